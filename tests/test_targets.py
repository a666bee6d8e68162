"""Target profiles (cost_models.targets): legality with the framework's reason, run-time semantics priced,
knobs checked, and the search space enumerating only what a target runs."""

from __future__ import annotations

import pytest

from autoplan import api
from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, PROFILES
from search.space import Tally, enumerate_layouts


@pytest.fixture(scope="module")
def ds3():  # type: ignore[no-untyped-def]
    return load_model("deepseek-v3")


def test_megatron_refuses_fsdp2_with_ep_citing_validate_args(ds3) -> None:  # type: ignore[no-untyped-def]
    cluster = build_cluster("h800", 2048)
    job = JobSpec(global_batch_size=4096, seq_len=4096)
    par = ParallelConfig(tp=1, pp=1, ep=256, zero_stage=3)
    with pytest.raises(ConfigError, match=r"--use-torch-fsdp2 is not supported with expert parallelism "
                                          r"\(Megatron-LM megatron/training/arguments.py@55ac7082:611\)"):
        MEGATRON.check(ds3, cluster, job, par)
    with pytest.raises(ConfigError, match="expert parallelism"):
        api.estimate({"model": "deepseek-v3", "cluster": {"gpu": "h800", "num_gpus": 2048},
                      "job": {"global_batch_size": 4096, "seq_len": 4096},
                      "parallel": {"tp": 1, "pp": 1, "ep": 256, "zero_stage": 3}, "target": "megatron"})


def test_search_space_holds_only_what_the_target_runs(ds3) -> None:  # type: ignore[no-untyped-def]
    cluster = build_cluster("h800", 2048)
    job = JobSpec(global_batch_size=4096, seq_len=4096)
    for target in ("megatron", "torchtitan"):
        prof = PROFILES[target]
        tally = Tally()
        n = 0
        for lay in enumerate_layouts(ds3, cluster, job, target, {"tp": 8}, tally):  # type: ignore[arg-type]
            n += 1
            assert lay.zero_stage in prof.zero_stages and lay.schedule in prof.schedules
            assert prof.layout_error(ds3, tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, zero=lay.zero_stage,
                                     hsdp=lay.hsdp_shard_size, dp_cp=lay.dp * lay.cp, schedule=lay.schedule) is None
        assert n > 0
        if target == "megatron":
            assert tally.counts["target_rule"] > 0  # ZeRO-3 with pp > 1 or ep > 1 was cut




def test_cli_estimate_illegal_layout_is_one_line_naming_the_rule() -> None:
    from click.testing import CliRunner

    from autoplan.cli import cli

    res = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--gpus", "16", "--tp", "1", "--pp", "2",
                                   "--zero", "3", "--target", "megatron"])
    assert res.exit_code == 2, res.output
    assert res.output.strip().count("\n") == 0 and "arguments.py@55ac7082" in res.output
    ok = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--gpus", "16", "--tp", "1", "--pp", "2",
                                  "--zero", "3", "--target", "torchtitan"])
    assert ok.exit_code == 0, ok.output


# ---- one runtime: the resolved target Runtime prices memory, DP traffic and the search ------------------------
def test_megatron_dp_gradients_travel_at_the_reduce_dtype() -> None:
    """fp32 main grads (Megatron default) hold 2 more bytes per parameter than --grad-reduce-in-bf16 and double the
    reduce-scatter; the all-gather of bf16 weights is the same: ZeRO-1 DP bytes (4 + 2) / (2 + 2) = 1.5."""
    from cost_models.estimate import estimate
    from cost_models.targets import Software

    model, cluster = load_model("llama3-70b"), build_cluster("h100-sxm", 1024)
    job, par = JobSpec(global_batch_size=512), ParallelConfig(tp=8, pp=8, zero_stage=1)
    fp32 = estimate(model, cluster, job, par, target="megatron")
    bf16 = estimate(model, cluster, job, par, target="megatron", software=Software(grad_reduce_dtype="bf16"))
    assert fp32.software["grad_reduce_dtype"] == "fp32" and bf16.software["grad_reduce_dtype"] == "bf16"
    assert fp32.comm_volume_gib["dp"] / bf16.comm_volume_gib["dp"] == pytest.approx(1.5)
    params = sum(model.layer_params(i) for i in range(10)) / 8 + model.embedding_params / 8  # stage 0 holds 10 layers
    held = (fp32.memory_gib["grads"] - bf16.memory_gib["grads"]) * 2**30
    assert held == pytest.approx(2.0 * params, rel=0.02)
    assert fp32.time.exposed_comm_s["dp"] >= bf16.time.exposed_comm_s["dp"]


