"""Batch planning throughput: a 1,000-request mixed queue with 1 and 2 local workers (and optionally Ray).

    python benchmarks/batch.py                  # 1,000 lines, workers 1 and 2
    python benchmarks/batch.py -n 200 --workers 1 2 --ray

The queue (``autoplan.batch.sample.mixed_requests``): valid estimates of random layouts of dense and MoE
catalog models on 8 … 16,384 GPUs, searches drawn from a small pool of jobs (queues repeat jobs), a few
impossible searches (infeasible) and broken lines (invalid). Every line's status is checked against the
one it was built to get, and every run's results against the first run's (the planner's wall time aside).

Prints, per run: wall time, plans/s (ok lines per second), lines/s, and cache hit rates — ``duplicates``
(lines answered from an identical earlier line in the batch), ``responses`` (a worker's response cache),
``job hit`` (searches that reused a worker's planner sub-results for the same model, cluster and job) and
the overall rate of lines answered from a cache. No asserts on wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoplan.batch import BatchRun, lines_from_requests  # noqa: E402
from autoplan.batch.sample import mixed_requests  # noqa: E402


def _stable(text: str) -> dict[str, Any]:
    out = json.loads(text)
    if out.get("result") and "search" in out["result"]:
        out["result"]["search"].pop("wall_time_s")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=1000, help="requests in the batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--ray", action="store_true", help="also run --backend ray with the largest worker count")
    args = ap.parse_args()

    sample = mixed_requests(args.n, args.seed)
    lines = lines_from_requests([s.text for s in sample])
    kinds = Counter((s.kind, s.expected) for s in sample)
    print(f"batch of {len(sample)}: " + ", ".join(f"{k} {e}: {n}" for (k, e), n in sorted(kinds.items())))

    runs = [("local", w) for w in args.workers] + ([("ray", max(args.workers))] if args.ray else [])
    reference: list[dict[str, Any]] | None = None
    header = (f"{'backend':8} {'workers':>7} {'wall_s':>8} {'plans/s':>8} {'lines/s':>8} {'dup hit':>8} "
              f"{'resp hit':>8} {'job hit':>8} {'overall':>8}  statuses")
    print(header)
    for backend, workers in runs:
        run = BatchRun(lines, workers=workers, backend=backend)  # type: ignore[arg-type]
        out = [(n, st, text) for n, st, text in run.answers()]
        wrong = [(s.text[:100], st) for s, (_, st, _) in zip(sample, out) if st != s.expected]
        if wrong:
            print(f"{len(wrong)} lines got the wrong status, e.g. {wrong[:3]}", file=sys.stderr)
            return 1
        stable = [_stable(t) for _, _, t in out]
        if reference is None:
            reference = stable
        elif stable != reference:
            print(f"{backend} x{workers}: results differ from the first run", file=sys.stderr)
            return 1
        s = run.summary()
        c = s.cache
        print(f"{backend:8} {workers:>7} {s.wall_s:>8.2f} {s.plans_per_s:>8.1f} {s.lines_per_s:>8.1f} "
              f"{c['duplicates']['hit_rate']:>8.1%} {c['responses']['hit_rate']:>8.1%} "
              f"{c.get('scorers', {}).get('hit_rate', 0.0):>8.1%} {c['hit_rate']:>8.1%}  "
              + ", ".join(f"{k} {v}" for k, v in s.counts.items()), flush=True)
    print(f"distinct requests: {len(lines) - run.duplicates} of {len(lines)}")
    print("every line got its expected status; results identical across runs (planner wall time aside)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
