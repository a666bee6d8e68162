"""Hybrid Mamba-2 stacks (Nemotron-H / Nemotron 3): ModelSpec's layer pattern and Mamba-2 mixer against transformers'
and megatron-core's own code, the HF reader, and the targets' rules.

megatron-core cannot build its MambaMixer here: ``MambaMixer.__init__`` raises ImportError without the mamba_ssm CUDA
package (megatron/core/ssm/mamba_mixer.py:173-176), which cannot be installed on this CPU machine. The parameter
count is therefore checked against transformers' NemotronHForCausalLM built on the meta device; megatron-core's real
pieces that run without CUDA kernels are checked directly: the layer allocation (mamba_hybrid_layer_allocation.py) and
the context-parallel head/group rules (MambaContextParallel's constructor)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from autoplan.catalog.hf import HFConfigWarning, spec_from_hf_config
from autoplan.errors import UserInputError
from cost_models.errors import ConfigError
from cost_models.specs import MambaSpec, ModelSpec

HF = Path(__file__).parent / "data" / "hf"
NANO = "nemotron-3-nano-30b-a3b"


def _config(stem: str = NANO) -> dict:
    return json.loads((HF / f"{stem}.json").read_text())


def _nano() -> ModelSpec:
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFConfigWarning)  # the published file has no unread key
        return spec_from_hf_config(_config(), name=NANO)


def _hf_model(cfg: dict):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "NemotronHConfig"):
        pytest.skip("transformers without NemotronH")
    keep = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
    with torch.device("meta"):
        return transformers.NemotronHForCausalLM(transformers.NemotronHConfig(**keep))


def test_nano_reads_the_published_config() -> None:
    m = _nano()
    assert m.hybrid_pattern is not None and len(m.hybrid_pattern) == m.num_layers == 52
    assert (m.hybrid_pattern.count("M"), m.hybrid_pattern.count("E"), m.hybrid_pattern.count("*")) == (23, 23, 6)
    assert m.mamba == MambaSpec(num_heads=64, head_dim=64, state_dim=128, num_groups=8)
    assert (m.num_experts, m.moe_top_k, m.num_shared_experts, m.expert_ffn_hidden_size) == (128, 6, 2, 1856)
    assert not m.gated_mlp and m.arch.activation == "relu2" and m.arch.no_position_encoding
    assert m.arch.router.score_function == "sigmoid" and m.arch.router.expert_bias
    assert m.arch.router.top_k_scaling == 2.5 and m.num_attention_layers == 6
    assert [m.is_moe_layer(i) for i in range(m.num_layers)] == [c == "E" for c in m.hybrid_pattern]


def test_nano_parameters_equal_transformers_model_per_block() -> None:
    """Every parameter of transformers' NemotronH built on the meta device, by block kind, = ModelSpec's."""
    cfg = _config()
    m = _nano()
    hf = _hf_model(cfg)
    named = dict(hf.named_parameters())
    total = sum(p.numel() for p in named.values())
    assert total == m.num_params == 31_577_937_344  # the model card's "31.6B total"
    for i, sym in enumerate(m.hybrid_pattern):
        got = sum(p.numel() for k, p in named.items() if k.startswith(f"model.layers.{i}."))
        assert got == m.layer_params(i), (i, sym)
    # one Mamba-2 mixer, piece by piece (mamba_mixer.py:268-379 builds the same tensors)
    mixer = {k.split("mixer.")[1]: p.numel() for k, p in named.items() if k.startswith("model.layers.0.mixer.")}
    mb = m.mamba
    assert mixer["in_proj.weight"] == m.hidden_size * (2 * mb.d_inner + 2 * mb.num_groups * mb.state_dim
                                                       + mb.num_heads)
    assert mixer["conv1d.weight"] == mb.conv_dim * mb.conv_kernel and mixer["conv1d.bias"] == mb.conv_dim
    assert mixer["A_log"] == mixer["D"] == mixer["dt_bias"] == mb.num_heads
    assert mixer["norm.weight"] == mb.d_inner and mixer["out_proj.weight"] == mb.d_inner * m.hidden_size
    assert sum(mixer.values()) == m.mamba_params


def test_latent_moe_parameters_equal_transformers() -> None:
    """The latent MoE (Nemotron 3 Super's moe_latent_size) on a small stack: experts at the latent width, shared
    experts at h, the two projections (transformers NemotronHMoE = megatron-core moe_layer.py:170-193)."""
    cfg = _config() | {"hybrid_override_pattern": "MEM*E-", "num_hidden_layers": 6, "moe_latent_size": 512,
                       "n_routed_experts": 16, "num_experts_per_tok": 4, "intermediate_size": 5376}
    m = spec_from_hf_config(cfg, name="latent")
    hf = _hf_model(cfg)
    assert sum(p.numel() for p in hf.parameters()) == m.num_params
    assert m.expert_params == 2 * 512 * 1856 and m.latent_projection_params == 2 * 2688 * 512


def test_megatron_core_allocates_the_same_layers() -> None:
    alloc = pytest.importorskip("megatron.core.ssm.mamba_hybrid_layer_allocation")
    m = _nano()
    layers = alloc.allocate_layers(m.num_layers, 0.0, 0.0, m.hybrid_pattern)
    assert "".join(layers) == m.hybrid_pattern
    attn, mamba, mlp, moe = alloc.get_layer_maps_from_layer_type_list(layers)
    assert sorted(moe) == [i for i in range(m.num_layers) if m.is_moe_layer(i)]
    assert sorted(attn) == [i for i in range(m.num_layers) if m.layer_has_attention(i)]
    assert len(mamba) == 23 and not mlp
    assert set(alloc.Symbols.VALID) == set("M*-E")


class _Group:
    """A process group's size and rank: all MambaContextParallel's constructor asks of one."""

    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return 0


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("cp", [1, 2, 4, 8, 16, 32])
def test_cp_rule_is_megatron_cores(tp: int, cp: int) -> None:
    """mamba_layout_error accepts exactly the (tp, cp) whose TP shard megatron-core's MambaContextParallel accepts
    (its assertions, mamba_context_parallel.py:99-124, run for real)."""
    pytest.importorskip("einops", reason="megatron-core's Mamba CP needs einops")
    from megatron.core.ssm.mamba_context_parallel import MambaContextParallel

    from cost_models.targets.megatron import mamba_layout_error

    m = _nano()
    mb = m.mamba
    ours = mamba_layout_error(m, tp, cp) is None
    try:
        MambaContextParallel(_Group(cp), mb.d_inner // tp, mb.num_heads // tp, mb.num_groups // tp, mb.state_dim,
                             None, None, None, None, False)
        theirs = True
    except AssertionError:
        theirs = False
    assert ours == theirs


@pytest.mark.parametrize(("tp", "cp"), [(1, 2), (2, 4), (4, 2), (4, 4), (8, 4), (2, 16)])
def test_mamba_cp_prices_what_megatron_cores_split_moves(tp: int, cp: int) -> None:
    """The Mamba CP all-to-all payload and the SSD scan's bytes follow MambaContextParallel's own split: B and C
    repeated ``group_repeat_count`` times before pre_conv_ssm's all-to-all (mamba_context_parallel.py:112-118,
    164-183), each rank's scan over the whole sequence with ``nheads_local_tpcp`` heads and ``ngroups_local_tpcp``
    groups (>= 1). Nano tp4 cp4: 2 groups per TP rank, repeat 2: 3088 elements per token before the scan, not 2576."""
    pytest.importorskip("einops", reason="megatron-core's Mamba CP needs einops")
    from megatron.core.ssm.mamba_context_parallel import MambaContextParallel

    from autoplan.catalog.cluster import build_cluster
    from cost_models.knob_effects import cp_comm
    from cost_models.mamba import ssd_traffic_bytes
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig

    m = _nano()
    mb = m.mamba
    theirs = MambaContextParallel(_Group(cp), mb.d_inner // tp, mb.num_heads // tp, mb.num_groups // tp,
                                  mb.state_dim, None, None, None, None, False)
    pre = (2 * theirs.d_inner_local_tp + 2 * theirs.ngroups_local_tp * theirs.group_repeat_count * theirs.d_state
           + theirs.nheads_local_tp)  # the widths pre_conv_ssm concatenates after its all-to-alls, times cp ranks
    post = theirs.d_inner_local_tpcp * cp  # post_conv_ssm's input [l_global, b, d_inner_local_tpcp], per local token
    if (tp, cp) == (4, 4):
        assert theirs.group_repeat_count == 2 and pre == 3088 and mb.in_proj_width // tp == 2576
    tokens = 8192 / cp
    par = ParallelConfig(tp=tp, cp=cp, micro_batch_size=1)
    _, sent, _, _, _ = cp_comm(layer_graph(m, "mamba", 8192), build_cluster("h100-sxm", 64), JobSpec(seq_len=8192), par,
                            tp, None, mb)
    assert sent == pytest.approx(2 * tokens * (pre + post) * 2.0 * (cp - 1) / cp, rel=1e-12)
    # a rank's scan = a tp1 cp1 mixer of megatron-core's per-rank heads and groups over the whole sequence
    rank = mb.model_copy(update={"num_heads": theirs.nheads_local_tpcp, "num_groups": theirs.ngroups_local_tpcp})
    whole = ssd_traffic_bytes(rank, 1)
    ours = ssd_traffic_bytes(mb, tp, cp)
    assert ours[0] * tokens == pytest.approx(whole[0] * 8192, rel=1e-12)
    assert ours[1] * tokens == pytest.approx(whole[1] * 8192, rel=1e-12)


@pytest.mark.parametrize(("tp", "cp"), [(1, 1), (4, 1), (1, 2), (4, 2), (4, 4), (8, 4), (2, 16)])
def test_mamba_saved_zxbcdt_is_the_tensor_megatron_core_scans(tp: int, cp: int) -> None:
    """MambaSplitConv1dScanCombinedFn saves ``zxbcdt`` as it receives it: after pre_conv_ssm's all-to-all, B and C
    repeated ``group_repeat_count`` times (mamba_context_parallel.py:112-118, 164-183; ssd_combined.py
    ctx.save_for_backward). Nano tp4 cp4: 3088 elements per local token (not in_proj_width / tp = 2576)."""
    pytest.importorskip("einops", reason="megatron-core's Mamba CP needs einops")
    from megatron.core.ssm.mamba_context_parallel import MambaContextParallel

    from cost_models.memory import op_activation_bytes
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig

    m = _nano()
    mb = m.mamba
    theirs = MambaContextParallel(_Group(cp), mb.d_inner // tp, mb.num_heads // tp, mb.num_groups // tp,
                                  mb.state_dim, None, None, None, None, False)
    width = cp * (2 * theirs.d_inner_local_tpcp + 2 * theirs.ngroups_local_tpcp * theirs.d_state
                  + theirs.nheads_local_tpcp)  # the scan's input is [b, l_global, width / cp] on each rank
    graph = layer_graph(m, "mamba", 8192)
    ssd = graph.op("ssd")
    par = ParallelConfig(tp=tp, cp=cp, micro_batch_size=2)
    ours = op_activation_bytes(ssd, JobSpec(seq_len=8192), par, graph=graph, mamba=mb)
    out_x = 2.0 * mb.d_inner / tp  # the scan's pre-gate output, heads split tp·cp over the whole sequence
    assert ours == pytest.approx(2 * 8192 / cp * (2.0 * width + out_x), rel=1e-12)
    if cp == 1:  # without CP: the graph's own in_proj_width / tp
        assert ours == pytest.approx(op_activation_bytes(ssd, JobSpec(seq_len=8192), par, graph=graph), rel=1e-12)
    if (tp, cp) == (4, 4):
        assert width == 3088


def test_megatron_refuses_tp_not_dividing_mamba_groups() -> None:
    from cost_models.targets.megatron import mamba_layout_error

    err = mamba_layout_error(_nano(), 16, 1)
    assert err is not None and "mamba_mixer.py:250, 258" in str(err) and err.valid[0] == 8


@pytest.mark.parametrize("target", ["torchtitan", "fsdp2"])
def test_targets_without_mamba_refuse_in_one_line(target: str) -> None:
    from cost_models.targets import get_profile

    err = get_profile(target).layout_error(_nano(), tp=1, pp=1, cp=1, ep=1, zero=3 if target != "fsdp2" else 3,
                                           hsdp=None, dp_cp=8, schedule="1f1b")
    assert err is not None and "hybrid Mamba-2 stack" in str(err) and "--target megatron" in str(err)
    assert "\n" not in str(err)


@pytest.mark.parametrize(("change", "message"), [
    ({"num_nextn_predict_layers": 1}, r"num_nextn_predict_layers=1.*mtp_hybrid_override_pattern"),
    ({"num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*X"}, r"mtp_hybrid_override_pattern='\*X'"),
    ({"mlp_hidden_act": "silu"}, r"mlp_hidden_act='silu'.*only 'relu2'"),
    ({"mamba_hidden_act": "gelu"}, r"mamba_hidden_act='gelu'"),
    ({"hybrid_override_pattern": "MEX"}, r"hybrid_override_pattern='MEX'"),
    ({"num_hidden_layers": 51}, r"num_hidden_layers=51.*52"),
    ({"mamba_proj_bias": True}, r"mamba_proj_bias=True"),
    ({"moe_shared_expert_intermediate_size": 1000}, r"moe_shared_expert_intermediate_size=1000"),
    ({"mamba_num_heads": 60}, r"num_heads \(60\) must be a multiple of num_groups \(8\)"),
])
def test_reader_refuses_what_it_cannot_represent(change: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        spec_from_hf_config(_config() | change)


def test_layers_block_type_spelling_reads_the_same() -> None:
    names = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
    cfg = {k: v for k, v in _config().items() if k != "hybrid_override_pattern"}
    cfg["layers_block_type"] = [names[c] for c in _config()["hybrid_override_pattern"]]
    assert spec_from_hf_config(cfg, name=NANO) == _nano()


def test_older_key_names_read_as_transformers_reads_them() -> None:
    """NemotronHConfig's older names (mamba_n_groups, mamba_d_conv, mamba_chunk_size, mamba_conv_bias, ...;
    configuration_nemotron_h.py ``__post_init__``) set the current fields: the spec takes what transformers' own
    config object holds, with no unread-key warning."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "NemotronHConfig"):
        pytest.skip("transformers without NemotronH")
    renames = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "chunk_size": "mamba_chunk_size",
               "use_conv_bias": "mamba_conv_bias", "expand": "mamba_expand", "time_step_min": "mamba_dt_min"}
    cfg = {k: v for k, v in _config().items() if k not in renames}
    cfg |= {"mamba_n_groups": 4, "mamba_d_conv": 2, "mamba_chunk_size": 256, "mamba_conv_bias": False,
            "mamba_expand": 2, "mamba_dt_min": 0.001}
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFConfigWarning)
        mb = spec_from_hf_config(cfg, name=NANO).mamba
    keep = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
    theirs = transformers.NemotronHConfig(**keep)
    assert (mb.num_groups, mb.conv_kernel, mb.chunk_size, mb.conv_bias) == \
        (theirs.n_groups, theirs.conv_kernel, theirs.chunk_size, theirs.use_conv_bias) == (4, 2, 256, False)


