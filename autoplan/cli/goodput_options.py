"""The failure-model flags (`search`, `estimate`, `scale`, `compare`) and the goodput line of a plan."""

from __future__ import annotations

from typing import Any

import click

from autoplan.cli.options import stack
from cost_models.goodput import DEFAULT_CHECKPOINT_GBPS, DEFAULT_RESTART_S, MAX_RESTART_S, FailureModel, Goodput

failure_options = stack(
    click.option("--mtbf-hours", type=click.FloatRange(min=0, min_open=True), default=None,
                 help="the job's mean time between interruptions [default: Llama 3's rate, 419 in 54 days on "
                      "16,384 GPUs, scaled to --gpus]"),
    click.option("--checkpoint-gbps", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_CHECKPOINT_GBPS,
                 show_default=True, help="aggregate checkpoint storage bandwidth, GB/s"),
    click.option("--async-save/--blocking-save", default=False, show_default=True,
                 help="async checkpoint save (training stalls only for the device-to-host copy)"),
    click.option("--restart-minutes", type=click.FloatRange(min=0, max=MAX_RESTART_S // 60),
                 default=DEFAULT_RESTART_S / 60,
                 show_default=True, help="relaunch time after an interruption, before reading the checkpoint"),
)


def failure_model(kw: dict[str, Any]) -> FailureModel:
    """Pops the failure flags from a command's keyword arguments."""
    return FailureModel(mtbf_hours=kw.pop("mtbf_hours"), checkpoint_gbps=kw.pop("checkpoint_gbps"),
                        async_save=kw.pop("async_save"), restart_s=60.0 * kw.pop("restart_minutes"))


def render_goodput(g: Goodput) -> str:
    save = "async" if g.async_save else "blocking"
    return (f"  goodput          {g.goodput * 100:.1f}% -> {g.tokens_per_s:,.0f} tokens/s after failures "
            f"(MTBF {g.mtbf_hours:.1f} h; checkpoint {g.checkpoint_gib_per_rank:.2f} GiB/rank every "
            f"{g.interval_steps} steps = {g.interval_s / 60:.1f} min, {save} stall {g.checkpoint_stall_s:.3g} s; "
            f"restart {g.restart_s / 60:.1f} min; {g.lost_hours_per_day:.2f} h lost/day)")
