"""The world model's inputs: model, hardware, cluster, job and parallel configuration.

Frozen pydantic models with ``extra="forbid"``; every unit lives in the field name
(``hbm_gib``, ``nic_gbps``, ``link_gbytes_per_s``). Cross-field checks raise ``ValueError``
naming every value involved (the Megatron convention: "num_attention_heads (64) must be a
multiple of tensor_model_parallel_size (3)").

Vocabulary: *axis* is a mesh axis, *dim* a tensor dimension. Degrees follow Megatron:
``dp = gpus / (tp * pp * cp)``; routed experts run with expert-TP 1 and the expert layers re-cut the ``tp * cp * dp``
ranks of a stage as ``ep × edp`` (Megatron-Core MoE parallel folding: ``ep`` may span TP ranks; edp = tp*cp*dp/ep).
"""

from __future__ import annotations

import difflib
import math
from functools import cached_property
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cost_models.errors import divisors, repeated_error

Precision = Literal["bf16", "fp8", "nvfp4"]
Recompute = Literal["none", "selective", "full"]
# Megatron-Core's selective-recompute modules, in its order (megatron/core/transformer/transformer_config.py:1198-1206;
# what each one recomputes and stops saving: cost_models.recompute).
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                                      "shared_experts")
_RECOMPUTE_SET = frozenset(RECOMPUTE_MODULES)
MoeDispatcher = Literal["alltoall", "deepep", "hybridep"]  # cost_models.moe prices each
Schedule = Literal["1f1b", "interleaved", "zb-h1", "dualpipe"]
Generation = Literal["volta", "ampere", "hopper", "blackwell", "cdna3", "cdna4"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MLASpec(_Frozen):
    """DeepSeek multi-head latent attention (DeepSeek-V2 §2.1). Parameters and FLOPs are exact;
    for sharding and activations MLA is approximated as MHA with ``num_kv_heads = num_attention_heads``
    and head dims ``qk_nope_head_dim + qk_rope_head_dim`` (scores) and ``v_head_dim`` (values)."""

    q_lora_rank: int = Field(ge=0, description="query down-projection rank; 0 = no query LoRA")
    kv_lora_rank: int = Field(gt=0, description="compressed KV latent dimension")
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)


class DSASpec(_Frozen):
    """DeepSeek sparse attention (DSA: DeepSeek-V3.2-Exp tech report, github.com/deepseek-ai/DeepSeek-V3.2-Exp
    DeepSeek_V3_2.pdf §2.1; GLM-5) over MLA: a lightning indexer scores every causal key of each query,
    ``I_t,s = Σ_j w_t,j · ReLU(q_t,j · k_s)`` over ``index_heads`` heads of ``index_head_dim``, and the MLA core
    attends to the ``index_topk`` best keys only. The indexer's weights (megatron-core 0.16.1
    experimental_attention_variant/dsa.py:410-453, transformers 5.24.0 DeepseekV32Indexer): ``wq_b`` q_lora_rank ->
    heads·head_dim, ``wk`` h -> head_dim, ``k_norm`` a LayerNorm (weight and bias) over head_dim, ``weights_proj``
    h -> heads; no biases. Its training loss is the KL divergence of the indexer's distribution to the summed dense
    attention distribution (dsa.py:161-252), scaled by ``indexer_loss_coeff``."""

    index_heads: int = Field(gt=0, description="indexer heads H_I (HF index_n_heads; Megatron dsa_indexer_n_heads)")
    index_head_dim: int = Field(gt=0, description="indexer head dim D_I (HF index_head_dim)")
    index_topk: int = Field(gt=0, description="keys each query's core attention reads (HF index_topk)")
    indexer_loss_coeff: float = Field(
        default=0.01, ge=0, description="the KL loss's coefficient (Megatron dsa_indexer_loss_coeff; a training "
        "setting no HF config states: 0.01 as Megatron-LM's DSA functional test trains, tests/functional_tests/"
        "test_cases/gpt/gpt3_mcore_te_tp2_pp2_dsa/model_config.yaml @ d98e8a64dd)")
    sparse_loss: bool = Field(default=False, description="KL over the top-k keys only (the report's sparse stage; "
                              "Megatron dsa_indexer_use_sparse_loss) instead of over all causal keys")
    shared_every: int = Field(default=1, gt=0, description="GLM-5 index sharing: layer i runs its own indexer iff "
                              "max(i - shared_offset + 1, 0) % shared_every == 0, the others reuse the previous "
                              "indexer layer's top-k (transformers GlmMoeDsaConfig index_topk_freq); 1 = every layer")
    shared_offset: int = Field(default=2, ge=0, description="GlmMoeDsaConfig index_skip_topk_offset")

    def params(self, hidden: int, q_lora_rank: int) -> int:
        """One indexer's weights (dsa.py:410-453): wq_b, wk, k_norm (LayerNorm: weight + bias), weights_proj."""
        hi, di = self.index_heads, self.index_head_dim
        return q_lora_rank * hi * di + hidden * di + 2 * di + hidden * hi

    def runs_indexer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) has its own indexer (GlmMoeDsaConfig.__post_init__'s
        ``indexer_types``, configuration_glm_moe_dsa.py @ transformers 5.24.0)."""
        return max(layer - self.shared_offset + 1, 0) % self.shared_every == 0


class RopeScaling(_Frozen):
    """RoPE frequency scaling for long context, as HF ``rope_scaling`` states it.

    ``llama3`` (Llama 3.1): frequencies below ``original_max_position_embeddings / low_freq_factor`` wavelength
    are divided by ``factor``, above ``.../high_freq_factor`` kept, smooth in between.
    ``yarn`` (DeepSeek-V3; Peng et al. 2023, arXiv:2309.00071): NTK-by-parts ramp between ``beta_fast`` and
    ``beta_slow`` rotations; attention logits scaled by ``mscale(factor, mscale)/mscale(factor, mscale_all_dim)``
    with ``mscale(s, m) = 0.1 m ln s + 1`` (MLA squares the ``mscale_all_dim`` term into its softmax scale).
    ``linear`` (position interpolation): every frequency divided by ``factor``, i.e. positions / factor
    (transformers ``_compute_linear_scaling_rope_parameters``, modeling_rope_utils.py:190 @ 5.24.0).
    ``dynamic`` (dynamic NTK): RoPE unchanged while a sequence is at most ``max_position_embeddings`` long; beyond
    it the base grows with the length (``dynamic_rope_update``, modeling_rope_utils.py:101 and 329-341 @ 5.24.0).
    All four change no FLOPs, bytes or memory beyond YaRN's ``attention_factor``."""

    type: Literal["llama3", "yarn", "linear", "dynamic"]
    factor: float = Field(ge=1, description="transformers' validation asks >= 1 (modeling_rope_utils.py:943)")
    original_max_position_embeddings: int | None = Field(
        default=None, gt=0, description="llama3 / yarn (required): context the base model was trained at")
    max_position_embeddings: int | None = Field(
        default=None, gt=0, description="dynamic (required): the config's max_position_embeddings, the length beyond "
        "which transformers rescales (LlamaRotaryEmbedding.original_max_seq_len, modeling_llama.py:76-77 @ 5.24.0)")
    low_freq_factor: float = Field(default=1.0, gt=0, description="llama3 only")
    high_freq_factor: float = Field(default=4.0, gt=0, description="llama3 only")
    beta_fast: float = Field(default=32.0, gt=0, description="yarn only")
    beta_slow: float = Field(default=1.0, gt=0, description="yarn only")
    mscale: float = Field(default=1.0, ge=0, description="yarn only")
    mscale_all_dim: float = Field(default=0.0, ge=0, description="yarn only")
    truncate: bool = Field(default=True, description="yarn only: the ramp's correction range rounded to whole "
                           "dimensions (transformers ``truncate``; Megatron-Core yarn_correction_range_round_to_int); "
                           "GPT-OSS: false")

    @model_validator(mode="after")
    def _lengths(self) -> RopeScaling:
        need = {"llama3": "original_max_position_embeddings", "yarn": "original_max_position_embeddings",
                "dynamic": "max_position_embeddings"}.get(self.type)
        if need is not None and getattr(self, need) is None:
            raise ValueError(f"rope_scaling of type '{self.type}' needs {need}")
        return self

    @property
    def attention_factor(self) -> float:
        """YaRN's concentration factor on the rotated q/k, ``mscale(s, mscale) / mscale(s, mscale_all_dim)``
        (transformers ``attention_factor``; Megatron-Core ``_yarn_get_concentration_factor``, which falls back to
        ``mscale(s, 1)`` when the two are unset, the same number for GPT-OSS: 0.1 ln 32 + 1 = 1.347); 1 for llama3."""
        if self.type != "yarn":
            return 1.0

        def mscale(m: float) -> float:
            return 0.1 * m * math.log(self.factor) + 1.0

        return mscale(self.mscale) / mscale(self.mscale_all_dim)


class RouterSpec(_Frozen):
    """How an MoE layer picks experts and balances load (meaningful only when ``num_experts > 0``)."""

    score_function: Literal["softmax", "sigmoid"] = "softmax"
    norm_top_k: bool = Field(default=True, description="selected experts' weights renormalized to sum to 1 "
                             "(Mixtral: top-k then softmax; Qwen3 norm_topk_prob; DeepSeek-V3 norm_topk_prob)")
    expert_bias: bool = Field(default=False, description="aux-loss-free balancing: a per-expert bias added to the "
                              "scores for selection only (DeepSeek-V3 topk_method 'noaux_tc')")
    num_groups: int = Field(default=0, ge=0, description="device-limited routing: experts in this many groups; "
                            "0 = ungrouped")
    group_top_k: int = Field(default=0, ge=0, description="groups each token may route to (with num_groups)")
    top_k_scaling: float = Field(default=1.0, gt=0, description="routed-expert output multiplier "
                                 "(DeepSeek routed_scaling_factor)")
    aux_loss: Literal["none", "aux_loss", "seq_aux_loss"] = Field(
        default="aux_loss", description="load-balancing loss: per batch (Switch/GShard) or per sequence (DeepSeek)")
    aux_loss_coeff: float = Field(default=0.0, ge=0, description="its weight (HF router_aux_loss_coef / "
                                  "aux_loss_alpha)")
    probs_on_input: bool = Field(default=False, description="the chosen expert's router weight scales the token "
                                 "before the expert rather than its output (Llama 4: transformers Llama4TextMoe "
                                 "routed_in = x * router_scores; Megatron-Core moe_apply_probs_on_input, top-1 only, "
                                 "moe/experts.py:229-232 @ core_v0.16.1)")
    fp32_logits: bool = Field(default=False, description="the gate's logits computed in fp32 from bf16 "
                              "activations (HF DeepseekV2/V3, Glm4Moe and NemotronH TopkRouter: F.linear on float32; "
                              "Megatron --moe-router-dtype fp32); else in the activations' dtype (Mixtral, Qwen, "
                              "GPT-OSS, OLMoE)")

    @model_validator(mode="after")
    def _check(self) -> "RouterSpec":
        if bool(self.num_groups) != bool(self.group_top_k) or self.group_top_k > self.num_groups:
            raise ValueError(f"group_top_k ({self.group_top_k}) must be in 1..num_groups ({self.num_groups}) "
                             "when routing is grouped, and both 0 otherwise")
        return self


