"""The models torchtitan 0.3.0 ships, and what its flavors fix in code: which models the torchtitan target can
build at all (``shipped_model_error``: the emitter and ``validate`` refuse the others, ``estimate`` and the search
price them with a note, ``TorchtitanProfile.model_notes``) and the config overrides that make a flavor the user's model
(``arch_overrides``, for the emitter). ``tests/test_validate_consumers.py`` rebuilds every row of ``SHIPPED`` from
torchtitan itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cost_models.errors import ConfigError
from cost_models.specs import ModelSpec

TORCHTITAN_03 = "0.3.0"


class UnsupportedModelError(ConfigError):
    """The model is not one torchtitan ships (so it has no config to override)."""


@dataclass(frozen=True)
class TitanModel:
    """A flavor torchtitan 0.3.0 ships: its module, flavor, ``config_registry`` function and architecture."""

    module: str  # --module
    flavor: str  # model_registry flavor (also [model] flavor in <= 0.2.x)
    config_fn: str  # config_registry function for this flavor; "" when torchtitan ships only the flavor
    config_precision: Literal["bf16", "fp8"]  # what config_fn trains in
    # architecture fingerprint: layers, hidden, heads, kv heads, ffn, vocab, experts
    dims: tuple[int, int, int, int, int, int, int]
    # the flavor's own architecture facts (models/<module>/__init__.py): RoPE base and scaling, norm eps
    rope_theta: float = 500000.0
    rope_scaling: Literal["none", "llama", "yarn"] = "llama"
    norm_eps: float = 1e-5
    # For a config module: a shipped bf16 config function of the same family to start from (building
    # config_fn itself would construct its float8 converter), and config_fn's settings to keep.
    bf16_base: str = ""
    keep: tuple[tuple[str, str], ...] = ()
    # attention and MLP facts the flavor hard-codes (``attention_facts``): window, every N-th layer full, sinks,
    # activation, GLU offset and clamp, biases on every linear
    attention: tuple[Any, ...] = (None, 0, False, "silu", 0.0, None, False)
    # its parameters as torchtitan builds it (MTP apart): a model with the flavor's dims differs here when it ties or
    # unties the embedding (torchtitan enable_weight_tying), has another head dim, q/k norms, expert width or shared
    # experts
    params: int = 0
    # the router it fixes (MoE; ``router_facts``): top-k, score function, renormalized, scale, groups, groups kept
    router: tuple[Any, ...] | None = None
    # the attention kernel its model_registry builds (models/<module>/__init__.py ``attn_backend`` default, which the
    # config functions autoplan emits keep; models/common/config_utils.py get_attention_config): FlexAttention or
    # varlen FlashAttention, each masking per document (tests/test_flex_attention.py builds every entry's config)
    attn_backend: Literal["flex", "varlen"] = "flex"


# The inner-attention module each ``attn_backend`` builds (models/common/attention.py; config_utils.py
# get_attention_config): what validate and the tests read back from the built config.
ATTENTION_MODULE = {"flex": "FlexAttention", "varlen": "VarlenAttention"}


def attention_facts(m: ModelSpec) -> tuple[Any, ...]:
    """What a torchtitan flavor fixes in code and no config field changes (compared with ``TitanModel.attention``)."""
    a = m.arch
    return (a.sliding_window, a.full_attention_every, a.attention_sinks, a.activation, a.glu_linear_offset,
            a.activation_clamp, m.linear_bias or m.qkv_bias)


def router_facts(m: ModelSpec) -> tuple[Any, ...] | None:
    """What a torchtitan MoE flavor's router fixes (``TitanModel.router``); None for a dense model."""
    r = m.arch.router
    return (m.moe_top_k, r.score_function, r.norm_top_k, r.top_k_scaling, r.num_groups, r.group_top_k) \
        if m.is_moe else None


ATTENTION_FACTS = ("sliding_window", "full_attention_every", "attention_sinks", "activation", "glu_linear_offset",
                   "activation_clamp", "biases")
# torchtitan/models/gpt_oss/__init__.py: a 128-token window on even layers (_build_gptoss_layers), sinks and biases on
# every linear and the router, the experts' swiglu (alpha 1.702, limit 7.0, +1 on the linear half: moe.py:67-73)
GPT_OSS_ATTENTION = (128, 2, True, "quick_gelu", 1.0, 7.0, True)


