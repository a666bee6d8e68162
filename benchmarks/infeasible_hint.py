"""What the smallest-cluster hint of an infeasible `autoplan search` costs, before and after a change.

An infeasible search (no layout fits) ends with ``search.planner.smallest_feasible_gpus``: every larger cluster size in
turn, until one has a layout and split that fit (``_has_plan``). Each case runs `autoplan search` as a fresh process
(imports included) in this checkout and, with ``--before PATH``, in another checkout (e.g. the main branch), the two
alternating ``--repeat`` times on the same machine, and prints per case the median child CPU seconds of each, the ratio,
and the hint each gave. Prints; never asserts on time (the machine may be shared: compare within one run).

    python benchmarks/infeasible_hint.py [--before /path/to/other/checkout] [--repeat 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (model, GPUs, global batch, extra flags): each infeasible on that many H100s
CASES = [("llama3-70b", 8, 64, []), ("llama3-70b", 8, 64, ["--recompute", "selective"]),
         ("deepseek-v3", 64, 1024, []), ("mixtral-8x22b", 8, 256, [])]


def run(repo: Path, model: str, gpus: int, batch: int, extra: list[str]) -> tuple[float, str]:
    """(child CPU s, the hint) of one fresh `autoplan search` process run in ``repo``."""
    cmd = [sys.executable, "-m", "autoplan", "search", "--model", model, "--gpus", str(gpus), "--global-batch-size",
           str(batch), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = out.stdout + out.stderr
    hint = text.rsplit("cluster with a plan: ", 1)[-1].split()[0] if "cluster with a plan: " in text else "-"
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), hint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another checkout to time alternately (e.g. the main branch)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| case | CPU s before | hint before | CPU s after | hint after | after / before |")
    print("|---|---:|---:|---:|---:|---:|")
    for model, gpus, batch, extra in CASES:
        old: list[tuple[float, str]] = []
        new: list[tuple[float, str]] = []
        for _ in range(args.repeat):  # alternating: the machine's load falls on both alike
            if args.before is not None:
                old.append(run(args.before, model, gpus, batch, extra))
            new.append(run(ROOT, model, gpus, batch, extra))
        label = f"{model} {gpus} GPUs gbs {batch} {' '.join(extra)}".strip()
        after = statistics.median(c for c, _ in new)
        if old:
            before = statistics.median(c for c, _ in old)
            print(f"| {label} | {before:.2f} | {old[0][1]} | {after:.2f} | {new[0][1]} | {after / before:.2f} |")
        else:
            print(f"| {label} | - | - | {after:.2f} | {new[0][1]} | - |")


if __name__ == "__main__":
    main()
