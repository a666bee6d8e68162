"""Transformer Engine's fp8 recipes (Megatron-Core's fp8 path) as the cost model prices them
(``cost_models.te_fp8``: ``te_cast_bytes``, ``te_tp_gather_bytes``, ``MXFP8_GEMM_TIME_RATIO``; priced by
``cost_models.knob_effects``).

- Cast bytes are recounted here from TE's kernel sequence per recipe (which kernels run, what each reads and writes:
  TE v2.9, cited in te_fp8), not from the formula the model uses.
- The MXFP8 GEMM ratio is recomputed from TE's GEMM profiling guide's pre-quantized B300 table, and the cast bytes
  are checked against the same guide's autocast table: the quantization time TE measured (autocast minus
  pre-quantized) over the bytes counted must give one achieved bandwidth for both recipes.
- The held-out Megatron-Bridge runs that differ only in the recipe (same layout) are ordered as measured.
"""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from benchmark_modules import load_benchmark
from cost_models.gemm import hbm_time_s
from cost_models.te_fp8 import MXFP8_GEMM_TIME_RATIO, te_cast_bytes
from cost_models.op_cost import op_compute
from cost_models.op_traffic import local_widths
from cost_models.opgraph import layer_graph
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for

BF16, FP8, E8M0, MX = 2, 1, 1, 32


def _bytes(kernels: list[tuple[float, float]]) -> float:
    """Sum of (read, written) bytes per element over a kernel sequence."""
    return sum(r + w for r, w in kernels)


# TE's kernels per recipe, per element, beyond the producer's bf16 write; Hopper (TN-only fp8 GEMM: per-tensor copies
# need a transpose) and Blackwell (any layout).
def _sequences(blackwell: bool) -> dict[str, dict[str, float]]:
    t = [] if blackwell else [FP8]  # the transposed copy a per-tensor cast also writes on Hopper
    return {
        "delayed": {  # cast(+transpose) with the stored scale; the norm writes fp8 itself, then nvte_transpose
            "input": _bytes([(BF16, FP8 + sum(t))]),
            "norm_input": (FP8 - BF16) + (0 if blackwell else _bytes([(FP8, FP8)])),
            "grad_output": _bytes([(BF16, FP8 + sum(t))]),
        },
        "tensorwise": {  # nvte_compute_amax, then the cast; the norm kernel computes the amax itself
            "input": _bytes([(BF16, 0), (BF16, FP8 + sum(t))]),
            "norm_input": _bytes([(BF16, FP8 + sum(t))]),
            "grad_output": _bytes([(BF16, 0), (BF16, FP8 + sum(t))]),
        },
        "mxfp8": {  # one kernel: rowwise and columnwise copies, each with an E8M0 scale per 32; norm not fused
            k: _bytes([(BF16, 2 * (FP8 + E8M0 / MX))]) for k in ("input", "norm_input", "grad_output")},
    }


@pytest.mark.parametrize("blackwell", [False, True])
def test_te_cast_bytes_follow_the_kernel_sequences(blackwell: bool) -> None:
    for recipe, expect in _sequences(blackwell).items():
        if recipe == "mxfp8" and not blackwell:
            continue
        got = te_cast_bytes(recipe, non_tn_gemm=blackwell)
        assert (got.input, got.norm_input, got.grad_output) == pytest.approx(
            (expect["input"], expect["norm_input"], expect["grad_output"])), recipe
    # TE's default (no recipe) is delayed scaling
    assert te_cast_bytes(None, blackwell) == te_cast_bytes("delayed", blackwell)


# TE docs/examples/gemm_profiling/gemm_profiling.rst (1609c890e, TE#2863): B300, 5B config (hidden 4096, FFN 16384,
# M = 31 x 512 = 15,872 tokens), per-layer ms of (Fprop, Dgrad, Wgrad) and the printed per-layer totals.
M, H, F, QKV = 15872, 4096, 16384, 12288
AUTOCAST = {"tensorwise": ((2.879, 3.063, 3.205), 9.147), "mxfp8": ((2.847, 3.045, 3.092), 8.984)}
PREQUANT = {"tensorwise": ((2.158, 2.329, 2.325), 6.812), "mxfp8": ((2.365, 2.397, 2.400), 7.161)}
# The benchmark's shapes (M x K x N; Dgrad / Wgrad as its appendix derives them).
SHAPES = {"fprop": [(M, H, QKV), (M, H, H), (M, H, F), (M, F, H)],
          "dgrad": [(M, QKV, H), (M, H, H), (M, F, H), (M, H, F)],
          "wgrad": [(H, M, QKV), (H, M, H), (H, M, F), (F, M, H)]}


