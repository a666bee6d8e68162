"""torchtitan builds its flavors, not the user's model: a model with a shipped flavor's dims is emitted only when
every fact the flavor fixes in code matches (``torchtitan_models.arch_overrides``). Each change below once matched a
flavor by its dims alone and was emitted as that flavor, a different model (issue 12 faithfulness)."""

from __future__ import annotations

from typing import Any

import pytest

from autoplan.catalog import load_model
from autoplan.catalog.registry import model_names
from cost_models.specs import ModelSpec
from cost_models.targets.torchtitan_models import SHIPPED, fingerprint, shipped_model_error


def _arch(m: ModelSpec, **change: Any) -> ModelSpec:
    return m.model_copy(update={"arch": m.arch.model_copy(update=change)})


LLAMA = load_model("llama3-8b")
QWEN = load_model("qwen3-235b-a22b")
CHANGES = {
    "tied embeddings": (LLAMA.model_copy(update={"tied_embeddings": True}), "parameters"),
    "q/k norm": (_arch(LLAMA, qk_norm=True), "parameters"),
    "head dim": (LLAMA.model_copy(update={"head_dim": 256}), "head dim 256"),
    "no q/k norm": (_arch(QWEN, qk_norm=False), "q/k norm False"),
    "top-k": (QWEN.model_copy(update={"moe_top_k": 4}), "router"),
    "dropout": (_arch(LLAMA, hidden_dropout=0.1), "dropout 0.1"),
    "NoPE": (_arch(LLAMA, no_position_encoding=True), "positions other than RoPE"),
    "layernorm": (LLAMA.model_copy(update={"norm": "layernorm"}), "layernorm (torchtitan: rmsnorm)"),
    "zero-centered": (_arch(LLAMA, norm_zero_centered_gamma=True), "zero-centered rmsnorm"),
    "partial RoPE": (_arch(LLAMA, rotary_fraction=0.5), "RoPE on 0.5 of each head"),
    "non-gated": (LLAMA.model_copy(update={"gated_mlp": False}), "non-gated silu MLP"),
    # Llama 4's facts (each weightless: the parameter count still matches the flavor's)
    "NoPE layers": (_arch(LLAMA, no_rope_every=4), "no RoPE on every 4th layer"),
    "q/k L2 norm": (_arch(LLAMA, qk_l2_norm=True), "weightless q/k L2 norm"),
    "chunked attention": (_arch(LLAMA, attention_chunk=8192), "chunked attention of 8192 tokens"),
    "temperature": (_arch(LLAMA, no_rope_every=4, attn_temperature={"floor_scale": 8192}), "temperature tuning"),
    "probs on input": (_arch(QWEN, router=QWEN.arch.router.model_copy(update={"probs_on_input": True})),
                       "router weights on the expert input"),
}


@pytest.mark.parametrize("what", sorted(CHANGES))
def test_a_fact_the_flavor_fixes_is_refused(what: str) -> None:
    model, said = CHANGES[what]
    assert fingerprint(model) == fingerprint(LLAMA if model.num_experts == 0 else QWEN)  # the dims still match
    err = shipped_model_error(model)
    assert err is not None and said in str(err) and "use another --target" in str(err), err


def test_the_catalog_models_with_a_flavors_dims_are_that_flavor() -> None:
    dims = {t.dims for t in SHIPPED}
    matched = [n for n in model_names() if fingerprint(load_model(n)) in dims]
    exact = [n for n in matched if shipped_model_error(load_model(n)) is None]
    # DeepSeek-V3.2 has DeepSeek-V3's dims but sparse attention: its indexer's weights differ from the flavor's count
    assert set(exact) == {"deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "llama3-405b", "llama3-70b", "llama3-8b",
                          "llama3.1-70b", "llama3.1-8b", "qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-8b"}, exact
    assert set(matched) - set(exact) == {"deepseek-v3.2"}, matched


def test_a_shared_mtp_module_is_refused() -> None:
    """torchtitan's deepseek_v3 builds one MTP module per depth (models/deepseek_v3/__init__.py _build_mtp_layers);
    a model whose one MTP module serves every depth (``mtp_repeated``) was emitted with num_mtp_layers depths of
    their own weights, silently. One depth is the same model either way."""
    dsv3 = load_model("deepseek-v3")
    two = _arch(dsv3, mtp_layers=2, mtp_repeated=True)
    err = shipped_model_error(two)
    assert err is not None and "mtp_repeated" in str(err) and "a module per depth" in str(err), err
    assert shipped_model_error(_arch(dsv3, mtp_layers=2)) is None
    assert shipped_model_error(_arch(dsv3, mtp_layers=1, mtp_repeated=True)) is None


@pytest.mark.parametrize(("model", "takes"), [(_arch(LLAMA, alibi=True), ["fsdp2"]),
                                              (LLAMA.model_copy(update={"gated_mlp": False}), ["fsdp2"]),
                                              (_arch(LLAMA, rotary_fraction=0.5), ["megatron", "fsdp2"])])
def test_a_refusal_suggests_only_the_targets_that_emit_the_plan(model: ModelSpec, takes: list[str]) -> None:
    """The refusal said "use --target megatron" for a model Megatron-LM has no flags for (ALiBi, a non-gated SiLU),
    then "this plan can be emitted for --target fsdp2": the one rule (``emittable_targets``) names the targets."""
    from autoplan.catalog import build_cluster
    from autoplan.emit import TARGETS, EmitPlan, emit, emittable_targets
    from cost_models.errors import ConfigError
    from cost_models.specs import JobSpec, ParallelConfig

    plan = EmitPlan(model, build_cluster("h100-sxm", 8), JobSpec(global_batch_size=64, seq_len=2048),
                    ParallelConfig(tp=1, pp=1, zero_stage=3))
    assert emittable_targets(plan) == takes
    with pytest.raises(ConfigError) as refused:
        emit(plan, "torchtitan")
    said, hint = str(refused.value), f"; this plan can be emitted for --target {' or '.join(takes)}"
    assert said.endswith(hint), said
    assert not any(f"--target {t}" in said.removesuffix(hint) for t in TARGETS), said  # the reason names none


def test_an_estimate_note_offers_only_the_targets_whose_emit_takes_the_model() -> None:
    """One rule per target (``TargetProfile.emit_model_errors``) for emit's refusal and the estimate's note: the note
    on a model torchtitan does not ship named 'megatron or fsdp2' whatever the model; for an ALiBi model (BLOOM)
    Megatron-LM refuses it too."""
    import json
    import warnings
    from pathlib import Path

    from autoplan.catalog import build_cluster
    from autoplan.catalog.hf import spec_from_hf_config
    from cost_models.estimate import estimate
    from cost_models.specs import JobSpec, ParallelConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bloom = spec_from_hf_config(json.loads((Path(__file__).parent / "data" / "hf" / "bloom-560m.json")
                                               .read_text()), name="bloom")
    cluster, job = build_cluster("h100-sxm", 64), JobSpec(global_batch_size=64, seq_len=4096)

    def note(model: ModelSpec) -> str:
        est = estimate(model, cluster, job, ParallelConfig(tp=1), target="torchtitan", check=False)
        [n] = [n for n in est.notes if n.startswith("not emittable for torchtitan")]
        return n

    assert note(bloom).endswith("; emit it for --target fsdp2")
    assert note(load_model("mixtral-8x7b")).endswith("; emit it for --target megatron or fsdp2")
