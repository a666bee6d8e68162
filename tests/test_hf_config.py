"""Hugging Face config.json → ModelSpec: public parameter counts, catalog agreement, error paths.

Fixtures in tests/data/hf/ are the public config.json files of each checkpoint (trimmed of nothing
that matters to the shapes). Public counts are the model cards' / papers' figures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.catalog import SUPPORTED_MODEL_TYPES, load_model
from autoplan.catalog.hf import HFConfigWarning, spec_from_hf_config
from autoplan.errors import UserInputError

HF = Path(__file__).parent / "data" / "hf"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((HF / f"{name}.json").read_text())


def write_json(path: Path, data: dict[str, Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return str(path)


# (fixture, public total, relative tolerance, why the gap when not ~0)
PUBLIC_TOTALS = [
    ("gpt2", 124_439_808, 1e-9, "exact (HF parameter count)"),
    ("pythia-160m", 162_322_944, 1e-9, "exact (Pythia paper, untied head)"),
    ("bloom-560m", 559_214_592, 1e-5, "embedding LayerNorm (2,048) ignored"),
    ("llama3-8b", 8.03e9, 0.002, "model card rounds to 8.03B"),
    ("mistral-7b", 7_241_732_096, 1e-9, "exact (HF parameter count)"),
    ("qwen2-7b", 7.62e9, 0.002, "model card 7.6B; HF count 7.62B"),
    ("qwen3-8b", 8_190_735_360, 2e-6, "per-head q/k RMSNorms (36 x 256) ignored"),
    ("mixtral-8x7b", 46.7e9, 0.002, "Mistral reports 46.7B"),
    ("qwen1.5-moe-a2.7b", 14.3e9, 0.005, "model card rounds to 14.3B"),
    ("qwen3-235b-a22b", 235e9, 0.005, "model card rounds to 235B"),
    ("deepseek-v2-lite", 15.7e9, 0.005, "model card rounds to 15.7B"),
    ("deepseek-v3", 671e9, 0.005, "671B main model; the 14B MTP module is not counted"),
]


@pytest.mark.parametrize(("name", "public", "rel", "why"), PUBLIC_TOTALS, ids=[p[0] for p in PUBLIC_TOTALS])
def test_total_params_match_public_counts(name: str, public: float, rel: float, why: str) -> None:
    spec = load_model(str(HF / f"{name}.json"))
    assert spec.num_params == pytest.approx(public, rel=rel), why


PUBLIC_ACTIVE = [
    ("mixtral-8x7b", 12.9e9, 0.005),  # Mistral: 12.9B active
    ("qwen1.5-moe-a2.7b", 2.7e9, 0.01),  # Qwen: 2.7B activated (2.69B counted)
    ("qwen3-235b-a22b", 22e9, 0.01),  # Qwen: 22B activated (22.19B counted, card rounds)
    # DeepSeek: "37B activated"; 37.55B counted — a round figure 1.5% under; tolerance 2%.
    ("deepseek-v3", 37e9, 0.02),
]


@pytest.mark.parametrize(("name", "public", "rel"), PUBLIC_ACTIVE, ids=[p[0] for p in PUBLIC_ACTIVE])
def test_active_params_match_public_counts(name: str, public: float, rel: float) -> None:
    assert load_model(str(HF / f"{name}.json")).num_active_params == pytest.approx(public, rel=rel)


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"])
def test_hf_fixture_equals_catalog_entry(name: str) -> None:
    hf = load_model(str(HF / f"{name}.json"))
    catalog = load_model(name)
    assert hf.model_dump(exclude={"name"}) == catalog.model_dump(exclude={"name"})
    assert (hf.num_params, hf.num_active_params) == (catalog.num_params, catalog.num_active_params)


def test_family_specific_fields() -> None:
    gpt2 = load_model(str(HF / "gpt2.json"))
    assert (gpt2.ffn_hidden_size, gpt2.learned_position_embeddings, gpt2.norm) == (3072, 1024, "layernorm")
    assert gpt2.tied_embeddings and gpt2.linear_bias and not gpt2.gated_mlp
    pythia = load_model(str(HF / "pythia-160m.json"))
    assert not pythia.tied_embeddings and pythia.learned_position_embeddings == 0
    bloom = load_model(str(HF / "bloom-560m.json"))
    assert bloom.tied_embeddings and bloom.learned_position_embeddings == 0 and bloom.ffn_hidden_size == 4096
    assert load_model(str(HF / "qwen2-7b.json")).qkv_bias
    assert not load_model(str(HF / "qwen3-8b.json")).qkv_bias
    assert load_model(str(HF / "qwen3-8b.json")).head_dim is None  # 128 == 4096 / 32: normalized
    qwen_moe = load_model(str(HF / "qwen1.5-moe-a2.7b.json"))
    assert (qwen_moe.num_shared_experts, qwen_moe.moe_ffn_hidden_size, qwen_moe.qkv_bias) == (4, 1408, True)
    v3 = load_model(str(HF / "deepseek-v3.json"))
    assert v3.mla is not None and v3.mla.q_lora_rank == 1536 and v3.num_kv_heads == 128
    assert (v3.first_dense_layers, v3.num_moe_layers) == (3, 58)
    lite = load_model(str(HF / "deepseek-v2-lite.json"))
    assert lite.mla is not None and lite.mla.q_lora_rank == 0  # null → no query compression


def test_every_supported_model_type_has_a_fixture() -> None:
    covered = {fixture(p.stem)["model_type"] for p in HF.glob("*.json")}
    assert covered == set(SUPPORTED_MODEL_TYPES)


# ---- naming and sources -----------------------------------------------------------------------


def test_name_from_name_or_path_then_folder_then_stem(tmp_path: Path) -> None:
    assert load_model(str(HF / "mixtral-8x7b.json")).name == "Mixtral-8x7B-v0.1"
    assert load_model(str(HF / "gpt2.json")).name == "gpt2"
    folder = tmp_path / "my-llama"
    write_json(folder / "config.json", fixture("llama3-8b"))
    assert load_model(str(folder / "config.json")).name == "my-llama"
    assert load_model(str(folder)).name == "my-llama"  # a folder means its config.json


def test_dict_hf_config() -> None:
    spec = load_model(fixture("qwen2-7b"))
    assert spec.name == "qwen2" and spec.num_params == load_model(str(HF / "qwen2-7b.json")).num_params
    assert spec_from_hf_config(fixture("gpt2"), name="mine").name == "mine"


def test_edited_file_is_reread(tmp_path: Path) -> None:
    cfg = fixture("llama3-8b")
    path = write_json(tmp_path / "m.json", cfg)
    assert load_model(path).num_layers == 32
    write_json(tmp_path / "m.json", cfg | {"num_hidden_layers": 16})
    st_ = os.stat(path)
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
    assert load_model(path).num_layers == 16


# ---- MoE layer placement ----------------------------------------------------------------------


def _qwen_moe(**over: Any) -> dict[str, Any]:
    return fixture("qwen3-235b-a22b") | {"num_hidden_layers": 12} | over


def test_qwen_decoder_sparse_step_and_mlp_only_prefix() -> None:
    every_other = spec_from_hf_config(_qwen_moe(decoder_sparse_step=2))
    assert (every_other.first_dense_layers, every_other.moe_layer_freq) == (0, 2)
    assert [every_other.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    prefix = spec_from_hf_config(_qwen_moe(mlp_only_layers=[0, 1]))
    assert (prefix.first_dense_layers, prefix.moe_layer_freq, prefix.num_moe_layers) == (2, 1, 10)
    dense = spec_from_hf_config(_qwen_moe(mlp_only_layers=list(range(12))))
    assert not dense.is_moe and dense.num_params < prefix.num_params


def test_unrepresentable_moe_layout_is_rejected() -> None:
    with pytest.raises(UserInputError, match=r"MoE layers \[1, 2, 3, 4, 6.*cannot be expressed"):
        spec_from_hf_config(_qwen_moe(mlp_only_layers=[0, 5]))


def test_deepseek_moe_layer_freq() -> None:
    cfg = fixture("deepseek-v2-lite") | {"num_hidden_layers": 9, "first_k_dense_replace": 1, "moe_layer_freq": 2}
    spec = spec_from_hf_config(cfg)
    assert [i for i in range(9) if spec.is_moe_layer(i)] == [2, 4, 6, 8]


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 24),
    step=st.integers(1, 4),
    dense_prefix=st.integers(0, 6),
)
def test_qwen_layout_reproduces_hf_rule(layers: int, step: int, dense_prefix: int) -> None:
    """Whenever a Qwen MoE config converts, ModelSpec marks exactly HF's sparse layers."""
    dense_only = list(range(min(dense_prefix, layers)))
    hf_moe = [i for i in range(layers) if i not in dense_only and (i + 1) % step == 0]
    cfg = _qwen_moe(num_hidden_layers=layers, decoder_sparse_step=step, mlp_only_layers=dense_only)
    try:
        spec = spec_from_hf_config(cfg)
    except UserInputError as err:
        assert "cannot be expressed" in str(err)
        return
    assert [i for i in range(layers) if spec.is_moe_layer(i)] == hf_moe