def test_mxfp8_gemm_ratio_is_tes_prequantized_measurement() -> None:
    for recipe, (passes, total) in PREQUANT.items():
        assert sum(passes) == pytest.approx(total, abs=0.002), recipe  # the table adds up
    ratio = PREQUANT["mxfp8"][1] / PREQUANT["tensorwise"][1]
    assert MXFP8_GEMM_TIME_RATIO == pytest.approx(ratio, abs=2e-4)
    assert MXFP8_GEMM_TIME_RATIO > 1.0  # block-scaled MXFP8 GEMMs are the slower kernel on Blackwell


def test_cast_bytes_give_one_bandwidth_for_tes_measured_quantization() -> None:
    """TE's autocast benchmark times ``te.Linear`` forward (benchmark_gemm.py ``benchmark_fp8_current`` /
    ``benchmark_fp8``): each call quantizes the activation A (M x K; both usages under grad mode: its wgrad needs it)
    and the weight B (K x N; rowwise only: the input does not require grad, module/linear.py:244-250). Autocast minus
    pre-quantized is the quantization time. With Blackwell's counts (tensorwise 5 B per element, no transpose; MXFP8
    4.0625 for A, 2 + 1 + 1/32 for B) both recipes imply one achieved bandwidth, under the B300's HBM; with a
    Hopper-style transposed copy (6 B) tensorwise would imply one a fifth higher than MXFP8's."""
    cast = {r: te_cast_bytes(r, non_tn_gemm=True).input for r in ("tensorwise", "mxfp8")}
    mx_rowwise_only = BF16 + FP8 + E8M0 / MX
    a = sum(m * k for shapes in SHAPES.values() for m, k, _ in shapes)
    b = sum(k * n for shapes in SHAPES.values() for _, k, n in shapes)
    seconds = {r: (AUTOCAST[r][1] - PREQUANT[r][1]) / 1e3 for r in AUTOCAST}
    bw_tw = cast["tensorwise"] * (a + b) / seconds["tensorwise"]
    bw_mx = (cast["mxfp8"] * a + mx_rowwise_only * b) / seconds["mxfp8"]
    assert bw_tw / bw_mx == pytest.approx(1.0, abs=0.10)
    assert max(bw_tw, bw_mx) < build_cluster("b300", 8).gpu.hbm_tbytes_per_s * 1e12
    with_transpose = te_cast_bytes("tensorwise", non_tn_gemm=False).input * (a + b) / seconds["tensorwise"]
    assert with_transpose / bw_mx > 1.15


def test_layer_prices_mxfp8_casts_and_gemms_against_tensorwise() -> None:
    """Llama3-8B on B200 (tp 1, mbs 2): each linear's GEMM is ``MXFP8_GEMM_TIME_RATIO`` × the tensorwise one; its
    memory-bound bytes differ by the cast bytes: forward by the input's (norm-fed q/k/v and gate/up once per norm),
    backward by the output gradient's."""
    model, cluster = load_model("llama3-8b"), build_cluster("b200", 8)
    job = JobSpec(global_batch_size=16, seq_len=8192, precision="fp8")
    par = ParallelConfig(tp=1, micro_batch_size=2, zero_stage=1)
    graph = layer_graph(model, "dense", job.seq_len)
    tokens = par.micro_batch_size * job.seq_len
    rts = {r: runtime_for("megatron", job, cluster, par, Software(fp8_recipe=r)) for r in ("tensorwise", "mxfp8")}
    casts = {r: _sequences(blackwell=True)[r] for r in rts}
    seen: set[str] = set()
    for op in (o for o in graph.ops if o.kind == "matmul"):
        k, n = local_widths(op, graph, 1)
        tw, mx = (op_compute(op, graph, model, cluster, job, par, rts[r]) for r in ("tensorwise", "mxfp8"))
        assert mx.gemm_f == pytest.approx(tw.gemm_f * MXFP8_GEMM_TIME_RATIO)
        norm_fed = next(o for o in graph.ops if o.output == op.inputs[0]).kind == "norm"
        kind = "norm_input" if norm_fed else "input"
        fwd = (casts["mxfp8"][kind] - casts["tensorwise"][kind]) * k * tokens if op.inputs[0] not in seen else 0.0
        seen.add(op.inputs[0])
        bwd = (casts["mxfp8"]["grad_output"] - casts["tensorwise"]["grad_output"]) * n * tokens
        extra = tw.gemm_f * (MXFP8_GEMM_TIME_RATIO - 1) * cluster.efficiency.memory_bound_fraction
        assert mx.mem_f - tw.mem_f == pytest.approx(hbm_time_s(fwd, cluster) + extra, rel=1e-6, abs=1e-12), op.name
        assert mx.mem_b - tw.mem_b == pytest.approx(hbm_time_s(bwd, cluster) + extra, rel=1e-6, abs=1e-12), op.name


