"""Megatron's selective recompute by module (``--recompute-modules``, cost_models.recompute): each module's time is
the forward of the ops it re-runs and its memory saving the tensors it stops keeping, recounted here from the
operator graph; Megatron's default (core_attn) is what plain ``selective`` prices; refusals name Megatron's rule."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autoplan.catalog import build_cluster, load_model
from autoplan.cli import cli
from cost_models.estimate import estimate
from cost_models.layer_cost import layer_cost
from cost_models.op_cost import op_compute
from cost_models.memory import activation_bytes_per_microbatch, graphs_for
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for
from tests.cli_emit import emitted_megatron_args

JOB = JobSpec(global_batch_size=2048, seq_len=4096)


def _setup(name: str = "deepseek-v3", gpu: str = "b200", gpus: int = 256):
    model, cluster = load_model(name), build_cluster(gpu, gpus)
    return model, cluster, graphs_for(model, JOB.seq_len)


def _par(**kw) -> ParallelConfig:
    return ParallelConfig(tp=1, pp=16, ep=8, **kw)


@pytest.mark.parametrize("name,gpus,kw", [("llama3-8b", 64, dict(tp=2, pp=2)),
                                          ("deepseek-v3", 256, dict(tp=1, pp=16, ep=8))])
def test_default_module_is_plain_selective(name: str, gpus: int, kw: dict) -> None:
    model, cluster = load_model(name), build_cluster("h100-sxm", gpus)
    a = estimate(model, cluster, JOB, ParallelConfig(recompute="selective", **kw))
    b = estimate(model, cluster, JOB, ParallelConfig(recompute_modules=("core_attn",), **kw))
    assert b.model_dump() == a.model_dump()


def _rerun_s(graph, model, cluster, par, rt, names: tuple[str, ...]) -> float:
    return sum(op_compute(op, graph, model, cluster, JOB, par, rt).forward_s for op in graph.ops if op.name in names)


def _saved(graph, model, par, rt, pairs: set[tuple[str, str]]) -> float:
    """Bytes the (op, tensor) pairs save for one micro-batch on one rank (tp 1, bf16: 2 bytes per element)."""
    tokens = par.micro_batch_size * JOB.seq_len
    return sum(s.bytes_per_token * tokens for op in graph.ops for s in op.saved if (op.name, s.tensor) in pairs)


@pytest.mark.parametrize("module,kind,ops,saved", [
    ("mla_up_proj", "moe", ("q_proj", "k_proj", "v_proj", "rotary"),
     {("attn_core", "q_rot"), ("attn_core", "k"), ("attn_core", "v")}),
    ("moe_act", "moe", ("expert_act",), {("expert_down_proj", "expert_act")}),
    # MLA's input norm is its own module; a dense layer's pre-MLP norm rides fc1's LayerNormLinear (separate_norm)
    ("layernorm", "dense", ("attn_norm",), {("q_down", "attn_in")}),
    ("mlp", "dense", ("gate_proj", "up_proj", "act", "down_proj"), {("act", "gate"), ("act", "up"),
                                                                   ("down_proj", "act")}),
    ("shared_experts", "moe", ("shared_gate_proj", "shared_up_proj", "shared_act", "shared_down_proj"),
     {("shared_act", "shared_gate"), ("shared_act", "shared_up"), ("shared_down_proj", "shared_act")}),
])
def test_module_reruns_its_ops_and_drops_their_tensors(module: str, kind: str, ops: tuple[str, ...],
                                                      saved: set[tuple[str, str]]) -> None:
    model, cluster, graphs = _setup()
    g = graphs[kind]
    none, par = _par(), _par(recompute_modules=(module,))
    rt = runtime_for("megatron", JOB, cluster, par)
    assert {(op.name, s.tensor) for op in g.ops for s in op.saved} >= saved  # the graph names these tensors
    lc = layer_cost(g, model, cluster, JOB, par, 16, rt)
    assert lc.recompute_s == pytest.approx(_rerun_s(g, model, cluster, par, rt, ops), rel=1e-12)
    assert lc.recompute_s > 0
    drop = (activation_bytes_per_microbatch(g, model, JOB, none, rt)
            - activation_bytes_per_microbatch(g, model, JOB, par, rt))
    assert drop == pytest.approx(_saved(g, model, par, rt, saved), rel=1e-12)


def test_mlp_module_leaves_moe_layers_alone() -> None:
    """Megatron recomputes ``mlp`` in dense layers only (transformer_layer.py:445-447)."""
    model, cluster, graphs = _setup()
    par = _par(recompute_modules=("mlp",))
    rt = runtime_for("megatron", JOB, cluster, par)
    assert layer_cost(graphs["moe"], model, cluster, JOB, par, 16, rt).recompute_s == 0.0
    assert activation_bytes_per_microbatch(graphs["moe"], model, JOB, par, rt) == pytest.approx(
        activation_bytes_per_microbatch(graphs["moe"], model, JOB, _par(), rt), rel=1e-12)


def test_moe_module_keeps_only_the_input_and_reruns_the_all_to_alls() -> None:
    model, cluster, graphs = _setup()
    g, none, par = graphs["moe"], _par(), _par(recompute_modules=("moe",))
    rt = runtime_for("megatron", JOB, cluster, par)
    a, b = layer_cost(g, model, cluster, JOB, none, 16, rt), layer_cost(g, model, cluster, JOB, par, 16, rt)
    assert b.ep_bytes == pytest.approx(1.5 * a.ep_bytes)  # dispatch + combine forward again: 6 all-to-alls, not 4
    moe_ops = {op.name for op in g.ops if op.kind in ("router", "dispatch", "experts", "combine")
               or op.name.startswith(("expert_", "shared_"))}
    kept = {(op.name, s.tensor) for op in g.ops for s in op.saved if op.name in moe_ops and s.tensor == "mlp_in"}
    dropped = {(op.name, s.tensor) for op in g.ops for s in op.saved if op.name in moe_ops} - kept
    drop = activation_bytes_per_microbatch(g, model, JOB, none, rt) - activation_bytes_per_microbatch(g, model, JOB,
                                                                                                     par, rt)
    assert drop == pytest.approx(_saved(g, model, par, rt, dropped), rel=1e-12)


def test_empty_module_list_recomputes_nothing(tmp_path) -> None:  # noqa: ANN001
    """Megatron-Bridge's ``recompute_modules=[]`` with selective granularity (GB300 DeepSeek-V3 perf config): nothing
    recomputed, priced as recompute none and emitted without recompute flags (Megatron-LM's --recompute-modules takes
    one or more)."""
    model, cluster, _ = _setup()
    a = estimate(model, cluster, JOB, _par())
    b = estimate(model, cluster, JOB, _par(recompute_modules=()))
    assert (b.step_time_s, b.peak_memory_gib) == (a.step_time_s, a.peak_memory_gib)
    assert (_par(recompute_modules=()).recompute, _par(recompute_modules=()).recompute_modules) == ("none", None)
    res = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--pp", "1",
                                   "--recompute-modules", ""])
    assert res.exit_code == 0 and "recompute=none" in res.output  # reported as what runs, not 'selective'
    ns = emitted_megatron_args(["--target", "megatron", "--model", "llama3-8b", "--gpus", "8", "--tp", "1",
                                "--recompute-modules", "", "--allow-over-memory"], tmp_path)
    assert ns.recompute_granularity is None and ns.recompute_modules is None


@pytest.mark.parametrize("args,match", [
    (["--model", "llama3-8b", "--recompute-modules", "mla_up_proj"], r"mla_up_proj needs multi-latent attention; "
     r"llama3-8b has none \(megatron/core/transformer/transformer_config.py:1218-1222\); valid: core_attn, layernorm"),
    (["--model", "deepseek-v3", "--ep", "8", "--pp", "16", "--precision", "fp8", "--gpu", "b200",
      "--recompute-modules", "moe_act", "--fp8-recipe", "delayed"], r"Delayed scaling does not support moe_act"),
    (["--model", "llama3-8b", "--recompute", "full", "--recompute-modules", "mlp"], r"only under "
     r"--recompute-granularity selective"),
    (["--model", "llama3-8b", "--recompute-modules", "attention"], r"'--recompute-modules': 'attention' is not a "
     r"Megatron recompute module \(valid: core_attn, moe_act, "),
    (["--model", "llama3-8b", "--recompute-modules", "moe"], r"no MoE layers"),
])
def test_refusals(args: list[str], match: str) -> None:
    res = CliRunner().invoke(cli, ["estimate", "--gpus", "256", "--tp", "1", "--pp", "1", "--global-batch-size",
                                   "2048", "--seq-len", "4096", *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    import re
    assert re.search(match, res.output), res.output


def test_moe_module_rerun_holds_the_layer_once_padded_to_capacity() -> None:
    """The backward of a ``moe``-checkpointed layer re-runs its forward with grad (CheckpointFunction.backward): the
    stage's peak holds that layer's saved tensors once (``memory.block_recompute_transient_bytes``), the expert rows
    padded to capacity under drop-and-pad (``_HybridEPManager.setup_metadata``: capacity · ep · local experts)."""
    from cost_models.memory import block_recompute_transient_bytes, op_activation_bytes

    model, cluster, graphs = _setup("deepseek-v3", "h100-sxm", 256)
    g = graphs["moe"]
    par = _par(recompute_modules=("moe_act", "moe", "core_attn"))
    rt = runtime_for("megatron", JOB, cluster, par)
    rerun = _par(recompute_modules=("moe_act", "core_attn"))
    layer = activation_bytes_per_microbatch(g, model, JOB, rerun, rt) - activation_bytes_per_microbatch(
        g, model, JOB, par, rt)
    assert layer > 0.1 * 2**30
    assert block_recompute_transient_bytes(model, JOB, par, graphs, rt, {"dense", "moe"}) == pytest.approx(layer)
    assert block_recompute_transient_bytes(model, JOB, _par(), graphs, rt, {"dense", "moe"}) == 0.0
    dense_1 = estimate(model, cluster, JOB, _par(recompute_modules=("moe_act", "core_attn")), target="megatron")
    dense_2 = estimate(model, cluster, JOB, par, target="megatron")
    assert dense_2.memory_gib["transients"] == pytest.approx(layer / 2**30, rel=1e-9)
    assert dense_1.memory_gib["transients"] == 0.0
    # capacity padding: every routed row × c, the rest unchanged
    padded = runtime_for("megatron", JOB, cluster, rerun, Software(moe_capacity_factor=1.1))
    for op in g.ops:
        a = op_activation_bytes(op, JOB, rerun, rt, g)
        b = op_activation_bytes(op, JOB, rerun, padded, g)
        assert b == pytest.approx(a * (1.1 if op.tokens_factor > 1 else 1.0))
    assert any(op.tokens_factor > 1 and op_activation_bytes(op, JOB, rerun, rt, g) > 0 for op in g.ops)


def test_moe_module_reruns_a_latent_moes_projections() -> None:
    """A latent MoE's ``fc1_latent_proj`` / ``fc2_latent_proj`` run inside the ``moe`` checkpoint (MoELayer's
    ``preprocess`` / ``postprocess`` in ``custom_forward``, moe_layer.py:420-425, 506-511, 556-597 @ core_v0.17.0):
    the backward re-runs them and their outputs are not kept (Nemotron 3 Super's MoE layers)."""
    from cost_models.recompute import reruns

    model = load_model("nemotron-3-super-120b-a12b")
    g = graphs_for(model, JOB.seq_len)["moe"]
    latent = [op for op in g.ops if op.name in ("fc1_latent_proj", "fc2_latent_proj")]
    assert len(latent) == 2
    assert all(reruns(op, g, frozenset({"moe"})) for op in latent)
    assert not any(reruns(op, g, frozenset({"moe_act", "layernorm"})) for op in latent)


def test_layernorm_module_skips_the_norms_transformer_engine_fuses() -> None:
    """Megatron-Core's ``layernorm`` recompute checkpoints only a norm that is its own module (transformer_layer.py:384,
    432 @ core_v0.16.1: not IdentityOp). Transformer Engine's GPT spec fuses the input norm into linear_qkv unless MLA
    and the pre-MLP norm into fc1 unless the layer is MoE (gpt_layer_specs.py:265, 291): on GPT-OSS (GQA, MoE) only
    the pre-MLP norm re-runs and only ``mlp_in`` is dropped; on a dense Llama nothing changes."""
    from cost_models.recompute import separate_norm

    assert [separate_norm(n, k, mla) for n, k, mla in (("attn_norm", "moe", False), ("attn_norm", "dense", True),
                                                        ("mlp_norm", "moe", False), ("mlp_norm", "dense", True),
                                                        ("attn_norm", "attention", False), ("mlp_norm", "mlp", False))
            ] == [False, True, True, False, False, False]
    model, cluster = load_model("gpt-oss-120b"), build_cluster("b200", 64)
    g = graphs_for(model, JOB.seq_len)["moe"]
    par, none = ParallelConfig(tp=1, ep=8, recompute_modules=("layernorm",)), ParallelConfig(tp=1, ep=8)
    rt = runtime_for("megatron", JOB, cluster, par)
    lc = layer_cost(g, model, cluster, JOB, par, 16, rt)
    assert lc.recompute_s == pytest.approx(_rerun_s(g, model, cluster, par, rt, ("mlp_norm",)), rel=1e-12)
    kept = {(op.name, s.tensor) for op in g.ops for s in op.saved if s.tensor == "attn_in"}  # linear_qkv's ln_out
    assert kept  # saved by the fused LayerNormLinear, and kept: only the norm outputs of separate norms go
    dropped = {(op.name, s.tensor) for op in g.ops for s in op.saved if s.tensor == "mlp_in"}
    drop = (activation_bytes_per_microbatch(g, model, JOB, none, rt)
            - activation_bytes_per_microbatch(g, model, JOB, par, rt))
    assert drop == pytest.approx(_saved(g, model, par, rt, dropped), rel=1e-12, abs=1.0)
    assert drop < _saved(g, model, par, rt, kept)
    dense, cl8 = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    gd, p8 = graphs_for(dense, JOB.seq_len)["dense"], ParallelConfig(tp=1, recompute_modules=("layernorm",))
    rt8 = runtime_for("megatron", JOB, cl8, p8)
    assert layer_cost(gd, dense, cl8, JOB, p8, 16, rt8).recompute_s == 0.0