def test_both_spellings_of_a_key_must_agree() -> None:
    same = spec_from_hf_config(_config() | {"mamba_chunk_size": _config().get("chunk_size", 128)}, name=NANO)
    assert same == _nano()
    with pytest.raises(UserInputError, match=r"mamba_d_conv=2 and conv_kernel=4 disagree") as err:
        spec_from_hf_config(_config() | {"mamba_d_conv": 2, "conv_kernel": 4})
    assert "\n" not in str(err.value)


def test_spec_refuses_inconsistent_hybrid_fields() -> None:
    base = _nano().model_dump()
    for change, message in (({"hybrid_pattern": "M" * 51}, "51 layers"), ({"mamba": None}, "needs mamba"),
                            ({"hybrid_pattern": "M*" * 26}, "E layers need"), ({"first_dense_layers": 1}, "hybrid")):
        with pytest.raises(ValueError, match=message):
            ModelSpec.model_validate(base | change)


# ---- the cost model -------------------------------------------------------------------------------------------

# Nemotron-H 8B's shape (Megatron-Bridge NemotronHModelProvider8B, src/megatron/bridge/models/nemotronh/
# nemotron_h_provider.py): a dense hybrid whose d_inner = 128 x 64 = 2 x hidden, the value Megatron-LM's FLOPs formula
# assumes.
H8_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


