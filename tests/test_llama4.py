"""Llama 4 (HF ``model_type: llama4`` / ``llama4_text``): the loader reads what transformers builds (parameters, NoPE
layers, chunked attention, q/k L2 norm, router on the expert input), the catalog entries are Meta's models, chunked
attention is priced by its mask, and Megatron-LM gets every fact it has a flag for or the user is told why not."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.catalog.hf import HFModelPartWarning, spec_from_hf_config
from autoplan.emit import EmitPlan, emit
from autoplan.emit.megatron import megatron_args, notes
from autoplan.errors import ConfigError, UserInputError
from cost_models.estimate import estimate
from cost_models.opgraph import keys_per_query
from cost_models.specs import JobSpec, ParallelConfig

HF = Path(__file__).parent / "data" / "hf"


def _scout() -> dict:
    return json.loads((HF / "llama4-scout-17b-16e.json").read_text())


def _text(**change: object) -> dict:
    return json.loads((HF / "llama4-scout-17b-16e-text.json").read_text()) | change


# Maverick's text_config as Meta publishes it differs from Scout's in these keys (the catalog entry's comment)
MAVERICK = {"interleave_moe_layer_step": 2, "moe_layers": list(range(1, 48, 2)), "num_local_experts": 128,
            "rope_scaling": None, "use_qk_norm": False}


def _hf_params(text: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    # transformers 5.24's strict config takes a bool (Meta's files write 4); the flag changes no parameter
    cfg = transformers.Llama4TextConfig(**{k: v for k, v in text.items() if k not in (
        "model_type", "architectures", "transformers_version", "attn_temperature_tuning")})
    with torch.device("meta"):
        model = transformers.Llama4ForCausalLM(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("change", [{}, MAVERICK], ids=["scout", "maverick"])
def test_parameters_equal_transformers_build(change: dict) -> None:
    text = _text(**change)
    assert spec_from_hf_config(text).num_params == _hf_params(text)


def test_absent_keys_take_the_configuration_class_defaults() -> None:
    """A bare ``{"model_type": "llama4_text"}`` is transformers' default Llama4TextConfig (head_dim 128 and 8 KV
    heads as field defaults, not hidden / heads and MHA)."""
    m = spec_from_hf_config({"model_type": "llama4_text"})
    assert (m.num_kv_heads, m.head_dim_resolved, m.arch.no_rope_every, m.arch.attention_chunk) == (8, 128, 4, 8192)
    assert m.num_params == _hf_params({})


@pytest.mark.parametrize("absent", ["num_key_value_heads", "vocab_size", "intermediate_size", "head_dim"])
def test_an_absent_key_takes_llama4_text_config_s_default(absent: str) -> None:
    """Llama4TextConfig's class defaults (8 KV heads, not MHA; vocabulary 202048), as transformers builds them."""
    text = {k: v for k, v in _text(**MAVERICK).items() if k != absent}
    assert spec_from_hf_config(text).num_params == _hf_params(text)


def test_null_keys_take_their_defaults_without_a_warning() -> None:
    """A null list key is Llama4TextConfig's default (moe_layers from interleave_moe_layer_step, no_rope_layers from
    no_rope_layer_interval, layer_types from both), read without an HFConfigWarning."""
    text = _text(**MAVERICK) | {"moe_layers": None, "no_rope_layers": None, "layer_types": None}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = spec_from_hf_config(text)
    assert spec == spec_from_hf_config(_text(**MAVERICK))


def test_the_catalog_entries_are_meta_s_models() -> None:
    scout = spec_from_hf_config(_text())
    maverick = spec_from_hf_config(_text(**MAVERICK))
    for name, hf in (("llama4-scout-17b-16e", scout), ("llama4-maverick-17b-128e", maverick)):
        ours = load_model(name).model_dump()
        theirs = hf.model_dump() | {"name": name}
        assert ours == theirs, {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}
        # "17B active" in both names: the top-1 expert, the shared one, attention and embeddings
        assert load_model(name).num_active_params / 1e9 == pytest.approx(17.2, abs=0.05)


