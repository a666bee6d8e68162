"""GLM-4.5 family (``glm4_moe``) and OLMoE (``olmoe``) from their published config.json (tests/data/hf/, sources in its
README): every architecture fact is read, the parameter counts are transformers' own and the model cards', the emitted
Megatron arguments build the model in megatron-core, and what Megatron cannot build is a WARNING."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.catalog.hf import HFConfigWarning, spec_from_hf_config
from autoplan.emit import EmitPlan, emit
from autoplan.errors import ConfigError, UserInputError
from cost_models.specs import JobSpec, ModelSpec, ParallelConfig
from tests.hf_files import HF, hf_config, hf_spec

_config, _spec = hf_config, hf_spec  # the published files (tests/hf_files.py)
GLM, AIR, OLMOE = "glm-4.5", "glm-4.5-air", "olmoe-1b-7b-0924"


def _plan(m: ModelSpec, **par: int) -> EmitPlan:
    return EmitPlan(m, build_cluster("h100-sxm", 64), JobSpec(global_batch_size=512, seq_len=4096),
                    ParallelConfig(**par))


# ---- reading -----------------------------------------------------------------------------------


def test_glm_reader_reads_every_fact() -> None:
    m, a = _spec(GLM), _spec(GLM).arch
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim,
            m.vocab_size) == (92, 5120, 12288, 96, 8, 128, 151552)
    assert (m.num_experts, m.moe_top_k, m.moe_ffn_hidden_size, m.num_shared_experts, m.first_dense_layers,
            m.num_moe_layers) == (160, 8, 1536, 1, 3, 89)
    assert m.qkv_bias and not m.linear_bias and not m.tied_embeddings and m.gated_mlp
    assert (a.rope_theta, a.rotary_fraction, a.norm_eps, a.qk_norm, a.qk_norm_per_head, a.mtp_layers) == \
        (1e6, 0.5, 1e-5, True, True, 1)
    r = a.router
    assert (r.score_function, r.expert_bias, r.norm_top_k, r.top_k_scaling, r.num_groups, r.group_top_k) == \
        ("sigmoid", True, True, 2.5, 0, 0)
    air = _spec(AIR)
    assert (air.num_layers, air.first_dense_layers, air.num_experts, air.moe_ffn_hidden_size) == (46, 1, 128, 1408)
    assert not air.arch.qk_norm and air.arch.router.top_k_scaling == 1.0


def test_olmoe_reader_reads_every_fact() -> None:
    m = _spec(OLMOE)
    a, r = m.arch, m.arch.router
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.vocab_size) == (16, 2048, 16, 16,
                                                                                                50304)
    assert (m.num_experts, m.moe_top_k, m.expert_ffn_hidden_size, m.num_shared_experts, m.num_moe_layers) == \
        (64, 8, 1024, 0, 16)
    assert not m.qkv_bias and not m.tied_embeddings
    assert (a.qk_norm, a.qk_norm_per_head, a.qkv_clip, a.rope_theta, a.norm_eps) == (True, False, None, 1e4, 1e-5)
    assert (r.score_function, r.norm_top_k, r.aux_loss, r.aux_loss_coeff) == ("softmax", False, "aux_loss", 0.01)
    assert _spec(OLMOE, clip_qkv=8.0).arch.qkv_clip == 8.0


def test_config_class_defaults_apply() -> None:
    """Keys a file leaves out take Glm4MoeConfig's / OlmoeConfig's defaults (partial rotary 0.5, one MTP layer, one
    dense layer; OLMoE's 64 experts top 8, aux 0.01), as transformers would."""
    glm = {k: v for k, v in _config(AIR).items() if k not in ("partial_rotary_factor", "num_nextn_predict_layers",
                                                                "first_k_dense_replace", "norm_topk_prob")}
    m = spec_from_hf_config(glm)
    assert (m.arch.rotary_fraction, m.arch.mtp_layers, m.first_dense_layers, m.arch.router.norm_top_k) == \
        (0.5, 1, 1, True)
    five = _config(AIR) | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}}
    del five["partial_rotary_factor"], five["rope_theta"], five["rope_scaling"]
    assert spec_from_hf_config(five).arch.rotary_fraction == 0.25  # transformers 5.x: inside rope_parameters
    bare = {k: v for k, v in _config(AIR).items() if k not in ("num_key_value_heads", "intermediate_size")}
    m = spec_from_hf_config(bare)  # Glm4MoeConfig: 8 KV heads (not one per query head), dense width 10944
    assert (m.num_kv_heads, m.ffn_hidden_size) == (8, 10944)
    olmoe = {k: v for k, v in _config(OLMOE).items() if k not in ("num_experts", "num_experts_per_tok",
                                                                    "router_aux_loss_coef")}
    m = spec_from_hf_config(olmoe)
    assert (m.num_experts, m.moe_top_k, m.arch.router.aux_loss_coeff) == (64, 8, 0.01)


