"""GPT-OSS end to end: the HF reader, the parameter counts of OpenAI's model card, the per-layer window in the cost
model (recomputed by hand), and the arguments the emitters write (checked by megatron-core and torchtitan code)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.catalog.hf import HFConfigWarning, spec_from_hf_config
from autoplan.emit import emit
from autoplan.emit.plan import EmitPlan
from autoplan.errors import ConfigError, UserInputError
from cost_models.layer_cost import layer_cost
from cost_models.opgraph import layer_graph
from cost_models.specs import JobSpec, ParallelConfig

HF = Path(__file__).parent / "data" / "hf"


def _config(name: str) -> dict[str, Any]:
    return json.loads((HF / f"{name}.json").read_text())


def _arch(m, **update):  # type: ignore[no-untyped-def]
    return m.model_copy(update={"arch": m.arch.model_copy(update=update)})


def test_reader_reads_every_fact_of_the_published_config() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFConfigWarning)  # no key of the published file left unread
        m = spec_from_hf_config(_config("gpt-oss-120b"), name="gpt-oss-120b")
    a = m.arch
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (36, 2880, 64, 8, 64)
    assert (m.num_experts, m.moe_top_k, m.expert_ffn_hidden_size, m.num_moe_layers) == (128, 4, 2880, 36)
    assert (m.vocab_size, m.tied_embeddings, m.linear_bias, m.gated_mlp) == (201088, False, True, True)
    assert (a.sliding_window, a.full_attention_every, a.attention_sinks) == (128, 2, True)
    assert [a.layer_window(i) for i in range(4)] == [128, None, 128, None]  # layer_types: sliding, full, ...
    assert (a.activation, a.glu_linear_offset, a.activation_clamp) == ("quick_gelu", 1.0, 7.0)
    rs = a.rope_scaling
    assert a.rope_theta == 150000.0 and rs is not None
    assert (rs.type, rs.factor, rs.original_max_position_embeddings, rs.beta_fast, rs.beta_slow, rs.truncate) == \
        ("yarn", 32.0, 4096, 32.0, 1.0, False)
    assert (a.router.score_function, a.router.norm_top_k, a.router.aux_loss_coeff) == ("softmax", True, 0.9)


# OpenAI's model card (arXiv:2508.10925, Table 1), in billions: MLP, attention, embed + unembed, active, total.
# "Active" counts the unembedding and not the embedding.
MODEL_CARD = {"gpt-oss-120b": (114.71, 0.96, 1.16, 5.13, 116.83), "gpt-oss-20b": (19.12, 0.64, 1.16, 3.61, 20.91)}


@pytest.mark.parametrize("name", sorted(MODEL_CARD))
def test_parameter_counts_match_the_model_card(name: str) -> None:
    m = load_model(name)
    norms = m.norm_params_per_layer
    mlp = sum(m.layer_params(i) - m.attention_params - norms for i in range(m.num_layers))
    attention = m.num_layers * m.attention_params  # q/k/v/o with biases and the 64 sinks
    embed = m.embedding_params + m.vocab_size * m.hidden_size
    active = m.num_active_params - m.embedding_params
    got = (mlp, attention, embed, active, m.num_params)
    # the card rounds to 10M; the ~0.2M of RMSNorm weights sit in the total only
    assert [round(x / 1e9, 2) for x in got] == list(MODEL_CARD[name])
    assert load_model(str(HF / f"{name}.json")).model_dump(exclude={"name"}) == m.model_dump(exclude={"name"})


def test_biases_and_sinks_are_counted_once_each() -> None:
    m = load_model("gpt-oss-20b")
    h, a, g, d, e, f = 2880, 64, 8, 64, 32, 2880
    attention = h * (a * d + 2 * g * d) + (a * d + 2 * g * d) + a * d * h + h + a  # weights, q/k/v/o biases, sinks
    expert = h * 2 * f + 2 * f + f * h + h  # gate_up (+ bias), down (+ bias)
    router = h * e + e
    assert m.attention_params == attention and m.expert_params == expert and m.router_params == router
    assert layer_graph(m, "moe", 4096).params == attention + 2 * h + router + e * expert  # the op graph agrees


@pytest.mark.parametrize(("change", "message"), [
    ({"layer_types": ["sliding_attention", "sliding_attention", "full_attention", "full_attention"] * 6},
     r"layer_types=.*every N-th layer"),
    ({"experts_per_token": 2}, r"experts_per_token=2 and num_experts_per_tok=4 disagree"),
    ({"initial_context_length": 8192},
     r"initial_context_length=8192 and rope_scaling.original_max_position_embeddings=4096 disagree"),
    ({"attention_bias": False}, r"attention_bias=False .*only true"),
    ({"swiglu_alpha": 1.5}, r"swiglu_alpha=1.5 .*only 1.702"),
    ({"sliding_window": 0}, r"sliding_window=0"),
])
def test_what_the_reader_cannot_represent_is_an_error(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        spec_from_hf_config(_config("gpt-oss-20b") | change)


def test_layer_type_patterns() -> None:
    base = _config("gpt-oss-20b")
    no_types = spec_from_hf_config({k: v for k, v in base.items() if k != "layer_types"})
    assert no_types.arch.full_attention_every == 2  # GptOssConfig's default: even layers slide
    every_third = spec_from_hf_config(base | {"layer_types": ["sliding_attention"] * 2 + ["full_attention"]} |
                                      {"layer_types": (["sliding_attention"] * 2 + ["full_attention"]) * 8})
    assert [every_third.arch.layer_window(i) is None for i in range(6)] == [False, False, True] * 2
    all_full = spec_from_hf_config(base | {"layer_types": ["full_attention"] * 24})
    assert (all_full.arch.sliding_window, all_full.arch.full_attention_every) == (None, 0)
    all_window = spec_from_hf_config(base | {"layer_types": ["sliding_attention"] * 24})
    assert (all_window.arch.sliding_window, all_window.arch.full_attention_every) == (128, 0)


@pytest.mark.parametrize("seq", [4096, 8192, 131072])
def test_window_layers_priced_by_their_window(seq: int) -> None:
    """By hand: a causal full layer sees s/2 keys per query; a 128-token window W − W²/(2s) (Mistral 7B §2, the
    continuous mean of min(i, W)). GPT-OSS alternates them, so each MoE layer is priced at their mean."""
    m = load_model("gpt-oss-120b")
    w, a, d = 128, 64, 64
    keys = ((w - w * w / (2 * seq)) + seq / 2) / 2
    core = layer_graph(m, "moe", seq).op("attn_core").flops_per_token
    assert core == pytest.approx(2 * a * (d + d) * keys, rel=1e-12)
    if seq == 4096:
        assert core == 2 * 64 * 128 * 1087  # (126 + 2048) / 2 keys
    full = layer_graph(_arch(m, sliding_window=None, full_attention_every=0), "moe", seq).op("attn_core")
    every = layer_graph(_arch(m, full_attention_every=0), "moe", seq).op("attn_core")  # a window on every layer
    assert core == pytest.approx((full.flops_per_token + every.flops_per_token) / 2, rel=1e-12)


@pytest.mark.parametrize("gpu", ["b200", "h100-sxm"])
def test_attention_time_is_the_mean_of_the_two_layer_kinds(gpu: str) -> None:
    """The kernel's time is linear in the keys per query (x · (x + half)/x, ``attention_kernel_factor``), so pricing
    every layer at the mean keys gives the mean time of a windowed and a full layer exactly."""
    m = load_model("gpt-oss-120b")
    cluster, job, par = build_cluster(gpu, 8), JobSpec(global_batch_size=8, seq_len=8192), ParallelConfig(ep=8)
    full_m, window_m = _arch(m, sliding_window=None, full_attention_every=0), _arch(m, full_attention_every=0)
    t = {k: layer_cost(layer_graph(x, "moe", 8192), x, cluster, job, par, 1).attention_s
         for k, x in (("mixed", m), ("full", full_m), ("window", window_m))}
    assert t["window"] < t["mixed"] < t["full"]
    assert t["mixed"] == pytest.approx((t["full"] + t["window"]) / 2, rel=1e-9)


def test_single_window_families_unchanged() -> None:
    m = load_model("mistral-7b")
    assert m.arch.full_attention_every == 0 and all(m.arch.layer_window(i) == 4096 for i in range(m.num_layers))
    core = layer_graph(m, "dense", 32768).op("attn_core").flops_per_token
    assert core == 2 * 32 * 256 * (4096 - 4096**2 / 65536)


def _plan(name: str = "gpt-oss-120b", **par: int) -> EmitPlan:
    return EmitPlan(load_model(name), build_cluster("h100-sxm", 64), JobSpec(global_batch_size=512, seq_len=4096),
                    ParallelConfig(**(par or {"ep": 8})))


def test_megatron_arguments_build_gpt_oss_in_megatron_core() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.utils import is_layer_window_attention

    from autoplan.emit.megatron import megatron_args, parse_megatron_args
    from autoplan.validate.megatron_checks import transformer_config_kwargs
    from autoplan.validate.megatron_lm import stand_in_te_version

    stand_in_te_version()  # what the validate path does first: no Transformer Engine on this CPU machine
    plan = _plan()
    args = megatron_args(plan)
    text = " ".join(args)
    for flag in ("--quick-geglu", "--glu-linear-offset 1.0", "--activation-func-clamp-value 7.0",
                 "--window-size (127,0)", "--window-attn-skip-freq 2", "--softmax-type learnable",
                 "--num-experts 128", "--moe-router-topk 4"):
        assert flag in text, flag
    assert "--disable-bias-linear" not in args and "--swiglu" not in args
    mla, kw = transformer_config_kwargs(parse_megatron_args(args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = TransformerConfig(**kw)  # megatron-core's own checks (quick_gelu + GLU offset + clamp, window freq)
    assert not mla and cfg.add_bias_linear and cfg.gated_linear_unit and cfg.activation_func.__name__ == "quick_gelu"
    assert (cfg.glu_linear_offset, cfg.activation_func_clamp_value, cfg.softmax_type) == (1.0, 7.0, "learnable")
    windows = [128 if is_layer_window_attention(cfg.window_size, cfg.window_attn_skip_freq, i + 1) else None
               for i in range(cfg.num_layers)]
    assert windows == [plan.model.arch.layer_window(i) for i in range(36)]


def test_megatron_says_what_it_cannot_build() -> None:
    notes = emit(_plan(), "megatron").notes
    yarn = [n for n in notes if "YaRN" in n]
    assert len(yarn) == 1 and yarn[0].startswith("WARNING") and "plain RoPE (base 150000)" in yarn[0]
    notes = emit(_plan("llama3.1-8b", tp=1), "megatron").notes
    assert not any("YaRN" in n for n in notes)
    # a GLU offset or clamp without quick-GELU has no megatron-core switch (its TransformerConfig refuses the first)
    for update in ({"activation": "silu"}, {"activation": "silu", "glu_linear_offset": 0.0}):
        m = _arch(load_model("gpt-oss-20b"), **update)
        with pytest.raises(ConfigError, match="quick_gelu"):
            emit(EmitPlan(m, build_cluster("h100-sxm", 64), JobSpec(global_batch_size=512, seq_len=4096),
                          ParallelConfig(ep=8)), "megatron")


def test_torchtitan_maps_gpt_oss_to_its_shipped_flavor() -> None:
    from autoplan.emit.torchtitan import needs_config_module, titan_model
    from cost_models.targets.torchtitan_models import UnsupportedModelError

    plan = _plan(ep=8, zero_stage=3)  # torchtitan cuts EP from the FSDP ranks
    t = titan_model(plan.model)
    assert (t.module, t.flavor, t.config_fn) == ("gpt_oss", "120b", "gpt_oss_120b") and not needs_config_module(plan)
    out = emit(plan, "torchtitan")
    overrides = " ".join(out.files["torchtitan_overrides.txt"].split())
    assert "--module gpt_oss --config gpt_oss_120b" in overrides
    assert "--training.disable_cuda_graphs" in overrides  # EP over the all-to-all dispatcher (trainer.py:179-208)
    assert any("not trained" in n for n in out.notes)  # the 0.9 aux loss torchtitan has no place for
    for update, fact in (({"sliding_window": 256}, "sliding_window"), ({"attention_sinks": False}, "attention_sinks"),
                         ({"activation_clamp": 10.0}, "activation_clamp")):
        with pytest.raises(UnsupportedModelError, match=fact):
            emit(EmitPlan(_arch(plan.model, **update), plan.cluster, plan.job, plan.parallel), "torchtitan")


def test_estimate_and_search_run_on_gpt_oss() -> None:
    from cost_models.estimate import estimate

    m = load_model("gpt-oss-120b")
    pred = estimate(m, build_cluster("b200", 64), JobSpec(global_batch_size=512, seq_len=4096),
                    ParallelConfig(ep=8), target="megatron")
    assert pred.fits and pred.step_time_s > 0