@pytest.mark.parametrize("target,software", [("torchtitan", {"compile": True}), ("fsdp2", {}),
                                             ("megatron", {"grad_reduce_dtype": "bf16"})])
def test_scorer_prices_with_the_targets_runtime(target: str, software: dict) -> None:
    """The search Scorer holds the target's memory facts and knobs: it equals estimate with that runtime (and
    differs from Megatron's where the facts differ)."""
    from cost_models.estimate import estimate
    from cost_models.targets import Software, runtime_for
    from search.planner import to_parallel
    from search.score import Scorer

    model, cluster, job = load_model("llama3-8b"), build_cluster("h100-sxm", 64), JobSpec(global_batch_size=128)
    sw = Software(**software)
    scorer = Scorer(model, cluster, job, software=sw)
    lays = [lay for lay in enumerate_layouts(model, cluster, job, target, {}, Tally()) if lay.pp <= 2][:6]
    assert lays
    for lay in lays:
        par = to_parallel(model, lay, (model.num_layers,) if lay.pp == 1 else (16, 16))
        layers = (model.num_layers,) if lay.pp == 1 else (16, 16)
        rt = runtime_for(target, job, cluster, par, sw)
        assert scorer.runtime(lay) == rt
        fs, pred = scorer.score(lay, layers), estimate(model, cluster, job, par, runtime=rt)
        assert pred.software["target"] == target
        assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9)
        assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)


def test_megatron_zero2_is_megatron_fsdp_optim_grads_priced_as_it_runs() -> None:
    """ZeRO-2 on Megatron = Megatron-FSDP optim_grads: gradients sharded but reduce-scattered in every micro-batch
    (DP bytes m·4 + 2 against ZeRO-1's 4 + 2 per parameter), one model chunk's gradients held unsharded in its
    backward, the unbucketed chunks' (vp − 1)/vp of the reduce-scatter exposed; the search Scorer prices it as
    estimate does."""
    from cost_models.estimate import estimate
    from cost_models.memory import stage_params
    from cost_models.targets import runtime_for
    from cost_models.validate import pipeline_split
    from search.planner import to_parallel
    from search.score import Scorer

    model, cluster, job = load_model("llama3-8b"), build_cluster("h100-sxm", 64), JobSpec(global_batch_size=128)
    base = dict(tp=2, pp=2, vp=2, schedule="interleaved")
    z1 = estimate(model, cluster, job, ParallelConfig(**base, zero_stage=1), target="megatron")
    par = ParallelConfig(**base, zero_stage=2)
    z2 = estimate(model, cluster, job, par, target="megatron")
    m, dp = z2.num_microbatches, z2.dp
    assert z2.comm_volume_gib["dp"] / z1.comm_volume_gib["dp"] == pytest.approx((4 * m + 2) / 6)
    assert z2.memory_gib["grads"] == pytest.approx(z1.memory_gib["grads"] / dp)
    assert z2.memory_gib["weights"] == pytest.approx(z1.memory_gib["weights"])
    split = pipeline_split(model, par)
    s = z2.binding_stage
    body = stage_params(model, par, split.layer_ids[s], first=False, last=False)
    chunk = (body.dense + body.expert) * -(-split.rank_layers[s] // 2) / split.rank_layers[s]
    assert z2.memory_gib["transients"] * 2**30 == pytest.approx(4.0 * chunk)  # fp32 main grads of one chunk
    assert z2.time.exposed_comm_s["dp"] > z1.time.exposed_comm_s["dp"]
    scorer = Scorer(model, cluster, job)
    lays = [lay for lay in enumerate_layouts(model, cluster, job, "megatron", {"zero_stage": 2}, Tally())
            if lay.pp <= 2 and lay.vp <= 2][:8]
    assert lays and {lay.vp for lay in lays} == {1, 2}
    for lay in lays:
        layers = (model.num_layers,) if lay.pp == 1 else (16, 16)
        p = to_parallel(model, lay, layers)
        rt = runtime_for("megatron", job, cluster, p)
        assert rt.grad_reduce_every_microbatch and scorer.runtime(lay) == rt
        fs, pred = scorer.score(lay, layers), estimate(model, cluster, job, p, runtime=rt)
        assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9)
        assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)