def _h8() -> ModelSpec:
    return ModelSpec(name="nemotron-h-8b-shape", num_layers=52, hidden_size=4096, ffn_hidden_size=21504,
                     num_attention_heads=32, num_kv_heads=8, head_dim=None, vocab_size=131072, gated_mlp=False,
                     hybrid_pattern=H8_PATTERN,
                     mamba=MambaSpec(num_heads=128, head_dim=64, state_dim=128, num_groups=8),
                     arch={"no_position_encoding": True, "activation": "relu2"})


def _megatron_hybrid_flops(m: ModelSpec, batch: int, seq: int, d_in: int | None = None) -> float:
    """Megatron-LM core_v0.16.1 megatron/training/training.py num_floating_point_operations, its hybrid branch
    (calculate_layer_counts, attn/mlp/moe/mamba_layer_flops, hybrid_flops), transcribed term by term. ``d_in``: the
    Mamba inner width (Megatron writes 2 * hidden_size)."""
    h, s, pat = m.hidden_size, seq, m.hybrid_pattern
    n_attn, n_mamba, n_mlp, n_moe = pat.count("*"), pat.count("M"), pat.count("-"), pat.count("E")
    a, g, kv = m.num_attention_heads, m.num_kv_heads, m.head_dim_resolved
    p = kv * a / h
    attn = 4 * batch * s * h * p * (h + h * (g / a) + s / 2)
    mlp = 4 * (m.ffn_hidden_size / h) * 1.0 * batch * s * h**2
    mb = m.mamba
    d_in = d_in if d_in is not None else 2 * h
    mamba = (2 * batch * s * h * (2 * d_in + 2 * mb.num_groups * mb.state_dim + mb.num_heads)
             + 7 * batch * s * d_in * mb.state_dim + 2 * batch * s * d_in * h) if mb else 0.0
    shared = m.num_shared_experts * m.expert_ffn_hidden_size
    moe = (4 * batch * s * h * m.expert_ffn_hidden_size * m.moe_top_k + 4 * batch * s * h * shared) if n_moe else 0.0
    fwd = n_attn * attn + n_mlp * mlp + n_mamba * mamba + n_moe * moe + 2 * batch * s * h * m.vocab_size
    return 3 * fwd


