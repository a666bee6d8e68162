"""Megatron-Core's eager glue around GPT-OSS's grouped experts (op_traffic.MCORE_EXPERT_*, Runtime.mcore_expert_glue):
the installed megatron-core runs the activation clamp and fc2's bias op by op; the byte tables equal what autograd
dispatches over that code; a worked per-layer byte count; models without a clamp or expert biases do not move."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models import op_traffic as L
from cost_models.opgraph import layer_graph
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import runtime_for
from cost_models.targets.common import Software
from benchmark_modules import load_benchmark


def test_megatron_core_runs_the_clamp_and_fc2_bias_eagerly() -> None:
    """What the byte tables price is what megatron-core 0.16.1 does: with a clamp value, the fused quick-GeGLU's
    entry point clamps and concatenates the halves in eager PyTorch before its autograd function; fc2 is built
    with skip_bias_add (TE returns the bias) and TEGroupedMLP adds it per expert in ``_apply_bias``; fc1 is not
    (TE adds its bias in the GEMM)."""
    import megatron.core.fusions.fused_bias_geglu as geglu
    from megatron.core.transformer.moe import experts

    impl = inspect.getsource(geglu.weighted_bias_quick_geglu_impl)
    head = impl.split("WeightedBiasQuickGeGLUFunction.apply")[0]
    assert "if clamp_value is not None" in head and ".clamp(" in head and "torch.cat(" in head
    init = inspect.getsource(experts.TEGroupedMLP.__init__)
    fc1 = init.split("self.linear_fc1 = build_module(")[1].split(")\n")[0]
    fc2 = init.split("self.linear_fc2 = build_module(")[1].split(")\n")[0]
    assert "skip_bias_add=False" in fc1 and "skip_bias_add=True" in fc2
    fwd = inspect.getsource(experts.TEGroupedMLP.forward)
    assert "self._apply_bias(output, output_bias" in fwd and "weighted_bias_quick_geglu_impl(" in fwd
    assert "torch.split" in inspect.getsource(experts.TEGroupedMLP._apply_bias)  # expert by expert


def test_glue_bytes_are_what_autograd_dispatches() -> None:
    et = load_benchmark("eager_traffic", "eager_traffic")
    counted, priced = et.counted_megatron(), et.priced_megatron()
    for piece, (f, b) in counted.items():
        assert priced[piece][0] == pytest.approx(f, rel=0.01), piece
        assert priced[piece][1] == pytest.approx(b, rel=0.01), piece


def _layer(model_name: str, dispatcher: str = "alltoall"):  # type: ignore[no-untyped-def]
    model = load_model(model_name)
    cluster = build_cluster("b200", 64)
    job = JobSpec(global_batch_size=1280, seq_len=4096, precision="bf16")
    par = ParallelConfig(tp=1, pp=1, ep=8, micro_batch_size=4)
    rt = runtime_for("megatron", job, cluster, par, Software(moe_dispatcher=dispatcher))
    return model, layer_graph(model, "moe", job.seq_len), job, par, rt


@pytest.mark.parametrize("dispatcher,bias_bytes", [("alltoall", 12.0), ("hybridep", 28.0)])
def test_worked_byte_count_gpt_oss_120b(dispatcher: str, bias_bytes: float) -> None:
    """gpt-oss-120b, 4 x 4096 tokens per micro-batch, top-4: 65,536 routed tokens on each EP rank (balanced). The
    clamp adds 8 bytes per fc1-output element forward (2 x 2880 wide) and 13.5 backward; fc2's bias 12 (bf16 probs,
    alltoall) or 28 (fp32 probs, HybridEP upcasts them) per fc2-output element (2880 wide) forward."""
    model, graph, job, par, rt = _layer("gpt-oss-120b", dispatcher)
    assert rt.mcore_expert_glue
    routed = 4 * 4096 * 4
    act = next(o for o in graph.ops if o.name == "expert_act")
    down = next(o for o in graph.ops if o.name == "expert_down_proj")
    off = replace(rt, mcore_expert_glue=False)
    for op, fwd in ((act, 8.0 * 2 * 2880 * routed), (down, bias_bytes * 2880 * routed)):
        on_f, on_b = L.op_traffic_bytes(op, graph, model, job, par, rt)
        off_f, off_b = L.op_traffic_bytes(op, graph, model, job, par, off)
        assert on_f - off_f == pytest.approx(fwd)
        assert on_b > off_b
    clamp_bwd = L.op_traffic_bytes(act, graph, model, job, par, rt)[1] - L.op_traffic_bytes(act, graph, model, job,
                                                                                           par, off)[1]
    assert clamp_bwd == pytest.approx(13.5 * 2 * 2880 * routed)


def test_models_without_clamp_or_expert_bias_do_not_move() -> None:
    model, graph, job, par, rt = _layer("qwen3-235b-a22b")
    off = replace(rt, mcore_expert_glue=False)
    for op in graph.ops:
        assert L.op_traffic_bytes(op, graph, model, job, par, rt) == L.op_traffic_bytes(op, graph, model, job, par,
                                                                                        off)
    tt = runtime_for("torchtitan", job, build_cluster("b200", 64), par)
    assert not tt.mcore_expert_glue  # a megatron-core fact, not torchtitan's


def test_clamp_keeps_a_second_copy_unless_moe_act_recomputes_it() -> None:
    """Without recompute, the clamp keeps the fc1 output and the fused activation saves its clamped copy: the
    activation op saves twice the 2 x 2880-wide fc1 output per routed token; under ``moe_act`` the checkpoint keeps
    the fc1 output only (as for an unclamped model)."""
    from cost_models.memory import op_activation_bytes

    model, graph, job, par, rt = _layer("gpt-oss-120b")
    act = next(o for o in graph.ops if o.name == "expert_act")
    assert act.clamped
    fc1 = 2 * 2880 * 2.0 * 4 * 4096 * 4  # bf16 bytes of the fc1 output of 65,536 routed tokens
    off = replace(rt, mcore_expert_glue=False)
    assert op_activation_bytes(act, job, par, off, graph) == pytest.approx(fc1)
    assert op_activation_bytes(act, job, par, rt, graph) == pytest.approx(2 * fc1)
    moe_act = par.model_copy(update={"recompute": "selective", "recompute_modules": ("moe_act",)})
    assert op_activation_bytes(act, job, moe_act, rt, graph) == pytest.approx(fc1)


def test_megatron_core_drops_fused_rope_under_yarn() -> None:
    """What MCORE_UNFUSED_ROTARY_BYTES prices is what megatron-core 0.16.1 does: standard attention passes YaRN's
    concentration factor as ``mscale`` to ``apply_rotary_pos_emb``, which leaves TE's fused RoPE for the op-by-op
    ``_apply_rotary_pos_emb_bshd`` when it is not 1; GPT-OSS's factor (Bridge's provider leaves yarn_mscale unset)
    is the catalog's ``attention_factor``."""
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import _yarn_get_concentration_factor
    from megatron.core.transformer import attention

    src = inspect.getsource(rope_utils.apply_rotary_pos_emb)
    fused = src.split("if config.apply_rope_fusion:")[1].split("# use unfused implementation")[0]
    assert "if mscale != 1.0:" in fused and "use_unfused = True" in fused
    assert "mscale=_yarn_get_concentration_factor_from_config(self.config)" in inspect.getsource(
        attention.Attention.forward)
    rs = load_model("gpt-oss-120b").arch.rope_scaling
    assert rs.attention_factor == pytest.approx(_yarn_get_concentration_factor(32.0, None, None))
    assert rs.attention_factor == pytest.approx(1.3466, abs=1e-4)