# ---- parameter counts --------------------------------------------------------------------------


def _embedding(m: ModelSpec) -> int:
    return m.vocab_size * m.hidden_size * (1 if m.tied_embeddings else 2)


# (fixture, total, active without the embedding and output matrices, rel. tolerance): the model cards (GLM-4.5:
# "355 billion total parameters with 32 billion active"; GLM-4.5-Air 106B / 12B; OLMoE-1B-7B: "1B active and 7B
# total", the OLMoE paper's 6.9B / 1.3B). GLM's active figures leave out the 2 x vocab x hidden embedding and head
# (33.63B and 13.42B with them); its MTP layer is not in ModelSpec.num_params (as for DeepSeek-V3). OLMoE's figures
# count the embeddings.
PUBLIC = [(GLM, 355e9, 32e9, 0.01, True), (AIR, 106e9, 12e9, 0.02, True), (OLMOE, 6.9e9, 1.3e9, 0.02, False)]


@pytest.mark.parametrize(("stem", "total", "active", "rel", "no_embed"), PUBLIC, ids=[p[0] for p in PUBLIC])
def test_parameter_counts_match_the_model_cards(stem: str, total: float, active: float, rel: float,
                                                no_embed: bool) -> None:
    m = _spec(stem)
    assert m.num_params == pytest.approx(total, rel=rel)
    assert m.num_active_params - (_embedding(m) if no_embed else 0) == pytest.approx(active, rel=rel)