def _our_flops(m: ModelSpec, batch: int, seq: int) -> float:
    from cost_models.estimate import _model_flops_per_step
    from cost_models.memory import graphs_for
    from cost_models.specs import JobSpec

    return _model_flops_per_step(m, graphs_for(m, seq), JobSpec(global_batch_size=batch, seq_len=seq))


def test_model_flops_are_megatrons_hybrid_formula() -> None:
    """Where Megatron's formula is exact (d_inner = 2h, no MoE router), ours equals it but for its causal halving of
    the attention scores, which autoplan's MFU convention does not take (model_flops_per_token)."""
    m, b, s = _h8(), 256, 8192
    # Megatron: 4·q_dim·(s/2) per token for the scores (causal); autoplan's MFU convention: 4·q_dim·s
    causal_half = 3 * 4 * b * s * m.q_dim * (s / 2) * m.hybrid_pattern.count("*")
    assert _our_flops(m, b, s) == pytest.approx(_megatron_hybrid_flops(m, b, s) + causal_half, rel=1e-12)


def test_nano_flops_differ_from_megatrons_by_named_terms() -> None:
    """Nemotron 3 Nano: Megatron's formula takes d_in = 2h = 5376 where the mixer is 64 x 64 = 4096 wide and leaves
    the router out; with the true width, the router and the causal term, ours equals it exactly."""
    m, b, s = _nano(), 512, 8192
    router = 3 * 2 * b * s * m.hidden_size * m.num_experts * m.num_moe_layers
    causal_half = 3 * 4 * b * s * m.q_dim * (s / 2) * m.num_attention_layers
    exact = _megatron_hybrid_flops(m, b, s, d_in=m.mamba.d_inner) + router + causal_half
    assert _our_flops(m, b, s) == pytest.approx(exact, rel=1e-12)
    megatron = _megatron_hybrid_flops(m, b, s)
    assert megatron > _our_flops(m, b, s) - router - causal_half  # its 2h inner width overcounts the mixers


def test_layer_graphs_hold_every_parameter_and_tp_boundaries() -> None:
    from cost_models.tp_comm import tp_boundaries
    from cost_models.opgraph import layer_graph, layer_kinds

    m = _nano()
    kinds = layer_kinds(m)
    assert all(layer_graph(m, kinds[i], 8192).params == m.layer_params(i) for i in range(m.num_layers))
    g = layer_graph(m, "mamba", 8192)
    # in_proj column-parallel, out_proj row-parallel (mamba_mixer.py:268-280, 367-379)
    assert tp_boundaries(g) == [("mamba_in", "column"), ("mamba_out", "row")]
    assert not any(op.name == "attn_core" for op in g.ops)


def test_mamba_activations_are_what_the_mixer_saves() -> None:
    """Per token, bf16: the norm's and in_proj's input (h each, sequence-split), zxbcdt and out_x (the fused
    kernel's save_for_backward), the gated norm's and out_proj's inputs (d_inner each), all but the first two ÷ tp."""
    from cost_models.memory import activation_bytes_per_microbatch
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig

    m, mb, s = _nano(), _nano().mamba, 4096
    g = layer_graph(m, "mamba", s)
    for tp, sp in ((1, False), (2, True), (4, False)):
        par = ParallelConfig(tp=tp, sequence_parallel=sp, micro_batch_size=2)
        got = activation_bytes_per_microbatch(g, m, JobSpec(seq_len=s), par)
        seq = 2 * m.hidden_size * 2 / (tp if sp and tp > 1 else 1)
        want = 2 * s * (seq + 2 * (mb.in_proj_width + 3 * mb.d_inner) / tp)
        assert got == pytest.approx(want, rel=1e-12), (tp, sp)


def _bytes_only(cluster):  # type: ignore[no-untyped-def]
    """``cluster`` with no SSD tensor-core rate: the scan priced by its HBM bytes alone."""
    return cluster.model_copy(update={"efficiency": cluster.efficiency.model_copy(update={"ssd_tflops": None})})


def test_ssd_scan_is_priced_by_its_bytes_or_its_flops() -> None:
    """The conv1d + SSD op costs its HBM bytes at the GPU's streaming bandwidth or its tensor-core FLOPs at the SSD
    kernels' rate (Efficiency.ssd_tflops), whichever is longer, forward and backward; both shrink with TP as the heads
    do. Without a rate: the bytes."""
    from autoplan.catalog.cluster import build_cluster
    from cost_models.gemm import hbm_time_s
    from cost_models.op_cost import op_compute
    from cost_models.mamba import ssd_flops, ssd_traffic_bytes
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig

    m = _nano()
    g = layer_graph(m, "mamba", 8192)
    op = g.op("ssd")
    job = JobSpec(seq_len=8192)
    for gpu in ("h100-sxm", "gb300"):
        cluster = build_cluster(gpu, 8)
        rate = cluster.efficiency.ssd_tflops * 1e12
        for tp in (1, 2):
            par = ParallelConfig(tp=tp, micro_batch_size=1)
            oc = op_compute(op, g, m, cluster, job, par)
            f, b = ssd_traffic_bytes(m.mamba, tp)
            ff, fb = ssd_flops(m.mamba, tp)
            assert oc.gemm_f == oc.attn_f == 0.0
            assert oc.mem_f == pytest.approx(max(hbm_time_s(f * 8192, cluster), ff * 8192 / rate), rel=1e-12)
            assert oc.mem_b == pytest.approx(max(hbm_time_s(b * 8192, cluster), fb * 8192 / rate), rel=1e-12)
            plain = op_compute(op, g, m, _bytes_only(cluster), job, par)
            assert plain.mem_f == pytest.approx(hbm_time_s(f * 8192, cluster), rel=1e-12)
    assert ssd_traffic_bytes(m.mamba, 2)[0] == pytest.approx(ssd_traffic_bytes(m.mamba, 1)[0] / 2)
    assert ssd_flops(m.mamba, 2)[1] == pytest.approx(ssd_flops(m.mamba, 1)[1] / 2)


