"""The catalog against the published Hugging Face configs (tests/data/hf/, sources in its README), and the HF
loader's promise that no architecture key is dropped silently."""

from __future__ import annotations

import json
import warnings

import pytest

from autoplan.catalog import load_model
from autoplan.catalog.hf import SUPPORTED_MODEL_TYPES, HFConfigWarning, spec_from_hf_config
from autoplan.errors import UserInputError
from tests.hf_files import HF, hf_config

_config = hf_config  # the published files (tests/hf_files.py)

# catalog name -> published config file (every catalog entry that has a public config.json here)
CATALOG_FILES = {
    "llama3-8b": "llama3-8b", "llama3-70b": "llama3-70b", "llama3.1-8b": "llama3.1-8b",
    "llama3.1-70b": "llama3.1-70b", "llama3-405b": "llama3.1-405b", "mistral-7b": "mistral-7b",
    "mixtral-8x7b": "mixtral-8x7b", "mixtral-8x22b": "mixtral-8x22b", "qwen3-235b-a22b": "qwen3-235b-a22b",
    "deepseek-v3": "deepseek-v3", "gpt-oss-120b": "gpt-oss-120b", "gpt-oss-20b": "gpt-oss-20b",
    "nemotron-3-nano-30b-a3b": "nemotron-3-nano-30b-a3b", "glm-4.5": "glm-4.5", "glm-4.5-air": "glm-4.5-air",
    "olmoe-1b-7b": "olmoe-1b-7b-0924", "nemotron4-15b": "nemotron4-15b",
    "llama4-scout-17b-16e": "llama4-scout-17b-16e", "qwen3-next-80b-a3b": "qwen3-next-80b-a3b",
    "deepseek-v3.2": "deepseek-v3.2", "glm-5.1": "glm-5.1", "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3-8b": "qwen3-8b",
}
# one published config per supported model_type
BY_TYPE = {json.loads(p.read_text())["model_type"]: p.stem for p in sorted(HF.glob("*.json"))}


@pytest.mark.parametrize("name", sorted(CATALOG_FILES))
def test_catalog_matches_published_config_field_by_field(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFConfigWarning)  # the published files have no unread key
        from_hf = spec_from_hf_config(_config(CATALOG_FILES[name]), name=name)
    ours = load_model(name).model_dump()
    theirs = from_hf.model_dump()
    diff = {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}
    assert not diff, f"{name}: catalog vs published config.json differ: {diff}"


def test_every_supported_model_type_has_a_published_config() -> None:
    assert set(BY_TYPE) == set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_unknown_architecture_key_is_reported(model_type: str) -> None:
    cfg = _config(BY_TYPE[model_type]) | {"attn_logit_softcapping": 30.0}
    with pytest.warns(HFConfigWarning, match=r"keys not read by autoplan's '" + model_type +
                      r"' loader: \['attn_logit_softcapping'\]"):
        spec_from_hf_config(cfg)


@pytest.mark.parametrize(("stem", "change", "message"), [
    ("llama3.1-8b", {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, r"rope_scaling.rope_type='longrope'"),
    ("llama3-8b", {"hidden_act": "relu"}, r"hidden_act='relu' is not supported"),
    ("qwen2-7b", {"use_sliding_window": True, "max_window_layers": 14}, r"max_window_layers=14"),
    ("deepseek-v3", {"topk_method": "random"}, r"topk_method='random'"),
    ("mixtral-8x7b", {"router_jitter_noise": 0.1}, r"router_jitter_noise=0.1"),
    ("bloom-560m", {"apply_residual_connection_post_layernorm": True}, r"post_layernorm=True"),
])
def test_values_autoplan_cannot_represent_are_errors(stem: str, change: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        spec_from_hf_config(_config(stem) | change)


def test_llama_ignores_a_stray_window_as_transformers_does_and_says_so() -> None:
    """LlamaConfig has no sliding_window: the key is reported unread, not turned into a window."""
    with pytest.warns(HFConfigWarning, match="sliding_window"):
        spec = spec_from_hf_config(_config("llama3-8b") | {"sliding_window": 4096})
    assert spec.arch.sliding_window is None
    assert spec_from_hf_config(_config("mistral-7b")).arch.sliding_window == 4096


@pytest.mark.parametrize("window", ["absent", None, 2048])
def test_mistral_window_as_transformers_builds_it(window: object) -> None:
    """A Mistral config without ``sliding_window`` slides over MistralConfig's 4096, as transformers builds it; an
    explicit null is no window."""
    transformers = pytest.importorskip("transformers")
    base = {k: v for k, v in _config("mistral-7b").items() if k != "sliding_window"}
    data = base if window == "absent" else base | {"sliding_window": window}
    theirs = transformers.MistralConfig.from_dict(data).sliding_window
    assert spec_from_hf_config(data).arch.sliding_window == theirs
    assert theirs == {"absent": 4096, None: None, 2048: 2048}[window]  # the case each parameter is


def test_qwen_window_only_when_enabled_on_every_layer() -> None:
    base = _config("qwen2-7b")
    assert spec_from_hf_config(base).arch.sliding_window is None  # use_sliding_window false
    on = spec_from_hf_config(base | {"use_sliding_window": True, "max_window_layers": 0, "sliding_window": 4096})
    assert on.arch.sliding_window == 4096


def test_architecture_facts_read_from_published_configs() -> None:
    ds = spec_from_hf_config(_config("deepseek-v3"))
    r, rs = ds.arch.router, ds.arch.rope_scaling
    assert (r.score_function, r.expert_bias, r.num_groups, r.group_top_k, r.top_k_scaling) == ("sigmoid", True, 8, 4,
                                                                                                2.5)
    assert rs is not None and (rs.type, rs.factor, rs.mscale_all_dim) == ("yarn", 40.0, 1.0)
    assert ds.arch.mtp_layers == 1 and ds.arch.norm_eps == 1e-6
    q = spec_from_hf_config(_config("qwen3-235b-a22b"))
    assert q.arch.qk_norm and q.arch.norm_eps == 1e-6 and q.arch.rope_theta == 1e6 and q.arch.router.norm_top_k
    assert spec_from_hf_config(_config("mixtral-8x7b")).arch.router.aux_loss_coeff == 0.02
    assert spec_from_hf_config(_config("pythia-160m")).arch.rotary_fraction == 0.25
