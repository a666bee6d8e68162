"""The cost model's price of one torchao Float8 rowwise linear against torchao's own H100 micro-benchmark
(benchmarks/data/torchao_rowwise_microbench_h100.json: pytorch/ao@fdddb2cfa docs/static/fp8-rowwise-perf.png, the
speedup of a torch.compile'd LayerNorm -> Linear -> Sigmoid forward + backward, rowwise fp8 vs bf16, by (M, K, N)).

The three ops are priced by ``op_cost.op_compute`` itself (the GEMMs, the torchao casts, the slow-accum rescale
passes, the norm and the activation), with the Hopper efficiency the torchtitan held-out runs use, on the
h100-sxm (the README says "NVIDIA H100"). Issue #12 (autoplan): the model prices rowwise 1.10-1.80x faster than
bf16 over the whole table, while the benchmark measures a slowdown (0.38-0.99) in 147 of its 216 cells, among them
the small-N ones torchtitan's 8B at TP 8 runs (N per rank 1792, 512, 128). Neither hypothesis fits it with one
physical parameter (session 15 report): a multiplier on the cast / rescale bytes (best 5.25x over all cells: cell
MAPE 16.5%, N-trend too flat; held-out rowwise H100 rows -8..-22% -> +42..+51%), or rowwise GEMMs saturating at a
larger half-dim (best 2000 vs 577.5 on the M >= 4096 cells: cell MAPE 9.4%, large shapes ~15% low; held-out
rowwise H100 rows -8..-22% -> +13..+19%, ranking 120/131 unchanged: six pairs fixed, six others broken). Even two
free per-element overheads (per M·K and per M·N element) need 56 and 28 bytes at streaming bandwidth (the model
counts 6 + 4 rescale and 6) and still leave 13% cell MAPE: the slowdown is not HBM bytes alone. ``test_model_sign_at_small_n`` records the gap (strict xfail:
it fails once the model prices the slowdown, and must then become a plain test)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from autoplan.catalog.registry import load_gpu
from benchmarks import fidelity
from benchmarks.heldout import resolve_run
from cost_models.gemm import matmul_time_s
from cost_models.op_cost import op_compute
from cost_models.opgraph import LayerGraph, Op, Tensor
from cost_models.specs import ParallelConfig
from cost_models.targets import runtime_for

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "torchao_rowwise_microbench_h100.json"
TORCHTITAN = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "more_runs_torchtitan.json"


def table() -> dict[tuple[int, int, int], float]:
    d = json.loads(DATA.read_text())
    return {(r["m"], r["k"], n): s for r in d["rows"] for n, s in zip(d["n"], r["speedup"])}


@cache
def _setup():  # type: ignore[no-untyped-def]
    """(model, one-GPU h100-sxm cluster, fp8 job, runtime) of the torchtitan rowwise H100 held-out run."""
    cases, rules = fidelity.load_cases(TORCHTITAN)
    case = next(c for c in cases if c["id"] == "tt_asynctp_8B_rowwise_vanillatp")
    run = resolve_run(fidelity.to_run(case, rules))
    cluster = run.cluster_with().model_copy(update={"gpu": load_gpu("h100-sxm"), "num_gpus": 1})
    return run.model, cluster, run.job, run.target, run.knobs


def model_speedup(m: int, k: int, n: int) -> float:
    """bf16 / rowwise-fp8 time of LayerNorm -> Linear -> Sigmoid on an (m, k) input, as ``op_compute`` prices them
    (one rank, no TP, micro-batch 1 of sequence m)."""
    model, cluster, job, target, knobs = _setup()
    tensors = {"x": Tensor("x", k, "hidden"), "xn": Tensor("xn", k, "hidden"), "y": Tensor("y", n, "ffn"),
               "s": Tensor("s", n, "ffn")}
    graph = LayerGraph("mlp", (Op("ln", "norm", ("x",), "xn"),
                               Op("fc", "matmul", ("xn",), "y", weight_in=k, weight_out=n, params=k * n,
                                  flops_per_token=2.0 * k * n),
                               Op("act", "elementwise", ("y",), "s")), tensors)
    par = ParallelConfig(tp=1, pp=1, micro_batch_size=1, sequence_parallel=False)
    fp8 = job.model_copy(update={"precision": "fp8", "seq_len": m, "global_batch_size": 1})
    rt = runtime_for(target, fp8, cluster, par, knobs)  # its fp8 effects apply only to an fp8 job
    times = []
    for precision in ("bf16", "fp8"):
        j = fp8.model_copy(update={"precision": precision})
        parts = [op_compute(op, graph, model, cluster, j, par, rt) for op in graph.ops]
        times.append(sum(p.forward_s + p.backward_s for p in parts))
    return times[0] / times[1]


def test_table_is_whole() -> None:
    t = table()
    assert len(t) == 216 and all(0.3 < s < 2.0 for s in t.values())
    assert t[(32768, 4096, 1024)] == 0.59 and t[(32768, 4096, 2048)] == 0.81  # the cells issue #12 quotes


def test_model_prices_rowwise_casts() -> None:
    """The fp8 side carries torchao's casts and rescale passes: the model's speedup is below the bf16 / fp8 GEMM
    time ratio of the same shape, and further below it where the GEMM is small against its activations."""
    cluster = _setup()[1]

    def gemm_ratio(m: int, k: int, n: int) -> float:
        return matmul_time_s(m, k, n, cluster, "bf16") / matmul_time_s(m, k, n, cluster, "fp8")

    small, large = (32768, 4096, 1024), (32768, 32768, 32768)
    assert model_speedup(*small) < gemm_ratio(*small) and model_speedup(*large) < gemm_ratio(*large)
    assert model_speedup(*small) / gemm_ratio(*small) < model_speedup(*large) / gemm_ratio(*large)


def test_model_orders_along_n_like_the_benchmark() -> None:
    """Within every (M, K) row of M >= 4096 the benchmark's speedup rises from N = 1024 to N = 32768 (larger
    GEMMs amortize the per-activation casts); the model's must too."""
    t = table()
    for m, k in {(m, k) for m, k, _ in t if m >= 4096}:
        assert t[(m, k, 32768)] > t[(m, k, 1024)]
        assert model_speedup(m, k, 32768) > model_speedup(m, k, 1024), (m, k)


@pytest.mark.xfail(strict=True, reason="issue #12: the model prices torchao rowwise faster than bf16 where torchao's "
                   "H100 micro-benchmark measures 0.59 / 0.81 (no one-parameter fit found; module docstring)")
def test_model_sign_at_small_n() -> None:
    t = table()
    for n in (1024, 2048):
        assert t[(32768, 4096, n)] < 1.0
        assert model_speedup(32768, 4096, n) < 1.0
