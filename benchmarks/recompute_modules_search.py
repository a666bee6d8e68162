"""What pinning Megatron's --recompute-modules costs `autoplan search`, and that the answer is deterministic.

Times `autoplan search --model deepseek-v3 --gpus 1024` as a fresh process (imports included) without a pin (the
search then tries Megatron's default modules and the ladder of module sets, ``cost_models.recompute_ladder``), with
``--recompute selective`` and with ``--recompute-modules mla_up_proj,moe_act,layernorm`` (Megatron-Bridge's DeepSeek-V3
recipes), ``--repeat`` times each, and prints per case the median wall and child CPU seconds, the planner's own time,
the ratio to the unpinned search, and whether every repeat returned the same plans. Prints; never asserts on time
(the machine may be shared: compare CPU seconds, and ratios within one run).

    python benchmarks/recompute_modules_search.py [--repeat 3] [--model deepseek-v3] [--gpus 1024]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = [("no pin", []), ("--recompute selective", ["--recompute", "selective"]),
         ("--recompute-modules", ["--recompute-modules", "mla_up_proj,moe_act,layernorm"])]


def run(model: str, gpus: int, extra: list[str]) -> tuple[float, float, dict]:
    """(wall s, child CPU s, the JSON result) of one fresh `autoplan search` process."""
    cmd = [sys.executable, "-m", "autoplan", "search", "--model", model, "--gpus", str(gpus), "--format", "json",
           *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--gpus", type=int, default=1024)
    args = ap.parse_args()
    print(f"| case | wall s | CPU s | planner s | CPU / no pin | layouts | scored | same plans x{args.repeat} | #1 |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    base = None
    for label, extra in CASES:
        runs = [run(args.model, args.gpus, extra) for _ in range(args.repeat)]
        plans = [[(p["parallel"], p["prediction"]["step_time_s"]) for p in r[2]["plans"]] for r in runs]
        cpu = statistics.median(r[1] for r in runs)
        base = base or cpu
        s = runs[0][2]["search"]
        top = runs[0][2]["plans"][0]
        par = top["parallel"]
        best = (f"tp{par['tp']} pp{par['pp']} ep{par['ep']} cp{par['cp']} mbs{par['micro_batch_size']} "
                f"{par['recompute']}{'(' + ','.join(par['recompute_modules']) + ')' if par.get('recompute_modules') else ''}"
                f" {top['prediction']['step_time_s']:.3f} s")
        print(f"| {label} | {statistics.median(r[0] for r in runs):.2f} | {cpu:.2f} | "
              f"{statistics.median(r[2]['search']['wall_time_s'] for r in runs):.2f} | {cpu / base:.2f} | "
              f"{s['candidates']} | {s['evaluated']} | {all(p == plans[0] for p in plans)} | {best} |")


if __name__ == "__main__":
    main()
