"""How fast `autoplan search` answers, and how that compares with exhaustive enumeration.

For each showcase case: the wall time of a fresh `autoplan search ... --format json` process (imports
included), the planner's own time (``search.wall_time_s``), the target, and the exhaustive search over the
same space (every layout × every layer split ``ParallelConfig`` can express, each scored by
``estimate``). Exhaustive search is run in full when it would take under ``--exhaustive-budget`` seconds;
otherwise its time is extrapolated from a timed random sample of points (marked ``~``). Prints; never
asserts on time.

    python benchmarks/search_speed.py [--exhaustive-budget 60] [--sample 300] [--cases 8b,70b] [--targets megatron,any]
                                      [--no-exhaustive]

Each row also gives the intra-op ILP solves and cache hits the search ran, and the 1-minute load average when
the row was measured (the machine may be shared: compare CPU seconds, and ratios within one run).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoplan.catalog import build_cluster, load_model  # noqa: E402
from cost_models.errors import ConfigError  # noqa: E402
from cost_models.estimate import estimate  # noqa: E402
from cost_models.specs import JobSpec, ParallelConfig  # noqa: E402
from search.exhaustive import exhaustive_search, expressible_splits  # noqa: E402
from search.space import Tally, enumerate_layouts  # noqa: E402

# (key, model, gpu, gpus, seq_len, target seconds)
CASES = [
    ("70b", "llama3-70b", "h100-sxm", 1024, 8192, 2.0),
    ("405b", "llama3-405b", "h100-sxm", 16384, 8192, 3.0),
    ("dsv3", "deepseek-v3", "h800", 2048, 8192, 3.0),
    ("131k-gpus", "llama3-405b", "h100-sxm", 131072, 8192, 5.0),
    ("mixtral", "mixtral-8x22b", "h100-sxm", 256, 8192, 5.0),
    ("8b", "llama3-8b", "h100-sxm", 8, 8192, 1.0),
    ("405b-128k", "llama3-405b", "h100-sxm", 16384, 131072, 10.0),
]


def cli_time(model: str, gpu: str, gpus: int, seq: int, target: str = "megatron") -> tuple[float, float, dict]:
    """(wall s, CPU s of the child, its JSON). CPU time is what the wall time would be on idle cores."""
    cmd = [sys.executable, "-m", "autoplan.cli", "search", "--model", model, "--gpus", str(gpus), "--gpu", gpu,
           "--seq-len", str(seq), "--format", "json", "--target", target]
    if gpus >= 65536:  # 1024 sequences cannot feed that many GPUs: a batch that can (16 per 1024 GPUs)
        cmd += ["--global-batch-size", str(gpus // 64)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        return wall, cpu, {"error": proc.stderr.strip()[-200:]}
    return wall, cpu, json.loads(proc.stdout)


def exhaustive_time(model_name: str, gpu: str, gpus: int, seq: int, budget_s: float, sample: int,
                    best_cost: float | None) -> tuple[str, int, str]:
    """(seconds, points, same best?) of the exhaustive search: run when under budget, else extrapolated from
    ``sample`` points drawn uniformly (enumeration time + points × mean estimate time)."""
    model, cluster, job = load_model(model_name), build_cluster(gpu, gpus), JobSpec(seq_len=seq)
    t0 = time.perf_counter()
    layouts = list(enumerate_layouts(model, cluster, job, "megatron", {}, Tally()))
    splits: dict[int, list] = {}
    counts = []
    for lay in layouts:
        if lay.vp > 1:
            counts.append(1)
            continue
        if lay.pp not in splits:
            splits[lay.pp] = list(expressible_splits(model.num_layers, lay.pp))
        counts.append(len(splits[lay.pp]))
    cum = list(itertools.accumulate(counts))
    total = cum[-1] if cum else 0
    enum_s = time.perf_counter() - t0
    rng = random.Random(0)
    per = 0.0
    if total:
        picks = [rng.randrange(total) for _ in range(min(sample, total))]
        pars = []
        for k in picks:
            i = bisect.bisect_right(cum, k)
            lay = layouts[i]
            sp = None if lay.vp > 1 else splits[lay.pp][k - (cum[i - 1] if i else 0)]
            extra = {} if sp is None else {"first_stage_layers": sp[0], "last_stage_layers": sp[1]}
            pars.append(ParallelConfig(**lay.parallel_kwargs(), **extra))
        t0 = time.perf_counter()
        for par in pars:
            try:
                estimate(model, cluster, job, par)
            except ConfigError:
                pass
        per = (time.perf_counter() - t0) / len(pars)
    predicted = enum_s + per * total
    if predicted > budget_s:
        return f"~{predicted:,.0f}", total, "n/a (extrapolated)"
    t0 = time.perf_counter()
    ref = exhaustive_search(model, cluster, job)
    took = time.perf_counter() - t0
    same = "n/a" if ref is None or best_cost is None else (
        "yes" if abs(ref.prediction.composite_cost - best_cost) <= 1e-9 * best_cost else
        f"NO ({ref.prediction.composite_cost:.4f} vs {best_cost:.4f})")
    return f"{took:,.1f}", total, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exhaustive-budget", type=float, default=60.0)
    ap.add_argument("--sample", type=int, default=300)
    ap.add_argument("--cases", default=",".join(c[0] for c in CASES))
    ap.add_argument("--targets", default="megatron", help="comma-separated: megatron,torchtitan,any")
    ap.add_argument("--no-exhaustive", action="store_true", help="time the planner only")
    args = ap.parse_args()
    keys = args.cases.split(",")
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs at start")
    hdr = (f"{'case':<34} {'target':>10} {'goal s':>6} {'cli wall s':>10} {'cli cpu s':>9} {'planner s':>9} "
           f"{'layouts':>7} {'scored':>6} {'ILP solves':>10} {'hits':>5} {'load':>5} {'exhaustive s':>13} "
           f"{'points':>9} {'ratio':>9} {'same best':>10}")
    print(hdr)
    print("-" * len(hdr))
    for (key, model, gpu, gpus, seq, goal), target in itertools.product(CASES, args.targets.split(",")):
        if key not in keys:
            continue
        wall, cpu, out = cli_time(model, gpu, gpus, seq, target)
        label = f"{model}@{gpus} {gpu}" + (f" s={seq}" if seq != 8192 else "")
        if "error" in out:
            print(f"{label:<34} {target:>10} {goal:>6.0f} {wall:>10.2f}  search failed: {out['error']}")
            continue
        s = out["search"]
        best = out["plans"][0]["prediction"]["composite_cost"] if out["plans"] else None
        if args.no_exhaustive or target != "megatron":
            ex, npts, same, ratio = "-", 0, "-", "-"
        else:
            ex, npts, same = exhaustive_time(model, gpu, gpus, seq, args.exhaustive_budget, args.sample, best)
            ratio = f"{float(ex.lstrip('~').replace(',', '')) / wall:,.0f}x"
        print(f"{label:<34} {target:>10} {goal:>6.0f} {wall:>10.2f} {cpu:>9.2f} {s['wall_time_s']:>9.2f} "
              f"{s['candidates']:>7} {s['evaluated']:>6} {s.get('ilp_solves', 0):>10} {s.get('ilp_cache_hits', 0):>5} "
              f"{os.getloadavg()[0]:>5.1f} {ex:>13} {npts:>9,} {ratio:>9} {same:>10}")
    print("\ncli wall s: fresh `autoplan search --format json` process, imports included; cli cpu s: its CPU time "
          "(the wall time on idle cores); planner s: search() alone; load: 1-minute load average after the row; "
          "ratio = exhaustive / cli wall.")


if __name__ == "__main__":
    main()