# Megatron-Core's hybrid layer symbols (megatron/core/ssm/mamba_hybrid_layer_allocation.py:25-32, ``Symbols``): each
# character of a hybrid pattern is ONE layer of the MambaStack, a pre-norm residual block around one mixer.
HYBRID_SYMBOLS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


class MambaSpec(_Frozen):
    """The Mamba-2 (SSD) mixer of a hybrid model as Megatron-Core 0.16.1 builds it (``MambaMixer``,
    megatron/core/ssm/mamba_mixer.py:224-379): ``in_proj`` h -> (z, x, B, C, dt) = 2·d_inner + 2·groups·state + heads
    with its pre-norm fused (TELayerNormColumnParallelLinear), a depthwise causal ``conv1d`` over (x, B, C) of
    ``conv_kernel`` taps (+ bias), per-head ``dt_bias``, ``A_log`` and ``D``, a gated RMSNorm over d_inner and
    ``out_proj`` d_inner -> h; no linear biases (mamba_mixer.py:264). transformers' ``NemotronHMamba2Mixer`` holds the
    same tensors."""

    num_heads: int = Field(gt=0, description="SSM heads (Megatron mamba_num_heads, HF mamba_num_heads)")
    head_dim: int = Field(gt=0, description="channels per head (mamba_head_dim); d_inner = heads * head_dim")
    state_dim: int = Field(gt=0, description="SSM state size N (mamba_state_dim, HF ssm_state_size)")
    num_groups: int = Field(gt=0, description="B/C groups (mamba_num_groups, HF n_groups)")
    conv_kernel: int = Field(default=4, gt=0, description="causal conv1d taps (MambaMixer d_conv, HF conv_kernel)")
    chunk_size: int = Field(default=128, gt=0, description="SSD scan chunk (HF chunk_size)")
    conv_bias: bool = Field(default=True, description="conv1d bias (HF use_conv_bias)")

    @model_validator(mode="after")
    def _check(self) -> "MambaSpec":
        if self.num_heads % self.num_groups:
            raise ValueError(f"mamba num_heads ({self.num_heads}) must be a multiple of num_groups "
                             f"({self.num_groups}) (megatron/core/ssm/mamba_mixer.py:262)")
        return self

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def bc_width(self) -> int:
        """B and C together: 2 · groups · state."""
        return 2 * self.num_groups * self.state_dim

    @property
    def in_proj_width(self) -> int:
        """z, x, B, C, dt (mamba_mixer.py:271)."""
        return 2 * self.d_inner + self.bc_width + self.num_heads

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv1d: x, B, C (mamba_mixer.py:292)."""
        return self.d_inner + self.bc_width

    def params(self, hidden: int) -> int:
        """Mixer weights without the fused pre-norm: in_proj, conv1d (+ bias), dt_bias, A_log, D (one per head,
        D_has_hdim False), the gated norm's weight (d_inner), out_proj."""
        conv = self.conv_dim * self.conv_kernel + (self.conv_dim if self.conv_bias else 0)
        return hidden * self.in_proj_width + conv + 3 * self.num_heads + self.d_inner + self.d_inner * hidden