Dims = tuple[int, int, int, int, int, int, int]
QWEN3_ROUTER = (8, "softmax", True, 1.0, 0, 0)  # torchtitan qwen3 MoE flavors: softmax, top 8, renormalized


def _gpt_oss(flavor: str, fn: str, dims: Dims, params: int) -> TitanModel:
    return TitanModel("gpt_oss", flavor, fn, "bf16", dims, 150000.0, "yarn", 1e-5, attention=GPT_OSS_ATTENTION,
                      params=params, router=(4, "softmax", True, 1.0, 0, 0), attn_backend="varlen")


def _qwen3(flavor: str, fn: str, dims: Dims, params: int, theta: float = 1e6, base: str = "",
           router: tuple[Any, ...] | None = None) -> TitanModel:
    return TitanModel("qwen3", flavor, fn, "bf16", dims, theta, "none", 1e-6, bf16_base=base, params=params,
                      router=router)


def _dsv3(flavor: str, fn: str, dims: Dims, params: int, router: tuple[Any, ...], base: str = "") -> TitanModel:
    return TitanModel("deepseek_v3", flavor, fn, "bf16", dims, 10000.0, "yarn", 1e-5, bf16_base=base, params=params,
                      router=router)


# Every non-debug flavor torchtitan 0.3.0 ships for the decoder families autoplan plans (tests/test_torchtitan_
# flavors.py rebuilds each from torchtitan and checks the row). Llama 3 flavors are Llama 3.1/3.2: llama RoPE
# scaling (factor 8 over 8192 tokens) is part of every one of them.
SHIPPED: tuple[TitanModel, ...] = (
    TitanModel("llama3", "1B", "", "bf16", (16, 2048, 32, 8, 8192, 128256, 0), bf16_base="llama3_8b",
               params=1235814400),
    TitanModel("llama3", "3B", "", "bf16", (28, 3072, 24, 8, 8192, 128256, 0), bf16_base="llama3_8b",
               params=3212749824),
    TitanModel("llama3", "8B", "llama3_8b", "bf16", (32, 4096, 32, 8, 14336, 128256, 0), params=8030261248),
    TitanModel("llama3", "70B", "llama3_70b", "bf16", (80, 8192, 64, 8, 28672, 128256, 0), params=70553706496),
    TitanModel("llama3", "405B", "llama3_405b", "fp8", (126, 16384, 128, 8, 53248, 128256, 0),
               bf16_base="llama3_70b", params=405853388800,
               keep=(("hf_assets_path", "'./assets/hf/Llama-3.1-405B'"),
                     ("optimizer", "default_adamw(lr=8e-5)"),
                     ("lr_scheduler", "LRSchedulersContainer.Config(warmup_steps=600)"),
                     ("training.local_batch_size", "2"), ("training.steps", "3000"),
                     ("compile", "CompileConfig(enable=True, enable_async_tensor_parallel=True)"))),
    _qwen3("0.6B", "qwen3_0_6b", (28, 1024, 16, 8, 3072, 151936, 0), 596049920),
    _qwen3("1.7B", "qwen3_1_7b", (28, 2048, 16, 8, 6144, 151936, 0), 1720574976),
    _qwen3("4B", "", (36, 2560, 32, 8, 9728, 151936, 0), 4022468096, base="qwen3_14b"),
    _qwen3("8B", "", (36, 4096, 32, 8, 12288, 151936, 0), 8190735360, base="qwen3_14b"),
    _qwen3("14B", "qwen3_14b", (40, 5120, 40, 8, 17408, 151936, 0), 14768307200),
    _qwen3("32B", "qwen3_32b", (64, 5120, 64, 8, 25600, 151936, 0), 32762123264),
    _qwen3("30B-A3B", "qwen3_30b_a3b", (48, 2048, 32, 4, 6144, 151936, 128), 30532122624, router=QWEN3_ROUTER),
    # torchtitan 0.3.0 ships 235B-A22B without a config function and with RoPE base 5e6 (Qwen's config.json: 1e6)
    TitanModel("qwen3", "235B-A22B", "", "bf16", (94, 4096, 64, 4, 12288, 151936, 128), 5e6, "none", 1e-6,
               bf16_base="qwen3_30b_a3b", keep=(("hf_assets_path", "'./assets/hf/Qwen3-235B-A22B'"),),
               params=235093634560, router=QWEN3_ROUTER),
    _dsv3("16B", "deepseek_v3_16b", (27, 2048, 16, 16, 10944, 102400, 64), 15706484224,
          (6, "softmax", False, 1.0, 0, 0)),
    _dsv3("236B", "", (60, 5120, 128, 128, 12288, 102400, 160), 235741434880, (6, "softmax", False, 16.0, 8, 3),
          base="deepseek_v3_16b"),
    _dsv3("671B", "deepseek_v3_671b", (61, 7168, 128, 128, 18432, 129280, 256), 671026404352,
          (8, "sigmoid", True, 2.5, 8, 4)),
    _gpt_oss("20b", "gpt_oss_20b", (24, 2880, 64, 8, 2880, 201088, 32), 20914757184),
    _gpt_oss("120b", "gpt_oss_120b", (36, 2880, 64, 8, 2880, 201088, 128), 116829156672),
)


