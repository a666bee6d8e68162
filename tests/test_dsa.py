"""DeepSeek sparse attention (DeepSeek-V3.2 ``deepseek_v32``, GLM-5 ``glm_moe_dsa``) from the published config.json
files (tests/data/hf/, sources in its README): the facts the loader reads, the parameter counts against transformers'
meta-device build and the published checkpoint, and what the loader refuses."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from autoplan.catalog import load_model
from autoplan.catalog.hf import HFConfigWarning, spec_from_hf_config
from autoplan.errors import UserInputError
from cost_models.specs import ModelSpec

HF = Path(__file__).parent / "data" / "hf"
DS, GLM = "deepseek-v3.2", "glm-5.1"


def _config(stem: str) -> dict[str, Any]:
    return json.loads((HF / f"{stem}.json").read_text())


def _spec(stem: str, **change: Any) -> ModelSpec:
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFConfigWarning)  # the published files have no unread key
        return spec_from_hf_config(_config(stem) | change, name=stem)


# ---- reading -----------------------------------------------------------------------------------


def test_indexer_facts_are_read() -> None:
    ds, glm = _spec(DS), _spec(GLM)
    assert (ds.dsa.index_heads, ds.dsa.index_head_dim, ds.dsa.index_topk) == (64, 128, 2048)
    assert (glm.dsa.index_heads, glm.dsa.index_head_dim, glm.dsa.index_topk) == (32, 128, 2048)
    assert ds.dsa.shared_every == glm.dsa.shared_every == 1  # every layer runs its indexer
    assert (glm.mla.q_lora_rank, glm.mla.qk_nope_head_dim, glm.mla.v_head_dim) == (2048, 192, 256)
    assert glm.first_dense_layers == ds.first_dense_layers == 3 and glm.arch.mtp_layers == 1


@pytest.mark.parametrize("stem", [DS, GLM])
def test_parameter_count_is_transformers_own(stem: str) -> None:
    """transformers 5.24.0 builds the published model on the meta device (DeepseekV32Indexer's wq_b, wk, k_norm
    weight and bias, weights_proj in every layer): ModelSpec counts exactly its weights."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(**_config(stem))
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
    assert _spec(stem).num_params == hf


def test_glm_5_1_matches_its_checkpoint() -> None:
    """The GLM-5.1 checkpoint (bf16) holds 753,864,139,008 numbers (tests/data/hf/README.md): ModelSpec's count, the
    MTP layer (a decoder layer like the last, plus eh_proj 2h x h and its enorm / hnorm / shared_head.norm) and the
    76 MoE routers' score-correction biases (256 each)."""
    m = _spec(GLM)
    h = m.hidden_size
    mtp = m.layer_params(m.num_layers - 1) + 2 * h * h + 3 * h
    assert m.num_params + mtp + (m.num_moe_layers + 1) * m.num_experts == 753_864_139_008


def test_indexer_weights_per_layer() -> None:
    """wq_b q_lora x H_I·D_I, wk h x D_I, k_norm 2·D_I (LayerNorm), weights_proj h x H_I (DeepSeek-V3.2's weight
    list: [8192, 1536], [128, 7168], [128] x 2, [64, 7168])."""
    m = _spec(DS)
    assert m.indexer_params(0) == 8192 * 1536 + 128 * 7168 + 2 * 128 + 64 * 7168
    assert m.layer_params(5) - _spec("deepseek-v3").layer_params(5) == m.indexer_params(5)


def test_catalog_entries_load() -> None:
    assert load_model("deepseek-v3.2") == _spec(DS).model_copy(update={"name": "deepseek-v3.2"})
    assert load_model("glm-5.1").dsa.index_heads == 32


def test_index_sharing_as_glm_5_2_states_it() -> None:
    """GLM-5.2's IndexShare (index_topk_freq 4; indexer_types full, full, full, shared x 3, full, ...): one indexer
    every 4th layer from layer 2 on; the shared layers hold no indexer, as transformers builds them."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    n = 78
    kinds = ["full" if max(i - 3 + 1, 0) % 4 == 0 else "shared" for i in range(n)]
    assert kinds[:8] == ["full", "full", "full", "shared", "shared", "shared", "full", "shared"]
    cfg = _config(GLM) | {"indexer_types": kinds}
    m = spec_from_hf_config(cfg)
    assert (m.dsa.shared_every, m.dsa.shared_offset) == (4, 3)
    assert [m.dsa.runs_indexer(i) for i in range(n)] == [k == "full" for k in kinds]
    small = cfg | {"num_hidden_layers": 8, "indexer_types": kinds[:8]}
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**small))
    assert spec_from_hf_config(small).num_params == sum(p.numel() for p in model.parameters())
    assert spec_from_hf_config(_config(GLM) | {"index_topk_freq": 4, "index_skip_topk_offset": 3}).dsa == m.dsa


@pytest.mark.parametrize(("stem", "change", "message"), [
    (DS, {"q_lora_rank": None}, r"needs mla with q_lora_rank > 0"),
    (DS, {"moe_layer_freq": 2}, r"moe_layer_freq=2 is not supported .* mlp_layer_types places"),
    (DS, {"layer_types": ["full_attention"] * 61}, r"layer_types=.*'indexed_attention'"),
    (DS, {"index_head_dim": 32}, r"index_head_dim \(32\) must be >= mla qk_rope_head_dim \(64\)"),
    (GLM, {"qk_head_dim": 192}, r"qk_head_dim=192 and qk_nope_head_dim \+ qk_rope_head_dim=256 disagree"),
    (GLM, {"indexer_rope_interleave": False}, r"indexer_rope_interleave=False is not supported"),
    (GLM, {"indexer_types": ["full"] * 2 + ["shared"] + ["full"] * 75}, r"'full' every N-th layer from an offset"),
    (GLM, {"indexer_types": ["shared"] + ["full"] * 77}, r"layer 0 'full'"),
])
def test_what_the_loader_refuses(stem: str, change: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        spec_from_hf_config(_config(stem) | change)


def test_mlp_layer_types_place_the_moe() -> None:
    types = ["dense"] * 3 + ["sparse"] * 75
    assert _spec(GLM, mlp_layer_types=types) == _spec(GLM)
    with pytest.raises(UserInputError, match="mlp_layer_types"):
        spec_from_hf_config(_config(GLM) | {"mlp_layer_types": ["dense"] * 78})
