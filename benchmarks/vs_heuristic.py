"""autoplan's best plan vs Megatron's hand rule (``benchmarks/baselines.py``), same cost model.

Per case: predicted tokens/s of autoplan's best plan (target megatron, so both launch on Megatron-LM)
over the hand rule's, and the geometric mean over the cases where both have a plan. The ratio can only be
≥ 1 if the hand rule's layout lies in the search space (it does: TP/PP/DP/CP/EP, mbs 1, ZeRO-1, 1F1B,
default split) and the search is exact. Prints; never asserts.

    python benchmarks/vs_heuristic.py
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoplan.catalog import build_cluster, load_model  # noqa: E402
from autoplan.report import describe_parallel  # noqa: E402
from benchmarks.baselines import megatron_hand_rule  # noqa: E402
from cost_models.errors import InfeasibleError  # noqa: E402
from cost_models.specs import JobSpec  # noqa: E402
from search.planner import search  # noqa: E402

# (model, gpu, gpus, seq_len, global batch)
CASES = [
    ("llama3-8b", "h100-sxm", 8, 8192, 1024),
    ("llama3-8b", "h100-sxm", 64, 8192, 512),
    ("llama3-70b", "h100-sxm", 1024, 8192, 1024),
    ("llama3-70b", "a100-80g", 256, 4096, 1024),
    ("llama3-405b", "h100-sxm", 16384, 8192, 1024),
    ("llama3-405b", "h100-sxm", 16384, 131072, 1024),
    ("mixtral-8x7b", "h100-sxm", 64, 8192, 512),
    ("mixtral-8x22b", "h100-sxm", 256, 8192, 1024),
    ("deepseek-v3", "h800", 2048, 8192, 1024),
    ("qwen3-235b-a22b", "h100-sxm", 512, 8192, 1024),
    ("gpt3-175b", "a100-80g", 1024, 2048, 1536),
    ("llama3-405b", "gb200", 1152, 8192, 1152),
]


def main() -> None:
    hdr = (f"{'case':<40} {'hand rule':<46} {'autoplan best':<58} {'hand tok/s':>11} {'autoplan tok/s':>14} "
           f"{'ratio':>6} {'s':>5}")
    print(hdr)
    print("-" * len(hdr))
    ratios = []
    for name, gpu, n, seq, batch in CASES:
        model, cluster, job = load_model(name), build_cluster(gpu, n), JobSpec(global_batch_size=batch, seq_len=seq)
        label = f"{name}@{n} {gpu} s={seq} B={batch}"
        hand = megatron_hand_rule(model, cluster, job)
        t0 = time.perf_counter()
        try:
            res = search(model, cluster, job, top_k=1, find_smallest_cluster=False)
            best = res.plans[0]
        except InfeasibleError:
            best = None
        took = time.perf_counter() - t0
        hand_txt = describe_parallel(hand[0], hand[1].dp).replace(" sp", "") if hand else "no plan fits"
        best_txt = describe_parallel(best.parallel, best.prediction.dp).replace(" sp", "") if best else "no plan"
        ht = hand[1].tokens_per_s if hand else float("nan")
        bt = best.prediction.tokens_per_s if best else float("nan")
        ratio = bt / ht if hand and best else float("nan")
        if not math.isnan(ratio):
            ratios.append(ratio)
        print(f"{label:<40} {hand_txt[:46]:<46} {best_txt[:58]:<58} {ht:>11,.0f} {bt:>14,.0f} {ratio:>6.3f} "
              f"{took:>5.1f}")
    if ratios:
        gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"\ngeometric mean of autoplan / hand rule throughput over {len(ratios)} cases: {gm:.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
