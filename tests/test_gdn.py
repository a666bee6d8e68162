"""Gated DeltaNet hybrids (Qwen3-Next): the HF loader against transformers' own model, the catalog entry, and what the
loader refuses."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from autoplan.catalog import load_model
from autoplan.catalog.hf import HFConfigWarning, spec_from_hf_config
from autoplan.errors import UserInputError

HF = Path(__file__).parent / "data" / "hf"


def _config(**change: object) -> dict:
    return json.loads((HF / "qwen3-next-80b-a3b.json").read_text()) | change


def _hf_params(config: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in hf.parameters())


def test_published_config_counts_what_transformers_builds() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFConfigWarning)
        m = spec_from_hf_config(_config(), name="qwen3-next-80b-a3b")
    assert m == load_model("qwen3-next-80b-a3b")
    assert [m.layer_is_gdn(i) for i in range(8)] == [True, True, True, False] * 2
    assert m.num_attention_layers == 12
    assert m.num_params == _hf_params(_config())  # 79,674,391,296


@pytest.mark.parametrize("change", [
    {"layer_types": ["full_attention", "linear_attention"] * 24},  # not "every N-th full": N = 2 marks odd layers
    {"full_attention_interval": 3, "num_hidden_layers": 12},
    {"linear_num_value_heads": 48, "linear_key_head_dim": 64, "head_dim": 128},
    {"decoder_sparse_step": 2, "num_hidden_layers": 8},
    {"mlp_only_layers": [0, 1], "num_hidden_layers": 8},
])
def test_variants_count_what_transformers_builds(change: dict) -> None:
    """Every shape key the loader reads moves the count as transformers' model moves it (a pattern Megatron cannot
    express is refused instead: the first case)."""
    cfg = _config(**change)
    if "layer_types" in cfg and cfg["layer_types"][0] == "full_attention":
        with pytest.raises(UserInputError, match="layer_types"):
            spec_from_hf_config(cfg)
        return
    assert spec_from_hf_config(cfg).num_params == _hf_params(cfg)


def test_refusals_name_the_key() -> None:
    with pytest.raises(UserInputError, match=r"layer_types=.*every N-th layer"):
        spec_from_hf_config(_config(layer_types=["linear_attention"] * 3 + ["full_attention"] * 2
                                    + ["linear_attention"] * 43))
    with pytest.raises(UserInputError, match="layer_types"):
        spec_from_hf_config(_config(layer_types=["linear_attention", "sliding_attention"] * 24))
    with pytest.raises(UserInputError, match="num_value_heads"):
        spec_from_hf_config(_config(linear_num_value_heads=24))


# ---- pricing ----------------------------------------------------------------------------------------------------

def _tiny(key_heads: int = 2, value_heads: int = 4, dk: int = 16, dv: int = 32, attention_heads: int = 16):
    from cost_models.specs import ModelSpec

    return ModelSpec(name="tiny-gdn", num_layers=4, hidden_size=256, ffn_hidden_size=512,
                     num_attention_heads=attention_heads, num_kv_heads=2, vocab_size=1024,
                     gdn={"num_key_heads": key_heads, "num_value_heads": value_heads, "key_head_dim": dk,
                          "value_head_dim": dv, "full_attention_every": 4},
                     arch={"attention_output_gate": True})


def test_chunk_flops_are_what_megatron_cores_reference_kernel_multiplies() -> None:
    """The chunked gated delta rule's matmul FLOPs, counted by torch's FlopCounterMode on megatron-core 0.16.1's own
    torch implementation of the chunk algorithm (``torch_chunk_gated_delta_rule``, gated_delta_net.py:572-664, the
    WY form fla's chunk kernels compute): per token and value head 6·C·dk + 4·C·dv + 6·dk·dv forward, twice that
    backward. ``gdn_core_flops`` adds the triangular solve (C²/3; the reference runs it as a row loop of element-wise
    ops), fla's recomputed W, U and states in the backward, and the conv."""
    torch = pytest.importorskip("torch")
    ref = pytest.importorskip("megatron.core.ssm.gated_delta_net").torch_chunk_gated_delta_rule
    from torch.utils.flop_counter import FlopCounterMode

    from cost_models.gdn import gdn_core_flops

    m = _tiny()
    g = m.gdn
    hv, dk, dv, c, seq = g.num_value_heads, g.key_head_dim, g.value_head_dim, g.chunk_size, 256
    q, k = torch.randn(1, seq, hv, dk, requires_grad=True), torch.randn(1, seq, hv, dk, requires_grad=True)
    v = torch.randn(1, seq, hv, dv, requires_grad=True)
    state = torch.randn(1, hv, dk, dv, requires_grad=True)  # a learnt start: every state matmul has both gradients
    with FlopCounterMode(display=False) as fwd:
        out, last = ref(q, k, v, g=-torch.rand(1, seq, hv), beta=torch.rand(1, seq, hv), chunk_size=c,
                        initial_state=state, output_final_state=True)
    with FlopCounterMode(display=False) as bwd:
        (out.sum() + last.sum()).backward()  # the last state update's gradient too
    per_f = fwd.get_total_flops() / (seq * hv)
    per_b = bwd.get_total_flops() / (seq * hv)
    assert per_f == 6 * c * dk + 4 * c * dv + 6 * dk * dv == 17408
    assert per_b == 2 * per_f
    conv = 2 * g.conv_dim * g.conv_kernel
    ours_f, ours_b = gdn_core_flops(m)
    assert ours_f == pytest.approx(hv * (per_f + c * c / 3) + conv, rel=1e-12)
    assert ours_b == pytest.approx(hv * (2 * (per_f + c * c / 3) + 2 * c * dk + 2 * c * dv + 4 * dk * dv) + 2 * conv,
                                   rel=1e-12)
    assert gdn_core_flops(m, 2)[0] == pytest.approx(ours_f / 2, rel=1e-12)  # value heads and conv channels split


def test_qwen3_next_worked_numbers() -> None:
    """Qwen3-Next-80B-A3B at TP 1, per token: 32 value heads, dk = dv = 128, C = 64, conv 8192 channels x 4 taps."""
    from cost_models.gdn import gdn_core_flops, gdn_model_flops
    from cost_models.opgraph import layer_graph

    m = load_model("qwen3-next-80b-a3b")
    fwd, _ = gdn_core_flops(m)
    assert fwd == pytest.approx(32 * (6 * 64 * 128 + 4 * 64 * 128 + 6 * 128 * 128 + 64 * 64 / 3) + 2 * 8192 * 4)
    assert fwd == pytest.approx(5_876_394.67, abs=0.01)
    # Megatron-LM's MFU count (training.py:494-515): conv + 4 * Hv * dv^2, times the fma factor 2
    assert gdn_model_flops(m) == 2 * (4 * 8192 + 4 * 32 * 128 * 128) == 4_259_840
    graph = layer_graph(m, "gdn_moe", 4096)
    assert graph.params == m.layer_params(0)  # the graph holds the layer's weights exactly
    assert [o.name for o in graph.ops[:6]] == ["attn_norm", "in_proj", "gdn_core", "gdn_norm", "out_proj",
                                               "attn_residual"]
    assert graph.op("in_proj").flops_per_token == 2 * 2048 * (2 * 2048 + 2 * 4096 + 64)
    full = layer_graph(m, "moe", 4096)
    assert full.op("gate_proj").weight_out == m.q_dim  # the output gate's half of q_proj
    assert "attn_output_gate" in [o.name for o in full.ops]


def test_estimate_prices_qwen3_next_and_refuses_what_megatron_refuses() -> None:
    from autoplan.catalog.cluster import build_cluster
    from cost_models.errors import ConfigError
    from cost_models.estimate import estimate
    from cost_models.opgraph import layer_kinds
    from cost_models.specs import JobSpec, ParallelConfig

    m = load_model("qwen3-next-80b-a3b")
    assert layer_kinds(m)[:4] == ["gdn_moe", "gdn_moe", "gdn_moe", "moe"]
    cluster = build_cluster("h100-sxm", 64, target="megatron")
    job = JobSpec(global_batch_size=512, seq_len=4096)
    pred = estimate(m, cluster, job, ParallelConfig(tp=2, pp=2, ep=16, micro_batch_size=1), target="megatron")
    assert 0 < pred.step_time_s < 60 and pred.peak_memory_gib < 80
    with pytest.raises(ConfigError, match="does not support context parallelism"):
        estimate(m, cluster, job, ParallelConfig(tp=2, pp=2, cp=2, ep=8, micro_batch_size=1), target="megatron")
    tiny = _tiny(key_heads=2, value_heads=4)
    with pytest.raises(ConfigError, match=r"tp=4 must divide the Gated DeltaNet key heads \(2\)"):
        estimate(tiny, build_cluster("h100-sxm", 8, target="megatron"), JobSpec(global_batch_size=8, seq_len=1024),
                 ParallelConfig(tp=4), target="megatron")
    for target in ("torchtitan", "fsdp2"):
        with pytest.raises(ConfigError, match="Gated DeltaNet"):
            estimate(tiny, build_cluster("h100-sxm", 8, target=target), JobSpec(global_batch_size=8, seq_len=1024),
                     ParallelConfig(tp=1), target=target)


def _qwen3_next_64() -> tuple:
    from autoplan.catalog.cluster import build_cluster
    from cost_models.specs import JobSpec, ParallelConfig

    par = ParallelConfig(tp=2, pp=2, ep=16, micro_batch_size=1)
    return (load_model("qwen3-next-80b-a3b"), build_cluster("h100-sxm", 64, target="megatron"),
            JobSpec(global_batch_size=512, seq_len=4096), par)


def test_gdn_moe_layers_wait_on_their_host_as_moe_layers_do() -> None:
    """A Gated DeltaNet MoE layer's experts are the same MoE block, issued by the host behind the same dispatcher sync
    (opgraph.MOE_KINDS): at ep 16 (32 local experts) both kinds wait on the host (ep_comm.host_wait_s), and estimate's
    host-bound time is every layer's wait on the binding stage (an all-MoE stack: no cover, host_cover)."""
    from cost_models.estimate import estimate, graphs_for, runtime_for
    from cost_models.layer_cost import layer_cost
    from cost_models.opgraph import layer_kinds

    m, cluster, job, par = _qwen3_next_64()
    pred = estimate(m, cluster, job, par, target="megatron")
    rt = runtime_for("megatron", job, cluster, par, None)
    graphs = graphs_for(m, job.seq_len)
    lc = {k: layer_cost(graphs[k], m, cluster, job, par, pred.dp, rt) for k in ("gdn_moe", "moe")}
    assert lc["gdn_moe"].host_s > 0 and lc["moe"].host_s > 0
    kinds = layer_kinds(m)
    per_stage = [sum(lc[k].host_s for k in kinds[a:a + 24]) for a in (0, 24)]  # 24 + 24 layers (tp2 pp2)
    assert pred.layers_per_stage == [24, 24]
    assert pred.time.host_bound_s == pytest.approx(max(per_stage) * pred.num_microbatches, rel=1e-9)


def test_scorer_prices_the_gdn_moe_host_wait_as_estimate() -> None:
    """The search's Scorer (priced as estimate prices a GDN stack: no intra-op ILP) puts each kind's own host wait
    on its layers: its per-layer times are layer_cost's, host wait included, and its step time estimate's."""
    import numpy as np

    from cost_models.estimate import estimate, graphs_for
    from cost_models.layer_cost import layer_cost
    from cost_models.opgraph import layer_kinds
    from cost_models.targets import Software
    from search.score import Scorer
    from search.space import Layout

    m, cluster, job, par = _qwen3_next_64()
    sc = Scorer(m, cluster, job)
    lay = Layout(tp=2, cp=1, pp=2, dp=16, ep=16, micro_batch_size=1, m=32, recompute="none", zero_stage=1,
                 hsdp_shard_size=None, schedule="1f1b", vp=1)
    sw = Software(**sc.chosen_knobs(lay))
    pred = estimate(m, cluster, job, par, target="megatron", software=sw)
    rt = sc.runtime(lay)
    graphs = graphs_for(m, job.seq_len)
    want = {k: layer_cost(graphs[k], m, cluster, job, par, pred.dp, rt).total_s for k in ("gdn_moe", "moe")}
    got = np.diff(sc.layer_pieces(lay)[0])
    assert got == pytest.approx([want[k] for k in layer_kinds(m)], rel=1e-12)
    assert sc.score(lay, (24, 24)).step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
    lo = np.diff(sc.lower_pieces(lay)[0])
    assert (lo <= got * (1 + 1e-12)).all()


def test_search_equals_exhaustive_on_a_gdn_moe_stack() -> None:
    """The planner's bounds and stage DP over a stack with both MoE kinds, each waiting on its host (32 or 64 local
    experts on 2 GPUs), find estimate's best plan (search.exhaustive: every layout, split and knob setting)."""
    from autoplan.catalog.cluster import build_cluster
    from cost_models.specs import JobSpec, ModelSpec
    from search.exhaustive import exhaustive_search
    from search.planner import search

    m = ModelSpec(name="tiny-gdn-moe", num_layers=6, hidden_size=512, ffn_hidden_size=1024, num_attention_heads=8,
                  num_kv_heads=2, vocab_size=4096, num_experts=64, moe_top_k=4, moe_ffn_hidden_size=256,
                  moe_layer_freq=3, gdn={"num_key_heads": 4, "num_value_heads": 8, "key_head_dim": 64,
                                         "value_head_dim": 64, "full_attention_every": 2})
    cluster, job = build_cluster("h100-sxm", 2, target="megatron"), JobSpec(global_batch_size=16, seq_len=2048)
    ref = exhaustive_search(m, cluster, job, "megatron")
    assert ref is not None and ref.prediction.time.host_bound_s > 0
    res = search(m, cluster, job, target="megatron", top_k=3, find_smallest_cluster=False)
    assert res.plans[0].prediction.composite_cost == pytest.approx(ref.prediction.composite_cost, rel=1e-9)


def test_gdn_activations_split_over_tp() -> None:
    from cost_models.memory import op_activation_bytes
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig

    m = load_model("qwen3-next-80b-a3b")
    graph = layer_graph(m, "gdn_moe", 4096)
    core = graph.op("gdn_core")
    g = m.gdn
    per_token = 2 * (g.conv_dim + 2 * g.key_dim + 2 * 32 * 128 + g.value_dim + 32 * 64) + 6 * 32
    assert sum(s.bytes_per_token for s in core.saved) == per_token
    one = op_activation_bytes(core, JobSpec(seq_len=4096), ParallelConfig(tp=1), graph=graph)
    four = op_activation_bytes(core, JobSpec(seq_len=4096), ParallelConfig(tp=4), graph=graph)
    assert one == pytest.approx(per_token * 4096) and four == pytest.approx(one / 4)


# ---- Megatron emission ------------------------------------------------------------------------------------------

def _emitted_config(model, **par):  # type: ignore[no-untyped-def]
    """megatron-core's TransformerConfig from the emitted Megatron-LM arguments (as core_transformer_config_from_args
    maps them: autoplan.validate.megatron_checks), at tp = pp = ep = 1 unless ``par`` says otherwise."""
    from autoplan.catalog.cluster import build_cluster
    from autoplan.emit.megatron import megatron_args, parse_megatron_args
    from autoplan.emit.plan import EmitPlan
    from autoplan.validate.megatron_checks import transformer_config_kwargs
    from cost_models.specs import JobSpec, ParallelConfig

    plan = EmitPlan(model=model, cluster=build_cluster("h100-sxm", 8), job=JobSpec(global_batch_size=8, seq_len=4096),
                    parallel=ParallelConfig(tp=1))
    argv = megatron_args(plan)
    _, kw = transformer_config_kwargs(parse_megatron_args(argv))
    kw.update(moe_token_dispatcher_type="allgather", moe_grouped_gemm=False, moe_permute_fusion=False,
              use_cpu_initialization=True, perform_initialization=False, **par)
    return argv, kw


def test_emitted_flags_build_megatron_cores_gdn_layers() -> None:
    """The closest check this CPU machine can run of the model megatron-core 0.16.1 builds from the emitted flags: its
    GDN block spec (get_transformer_block_with_experimental_attention_variant_spec) asks for Transformer Engine
    (_get_backend_spec_provider: TESpecProvider, and get_gpt_layer_with_transformer_engine_spec for the attention
    layers), which is not installed here. So: megatron-core's own pattern functions place the GDN and MoE layers where
    autoplan prices them; megatron-core's own ``GatedDeltaNet`` module, built on meta from the emitted config with
    local linears and norm in TE's place (and flash-linear-attention, needed only by its forward, stood in for), holds
    autoplan's GDN weights (+ the input norm TE fuses into in_proj); megatron-core's local-spec gated
    ``SelfAttention`` holds autoplan's attention weights."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    import megatron.core.ssm.gated_delta_net as gdn_mod
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (get_linear_attention_pattern,
                                                                                     get_moe_layer_pattern)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.spec_utils import build_module

    from autoplan.validate.model_equivalence import _init_megatron

    m = load_model("qwen3-next-80b-a3b")
    argv, kw = _emitted_config(m)
    assert argv[argv.index("--linear-attention-freq") + 1] == "4" and "--attention-output-gate" in argv
    # the GPU run's TENorm takes zero-centred gamma from the config; the CPU build's WrappedTorchNorm refuses it
    # (torch_norm.py:26-28), so the modules are built without it (same weights: model_equivalence does the same)
    assert kw.pop("layernorm_zero_centered_gamma") is True
    _init_megatron()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = TransformerConfig(**kw)
        assert get_linear_attention_pattern(cfg) == [int(m.layer_is_gdn(i)) for i in range(m.num_layers)]
        assert get_moe_layer_pattern(cfg) == [int(m.is_moe_layer(i)) for i in range(m.num_layers)]
        local = LocalSpecProvider()
        subs = gdn_mod.GatedDeltaNetSubmodules(in_proj=local.column_parallel_linear(),
                                               out_norm=local.layer_norm(rms_norm=True, for_qk=False),
                                               out_proj=local.row_parallel_linear())
        saved_fla, saved_dev = gdn_mod.HAVE_FLA, torch.cuda.current_device
        gdn_mod.HAVE_FLA, torch.cuda.current_device = True, (lambda: "meta")  # type: ignore[assignment]
        try:
            with torch.device("meta"):
                theirs = gdn_mod.GatedDeltaNet(cfg, subs, layer_number=1, pg_collection=ProcessGroupCollection.
                                               use_mpu_process_groups())
                attn_spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm").submodules.self_attention
                attn = build_module(attn_spec, config=cfg, layer_number=4)
        finally:
            gdn_mod.HAVE_FLA, torch.cuda.current_device = saved_fla, saved_dev  # type: ignore[assignment]
        assert sum(p.numel() for p in theirs.parameters()) == m.gdn_params == 33_718_464
        assert m.layer_params(0) == m.gdn_params + m.moe_block_params + 2 * m.norm_params  # TE's fused in_proj norm: h
        assert sum(p.numel() for p in attn.parameters()) == m.attention_params  # q_proj doubled + q/k norms
    finally:  # the in-process groups would leak into later tests that start their own (torchtitan checks)
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def test_megatron_refuses_what_autoplan_refuses() -> None:
    """megatron-core's TransformerConfig refuses the layouts the target refuses (gdn_layout_error): CP, and a TP that
    does not divide the GDN heads."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer import TransformerConfig

    from cost_models.targets.megatron import gdn_layout_error

    m = _tiny(key_heads=2, value_heads=4)
    for tp, cp in ((1, 2), (4, 1)):
        assert gdn_layout_error(m, tp, cp) is not None
        _, kw = _emitted_config(m, tensor_model_parallel_size=tp, context_parallel_size=cp)
        with warnings.catch_warnings(), pytest.raises(AssertionError, match="parallel"):
            warnings.simplefilter("ignore")
            TransformerConfig(**kw)
    assert gdn_layout_error(m, 2, 1) is None


def test_facts_megatron_cannot_build_are_refused_at_emit() -> None:
    from autoplan.catalog.cluster import build_cluster
    from autoplan.emit.megatron import megatron_args
    from autoplan.emit.plan import EmitPlan
    from cost_models.errors import ConfigError
    from cost_models.specs import JobSpec, ParallelConfig

    base = _tiny()
    for update, match in (({"gdn": base.gdn.model_copy(update={"chunk_size": 128})}, "chunk_size=128"),
                          ({"arch": base.arch.model_copy(update={"activation": "quick_gelu"})}, "silu")):
        plan = EmitPlan(model=base.model_copy(update=update), cluster=build_cluster("h100-sxm", 8),
                        job=JobSpec(global_batch_size=8, seq_len=1024), parallel=ParallelConfig(tp=1))
        with pytest.raises(ConfigError, match=match):
            megatron_args(plan)


# ---- Qwen3.5 text stacks ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("stem", "causal_lm"), [("qwen3.5-default", "Qwen3_5ForCausalLM"),
                                                 ("qwen3.5-moe-default", "Qwen3_5MoeForCausalLM")])
