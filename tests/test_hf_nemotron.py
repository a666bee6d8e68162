"""Nemotron-4 (HF ``model_type: nemotron``): the loader reads what transformers builds, the catalog entries are the
papers' models, the Megatron emitter passes every fact (LayerNorm1p, squared ReLU, partial RoPE), and the
zero-centered gamma costs nothing (torchtitan's refusal: tests/test_torchtitan_flavor_facts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.catalog.hf import spec_from_hf_config
from autoplan.emit import EmitPlan
from autoplan.emit.megatron import megatron_args
from autoplan.errors import UserInputError
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ParallelConfig

HF = Path(__file__).parent / "data" / "hf"


def _config(**change: object) -> dict:
    return json.loads((HF / "nemotron4-15b.json").read_text()) | change


def test_the_loader_reads_nemotron_as_transformers_builds_it() -> None:
    m = spec_from_hf_config(_config(), name="n")
    a = m.arch
    assert (m.norm, a.norm_zero_centered_gamma, a.activation, m.gated_mlp, a.rotary_fraction) == \
        ("layernorm", True, "relu2", False, 0.5)
    assert (m.linear_bias, m.qkv_bias, m.tied_embeddings, m.num_kv_heads) == (False, False, False, 8)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(**_config())
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(cfg)
    assert m.num_params == sum(p.numel() for p in hf.parameters())


def test_a_transformers_5_file_and_biases() -> None:
    """rope_parameters (transformers 5.x) carries the partial factor; a disagreeing top-level key is named; biases
    on every linear are read, on the attention alone refused (Megatron biases every linear or none)."""
    five = _config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
    del five["partial_rotary_factor"], five["rope_theta"]
    assert spec_from_hf_config(five).arch.rotary_fraction == 0.25
    with pytest.raises(UserInputError, match="partial_rotary_factor=0.5 and rope_parameters.partial_rotary_factor"):
        spec_from_hf_config(five | {"partial_rotary_factor": 0.5})
    assert spec_from_hf_config(_config(attention_bias=True, mlp_bias=True)).linear_bias
    with pytest.raises(UserInputError, match="attention_bias / mlp_bias"):
        spec_from_hf_config(_config(attention_bias=True))


def test_catalog_entries_are_the_papers_models() -> None:
    """arXiv 2406.11704 Table 1: 9.4B embedding and 331.6B non-embedding parameters; arXiv 2402.16819 section 2:
    3.2B / 12.5B (input and output embeddings of the 256000-token vocabulary: 3.15B)."""
    for name, emb, rest in (("nemotron4-340b", 9.4, 331.6), ("nemotron4-15b", 3.2, 12.5)):
        m = load_model(name)
        e = (m.embedding_params + m.head_params) / 1e9
        assert e == pytest.approx(emb, abs=0.06), name
        assert (m.num_params / 1e9 - e) == pytest.approx(rest, abs=0.06), name


def _plan(model_name: str = "nemotron4-15b") -> EmitPlan:
    return EmitPlan(load_model(model_name), build_cluster("h100-sxm", 64), JobSpec(global_batch_size=256,
                    seq_len=4096), ParallelConfig(tp=4, pp=2))


def test_megatron_is_told_every_fact() -> None:
    argv = megatron_args(_plan())
    assert "--apply-layernorm-1p" in argv and "--squared-relu" in argv and "--disable-bias-linear" in argv
    assert argv[argv.index("--normalization") + 1] == "LayerNorm"
    assert float(argv[argv.index("--rotary-percent") + 1]) == 0.5
    assert "--swiglu" not in argv and "--apply-layernorm-1p" not in megatron_args(_plan("llama3-8b"))


def test_zero_centered_gamma_is_cost_neutral() -> None:
    p = _plan()
    plain = p.model.model_copy(update={"arch": p.model.arch.model_copy(update={"norm_zero_centered_gamma": False})})
    a = estimate(p.model, p.cluster, p.job, p.parallel)
    b = estimate(plain, p.cluster, p.job, p.parallel)
    assert (a.step_time_s, a.peak_memory_gib) == (b.step_time_s, b.peak_memory_gib)


@pytest.mark.parametrize(("change", "says"), [
    # relu2 is the family's default (NemotronConfig.hidden_act): the refusal of another name lists it with the rest
    ({"hidden_act": "relu"}, r"hidden_act='relu' is not supported for model_type 'nemotron' \(supported: .*relu2"),
    ({"hidden_act": 3}, r"hidden_act=3 is not supported .*relu2"),
    # a partial factor that is not a number was an internal error (ValueError from float('x')) or read as 1.0 (true)
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": "x"}},
     r"rope_parameters.partial_rotary_factor='x' is not supported .*\(a number in \(0, 1\]\)"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": True}},
     r"rope_parameters.partial_rotary_factor=True is not supported"),
])
def test_a_bad_activation_or_partial_factor_is_one_clear_line(change: dict, says: str) -> None:
    config = _config(**change)
    if "rope_parameters" in change:
        del config["partial_rotary_factor"], config["rope_theta"]
    with pytest.raises(UserInputError, match=says):
        spec_from_hf_config(config)


@pytest.mark.parametrize("act", ["silu", "swish"])
def test_megatron_estimate_notes_the_activation_emit_refuses(act: str) -> None:
    """A non-gated SiLU MLP (a nemotron config with hidden_act silu) has no Megatron-LM flag: emit refused it while
    estimate and search priced it for megatron without a word. One rule (``model_flags_error``): the estimate's note
    quotes emit's reason; the price is the model's."""
    from autoplan.emit import emit
    from autoplan.errors import ConfigError

    m = spec_from_hf_config(_config(hidden_act=act), name="n")
    p = EmitPlan(m, build_cluster("h100-sxm", 64), JobSpec(global_batch_size=256, seq_len=4096),
                 ParallelConfig(tp=4, pp=2))
    with pytest.raises(ConfigError) as refused:
        emit(p, "megatron")
    est = estimate(p.model, p.cluster, p.job, p.parallel, target="megatron")
    [note] = [n for n in est.notes if n.startswith("not emittable for --target megatron")]
    reason = str(refused.value).split("; ")[0]  # before the valid choices and the targets that would take it
    assert reason in note and "a non-gated silu MLP has no Megatron-LM flag" in note
    base = estimate(load_model("nemotron4-15b"), p.cluster, p.job, p.parallel, target="megatron")
    assert not [n for n in base.notes if n.startswith("not emittable")]


def test_a_refusal_does_not_offer_megatron_for_a_model_without_its_flags() -> None:
    """emit's refusal names the targets that would take the plan (``emittable_targets``, through ``_check``); a
    non-gated SiLU model was offered --target megatron, whose emitter then refused it."""
    from autoplan.emit.plan import emittable_targets

    m = spec_from_hf_config(_config(hidden_act="silu"), name="n")
    p = EmitPlan(m, build_cluster("h100-sxm", 64), JobSpec(global_batch_size=256, seq_len=4096),
                 ParallelConfig(tp=4, pp=2, zero_stage=0))
    assert "megatron" not in emittable_targets(p)
    assert "megatron" in emittable_targets(EmitPlan(load_model("nemotron4-15b"), p.cluster, p.job, p.parallel))


@pytest.mark.parametrize("kv", ["absent", None])
def test_a_config_without_kv_heads_is_refused_as_transformers_cannot_build_it(kv: object) -> None:
    """NemotronConfig leaves num_key_value_heads None (no default to num_attention_heads, unlike LlamaConfig), and
    NemotronAttention divides by it: transformers builds no model of such a file, so the loader refuses it with one
    line naming the key and the value MHA would take, where it read MHA before."""
    config = _config(num_key_value_heads=kv)
    if kv == "absent":
        del config["num_key_value_heads"]
    with pytest.raises(UserInputError, match=r"missing key 'num_key_value_heads' \(model_type 'nemotron'\).*"
                                             r"num_key_value_heads: 48 for multi-head attention") as refused:
        spec_from_hf_config(config)
    assert "\n" not in str(refused.value)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(**config)
    assert cfg.num_key_value_heads is None
    with torch.device("meta"), pytest.raises(TypeError):
        transformers.AutoModelForCausalLM.from_config(cfg)
