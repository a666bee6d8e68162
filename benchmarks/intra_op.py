"""Intra-op ILP speed: solve time per (layer kind, mesh, target) and cache hit rate over a planner-like sweep.

The sweep is what the outer enumeration asks for llama3-70b on 1024 H100s: every (pp, tp, cp) with
dp = 1024 / (pp·tp·cp) (and ep 1 or 8 inside dp for MoE models), micro-batch 1 or 2, recompute none/full, global batch 1024 sequences of 8192
tokens; per configuration the planner asks for every layer of every stage (embedding, 80 decoder
layers, head) with the per-layer memory budget of its stage. Identical layers hit the cache.
Prints tables; never asserts on time.

    python benchmarks/intra_op.py [--model llama3-70b] [--target megatron|torchtitan|fsdp2|union] [--quick]

``union``: the research strategy set of ``ilp_gain.py`` (SP per op, every loss and K/V holding), no target's.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections import defaultdict

from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError, InfeasibleError
from cost_models.opgraph import layer_kinds
from search.intra_op import IntraOpCache, IntraOpRequest, solve_layer
from search.mesh import LogicalMesh

from ilp_gain import UNION  # benchmarks/ (this script's directory)

GIB = 2**30
RESERVE_GIB = 6.0  # CUDA context, NCCL buffers, logits and fragmentation kept out of the layers' budget


def sweep(model_name: str, target: str, quick: bool) -> None:
    model = load_model(model_name)
    kinds_of = layer_kinds(model)
    cluster = build_cluster("h100-sxm", 1024)
    seq, gbs = 8192, 1024
    pps = (4, 8) if quick else (1, 2, 4, 8, 16)
    cache = IntraOpCache()
    times: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    outcomes: dict[str, int] = defaultdict(int)
    t_all = time.perf_counter()
    for pp in pps:
        for tp in (1, 2, 4, 8):
            for cp, ep in itertools.product((1, 2, 4), (1, 8) if model.is_moe else (1,)):
                dp = 1024 // (pp * tp * cp)
                if dp % ep or (model.is_moe and model.num_experts % ep):
                    continue
                mesh = LogicalMesh.from_degrees(cluster, dp=dp, cp=cp, tp=tp, ep=ep)
                shape = "×".join(a.value for a in mesh.axes)
                layers_per_stage = model.num_layers // pp
                budget = (cluster.gpu.hbm_gib - RESERVE_GIB) * GIB / layers_per_stage
                for mbs in (1, 2):
                    if gbs % (dp * mbs):
                        continue
                    m = gbs // (dp * mbs)
                    for recompute in ("none", "full"):
                        kinds = ["embedding", *kinds_of, "head"]
                        for kind in kinds:
                            r = IntraOpRequest(kind, seq, micro_batch_size=mbs, recompute=recompute,
                                               target="megatron" if target == "union" else target,  # type: ignore[arg-type]
                                               strategies=UNION if target == "union" else None,
                                               num_microbatches=m, activation_copies=min(pp, m),
                                               memory_limit_bytes=budget)
                            misses = cache.misses
                            t0 = time.perf_counter()
                            try:
                                res = solve_layer(model, mesh, r, cache=cache)
                                outcome = f"{res.status} ({res.solver_method or 'fallback'})"
                            except InfeasibleError:
                                outcome = "does not fit"
                            except ConfigError:
                                outcome = "not launchable"
                            dt = time.perf_counter() - t0
                            if cache.misses > misses:
                                times[kind, f"{len(mesh.axes)}-axis", shape].append(dt)
                                outcomes[outcome] += 1
    wall = time.perf_counter() - t_all

    print(f"intra-op ILP, {model_name} on 1024 x h100-sxm, target={target}, seq={seq}, gbs={gbs}")
    print(f"{'layer kind':<10} {'mesh':<6} {'axes':<10} {'solves':>6} {'median ms':>10} {'p90 ms':>8} {'max ms':>8}")
    for (kind, naxes, shape), ts in sorted(times.items()):
        ts_ms = sorted(t * 1e3 for t in ts)
        p90 = ts_ms[min(len(ts_ms) - 1, int(0.9 * len(ts_ms)))]
        print(f"{kind:<10} {naxes:<6} {shape:<10} {len(ts):>6} {statistics.median(ts_ms):>10.1f} {p90:>8.1f} "
              f"{ts_ms[-1]:>8.1f}")
    dense2 = [t * 1e3 for (k, n, _), ts in times.items() if k == "dense" and n == "2-axis" for t in ts]
    if dense2:
        print(f"\nmedian solve, dense layer on a 2-axis mesh: {statistics.median(dense2):.1f} ms "
              f"({len(dense2)} solves)")
    total = cache.hits + cache.misses
    print(f"requests {total}, solved {cache.misses}, cache hits {cache.hits}, hit rate {cache.hit_rate:.1%}")
    print("solve outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    print(f"sweep wall time {wall:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="megatron", choices=["megatron", "torchtitan", "fsdp2", "union"])
    ap.add_argument("--model", default="llama3-70b", help="catalog name (MoE models add moe layers)")
    ap.add_argument("--quick", action="store_true", help="pp in (4, 8) only")
    args = ap.parse_args()
    sweep(args.model, args.target, args.quick)


if __name__ == "__main__":
    main()