def test_worked_rope_bytes_gpt_oss_120b() -> None:
    """gpt-oss-120b at tp 1, 4 x 4096 tokens: q (64 x 64) and k (8 x 64) per token through the op-by-op RoPE, 24 bytes
    per element forward and 28 backward (the fused kernel's 4 and 4); not under torchtitan, not for a model
    without YaRN (Qwen3-235B) nor for MLA's own fused YaRN RoPE (DeepSeek-V3)."""
    model, graph, job, par, rt = _layer("gpt-oss-120b")
    assert rt.mcore_yarn_unfused_rope
    rot = next(o for o in graph.ops if o.name == "rotary")
    elems = (64 * 64 + 8 * 64) * 4 * 4096
    assert L.op_traffic_bytes(rot, graph, model, job, par, rt) == pytest.approx((24.0 * elems, 28.0 * elems))
    off = replace(rt, mcore_yarn_unfused_rope=False)
    assert L.op_traffic_bytes(rot, graph, model, job, par, off) == pytest.approx((4.0 * elems, 4.0 * elems))
    assert not runtime_for("torchtitan", job, build_cluster("b200", 64), par).mcore_yarn_unfused_rope
    for name in ("qwen3-235b-a22b", "deepseek-v3"):
        other = load_model(name)
        g = layer_graph(other, "moe", job.seq_len)
        for op in g.ops:
            assert L.op_traffic_bytes(op, g, other, job, par, rt) == L.op_traffic_bytes(op, g, other, job, par, off)


def test_the_prediction_says_its_rope_is_not_the_emitted_runs() -> None:
    """The op-by-op RoPE is what a Bridge-built YaRN run does; the Megatron-LM command line autoplan emits has no YaRN
    and runs the fused kernel: the megatron prediction says so, a model without YaRN has no such note."""
    from cost_models.estimate import estimate

    def notes(name: str) -> list[str]:
        m = load_model(name)
        par = ParallelConfig(tp=1, pp=1, ep=8, micro_batch_size=1)
        return estimate(m, build_cluster("gb200", 64), JobSpec(global_batch_size=256, seq_len=4096), par,
                        target="megatron", check=False).notes

    assert any("priced as megatron-core runs YaRN" in n and "1.347" in n for n in notes("gpt-oss-120b"))
    assert not any("YaRN" in n for n in notes("qwen3-235b-a22b"))