@pytest.fixture(scope="module")
def heldout():  # type: ignore[no-untyped-def]
    load_benchmark("fidelity", "fidelity")
    return load_benchmark("heldout", "heldout")


def test_heldout_recipe_pairs_on_one_layout_are_ordered_as_measured(heldout) -> None:  # type: ignore[no-untyped-def]
    """Megatron-Bridge's per-tensor current scaling vs MXFP8 on the same layout (Llama3 8B on 8 GB300 / GB200 /
    B200, Llama3.1 405B on 128 B200; 25.11 tables): measured MXFP8 is 4-6% slower; the model must order them so."""
    rows, _, cases = heldout.evaluate([heldout.ROOT / "benchmarks" / "data" / "more_runs.json"])
    by_id = {c["id"]: c for c in cases}
    pred = {r.id: (r.measured_s, r.predicted_s) for r in rows}
    groups: dict[tuple, dict[str, str]] = {}
    for rid in pred:
        c = by_id[rid]
        recipe = c.get("software", {}).get("fp8_recipe")
        if recipe in ("tensorwise", "mxfp8"):
            key = (c["group"], repr(c["model"]), repr(c["cluster"]), repr(c["job"]), repr(c["parallel"]))
            groups.setdefault(key, {})[recipe] = rid
    pairs = [g for g in groups.values() if len(g) == 2]
    assert len(pairs) >= 4
    for g in pairs:
        (m_tw, p_tw), (m_mx, p_mx) = pred[g["tensorwise"]], pred[g["mxfp8"]]
        assert (m_mx > m_tw) == (p_mx > p_tw) and abs(p_mx / p_tw - 1) > 0.005, g


def test_every_heldout_pair_of_recipes_is_ordered_as_measured(heldout) -> None:  # type: ignore[no-untyped-def]
    """All held-out pairs of one job whose runs state per-tensor current scaling and MXFP8 (same layout, or the 26.x
    tables' recipe-specific layouts: 405B GB300 FP8 tp4 vs MXFP8 tp2 cp2, GB200 vp 4 vs 8), by heldout.py's own
    ranking (pairs within one source)."""
    rows, _, cases = heldout.evaluate()
    by_id = {c["id"]: c for c in cases}

    def recipe(cid: str) -> str | None:
        return by_id[cid].get("software", {}).get("fp8_recipe")

    jobs: dict[tuple, list[str]] = {}
    for r in rows:
        jobs.setdefault(heldout.same_job(by_id[r.id]), []).append(r.id)
    pairs = {f"{a} vs {b}" for ids in jobs.values() for i, a in enumerate(ids) for b in ids[i + 1:]
             if {recipe(a), recipe(b)} == {"tensorwise", "mxfp8"}}
    _, _, wrong = heldout.ranking(rows, cases)
    assert len(pairs) >= 10  # 8B x3, 405B B200, 405B GB300 x3, 405B GB200 x3
    assert not pairs & set(wrong)


