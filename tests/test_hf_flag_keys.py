"""Boolean keys of the HF readers (``autoplan.catalog.hf._Config.flag``): a JSON bool, as
transformers 5.24.0's strict config dataclasses take (``Llama4TextConfig`` raises "expected bool"); a string such as
"false" is refused, not read as true. attn_temperature_tuning also takes an integer for its truth value (Meta's
Llama-4-Scout file writes 4, modeling_llama4.py:360 reads truthiness). attn_scale 0 is transformers' no-op tuning
(modeling_llama4.py:363-364), not a refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoplan.catalog import load_model
from autoplan.catalog.hf import spec_from_hf_config
from autoplan.errors import UserInputError

HF = Path(__file__).parent / "data" / "hf"


def _scout(**change: Any) -> dict[str, Any]:
    return json.loads((HF / "llama4-scout-17b-16e-text.json").read_text()) | change


def _deepseek(**change: Any) -> dict[str, Any]:
    return json.loads((HF / "deepseek-v3.json").read_text()) | change


@pytest.mark.parametrize("key", ["attn_temperature_tuning", "use_qk_norm", "attention_bias"])
@pytest.mark.parametrize("value", ["false", "true", "no", [True], 0.5])
def test_a_llama4_flag_that_is_not_a_bool_is_refused_naming_it(key: str, value: Any) -> None:
    with pytest.raises(UserInputError, match=rf"key '{key}' must be true or false.*got {value!r}".replace("[", r"\[")):
        spec_from_hf_config(_scout(**{key: value}))


def test_llama4_flags_read_as_transformers_runs_them() -> None:
    base = spec_from_hf_config(_scout()).arch
    assert base.attn_temperature is not None and base.qk_l2_norm  # Scout's file: tuning 4, qk norm true
    assert spec_from_hf_config(_scout(attn_temperature_tuning=False)).arch.attn_temperature is None
    assert spec_from_hf_config(_scout(attn_temperature_tuning=0)).arch.attn_temperature is None
    assert spec_from_hf_config(_scout(attn_temperature_tuning=True)).arch.attn_temperature == base.attn_temperature
    assert spec_from_hf_config(_scout(use_qk_norm=False)).arch.qk_l2_norm is False
    with pytest.raises(UserInputError, match=r"key 'use_qk_norm' must be true or false, got 1"):
        spec_from_hf_config(_scout(use_qk_norm=1))  # no published file writes an integer there


@pytest.mark.parametrize("zero", [0, 0.0])
def test_attn_scale_zero_is_no_tuning(zero: float) -> None:
    """1 + log1p(floor((p + 1) / floor_scale)) * 0 = 1 for every position: the model without tuning."""
    assert spec_from_hf_config(_scout(attn_scale=zero)) == spec_from_hf_config(_scout(attn_temperature_tuning=False))


@pytest.mark.parametrize("config", [_scout, _deepseek], ids=["llama4", "deepseek"])
def test_an_attention_bias_refusal_names_the_value_given(config: Any) -> None:
    with pytest.raises(UserInputError, match=r"attention_bias=True is not supported"):
        spec_from_hf_config(config(attention_bias=True))
    with pytest.raises(UserInputError, match=r"key 'attention_bias' must be true or false, got 'yes'"):
        spec_from_hf_config(config(attention_bias="yes"))
    assert spec_from_hf_config(config(attention_bias=False)) == spec_from_hf_config(config())


# Every other boolean key a family reader takes (each family once per key it reads): read by _Config.flag, so the
# string "false" is refused naming the key, where bool("false") read it as true (a window, a bias, tied embeddings,
# a sequence-level aux loss, or a refusal of the value the file did not give)
_FLAGS = [
    ("qwen3-235b-a22b", "norm_topk_prob"), ("deepseek-v3", "norm_topk_prob"), ("glm-4.5", "norm_topk_prob"),
    ("nemotron-3-nano-30b-a3b", "norm_topk_prob"), ("qwen3-next-80b-a3b", "norm_topk_prob"),
    ("deepseek-v3", "seq_aux"),
    ("llama3.1-8b", "attention_bias"), ("llama3.1-8b", "mlp_bias"), ("nemotron4-15b", "attention_bias"),
    ("nemotron4-15b", "mlp_bias"), ("olmoe-1b-7b-0924", "attention_bias"), ("glm-4.5", "attention_bias"),
    ("gpt-oss-20b", "attention_bias"), ("pythia-160m", "attention_bias"), ("nemotron-3-nano-30b-a3b", "attention_bias"),
    ("nemotron-3-nano-30b-a3b", "mlp_bias"), ("nemotron-3-nano-30b-a3b", "mamba_proj_bias"),
    ("nemotron-3-nano-30b-a3b", "use_bias"), ("nemotron-3-nano-30b-a3b", "residual_in_fp32"),
    ("nemotron-3-nano-30b-a3b", "use_conv_bias"), ("deepseek-v3.2", "mlp_bias"),
    ("deepseek-v3.2", "rope_interleave"), ("glm-5.1", "indexer_rope_interleave"), ("glm-4.5", "use_qk_norm"),
    ("llama3-8b", "tie_word_embeddings"), ("deepseek-v3", "tie_word_embeddings"), ("gpt2", "tie_word_embeddings"),
    ("pythia-160m", "tie_word_embeddings"), ("bloom-560m", "tie_word_embeddings"),
    ("nemotron-3-nano-30b-a3b", "tie_word_embeddings"), ("llama4-scout-17b-16e-text", "tie_word_embeddings"),
    ("llama4-scout-17b-16e", "tie_word_embeddings"), ("qwen3.5-default", "tie_word_embeddings"),
    ("qwen2-7b", "use_sliding_window"), ("gpt2", "scale_attn_weights"), ("gpt2", "scale_attn_by_inverse_layer_idx"),
    ("pythia-160m", "use_parallel_residual"), ("bloom-560m", "apply_residual_connection_post_layernorm"),
]


def _config(stem: str, **change: Any) -> dict[str, Any]:
    return json.loads((HF / f"{stem}.json").read_text()) | change


@pytest.mark.filterwarnings("ignore:.*use_parallel_residual=true")  # Pythia's file: the warning it always gives
@pytest.mark.parametrize("stem,key", _FLAGS, ids=[f"{s}-{k}" for s, k in _FLAGS])
def test_a_string_false_is_refused_naming_the_key(stem: str, key: str) -> None:
    with pytest.raises(UserInputError, match=rf"key '{key}' must be true or false, got 'false'"):
        spec_from_hf_config(_config(stem, **{key: "false"}))


@pytest.mark.parametrize("stem", ["llama4-scout-17b-16e", "qwen3.5-default"])
def test_a_text_config_flag_that_is_a_string_is_refused_as_the_text_configs(stem: str) -> None:
    """The VLM's text_config tie_word_embeddings: its own key, refused as such (it read as a disagreement with the
    top-level false before: "tie_word_embeddings=False and text_config.tie_word_embeddings='false' disagree")."""
    data = _config(stem)
    data["text_config"] = {**data["text_config"], "tie_word_embeddings": "false"}
    with pytest.raises(UserInputError, match=r"text_config: key 'tie_word_embeddings' must be true or false, "
                                             r"got 'false'"):
        spec_from_hf_config(data)
    data["text_config"]["tie_word_embeddings"] = not data.get("tie_word_embeddings", False)
    with pytest.raises(UserInputError, match=r"disagree"):
        spec_from_hf_config(data)


def test_a_config_json_whose_window_flag_is_the_string_false_is_refused(tmp_path: Path) -> None:
    """Through the loader a CLI --model path takes: hf_precheck checks five keys only, and a Qwen2 file's
    use_sliding_window "false" planned a 4096-token window on every layer (23.1 s a step where false prices 37.4 s)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config("qwen2-7b", use_sliding_window="false", sliding_window=4096,
                                       max_window_layers=0)))
    with pytest.raises(UserInputError, match=r"key 'use_sliding_window' must be true or false, got 'false'"):
        load_model(str(path))
    path.write_text(json.dumps(_config("qwen2-7b", use_sliding_window=False, sliding_window=4096, max_window_layers=0)))
    assert load_model(str(path)).arch.sliding_window is None