def test_knob_the_target_lacks_is_one_line_naming_its_knobs() -> None:
    from click.testing import CliRunner

    from autoplan.cli import cli

    for cmd in (["estimate", "--tp", "1", "--pp", "1"], ["search"]):
        res = CliRunner().invoke(cli, [*cmd, "--model", "llama3-8b", "--gpus", "8", "--target", "megatron",
                                       "--compile"])
        assert res.exit_code == 2, res.output
        assert res.output.strip().count("\n") == 0
        assert ("megatron has no knob compile (its knobs: adam_moments_dtype, bf16_layers, cp_a2a_size, cp_comm_type, "
                "cpu_offload_layers, cross_entropy_fusion, cuda_graph_impl, cuda_graph_scope, dsa_kernel_backend, "
                "expandable_segments, "
                "fp8_param_gather, fp8_recipe, grad_reduce_dtype") in res.output


def test_predictions_report_every_knob_and_the_emitter_writes_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from click.testing import CliRunner

    from autoplan.cli import cli

    base = ["--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "1", "--target", "megatron"]
    res = CliRunner().invoke(cli, ["estimate", *base, "--grad-reduce-dtype", "bf16", "--format", "json"])
    assert res.exit_code == 0, res.output
    knobs = json.loads(res.output)["prediction"]["software"]
    assert knobs == {"target": "megatron", "tp_comm_overlap": True, "fp8_recipe": None, "grad_reduce_dtype": "bf16",
                     "cp_comm_type": "p2p", "overlap_grad_reduce": True, "overlap_param_gather": True,
                     "adam_moments_dtype": "fp32", "cpu_offload_layers": 0,
                     "fp8_param_gather": False, "cross_entropy_fusion": "none", "expandable_segments": False}
    text = CliRunner().invoke(cli, ["estimate", *base])
    assert "software: target=megatron tp_comm_overlap=True grad_reduce_dtype=fp32" in text.output
    plan = tmp_path / "plan.json"
    plan.write_text(res.output)
    for src, want in ((["--plan", str(plan)], True), (base[:-2], False)):
        out = tmp_path / f"out{want}"
        emitted = CliRunner().invoke(cli, ["emit", "--target", "megatron", "-o", str(out), *src])
        assert emitted.exit_code == 0, emitted.output
        script = "\n".join(p.read_text() for p in out.iterdir() if p.suffix == ".sh")
        assert ("--grad-reduce-in-bf16" in script) == want  # exactly when the runtime reduces in bf16


def test_schema_and_request_carry_software() -> None:
    from autoplan.schema import EstimateRequest, SearchRequest, json_schema

    text = str(json_schema())
    assert "grad_reduce_dtype" in text and "reshard_after_forward" in text
    req = EstimateRequest.model_validate({"model": "llama3-8b", "cluster": {"num_gpus": 8},
                                          "parallel": {"tp": 2}, "target": "torchtitan",
                                          "software": {"compile": True, "async_tp": True}})
    pred = api.estimate(req).prediction
    assert pred.software["compile"] is True and pred.software["async_tp"] is True
    assert "fsdp2" in str(SearchRequest.model_fields["target"].annotation)


def test_torchtitan_zero0_with_cp_is_priced_as_it_runs() -> None:
    """torchtitan shards over dp_shard x cp even with 'zero 0': estimate prices the FSDP it runs and says so."""
    base = {"model": "llama3-8b", "cluster": {"num_gpus": 16}, "job": {"global_batch_size": 16, "seq_len": 16384},
            "target": "torchtitan"}
    asked = api.estimate({**base, "parallel": {"tp": 1, "cp": 2, "zero_stage": 0}}).prediction
    runs = api.estimate({**base, "parallel": {"tp": 1, "cp": 2, "zero_stage": 3, "hsdp_shard_size": 2}}).prediction
    assert "runs_as" in asked.software and "FSDP over dp_shard x cp = 2" in asked.software["runs_as"]
    assert asked.peak_memory_gib == pytest.approx(runs.peak_memory_gib, rel=1e-12)
    assert asked.step_time_s == pytest.approx(runs.step_time_s, rel=1e-12)


def _tt(model: str, gpus: int, job: JobSpec, par: ParallelConfig, target: str = "torchtitan",
        flex_as_sdpa: bool = False, **knobs: object) -> float:
    """The step on ``target``; ``flex_as_sdpa``: FlexAttention at cuDNN SDPA's rate (the one kernel torchtitan 0.3.0
    runs and its 2024-12 / 2025 reference profiles do not: Runtime.titan_attention), to compare the rest."""
    from cost_models.estimate import estimate
    from cost_models.targets import Software

    cluster = build_cluster("h100-sxm", gpus)
    if flex_as_sdpa:
        same = {f: 1.0 for f in ("attention_flex_fwd", "attention_flex_bwd", "attention_flex_mla_fwd",
                                 "attention_flex_mla_bwd")}
        cluster = cluster.model_copy(update={"efficiency": cluster.efficiency.model_copy(update=same)})
    return estimate(load_model(model), cluster, job, par, target=target, software=Software(**knobs)).step_time_s


def test_knob_effects_move_the_step_the_published_way() -> None:
    """Async TP faster at tp > 1 and nothing at tp 1; rowwise Float8
    (more cast traffic, CUTLASS forward GEMM) and rowwise_with_gw_hp (bf16 weight-gradient GEMM) slower than
    tensorwise."""
    job = JobSpec(global_batch_size=16, seq_len=8192)
    fsdp = ParallelConfig(tp=1, zero_stage=3, micro_batch_size=2)
    tp8 = ParallelConfig(tp=8, zero_stage=3, micro_batch_size=2)
    assert _tt("llama3-70b", 64, job, tp8, compile=True, async_tp=True) < _tt("llama3-70b", 64, job, tp8,
                                                                               compile=True)
    assert _tt("llama3-8b", 8, job, fsdp, compile=True, async_tp=True) == _tt("llama3-8b", 8, job, fsdp,
                                                                               compile=True)
    fp8 = job.model_copy(update={"precision": "fp8"})
    # tensorwise: the 2024-12 torchtitan (reference profile; 0.3.0 refuses it), otherwise priced alike
    tensorwise = _tt("llama3-8b", 8, fp8, fsdp, "torchtitan-2024-12", compile=True, fp8_recipe="tensorwise")
    # rowwise_with_gw_hp: its bf16 weight-gradient GEMM makes it slower than tensorwise (torchao README, MI300X)
    assert tensorwise < _tt("llama3-8b", 8, fp8, fsdp, compile=True, fp8_recipe="rowwise")
    assert tensorwise < _tt("llama3-8b", 8, fp8, fsdp, compile=True, fp8_recipe="rowwise_with_gw_hp")
    # the 2024-12 torchtitan compiled the blocks only (its loss eager, e8977b0); 0.3.0 compiles the loss too:
    # priced alike without compile, the 2024-12 one slower with it (0.3.0's FlexAttention at SDPA's rate)
    assert _tt("llama3-8b", 8, fp8, fsdp, "torchtitan-2024-12", fp8_recipe="rowwise") \
        == _tt("llama3-8b", 8, fp8, fsdp, flex_as_sdpa=True, fp8_recipe="rowwise")
    assert _tt("llama3-8b", 8, fp8, fsdp, "torchtitan-2024-12", compile=True, fp8_recipe="rowwise") \
        > _tt("llama3-8b", 8, fp8, fsdp, flex_as_sdpa=True, compile=True, fp8_recipe="rowwise")
    # torchtitan 2025 (bbb1b616e .. tensorwise's removal): 0.3.0's compiled loss, 2024-12's tensorwise recipe, SDPA
    # where 0.3.0 runs FlexAttention (slower: attention_flex_*)
    for recipe in ("rowwise", "rowwise_with_gw_hp"):
        for compiled in (False, True):
            old = _tt("llama3-8b", 8, fp8, fsdp, "torchtitan-2025", compile=compiled, fp8_recipe=recipe)
            assert old == _tt("llama3-8b", 8, fp8, fsdp, flex_as_sdpa=True, compile=compiled, fp8_recipe=recipe)
            assert old < _tt("llama3-8b", 8, fp8, fsdp, compile=compiled, fp8_recipe=recipe)
    assert _tt("llama3-8b", 8, fp8, fsdp, "torchtitan-2025", fp8_recipe="tensorwise") \
        == _tt("llama3-8b", 8, fp8, fsdp, "torchtitan-2024-12", fp8_recipe="tensorwise")
    assert _tt("llama3-8b", 8, fp8, fsdp, "torchtitan-2025", compile=True, fp8_recipe="tensorwise") < tensorwise


def test_rowwise_backward_bytes_follow_torchao() -> None:
    """torchao Float8Linear's backward, as torchao's roofline counts its casts (roofline_utils.py at ao#1793) plus
    the rowwise slow-accum rescale pass (ao#1325): per output-gradient element rowwise 6 B fused under compile,
    rowwise_with_gw_hp 1 B fused / 3 B eager; per weight element rowwise 7 B (bf16 transpose + cast), gw_hp 3 B;
    the rescale adds 4 B per grad_weight element (rowwise) and per grad_input element, compiled or not: Inductor
    launches a kernel per GEMM for it (ao#2184)."""
    from cost_models.op_traffic import local_widths, op_traffic_bytes
    from cost_models.opgraph import layer_graph
    from cost_models.targets import Software, runtime_for

    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    job = JobSpec(global_batch_size=16, seq_len=8192, precision="fp8")
    par = ParallelConfig(tp=1, zero_stage=3, micro_batch_size=2)
    graph = layer_graph(model, "dense", job.seq_len)
    tokens = par.micro_batch_size * job.seq_len
    linears = [op for op in graph.ops if op.kind == "matmul"]
    weights = sum(k * n for k, n in (local_widths(op, graph, 1) for op in linears))
    inputs = sum(local_widths(op, graph, 1)[0] for op in linears) * tokens
    grads = sum(local_widths(op, graph, 1)[1] for op in linears) * tokens

    def bwd(recipe: str, compiled: bool) -> float:
        rt = runtime_for("torchtitan", job, cluster, par, Software(compile=compiled, fp8_recipe=recipe))
        return sum(op_traffic_bytes(op, graph, model, job, par, rt)[1] for op in linears)

    base = {c: bwd("rowwise_with_gw_hp", c) for c in (True, False)}
    assert base[False] - base[True] == pytest.approx((3.0 - 1.0) * grads)  # the unfused cast only
    extra = bwd("rowwise", True) - base[True]
    assert extra == pytest.approx((6.0 - 1.0) * grads + (7.0 - 3.0) * weights + 4.0 * weights)
    gw_hp_weights_cast = 3.0 * weights  # gw_hp's backward, compiled: its casts and the grad_input rescale, no more
    assert base[True] == pytest.approx(1.0 * grads + gw_hp_weights_cast + 4.0 * inputs)


def test_torchao_casts_after_a_bf16_tp_gather_are_unfused() -> None:
    """torchtitan's regular TP (rowwise recipes: bf16 sequence-parallel all-gathers) hands the column-parallel
    linears the gathered norm output and the row-parallel ones the gathered output gradient: torchao casts those
    after an NCCL kernel, unfused even under compile (rowwise 8 B per element instead of 6). Float8 tensorwise TP
    casts the local shard before its fp8 gather: fused as without TP."""
    from cost_models.op_traffic import COLUMN_KINDS, local_widths, op_traffic_bytes
    from cost_models.opgraph import layer_graph
    from cost_models.targets import Software, runtime_for

    model, cluster = load_model("llama3-70b"), build_cluster("h100-sxm", 64)
    job = JobSpec(global_batch_size=16, seq_len=8192, precision="fp8")
    graph = layer_graph(model, "dense", job.seq_len)
    linears = [op for op in graph.ops if op.kind == "matmul"]

    def traffic(recipe: str, sp: bool) -> tuple[float, float]:
        par = ParallelConfig(tp=8, zero_stage=3, micro_batch_size=2, sequence_parallel=sp)
        rt = runtime_for("torchtitan-2025", job, cluster, par, Software(compile=True, fp8_recipe=recipe))
        per_op = [op_traffic_bytes(op, graph, model, job, par, rt) for op in linears]
        return sum(f for f, _ in per_op), sum(b for _, b in per_op)

    tokens = 2 * job.seq_len
    inputs = {op.inputs[0]: local_widths(op, graph, 8)[0] for op in linears
              if graph.tensors[op.output].dim_kind in COLUMN_KINDS}  # one cast per gathered tensor (siblings share)
    grads = sum(local_widths(op, graph, 8)[1] for op in linears
                if graph.tensors[op.inputs[0]].dim_kind in COLUMN_KINDS)
    (f_sp, b_sp), (f_no, b_no) = traffic("rowwise", True), traffic("rowwise", False)
    assert f_sp - f_no == pytest.approx((8.0 - 6.0) * sum(inputs.values()) * tokens)
    assert b_sp - b_no == pytest.approx((8.0 - 6.0) * grads * tokens)
    assert traffic("tensorwise", True) == pytest.approx(traffic("tensorwise", False))


def test_async_tp_leaves_the_gathers_torchao_casts_whole() -> None:
    """Async TP fuses an all-gather only into matmuls that consume it (micro_pipeline_tp ``_find_consumer_matmuls``);
    under regular TP torchao's rowwise cast consumes the bf16 gathers (pytorch#149990): each boundary's all-gather
    is priced whole, its reduce-scatter at the async-TP share, as bf16's and Float8 tensorwise TP's all are."""
    from cost_models.collectives import group_collective_time_s
    from cost_models.tp_comm import tp_boundaries, tp_boundary_costs, tp_exposed_fraction
    from cost_models.opgraph import layer_graph
    from cost_models.targets import Software, runtime_for

    model, cluster = load_model("llama3-70b"), build_cluster("h100-sxm", 64, target="torchtitan-2025")
    par = ParallelConfig(tp=8, zero_stage=3, micro_batch_size=2, sequence_parallel=True)
    graph = layer_graph(model, "dense", 8192)

    def seconds(precision: str, recipe: str | None) -> float:
        job = JobSpec(global_batch_size=16, seq_len=8192, precision=precision)
        rt = runtime_for("torchtitan-2025", job, cluster, par, Software(compile=True, async_tp=True,
                                                                         fp8_recipe=recipe))
        return sum(sec for sec, _ in tp_boundary_costs(graph, cluster, job, par, 1, True, rt))

    job = JobSpec(global_batch_size=16, seq_len=8192, precision="bf16")
    rt = runtime_for("torchtitan-2025", job, cluster, par, Software(compile=True, async_tp=True))
    share = tp_exposed_fraction(8, cluster.efficiency, rt)
    assert 0.0 < share < 1.0
    one = sum(group_collective_time_s("all_gather", 2.0 * 2 * 8192 * graph.tensors[x].width, 8, 1, cluster)
              for x, _ in tp_boundaries(graph))  # every boundary gathers the same bf16 [tokens, hidden] once
    assert seconds("bf16", None) == pytest.approx(2 * one * share)  # all-gathers and reduce-scatters alike
    assert seconds("fp8", "rowwise") == pytest.approx(one * (1.0 + share))
    assert seconds("fp8", "tensorwise") < seconds("bf16", None)


def test_torchtitan_float8_tensorwise_tp_gathers_in_fp8() -> None:
    """torchtitan's Float8 tensorwise TP (torchao Float8ColwiseParallel/RowwiseParallel) all-gathers fp8 (1 B),
    reduce-scatters bf16: with SP each boundary runs one of each, so TP bytes are 3/4 of rowwise's, whose regular
    DTensor TP gathers bf16 like Megatron's."""
    from cost_models.tp_comm import tp_boundary_costs
    from cost_models.opgraph import layer_graph
    from cost_models.targets import Software, runtime_for

    model, cluster = load_model("llama3-70b"), build_cluster("h100-sxm", 64)
    job = JobSpec(global_batch_size=16, seq_len=8192, precision="fp8")
    par = ParallelConfig(tp=8, zero_stage=3, micro_batch_size=2, sequence_parallel=True)
    graph = layer_graph(model, "dense", job.seq_len)

    def tp_bytes(recipe: str | None) -> float:
        rt = None if recipe is None else runtime_for("torchtitan-2024-12", job, cluster, par,
                                                     Software(compile=True, fp8_recipe=recipe))
        return sum(b for _, b in tp_boundary_costs(graph, cluster, job, par, 1, True, rt))

    assert tp_bytes("rowwise") == pytest.approx(tp_bytes(None))
    assert tp_bytes("tensorwise") == pytest.approx(0.75 * tp_bytes("rowwise"))


def test_compile_is_faster_with_the_torchtitan_profile_efficiency() -> None:
    from autoplan.catalog.registry import framework_efficiency, resolve_over
    from cost_models.estimate import estimate
    from cost_models.targets import Software

    cluster = build_cluster("h100-sxm", 8)
    eff = cluster.efficiency.model_copy(update=resolve_over(cluster.efficiency, framework_efficiency("torchtitan")))
    cluster = cluster.model_copy(update={"efficiency": eff})
    m, job, par = load_model("llama3-8b"), JobSpec(global_batch_size=16), ParallelConfig(zero_stage=3)
    eager, fused = (estimate(m, cluster, job, par, target="torchtitan", software=Software(compile=c)).step_time_s
                    for c in (False, True))
    assert eager > fused * 1.02


def test_ulysses_moves_what_the_formula_says_and_is_exposed() -> None:
    """Ulysses all-to-all: 2·(w_q+w_k+w_v+w_o)/t per token re-split (forward and backward); ring P2P 3(c−1) K/V
    blocks hidden behind the attention."""
    from cost_models.estimate import estimate
    from cost_models.memory import graphs_for
    from cost_models.targets import Software

    m, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 16)
    job, par = JobSpec(global_batch_size=16, seq_len=32768), ParallelConfig(tp=1, cp=8)
    g = graphs_for(m, job.seq_len)["dense"]
    a2a = estimate(m, cluster, job, par, target="megatron", software=Software(cp_comm_type="a2a"))
    ring = estimate(m, cluster, job, par, target="megatron", software=Software(cp_comm_type="p2p"))
    tokens = job.seq_len / 8
    width = 2 * m.hidden_size + 2 * g.tensors["k"].width
    per_layer = 2 * tokens * width * 2.0 * 7 / 8
    assert a2a.comm_volume_gib["cp"] * 2**30 == pytest.approx(per_layer * m.num_layers * a2a.num_microbatches)
    ring_bytes = 3 * 7 * tokens * 2 * g.tensors["k"].width * 2.0
    assert ring.comm_volume_gib["cp"] * 2**30 == pytest.approx(ring_bytes * m.num_layers * ring.num_microbatches)
    assert a2a.software["cp_comm_type"] == "a2a" and ring.time.exposed_comm_s["cp"] == 0.0


