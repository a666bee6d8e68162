"""NVFP4 training (Transformer Engine ``NVFP4BlockScaling`` through Megatron-Core ``--fp4-format e2m1``) as the cost
model prices it (``cost_models.te_nvfp4``; GEMM in ``cost_models.gemm``, casts and gathers through ``te_fp8``).

- The quantization bytes are recounted from TE's kernel sequence (which kernels run, what each reads and writes,
  TE 5671fd36 as cited in te_nvfp4), not from the module's formula; every decoder GEMM pays them, the output layer
  (Megatron's own linear) none.
- The GEMM ratio is recomputed from TE's GEMM profiling guide's pre-quantized B300 table (which must add up).
- Refusals name the rule; an emitted plan is read back by Megatron's argument code; NVFP4 orders ahead of MXFP8.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autoplan.catalog import build_cluster, load_model
from autoplan.cli import cli
from benchmark_modules import load_benchmark
from cli_emit import emitted_megatron_args
from cost_models.estimate import estimate, head_cost
from cost_models.gemm import hbm_time_s, matmul_time_s
from cost_models.op_cost import op_compute
from cost_models.op_traffic import local_widths
from cost_models.memory import op_activation_bytes
from cost_models.opgraph import layer_graph
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for
from cost_models.te_fp8 import te_cast_bytes, te_gathered_cast_bytes, te_tp_gather_bytes
from cost_models.te_nvfp4 import NVFP4_GEMM_TIME_RATIO, NVFP4_SAVED_BYTES, NVFP4_WEIGHT_CACHE_BYTES

BF16, FP4, E4M3, BLOCK = 2, 0.5, 1, 16
COPY = FP4 + E4M3 / BLOCK  # one NVFP4 usage: E2M1 codes + an E4M3 scale per 16 elements

# TE's GEMM profiling guide, "Autocast vs Pre-quantized", B300 (docs/examples/gemm_profiling/gemm_profiling.rst at
# 1609c890e): per-layer ms (fprop, dgrad, wgrad) and the printed per-layer total.
PREQUANT = {"tensorwise": ((2.158, 2.329, 2.325), 6.812), "nvfp4": ((1.254, 1.305, 1.205), 3.764)}


def _bytes(kernels: list[tuple[float, float]]) -> float:
    return sum(r + w for r, w in kernels)


# NVFP4Quantizer::quantize_impl with RHT (inputs, output gradients), both usages: nvte_hadamard_transform_amax reads
# the tensor; nvte_quantize_v2 reads it and writes the row-wise copy; the fused RHT column-wise cast reads it and
# writes the column-wise copy. The norm does not fuse (post-RHT amax: UNFUSED), so a norm-fed input costs the same.
RHT_CAST = _bytes([(BF16, 0), (BF16, COPY), (BF16, COPY)])


def _llama(gpu: str = "gb200", precision: str = "nvfp4", tp: int = 1):  # type: ignore[no-untyped-def]
    model, cluster = load_model("llama3-8b"), build_cluster(gpu, 8)
    job = JobSpec(global_batch_size=16, seq_len=8192, precision=precision)
    par = ParallelConfig(tp=tp, micro_batch_size=2, zero_stage=1, sequence_parallel=tp > 1)
    return model, cluster, job, par


def test_nvfp4_cast_and_gather_bytes_follow_tes_kernels() -> None:
    cast = te_cast_bytes("nvfp4", non_tn_gemm=True)
    assert (cast.input, cast.norm_input, cast.grad_output) == pytest.approx((RHT_CAST,) * 3)
    assert RHT_CAST == pytest.approx(7.125)
    # SP: forward gathers the row-wise copy, backward both copies of the output gradient, all with their scales
    assert te_tp_gather_bytes("nvfp4") == pytest.approx((COPY, 2 * COPY))
    # ... after quantizing the local shard with every usage
    assert te_gathered_cast_bytes("nvfp4", True, 4) == pytest.approx(RHT_CAST / 4)
    assert NVFP4_SAVED_BYTES == pytest.approx(COPY)  # the forward keeps the column-wise copy for wgrad
    assert NVFP4_WEIGHT_CACHE_BYTES == pytest.approx(2 * COPY)


def test_nvfp4_gemm_ratio_is_tes_prequantized_measurement() -> None:
    for recipe, (passes, total) in PREQUANT.items():
        assert sum(passes) == pytest.approx(total, abs=0.002), recipe  # the table adds up
    assert NVFP4_GEMM_TIME_RATIO == pytest.approx(PREQUANT["nvfp4"][1] / PREQUANT["tensorwise"][1], abs=2e-4)


@pytest.mark.parametrize("gpu", ["b200", "gb200", "b300", "gb300"])
def test_nvfp4_gemm_runs_at_the_measured_ratio_capped_by_the_fp4_peak(gpu: str) -> None:
    cluster = build_cluster(gpu, 8)
    m, k, n = 16384, 8192, 28672  # compute-bound
    fp8, fp4 = (matmul_time_s(m, k, n, cluster, p) for p in ("fp8", "nvfp4"))
    cap = cluster.gpu.peak_fp8_tflops / cluster.gpu.peak_fp4_tflops
    assert fp4 / fp8 == pytest.approx(max(NVFP4_GEMM_TIME_RATIO, cap))
    slow = cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={
        "peak_fp4_tflops": 1.5 * cluster.gpu.peak_fp8_tflops})})
    assert matmul_time_s(m, k, n, slow, "nvfp4") / fp8 == pytest.approx(1 / 1.5)


def test_layer_prices_nvfp4_gemms_and_casts_against_bf16() -> None:
    """Llama3-8B on GB200 (tp 1): each decoder GEMM is the fp8 one × ``NVFP4_GEMM_TIME_RATIO``; its memory-bound bytes
    exceed bf16's by the RHT quantization of its input (q/k/v and gate/up once per input) and of its output
    gradient."""
    model, cluster, job, par = _llama()
    graph = layer_graph(model, "dense", job.seq_len)
    tokens = par.micro_batch_size * job.seq_len
    rt4 = runtime_for("megatron", job, cluster, par)
    bf = job.model_copy(update={"precision": "bf16"})
    f8 = job.model_copy(update={"precision": "fp8"})
    rt_bf = runtime_for("megatron", bf, cluster, par)
    rt8 = runtime_for("megatron", f8, cluster, par, Software(fp8_recipe="tensorwise"))
    seen: set[str] = set()
    for op in (o for o in graph.ops if o.kind == "matmul"):
        k, n = local_widths(op, graph, 1)
        c4, c8, cb = (op_compute(op, graph, model, cluster, j, par, r)
                      for j, r in ((job, rt4), (f8, rt8), (bf, rt_bf)))
        assert c4.gemm_f == pytest.approx(c8.gemm_f * NVFP4_GEMM_TIME_RATIO)
        fwd = RHT_CAST * k * tokens if op.inputs[0] not in seen else 0.0
        seen.add(op.inputs[0])
        bwd = RHT_CAST * n * tokens
        extra = (c4.gemm_f - cb.gemm_f) * cluster.efficiency.memory_bound_fraction
        assert c4.mem_f - cb.mem_f == pytest.approx(hbm_time_s(fwd, cluster) + extra, rel=1e-6, abs=1e-12), op.name
        assert c4.mem_b - cb.mem_b == pytest.approx(hbm_time_s(bwd, cluster) + extra, rel=1e-6, abs=1e-12), op.name


def test_output_layer_runs_bf16_and_saved_inputs_are_the_columnwise_copy() -> None:
    """Megatron's output layer is not a TE linear: under NVFP4 the head costs what it costs in bf16 (no FP4 GEMM, no
    casts). Decoder GEMM inputs are saved as NVFP4 column-wise copies (0.5625 of bf16's 2 B per element)."""
    model, cluster, job, par = _llama()
    bf = job.model_copy(update={"precision": "bf16"})
    head = layer_graph(model, "head", job.seq_len)
    rt4, rtb = runtime_for("megatron", job, cluster, par), runtime_for("megatron", bf, cluster, par)
    assert head_cost(head, cluster, job, par, rt4) == pytest.approx(head_cost(head, cluster, bf, par, rtb))
    lm = head.op("lm_head")
    assert op_activation_bytes(lm, job, par, rt4) == pytest.approx(op_activation_bytes(lm, bf, par, rtb))
    dense = layer_graph(model, "dense", job.seq_len)
    q = dense.op("q_proj")
    assert op_activation_bytes(q, job, par, rt4) == pytest.approx(op_activation_bytes(q, bf, par, rtb) * COPY / BF16)


def test_nvfp4_runtime_holds_the_cached_weights_and_no_tp_overlap() -> None:
    model, cluster, job, par = _llama(tp=2)
    rt = runtime_for("megatron", job, cluster, par)
    assert not rt.tp_comm_overlap and rt.fp8_saved_bytes == pytest.approx(COPY)
    assert rt.state_bytes(1.0, 1, 4)[0] == pytest.approx(BF16 + 2 * COPY)  # bf16 weight + TE's two NVFP4 copies
    fsdp = runtime_for("megatron", job, cluster, par.model_copy(update={"zero_stage": 3, "tp": 1,
                                                                        "sequence_parallel": False}))
    # --use-torch-fsdp2 shards the bf16 model (2 B / 4); the cache is of the gathered weight
    assert fsdp.state_bytes(1.0, 3, 4)[0] == pytest.approx(2.0 / 4 + 2 * COPY)
    assert rt.knobs()["fp8_recipe"] is None  # the recipe is the precision, not the fp8 knob
    assert (rt.tp_gather_bytes, rt.tp_grad_gather_bytes) == pytest.approx((COPY, 2 * COPY))


def test_nvfp4_weight_cache_is_of_the_te_linears_only() -> None:
    """TE caches quantized copies of the weights its linears use; the embedding and Megatron's own output layer
    (gpt_model.py:241, bf16 outside the FP4 autocast) have none. Llama3-8B pp 2: the first stage holds the embedding,
    the last the output layer; both stages' weights are bf16 for everything + the two NVFP4 copies of the layers."""
    from cost_models.memory import graphs_for, stage_memory, stage_params

    model, cluster, job, par = _llama()
    par = par.model_copy(update={"pp": 2})
    rt = runtime_for("megatron", job, cluster, par)
    layers = [model.num_layers // 2] * 2
    for s in (0, 1):
        ids = list(range(s * layers[0], (s + 1) * layers[0]))
        sp = stage_params(model, par, ids, first=s == 0, last=s == 1)
        body = stage_params(model, par, ids, first=False, last=False).dense
        mem = stage_memory(model, job, par, 8 // 2, s, layers, 4, graphs_for(model, job.seq_len), rt)
        assert mem.weights == pytest.approx(BF16 * sp.dense + 2 * COPY * body)
        assert sp.dense - body == pytest.approx((model.embedding_params if s == 0 else model.head_params))


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-80g", "mi300x"])
def test_nvfp4_is_refused_without_fp4_tensor_cores(gpu: str) -> None:
    res = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--gpu", gpu, "--gpus", "8", "--tp", "1",
                                   "--pp", "1", "--precision", "nvfp4"])
    assert res.exit_code == 2, res.output
    assert f"precision nvfp4 is impossible on {gpu}: it needs FP4 tensor cores" in res.output
    assert "valid: bf16" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["search", "--model", "llama3-8b", "--gpu", gpu, "--gpus", "8",
                                   "--precision", "nvfp4"])
    assert res.exit_code == 2 and "needs FP4 tensor cores" in res.output, res.output