def test_the_published_file_reads_the_text_decoder_and_says_the_vision_tower_is_not_planned() -> None:
    with pytest.warns(HFModelPartWarning, match="vision encoder and projector"):
        whole = spec_from_hf_config(_scout(), name="s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = spec_from_hf_config(_text(), name="s")
    assert whole == text


def test_nope_layers_match_transformers_and_megatron_core() -> None:
    arch = spec_from_hf_config(_text()).arch
    flags = _text()["no_rope_layers"]
    assert [int(arch.layer_has_rope(i)) for i in range(48)] == flags
    assert [arch.layer_chunk(i) for i in range(4)] == [8192, 8192, 8192, None]  # HF layer_types
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    cfg = tc.TransformerConfig(num_layers=48, hidden_size=64, num_attention_heads=4, no_rope_freq=arch.no_rope_every)
    assert [1 - x for x in cfg.no_rope_freq] == flags  # megatron-core: 1 = the layer skips RoPE


@pytest.mark.parametrize(("change", "says"), [
    ({"no_rope_layers": [1, 0] * 12 + [1] * 24}, r"no_rope_layers=.*every N-th layer"),
    ({"layer_types": ["full_attention"] * 48}, r"layer_types=.* and no_rope_layers / attention_chunk_size=.* disagree"),
    ({"router_jitter_noise": 0.1}, r"router_jitter_noise=0.1"),
    ({"attention_bias": True}, r"attention_bias=True is not supported"),
])
def test_what_autoplan_cannot_represent_is_one_clear_line(change: dict, says: str) -> None:
    with pytest.raises(UserInputError, match=says):
        spec_from_hf_config(_text(**change))


def test_chunked_keys_count_the_mask() -> None:
    """Each query sees the earlier keys of its own chunk (block-diagonal causal): the brute-force count of HF's
    chunked mask, less the half key ``keys_per_query``'s causal convention drops (``s/2`` for full attention)."""
    for seq, chunk in ((16384, 8192), (20000, 8192), (8192, 8192), (3000, 8192), (10, 3)):
        brute = sum(i % chunk + 1 for i in range(seq)) / seq
        assert keys_per_query(seq, None, True, chunk) == pytest.approx(brute - 0.5)
    assert keys_per_query(8192, None, True, 8192) == keys_per_query(8192, None, True)


def test_chunking_prices_less_attention_only_beyond_one_chunk() -> None:
    m = load_model("llama4-maverick-17b-128e")
    full = m.model_copy(update={"arch": m.arch.model_copy(update={"attention_chunk": None})})
    cluster, par = build_cluster("b200", 128), ParallelConfig(tp=2, pp=4, ep=16, sequence_parallel=True)
    for seq, shorter in ((8192, False), (32768, True)):
        job = JobSpec(global_batch_size=128, seq_len=seq)
        a, b = (estimate(x, cluster, job, par, target="megatron").time.compute_s for x in (m, full))
        assert (a < b) is shorter and (a == b) is not shorter


def _plan(name: str, seq: int = 8192) -> EmitPlan:
    return EmitPlan(load_model(name), build_cluster("b200", 128), JobSpec(global_batch_size=1024, seq_len=seq),
                    ParallelConfig(tp=1, pp=2, ep=64 if "128e" in name else 16))


def test_megatron_is_told_every_fact_it_has_a_flag_for() -> None:
    argv = megatron_args(_plan("llama4-maverick-17b-128e"))
    for flag in ("--rotary-interleaved", "--moe-apply-probs-on-input"):
        assert flag in argv
    assert argv[argv.index("--no-rope-freq") + 1] == "4"
    assert argv[argv.index("--moe-router-score-function") + 1] == "sigmoid"
    assert argv[argv.index("--moe-router-load-balancing-type") + 1] == "none"
    assert argv[argv.index("--moe-shared-expert-intermediate-size") + 1] == "8192"
    assert "--qk-l2-norm" not in argv and "--moe-router-pre-softmax" not in argv
    # HF's attention temperature tuning touches position 8191 at seq 8192: said, not silently dropped
    assert any("temperature tuning" in n and "position 8191" in n for n in notes(_plan("llama4-maverick-17b-128e")))
    assert not any("temperature" in n for n in notes(_plan("llama4-maverick-17b-128e", 4096)))


def test_megatron_refuses_what_it_would_train_differently_and_estimate_says_so() -> None:
    # Scout's q/k L2 norm on RoPE layers only: --qk-l2-norm would normalise the NoPE layers too
    scout = _plan("llama4-scout-17b-16e")
    with pytest.raises(ConfigError, match="q/k L2 norm on the RoPE layers only"):
        emit(scout, "megatron")
    est = estimate(scout.model, scout.cluster, scout.job, scout.parallel, target="megatron")
    assert any(n.startswith("not emittable for --target megatron") and "L2 norm" in n for n in est.notes)
    # a sequence longer than one chunk: Megatron-LM has no chunked attention
    long = _plan("llama4-maverick-17b-128e", 16384)
    with pytest.raises(ConfigError, match=r"no chunked attention.*seq_len <= 8192"):
        emit(long, "megatron")
    est = estimate(long.model, long.cluster, long.job, long.parallel, target="megatron")
    assert any("no chunked attention" in n and "fsdp2" in n for n in est.notes)
    # Megatron's probs-on-input is top-1 only (moe/experts.py:229-232)
    m = load_model("llama4-maverick-17b-128e").model_copy(update={"moe_top_k": 2})
    top2 = EmitPlan(m, long.cluster, JobSpec(global_batch_size=1024, seq_len=8192), long.parallel)
    with pytest.raises(ConfigError, match="moe_apply_probs_on_input takes top-1 only"):
        emit(top2, "megatron")


@pytest.mark.parametrize("layers", [6, 46, 48])
def test_megatron_builds_the_nope_layers_of_any_depth(layers: int) -> None:
    """megatron-core asserts num_layers % no_rope_freq == 0 for the integer form (transformer_config.py:1966): a
    depth the interval does not divide gets the list expression, whose layers equal transformers' no_rope_layers."""
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    from autoplan.emit.megatron import parse_megatron_args
    from autoplan.validate.megatron_checks import transformer_config_kwargs

    text = _text(**MAVERICK) | {"num_hidden_layers": layers, "no_rope_layers": None, "moe_layers": None,
                                "layer_types": None}
    hf_flags = [int((i + 1) % 4 != 0) for i in range(layers)]  # Llama4TextConfig: no_rope_layer_interval 4
    plan = EmitPlan(spec_from_hf_config(text, name=f"l4-{layers}"), build_cluster("b200", 8),
                    JobSpec(global_batch_size=8, seq_len=8192), ParallelConfig(tp=1))
    _, kw = transformer_config_kwargs(parse_megatron_args(megatron_args(plan)))
    cfg = tc.TransformerConfig(**kw)
    assert [1 - x for x in cfg.no_rope_freq] == hf_flags


def test_fsdp2_says_what_kernel_the_chunked_price_assumes() -> None:
    """The user's own model runs under fsdp2 (the target Megatron's refusal points to): beyond one chunk its
    attention is priced by the chunked mask, which only a kernel that skips the masked blocks attains."""
    m, cluster = load_model("llama4-scout-17b-16e"), build_cluster("b200", 64)
    par = ParallelConfig(tp=1, zero_stage=3, recompute="full")
    for seq, said in ((8192, False), (32768, True)):
        est = estimate(m, cluster, JobSpec(global_batch_size=64, seq_len=seq), par, target="fsdp2")
        assert any("chunked attention" in n and "FlexAttention" in n for n in est.notes) is said