@pytest.mark.parametrize("stem", [GLM, AIR, OLMOE])
def test_parameter_count_is_transformers_own(stem: str) -> None:
    """transformers builds the published model on the meta device; ModelSpec counts the same weights, but for OLMoE's
    q/k norms, which it counts per head (what Megatron builds, see the WARNING below)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(**_config(stem))
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
    m = _spec(stem)
    norms = m.num_layers * (m.q_dim + m.kv_dim - 2 * m.head_dim_resolved) if stem == OLMOE else 0
    assert hf - m.num_params == norms


# ---- Megatron ----------------------------------------------------------------------------------


def _flags(m: ModelSpec, **par: int) -> str:
    from autoplan.emit.megatron import megatron_args

    return " ".join(megatron_args(_plan(m, **par)))


def test_megatron_gets_every_glm_fact() -> None:
    text = _flags(_spec(GLM), tp=2, ep=8)
    for flag in ("--num-layers 92", "--hidden-size 5120", "--ffn-hidden-size 12288", "--num-attention-heads 96",
                 "--group-query-attention --num-query-groups 8", "--kv-channels 128", "--swiglu",
                 "--normalization RMSNorm --norm-epsilon 1e-05", "--qk-layernorm", "--disable-bias-linear --add-qkv-bias",
                 "--position-embedding-type rope --rotary-base 1000000 --rotary-percent 0.5",
                 "--untie-embeddings-and-output-weights", "--num-experts 160", "--moe-router-topk 8",
                 "--moe-ffn-hidden-size 1536", "--moe-shared-expert-intermediate-size 1536",
                 "--moe-layer-freq ([0]*3+[1]*89)", "--moe-router-score-function sigmoid",
                 "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor 2.5",
                 "--moe-router-load-balancing-type seq_aux_loss", "--moe-aux-loss-coeff 0.001", "--mtp-num-layers 1"):
        assert flag in text, flag
    assert "--moe-router-pre-softmax" not in text and "--moe-router-num-groups" not in text
    air = _flags(_spec(AIR), tp=2, ep=8)
    assert "--moe-layer-freq ([0]*1+[1]*45)" in air and "--rotary-percent 0.5" in air
    assert "--qk-layernorm" not in air and "--moe-router-topk-scaling-factor" not in air  # 1.0 is Megatron's default
    grouped = _flags(_spec(GLM, n_group=8, topk_group=4), tp=2, ep=8)
    assert "--moe-router-num-groups 8 --moe-router-group-topk 4" in grouped


def test_megatron_gets_every_olmoe_fact() -> None:
    text = _flags(_spec(OLMOE), tp=1, ep=8)
    for flag in ("--num-layers 16", "--hidden-size 2048", "--ffn-hidden-size 1024", "--num-attention-heads 16",
                 "--qk-layernorm", "--disable-bias-linear", "--rotary-base 10000", "--num-experts 64",
                 "--moe-router-topk 8", "--moe-ffn-hidden-size 1024", "--moe-router-score-function softmax",
                 "--moe-router-pre-softmax", "--moe-router-load-balancing-type aux_loss", "--moe-aux-loss-coeff 0.01"):
        assert flag in text, flag
    for flag in ("--add-qkv-bias", "--moe-layer-freq", "--moe-shared-expert-intermediate-size", "--mtp-num-layers",
                 "--group-query-attention", "--rotary-percent"):
        assert flag not in text, flag


@pytest.mark.parametrize("stem", [GLM, AIR, OLMOE])
def test_megatron_core_accepts_the_arguments(stem: str) -> None:
    """megatron-core 0.16.1's own TransformerConfig checks (MoE, expert bias with sigmoid, MTP, qk layernorm) on the
    emitted list, mapped as Megatron-LM's core_transformer_config_from_args does."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer import TransformerConfig

    from autoplan.emit.megatron import megatron_args, parse_megatron_args
    from autoplan.validate.megatron_checks import gpt_model_kwargs, transformer_config_kwargs
    from autoplan.validate.megatron_lm import stand_in_te_version

    stand_in_te_version()  # what the validate path does first: no Transformer Engine on this CPU machine
    m = _spec(stem)
    ns = parse_megatron_args(megatron_args(_plan(m, tp=2 if stem != OLMOE else 1, ep=8)))
    mla, kw = transformer_config_kwargs(ns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = TransformerConfig(**kw)
    assert not mla and (cfg.num_moe_experts, cfg.moe_router_topk, cfg.kv_channels) == \
        (m.num_experts, m.moe_top_k, m.head_dim_resolved)
    assert (cfg.qk_layernorm, cfg.add_qkv_bias, cfg.add_bias_linear, cfg.mtp_num_layers) == \
        (m.arch.qk_norm, m.qkv_bias, False, m.arch.mtp_layers or None)
    assert (cfg.moe_router_score_function, cfg.moe_router_enable_expert_bias, cfg.moe_router_pre_softmax) == \
        (m.arch.router.score_function, m.arch.router.expert_bias, not m.arch.router.norm_top_k)
    if isinstance(cfg.moe_layer_freq, list):
        assert [bool(f) for f in cfg.moe_layer_freq] == [m.is_moe_layer(i) for i in range(m.num_layers)]
    ns.padded_vocab_size = m.vocab_size
    assert gpt_model_kwargs(ns)["rotary_percent"] == m.arch.rotary_fraction


def test_megatron_warns_what_it_cannot_build() -> None:
    notes = emit(_plan(_spec(OLMOE), ep=8), "megatron").notes
    qk = [n for n in notes if "q/k RMSNorms" in n]
    assert len(qk) == 1 and qk[0].startswith("WARNING") and "2048" in qk[0] and "128 channels" in qk[0]
    assert not any("clip_qkv" in n for n in notes)
    clipped = emit(_plan(_spec(OLMOE, clip_qkv=8.0), ep=8), "megatron").notes
    assert any(n.startswith("WARNING") and "[-8, 8]" in n and "clip_qkv" in n for n in clipped)
    for stem in (GLM, AIR):  # per-head norms, no clamp: nothing to announce
        glm = emit(_plan(_spec(stem), tp=2, ep=8), "megatron").notes
        assert not any(n.startswith("WARNING") for n in glm), glm


def test_loader_warnings() -> None:
    with pytest.warns(HFConfigWarning, match=r"ranks groups by the sum of their top-2 scores, Megatron-Core by the sum "
                      r"of their top 4"):
        spec_from_hf_config(_config(GLM) | {"n_group": 8, "topk_group": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFConfigWarning)
        spec_from_hf_config(_config(GLM) | {"n_group": 8, "topk_group": 4})  # 8 // 4 = 2: the same ranking
    with pytest.warns(HFConfigWarning, match=r"o_proj"):
        spec_from_hf_config(_config(OLMOE) | {"attention_bias": True})


@pytest.mark.filterwarnings("ignore::autoplan.catalog.hf.HFConfigWarning")
@pytest.mark.parametrize(("stem", "change", "message"), [
    (OLMOE, {"clip_qkv": -1}, r"clip_qkv=-1 is not supported for model_type 'olmoe' \(a positive number or null\)"),
    (OLMOE, {"clip_qkv": "big"}, r"clip_qkv='big'"),
    (OLMOE, {"num_experts": 0}, r"key 'num_experts' must be >= 1, got 0"),
    (OLMOE, {"num_experts_per_tok": 65}, r"moe_top_k \(65\) must be in 1..num_experts \(64\)"),
    (GLM, {"partial_rotary_factor": 0}, r"rotary_fraction"),
    (GLM, {"partial_rotary_factor": 1.5}, r"rotary_fraction"),
    (GLM, {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}},
     r"partial_rotary_factor=0.5 and rope_parameters.partial_rotary_factor=0.25 disagree"),
    (GLM, {"n_group": 3}, r"router num_groups \(3\) must divide num_experts \(160\); valid: 2, 4, 5, 8"),
    (GLM, {"n_group": 4, "topk_group": 5}, r"group_top_k \(5\) must be in 1..num_groups \(4\)"),
    (GLM, {"n_group": 0}, r"key 'n_group' must be >= 1, got 0"),
    (GLM, {"num_nextn_predict_layers": -1}, r"mtp_layers"),
    (GLM, {"hidden_act": "relu"}, r"hidden_act='relu' is not supported"),
])
def test_bad_values_are_clear_errors(stem: str, change: dict[str, Any], message: str) -> None:
    with pytest.raises(UserInputError, match=message) as info:
        spec_from_hf_config(_config(stem) | change)
    assert "\n" not in str(info.value)


def test_sigmoid_routing_without_renormalization_is_refused_at_emit() -> None:
    m = _spec(AIR, norm_topk_prob=False)
    assert not m.arch.router.norm_top_k
    with pytest.raises(ConfigError, match="sigmoid routing without top-k renormalization"):
        emit(_plan(m, tp=2, ep=8), "megatron")


def test_all_dense_glm_is_a_dense_model() -> None:
    m = _spec(AIR, first_k_dense_replace=46)  # Glm4MoeDecoderLayer: layer_idx >= first_k_dense_replace is MoE
    assert not m.is_moe and m.num_params < _spec(AIR).num_params


# ---- torchtitan --------------------------------------------------------------------------------


@pytest.mark.parametrize("stem", [GLM, AIR, OLMOE])
def test_torchtitan_refuses_models_it_does_not_ship(stem: str) -> None:
    from cost_models.targets.torchtitan_models import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match=r"torchtitan .* does not ship .* \(a mixture-of-experts model\)"):
        emit(_plan(_spec(stem), ep=8, zero_stage=3), "torchtitan")


