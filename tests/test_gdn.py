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