@pytest.mark.parametrize("args, rule", [
    (["--target", "torchtitan"], "torchao's prototype nvfp4_training"),
    (["--target", "fsdp2"], "no fp4 linears"),
    (["--tp", "2", "--tp-comm-overlap"], "userbuffers for fp8 or bf16 only"),
    (["--fp8-recipe", "mxfp8"], "needs precision fp8"),
    (["--fp8-param-gather"], "fp8_param_gather with precision nvfp4"),
])
def test_nvfp4_refusals_name_the_rule(args: list[str], rule: str) -> None:
    base = ["estimate", "--model", "llama3-8b", "--gpu", "b200", "--gpus", "8", "--pp", "1", "--precision", "nvfp4"]
    res = CliRunner().invoke(cli, [*base, *args, *([] if "--tp" in args else ["--tp", "1"])])
    assert res.exit_code == 2 and rule in res.output, res.output


def test_emitted_nvfp4_plan_carries_megatrons_fp4_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The emitted arguments, read back with Megatron's flag names, run NVFP4 and no fp8; megatron-core's
    TransformerConfig accepts them (validate's config check)."""
    from autoplan.validate.megatron_checks import _check_config

    ns = emitted_megatron_args(["--model", "llama3-70b", "--gpu", "gb200", "--gpus", "64", "--tp", "2", "--pp", "4",
                                "--vp", "5", "--global-batch-size", "256", "--seq-len", "8192", "--precision",
                                "nvfp4", "--target", "megatron"], tmp_path)
    assert (ns.fp4, ns.fp4_recipe, ns.fp8, ns.tp_comm_overlap) == ("e2m1", "nvfp4", None, False)
    assert "TransformerConfig(num_layers=80" in _check_config(ns)


def test_megatron_lm_validates_the_emitted_nvfp4_launch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Megatron-LM's own parse_args / validate_args / core_transformer_config_from_args on the emitted launch script
    settle fp4 e2m1 with the nvfp4 recipe; the same list with fp8 added is refused by Megatron's rule (MLM:660)."""
    from autoplan.validate import megatron_lm

    if megatron_lm.checkout() is None:
        pytest.skip(megatron_lm.skip_reason())
    plan_json = tmp_path / "plan.json"
    res = CliRunner().invoke(cli, ["estimate", "--model", "llama3-70b", "--gpu", "gb200", "--gpus", "64", "--tp", "2",
                                   "--pp", "4", "--vp", "5", "--global-batch-size", "256", "--seq-len", "8192",
                                   "--precision", "nvfp4", "--format", "json"])
    assert res.exit_code == 0, res.output
    plan_json.write_text(res.output)
    res = CliRunner().invoke(cli, ["validate", "--plan", str(plan_json), "-o", str(tmp_path / "emit")])
    assert res.exit_code == 0 and "7 of 7 checks passed" in res.output, res.output
    argv = megatron_lm.launch_argv(tmp_path / "emit" / "train_megatron_torchrun.sh",
                                   megatron_lm.mock_data_env(128256, tmp_path))
    ok, both = megatron_lm.judge([
        {"argv": argv, "world_size": 64, "env": {}, "arch": 10, "setup": True},
        {"argv": [*argv, "--fp8-format", "hybrid"], "world_size": 64, "env": {}, "arch": 10, "setup": True}])
    assert ok["ok"] and (ok["facts"]["fp4"], ok["facts"]["fp4_recipe"], ok["facts"]["fp8"]) == ("e2m1", "nvfp4", None)
    assert not both["ok"] and "--fp4-format and --fp8-format cannot be used simultaneously" in both["error"]


def test_nvfp4_is_faster_than_mxfp8_on_a_gemm_bound_blackwell_job() -> None:
    model, cluster = load_model("llama3-70b"), build_cluster("gb200", 64)
    par = ParallelConfig(tp=2, pp=4, vp=5, micro_batch_size=1, zero_stage=1, sequence_parallel=True)
    step = {}
    for precision, knobs in (("nvfp4", None), ("fp8", Software(fp8_recipe="mxfp8")),
                             ("fp8", Software(fp8_recipe="tensorwise")), ("bf16", None)):
        job = JobSpec(global_batch_size=256, seq_len=8192, precision=precision)
        step[knobs.fp8_recipe if knobs else precision] = estimate(model, cluster, job, par, target="megatron",
                                                                  software=knobs).step_time_s
    assert step["nvfp4"] < step["tensorwise"] < step["mxfp8"] < step["bf16"]


@pytest.fixture(scope="module")
def heldout():  # type: ignore[no-untyped-def]
    load_benchmark("fidelity", "fidelity")
    return load_benchmark("heldout", "heldout")


def test_heldout_nvfp4_rows_are_priced_and_ordered_against_fp8(heldout) -> None:  # type: ignore[no-untyped-def]
    """The 10 Megatron-Bridge 26.02-26.06 NVFP4 rows resolve (precision nvfp4, their group's basis), fit, and every
    held-out pair of one job with an NVFP4 run is ordered as measured (NVFP4 ran faster than FP8 and MXFP8 in each)."""
    rows, skipped, cases = heldout.evaluate([heldout.ROOT / "benchmarks" / "data" / "more_runs.json"])
    mine = [r for r in rows if r.precision == "nvfp4"]
    assert len(mine) == 10 and all(r.fits for r in mine)
    assert not [s for s in skipped if "NVFP4" in s[0]]
    by_id = {c["id"]: c for c in cases}
    jobs: dict[tuple, list[str]] = {}
    for r in rows:
        jobs.setdefault(heldout.same_job(by_id[r.id]), []).append(r.id)
    prec = {r.id: r.precision for r in rows}
    pairs = {f"{a} vs {b}" for ids in jobs.values() for i, a in enumerate(ids) for b in ids[i + 1:]
             if "nvfp4" in (prec[a], prec[b]) and prec[a] != prec[b]}
    _, _, wrong = heldout.ranking(rows, cases)
    assert len(pairs) >= 20 and not pairs & set(wrong)


def test_search_fast_path_prices_nvfp4_as_estimate() -> None:
    """The stage DP's Scorer (prefix sums of cost_models' layer costs) and ``estimate`` agree on NVFP4 layouts, and
    the searched plan is what estimate prices (one cost model)."""
    from search.planner import search, to_parallel
    from search.score import Scorer
    from search.space import Tally, enumerate_layouts
    from cost_models.validate import stage_layers

    model, cluster = load_model("llama3-8b"), build_cluster("gb200", 16)
    job = JobSpec(global_batch_size=64, seq_len=8192, precision="nvfp4")
    layouts = list(enumerate_layouts(model, cluster, job, "megatron", {}, Tally()))
    scorer = Scorer(model, cluster, job)
    assert layouts
    for lay in layouts[:: max(1, len(layouts) // 12)]:
        par = to_parallel(model, lay, tuple(stage_layers(model, to_parallel(model, lay, (model.num_layers,)))))
        fs = scorer.score(lay, tuple(stage_layers(model, par)))
        pred = estimate(model, cluster, job, par, target="megatron", software=Software(**scorer.chosen_knobs(lay)))
        assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
        assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9)
    best = search(model, cluster, job, target="megatron", top_k=1, find_smallest_cluster=False).plans[0]
    assert best.prediction.software["fp8_recipe"] is None and not best.prediction.software["tp_comm_overlap"]