# Gated DeltaNet models (``ModelSpec.gdn``): torchtitan 0.3.0 has no Qwen3-Next module (torchtitan/models: llama3,
# qwen3, qwen3_5, deepseek_v3, gpt_oss, kimi_k2_7, flux, muse_glimmer), and its one Gated DeltaNet model, models/qwen3_5,
# is Qwen3.5's vision-language model, not the text decoder autoplan plans and prices (``autoplan.catalog.hf._qwen3_5``:
# Qwen3_5ForCausalLM). Its text decoders have the published dims (the 9B flavor's decoder has the 8,953,803,264
# parameters autoplan counts for Qwen3_5TextConfig's defaults), but no config trains the decoder alone: the vision
# tower cannot be left out and the forward needs the multimodal collator's batches. Each row: (file under
# torchtitan/ of the 0.3.0 wheel, line, what the line says, text on that line); tests/test_torchtitan_qwen3_5.py
# checks every line in the installed wheel and each claim on the real model (meta device, fla-core installed).
QWEN3_5_TEXT_BLOCKERS: tuple[tuple[str, int, str, str], ...] = (
    ("models/qwen3_5/model.py", 692, "the vision encoder is a required Qwen35Model.Config field",
     "vision_encoder: Qwen35VisionEncoder.Config"),
    ("models/qwen3_5/model.py", 752, "the model builds it unconditionally",
     "self.vision_encoder = config.vision_encoder.build()"),
    ("models/qwen3_5/model.py", 873, "the forward reads the batch's special_tokens['image_id'] on every text batch",
     'image_token_id = special_tokens["image_id"]'),
    ("hf_datasets/multimodal/mm_collator.py", 361, "which only the multimodal collator supplies",
     '"special_tokens": {'),
    ("hf_datasets/multimodal/mm_datasets.py", 270, "over image-text data sets (obelics, cc12m)",
     "MM_DATASETS = {"),
)
# What torchtitan 0.3.0 would further hold a Qwen3.5 plan to, were the decoder trainable alone (not checked by the
# profile, since nothing is emitted; the test checks the lines): flavors fix every dim in code, model_registry takes a
# flavor name, attention backend, MoE comm backend and converters only; the 0.8B / 2B / 4B flavors untie the embedding
# the published configs tie; context parallelism raises NotImplementedError; tp must divide the GDN key and value
# heads; the GDN kernel is fla's chunk_gated_delta_rule (fla-core).
QWEN3_5_LIMITS: tuple[tuple[str, int, str, str], ...] = (
    ("models/qwen3_5/__init__.py", 1109, "flavors fixed in code", "config = qwen3_5_configs[flavor](**kwargs)"),
    ("models/qwen3_5/__init__.py", 606, "0.8B unties the embedding", "NOTE: HF config has tie_word_embeddings=true."),
    ("models/qwen3_5/parallelize.py", 63, "no context parallelism", "Context Parallel is not yet supported for Qwen3.5"),
    ("models/qwen3_5/model.py", 718, "tp divides the GDN key and value heads",
     "if n_key_heads % tp != 0 or n_value_heads % tp != 0:"),
    ("models/qwen3_5/model.py", 16, "fla's GDN kernels", "from fla.ops.gated_delta_rule import ("),
)