@pytest.mark.parametrize(("update", "message"), [({"qk_norm": True, "qk_norm_per_head": False}, "whole projection"),
                                                 ({"qkv_clip": 8.0}, "q/k/v clamp 8")])
def test_torchtitan_refuses_attention_facts_its_flavors_lack(update: dict[str, Any], message: str) -> None:
    from cost_models.targets.torchtitan_models import UnsupportedModelError, arch_overrides

    m = load_model("qwen3-235b-a22b")
    m = m.model_copy(update={"arch": m.arch.model_copy(update=update)})
    with pytest.raises(UnsupportedModelError, match=message):
        arch_overrides(m)


# ---- the model megatron-core builds (meta device) ------------------------------------------------


@pytest.mark.consumers
@pytest.mark.slow
@pytest.mark.parametrize("stem", [GLM, AIR, OLMOE])
def test_megatron_builds_the_published_model(stem: str) -> None:
    """megatron-core builds GPTModel from the emitted arguments (autoplan.validate.model_equivalence): parameters,
    the 32 RoPE frequencies of GLM's half-rotated heads, q/k norms, router and MTP equal transformers' model of the same
    file, but for what is announced: OLMoE's q/k norm width (a WARNING) and the load-balancing loss GLM's config does
    not state (Megatron-Bridge's 1e-3; transformers' model has none)."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("transformers")
    from tests.test_model_equivalence import rows_for

    rows = rows_for(str(HF / f"{stem}.json"), HF / f"{stem}.json")
    differ = {r[2]: (r[3], r[4]) for r in rows if r[3] != r[4] and r[2] != "rope_inv_freq" or r[3] == "DIFFERENT"}
    m = _spec(stem)
    if stem == OLMOE:
        assert set(differ) == {"params"}
        assert differ["params"][1] - differ["params"][0] == m.num_layers * (m.q_dim + m.kv_dim - 2 * m.head_dim_resolved)
    else:
        assert set(differ) == {"router"}
        ours, theirs = differ["router"]
        assert {k for k in ours if ours[k] != theirs[k]} == {"aux_coeff"} and theirs["aux_coeff"] is None
        mtp = next(r for r in rows if r[2].startswith("mtp_params"))
        assert mtp[3] == mtp[4] > 0


@pytest.mark.consumers
@pytest.mark.slow
def test_megatron_lm_sets_up_the_emitted_runs(tmp_path: Path) -> None:
    """The emitted torchrun scripts (mock data) through Megatron-LM's parse_args, validate_args, tokenizer and
    core_transformer_config_from_args (``autoplan.validate.megatron_lm``; skips without MEGATRON_LM_PATH)."""
    from autoplan.emit import write_plan
    from autoplan.validate import megatron_lm
    from autoplan.validate.megatron_checks import megatron_lm_case

    if megatron_lm.checkout() is None:
        pytest.skip(megatron_lm.skip_reason())
    plans, cases = [], []
    for stem, gpus, par in ((GLM, 1024, dict(tp=2, pp=4, ep=32)), (AIR, 64, dict(tp=2, ep=8)),
                            (OLMOE, 64, dict(tp=1, ep=8))):
        m = _spec(stem)
        plan = EmitPlan(m, build_cluster("h100-sxm", gpus), JobSpec(global_batch_size=2048, seq_len=4096),
                        ParallelConfig(**par))
        write_plan(plan, "megatron", tmp_path / stem)
        env = {"DATA_ARGS": f"--mock-data --tokenizer-type NullTokenizer --vocab-size {m.vocab_size - 1}",
               "TRAIN_ITERS": "10", "LR": "3e-4", "CHECKPOINT_DIR": str(tmp_path / stem / "ckpt")}
        plans.append(plan)
        cases.append(megatron_lm_case(plan, megatron_lm.launch_argv(tmp_path / stem / "train_megatron_torchrun.sh",
                                                                    env)))
    results = megatron_lm.judge(cases)
    assert all(r["ok"] for r in results), [f"{r['stage']}: {r['error']}" for r in results if not r["ok"]]
    for plan, res in zip(plans, results):
        m, got = plan.model, res["facts"]
        want = {"num_layers": m.num_layers, "hidden_size": m.hidden_size, "padded_vocab_size": m.vocab_size,
                "qk_layernorm": m.arch.qk_norm, "num_moe_experts": m.num_experts, "mtp_num_layers": m.arch.mtp_layers
                or None, "moe_router_score_function": m.arch.router.score_function,
                "moe_router_enable_expert_bias": m.arch.router.expert_bias, "rotary_base": m.arch.rope_theta,
                "num_microbatches": plan.num_microbatches, "rotary_percent": m.arch.rotary_fraction,
                "kv_channels": m.head_dim_resolved, "add_qkv_bias": m.qkv_bias, "untie": not m.tied_embeddings,
                "moe_router_topk_scaling_factor": m.arch.router.top_k_scaling if m.arch.router.top_k_scaling != 1
                else None, "moe_router_pre_softmax": not m.arch.router.norm_top_k,
                "moe_router_dtype": "fp32" if m.arch.router.fp32_logits else None,
                "moe_shared_expert_intermediate_size": m.num_shared_experts * m.expert_ffn_hidden_size or None,
                "moe_layer_freq": [int(m.is_moe_layer(i)) for i in range(m.num_layers)]
                if m.first_dense_layers else 1}
        assert {k: got[k] for k in want} == want, m.name


@pytest.mark.parametrize("stem,change,message", [
    (AIR, {"use_qk_norm": "false"}, "key 'use_qk_norm' must be true or false"),  # "false" is truthy
    (OLMOE, {"norm_topk_prob": "false"}, "key 'norm_topk_prob' must be true or false"),
    (AIR, {"n_routed_experts": 0}, "n_routed_experts is 0, but model_type 'glm4_moe' is a mixture of experts"),
])
def test_the_loader_refuses_what_the_readers_would_misread(tmp_path: Path, stem: str, change: dict[str, Any],
                                                           message: str) -> None:
    """A string boolean read with bool() flipped a fact silently (a GLM-Air file's "use_qk_norm": "false" emitted
    --qk-layernorm); a glm4_moe file without experts was planned as a dense model."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(stem) | change))
    with pytest.raises(UserInputError, match=message):
        load_model(str(path))
