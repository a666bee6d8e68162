"""``autoplan models`` and ``autoplan hardware``: what the catalogs hold, as a table or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from autoplan.catalog import gpu_names, load_gpu, load_model, model_aliases, model_names
from autoplan.cli import cli
from autoplan.cli.options import user_errors
from cost_models.specs import GPUSpec, ModelSpec

_FORMAT = click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
    help="human-readable table or one JSON object",
)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, text_columns: int = 1) -> str:
    """The first ``text_columns`` columns left-aligned, the rest (numbers) right-aligned."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [c.ljust(w) if i < text_columns else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(parts).rstrip()

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths), *(line(r) for r in cells[1:])])


def model_record(m: ModelSpec, aliases: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON form of one model (counts are exact integers)."""
    return {
        "name": m.name,
        "aliases": list(aliases),
        "num_params": m.num_params,
        "num_active_params": m.num_active_params,
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_kv_heads": m.num_kv_heads,
        "num_experts": m.num_experts,
        "moe_top_k": m.moe_top_k,
    }


def _model_row(m: ModelSpec) -> list[object]:
    experts = f"{m.num_experts}/{m.moe_top_k}" + (f"+{m.num_shared_experts}" if m.num_shared_experts else "")
    return [
        m.name,
        f"{m.num_params / 1e9:.2f}",
        f"{m.num_active_params / 1e9:.2f}",
        m.num_layers,
        m.hidden_size,
        f"{m.num_attention_heads}/{m.num_kv_heads}",
        experts if m.is_moe else "-",
    ]


@cli.command()
@click.argument("sources", nargs=-1, metavar="[MODEL]...")
@_FORMAT
@user_errors
def models(sources: tuple[str, ...], fmt: str) -> None:
    """List catalog models, or describe MODEL(s): names, HF config.json paths or spec files."""
    specs = [load_model(s) for s in sources] if sources else [load_model(n) for n in model_names()]
    by_target: dict[str, list[str]] = {}
    if not sources:
        for alias, target in model_aliases().items():
            by_target.setdefault(target, []).append(alias)
    if fmt == "json":
        click.echo(json.dumps({"models": [model_record(m, by_target.get(m.name, [])) for m in specs]}, indent=2))
        return
    headers = ["model", "params (B)", "active (B)", "layers", "hidden", "heads/kv", "experts/top-k(+shared)"]
    click.echo(render_table(headers, [_model_row(m) for m in specs]))
    if by_target:
        listed = ", ".join(f"{a} -> {t}" for t, names in sorted(by_target.items()) for a in names)
        click.echo(f"\naliases: {listed}")


def _gpu_row(g: GPUSpec) -> list[object]:
    return [
        g.name,
        g.generation,
        f"{g.peak_bf16_tflops:g}",
        f"{g.peak_fp8_tflops:g}",
        f"{g.hbm_gib:g}",
        f"{g.hbm_tbytes_per_s:g}",
        f"{g.link_gbytes_per_s:g}",
        g.nvlink_domain_size,
        g.gpus_per_node,
        f"{g.nic_gbps:g}",
    ]


@cli.command()
@_FORMAT
def hardware(fmt: str) -> None:
    """List catalog GPUs with their datasheet numbers."""
    gpus = [load_gpu(n) for n in gpu_names()]
    if fmt == "json":
        click.echo(json.dumps({"gpus": [g.model_dump() for g in gpus]}, indent=2))
        return
    headers = [
        "gpu", "generation", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GiB", "HBM TB/s",
        "link GB/s", "NVLink domain", "GPUs/node", "NIC Gb/s",
    ]
    click.echo(render_table(headers, [_gpu_row(g) for g in gpus], text_columns=2))