def test_qwen3_5_text_decoder_counts_what_transformers_builds(stem: str, causal_lm: str) -> None:
    """The VLM file plans its text decoder (the vision tower warned as not planned), the bare text file the same;
    both hold the parameters transformers' text-only causal LM of that text_config holds."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from autoplan.catalog.hf import HFModelPartWarning

    vlm = json.loads((HF / f"{stem}.json").read_text())
    text = json.loads((HF / f"{stem}-text.json").read_text())
    with pytest.warns(HFModelPartWarning, match="vision encoder"):
        m = spec_from_hf_config(vlm, name="q")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert spec_from_hf_config(text, name="q") == m
    cfg_cls = getattr(transformers, causal_lm.replace("ForCausalLM", "TextConfig"))
    cfg = cfg_cls(**{k: v for k, v in text.items() if k not in ("architectures", "transformers_version", "model_type")})
    with torch.device("meta"):
        hf = getattr(transformers, causal_lm)(cfg)
    assert m.num_params == sum(p.numel() for p in hf.parameters())
    assert m.gdn is not None and m.gdn.full_attention_every == 4 and m.arch.attention_output_gate
    if "moe" in stem:
        assert m.num_moe_layers == m.num_layers and m.arch.router.norm_top_k  # Qwen3_5MoeTopKRouter renormalises


def test_qwen3_5_moe_plans_and_emits() -> None:
    from autoplan.catalog.cluster import build_cluster
    from autoplan.emit.megatron import megatron_args
    from autoplan.emit.plan import EmitPlan
    from cost_models.estimate import estimate
    from cost_models.specs import JobSpec, ParallelConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = spec_from_hf_config(json.loads((HF / "qwen3.5-moe-default.json").read_text()), name="qwen3.5-moe")
    cluster, job, par = build_cluster("h100-sxm", 16), JobSpec(global_batch_size=512, seq_len=4096), \
        ParallelConfig(tp=1, pp=2, ep=8, micro_batch_size=1)
    assert estimate(m, cluster, job, par, target="megatron").step_time_s > 0
    argv = megatron_args(EmitPlan(model=m, cluster=cluster, job=job, parallel=par))
    assert argv[argv.index("--num-layers") + 1] == "40" and "gated_delta_net" in argv


def test_validate_reads_the_gdn_variant_as_not_dsa(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """validate's Megatron-LM check compares the DSA facts Megatron-LM settled with the plan's: a Qwen3-Next launch
    settles experimental_attention_variant 'gated_delta_net' (and RoPE fusion on), which is not a DSA mismatch. The
    facts are those core_v0.16.1's setup returns for this launch (autoplan validate with MEGATRON_LM_PATH)."""
    from autoplan.catalog.cluster import build_cluster
    from autoplan.emit import EmitPlan, write_plan
    from autoplan.validate import megatron_lm
    from autoplan.validate.megatron_checks import _check_megatron_lm
    from cost_models.specs import JobSpec, ParallelConfig

    plan = EmitPlan(load_model("qwen3-next-80b-a3b"), build_cluster("h100-sxm", 64),
                    JobSpec(global_batch_size=256, seq_len=4096), ParallelConfig(tp=2, pp=2, ep=16))
    write_plan(plan, "megatron", tmp_path)
    settled = {"fp4": None, "fp4_recipe": None, "num_microbatches": plan.num_microbatches,
               "padded_vocab_size": plan.model.vocab_size, "dsa": ["gated_delta_net", None, None, None, None, True]}
    monkeypatch.setattr(megatron_lm, "judge", lambda cases: [{"ok": True, "stage": "", "facts": settled}])
    assert "pass parse_args" in _check_megatron_lm(plan, tmp_path)
    settled["dsa"] = ["dsa", None, None, None, None, True]  # a DSA variant the plan did not price still fails
    with pytest.raises(AssertionError, match="DSA"):
        _check_megatron_lm(plan, tmp_path)
