"""Plots of ``scale`` results (matplotlib: the optional ``plot`` extra, imported only here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoplan.errors import UserInputError

FORMATS = (".png", ".svg")


def check_plot_path(path: str) -> None:
    """Refuse an unknown format, an unwritable path (missing folder, no permission) or a missing matplotlib
    before any work is done."""
    from autoplan.outputs import output_target

    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise UserInputError(f"--plot {path!r:.80}: the file must end in .png or .svg, got {suffix or 'no suffix'!r}")
    output_target(path, what="plot")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserInputError("--plot needs matplotlib: pip install 'autoplan[plot]'") from None


def plot_scale(result: Any, path: str) -> None:
    """Throughput (left axis) and scaling efficiency (right axis) against GPU count (log 2), the goodput
    throughput dashed, and a vertical line with the new layout wherever the best layout changes."""
    check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in result.rows if r.status == "ok"]
    fig, ax = plt.subplots(figsize=(9, 5.2), dpi=110)
    if ok:
        x = [r.num_gpus for r in ok]
        ax.plot(x, [r.tokens_per_s / 1e6 for r in ok], "o-", color="tab:blue", label="tokens/s (step)")
        ax.plot(x, [r.goodput_tokens_per_s / 1e6 for r in ok], "s--", color="tab:cyan",
                label="tokens/s after failures (goodput)")
        eff = ax.twinx()
        eff.plot(x, [r.scaling_efficiency * 100 for r in ok], "^-", color="tab:orange", label="scaling efficiency")
        eff.set_ylabel("scaling efficiency vs smallest size (%)", color="tab:orange")
        eff.set_ylim(0, max(105.0, max(r.scaling_efficiency * 100 for r in ok) + 5))
        for i, r in enumerate(ok):
            if i == 0 or r.layout_changed:
                ax.axvline(r.num_gpus, color="grey", linestyle=":", linewidth=1)
                ax.annotate(r.layout, (r.num_gpus, 0.02), xycoords=("data", "axes fraction"), rotation=90,
                            fontsize=8, color="dimgrey", ha="right", va="bottom")
        lines = ax.get_legend_handles_labels()
        lines2 = eff.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    for r in result.rows:
        if r.status != "ok":
            ax.axvline(r.num_gpus, color="red", alpha=0.3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = [r.num_gpus for r in result.rows]
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("million tokens/s (log)")
    ax.set_title(f"{result.model.name} on {result.cluster.gpu}: {result.scaling} scaling "
                 "(dotted: best layout changes)", fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as err:  # what the up-front check cannot see (e.g. /proc, which refuses new files even to root)
        raise UserInputError(f"cannot write plot '{path}': {err.strerror or err}") from None
    finally:
        plt.close(fig)
