"""Baselines the planner is measured against, on the same cost model (``cost_models.estimate``).

- ``megatron_hand_rule``: what practitioners do by hand (COST_MODEL.md §8, Megatron-LM's scaling recipes):
  TP = the largest degree ≤ min(8, heads) that divides the heads, the KV heads and the FFN and fits the
  NVLink domain; PP = the smallest that fits memory (1F1B, Megatron's default layer split); DP the rest;
  micro-batch 1, distributed optimizer (ZeRO-1), sequence parallelism on. MoE: EP = the largest divisor of
  the experts that divides dp (≤ 64). When no PP fits, the rule escalates the way practitioners do:
  selective, then full recompute, then CP = 2, 4, … (long context).
- ``exhaustive_search``: every layout × every expressible split, from ``search.exhaustive``.

    python benchmarks/baselines.py --model llama3-70b --gpus 1024
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.errors import ConfigError, divisors  # noqa: E402
from cost_models.estimate import Prediction, estimate  # noqa: E402
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig  # noqa: E402
from search.exhaustive import exhaustive_points, exhaustive_search  # noqa: E402,F401

MAX_HAND_EP = 64


def hand_tp(model: ModelSpec, cluster: ClusterSpec) -> int:
    cap = min(8, model.num_attention_heads, cluster.nvlink_domain_size)
    for t in range(cap, 0, -1):
        if (model.num_attention_heads % t == 0 and model.num_kv_heads % t == 0 and model.ffn_hidden_size % t == 0
                and cluster.nvlink_domain_size % t == 0 and cluster.num_gpus % t == 0):
            return t
    return 1


def megatron_hand_rule(model: ModelSpec, cluster: ClusterSpec, job: JobSpec) -> tuple[ParallelConfig, Prediction] | None:
    """The hand rule's plan and its prediction; None when even the escalations find nothing that fits."""
    tp = hand_tp(model, cluster)
    N = cluster.num_gpus
    cps = [1] + [c for c in (2, 4, 8, 16, 32, 64, 128) if job.seq_len % (2 * c) == 0]
    for cp in cps:
        for recompute in ("none", "selective", "full"):
            if (N // tp) % cp:
                continue
            for pp in divisors(N // (tp * cp)):
                if pp > model.num_layers:
                    break
                dp = N // (tp * cp * pp)
                ep = 1
                if model.is_moe:
                    ep = max(e for e in divisors(model.num_experts) if (dp * cp) % e == 0 and e <= MAX_HAND_EP)
                par = ParallelConfig(tp=tp, pp=pp, cp=cp, ep=ep, recompute=recompute)  # type: ignore[arg-type]
                try:
                    pred = estimate(model, cluster, job, par)
                except ConfigError:
                    continue
                if pred.fits:
                    return par, pred
    return None


def main() -> None:
    from autoplan.catalog import build_cluster, load_model
    from autoplan.report import describe_parallel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--seq-len", type=int, default=8192)
    args = ap.parse_args()
    model, cluster = load_model(args.model), build_cluster(args.gpu, args.gpus)
    job = JobSpec(seq_len=args.seq_len)
    hand = megatron_hand_rule(model, cluster, job)
    if hand is None:
        print("hand rule: no plan fits")
    else:
        print(f"hand rule: {describe_parallel(hand[0], hand[1].dp)}  step {hand[1].step_time_s:.3f} s  "
              f"MFU {hand[1].mfu:.1%}")


if __name__ == "__main__":
    main()