# ---- error paths ------------------------------------------------------------------------------


def test_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",}')
    with pytest.raises(UserInputError, match=r"invalid JSON in '.*config.json': .*\(line 1, column"):
        load_model(str(path))


def test_missing_key(tmp_path: Path) -> None:
    cfg = fixture("llama3-8b")
    del cfg["num_hidden_layers"]
    with pytest.raises(UserInputError, match=r"missing key 'num_hidden_layers' \(model_type 'llama'\)"):
        load_model(write_json(tmp_path / "config.json", cfg))


def test_missing_synonym_keys_named() -> None:
    cfg = fixture("gpt2")
    del cfg["n_layer"]
    with pytest.raises(UserInputError, match=r"missing key 'n_layer' or 'num_hidden_layers'"):
        spec_from_hf_config(cfg)


def test_unsupported_model_type(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"unsupported model_type 'foo'; supported: bloom, deepseek_v2, .*qwen3_moe"):
        load_model(write_json(tmp_path / "config.json", fixture("llama3-8b") | {"model_type": "foo"}))


def test_hf_looking_config_without_model_type(tmp_path: Path) -> None:
    cfg = fixture("llama3-8b")
    del cfg["model_type"]
    with pytest.raises(UserInputError, match=r"missing key 'model_type'"):
        load_model(write_json(tmp_path / "config.json", cfg))


