"""When the user's knobs rule out every layout the search builds (``search.planner._runs_with_knobs``), the refusal
names the rules that bind, not the first layout's: ``search --model deepseek-v3 --gpus 1024 --seq-len 32768
--moe-a2a-overlap`` said "moe_a2a_overlap with ep=1: ... needs expert parallelism; valid: ep > 1" although every
ep > 1 layout was refused as well (pp=1 by the MTP rule, pp > 1 by the virtual-pipeline rule, with no interleaved
split of DeepSeek-V3's 61 layers). A small MoE with one MTP layer and 13 layers (no interleaved split at pp 2, 4, 8
either) is the same case in seconds; since the search weighs Megatron's explicit layouts it interleaves that model,
so the refusal is asked with vp pinned to 1."""

from __future__ import annotations

from typing import Any

import pytest

import autoplan


def _moe(layers: int, **change: Any) -> dict[str, Any]:
    return {"name": "moe", "num_layers": layers, "hidden_size": 1024, "ffn_hidden_size": 2048,
            "num_attention_heads": 8, "num_kv_heads": 8, "vocab_size": 32000, "num_experts": 8, "moe_top_k": 2,
            "moe_ffn_hidden_size": 1024, "tied_embeddings": False, "gated_mlp": True, "arch": {"mtp_layers": 1},
            **change}


def _search(model: dict[str, Any], **pins: Any) -> Any:
    return autoplan.search({"model": model, "cluster": {"num_gpus": 16}, "parallel": pins,
                            "job": {"global_batch_size": 64, "seq_len": 4096}, "software": {"moe_a2a_overlap": True}})


def test_a_knob_no_layout_runs_names_every_rule_and_why_none_interleaves() -> None:
    with pytest.raises(autoplan.InputError) as info:
        _search(_moe(13), vp=1)  # unpinned, Megatron's explicit layouts interleave it (the test below)
    msg = str(info.value)
    assert msg.startswith("no layout of moe on 16 GPUs runs the settings asked for: each breaks one of these 4 rules")
    for rule in ("with ep=1: --overlap-moe-expert-parallel-comm needs expert parallelism",
                 "with an MTP layer and pp=1: --overlap-moe-expert-parallel-comm needs pp > 1 with MTP",
                 "needs a virtual pipeline when pp > 1", "refuses full recomputation"):
        assert rule in msg, msg
    assert "no layout searched is interleaved: the pinned vp=1" in msg
    assert msg.endswith("; valid: moe_a2a_overlap=false") and len(msg) < 1000, msg


def test_the_same_knob_on_a_model_with_an_interleaved_split_plans() -> None:
    """7 layers split unevenly over pp 2 x vp 2: the rules above leave that layout, and the search plans it. 13 layers
    have no interleaved split Megatron's flags build at pp 2, 4, 8: an explicit layout interleaves them."""
    plan = _search(_moe(7)).plans[0].parallel
    assert plan.ep > 1 and plan.pp > 1 and plan.schedule == "interleaved"
    plan = _search(_moe(13)).plans[0].parallel
    assert plan.ep > 1 and plan.pp > 1 and plan.schedule == "interleaved" and plan.pipeline_layout is not None


def test_one_rule_is_refused_as_itself() -> None:
    dense = {k: v for k, v in _moe(13).items() if not k.startswith(("num_experts", "moe_"))}
    with pytest.raises(autoplan.InputError, match=r"^moe_a2a_overlap: MoE settings on moe, a dense model; valid: "):
        _search(dense)