def test_te_sequence_parallel_gathers_move_the_quantized_copies() -> None:
    """TE's SP all-gathers under fp8 (Llama3 70B, GB200, tp 4 + SP): per-tensor recipes gather one fp8 copy (1 B) at
    every boundary; MXFP8 gathers its row-wise copy with E8M0 scales forward (column boundaries) and both copies of
    the output gradient backward (row boundaries); bf16 gathers 2 B. Reduce-scatters stay bf16."""
    from cost_models.collectives import bytes_sent_per_rank
    from cost_models.tp_comm import tp_boundaries, tp_boundary_costs

    model, cluster = load_model("llama3-70b"), build_cluster("gb200", 64)
    par = ParallelConfig(tp=4, micro_batch_size=1, sequence_parallel=True, zero_stage=1)
    graph = layer_graph(model, "dense", 8192)
    tokens = 8192

    def sent(precision: str, recipe: str | None) -> list[float]:
        job = JobSpec(global_batch_size=64, seq_len=8192, precision=precision)  # type: ignore[arg-type]
        rt = runtime_for("megatron", job, cluster, par, Software(fp8_recipe=recipe) if recipe else Software())
        return [b for _, b in tp_boundary_costs(graph, cluster, job, par, 1, True, rt)]

    bf16, tw, mx = sent("bf16", None), sent("fp8", "tensorwise"), sent("fp8", "mxfp8")
    scale = FP8 + E8M0 / MX
    for (tensor, role), b, t, m in zip(tp_boundaries(graph), bf16, tw, mx):
        elems = tokens * graph.tensors[tensor].width
        ag = (lambda byte: bytes_sent_per_rank("all_gather", byte * elems, par.tp))  # noqa: E731
        assert b - t == pytest.approx(ag(BF16 - FP8)), tensor
        assert m - t == pytest.approx(ag(scale - FP8) if role == "column" else ag(2 * scale - FP8)), tensor


@pytest.mark.parametrize("gpu", ["h100-sxm", "gb200"])
def test_sequence_parallel_casts_run_on_the_local_shard(gpu: str) -> None:
    """Under SP (tp 4) TE quantizes a column-parallel input (the norm's output) and a row-parallel output gradient on
    the local quarter, then gathers; per-tensor recipes cast row-wise only and, on a TN-only GPU (Hopper), transpose
    the gathered tensor (read 1, write 1). Bytes per gathered element, recounted from those kernels."""
    from cost_models.op_traffic import op_traffic_bytes

    model, cluster = load_model("llama3-70b"), build_cluster(gpu, 64)
    par = ParallelConfig(tp=4, micro_batch_size=1, sequence_parallel=True, zero_stage=1)
    graph = layer_graph(model, "dense", 8192)
    tokens, t, hopper = 8192, 4, gpu == "h100-sxm"
    q, o = graph.op("q_proj"), graph.op("o_proj")
    h = model.hidden_size
    transpose = 0 if not hopper else _bytes([(FP8, FP8)])
    expect = {  # (q_proj forward: norm-fed input of the fused qkv; o_proj backward: its output gradient)
        "delayed": ((FP8 - BF16) / t + transpose, _bytes([(BF16, FP8)]) / t + transpose),
        "tensorwise": (_bytes([(BF16, FP8)]) / t + transpose, _bytes([(BF16, 0), (BF16, FP8)]) / t + transpose),
        "mxfp8": (_bytes([(BF16, 2 * (FP8 + E8M0 / MX))]) / t,) * 2,
    }
    base = JobSpec(global_batch_size=64, seq_len=8192, precision="bf16")
    bf16 = runtime_for("megatron", base, cluster, par, Software())
    for recipe, (q_in, o_grad) in expect.items():
        if recipe == "mxfp8" and hopper:
            continue
        job = base.model_copy(update={"precision": "fp8"})
        rt = runtime_for("megatron", job, cluster, par, Software(fp8_recipe=recipe))
        blackwell = not hopper

        def extra(op, i):  # type: ignore[no-untyped-def]
            return (op_traffic_bytes(op, graph, model, job, par, rt, non_tn_gemm=blackwell)[i]
                    - op_traffic_bytes(op, graph, model, base, par, bf16, non_tn_gemm=blackwell)[i])

        assert extra(q, 0) == pytest.approx(q_in * h * tokens), recipe
        assert extra(o, 1) == pytest.approx(o_grad * h * tokens), recipe