def test_ssd_flops_are_the_kernels_matmuls() -> None:
    """Nano (Q 128, N 128, 8 groups, d_inner 4096), per token: forward C·Bᵀ 2·128·128·8 + chunk states and C·states
    2·2·4096·128 + the causal intra-chunk half 128·4096; backward 3 C·Bᵀ-sized (recomputed + two bmm backward),
    5 state-sized (recomputed states, dstates, B·dstates, dB, dC) and 3 causal intra-chunk products (dx, dCB, ddA)."""
    from cost_models.mamba import ssd_flops

    assert ssd_flops(_nano().mamba, 1) == (262144 + 2097152 + 524288, 3 * 262144 + 5 * 1048576 + 3 * 524288)


def test_ssd_rate_reproduces_mamba904s_generation_ratio() -> None:
    """gpus.yaml's hopper / blackwell ssd_tflops is benchmarks/mamba2_scaling.py's solve: the one rate at which the
    predicted GB200/H200 ratio of mamba#904's stack is the measured 1.51x (by bytes alone the model says 2.18x)."""
    from autoplan.catalog.cluster import build_cluster

    from benchmark_modules import load_benchmark

    scaling = load_benchmark("mamba2_scaling", "mamba2_scaling")
    rate = scaling.ssd_rate_fit()
    for gpu in ("h200", "gb200", "h100-sxm", "b200", "gb300", "b300"):
        assert build_cluster(gpu, 8).efficiency.ssd_tflops == pytest.approx(rate, rel=0.01), gpu
    measured = scaling.MEASURED_TFLOPS["gb200"] / scaling.MEASURED_TFLOPS["h200"]
    step = scaling.stack_steps(build_cluster("h200", 1).efficiency.ssd_tflops)
    assert step["h200"] / step["gb200"] == pytest.approx(measured, rel=0.01)
    plain = scaling.stack_steps(None)
    assert plain["h200"] / plain["gb200"] > 2.0


def test_a_blackwell_only_ssd_rate_cut_contradicts_mamba904() -> None:
    """The held-out Nemotron 3 Blackwell rows are under-predicted; ``--what-if blackwell.ssd_tflops=25`` closes Nano's
    gap. mamba#904 measured the same kernels (Megatron-Core trains through mamba_ssm's mamba_split_conv1d_scan_combined
    at core_v0.16.1-0.19.0) 1.51x faster on GB200 than on H200: with Hopper kept at the catalog's rate, a GB200 rate of
    25 predicts GB200 slower than H200, and the Hopper rate that measurement then needs is below the Blackwell one
    (the Hopper hybrid rows, within -0.6..+3.3% at 47.3 in s32, would move ~+10%: benchmarks/heldout.py --what-if)."""
    from autoplan.catalog.cluster import build_cluster

    from benchmark_modules import load_benchmark

    scaling = load_benchmark("mamba2_scaling", "mamba2_scaling")
    hopper = build_cluster("h200", 1).efficiency.ssd_tflops
    cut = scaling.stack_steps(hopper, 25.0)
    measured = scaling.MEASURED_TFLOPS["gb200"] / scaling.MEASURED_TFLOPS["h200"]
    assert cut["h200"] / cut["gb200"] < 1.0 < measured
    needed = scaling.hopper_rate_for(25.0)
    assert needed < 25.0 < hopper
    step = scaling.stack_steps(needed, 25.0)
    assert step["h200"] / step["gb200"] == pytest.approx(measured, rel=0.01)


