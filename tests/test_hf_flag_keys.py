"""Boolean keys of the Llama 4 and DeepSeek readers (``autoplan.catalog.hf._Config.flag``): a JSON bool, as
transformers 5.24.0's strict config dataclasses take (``Llama4TextConfig`` raises "expected bool"); a string such as
"false" is refused, not read as true. attn_temperature_tuning also takes an integer for its truth value (Meta's
Llama-4-Scout file writes 4, modeling_llama4.py:360 reads truthiness). attn_scale 0 is transformers' no-op tuning
(modeling_llama4.py:363-364), not a refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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
