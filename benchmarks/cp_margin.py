"""What context parallelism buys where the search picks it at short sequences (issue 12, "suspicious choices").

Per case: the best plan, and, where it uses CP, the local chunk each rank holds (``seq_len / cp``), the CP traffic
per GPU per step and what of it shows (ring CP: each K/V block beside one ring step's kernel,
``attention_cost.ring_steps_exposed_s``), and the best plan with CP pinned to 1 with the margin between the two.
A margin within the model's error (``benchmarks/heldout.py``) is a tie, not a reason to run CP. Then the measured
runs that used CP on short chunks (held-out rows of ``benchmarks/heldout.py`` whose ``seq_len / cp`` is at most
``--chunk`` tokens): what the cost model predicts for them against what they measured. Prints; never asserts.

    python benchmarks/cp_margin.py [--cases gpt3,dsv3] [--chunk 4096] [--measured-only]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoplan.catalog import build_cluster, load_model  # noqa: E402
from autoplan.report import describe_parallel  # noqa: E402
from cost_models.errors import InfeasibleError  # noqa: E402
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec  # noqa: E402
from search.planner import RankedPlan, search  # noqa: E402

# (key, model, gpu, gpus, seq_len, global batch): vs_heuristic.py's cases whose best plan has used CP at <= 8k
CASES = [
    ("gpt3", "gpt3-175b", "a100-80g", 1024, 2048, 1536),
    ("mixtral", "mixtral-8x7b", "h100-sxm", 64, 8192, 512),
    ("mixtral-8x22b", "mixtral-8x22b", "h100-sxm", 256, 8192, 1024),
    ("dsv3", "deepseek-v3", "h800", 2048, 8192, 1024),
    ("qwen3-235b", "qwen3-235b-a22b", "h100-sxm", 512, 8192, 1024),
    ("kimi-k2", "kimi-k2", "h100-sxm", 512, 8192, 1024),
    ("405b-gb200", "llama3-405b", "gb200", 1152, 8192, 1152),
]


def _best(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, pins: dict[str, int]) -> RankedPlan | None:
    try:
        return search(model, cluster, job, pins=pins, top_k=1, find_smallest_cluster=False).plans[0]
    except InfeasibleError:
        return None


def measured_short_chunks(chunk: int) -> None:
    """The held-out measured runs with cp > 1 and at most ``chunk`` tokens per rank: predicted vs measured step."""
    from heldout import evaluate  # benchmarks/heldout.py, beside this script

    rows, _, cases = evaluate()
    seq = {c["id"]: c["job"]["seq_len"] for c in cases}
    short = sorted((r for r in rows if r.cp > 1 and seq[r.id] // r.cp <= chunk), key=lambda r: r.id)
    print(f"\nmeasured runs with context parallelism on chunks of <= {chunk} tokens (held-out, benchmarks/heldout.py)")
    hdr = (f"{'run':<48} {'seq':>6} {'cp':>3} {'chunk':>6} {'GPUs':>5} {'measured s':>11} {'predicted s':>12} "
           f"{'error':>7}")
    print(hdr)
    print("-" * len(hdr))
    for r in short:
        print(f"{r.id[:48]:<48} {seq[r.id]:>6} {r.cp:>3} {seq[r.id] // r.cp:>6} {r.num_gpus:>5} {r.measured_s:>11.3f} "
              f"{r.predicted_s:>12.3f} {r.error:>+7.1%}")
    if short:
        mape = sum(abs(r.error) for r in short) / len(short)
        signed = sum(r.error for r in short) / len(short)
        print(f"{len(short)} runs: MAPE {mape:.1%}, mean signed {signed:+.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", help="comma-separated case keys (default: all)")
    ap.add_argument("--chunk", type=int, default=4096, help="largest tokens per rank of the measured runs shown")
    ap.add_argument("--measured-only", action="store_true", help="only the measured runs, no search")
    args = ap.parse_args()
    if args.measured_only:
        measured_short_chunks(args.chunk)
        return
    keys = set(args.cases.split(",")) if args.cases else None
    hdr = (f"{'case':<14} {'best plan':<54} {'chunk':>6} {'CP GiB':>7} {'shown s':>8} {'step s':>8} "
           f"{'best cp=1':<46} {'step s':>8} {'CP buys':>8} {'s':>5}")
    print(hdr)
    print("-" * len(hdr))
    for key, name, gpu, n, seq, batch in CASES:
        if keys and key not in keys:
            continue
        model, cluster, job = load_model(name), build_cluster(gpu, n), JobSpec(global_batch_size=batch, seq_len=seq)
        t0 = time.perf_counter()
        best = _best(model, cluster, job, {})
        if best is None:
            print(f"{key:<14} no plan fits")
            continue
        par, pred = best.parallel, best.prediction
        text = describe_parallel(par, pred.dp).replace(" sp", "")
        if par.cp == 1:
            print(f"{key:<14} {text[:54]:<54} {'-':>6} {'-':>7} {'-':>8} {pred.step_time_s:>8.3f} {'(no CP)':<46} "
                  f"{'':>8} {'':>8} {time.perf_counter() - t0:>5.1f}")
            continue
        alt = _best(model, cluster, job, {"cp": 1})
        alt_text = describe_parallel(alt.parallel, alt.prediction.dp).replace(" sp", "") if alt else "no plan fits"
        alt_s = alt.prediction.step_time_s if alt else float("nan")
        buys = alt_s / pred.step_time_s - 1.0
        print(f"{key:<14} {text[:54]:<54} {seq // par.cp:>6} {pred.comm_volume_gib.get('cp', 0.0):>7.1f} "
              f"{pred.time.exposed_comm_s.get('cp', 0.0):>8.3f} {pred.step_time_s:>8.3f} {alt_text[:46]:<46} "
              f"{alt_s:>8.3f} {buys:>+8.1%} {time.perf_counter() - t0:>5.1f}")
    print("\nchunk: tokens per rank (seq_len / cp); CP GiB: ring traffic per GPU per step; shown s: what of it the "
          "step pays; CP buys: the cp=1 plan's step time over the best's, less 1")
    measured_short_chunks(args.chunk)


if __name__ == "__main__":
    main()