def qwen3_5_refusal() -> str:
    """Why the torchtitan target runs no Gated DeltaNet model (``TorchtitanProfile.gdn_refusal``), each step cited."""
    why = ", ".join(f"{what} (torchtitan/{path}:{line})" for path, line, what, _ in QWEN3_5_TEXT_BLOCKERS)
    return (f"torchtitan {TORCHTITAN_03} ships no Qwen3-Next model, and its one Gated DeltaNet model, models/qwen3_5, "
            f"trains Qwen3.5's vision-language model, not the text decoder autoplan plans: {why}")


def fingerprint(m: ModelSpec) -> tuple[int, int, int, int, int, int, int]:
    return (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size, m.vocab_size,
            m.num_experts)


def titan_model(m: ModelSpec) -> TitanModel:
    """The torchtitan flavor with ``m``'s shapes, or ``UnsupportedModelError`` saying what ships. Facts that
    differ without changing shapes (RoPE, norm eps, MTP) are set by the emitted config module (``arch_overrides``)."""
    for t in SHIPPED:
        if t.dims == fingerprint(m):
            return t
    ships = ", ".join(f"{t.module} {t.flavor}" for t in SHIPPED)
    kind = " (a mixture-of-experts model)" if m.is_moe else ""
    raise UnsupportedModelError(
        f"torchtitan {TORCHTITAN_03} does not ship {m.name}{kind}: autoplan emits torchtitan configs for "
        f"the models it ships ({ships}), matched by architecture",
        advice="use another --target, or register the model with torchtitan (a model package with a config_registry) "
               "first")