def test_emitters_write_the_knobs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """torchtitan: compile and async TP flags; fsdp2: the integer reshard_after_forward; torchtitan refuses an
    integer (its config has no group size) in one line."""
    from click.testing import CliRunner

    from autoplan.cli import cli

    base = ["--model", "llama3-8b", "--gpus", "16", "--pp", "1"]
    tt = CliRunner().invoke(cli, ["emit", "--target", "torchtitan", "-o", str(tmp_path / "tt"), *base, "--tp", "2",
                                  "--compile", "--async-tp"])
    assert tt.exit_code == 0, tt.output
    script = (tmp_path / "tt" / "train_torchtitan_torchrun.sh").read_text()
    assert "--compile.enable" in script and "--compile.enable_async_tensor_parallel" in script
    f2 = CliRunner().invoke(cli, ["emit", "--target", "fsdp2", "-o", str(tmp_path / "f2"), *base, "--tp", "1",
                                  "--reshard-after-forward", "8"])
    assert f2.exit_code == 0, f2.output
    assert "RESHARD_AFTER_FORWARD = 8" in (tmp_path / "f2" / "autoplan_parallelize.py").read_text()
    bad = CliRunner().invoke(cli, ["estimate", *base, "--tp", "1", "--target", "torchtitan",
                                   "--reshard-after-forward", "8"])
    assert bad.exit_code == 2 and bad.output.strip().count("\n") == 0
    assert "reshard_after_forward=8 is not a torchtitan choice" in bad.output