def test_non_integer_value() -> None:
    with pytest.raises(UserInputError, match=r"key 'hidden_size' must be an integer, got 'big'"):
        spec_from_hf_config(fixture("llama3-8b") | {"hidden_size": "big"})
    with pytest.raises(UserInputError, match=r"key 'mlp_only_layers' must be a list of integers"):
        spec_from_hf_config(_qwen_moe(mlp_only_layers="0,1"))


def test_inconsistent_shapes_report_values_in_one_line() -> None:
    with pytest.raises(UserInputError) as info:
        spec_from_hf_config(fixture("llama3-8b") | {"num_key_value_heads": 5})
    msg = str(info.value)
    assert "num_attention_heads (32) must be a multiple of num_kv_heads (5)" in msg and "\n" not in msg


def test_invalid_mla_value_is_compact() -> None:
    with pytest.raises(UserInputError, match=r"\(MLA\): kv_lora_rank: Input should be greater than 0 \(got 0\)"):
        spec_from_hf_config(fixture("deepseek-v3") | {"kv_lora_rank": 0})


def test_zero_divisors_rejected_before_use() -> None:
    with pytest.raises(UserInputError, match=r"key 'decoder_sparse_step' must be >= 1, got 0"):
        spec_from_hf_config(_qwen_moe(decoder_sparse_step=0))
    with pytest.raises(UserInputError, match=r"key 'moe_layer_freq' must be >= 1, got 0"):
        spec_from_hf_config(fixture("deepseek-v3") | {"moe_layer_freq": 0})