def arch_overrides(m: ModelSpec) -> dict[str, Any]:
    """Where the flavor's architecture differs from the model the user asked for: RoPE base (``theta``), RoPE
    scaling (``scaling``), norm epsilon (``eps``), MTP depth (``num_mtp_layers``, DeepSeek). Raises
    ``UnsupportedModelError`` for a difference torchtitan's config cannot express here; it names no other target:
    ``emit``'s refusal adds the ones that take the plan (``autoplan.emit.plan.emittable_targets``), which Megatron-LM
    is not for every model (e.g. ALiBi, a non-gated SiLU: ``megatron.model_flags_error``)."""
    t, arch, out = titan_model(m), m.arch, {}
    differ = [f"{k} {ours!r} (torchtitan: {theirs!r})" for k, ours, theirs in
              zip(ATTENTION_FACTS, attention_facts(m), t.attention) if ours != theirs]
    if not arch.qk_norm_per_head and arch.qk_norm:
        differ.append("q/k norm over the whole projection (torchtitan: per head or none)")
    if arch.qkv_clip is not None:
        differ.append(f"q/k/v clamp {arch.qkv_clip:g} (torchtitan: none)")
    # every shipped flavor: RMSNorm weights scaling as they are, RoPE on the whole head, a gated MLP
    if m.norm != "rmsnorm" or arch.norm_zero_centered_gamma:
        differ.append(f"{'zero-centered ' if arch.norm_zero_centered_gamma else ''}{m.norm} (torchtitan: rmsnorm)")
    if arch.rotary_fraction != 1.0:
        differ.append(f"RoPE on {arch.rotary_fraction:g} of each head (torchtitan: all of it)")
    if not m.gated_mlp:
        differ.append(f"a non-gated {arch.activation} MLP (torchtitan: gated)")
    if m.num_params != t.params:  # the flavor's dims matched: tying, head dim, q/k norms or expert widths differ
        differ.append(f"{m.num_params:,} parameters (torchtitan: {t.params:,}; tied embeddings "
                      f"{m.tied_embeddings}, head dim {m.head_dim_resolved}, q/k norm {arch.qk_norm})")
    if router_facts(m) != t.router:
        differ.append(f"router (top-k, score, renormalized, scale, groups, kept) {router_facts(m)} "
                      f"(torchtitan: {t.router})")
    if arch.hidden_dropout or arch.attention_dropout:  # no dropout module in any torchtitan model
        differ.append(f"dropout {arch.hidden_dropout:g} / attention {arch.attention_dropout:g} (torchtitan: none)")
    if arch.no_position_encoding or arch.alibi or m.learned_position_embeddings:
        differ.append("positions other than RoPE (torchtitan: RoPE)")
    # Llama 4's facts: no shipped flavor has them (attention.py / moe.py @ 0.3.0: RoPE on every layer, causal
    # attention over the whole sequence, no q/k L2 norm or temperature, router weights on the experts' output)
    if arch.no_rope_every:
        differ.append(f"no RoPE on every {arch.no_rope_every}th layer (torchtitan: RoPE on every layer)")
    if arch.qk_l2_norm:
        differ.append("a weightless q/k L2 norm (torchtitan: none)")
    if arch.attention_chunk is not None:
        differ.append(f"chunked attention of {arch.attention_chunk} tokens (torchtitan: causal over the sequence)")
    if arch.attn_temperature is not None:
        differ.append("attention temperature tuning (torchtitan: none)")
    if m.is_moe and arch.router.probs_on_input:
        differ.append("router weights on the expert input (torchtitan: on the expert output)")
    if differ:
        raise UnsupportedModelError(f"{m.name} differs from torchtitan {t.module} {t.flavor} in what its code fixes: "
                                    f"{', '.join(differ)}", advice="use another --target")
    if arch.rope_theta != t.rope_theta:
        out["theta"] = arch.rope_theta
    rs_type = arch.rope_scaling.type if arch.rope_scaling else None
    if arch.rope_scaling is not None and rs_type == "linear":
        raise UnsupportedModelError(f"{m.name}: linear RoPE scaling (factor {arch.rope_scaling.factor:g}: positions "
                                    "/ factor) has no torchtitan 0.3.0 config: RoPE.Config.scaling is 'none', 'llama' "
                                    "or 'yarn' (torchtitan/models/common/rope.py:98)")
    # dynamic NTK is plain RoPE up to its length (the emitter refuses a longer seq_len: common.dynamic_rope_error)
    want = {None: "none", "dynamic": "none", "llama3": "llama", "yarn": "yarn"}[rs_type]
    if want != t.rope_scaling:
        if want != "none":
            raise UnsupportedModelError(f"{m.name}: RoPE scaling '{want}' differs from torchtitan {t.module} "
                                        f"{t.flavor}'s '{t.rope_scaling}'; autoplan only removes a flavor's scaling")
        out["scaling"] = "none"
    elif want == "yarn" and t.module == "gpt_oss" and arch.rope_scaling is not None:
        rs = arch.rope_scaling  # torchtitan gpt_oss flavors: CosSinRoPE yarn 32, beta 32/1, 4096, truncate False
        if (rs.factor, rs.beta_fast, rs.beta_slow, rs.original_max_position_embeddings, rs.truncate, rs.mscale,
                rs.mscale_all_dim) != (32, 32, 1, 4096, False, 1.0, 0.0):
            raise UnsupportedModelError(f"{m.name}: YaRN {rs} differs from torchtitan gpt_oss's (32, 32, 1, 4096, "
                                        "truncate False)")
    elif want == "llama" and arch.rope_scaling is not None:
        rs = arch.rope_scaling  # torchtitan's llama scaling defaults (RoPE.Config): 8, 1, 4, 8192
        if (rs.factor, rs.low_freq_factor, rs.high_freq_factor, rs.original_max_position_embeddings) != (8, 1, 4, 8192):
            raise UnsupportedModelError(f"{m.name}: llama RoPE scaling {rs} differs from torchtitan's (8, 1, 4, 8192)")
    if arch.norm_eps != t.norm_eps:
        out["eps"] = arch.norm_eps
    if arch.mtp_layers:
        if t.module != "deepseek_v3":
            raise UnsupportedModelError(f"{m.name}: torchtitan {t.module} has no multi-token prediction")
        if arch.mtp_repeated and arch.mtp_layers > 1:  # models/deepseek_v3/__init__.py:291-300 (_build_mtp_layers)
            raise UnsupportedModelError(f"{m.name}: one MTP module's weights at each of its {arch.mtp_layers} depths "
                                        "(mtp_repeated); torchtitan deepseek_v3 builds a module per depth, each with "
                                        "weights of its own", advice="use another --target")
        out["num_mtp_layers"] = arch.mtp_layers
    return out


def shipped_model_error(m: ModelSpec) -> ConfigError | None:
    """Why torchtitan 0.3.0 cannot train ``m`` as the user gave it (no flavor with its shapes, or a fact the flavor
    fixes in code and no config changes: ``titan_model``, ``arch_overrides``); None: it can."""
    try:
        arch_overrides(m)
    except UnsupportedModelError as err:
        return err
    return None
