"""The emitted model is the published model: megatron-core builds it from autoplan's emitted arguments on the meta
device and every compared field equals what transformers builds from the published config.json (parameters, RoPE
frequencies incl. llama3/YaRN scaling, norm epsilon, q/k norm, attention window, softmax scale, router).
One subprocess per model (process-global torch.distributed state). Needs the validate extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.catalog import load_model
from autoplan.catalog.registry import model_names
from autoplan.emit.megatron import yarn_not_emitted
from tests.test_llama4 import MAVERICK
from tests.written_configs import MISTRAL_7B

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.consumers, pytest.mark.slow]

HF = Path(__file__).parent / "data" / "hf"
ROOT = Path(__file__).parent.parent


CASES = {"llama3-8b": HF / "llama3-8b.json", "llama3-70b": HF / "llama3-70b.json",
         "llama3-405b": HF / "llama3.1-405b.json", "llama3.1-8b": HF / "llama3.1-8b.json",
         "mixtral-8x7b": HF / "mixtral-8x7b.json", "qwen3-235b-a22b": HF / "qwen3-235b-a22b.json",
         "deepseek-v3": HF / "deepseek-v3.json", "mistral-7b": None, "gpt-oss-20b": HF / "gpt-oss-20b.json",
         # a user's config.json: MLA whose HF rotary is modeling_deepseek_v2's complex-pair apply_rotary_emb
         "deepseek-v2-lite": HF / "deepseek-v2-lite.json",
         # a user's config.json (no catalog entry): Qwen2-MoE's gated shared expert and q/k/v biases
         "qwen1.5-moe-a2.7b": HF / "qwen1.5-moe-a2.7b.json",
         # LayerNorm1p (zero-centered gamma), squared-ReLU MLP, RoPE on half of each head
         "nemotron4-15b": HF / "nemotron4-15b.json",
         # NoPE every 4th layer, interleaved RoPE, top-1 sigmoid router on the expert input, MoE every 2nd layer
         "llama4-maverick-17b-128e": None}


# torchtitan 0.3.0 ships these (mixtral and mistral it does not: the emitter refuses them, tested in test_emit.py)
TITAN_CASES = ["deepseek-v3", "gpt-oss-20b", "llama3-405b", "llama3-70b", "llama3-8b", "llama3.1-8b",
               "qwen3-235b-a22b"]


def titan_router_diff(name: str) -> set[str]:
    """The router facts torchtitan 0.3.0 cannot express, as the emitter's WARNING notes announce them: its MoE has
    no auxiliary loss, always balances with a per-expert bias (MoE.Config.load_balance_coeff,
    torchtitan/models/common/moe.py) and always computes its gate in fp32."""
    from autoplan.catalog import load_model
    from autoplan.emit.torchtitan import balancing_warnings, router_precision_warnings

    model = load_model(name)
    warned = balancing_warnings(model) + router_precision_warnings(model)
    return ({"aux_coeff"} if any("loss" in w and "not trained" in w for w in warned) else set()) | \
        ({"expert_bias"} if any("no expert bias" in w for w in warned) else set()) | \
        ({"logits_fp32"} if any("logits in bf16" in w for w in warned) else set())


def rows_for(model: str, config: Path, framework: str = "megatron-core") -> list[list]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "autoplan.validate.model_equivalence", model, str(config), framework],
                         capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_builds_the_published_model(name: str, tmp_path: Path) -> None:
    config = CASES[name]
    model = name
    if name == "llama4-maverick-17b-128e":  # Maverick's text_config: Scout's with the keys Meta's file changes
        config = tmp_path / "config.json"
        # (transformers 5.24's strict config takes attn_temperature_tuning as a bool: Meta's files write 4)
        config.write_text(json.dumps(json.loads((HF / "llama4-scout-17b-16e-text.json").read_text()) | MAVERICK
                                     | {"attn_temperature_tuning": True}))
    elif config is None:  # the Mistral config.json is written by the test and loaded as a user's file
        config = tmp_path / "config.json"
        config.write_text(json.dumps(MISTRAL_7B))
        model = str(config)
    elif name not in model_names():
        model = str(config)
    rows = rows_for(model, config)
    assert {r[2] for r in rows} >= {"params", "rope_inv_freq", "norm_eps", "norm", "qk_norm", "window", "softmax_scale",
                                    "router", "layer_windows", "attention_sinks", "glu", "rope_layers",
                                    "qk_l2_layers", "rope_interleaved"}
    differ = [r for r in rows if r[3] != r[4] and r[2] != "rope_inv_freq" or r[3] == "DIFFERENT"]
    # YaRN on standard attention has no Megatron-LM flag: the emitter's WARNING note announces plain RoPE (its
    # frequencies and the attention-logit factor differ); nothing else may
    announced = {"rope_inv_freq", "softmax_scale"} if yarn_not_emitted(load_model(model)) else set()
    assert {r[2] for r in differ} == announced, differ


@pytest.mark.parametrize("name", TITAN_CASES)
def test_torchtitan_builds_the_published_model(name: str) -> None:
    rows = rows_for(name, CASES[name], "torchtitan")
    differ = [r for r in rows if (r[3] != r[4] and r[2] != "rope_inv_freq") or r[3] == "DIFFERENT"]
    announced = titan_router_diff(name)
    router = [r for r in differ if r[2] == "router"]
    assert {k for r in router for k in r[3] if r[3][k] != r[4][k]} == announced, (router, announced)
    differ = [r for r in differ if r[2] != "router"]
    assert not differ, differ
