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
    ({"num_nextn_predict_layers": 1}, r"num_nextn_predict_layers=1"),
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


def test_spec_refuses_inconsistent_hybrid_fields() -> None:
    base = _nano().model_dump()
    for change, message in (({"hybrid_pattern": "M" * 51}, "51 layers"), ({"mamba": None}, "needs mamba"),
                            ({"hybrid_pattern": "M*" * 26}, "E layers need"), ({"first_dense_layers": 1}, "hybrid")):
        with pytest.raises(ValueError, match=message):
            ModelSpec.model_validate(base | change)