def test_ssd_bytes_are_the_kernels_tensors_one_pass_each() -> None:
    """Nano tp1 per token (d 4096, heads 64, B/C 1024 each, conv 6144, chunk states 4096, C·Bᵀ 1024): each kernel of
    mamba_ssm's MambaSplitConv1dScanCombinedFn reads and writes its tensors once (bf16 2 B, fp32 4 B). Forward:
    conv 24,576 + cumsum 640 + chunk_state 27,136 + state_passing 24,576 + bmm 8,192 + chunk_scan 47,616 = 132,736;
    the backward (recomputed conv, cumsum, C·Bᵀ, states; then dz, dstates, state_passing_bwd, dx, dB, dC, dCB, two
    bmm_bwd, ddA, cumsum_bwd, conv_bwd) 436,352: 3.3x the forward, not the 2x + conv recompute priced before.
    This checks the arithmetic of the kernel table in ``mamba.py`` (mamba_ssm is not installed here), not its reading
    of the kernels, which cites mamba_ssm v2.2.6.post3 file by file."""
    from cost_models.mamba import ssd_traffic_bytes

    mb = _nano().mamba
    d, h, bc, conv, st, cb = 4096, 64, 1024, 6144, 4096, 1024
    assert (mb.d_inner, mb.num_heads, mb.num_groups * mb.state_dim, mb.conv_dim) == (d, h, bc, conv)
    assert (mb.num_heads * mb.head_dim * mb.state_dim // mb.chunk_size, mb.num_groups * mb.chunk_size) == (st, cb)
    kernels_fwd = {  # (bf16 elements, fp32 elements) read + written per token
        "causal_conv1d_fwd": (2 * conv, 0), "chunk_cumsum_fwd": (h, 2 * h),
        "chunk_state_fwd": (bc + d, 2 * h + st), "state_passing_fwd": (st, st), "bmm_chunk_fwd": (2 * bc, cb),
        "chunk_scan_fwd": (d + d + bc + st + 2 * d, cb + 2 * h),
    }
    kernels_bwd = {
        "causal_conv1d_fwd": (2 * conv, 0), "dt.clone": (2 * h, 0), "chunk_cumsum_fwd": (h, 2 * h),
        "bmm_chunk_fwd": (2 * bc, cb), "chunk_state_fwd": (bc + d, 2 * h + st), "state_passing_fwd": (0, 2 * st),
        "chunk_scan_bwd_dz": (6 * d, 0), "chunk_scan_bwd_dstates": (bc + d, h + st),
        "state_passing_bwd": (2 * st, 2 * st), "chunk_scan_chunk_state_bwd_dx": (3 * d + bc + st, 3 * h + cb),
        "chunk_state_bwd_db (+ sum)": (d + st + bc, 2 * h + 3 * bc),
        "chunk_scan_bwd_dC (+ sum)": (d + st + bc, h + 3 * bc),
        "chunk_scan_bwd_dcb (+ sum)": (2 * d, 2 * h + 3 * cb), "bmm_chunk_bwd x2": (4 * bc, 2 * (cb + bc)),
        "chunk_scan_bwd_ddAcs_stable": (2 * d, 3 * h + cb), "ddA flips, cumsum, adds": (0, 12 * h),
        "chunk_cumsum_bwd": (2 * h, 2 * h), "causal_conv1d_bwd": (3 * conv, 0),
    }
    fwd = sum(2 * b + 4 * f for b, f in kernels_fwd.values())
    bwd = sum(2 * b + 4 * f for b, f in kernels_bwd.values())
    assert (fwd, bwd) == (132736, 436352)
    assert ssd_traffic_bytes(mb, 1) == (fwd, bwd)


def test_layout_copies_around_the_scan_only_at_micro_batch_above_one() -> None:
    """MambaMixer._ssm_training makes zxBCdt batch-major and the scan's output sequence-major with
    rearrange(...).contiguous() (megatron-core's own source says so); torch copies only when the micro-batch holds
    more than one sequence. Nano tp1 mbs2: forward 2·2·(10304 + 4096) = 57,600 B/token, backward (in_proj's
    dzxbcdt made contiguous) 2·2·10304 = 41,216 B/token, added to the ssd op; mbs 1: nothing."""
    import inspect

    torch = pytest.importorskip("torch")
    from megatron.core.ssm.mamba_mixer import MambaMixer

    from autoplan.catalog.cluster import build_cluster
    from cost_models.gemm import hbm_time_s
    from cost_models.op_cost import op_compute
    from cost_models.mamba import layout_copy_bytes, ssd_traffic_bytes
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig

    src = inspect.getsource(MambaMixer._ssm_training)
    assert '"l b d -> b l d").contiguous()' in src and '"b l d -> l b d").contiguous()' in src
    for batch, copies in ((1, False), (2, True)):
        view = torch.empty(16, batch, 8).permute(1, 0, 2)  # "l b d -> b l d"
        assert (view.contiguous().data_ptr() != view.data_ptr()) == copies
    m = _nano()
    mb = m.mamba
    assert mb.in_proj_width == 10304 and mb.d_inner == 4096
    assert layout_copy_bytes(mb, 1, 1, 1) == (0.0, 0.0)
    assert layout_copy_bytes(mb, 1, 1, 2) == (2.0 * 2 * (10304 + 4096), 2.0 * 2 * 10304) == (57600.0, 41216.0)
    assert layout_copy_bytes(mb, 4, 1, 4)[1] == pytest.approx(41216.0 / 4)
    g = layer_graph(m, "mamba", 8192)
    cluster = _bytes_only(build_cluster("gb200", 8))  # the bytes (the scan's FLOPs may bind: the test above)
    par = ParallelConfig(tp=1, micro_batch_size=2)
    oc = op_compute(g.op("ssd"), g, m, cluster, JobSpec(seq_len=8192), par)
    f, b = ssd_traffic_bytes(mb, 1)
    assert oc.mem_f == pytest.approx(hbm_time_s((f + 57600.0) * 2 * 8192, cluster), rel=1e-12)
    assert oc.mem_b == pytest.approx(hbm_time_s((b + 41216.0) * 2 * 8192, cluster), rel=1e-12)


def test_pipeline_stages_see_each_layers_own_kind() -> None:
    """estimate prices each stage from its own layers' kinds: with first/last stage sizes that put all six attention
    layers' share unevenly, the slowest stage's compute is the sum of layer_cost over exactly its layers (Mamba, MoE,
    attention each priced as itself)."""
    from autoplan.catalog.cluster import build_cluster
    from cost_models.estimate import estimate
    from cost_models.layer_cost import layer_cost
    from cost_models.memory import graphs_for
    from cost_models.opgraph import layer_kinds
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets import runtime_for

    m = _nano()
    cluster = build_cluster("h100-sxm", 16, target="megatron")
    job = JobSpec(global_batch_size=64, seq_len=4096)
    par = ParallelConfig(tp=2, pp=2, ep=8, micro_batch_size=1, recompute="full", first_stage_layers=20,
                         last_stage_layers=32)
    pred = estimate(m, cluster, job, par, target="megatron")
    assert pred.layers_per_stage == [20, 32]
    dp, mb = 4, 64 // 4
    rt = runtime_for("megatron", job, cluster, par, None)
    graphs = graphs_for(m, job.seq_len)
    costs = {k: layer_cost(graphs[k], m, cluster, job, par, dp, rt) for k in set(layer_kinds(m))}
    ids = range(0, 20) if pred.slowest_stage == 0 else range(20, 52)
    kinds = [layer_kinds(m)[i] for i in ids]
    want = sum(costs[k].forward_s + costs[k].backward_s for k in kinds) * mb
    if pred.slowest_stage == 1:
        from cost_models.estimate import head_cost

        want += head_cost(graphs["head"], cluster, job, par, rt) * mb
    assert pred.time.compute_s == pytest.approx(want, rel=1e-9)
    assert len(set(kinds)) == 3  # the stage holds all three mixers


def test_megatron_refuses_interleaving_a_hybrid_stack() -> None:
    from autoplan.catalog.cluster import build_cluster
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets import get_profile

    prof, job = get_profile("megatron"), JobSpec(global_batch_size=64, seq_len=4096)
    with pytest.raises(ConfigError, match=r"mamba_block.py:173-176"):
        prof.check(_nano(), build_cluster("h100-sxm", 16), job, ParallelConfig(tp=2, pp=2, vp=2, ep=8))
    with pytest.raises(ConfigError, match=r"pp=8 must divide num_layers=52"):
        prof.check(_nano(), build_cluster("h100-sxm", 64), job, ParallelConfig(tp=1, pp=8, ep=8))
    prof.check(_nano(), build_cluster("h100-sxm", 64), job, ParallelConfig(tp=1, pp=8, ep=8, first_stage_layers=10,
                                                                           last_stage_layers=6))


@pytest.mark.parametrize("flag", ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"])
def test_accounting_on_a_hybrid_stack_names_mambastacks_rule_first(flag: str) -> None:
    """MambaStack takes no embedding / loss accounting at all (mamba_block.py:172-221): estimate says that, not
    the generic 'num_layers + embedding = 53 must divide evenly over pp*vp' of TransformerBlock's split."""
    from click.testing import CliRunner

    from autoplan.cli import cli

    res = CliRunner().invoke(cli, ["estimate", "--model", NANO, "--gpus", "16", "--tp", "2", "--pp", "2", flag])
    assert res.exit_code == 2, res.output
    assert "MambaStack splits its layers by count only" in res.output and "must divide evenly" not in res.output


def test_published_nano_throughput_is_megatrons_hybrid_formula() -> None:
    """Megatron-Bridge's Nemotron 3 Nano rows (benchmarks/data/more_runs_bridge2.json) publish TFLOP/s and tokens/s per
    GPU: their ratio is the FLOPs per token of Megatron-LM's hybrid formula as transcribed here (d_in = 2h), to the
    tables' rounding; autoplan's own count (true mixer width, router, no causal halving) is 1.1% lower."""
    m = _nano()
    per_token = _megatron_hybrid_flops(m, 1, 8192) / 8192
    rows = [c for c in json.loads((Path(__file__).parents[1] / "benchmarks" / "data" / "more_runs_bridge2.json")
                                  .read_text())["cases"] if "_Nemotron_3_Nano_" in c["id"]]
    assert len(rows) == 20
    ratios = sorted(c["measured"]["tflops_per_gpu"] * 1e12 / c["measured"]["tokens_per_s_per_gpu"] for c in rows)
    # the median row to 0.05%; every row to 1.5% (some tables' tokens/s are rounded to powers of two: 32768, 40960)
    assert ratios[len(ratios) // 2] == pytest.approx(per_token, rel=5e-4)
    assert all(r == pytest.approx(per_token, rel=0.015) for r in ratios)
    assert _our_flops(m, 1, 8192) / 8192 == pytest.approx(per_token * 0.989, rel=2e-3)


def test_megatron_refuses_fp8_mamba_projection_not_a_multiple_of_16() -> None:
    from autoplan.catalog.cluster import build_cluster
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets import get_profile, runtime_for

    odd = _nano().model_copy(update={"mamba": MambaSpec(num_heads=60, head_dim=64, state_dim=128, num_groups=6)})
    prof, cluster, par = get_profile("megatron"), build_cluster("h100-sxm", 8), ParallelConfig(tp=1, ep=8)
    job = JobSpec(global_batch_size=64, seq_len=4096, precision="fp8")
    assert odd.mamba.in_proj_width % 16  # 2*3840 + 1536 + 60
    with pytest.raises(ConfigError, match=r"mamba_mixer.py:241-245"):
        prof.check(odd, cluster, job, par, runtime_for("megatron", job, cluster, par, None))
    prof.check(_nano(), cluster, job, par, runtime_for("megatron", job, cluster, par, None))


@pytest.mark.parametrize(("pp", "first", "last"), [(2, None, None), (4, None, None), (2, 28, 24), (8, 10, 6),
                                                    (3, 20, None), (4, None, 16)])
def test_pipeline_split_is_mambastacks(pp: int, first: int | None, last: int | None) -> None:
    """The layers autoplan prices on each pipeline rank are the ones megatron-core's MambaStack selects
    (``MambaStack._select_layers_for_pipeline_parallel``, mamba_block.py:172-221, run for real on each rank)."""
    from types import SimpleNamespace

    pytest.importorskip("einops", reason="megatron-core's MambaStack module imports einops")
    from megatron.core.ssm.mamba_block import MambaStack

    from cost_models.specs import ParallelConfig
    from cost_models.validate import pipeline_split

    m = _nano()
    if first is None and last is None and m.num_layers % pp:
        pytest.skip("not an even split")
    par = ParallelConfig(pp=pp, first_stage_layers=first, last_stage_layers=last)
    ours = pipeline_split(m, par).layer_ids
    cfg = SimpleNamespace(virtual_pipeline_model_parallel_size=None, num_layers=m.num_layers,
                          num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last)
    for rank in range(pp):
        stack = SimpleNamespace(config=cfg, pp_group=SimpleNamespace(rank=lambda r=rank: r, size=lambda: pp))
        offset, chosen = MambaStack._select_layers_for_pipeline_parallel(stack, list(m.hybrid_pattern))
        assert tuple(range(offset, offset + len(chosen))) == ours[rank], rank
        assert "".join(chosen) == "".join(m.hybrid_pattern[i] for i in ours[rank])


@pytest.mark.parametrize("name", ["nemotron-h-8b", "nemotron-h-56b"])
def test_dense_hybrid_catalog_entries_equal_transformers(name: str) -> None:
    """The Nemotron-H catalog entries (Mamba-2 / attention / squared-ReLU MLP, no MoE) hold every parameter of
    transformers' NemotronH built from the same facts on the meta device (8.10B / 56.32B: the report's 8B / 56B)."""
    from autoplan.catalog import load_model

    m = load_model(name)
    mb = m.mamba
    cfg = {"model_type": "nemotron_h", "hybrid_override_pattern": m.hybrid_pattern, "hidden_size": m.hidden_size,
           "intermediate_size": m.ffn_hidden_size, "num_attention_heads": m.num_attention_heads,
           "num_key_value_heads": m.num_kv_heads, "head_dim": m.head_dim_resolved, "vocab_size": m.vocab_size,
           "mamba_num_heads": mb.num_heads, "mamba_head_dim": mb.head_dim, "ssm_state_size": mb.state_dim,
           "n_groups": mb.num_groups, "num_hidden_layers": m.num_layers}
    assert spec_from_hf_config(cfg, name=name).model_dump(exclude={"name"}) == m.model_dump(exclude={"name"})
    hf = _hf_model(cfg)
    assert sum(p.numel() for p in hf.parameters()) == m.num_params
    assert round(m.num_params / 1e9) == int(name.split("-")[-1].rstrip("b"))


def test_mlp_recompute_module_drops_a_hybrid_mlp_layers_activations() -> None:
    """Megatron's ``mlp`` recompute module checkpoints the MLP of a hybrid stack's '-' layer (MLPLayer, a
    TransformerLayer holding only the MLP): its saved activations shrink to what the checkpoint keeps."""
    from autoplan.catalog import load_model
    from cost_models.memory import activation_bytes_per_microbatch
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig

    m, job = load_model("nemotron-h-8b"), JobSpec(seq_len=4096)
    g = layer_graph(m, "mlp", job.seq_len)
    none = activation_bytes_per_microbatch(g, m, job, ParallelConfig())
    mlp = activation_bytes_per_microbatch(g, m, job, ParallelConfig(recompute_modules=("mlp",)))
    # kept: the layer input (its norm) and the MLP's input; dropped: up_proj's input copy, the activation's input,
    # down_proj's input (f-wide)
    assert mlp < none and none - mlp >= 2 * 4096 * 2 * m.ffn_hidden_size


def test_fast_scorer_equals_estimate_on_a_hybrid_stack() -> None:
    """One cost model: the search's Scorer (per-layer kinds in its stage tables) prices hybrid layouts exactly as
    estimate does — time, peak memory and fit — for layouts with pp 1 and 2 (stages of different mixer mixes), and
    the memory lower bound stays below the peak."""
    from autoplan.catalog.cluster import build_cluster
    from cost_models.estimate import estimate
    from cost_models.pipeline_split import fields_for
    from cost_models.specs import JobSpec, ParallelConfig
    from cost_models.targets import Software
    from search.score import Scorer
    from search.space import Tally, enumerate_layouts

    m = _nano()
    cluster, job = build_cluster("h100-sxm", 16, target="megatron"), JobSpec(global_batch_size=64, seq_len=4096)
    layouts = list(enumerate_layouts(m, cluster, job, "megatron", {}, Tally()))
    picked = [lay for lay in layouts if lay.pp == 2][::7][:6] + [lay for lay in layouts if lay.pp == 1][::23][:6]
    assert len(picked) >= 8 and all(lay.vp == 1 for lay in layouts)
    scorer = Scorer(m, cluster, job)
    for lay in picked:
        for layers in ((m.num_layers // lay.pp,) * lay.pp, (20, 32) if lay.pp == 2 else (m.num_layers,)):
            par = ParallelConfig(**{**lay.parallel_kwargs(), **fields_for(layers, lay.vp)})
            fs = scorer.score(lay, layers)
            pred = estimate(m, cluster, job, par, target="megatron", software=Software(**scorer.chosen_knobs(lay)))
            assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9), (lay, layers)
            assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9), (lay, layers)
            assert fs.fits == pred.fits
            assert scorer.memory_lower_bound(lay) <= fs.peak_memory_bytes * (1 + 1e-12)


def test_a_pinned_tp_the_mixer_cannot_split_is_refused_naming_the_rule() -> None:
    from autoplan.catalog.cluster import build_cluster
    from cost_models.specs import JobSpec
    from search.planner import search

    m = _nano().model_copy(update={"mamba": MambaSpec(num_heads=64, head_dim=64, state_dim=128, num_groups=4)})
    with pytest.raises(ConfigError, match=r"no layout keeps tp=8 \(tp=8 must divide the Mamba heads \(64\) and groups "
                                          r"\(4\).*mamba_mixer.py:250, 258\)\); valid: 1, 2, 4$"):
        search(m, build_cluster("h100-sxm", 8, target="megatron"), JobSpec(global_batch_size=64, seq_len=4096),
               target="megatron", pins={"tp": 8})


def test_the_planner_asks_the_target_profile_for_the_mixer_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned-tp refusal quotes ``TargetProfile.hybrid_layout_error`` (Megatron's: ``mamba_layout_error``; the
    default profile has none): whatever rule the profile states is the reason given, without its valid list."""
    from autoplan.catalog.cluster import build_cluster
    from cost_models.specs import JobSpec
    from cost_models.targets import get_profile
    from cost_models.targets.megatron import MegatronProfile, mamba_layout_error
    from search.planner import search

    m = _nano().model_copy(update={"mamba": MambaSpec(num_heads=64, head_dim=64, state_dim=128, num_groups=4)})
    ours = get_profile("megatron").hybrid_layout_error(m, 8, 1)
    assert ours is not None and str(ours) == str(mamba_layout_error(m, 8, 1)) and "; valid:" not in ours.reason
    assert get_profile("torchtitan").hybrid_layout_error(m, 8, 1) is None
    monkeypatch.setattr(MegatronProfile, "hybrid_layout_error",
                        lambda self, model, tp, cp: ConfigError(f"the profile's rule at tp={tp}", valid=[1, 2])
                        if tp == 8 else None)
    with pytest.raises(ConfigError, match=r"no layout keeps tp=8 \(the profile's rule at tp=8\); valid: 1, 2, 4$"):
        search(m, build_cluster("h100-sxm", 8, target="megatron"), JobSpec(global_batch_size=64, seq_len=4096),
               target="megatron", pins={"tp": 8})