def test_search_with_knobs_reports_them_on_every_plan() -> None:
    res = api.search({"model": "llama3-8b", "cluster": {"num_gpus": 16}, "job": {"global_batch_size": 64},
                      "target": "torchtitan", "top": 2, "software": {"compile": True}})
    assert res.plans and all(p.prediction.software["compile"] is True for p in res.plans)
    assert all(p.prediction.software["target"] == "torchtitan" for p in res.plans)


def test_torchtitan_fp8_recipes_are_what_torchtitan_accepts() -> None:
    """The 0.3.0 profile's fp8_recipe values are exactly the installed torchtitan's: the Float8 converter's
    ``recipe_name`` Literal (components/quantization/float8.py:58) plus ``mxfp8`` where the MXFP8 linear converter
    exists (mx.py); the 2024-12 reference profile adds only ``tensorwise`` (what the published runs used)."""
    import dataclasses
    import typing

    from torchtitan.components.quantization import float8, mx

    from cost_models.targets import REFERENCE_PROFILES, TORCHTITAN

    field = next(f for f in dataclasses.fields(float8.Float8LinearConverter.Config) if f.name == "recipe_name")
    hints = typing.get_type_hints(float8.Float8LinearConverter.Config)
    accepted = set(typing.get_args(hints[field.name]))
    assert accepted and "tensorwise" not in accepted
    if hasattr(mx, "MXFP8LinearConverter"):
        accepted.add("mxfp8")
    assert set(TORCHTITAN.knobs["fp8_recipe"].values) == accepted
    assert TORCHTITAN.knobs["fp8_recipe"].default == field.default
    for name in ("torchtitan-2024-12", "torchtitan-2025"):
        ref = REFERENCE_PROFILES[name]
        assert set(ref.knobs["fp8_recipe"].values) == accepted | {"tensorwise"}
        # and lack only debug.moe_force_load_balance (99fee810b, 2025-10-03: after these releases)
        assert {k: v for k, v in ref.knobs.items() if k != "fp8_recipe"} == \
            {k: v for k, v in TORCHTITAN.knobs.items() if k not in ("fp8_recipe", "moe_force_balance")}


def test_torchtitan_tensorwise_is_a_one_line_error() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "autoplan", "estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1",
                          "--target", "torchtitan", "--precision", "fp8", "--fp8-recipe", "tensorwise"],
                         capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert "tensorwise" in lines[0] and "float8.py:58" in lines[0]
    assert "rowwise" in lines[0] and "rowwise_with_gw_hp" in lines[0]
