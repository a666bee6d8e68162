"""The model-equivalence check's reference router (``autoplan.validate.model_equivalence._hf_router_config``) reads
config.json's booleans as the catalog does (``autoplan.catalog.hf._Config.flag``): a JSON boolean, the family's
default when absent, and a clear refusal of anything else (``bool("false")`` is True). No torch needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.errors import UserInputError
from autoplan.validate.model_equivalence import _hf_router_config

HF = Path(__file__).parent / "data" / "hf"


@pytest.mark.parametrize(("name", "renormalize"), [("qwen3-235b-a22b.json", True), ("mixtral-8x7b.json", True),
                                                   ("deepseek-v3.json", True), ("glm-4.5-air.json", True),
                                                   ("olmoe-1b-7b-0924.json", False)])
def test_published_configs_read_as_before(name: str, renormalize: bool) -> None:
    c = json.loads((HF / name).read_text())
    experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
    assert _hf_router_config(c, experts)["renormalize"] is renormalize


@pytest.mark.parametrize(("model_type", "default"), [("mixtral", True), ("qwen3_moe", False), ("glm4_moe", True)])
def test_absent_flag_takes_the_family_default(model_type: str, default: bool) -> None:
    assert _hf_router_config({"model_type": model_type, "num_experts_per_tok": 2}, 8)["renormalize"] is default


@pytest.mark.parametrize("model_type", ["qwen3_moe", "glm4_moe"])
def test_string_flag_is_refused_naming_key_and_value(model_type: str) -> None:
    with pytest.raises(UserInputError) as err:
        _hf_router_config({"model_type": model_type, "num_experts_per_tok": 2, "norm_topk_prob": "false"}, 8)
    assert "'norm_topk_prob' must be true or false" in str(err.value) and "'false'" in str(err.value)