class GatedDeltaNetSpec(_Frozen):
    """The Gated DeltaNet (GDN) linear-attention mixer that replaces self-attention on the linear-attention layers of a
    transformer stack (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", ICLR 2025, arXiv:2412.06464; Qwen3-Next),
    as megatron-core 0.16.1 builds it (``GatedDeltaNet``, megatron/core/ssm/gated_delta_net.py:136-224): ``in_proj``
    h -> (q, k, v, z, beta, alpha) = 2·key_dim + 2·value_dim + 2·value_heads, no bias, with the layer's input norm
    fused (TELayerNormColumnParallelLinear); a depthwise causal ``conv1d`` over (q, k, v) of ``conv_kernel`` taps, no
    bias (:161-179); per value head ``dt_bias`` and ``A_log`` (:181-200); the chunked gated delta rule
    (flash-linear-attention ``chunk_gated_delta_rule``, :382-391) with q and k L2-normalised and repeated from key heads
    to value heads (:349-355); an RMSNorm over each value head (one ``value_head_dim`` weight), gated by silu(z)
    (:202-207, :412-421); ``out_proj`` value_dim -> h (row-parallel). transformers' ``Qwen3NextGatedDeltaNet``
    (modeling_qwen3_next.py:583-627 @ 5.24.0) holds the same tensors, its in_proj split in two (qkvz, ba). Every
    ``full_attention_every``-th layer (1-based N, 2N, ...) keeps softmax self-attention (Megatron-Core
    ``linear_attention_freq`` N, experimental_attention_variant_module_specs.py:317-326: layer i is SDPA iff
    (i + 1) % N == 0; HF ``full_attention_interval``)."""

    num_key_heads: int = Field(gt=0, description="q/k heads (Megatron linear_num_key_heads, HF same)")
    num_value_heads: int = Field(gt=0, description="v / gate heads (linear_num_value_heads); a multiple of "
                                 "num_key_heads: q and k are repeated to them (gated_delta_net.py:353-355)")
    key_head_dim: int = Field(gt=0, description="q/k channels per head (linear_key_head_dim)")
    value_head_dim: int = Field(gt=0, description="v channels per head (linear_value_head_dim)")
    conv_kernel: int = Field(default=4, gt=0, description="causal conv1d taps (linear_conv_kernel_dim)")
    full_attention_every: int = Field(ge=2, description="every N-th layer (1-based) is softmax self-attention, "
                                      "the others GDN (Megatron linear_attention_freq N, HF full_attention_interval)")
    chunk_size: int = Field(default=64, gt=0, description="the chunk of flash-linear-attention's chunked gated delta "
                            "rule (fla/ops/gated_delta_rule/chunk.py: chunk_local_cumsum(g, chunk_size=64), BT = 64 "
                            "in every chunk kernel; Megatron calls it without a chunk argument)")

    @model_validator(mode="after")
    def _check(self) -> "GatedDeltaNetSpec":
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"gdn num_value_heads ({self.num_value_heads}) must be a multiple of num_key_heads "
                             f"({self.num_key_heads}) (megatron/core/transformer/transformer_config.py:969-972)")
        return self

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def in_proj_width(self) -> int:
        """q, k, v, z (output gate), beta, alpha (gated_delta_net.py:139)."""
        return 2 * self.key_dim + 2 * self.value_dim + 2 * self.num_value_heads

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv1d: q, k, v (gated_delta_net.py:161)."""
        return 2 * self.key_dim + self.value_dim

    def params(self, hidden: int) -> int:
        """Mixer weights without the fused input norm: in_proj, conv1d (no bias), dt_bias and A_log (one per value
        head), the gated norm's weight (value_head_dim), out_proj."""
        return (hidden * self.in_proj_width + self.conv_dim * self.conv_kernel + 2 * self.num_value_heads
                + self.value_head_dim + self.value_dim * hidden)

    def is_linear(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) is a GDN layer (not every N-th)."""
        return (layer + 1) % self.full_attention_every != 0


class AttnTemperature(_Frozen):
    """Llama 4's attention temperature tuning on its NoPE layers (transformers ``Llama4TextAttention``,
    modeling_llama4.py:360-366 @ 5.24.0; Meta's ``attn_temperature_tuning``): the query at position ``p`` (0-based)
    is scaled by ``1 + attn_scale · log(1 + floor((p + 1) / floor_scale))``, unchanged for ``p < floor_scale - 1``.
    No cost (one multiply per query element, fused by no kernel autoplan prices apart)."""

    floor_scale: int = Field(default=8192, gt=0, description="HF floor_scale")
    attn_scale: float = Field(default=0.1, gt=0, description="HF attn_scale")

    def first_scaled_position(self) -> int:
        """The first 0-based position whose query is scaled: floor((p + 1) / floor_scale) >= 1."""
        return self.floor_scale - 1


class ArchSpec(_Frozen):
    """Architecture facts that change the trained model but not its tensor shapes: positions, norms, attention
    window, activation, dropout, routing, multi-token prediction. One nested group so an emitter writes all of
    them (Megatron flags, torchtitan model args, the FSDP2 module's config) and a loader can say which it read.
    Defaults are a plain pre-norm Llama-style decoder with no dropout."""

    rope_theta: float = Field(default=10000.0, gt=0, description="RoPE base (HF rope_theta)")
    rope_scaling: RopeScaling | None = Field(default=None, description="long-context RoPE scaling; None = none")

    @field_validator("rope_scaling", mode="after")
    @classmethod
    def _linear_one_is_plain(cls, rs: RopeScaling | None) -> RopeScaling | None:
        """Linear scaling at factor 1 divides by 1: plain RoPE, so every target emits it (the HF loader too)."""
        return None if rs is not None and rs.type == "linear" and rs.factor == 1 else rs

    rotary_fraction: float = Field(default=1.0, gt=0, le=1, description="fraction of head dim rotated "
                                   "(GPT-NeoX rotary_pct)")
    alibi: bool = Field(default=False, description="ALiBi attention biases instead of RoPE (BLOOM)")
    no_position_encoding: bool = Field(default=False, description="attention without any position encoding "
                                       "(NoPE: Nemotron-H's attention layers, NemotronHAttention has no rotary; "
                                       "Megatron --position-embedding-type none)")
    rope_interleaved: bool = Field(default=False, description="RoPE rotates adjacent pairs (2i, 2i+1) of each head "
                                   "(Llama 4: transformers apply_rotary_emb on view_as_complex pairs, "
                                   "modeling_llama4.py:225-235 @ 5.24.0; Megatron --rotary-interleaved) rather than "
                                   "the two halves (rotate_half)")
    no_rope_every: int = Field(default=0, ge=0, description="every N-th layer (1-based N, 2N, ...) has no RoPE "
                               "(NoPE; Llama 4: HF no_rope_layers / no_rope_layer_interval 4; Megatron-Core "
                               "no_rope_freq N, transformer_config.py:1963-1978 @ core_v0.16.1); 0 = RoPE everywhere")
    attention_chunk: int | None = Field(default=None, gt=0, description="chunked attention on the RoPE layers: a "
                                        "query attends only to the keys of its own chunk of this many tokens (Llama 4: "
                                        "HF attention_chunk_size 8192, layer_types 'chunked_attention' where "
                                        "no_rope_layers is 1); None = full attention")
    attn_temperature: AttnTemperature | None = Field(default=None, description="query temperature tuning on the "
                                                     "NoPE layers (Llama 4); None = none")
    norm_eps: float = Field(default=1e-5, gt=0, description="epsilon of every RMSNorm/LayerNorm")
    norm_zero_centered_gamma: bool = Field(default=False, description="every norm scales by (1 + weight), the "
                                           "weight initialised to 0 (Nemotron-4's LayerNorm1P: transformers "
                                           "NemotronLayerNorm1P; Megatron --apply-layernorm-1p, TransformerConfig."
                                           "layernorm_zero_centered_gamma). The same function at init and under "
                                           "Adam without weight decay on norms; checkpoints store weight - 1")
    qk_norm: bool = Field(default=False, description="per-head RMSNorm on queries and keys (Qwen3)")
    qk_norm_per_head: bool = Field(default=True, description="with qk_norm: one RMSNorm of head_dim applied to each "
                                   "head (Qwen3, GLM-4.5; Megatron --qk-layernorm); false: one RMSNorm over the whole "
                                   "q and k projections (OLMoE: q_norm over heads*head_dim, k_norm over "
                                   "kv_heads*head_dim), which Megatron-LM has no flag for")
    qk_l2_norm: bool = Field(default=False, description="q and k of each head scaled to unit RMS, no weight (Llama 4 "
                             "use_qk_norm: transformers Llama4TextL2Norm, modeling_llama4.py:106-118, 331-332 @ "
                             "5.24.0; Megatron-Core L2Norm, --qk-l2-norm), on the layers with RoPE only "
                             "(no_rope_every's NoPE layers have none)")
    qkv_clip: float | None = Field(default=None, gt=0, description="q, k and v clamped to [-c, c] after their "
                                   "projections (OLMoE clip_qkv); None = no clamp")
    sliding_window: int | None = Field(default=None, gt=0, description="causal attention window in tokens "
                                       "(Mistral 7B v0.1: every layer); None = full attention")
    full_attention_every: int = Field(default=0, ge=0, description="with sliding_window: every N-th layer "
                                      "(1-based layer N, 2N, ...) attends to the whole sequence, the others use the "
                                      "window (GPT-OSS: 2, HF layer_types alternating; Megatron-Core "
                                      "window_attn_skip_freq N); 0 = every layer windowed")
    attention_output_gate: bool = Field(default=False, description="softmax attention's output scaled by "
                                        "sigmoid of a second query-wide projection before o_proj: q_proj is twice as "
                                        "wide (Qwen3-Next: transformers Qwen3NextAttention, modeling_qwen3_next.py:241-"
                                        "243, 290-300 @ 5.24.0; Megatron-Core attention_output_gate, attention.py:985-"
                                        "1003 @ core_v0.16.1)")
    attention_sinks: bool = Field(default=False, description="a learned per-head logit in each softmax "
                                  "denominator (GPT-OSS 'sinks'; Megatron-Core softmax_type 'learnable')")
    activation: Literal["silu", "gelu", "gelu_tanh", "quick_gelu", "relu2"] = Field(
        default="silu", description="MLP activation (gated with gated_mlp: SwiGLU is silu; quick_gelu is "
        "x*sigmoid(1.702x), GPT-OSS's gated experts; relu2 is squared ReLU, Nemotron-H's non-gated MLPs and "
        "experts, Megatron --squared-relu)")
    glu_linear_offset: float = Field(default=0.0, description="gated MLP: act(gate) * (up + offset) "
                                     "(GPT-OSS: 1.0; Megatron-Core glu_linear_offset)")
    activation_clamp: float | None = Field(default=None, gt=0, description="gated MLP: gate clamped to <= c and "
                                           "up to [-c, c] before the activation (GPT-OSS swiglu_limit 7.0; "
                                           "Megatron-Core activation_func_clamp_value)")
    attention_dropout: float = Field(default=0.0, ge=0, lt=1)
    hidden_dropout: float = Field(default=0.0, ge=0, lt=1, description="dropout on residual branches")
    router: RouterSpec = Field(default_factory=RouterSpec)
    shared_expert_gate: bool = Field(default=False, description="the shared experts' output scaled by sigmoid(x·g), "
                                     "g one hidden-wide weight per MoE layer (HF Qwen2-MoE shared_expert_gate; "
                                     "Megatron --moe-shared-expert-gate, moe/shared_experts.py:55-61, 128-131)")
    mtp_layers: int = Field(default=0, ge=0, description="multi-token-prediction depths (DeepSeek-V3 "
                            "num_nextn_predict_layers; Megatron --mtp-num-layers): each is a block + projection "
                            "sharing the embedding and the head")
    mtp_pattern: str | None = Field(default=None, min_length=1, max_length=256, description="a hybrid stack's "
                                    "MTP block, one symbol per layer as hybrid_pattern (M, *, -, E): each depth runs "
                                    "this block (Megatron-Core's unified pattern '<main>/<block>/<block>...', "
                                    "hybrid_layer_allocation.py:40-65 @ core_v0.18.0; Nemotron 3 Super '*E', HF "
                                    "mtp_hybrid_override_pattern); None: a transformer stack's block, the last "
                                    "decoder layer's kind")
    mtp_repeated: bool = Field(default=False, description="one MTP module's weights run at every depth "
                               "(Megatron-Core mtp_use_repeated_layer: MultiTokenPredictionBlock builds one layer and "
                               "applies it mtp_layers times, multi_token_prediction.py:1537-1547, 1617-1618 @ "
                               "core_v0.18.0): the weights of one depth, the compute of all")

    @model_validator(mode="after")
    def _check(self) -> "ArchSpec":
        if (self.mtp_pattern is not None or self.mtp_repeated) and not self.mtp_layers:
            raise ValueError(f"mtp_pattern ({self.mtp_pattern!r}) / mtp_repeated ({self.mtp_repeated}) describe "
                             "multi-token prediction: they need mtp_layers >= 1")
        if self.mtp_pattern is not None:
            bad = sorted(set(self.mtp_pattern) - set(HYBRID_SYMBOLS))
            if bad:
                raise ValueError(f"mtp_pattern {self.mtp_pattern!r}: symbol(s) {bad} are not layer symbols autoplan "
                                 "models: M (Mamba), * (attention), - (MLP), E (MoE) (Megatron-Core's MTP block "
                                 "takes no '|' or '/', hybrid_layer_allocation.py:305-326 @ core_v0.18.0; G / D "
                                 "layers are not modelled); e.g. '*E'")
        if self.full_attention_every == 1 or (self.full_attention_every and self.sliding_window is None):
            raise ValueError(f"full_attention_every ({self.full_attention_every}) must be 0 or >= 2, and needs "
                             "sliding_window")
        if self.no_rope_every == 1:
            raise ValueError("no_rope_every 1 leaves no layer with RoPE: use no_position_encoding true; valid: 0 or "
                             ">= 2")
        if self.qk_l2_norm and self.qk_norm:
            raise ValueError("qk_norm (a learned RMSNorm) and qk_l2_norm (weightless) are two q/k norms: give one")
        if self.attention_chunk is not None and self.sliding_window is not None:
            raise ValueError("attention_chunk and sliding_window are two attention masks: give one")
        if self.attn_temperature is not None and not self.no_rope_every:
            raise ValueError("attn_temperature scales the NoPE layers' queries: it needs no_rope_every >= 2")
        return self

    def layer_has_rope(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) applies RoPE: not a NoPE layer of ``no_rope_every`` (Megatron-Core
        ``no_rope_freq`` pattern ``[0] * (N - 1) + [1]``, transformer_config.py:1972; HF ``(i + 1) % N != 0``)."""
        return not (self.no_rope_every and (layer + 1) % self.no_rope_every == 0)

    def layer_chunk(self, layer: int) -> int | None:
        """The attention chunk of decoder layer ``layer`` (0-based): ``attention_chunk`` on a RoPE layer, None (full
        attention) on a NoPE one (transformers Llama4TextConfig.layer_types, configuration_llama4.py:187-191)."""
        return self.attention_chunk if self.layer_has_rope(layer) else None

    def layer_window(self, layer: int) -> int | None:
        """The attention window of decoder layer ``layer`` (0-based), None for full attention: Megatron-Core's
        ``is_layer_window_attention`` (megatron/core/transformer/utils.py:451-466) on 1-based layer numbers."""
        if self.sliding_window is None or (self.full_attention_every and (layer + 1) % self.full_attention_every == 0):
            return None
        return self.sliding_window


class ModelSpec(_Frozen):
    """A decoder-only transformer. Dense when ``num_experts == 0``."""

    name: str = Field(min_length=1, description="display name")
    num_layers: int = Field(gt=0, description="decoder layers L")
    hidden_size: int = Field(gt=0, description="model width h")
    ffn_hidden_size: int = Field(gt=0, description="dense MLP width f")
    num_attention_heads: int = Field(gt=0, description="query heads a")
    num_kv_heads: int = Field(gt=0, description="KV heads g (GQA groups); = a for MHA, 1 for MQA")
    head_dim: int | None = Field(default=None, gt=0, description="per-head dim d; None means h / a")
    vocab_size: int = Field(gt=0, description="vocabulary V")
    gated_mlp: bool = Field(default=True, description="SwiGLU (3 matrices) if true, GELU (2) if false")
    tied_embeddings: bool = Field(default=False, description="output head shares the input embedding")
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    linear_bias: bool = Field(default=False, description="biases on attention/MLP linears (GPT-2, BLOOM)")
    qkv_bias: bool = Field(default=False, description="biases on the Q/K/V projections only (Qwen2)")
    learned_position_embeddings: int = Field(
        default=0, ge=0, description="rows of a learned absolute position table; 0 = rotary/ALiBi"
    )
    # MoE
    num_experts: int = Field(default=0, ge=0, description="routed experts per MoE layer; 0 = dense")
    moe_top_k: int = Field(default=0, ge=0, description="experts each token is routed to")
    moe_ffn_hidden_size: int | None = Field(default=None, gt=0, description="per-expert FFN width")
    num_shared_experts: int = Field(default=0, ge=0, description="always-on experts per MoE layer")
    first_dense_layers: int = Field(default=0, ge=0, description="leading layers with a dense MLP")
    moe_layer_freq: int = Field(default=1, gt=0, description="every k-th layer (after the dense ones) is MoE")
    mla: MLASpec | None = Field(default=None, description="multi-head latent attention (DeepSeek)")
    dsa: DSASpec | None = Field(default=None, description="DeepSeek sparse attention over the MLA (DeepSeek-V3.2, "
                                "GLM-5): a lightning indexer and top-k key selection in every attention layer")
    moe_latent_size: int | None = Field(default=None, gt=0, description="latent MoE (Nemotron 3 Super): routed "
                                        "experts run at this width between an h->latent and a latent->h projection, "
                                        "both replicated over TP (Megatron-Core moe_layer.py:170-193); shared experts "
                                        "stay at h")
    # Hybrid (Mamba) stacks: one character per layer, Megatron-Core's hybrid_override_pattern
    hybrid_pattern: str | None = Field(default=None, max_length=1 << 16, description="hybrid stack: layer i is "
                                       "hybrid_pattern[i], M Mamba-2 mixer, * self-attention, - dense MLP, E MoE, each "
                                       "a single pre-norm residual block (Megatron-Core MambaStack, "
                                       "mamba_hybrid_layer_allocation.py); None = transformer decoder layers "
                                       "(attention + MLP each)")
    mamba: MambaSpec | None = Field(default=None, description="the Mamba-2 mixer of a hybrid stack's M layers")
    gdn: GatedDeltaNetSpec | None = Field(default=None, description="Gated DeltaNet linear attention in place of "
                                          "self-attention on a transformer stack's linear-attention layers "
                                          "(Qwen3-Next; Megatron-Core experimental_attention_variant "
                                          "'gated_delta_net'); None = softmax attention in every layer")
    arch: ArchSpec = Field(default_factory=ArchSpec, description="positions, norms, window, routing, MTP")

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> "ModelSpec":
        """A copy with ``update`` applied and validated again (a new instance: ``deep`` is moot). pydantic's own copy
        keeps the instance ``__dict__``, where ``functools.cached_property`` stores the derived sizes below: an update
        would leave them stale."""
        if not update:
            return super().model_copy(deep=deep)
        return type(self).model_validate({**{k: getattr(self, k) for k in type(self).model_fields}, **update})

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        a, g = self.num_attention_heads, self.num_kv_heads
        if a % g:
            raise ValueError(f"num_attention_heads ({a}) must be a multiple of num_kv_heads ({g})")
        if self.head_dim is None and self.hidden_size % a:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads ({a}) "
                "unless head_dim is given"
            )
        if self.num_experts:
            if not 0 < self.moe_top_k <= self.num_experts:
                raise ValueError(
                    f"moe_top_k ({self.moe_top_k}) must be in 1..num_experts ({self.num_experts})"
                )
            groups = self.arch.router.num_groups
            if groups and self.num_experts % groups:  # megatron-core 0.16.1 transformer_config.py:1654-1657
                raise ValueError(f"router num_groups ({groups}) must divide num_experts ({self.num_experts}); valid: "
                                 f"{', '.join(str(d) for d in divisors(self.num_experts) if d > 1)}")
            if self.first_dense_layers >= self.num_layers:
                raise ValueError(
                    f"first_dense_layers ({self.first_dense_layers}) must be < num_layers ({self.num_layers})"
                )
        elif self.moe_top_k or self.num_shared_experts:
            raise ValueError("moe_top_k / num_shared_experts need num_experts > 0")
        if self.moe_latent_size is not None and not self.num_experts:
            raise ValueError("moe_latent_size needs num_experts > 0")
        self._check_hybrid()
        self._check_gdn()
        self._check_dsa()
        arch = self.arch
        if not self.gated_mlp and (arch.glu_linear_offset or arch.activation_clamp is not None):
            raise ValueError("glu_linear_offset / activation_clamp apply to a gated MLP (gated_mlp true)")
        return self

    def _check_dsa(self) -> None:
        """DSA runs over MLA with a query LoRA: the indexer's queries read the q latent (transformers 5.24.0
        AXK1Attention / DeepseekV32Indexer ``wq_b``; megatron-core 0.16.1 experimental_attention_variant_module_specs.py:81
        "Currently only MLA supports sparse attention"), and its RoPE covers the last qk_rope_head_dim of each indexer
        head (dsa.py:455-472)."""
        d = self.dsa
        if d is None:
            return
        if self.mla is None or not self.mla.q_lora_rank:
            raise ValueError("dsa (DeepSeek sparse attention) needs mla with q_lora_rank > 0: the indexer's queries "
                             "read the query latent")
        if d.index_head_dim < self.mla.qk_rope_head_dim:
            raise ValueError(f"dsa index_head_dim ({d.index_head_dim}) must be >= mla qk_rope_head_dim "
                             f"({self.mla.qk_rope_head_dim}): RoPE covers that slice of each indexer head")

    def _check_hybrid(self) -> None:
        pat = self.hybrid_pattern
        if pat is None:
            if self.mamba is not None:
                raise ValueError("mamba (a Mamba-2 mixer) needs hybrid_pattern (which layers are Mamba)")
            if self.arch.mtp_pattern is not None:
                raise ValueError(f"mtp_pattern {self.arch.mtp_pattern!r} is a hybrid stack's MTP block and needs "
                                 "hybrid_pattern; a transformer stack's MTP block is its last decoder layer "
                                 "(unset mtp_pattern)")
            return
        bad = sorted(set(pat) - set(HYBRID_SYMBOLS))
        if bad:
            raise ValueError(f"hybrid_pattern symbol(s) {bad} are not Megatron-Core's: M (Mamba), * (attention), "
                             "- (MLP), E (MoE) (mamba_hybrid_layer_allocation.py:25-32)")
        if len(pat) != self.num_layers:
            raise ValueError(f"hybrid_pattern has {len(pat)} layers, num_layers is {self.num_layers}: they must be "
                             "equal (mamba_hybrid_layer_allocation.py:71-77)")
        if ("M" in pat) != (self.mamba is not None):
            raise ValueError("hybrid_pattern with M layers needs mamba (the mixer's shape), and mamba needs M layers")
        if ("E" in pat) != bool(self.num_experts):
            raise ValueError(f"hybrid_pattern E layers need num_experts > 0, and num_experts ({self.num_experts}) > 0 "
                             "needs E layers")
        if self.first_dense_layers or self.moe_layer_freq != 1:
            raise ValueError("first_dense_layers / moe_layer_freq do not apply to a hybrid stack: hybrid_pattern "
                             "places the MoE (E) layers")
        if self.mla is not None:
            raise ValueError("a hybrid stack with MLA is not modelled: mla unset")
        mtp = self.arch.mtp_pattern
        if self.arch.mtp_layers and mtp is None:
            raise ValueError(f"mtp_layers={self.arch.mtp_layers} on a hybrid stack needs arch.mtp_pattern, the block "
                             "each MTP depth runs (Megatron-Core builds it from the pattern after '/', "
                             "hybrid_layer_allocation.py:194-277 @ core_v0.18.0), e.g. '*E' (Nemotron 3 Super)")
        if mtp is not None:
            if "M" in mtp and self.mamba is None:
                raise ValueError(f"mtp_pattern {mtp!r} has M layers: it needs mamba (the mixer's shape)")
            if "E" in mtp and not self.num_experts:
                raise ValueError(f"mtp_pattern {mtp!r} has E layers: it needs num_experts > 0")

    def _check_gdn(self) -> None:
        if self.gdn is None:
            return
        if self.hybrid_pattern is not None:
            raise ValueError("gdn (Gated DeltaNet layers of a transformer stack) and hybrid_pattern (a Mamba stack) "
                             "are two layer layouts: give one")
        if self.mla is not None:
            raise ValueError("gdn with MLA full-attention layers is not modelled: mla unset")
        if self.gdn.full_attention_every > self.num_layers:
            raise ValueError(f"gdn full_attention_every ({self.gdn.full_attention_every}) leaves no full-attention "
                             f"layer in {self.num_layers} layers; valid: 2..{self.num_layers}")

    # ---- derived shapes -------------------------------------------------------------------
    def layer_is_gdn(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` mixes tokens with Gated DeltaNet rather than self-attention."""
        return self.gdn is not None and self.gdn.is_linear(layer)

    @property
    def is_hybrid(self) -> bool:
        return self.hybrid_pattern is not None

    def hybrid_symbol(self, layer: int) -> str:
        """Layer ``layer``'s hybrid symbol (M, *, -, E); a transformer layer has both attention and an MLP: ''."""
        return self.hybrid_pattern[layer] if self.hybrid_pattern is not None else ""

    def layer_has_attention(self, layer: int) -> bool:
        """Softmax self-attention in the layer (not a Mamba or Gated DeltaNet mixer)."""
        if self.layer_is_gdn(layer):
            return False
        return self.hybrid_pattern is None or self.hybrid_pattern[layer] == "*"

    def layer_has_mlp(self, layer: int) -> bool:
        """A dense or MoE MLP in the layer."""
        return self.hybrid_pattern is None or self.hybrid_pattern[layer] in "-E"

    @cached_property
    def num_attention_layers(self) -> int:
        if self.gdn is not None:
            return sum(not self.gdn.is_linear(i) for i in range(self.num_layers))
        return self.num_layers if self.hybrid_pattern is None else self.hybrid_pattern.count("*")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def head_dim_resolved(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (a * d)."""
        return self.num_attention_heads * self.head_dim_resolved

    @property
    def kv_dim(self) -> int:
        """Width of one of K or V (g * d)."""
        return self.num_kv_heads * self.head_dim_resolved

    @property
    def kv_projection_params(self) -> int:
        """K and V projection weights (+ biases) of one layer (0 for MLA: its K/V are per query head)."""
        if self.mla is not None:
            return 0
        bias = self.linear_bias or self.qkv_bias
        return 2 * (self.hidden_size * self.kv_dim + (self.kv_dim if bias else 0))

    def kv_replicated(self, par: "ParallelConfig") -> bool:
        """Whether ``par`` holds the K/V projections whole on every TP rank (``kv_replication='replicate'`` with
        tp > num_kv_heads)."""
        return self.mla is None and par.tp > self.num_kv_heads and par.kv_replication == "replicate"

    @property
    def expert_ffn_hidden_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    def is_moe_layer(self, layer: int) -> bool:
        """DeepSeek/Qwen convention: layers < first_dense_layers are dense, then every
        moe_layer_freq-th layer is MoE."""
        if self.hybrid_pattern is not None:
            return self.hybrid_pattern[layer] == "E"
        if not self.is_moe or layer < self.first_dense_layers:
            return False
        return (layer - self.first_dense_layers) % self.moe_layer_freq == self.moe_layer_freq - 1

    @cached_property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    # ---- parameter counts ------------------------------------------------------------------
    @property
    def _mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    @cached_property
    def attention_params(self) -> int:
        """Q, K, V and output projection weights (+ biases) of one layer."""
        h = self.hidden_size
        if self.mla is not None:
            m, a = self.mla, self.num_attention_heads
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = h * a * qk if m.q_lora_rank == 0 else h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
            kv += m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + a * m.v_head_dim * h
        w = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        if self.arch.attention_output_gate:
            w += h * self.q_dim + (self.q_dim if self.linear_bias or self.qkv_bias else 0)  # the gate half of q_proj
        if self.arch.qk_norm:
            w += 2 * self.head_dim_resolved  # per-head RMSNorm weights of q and k (Qwen3)
        if self.arch.attention_sinks:
            w += self.num_attention_heads  # one sink logit per query head (GPT-OSS self_attn.sinks)
        if self.linear_bias:
            w += self.q_dim + 2 * self.kv_dim + h
        elif self.qkv_bias:
            w += self.q_dim + 2 * self.kv_dim
        return w

    def _mlp_params(self, width: int) -> int:
        h, k = self.hidden_size, self._mlp_matrices
        w = k * h * width
        if self.linear_bias:
            w += (k - 1) * width + h
        return w

    @cached_property
    def dense_mlp_params(self) -> int:
        return self._mlp_params(self.ffn_hidden_size)

    @property
    def expert_input_size(self) -> int:
        """Width routed experts read and write: h, or the latent width of a latent MoE."""
        return self.moe_latent_size or self.hidden_size

    @cached_property
    def expert_params(self) -> int:
        """One routed expert's MLP weights (at the latent width in a latent MoE: experts.py:544-567)."""
        h, k, w = self.expert_input_size, self._mlp_matrices, self.expert_ffn_hidden_size
        return k * h * w + (((k - 1) * w + h) if self.linear_bias else 0)

    @cached_property
    def shared_expert_params(self) -> int:
        """One shared expert's weights: always at h (Megatron-Core SharedExpertMLP reads the layer input)."""
        return self._mlp_params(self.expert_ffn_hidden_size)

    @cached_property
    def latent_projection_params(self) -> int:
        """The latent MoE's h->latent and latent->h projections (moe_layer.py:170-193; no bias unless
        add_bias_linear)."""
        if self.moe_latent_size is None:
            return 0
        return 2 * self.hidden_size * self.moe_latent_size + ((self.moe_latent_size + self.hidden_size)
                                                               if self.linear_bias else 0)

    @cached_property
    def router_params(self) -> int:
        """Gate weights, + a bias per expert with ``linear_bias`` (GPT-OSS mlp.router.bias; Megatron-Core's
        TopKRouter adds one under add_bias_linear, moe/router.py:56)."""
        return (self.hidden_size + (1 if self.linear_bias else 0)) * self.num_experts

    @property
    def norm_params_per_layer(self) -> int:
        """Two pre-norms of a transformer layer (a hybrid layer has one: ``layer_params``)."""
        return 2 * self.norm_params

    @property
    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    @cached_property
    def moe_block_params(self) -> int:
        """Router, routed and shared experts and latent projections of one MoE MLP (no norm)."""
        return (self.router_params + self.num_experts * self.expert_params
                + self.num_shared_experts * self.shared_expert_params + self.shared_gate_params
                + self.latent_projection_params)

    @property
    def shared_gate_params(self) -> int:
        """The shared experts' sigmoid gate (``ArchSpec.shared_expert_gate``): one hidden-wide weight per MoE layer."""
        return self.hidden_size if self.arch.shared_expert_gate and self.num_shared_experts else 0

    @cached_property
    def mamba_params(self) -> int:
        """One Mamba-2 mixer without its pre-norm (``MambaSpec.params``)."""
        return self.mamba.params(self.hidden_size) if self.mamba is not None else 0

    @cached_property
    def gdn_params(self) -> int:
        """One Gated DeltaNet mixer without its fused input norm (``GatedDeltaNetSpec.params``)."""
        return self.gdn.params(self.hidden_size) if self.gdn is not None else 0

    def layer_params(self, layer: int) -> int:
        """All weights of decoder layer ``layer`` (experts included). A hybrid layer is one pre-norm + one mixer
        (M Mamba-2, * attention, - MLP, E MoE): MambaLayer / TransformerLayer / MLPLayer / MoETransformerLayer of
        megatron/core/models/mamba/mamba_layer_specs.py, the norm fused into the first linear or a TENorm."""
        if self.hybrid_pattern is not None:
            return self.symbol_params(self.hybrid_pattern[layer])
        p = ((self.gdn_params if self.layer_is_gdn(layer) else self.attention_params) + self.norm_params_per_layer
             + self.indexer_params(layer))
        p += self.moe_block_params if self.is_moe_layer(layer) else self.dense_mlp_params
        return p

    def indexer_params(self, layer: int) -> int:
        """The DSA lightning indexer's weights in decoder layer ``layer`` (``DSASpec.params``; 0 without DSA or on a
        layer that reuses an earlier layer's top-k)."""
        d, m = self.dsa, self.mla
        if d is None or m is None or not d.runs_indexer(layer):
            return 0
        return d.params(self.hidden_size, m.q_lora_rank)

    def layer_unsplit_params(self, layer: int) -> int:
        """Weights of layer ``layer`` every TP rank holds whole: its norms (one in a hybrid layer, two in a transformer
        layer) and a latent MoE's two projections ('duplicated' TELinear, moe_layer.py:170-193)."""
        p = self.norm_params if self.hybrid_pattern is not None else self.norm_params_per_layer
        p += self.indexer_params(layer)  # DSAIndexer's linears are 'duplicated' (dsa.py:410-453)
        return p + (self.latent_projection_params if self.is_moe_layer(layer) else 0)

    def layer_kv_whole_extra(self, layer: int, tp: int, replicated: bool) -> float:
        """K/V weights a TP rank holds beyond its 1/tp share when they are replicated (``kv_replicated``)."""
        return self.kv_projection_params * (1 - 1 / tp) if replicated and self.layer_has_attention(layer) else 0.0

    def layer_expert_params(self, layer: int) -> int:
        """Routed-expert weights in layer ``layer`` (sharded over EP, not TP-only)."""
        return self.num_experts * self.expert_params if self.is_moe_layer(layer) else 0

    @cached_property
    def embedding_params(self) -> int:
        return (self.vocab_size + self.learned_position_embeddings) * self.hidden_size

    @cached_property
    def head_params(self) -> int:
        """Output projection (0 when tied) + final norm."""
        final_norm = self.hidden_size * (2 if self.norm == "layernorm" else 1)
        return (0 if self.tied_embeddings else self.vocab_size * self.hidden_size) + final_norm

    @cached_property
    def num_params(self) -> int:
        return self.embedding_params + self.head_params + sum(self.layer_params(i) for i in range(self.num_layers))

    def symbol_params(self, symbol: str) -> int:
        """Weights of one hybrid layer of ``symbol`` (M, *, -, E): its pre-norm + its mixer (``layer_params``; an MTP
        block's layers, ``mtp_block_layers``)."""
        return self.norm_params + {"M": self.mamba_params, "*": self.attention_params, "-": self.dense_mlp_params,
                                   "E": self.moe_block_params}[symbol]

    @property
    def mtp_block_layers(self) -> list[tuple[int, int, int]]:
        """(weights, routed-expert weights, weights every TP rank holds whole) of each layer of one MTP depth's
        block: the hybrid ``mtp_pattern``'s layers, else one decoder layer like the last (Megatron-Core builds it
        from the last layer's spec, multi_token_prediction.py @ core_v0.16.1)."""
        if not self.arch.mtp_layers:
            return []
        if self.arch.mtp_pattern is None:
            i = self.num_layers - 1
            return [(self.layer_params(i), self.layer_expert_params(i), self.layer_unsplit_params(i))]
        out = []
        for s in self.arch.mtp_pattern:
            moe = s == "E"
            out.append((self.symbol_params(s), self.num_experts * self.expert_params if moe else 0,
                        self.norm_params + (self.latent_projection_params if moe else 0)))
        return out

    @property
    def mtp_weight_copies(self) -> int:
        """MTP modules holding weights: one under ``mtp_repeated`` (the one layer runs at every depth), else one a
        depth."""
        return min(1, self.arch.mtp_layers) if self.arch.mtp_repeated else self.arch.mtp_layers

    @cached_property
    def mtp_params(self) -> int:
        """Multi-token-prediction modules (not in ``num_params``): each holds its block (``mtp_block_layers``), a
        2h→h projection and its norms (enorm, hnorm, final norm); embedding and head are shared (DeepSeek-V3 §2.2);
        ``mtp_weight_copies`` of them hold weights."""
        per = sum(p for p, _, _ in self.mtp_block_layers) + 2 * self.hidden_size**2 + 3 * self.hidden_size
        return self.mtp_weight_copies * per

    @cached_property
    def num_active_params(self) -> int:
        """Parameters touched per token (top-k routed + shared experts only)."""
        routed_idle = (self.num_experts - self.moe_top_k) * self.expert_params
        return self.num_params - self.num_moe_layers * routed_idle


class GPUSpec(_Frozen):
    """One accelerator type: datasheet numbers (sources in the catalog file)."""

    name: str
    generation: Generation
    peak_bf16_tflops: float = Field(gt=0, description="dense bf16 tensor-core peak, TFLOP/s")
    peak_fp8_tflops: float = Field(gt=0, description="dense fp8 peak, TFLOP/s (= bf16 where unsupported)")
    peak_fp4_tflops: float | None = Field(default=None, gt=0, description="dense FP4 (NVFP4) tensor-core peak, "
                                          "TFLOP/s; None: no FP4 tensor cores (before Blackwell)")
    sm_count: int | None = Field(default=None, gt=0, description="streaming multiprocessors (CUDA multiProcessorCount): "
                                 "DeepEP / HybridEP kernels take a share of them from compute; None: unknown")
    nccl_p2p_channels_nvlink: int | None = Field(
        default=None, gt=0, description="NCCL p2p channels (one CTA each: the SMs an all-to-all kernel holds) of a "
        "communicator inside one NVLink domain, as NCCL logs them on this GPU's systems; None: no public log")
    nccl_p2p_channels_net: int | None = Field(
        default=None, gt=0, description="NCCL p2p channels of a communicator spanning nodes "
        "(moe.NCCL_NET_CHANNELS_PER_PEER per remote peer); None: no public log")
    hbm_gib: float = Field(gt=0)
    hbm_tbytes_per_s: float = Field(gt=0)
    link_gbytes_per_s: float = Field(gt=0, description="scale-up (NVLink/xGMI) bandwidth per direction, GB/s")
    nvlink_domain_size: int = Field(gt=0, description="GPUs sharing one NVSwitch/NVLink domain")
    gpus_per_node: int = Field(gt=0)
    nic_gbps: float = Field(gt=0, description="default scale-out NIC bandwidth per GPU, Gbit/s")
    link_latency_us: float = Field(gt=0, description="per-hop latency on the scale-up link, µs")
    nic_latency_us: float = Field(gt=0, description="per-hop latency across the scale-out network, µs")
    source: str = ""


# FlashAttention-2 / cuDNN fused attention forward throughput on H100 SXM5, causal, head dim 128, sequence 2k-16k:
# 298/484, 319/518, 333/529, 335/539 TFLOP/s = 0.62 (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, Fig. 5).
FA2_VS_CUDNN = 0.62

# cuDNN fused attention (SDPA) micro-benchmarks per GPU generation, one GPU each: bf16, causal, head dim 128,
# 8192 tokens (4096 keys per query): (GPU, forward TFLOP/s, backward TFLOP/s), backward counted as 2.5x the forward
# FLOPs as the model does (attention_cost.ATTN_BWD_FACTOR). Both from NVIDIA's own cudnn-frontend benchmarks:
# - hopper: H200 (the H100's GH100 SMs and 989 TFLOP/s peak), cuDNN 9.1.0, batch 2 x 16 heads:
#   NVIDIA/cudnn-frontend benchmark/benchmark_results.csv @ b740542 (2024-05-07), row "2,16,8192,128,True" —
#   the software era of the runs Hopper is fitted on (2024).
# - blackwell: GB200, cuDNN 9.17.0 (NGC PyTorch 25.11), batch 1, 128 query / 8 KV heads (Llama 3.1 405B shape):
#   NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv
#   @ d48a60e (2025-12-19), row "1,8192,8192,128,8,128,True,cudnn_fe" — the newest published Blackwell sweep, the
#   kernel a plan made now runs. The same benchmark on B200 with cuDNN 9.10.2 (@ cb560b9, 2025-07-16: 8k fwd 1171 /
#   bwd 943 of 2250 = 0.444; 4k 0.33) shows how much Blackwell attention gained in software within 2025 (+17% at 8k).
# A generation without measured training runs takes a fitted generation's in-training attention efficiency scaled by
# the ratio of the two kernels' fwd+bwd share of peak (benchmarks/fidelity.py transfer_efficiency): 0.519 on GB200
# against 0.496 on H200.
ATTENTION_KERNEL_BENCH: dict[str, tuple[str, float, float]] = {
    "hopper": ("h200", 572.9, 463.5),
    "blackwell": ("gb200", 1584.0, 1211.0),
}
# Head dim of those benchmarks (and of nearly every calibration run): a generation's ``attention`` share is stated
# there; ``Efficiency.attention_d64`` moves a smaller head dim off it (attention_cost.head_dim_factor).
ATTENTION_REF_HEAD_DIM = 128
# Keys per query of that benchmark (8192 tokens, causal): where a generation's ``attention`` share is stated when its
# kernel's saturation in sequence length is modelled (``Efficiency.attention_half_keys``, attention_cost.attention_kernel_factor).
ATTENTION_REF_KEYS = 4096.0
# The Blackwell benchmark's sweep, 4k-128k tokens (GB200, the CSV above): tokens -> (forward, backward) TFLOP/s. Its
# fwd+bwd share of peak rises 0.45 (4k) -> 0.52 (8k) -> 0.57 (32k), then falls to 0.50 at 128k (H200's, same file @
# b740542: 0.47 -> 0.50 -> 0.53, flat on). Its 8k row is GB200's side of gpu_facts.attention_share_ratio; the
# saturation ``attention_half_keys`` is fitted to the newer cuDNN 9.19.1 sweep, 2k-32k (benchmarks/gpu_facts.py
# ATTENTION_SWEEP_919: this one's x/(x + h) fit on 4k-128k, 334, is bent by the 64k-128k fall and priced 2k 1.27x fast).
BLACKWELL_ATTENTION_SWEEP: tuple[str, dict[int, tuple[float, float]]] = ("gb200", {
    4096: (1386.0, 1054.0), 8192: (1584.0, 1211.0), 16384: (1668.0, 1304.0),
    32768: (1681.0, 1348.0), 65536: (1573.0, 1229.0), 131072: (1467.0, 1188.0),
})


class Efficiency(_Frozen):
    """Physical efficiency parameters of one cluster and its training software (one set per GPU generation
    in the catalog; ``autoplan calibrate`` refits them to a user's own runs).

    Each field has a measured meaning (COST_MODEL.md §1-2; values and sources in ``gpus.yaml``)."""

    gemm_max: float = Field(gt=0, le=1, description="achieved fraction of dense peak on asymptotically large GEMMs")
    gemm_half_dim: float = Field(
        ge=0, description="GEMM dimension at which one saturation factor x/(x + x½) is 1/2 (elements)"
    )
    attention: float = Field(gt=0, le=1, description="fused (flash) attention core: achieved fraction of bf16 peak "
                             "on its causal FLOPs")
    link_bus: float = Field(gt=0, le=1.2, description="achieved bus-bandwidth fraction of the scale-up link "
                            "(nccl-tests busbw / nominal per-direction NVLink; > 1 possible with NVLS)")
    nic_bus: float = Field(gt=0, le=1, description="achieved fraction of NIC line rate")
    fp8_gemm_speedup: float = Field(ge=1, description="achieved fp8/bf16 GEMM speed-up (≤ the peak ratio)")
    dp_overlap: float = Field(ge=0, le=1, description="fraction of DP/FSDP traffic that can hide under the "
                              "compute window it overlaps (the rest is the last bucket's tail)")
    memory_bound_fraction: float = Field(
        ge=0, description="extra non-GEMM time as a fraction of GEMM time, for kernels the operator graph does not "
        "cost by their HBM traffic (0 in the catalog: norms, element-wise ops, softmax, loss and fp8 casts are "
        "costed by bytes / (HBM bandwidth × hbm_bus))"
    )
    moe_dispatcher: MoeDispatcher = Field(
        default="alltoall", description="MoE token dispatch: 'alltoall' sends every routed copy (Megatron's "
        "alltoall dispatcher); 'deepep' sends a token once per remote node and forwards it over NVLink, in fp8 "
        "under fp8 training (DeepEP, DeepSeek-V3 report §3.2.2, §3.3.3), on SMs taken from compute; 'hybridep' "
        "likewise per remote NVLink domain, bf16 (cost_models.moe)")
    moe_a2a_overlap: bool = Field(default=False, description="EP all-to-all overlapped with another micro-batch's "
                                  "compute (Megatron-Core --overlap-moe-expert-parallel-comm; always with DualPipe)")
    moe_imbalance: float = Field(
        default=1.15, ge=1, description="MoE load imbalance ρ: busiest / average expert-rank tokens (COST_MODEL §4)"
    )
    moe_host_s_per_expert: float = Field(
        default=0.0, ge=0, description="host (CPU) seconds to issue one local routed expert's work in one MoE layer, "
        "forward + backward, per micro-batch: Transformer Engine's GroupedLinear loops over its experts on the host "
        "(grouped_linear.py) and Megatron-Core's dropless dispatcher syncs host and device in every MoE layer "
        "(token_dispatcher.py preprocess): the forward's expert issue overlaps only the device work after that sync, "
        "the rest runs at max(device time, host time) (ep_comm.host_bound_s); "
        "only where no CUDA graph holds the experts (cost_models.moe.moe_layer_host_issued); plus "
        "moe_host_s_per_layer. Default 0 (not priced); the catalog's Megatron-Core value is a fit on public "
        "Megatron-Bridge MoE runs "
        "(gpus.yaml frameworks.megatron, benchmarks/fidelity.py fit_moe_host); `autoplan calibrate` fits it on "
        "one's own runs")
    moe_host_s_per_layer: float = Field(
        default=0.0, ge=0, description="host (CPU) seconds one MoE layer's issue takes per micro-batch, forward + "
        "backward, whatever its local experts: the dispatcher's permutes, all-to-alls and its per-layer sync, the "
        "grouped-GEMM modules' per-call setup; added to moe_host_s_per_expert × local experts (ep_comm.host_bound_s), "
        "priced where that is. Default 0; the catalog's Megatron-Core value is fitted with moe_host_s_per_expert "
        "(gpus.yaml frameworks.megatron, benchmarks/fidelity.py fit_moe_host)")
    hbm_bus: float = Field(default=0.85, gt=0, le=1, description="achieved fraction of HBM bandwidth by streaming "
                           "(memory-bound) kernels, as BabelStream/STREAM copy measures it")
    tp_overlap: float = Field(default=0.0, ge=0, le=1, description="fraction of TP/SP communication hidden behind "
                              "GEMMs where no per-collective model prices it (torchtitan async TP; the intra-op search's "
                              "per-op TP pricing; Megatron's userbuffers are priced per collective: te_userbuffers); "
                              "0 = no TP overlap in this stack: all on the critical path")
    nvls_bus: float = Field(default=0.0, ge=0, le=1.5, description="NVLink SHARP (NVLS) all-reduce bus bandwidth "
                            "/ nominal link, inside one NVLink domain; 0 = no NVLS (ring at link_bus)")
    a2a_link_ratio: float | None = Field(default=None, gt=0, le=1.2, description="NCCL all-to-all bus bandwidth "
                                         "(nccl-tests alltoall_perf busbw = algbw·(n−1)/n) over the ring all-reduce's "
                                         "(link_bus) inside one NVLink domain: the rate of Megatron's alltoall "
                                         "dispatcher and of Ulysses / Mamba all-to-alls over NVLink is link·link_bus·"
                                         "this (ep_comm.moe_all_to_all_parts, collectives.link_all_to_all_bandwidth), "
                                         "so a profile or calibration that moves link_bus moves it too; unset: 1 (the "
                                         "ring's)")
    compiled: bool = Field(default=True, description="element-wise kernels fused (TE / torch.compile); false = "
                           "PyTorch eager, whose norms, rotary and SwiGLU make several HBM passes (counted per op: "
                           "cost_models/op_traffic.py EAGER_*)")
    attention_fa2: bool = Field(default=False, description="the fused attention is FlashAttention-2 (PyTorch SDPA's "
                                "flash backend) rather than cuDNN / Transformer Engine fused attention: × FA2_VS_CUDNN")
    attention_measures_fa2: bool = Field(default=False, description="the generation's ``attention`` figure is itself "
                                         "FlashAttention-2's (not a cuDNN measurement): a stack running FA2 takes it "
                                         "as it is, without × FA2_VS_CUDNN")
    flash_attention: bool = Field(default=True, description="fused attention kernel; false = the unfused path (QKᵀ "
                                  "and AV as batched GEMMs over the full s×s scores, softmax/dropout through HBM)")
    attention_half_keys: float | None = Field(default=None, gt=0, description="keys per query at which the fused "
                                              "attention kernel reaches half its long-sequence throughput; set: "
                                              "`attention` is the share at ATTENTION_REF_KEYS and the kernel follows "
                                              "x/(x + half) in the keys it sees (attention_cost.attention_kernel_factor); "
                                              "unset: `attention` holds at every length (ring CP steps aside)")
    attention_d64: float | None = Field(default=None, gt=0.5, le=1, description="fused attention kernel throughput "
                                        "at head dim 64 over head dim 128 (ATTENTION_REF_HEAD_DIM) at equal keys per "
                                        "query, forward + backward: per score the kernel pays the softmax (exp, max, "
                                        "scale: SFU/ALU) once and the MMAs in proportion to d, so throughput ∝ "
                                        "d/(d + d½); this ratio sets d½ (attention_cost.head_dim_factor). Head dims "
                                        ">= 128 keep the measured d-128 share; unset: no head-dim dependence")
    mcore_glue_time_ratio: float = Field(default=1.0, ge=1.0, le=5.0, description="device time of Megatron-Core's "
                                         "eager glue kernels (GPT-OSS's expert clamp, fc2's per-expert bias, YaRN's "
                                         "op-by-op RoPE: op_traffic.MCORE_EXPERT_CLAMP_BYTES / MCORE_EXPERT_BIAS_BYTES"
                                         " / MCORE_UNFUSED_ROTARY_BYTES) over their bytes at the streaming rate "
                                         "(hbm_bus): the bytes count what the code reads and writes, this what the "
                                         "kernels take to move them (op_traffic.op_traffic_bytes ``glue_ratio``); "
                                         "1: at the streaming rate")
    attention_efficient_fwd: float | None = Field(default=None, gt=0, le=1, description="PyTorch SDPA's "
                                                  "memory-efficient (CUTLASS) kernel's forward throughput over "
                                                  "FlashAttention-2's at MLA head dims (q/k 192, v 128), each on its "
                                                  "own causal FLOPs: the kernel SDPA falls back to where flash refuses "
                                                  "a value head dim unequal to q/k's "
                                                  "(Runtime.sdpa_unequal_v_efficient; op_cost.op_compute); unset: "
                                                  "priced as FlashAttention-2")
    attention_efficient_bwd: float | None = Field(default=None, gt=0, le=1, description="the same, backward "
                                                  "(``attention_efficient_fwd``)")
    attention_flex_fwd: float | None = Field(default=None, gt=0, le=1, description="compiled FlexAttention's "
                                             "(torch.nn.attention.flex_attention, causal BlockMask, torchtitan 0.3.0's "
                                             "inductor options) forward throughput over cuDNN SDPA's, equal q/k and v "
                                             "head dims: the kernel torchtitan 0.3.0 runs its language models' "
                                             "attention on (Runtime.titan_attention; op_cost.titan_attention_rates); "
                                             "unset: priced at the cuDNN figure")
    attention_flex_bwd: float | None = Field(default=None, gt=0, le=1, description="the same, backward "
                                             "(``attention_flex_fwd``)")
    attention_flex_mla_fwd: float | None = Field(default=None, gt=0, le=1, description="``attention_flex_fwd`` at "
                                                 "MLA head dims (q/k 192, v 128: the kernel rounds q/k to 256)")
    attention_flex_mla_bwd: float | None = Field(default=None, gt=0, le=1, description="the same, backward "
                                                 "(``attention_flex_mla_fwd``)")
    attention_varlen_fwd: float | None = Field(default=None, gt=0, le=1, description="varlen FlashAttention's "
                                               "(torch.nn.attention.varlen.varlen_attn, causal) forward throughput "
                                               "over cuDNN SDPA's at head dim 64 with GQA: the kernel torchtitan 0.3.0 "
                                               "runs GPT-OSS's attention on (op_cost.titan_attention_rates); unset: "
                                               "priced at the cuDNN figure")
    attention_varlen_bwd: float | None = Field(default=None, gt=0, le=1, description="the same, backward "
                                               "(``attention_varlen_fwd``)")
    ssd_tflops: float | None = Field(default=None, gt=0, description="tensor-core TFLOP/s the Mamba-2 SSD kernels "
                                     "(mamba_ssm's Triton chunked scan, forward and backward) sustain: the op takes at "
                                     "least its FLOPs at this rate (cost_models.mamba.ssd_flops); unset: priced by its "
                                     "HBM bytes only")
    gpu_speed_sigma: float = Field(default=0.0, ge=0, le=0.2, description="relative standard deviation of the "
                                   "sustained speed of identical GPUs (manufacturing and power-management spread): a "
                                   "synchronous job runs at its slowest GPU's pace (cost_models.gemm.straggler_pace)")


# Default memory headroom: 5% of HBM (4 GiB on an 80 GiB GPU). The memory model's error against published peaks
# (benchmarks/fidelity.py) is of that order, and the caching allocator's transient spikes (NCCL stream syncs,
# optimizer step temporaries) are not in a peak summed from tensors. `--memory-headroom` changes it.
DEFAULT_MEMORY_HEADROOM = 0.05


class ClusterSpec(_Frozen):
    """A homogeneous, rail-optimized cluster (one NIC per GPU)."""

    gpu: GPUSpec
    num_gpus: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    nvlink_domain_size: int = Field(gt=0, description="GPUs reachable over NVLink (8 HGX, 72 NVL72)")
    inter_node_gbps: float = Field(gt=0, description="scale-out bandwidth per GPU, Gbit/s")
    efficiency: Efficiency
    memory_headroom: float = Field(
        default=DEFAULT_MEMORY_HEADROOM, ge=0, description="HBM kept free by every plan: a fraction of HBM when "
        "< 1, GiB when >= 1 (cost_models.memory: the model's own error and allocator spikes)")

    @model_validator(mode="after")
    def _check(self) -> "ClusterSpec":
        g = self.gpus_per_node
        if self.nvlink_domain_size % g and g % self.nvlink_domain_size:
            raise ValueError(
                f"nvlink_domain_size ({self.nvlink_domain_size}) and gpus_per_node ({g}) must divide one another; "
                f"valid: {', '.join(str(d) for d in range(1, g + 1) if g % d == 0)} or a multiple of {g}"
            )
        if self.num_gpus > g and self.num_gpus % g:
            below = self.num_gpus // g * g
            raise ValueError(
                f"num_gpus ({self.num_gpus}) must be a multiple of gpus_per_node ({g}); valid: num_gpus={below}, "
                f"num_gpus={below + g} (or a gpus_per_node that divides {self.num_gpus})"
            )
        return self

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def hbm_bytes(self) -> float:
        return self.gpu.hbm_gib * 2**30

    @property
    def memory_headroom_gib(self) -> float:
        h = self.memory_headroom
        return h * self.gpu.hbm_gib if h < 1 else h

    @property
    def memory_limit_gib(self) -> float:
        """What a plan may use per GPU: HBM less the headroom (``fits`` compares the device peak with it)."""
        return max(0.0, self.gpu.hbm_gib - self.memory_headroom_gib)


class JobSpec(_Frozen):
    global_batch_size: int = Field(default=1024, gt=0, description="sequences per optimizer step")
    seq_len: int = Field(default=8192, gt=0, description="tokens per sequence")
    precision: Precision = "bf16"
    optimizer: Literal["adam"] = "adam"

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


def zero_stage_is_not_a_bool(v: object) -> object:
    """A ``mode="before"`` check for ``zero_stage`` fields: Literal[0, 1, 2, 3] would take False/True as 0/1."""
    if isinstance(v, bool):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {v}")
    return v


# The rules of a ``recompute_modules`` field (Megatron --recompute-modules): ``ParallelConfig``'s and the search's pin
# (``autoplan.schema.ParallelPins``) apply these same functions.
def recompute_modules_list(v: object) -> object:
    """A ``mode="before"`` check: a JSON list is the tuple (strict mode takes no list for a tuple); a module named twice
    is refused: Megatron only tests membership (``"mlp" in config.recompute_modules``,
    megatron/core/transformer/transformer_layer.py:445, attention.py:330 @core_v0.16.1), so a repeat requests nothing
    and is a slip for another module."""
    v = tuple(v) if isinstance(v, list) else v
    if isinstance(v, tuple) and (err := recompute_module_names_error(v)) is not None:
        raise ValueError(err)
    return v


def recompute_module_names_error(names: tuple[object, ...]) -> str | None:
    """What is wrong with ``names`` as Megatron's --recompute-modules (the allowed modules of megatron/core/transformer/
    transformer_config.py:1198-1211 @ core_v0.16.1: ``RECOMPUTE_MODULES``), or None: the first name that is not a module
    (with the nearest one), then a repeat. The CLI flag and a request's ``parallel.recompute_modules`` say the same."""
    if all(isinstance(n, str) for n in names) and _RECOMPUTE_SET.issuperset(names) and len(set(names)) == len(names):
        return None  # the common case, checked at once (every ParallelConfig with modules asks it)
    bad = next((n for n in names if n not in RECOMPUTE_MODULES), None)
    if bad is not None:
        close = difflib.get_close_matches(str(bad), RECOMPUTE_MODULES, n=1)
        return (f"{str(bad)!r} is not a Megatron recompute module (valid: {', '.join(RECOMPUTE_MODULES)})"
                + (f"; nearest: {close[0]}" if close else ""))
    return repeated_error(names, "module")


def canonical_recompute_modules(v: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """A ``mode="after"`` step: Megatron's order, each once (the set is what Megatron reads): equal plans compare
    equal."""
    return None if v is None else tuple(m for m in RECOMPUTE_MODULES if m in v)


def modules_imply_selective(data: object) -> object:
    """A ``mode="before"`` model step: modules given without a recompute mode are Megatron's selective recompute; an
    empty list under selective (or none) recomputes nothing (Megatron checks each module's name in the list,
    transformer_layer.py / mlp.py): the plan is recompute 'none' and says so."""
    if not isinstance(data, dict) or data.get("recompute_modules") is None:
        return data
    if len(data["recompute_modules"]) == 0 and data.get("recompute") in (None, "selective"):
        return {**data, "recompute": "none", "recompute_modules": None}
    if data.get("recompute") is None:
        return {**data, "recompute": "selective"}
    return data


def recompute_modules_error(recompute: str | None, modules: tuple[str, ...] | None) -> str | None:
    """Modules under a recompute mode other than selective: Megatron reads them only there."""
    if modules is None or recompute == "selective":
        return None
    return (f"recompute_modules with recompute '{recompute}': Megatron recomputes modules only under "
            "--recompute-granularity selective (transformer_config.py:1196); use recompute 'selective' or drop "
            "recompute_modules")


def _vp_from_layout(data: dict) -> dict:
    """``vp`` a layout implies when none is given (Megatron-LM derives it the same way: arguments.py:516-527); a
    layout whose stages ``pp`` does not divide is left for ``_check`` to refuse."""
    if data.get("vp") is not None:
        return data
    from cost_models.errors import ConfigError
    from cost_models.pipeline_layout import layout_vp

    pp = data.get("pp", 1)
    try:
        return {**data, "vp": layout_vp(data["pipeline_layout"], pp)} if isinstance(pp, int) and pp > 0 else data
    except ConfigError:
        return data


def vp_schedule_error(vp: int, schedule: str) -> str | None:
    """Why ``vp`` virtual stages per pipeline rank and ``schedule`` contradict, None when they agree. Megatron has no
    schedule flag: a virtual pipeline size selects the interleaved schedule and its absence the plain 1F1B one
    (megatron-core pipeline_parallel/schedules.py:144-148 @ core_v0.16.1), so vp > 1 is interleaved and
    interleaved is vp > 1. Other schedules (zb-h1, dualpipe) are the targets' own rules."""
    if vp > 1 and schedule == "1f1b":
        return (f"vp={vp} virtual stages per pipeline rank run the interleaved schedule (megatron-core picks it "
                "whenever a virtual pipeline size is set, schedules.py:144-148), not schedule '1f1b'; valid: schedule "
                "interleaved (or omit it), or vp=1")
    if vp == 1 and schedule == "interleaved":
        # vp = 1 would be priced as 1F1B while the user asked for interleaving: refuse, never price it silently
        return ("schedule 'interleaved' needs vp >= 2 virtual stages per pipeline rank (Megatron "
                "--num-virtual-stages-per-pipeline-rank); pass vp (e.g. --vp 2), or schedule '1f1b'")
    return None


def interleave_pp_error(pp: int, vp: int, schedule: str) -> str | None:
    """Why an interleaved schedule (``vp`` > 1 virtual stages per rank) cannot run on ``pp`` ranks: it needs pp > 1
    (megatron-core: virtual pipeline stages split one rank's layers between pipeline peers); None when it can."""
    if schedule != "interleaved" or pp != 1:
        return None
    return (f"vp={vp} virtual stages per pipeline rank (the interleaved schedule) need pp > 1; valid: vp=1, or pp >= 2"
            if vp > 1 else "schedule 'interleaved' needs pp > 1; valid: schedule 1f1b, or pp >= 2")


class ParallelConfig(_Frozen):
    """One parallel layout. Checks that need the model or cluster live in ``cost_models.validate``."""

    tp: int = Field(default=1, gt=0, description="tensor-parallel degree")
    pp: int = Field(default=1, gt=0, description="pipeline stages")
    cp: int = Field(default=1, gt=0, description="context-parallel degree (ring attention)")
    ep: int = Field(default=1, gt=0, description="expert-parallel degree; divides tp*cp*dp (expert-TP 1)")
    vp: int = Field(default=1, gt=0, description="virtual (interleaved) stages per pipeline rank")
    micro_batch_size: int = Field(default=1, gt=0, description="sequences per micro-batch")
    sequence_parallel: bool = Field(default=True, description="Megatron SP (only meaningful with tp > 1)")
    zero_stage: Literal[0, 1, 2, 3] = Field(default=1, description="0 DDP, 1 distributed optimizer, 3 FSDP")
    hsdp_shard_size: int | None = Field(
        default=None, gt=0, description="ZeRO shard group size for HSDP; None = the whole dp*cp group"
    )
    recompute: Recompute = "none"
    schedule: Schedule = "1f1b"
    kv_replication: Literal["gather", "replicate"] = Field(
        default="gather", description="tp > num_kv_heads (GQA): 'gather' = Megatron-Core's QKV split evenly and "
        "all-gathered, one KV head per rank; 'replicate' = K/V weights whole on every TP rank (DTensor). Ignored "
        "when tp divides num_kv_heads")
    first_stage_layers: int | None = Field(default=None, gt=0, description="decoder layers on pipeline stage 0 "
                                           "(Megatron --decoder-first-pipeline-num-layers)")
    last_stage_layers: int | None = Field(default=None, gt=0, description="decoder layers on the last stage "
                                          "(Megatron --decoder-last-pipeline-num-layers)")
    account_for_embedding_in_pipeline_split: bool = Field(
        default=False, description="the embedding counts as one layer of the split (Megatron flag of that name)")
    account_for_loss_in_pipeline_split: bool = Field(
        default=False, description="the output layer + loss count as one layer of the split (Megatron flag)")
    pipeline_layout: str | None = Field(
        default=None, max_length=2000, description="Megatron --pipeline-model-parallel-layout: what each pipeline "
        "stage builds, E embedding, t decoder layer, m MTP layer, L loss, '|' between the pp*vp stages, repeats "
        "as (tt|)*30 or t*4 (e.g. 'Et|(tt|)*30mL'); sets vp to stages/pp (cost_models.pipeline_layout)")
    recompute_modules: tuple[RecomputeModule, ...] | None = Field(
        default=None, description="Megatron --recompute-modules under selective recompute (None: Megatron's "
        "default core_attn); giving them implies recompute 'selective' (cost_models.recompute)")

    _zero_stage_is_not_a_bool = field_validator("zero_stage", mode="before")(zero_stage_is_not_a_bool)

    @model_validator(mode="before")
    @classmethod
    def _interleave_when_vp(cls, data: object) -> object:
        """``vp > 1`` implies the interleaved schedule (the only one that uses virtual stages)."""
        if isinstance(data, dict) and isinstance(data.get("pipeline_layout"), str):
            data = _vp_from_layout(data)
        data = modules_imply_selective(data)
        if isinstance(data, dict) and isinstance(data.get("vp"), int) and data["vp"] > 1:
            if data.get("schedule") is None:  # vp > 1 is the interleaved schedule (vp_schedule_error)
                data = {**data, "schedule": "interleaved"}
            elif (err := vp_schedule_error(data["vp"], str(data["schedule"]))) is not None:
                if data.get("pipeline_layout") is not None:  # vp was read from the layout, not given
                    err = f"pipeline_layout {data['pipeline_layout']!r:.60} gives vp={data['vp']}: " + err
                raise ValueError(err)
        return data

    _modules_list = field_validator("recompute_modules", mode="before")(recompute_modules_list)
    _canonical_modules = field_validator("recompute_modules", mode="after")(canonical_recompute_modules)

    @model_validator(mode="after")
    def _check(self) -> "ParallelConfig":
        err = interleave_pp_error(self.pp, self.vp, self.schedule)
        if err is not None and self.pipeline_layout is not None:  # vp was read from the layout, not given
            raise ValueError(f"pipeline_layout {self.pipeline_layout!r:.60} lists {self.vp} stages: on pp=1 that is "
                             f"vp={self.vp} virtual stages per rank, which need pp > 1; valid: pp >= 2, or a layout of "
                             "one stage (no '|')")
        if err is not None:
            raise ValueError(err)
        if (err := recompute_modules_error(self.recompute, self.recompute_modules)) is not None:
            raise ValueError(err)
        if self.pipeline_layout is not None:
            from cost_models.pipeline_layout import layout_vp

            vp = layout_vp(self.pipeline_layout, self.pp)  # ConfigError (a ValueError) naming Megatron's rule
            if vp != self.vp:
                raise ValueError(f"vp={self.vp} conflicts with pipeline_layout, which lists {vp * self.pp} stages "
                                 f"= pp {self.pp} x vp {vp} (megatron-core transformer_config.py:1340-1352); "
                                 f"omit vp or pass vp={vp}")
            fixed = [k for k in ("first_stage_layers", "last_stage_layers") if getattr(self, k) is not None] + [
                k for k in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
                if getattr(self, k)]
            if fixed:
                raise ValueError(f"pipeline_layout cannot be set with {', '.join(fixed)}: the layout places every "
                                 "layer itself (megatron-core transformer_config.py:1307-1324)")
        if (err := vp_schedule_error(self.vp, self.schedule)) is not None:
            raise ValueError(err)
        return self

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    def dp(self, num_gpus: int) -> int:
        return num_gpus // self.model_parallel_size