@pytest.mark.parametrize("name", ["deepseek-v3", "glm-4.5"])
def test_negative_first_k_dense_replace_is_refused(name: str) -> None:
    """-1 made every layer MoE, silently (HF compares layer_idx >= first_k_dense_replace); a count is >= 0."""
    with pytest.raises(UserInputError, match=r"key 'first_k_dense_replace' must be >= 0, got -1"):
        spec_from_hf_config(fixture(name) | {"first_k_dense_replace": -1})


_JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-4, 300), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4), st.lists(st.integers(-2, 40), max_size=4), st.dictionaries(st.text(max_size=3), st.none()),
)


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(p.stem for p in HF.glob("*.json"))),
    data=st.data(),
    value=_JSON_VALUES,
)
def test_any_corrupted_value_gives_a_spec_or_a_user_error(name: str, data: st.DataObject, value: Any) -> None:
    """No traceback-style exception escapes, whatever one key of a real config is set to."""
    cfg = fixture(name)
    key = data.draw(st.sampled_from(sorted(cfg)))
    try:
        spec_from_hf_config(cfg | {key: value})
    except UserInputError as err:
        assert "\n" not in str(err)


def test_qwen2_moe_shared_expert_gate_reaches_megatron_and_the_price() -> None:
    """Qwen2-MoE scales its shared expert by sigmoid(shared_expert_gate(x)) (transformers Qwen2MoeSparseMoeBlock):
    ArchSpec.shared_expert_gate, one hidden-wide weight per MoE layer in the parameters and the layer graph, and
    Megatron's --moe-shared-expert-gate. Qwen3-MoE has no shared expert, so no gate."""
    from autoplan.emit import EmitPlan
    from autoplan.catalog import build_cluster
    from autoplan.emit.megatron import model_args, parse_megatron_args
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig

    qwen = load_model(str(HF / "qwen1.5-moe-a2.7b.json"))
    plain = qwen.model_copy(update={"arch": qwen.arch.model_copy(update={"shared_expert_gate": False})})
    assert qwen.arch.shared_expert_gate and not load_model("qwen3-235b-a22b").arch.shared_expert_gate
    assert qwen.moe_block_params - plain.moe_block_params == qwen.hidden_size
    assert qwen.num_params - plain.num_params == qwen.hidden_size * qwen.num_moe_layers
    graph = layer_graph(qwen, "moe", 4096)
    assert sum(op.params for op in graph.ops if op.name == "shared_gate") == qwen.hidden_size
    emitted = [parse_megatron_args(model_args(EmitPlan(model=m, cluster=build_cluster("h100-sxm", 8),
                                                       job=JobSpec(global_batch_size=8, seq_len=4096),
                                                       parallel=ParallelConfig()))).moe_shared_expert_gate
               for m in (qwen, plain)]
    assert emitted == [True, False]


@pytest.mark.parametrize(("keys", "said"), [({"attention_bias": True}, "o_proj's bias"),
                                            ({"mlp_bias": True}, "the MLP's biases")])
def test_llama_bias_megatron_cannot_build_is_said(keys: dict[str, bool], said: str) -> None:
    """LlamaAttention's o_proj follows attention_bias, LlamaMLP's linears mlp_bias; Megatron has q/k/v-only biases
    or biases everywhere, so one without the other is dropped, and the loader says so."""
    with pytest.warns(HFConfigWarning, match=said):
        m = spec_from_hf_config({**fixture("llama3-8b"), **keys})
    assert not m.linear_bias and m.qkv_bias == ("attention_bias" in keys)


def test_model_copy_recomputes_derived_sizes() -> None:
    """ModelSpec's derived sizes are cached properties; a copy with an update must not inherit them stale."""
    m = load_model("qwen3-235b-a22b")
    assert m.num_params  # cached on m
    fewer = m.model_copy(update={"num_experts": 64})
    assert fewer.num_params < m.num_params and fewer.num_params == load_model("qwen3-235b-a22b").model_copy(
        update={"num_experts": 64}).num_params
    with pytest.raises(ValueError):
        m.model_copy(update={"num_experts": 0})  # moe_top_k without experts: validated again
