"""Hugging Face ``config.json`` → :class:`~cost_models.specs.ModelSpec`.

Supported ``model_type``: llama, llama4 (and llama4_text: the text decoder), mistral, mixtral, qwen2, qwen3,
qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, gpt2, gpt_neox, bloom, gpt_oss, nemotron (Nemotron-4, Minitron),
nemotron_h (hybrid Mamba-2 stacks: ``ModelSpec.hybrid_pattern``), qwen3_next (Gated DeltaNet / gated attention:
``ModelSpec.gdn``),
glm4_moe (GLM-4.5/4.6/4.7), olmoe, and DeepSeek sparse attention over MLA: deepseek_v32 (DeepSeek-V3.2) and
glm_moe_dsa (GLM-5; ``ModelSpec.dsa``). Each family's key names and defaults follow its ``transformers``
configuration class. Approximations (all small; the parameter-count tests state the tolerances):

- **MLA** (deepseek_v2/v3): parameters and FLOPs are exact through ``ModelSpec.mla``; for sharding and
  activations MLA is treated as MHA with ``num_kv_heads = num_attention_heads`` and
  ``head_dim = v_head_dim`` (see ``MLASpec``). The multi-token-prediction module
  (``num_nextn_predict_layers``) is not counted.
- **Qwen2-MoE shared expert**: one shared expert of width ``shared_expert_intermediate_size``; ModelSpec
  has one expert width, so it becomes ``num_shared_experts = round(shared_width / moe_intermediate_size)``
  experts (exact for the public checkpoints: 5632 = 4 x 1408, 20480 = 8 x 2560). Its sigmoid gate
  (``shared_expert_gate``, ``hidden_size`` weights per layer) is ``ArchSpec.shared_expert_gate``.
- **MoE layer placement**: HF's ``mlp_only_layers``/``decoder_sparse_step`` (Qwen) and
  ``first_k_dense_replace``/``moe_layer_freq`` (DeepSeek) are translated to ModelSpec's
  ``first_dense_layers``/``moe_layer_freq`` only when that reproduces the same set of MoE layers exactly;
  otherwise the config is rejected.
- **Ignored small tensors**: Qwen3's per-head q/k RMSNorms (2·head_dim per layer), BLOOM's embedding
  LayerNorm (2·hidden), Llama's ``attention_bias`` on the output projection (hidden per layer) and
  a Llama ``mlp_bias`` without ``attention_bias`` (with both, every linear has a bias: ``linear_bias``); the
  last two change the model, so each is an ``HFConfigWarning``.
- ``head_dim`` equal to ``hidden_size / num_attention_heads`` is normalized to ``None`` so a config and
  the matching catalog entry give identical specs.

Architecture facts (``ModelSpec.arch``: RoPE base and scaling, norm epsilon, q/k norm, sliding window,
activation, dropout, router, MTP depth) are read for every family. Nothing is dropped silently: a key the
family's reader neither reads nor knows to be harmless (token ids, dtype, cache flags, ...) is named in an
``HFConfigWarning``; a value autoplan cannot represent (an unknown ``rope_scaling`` type, a per-layer window
pattern other than "every N-th layer full" (``ArchSpec.full_attention_every``), an unsupported activation or
router) is a ``UserInputError`` naming the key and the supported values.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autoplan.catalog.spec_file import validate
from autoplan.errors import UserInputError
from cost_models.specs import MLASpec, ModelSpec

_MISSING = object()
_LAYER_BOUND = 1 << 16  # far above any model; keeps list(range(layers)) small for a corrupted file


class HFConfigWarning(UserWarning):
    """A config.json key autoplan's loader did not read (it may change the model autoplan plans for)."""


class HFModelPartWarning(UserWarning):
    """A part of the published model autoplan does not plan (Llama 4's vision tower): the plan is the rest's."""


# Keys that never change the trained architecture: bookkeeping, token ids, storage dtype and format,
# inference-only switches and heads autoplan does not plan (GPT-2's sequence-summary head).
HARMLESS_KEYS = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "sep_token_id", "decoder_start_token_id",
    "use_cache", "initializer_range", "initializer_factor", "pretraining_tp", "output_router_logits",
    "attn_implementation", "_attn_implementation_autoset", "auto_map", "quantization_config", "ep_size",
    "max_position_embeddings", "n_ctx", "task_specific_params", "summary_activation", "summary_first_dropout",
    "summary_proj_to_labels", "summary_type", "summary_use_proj", "classifier_dropout", "id2label", "label2id",
    "tokenizer_class", "return_dict", "output_attentions", "output_hidden_states", "torchscript",
    "is_decoder", "use_return_dict", "chunk_size_feed_forward",
    # Megatron-era fusion switches in BLOOM's config: kernels, not the math
    "masked_softmax_fusion", "bias_dropout_fusion", "skip_bias_add", "skip_bias_add_qkv",
    "attention_softmax_in_fp32", "slow_but_exact", "offset_alibi",
})

# Keys that mark a mapping as a Hugging Face config rather than an autoplan spec.
HF_MARKER_KEYS = frozenset(
    {"model_type", "architectures", "transformers_version", "_name_or_path", "num_hidden_layers", "n_layer"}
)


class _Config:
    """A config.json mapping with lookups that fail with a message naming the file and key."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data = data
        self.source = source
        self.model_type = str(data.get("model_type"))
        self.read: set[str] = set()  # keys a family reader looked at (HARMLESS_KEYS aside)

    def seen(self, *keys: str) -> None:
        """Mark ``keys`` as understood without reading a value (e.g. a flag checked elsewhere)."""
        self.read.update(keys)

    def error(self, key: str, value: Any, supported: str) -> UserInputError:
        return UserInputError(f"{self.source}: {key}={value!r} is not supported for model_type "
                              f"'{self.model_type}' ({supported})")

    def disagree(self, key: str, value: Any, other: str, other_value: Any, why: str = "") -> UserInputError:
        """Two keys holding one fact with different values: both named (which one is wrong is the user's to say)."""
        return UserInputError(f"{self.source}: {key}={value!r} and {other}={other_value!r} disagree"
                              f"{f' ({why})' if why else ''}; give one of them")

    def float(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserInputError(f"{self.source}: key '{key}' must be a number, got {value!r}")
        return float(value)

    def _req(self, *keys: str) -> Any:
        """The first of ``keys`` present with a non-null value (alternatives are synonyms)."""
        self.read.update(keys)
        for key in keys:
            if self.data.get(key) is not None:
                return self.data[key]
        names = " or ".join(f"'{k}'" for k in keys)
        raise UserInputError(f"{self.source}: missing key {names} (model_type '{self.model_type}')")

    def get(self, key: str, default: Any) -> Any:
        self.read.add(key)
        value = self.data.get(key, _MISSING)
        return default if value is _MISSING or value is None else value

    def flag(self, key: str, default: bool, int_reason: str = "") -> bool:
        """A JSON boolean under ``key`` (``default`` when absent or null). Anything else is refused, as transformers'
        strict config dataclasses refuse it ("expected bool", e.g. ``Llama4TextConfig`` @ 5.24.0): read for its truth
        value a string such as "false" would be true. ``int_reason``: why an integer is taken as its truth value
        (a published file that writes one), said in the refusal."""
        value = self.get(key, default)
        if isinstance(value, bool):
            return value
        if int_reason and isinstance(value, int):
            return bool(value)
        ints = f", or an integer read as its truth value ({int_reason})" if int_reason else ""
        raise UserInputError(f"{self.source}: key '{key}' must be true or false{ints}, got {value!r}")

    def int_list(self, key: str) -> list[int]:
        """A list of integers under ``key`` (empty when absent)."""
        value = self.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise UserInputError(f"{self.source}: key '{key}' must be a list of integers, got {value!r}")
        return value

    def layers(self, *keys: str, default: int | object = _MISSING) -> int:
        """The decoder depth, bounded before any per-layer list is built from it (the planner's own limit,
        ``autoplan.schema.MAX_NUM_LAYERS``, is checked later on the spec)."""
        n = self.int(*keys, default=default, minimum=1)
        if n > _LAYER_BOUND:
            raise UserInputError(f"{self.source}: key '{keys[0]}' = {n} is over {_LAYER_BOUND} layers")
        return n

    def int(self, *keys: str, default: int | object = _MISSING, minimum: int | None = None) -> int:
        """An integer under the first present of ``keys`` (or ``default`` when none is); ``minimum``
        guards values used as divisors, which ModelSpec's own validation would see too late."""
        self.read.update(keys)
        present = [k for k in keys if self.data.get(k) is not None]
        if not present and isinstance(default, int):
            return default
        value = self._req(*keys)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise UserInputError(f"{self.source}: key '{present[0]}' must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise UserInputError(f"{self.source}: key '{present[0]}' must be >= {minimum}, got {value!r}")
        return int(value)


def _head_dim(c: _Config, hidden: int, heads: int) -> int | None:
    """Explicit ``head_dim`` only when it differs from hidden / heads."""
    if c.get("head_dim", None) is None:
        return None
    head_dim = c.int("head_dim")
    return None if hidden % heads == 0 and head_dim == hidden // heads else head_dim


def _moe_layout(num_layers: int, moe_layers: list[int], c: _Config) -> tuple[int, int]:
    """``(first_dense_layers, moe_layer_freq)`` whose ``ModelSpec.is_moe_layer`` marks exactly
    ``moe_layers``. Example: 61 layers, MoE from layer 3 on → ``(3, 1)``; every 2nd layer from
    layer 1 (HF ``decoder_sparse_step=2``) → ``(0, 2)``."""
    first_moe = moe_layers[0]
    for freq in range(1, num_layers + 1):
        first_dense = first_moe - (freq - 1)
        if first_dense < 0:
            break
        pattern = [i for i in range(first_dense, num_layers) if (i - first_dense) % freq == freq - 1]
        if pattern == moe_layers:
            return first_dense, freq
    raise UserInputError(
        f"{c.source}: MoE layers {moe_layers} cannot be expressed as leading dense layers followed by "
        "every k-th layer (ModelSpec first_dense_layers / moe_layer_freq)"
    )


def _moe_fields(c: _Config, num_layers: int, moe_layers: list[int], **fields: Any) -> dict[str, Any]:
    """MoE fields of ModelSpec, or none (dense) when no layer is MoE."""
    if not moe_layers or not fields.get("num_experts"):
        return {}
    first_dense, freq = _moe_layout(num_layers, moe_layers, c)
    return {**fields, "first_dense_layers": first_dense, "moe_layer_freq": freq}


# ---- architecture facts (ModelSpec.arch) ----------------------------------------------------------

_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
_ROPE_SCALING_KEYS = {
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "truncate"},
    # transformers 5.24.0 modeling_rope_utils.py: linear reads only factor (:186-190); dynamic factor and the
    # config's max_position_embeddings (:329-341), never original_max_position_embeddings
    "linear": {"factor"},
    "dynamic": {"factor"},
}
_ROPE_TYPES = "supported: default, linear, dynamic, llama3, yarn"


def _activation(c: _Config, key: str, default: str, family: Mapping[str, str] | None = None) -> str:
    """``key``'s activation; ``family``: names this family's reader takes besides ``_ACTIVATIONS`` (the error lists
    them too)."""
    names = {**_ACTIVATIONS, **(family or {})}
    value = c.get(key, default)
    if not isinstance(value, str) or value not in names:
        raise c.error(key, value, f"supported: {', '.join(sorted(names))}")
    return names[value]


def _rope_scaling(c: _Config, d: Any, key: str) -> dict[str, Any] | None:
    if not isinstance(d, Mapping):
        raise c.error(key, d, "expected a mapping with 'rope_type'")
    kind = d.get("rope_type", d.get("type"))
    if not isinstance(kind, (str, type(None))):
        raise c.error(f"{key}.rope_type", kind, _ROPE_TYPES)
    if kind in (None, "default"):
        return None
    if kind not in _ROPE_SCALING_KEYS:
        raise c.error(f"{key}.rope_type", kind, _ROPE_TYPES)
    wanted = _ROPE_SCALING_KEYS[kind]
    extra = sorted(set(d) - wanted - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
    if extra:
        warnings.warn(f"{c.source}: {key} keys {extra} are not read for rope_type '{kind}' "
                      f"(read: {sorted(wanted)})", HFConfigWarning, stacklevel=4)
    out: dict[str, Any] = {"type": kind}
    for k in wanted:
        if d.get(k) is not None:
            out[k] = d[k]
    if kind in ("linear", "dynamic"):
        return _interpolation(c, out, key)
    if "original_max_position_embeddings" not in out:
        raise UserInputError(f"{c.source}: {key} of rope_type '{kind}' needs 'original_max_position_embeddings'")
    return out


def _interpolation(c: _Config, out: dict[str, Any], key: str) -> dict[str, Any] | None:
    """Linear / dynamic-NTK scaling: ``factor`` a number >= 1 (transformers warns below, modeling_rope_utils.py:943);
    linear at factor 1 is plain RoPE (``ArchSpec`` drops it). Dynamic keeps the length it starts rescaling beyond."""
    factor = out.get("factor")
    if factor is None:
        raise UserInputError(f"{c.source}: {key} of rope_type '{out['type']}' needs 'factor' (a number >= 1)")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor < float("inf"):
        raise c.error(f"{key}.factor", factor, "a number >= 1")
    if out["type"] == "dynamic":
        if c.data.get("max_position_embeddings") is None:
            raise UserInputError(f"{c.source}: {key} of rope_type 'dynamic' needs 'max_position_embeddings' (the "
                                 "length beyond which transformers rescales RoPE)")
        out["max_position_embeddings"] = c.int("max_position_embeddings", minimum=1)
    return {**out, "factor": float(factor)}


def _rope(c: _Config, theta_default: float = 10000.0, scaling_default: Mapping[str, Any] | None = None,
          partial_default: float | None = None) -> dict[str, Any]:
    """RoPE base and scaling: ``rope_theta`` / ``rope_scaling`` (transformers 4.x) or ``rope_parameters`` (5.x);
    the defaults are the family's configuration class's (GptOssConfig: base 150000, YaRN). ``partial_default``: a
    family with partial RoPE (GLM-4.5, Nemotron) also reads a top-level ``partial_rotary_factor`` (4.x files), this
    where neither key is given; the two keys must agree."""
    params = c.get("rope_parameters", None)
    if isinstance(params, Mapping):
        theta = params.get("rope_theta", c.float("rope_theta", theta_default))
        if isinstance(theta, bool) or not isinstance(theta, (int, float)):
            raise c.error("rope_parameters.rope_theta", theta, "a number")
        scaling, key = params, "rope_parameters"
    else:
        theta, key = c.float("rope_theta", theta_default), "rope_scaling"
        scaling = c.get("rope_scaling", scaling_default)
    out: dict[str, Any] = {"rope_theta": float(theta)}
    if isinstance(params, Mapping) and params.get("partial_rotary_factor") is not None:
        fraction = params["partial_rotary_factor"]
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise c.error("rope_parameters.partial_rotary_factor", fraction, "a number in (0, 1]")
        out["rotary_fraction"] = float(fraction)
    if scaling is not None:
        rs = _rope_scaling(c, scaling, key)
        if rs is not None:
            out["rope_scaling"] = rs
    if partial_default is not None:
        fraction = c.float("partial_rotary_factor", out.get("rotary_fraction", partial_default))
        if out.setdefault("rotary_fraction", fraction) != fraction:
            raise c.disagree("partial_rotary_factor", fraction, "rope_parameters.partial_rotary_factor",
                             out["rotary_fraction"])
    return out


def _window(c: _Config, num_layers: int, *, qwen: bool, default: int | None = None) -> int | None:
    """The sliding window if every layer has it; ``None`` if none does; an error for a per-layer mix.
    Qwen (transformers ``Qwen2Config.layer_types``): with ``use_sliding_window``, layers
    ``>= max_window_layers`` slide. Mistral/Mixtral: ``sliding_window`` applies to every layer. ``default``: the
    configuration class's where the key is absent (``MistralConfig``: 4096)."""
    window = c.get("sliding_window", None) if "sliding_window" in c.data else default  # null: no window
    layer_types = c.get("layer_types", None)
    if qwen:
        if not c.flag("use_sliding_window", False):
            window = None
        else:
            first = c.int("max_window_layers", default=0)
            if 0 < first < num_layers:
                raise c.error("max_window_layers", first, f"a window on layers {first}..{num_layers - 1} only: "
                              "autoplan supports a window on every layer or none")
            if first >= num_layers:
                window = None
        c.seen("max_window_layers")
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise c.error("layer_types", layer_types, "a list of 'full_attention' / 'sliding_attention'")
        kinds = set(layer_types) or {"full_attention"}
        if kinds == {"full_attention"}:
            window = None
        elif kinds != {"sliding_attention"}:
            raise c.error("layer_types", sorted(kinds), "autoplan supports a window on every layer or none")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise c.error("sliding_window", window, "a positive integer or null")
    return window


def _every_nth(marked: list[bool]) -> int | None:
    """N >= 2 such that layer i is marked iff (i + 1) % N == 0 (layers N, 2N, ...: Megatron-Core's
    window_attn_skip_freq / no_rope_freq N), or None when the marks follow no such pattern."""
    n = len(marked)
    return next((every for every in range(2, n + 1) if marked == [(i + 1) % every == 0 for i in range(n)]), None)


def _layer_types(c: _Config, num_layers: int, default_full_every: int) -> int | None:
    """HF ``layer_types`` (one ``sliding_attention`` / ``full_attention`` per layer) as ``full_attention_every``
    N: layer i is full iff (i + 1) % N == 0 (Megatron-Core window_attn_skip_freq); 0 when every layer slides, None
    when none does. Absent: the configuration class's default pattern (GptOssConfig: even layers slide, N = 2)."""
    types = c.get("layer_types", None)
    if types is None:
        return default_full_every
    if not isinstance(types, list) or len(types) != num_layers or not set(types) <= {"sliding_attention",
                                                                                    "full_attention"}:
        raise c.error("layer_types", types, f"a list of {num_layers} 'sliding_attention' / 'full_attention'")
    full = [t == "full_attention" for t in types]
    if all(full):
        return None
    if not any(full):
        return 0
    if (every := _every_nth(full)) is not None:
        return every
    raise c.error("layer_types", types, "windowed layers with every N-th layer (N, 2N, ...) full: autoplan and "
                  "Megatron-Core's window_attn_skip_freq express that pattern (or a window on every layer)")


def _router(c: _Config, *, coeff_key: str, coeff_default: float, norm_default: bool) -> dict[str, Any]:
    """Softmax top-k routing with a batch load-balancing loss (Mixtral, Qwen-MoE)."""
    jitter = c.float("router_jitter_noise", 0.0)
    if jitter:
        raise c.error("router_jitter_noise", jitter, "only 0: input jitter is not modelled")
    return {"score_function": "softmax", "norm_top_k": c.flag("norm_topk_prob", norm_default),
            "aux_loss": "aux_loss", "aux_loss_coeff": c.float(coeff_key, coeff_default)}


def _deepseek_router(c: _Config) -> dict[str, Any]:
    """DeepSeek-V2/V3 gate (``modeling_deepseek.MoEGate``): softmax or sigmoid scores; ``greedy`` top-k,
    ``group_limited_greedy`` (V2: groups ranked by their best score) or ``noaux_tc`` (V3: a selection-only
    bias per expert, groups ranked by the sum of their top-2 scores); ``routed_scaling_factor``."""
    score = c.get("scoring_func", "softmax")
    if score not in ("softmax", "sigmoid"):
        raise c.error("scoring_func", score, "supported: softmax, sigmoid")
    method = c.get("topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise c.error("topk_method", method, "supported: greedy, group_limited_greedy, noaux_tc")
    groups, group_k = c.int("n_group", default=1), c.int("topk_group", default=1)
    grouped = method != "greedy" and groups > 1
    if grouped and method == "group_limited_greedy" and c.int("num_experts_per_tok") > group_k:
        warnings.warn(f"{c.source}: topk_method 'group_limited_greedy' ranks groups by their best expert; "
                      "Megatron and torchtitan rank them by the sum of their top experts", HFConfigWarning,
                      stacklevel=4)
    seq = c.flag("seq_aux", True)
    return {"score_function": score, "norm_top_k": c.flag("norm_topk_prob", False),
            "expert_bias": method == "noaux_tc", "num_groups": groups if grouped else 0,
            "group_top_k": group_k if grouped else 0, "top_k_scaling": c.float("routed_scaling_factor", 1.0),
            "aux_loss": "seq_aux_loss" if seq else "aux_loss", "aux_loss_coeff": c.float("aux_loss_alpha", 0.001),
            "fp32_logits": True}  # DeepseekV2/V3TopkRouter: F.linear on float32 (transformers 5.24 v3:135, v2:100)


def _llama_arch(c: _Config, num_layers: int, *, qwen: bool, qk_norm: bool, window: bool,
                window_default: int | None = None) -> dict[str, Any]:
    """``window``: the family has attention windows (LlamaConfig has none: a stray key is reported unread);
    ``window_default``: its configuration class's window where the key is absent."""
    return {**_rope(c), "norm_eps": c.float("rms_norm_eps", 1e-6), "qk_norm": qk_norm,
            "sliding_window": _window(c, num_layers, qwen=qwen, default=window_default) if window else None,
            "activation": _activation(c, "hidden_act", "silu"),
            "attention_dropout": c.float("attention_dropout", 0.0)}


# ---- families ---------------------------------------------------------------------------------


def _llama_like(c: _Config, *, qkv_bias: bool = False, qwen: bool = False, qk_norm: bool = False,
                window: bool = True, window_default: int | None = None,
                arch: dict[str, Any] | None = None) -> dict[str, Any]:
    """Llama/Mistral/Qwen decoder: RMSNorm, SwiGLU, rotary, untied by default."""
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads", minimum=1)
    attention_bias, mlp_bias = c.flag("attention_bias", False), c.flag("mlp_bias", False)
    if attention_bias != mlp_bias:  # LlamaAttention / LlamaMLP: o_proj follows attention_bias, the MLP mlp_bias
        dropped = ("o_proj's bias (attention_bias: Megatron's --add-qkv-bias covers q/k/v only)" if attention_bias
                   else "the MLP's biases (mlp_bias: Megatron biases every linear or none)")
        warnings.warn(f"{c.source}: {dropped} is not represented: the plan and the emitted configs train the model "
                      "without it", HFConfigWarning, stacklevel=3)
    n = c.layers("num_hidden_layers")
    return {
        "arch": {**_llama_arch(c, n, qwen=qwen, qk_norm=qk_norm, window=window, window_default=window_default),
                 **(arch or {})},
        **_decoder_shape(c, n, hidden, heads),
        "linear_bias": attention_bias and mlp_bias,
        "qkv_bias": qkv_bias or (attention_bias and not mlp_bias),
    }


def _decoder_shape(c: _Config, n: int, hidden: int, heads: int, *, ffn: int | object = _MISSING,
                   kv_heads: int | None = None) -> dict[str, Any]:
    """The shape keys Llama-style configs share (Llama, Mistral, Qwen, GPT-OSS): layers, widths, heads, vocab, tying
    (untied by default); ``ffn`` / ``kv_heads``: the family's defaults for an absent key (required / MHA if unset)."""
    return {
        "num_layers": n,
        "hidden_size": hidden,
        "ffn_hidden_size": c.int("intermediate_size", default=ffn),
        "num_attention_heads": heads,
        "num_kv_heads": c.int("num_key_value_heads", default=heads if kv_heads is None else kv_heads),
        "head_dim": _head_dim(c, hidden, heads),
        "vocab_size": c.int("vocab_size"),
        "tied_embeddings": c.flag("tie_word_embeddings", False),
    }


def _llama(c: _Config) -> dict[str, Any]:
    return _llama_like(c, window=False)


def _mistral(c: _Config) -> dict[str, Any]:
    # MistralConfig.sliding_window: every layer; 4096 where the file leaves the key out (transformers
    # models/mistral/configuration_mistral.py ``sliding_window=4096``), as transformers builds the model then
    return _llama_like(c, window_default=4096)


def _qwen2(c: _Config) -> dict[str, Any]:
    return _llama_like(c, qkv_bias=True, qwen=True)  # Qwen2Attention: q/k/v always have a bias, o_proj none


def _qwen3(c: _Config) -> dict[str, Any]:
    return _llama_like(c, qwen=True, qk_norm=True)  # Qwen3Attention: per-head RMSNorm on q and k


def _mixtral(c: _Config) -> dict[str, Any]:
    # MixtralConfig defaults: router_aux_loss_coef 0.001; top-k logits then softmax (renormalized)
    fields = _llama_like(c, arch={"router": _router(c, coeff_key="router_aux_loss_coef", coeff_default=0.001,
                                                     norm_default=True)})
    n = int(fields["num_layers"])
    return fields | _moe_fields(
        c, n, list(range(n)), num_experts=c.int("num_local_experts"), moe_top_k=c.int("num_experts_per_tok")
    )


def _qwen_moe(c: _Config, *, qkv_bias: bool, qk_norm: bool) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE: layer i is sparse iff i ∉ mlp_only_layers and (i+1) % decoder_sparse_step == 0.
    Router: softmax over all experts, top-k, renormalized iff norm_topk_prob (default false). Qwen2-MoE's shared
    expert output is scaled by sigmoid(shared_expert_gate(x)) (transformers Qwen2MoeSparseMoeBlock, every layer
    with a shared expert); Qwen3-MoE has no shared expert."""
    experts = c.int("num_experts")
    moe_width = c.int("moe_intermediate_size", minimum=1)
    shared = round(c.int("shared_expert_intermediate_size", default=0) / moe_width)
    router = _router(c, coeff_key="router_aux_loss_coef", coeff_default=0.001, norm_default=False)
    fields = _llama_like(c, qkv_bias=qkv_bias, qwen=True, qk_norm=qk_norm,
                         arch={"router": router, "shared_expert_gate": shared > 0})
    n = int(fields["num_layers"])
    step, dense_only = c.int("decoder_sparse_step", default=1, minimum=1), set(c.int_list("mlp_only_layers"))
    moe_layers = [i for i in range(n) if experts > 0 and i not in dense_only and (i + 1) % step == 0]
    return fields | _moe_fields(
        c,
        n,
        moe_layers,
        num_experts=experts,
        moe_top_k=c.int("num_experts_per_tok"),
        moe_ffn_hidden_size=moe_width,
        num_shared_experts=shared,
    )


# Qwen3-Next (transformers ``Qwen3NextConfig`` / ``Qwen3NextForCausalLM``, models/qwen3_next @ 5.24.0): a Qwen3-MoE
# decoder whose token mixer is Gated DeltaNet (``linear_attention``) on most layers and gated softmax attention
# (``full_attention``) on every ``full_attention_interval``-th (``ModelSpec.gdn``).
_QWEN3_NEXT_LAYERS = ("linear_attention", "full_attention")
_QWEN3_NEXT_WINDOW_KEYS = ("use_sliding_window", "sliding_window", "max_window_layers")


def _qwen3_next_full_every(c: _Config, n: int) -> int:
    """``layer_types`` (or, without it, ``full_attention_interval``, default 4: configuration_qwen3_next.py:127-135)
    as ``GatedDeltaNetSpec.full_attention_every`` N: layer i is full attention iff (i + 1) % N == 0."""
    types = c.get("layer_types", None)
    if types is None:
        every = c.int("full_attention_interval", default=4, minimum=1)
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    else:
        c.seen("full_attention_interval")  # transformers ignores it when layer_types is given
    if not isinstance(types, list) or len(types) != n or not set(types) <= set(_QWEN3_NEXT_LAYERS):
        raise c.error("layer_types", types, f"a list of {n} 'linear_attention' / 'full_attention'")
    full = [t == "full_attention" for t in types]
    every = _every_nth(full)
    if every is None:
        raise c.error("layer_types", types, "Gated DeltaNet layers with every N-th layer (N, 2N, ..., N >= 2) full "
                      "attention: autoplan's GatedDeltaNetSpec.full_attention_every and Megatron-Core's integer "
                      "linear_attention_freq express that pattern")
    return every


def _qwen3_next(c: _Config) -> dict[str, Any]:
    """Qwen3-Next: Qwen3-MoE's MoE (``_qwen_moe``: decoder_sparse_step, mlp_only_layers, one gated shared expert),
    per-head q/k RMSNorm, every norm zero-centred (``Qwen3NextRMSNorm``: weight 0, x·(1 + weight), :126-140 — the
    GDN's gated output norm excepted, ``Qwen3NextRMSNormGated``: weight 1, :59-76), a gated softmax attention
    (``Qwen3NextAttention``: q_proj twice as wide, sigmoid(gate) · attention before o_proj, :241-300), partial RoPE
    (``partial_rotary_factor``, default 0.25), head_dim default 256, and the Gated DeltaNet mixer on the
    ``linear_attention`` layers (``Qwen3NextGatedDeltaNet``, :583-627). transformers builds no sliding window for
    this family: ``use_sliding_window`` / ``sliding_window`` are not read by it, nor here."""
    inner = _Config({k: v for k, v in c.data.items() if k not in ("layer_types", *_QWEN3_NEXT_WINDOW_KEYS)},
                    c.source)
    fields = _qwen_moe(inner, qkv_bias=False, qk_norm=True)
    c.read |= inner.read
    c.seen(*_QWEN3_NEXT_WINDOW_KEYS)
    return _qwen_gdn_fields(c, fields)


def _qwen_gdn_fields(c: _Config, fields: dict[str, Any]) -> dict[str, Any]:
    """What Qwen3-Next and Qwen3.5 add to a Qwen3 decoder (``_qwen3_next``): head_dim default 256, partial RoPE
    (default 0.25), zero-centred norms, the attention output gate and the Gated DeltaNet layers."""
    hidden, heads = int(fields["hidden_size"]), int(fields["num_attention_heads"])
    head_dim = c.int("head_dim", default=256, minimum=1)  # Qwen3NextConfig.head_dim = 256
    fields["head_dim"] = None if hidden % heads == 0 and head_dim == hidden // heads else head_dim
    n = int(fields["num_layers"])
    fields["arch"] = {**fields["arch"], **_rope(c, partial_default=0.25), "norm_zero_centered_gamma": True,
                      "attention_output_gate": True}
    fields["gdn"] = {"num_key_heads": c.int("linear_num_key_heads", default=16, minimum=1),
                     "num_value_heads": c.int("linear_num_value_heads", default=32, minimum=1),
                     "key_head_dim": c.int("linear_key_head_dim", default=128, minimum=1),
                     "value_head_dim": c.int("linear_value_head_dim", default=128, minimum=1),
                     "conv_kernel": c.int("linear_conv_kernel_dim", default=4, minimum=1),
                     "full_attention_every": _qwen3_next_full_every(c, n)}
    return fields


# Qwen3.5 / Qwen3.6 (transformers models/qwen3_5, qwen3_5_moe @ 5.24.0): a vision-language model whose text decoder is
# Qwen3-Next's layer (the GDN in_proj split in four linears: the same weights, modeling_qwen3_5.py ``in_proj_qkv``,
# ``in_proj_z``, ``in_proj_b``, ``in_proj_a``).
_QWEN3_5_IGNORED = ("decoder_sparse_step", "mlp_only_layers", "norm_topk_prob")  # no Qwen3_5*TextConfig field
_QWEN3_5_TOP = ("text_config", "vision_config", "tie_word_embeddings", "image_token_id", "video_token_id",
                "vision_start_token_id", "vision_end_token_id")


def _qwen3_5_text(c: _Config, *, moe: bool) -> dict[str, Any]:
    """Qwen3.5's text decoder (``Qwen3_5TextConfig`` / ``Qwen3_5MoeTextConfig``): Qwen3-Next's layers with a dense
    SwiGLU MLP on every layer (qwen3_5: ``Qwen3_5MLP`` of intermediate_size) or an MoE on every layer (qwen3_5_moe:
    ``Qwen3_5MoeSparseMoeBlock``, one gated shared expert; its router always renormalises the top k,
    ``Qwen3_5MoeTopKRouter`` modeling_qwen3_5_moe.py:894-910, and the class has no decoder_sparse_step, mlp_only_layers
    or norm_topk_prob to change that: such keys are inert, as transformers leaves them). Its RoPE is M-RoPE
    (``rope_parameters.mrope_section``): on text tokens the three position rows are equal and it is 1-D RoPE
    (modeling_qwen3_5.py:178-200), which is what is planned."""
    drop = ("layer_types", *_QWEN3_NEXT_WINDOW_KEYS, *_QWEN3_5_IGNORED)
    data = {k: v for k, v in c.data.items() if k not in drop}
    if moe and data.get("intermediate_size") is None:
        # no dense MLP in this family (every layer MoE, Qwen3_5MoeTextConfig has no intermediate_size): ModelSpec's
        # dense width, unused by its layers, is the expert width
        data["intermediate_size"] = c.int("moe_intermediate_size", default=512, minimum=1)
    inner = _Config(data, c.source)
    if moe:
        fields = _qwen_moe(inner, qkv_bias=False, qk_norm=True)
        fields["arch"]["router"] = {**fields["arch"]["router"], "norm_top_k": True}
    else:
        fields = _llama_like(inner, qwen=True, qk_norm=True)
    c.read |= inner.read
    c.seen(*_QWEN3_NEXT_WINDOW_KEYS, *_QWEN3_5_IGNORED)
    return _qwen_gdn_fields(c, fields)


def _qwen3_5(c: _Config, *, moe: bool) -> dict[str, Any]:
    """Qwen3.5 as published (``Qwen3_5Config`` / ``Qwen3_5MoeConfig``: ``text_config`` and a ``vision_config``): the
    text decoder (``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``) is what autoplan plans and emits; the vision
    encoder and its merger are not (an ``HFModelPartWarning`` says so), as for Llama 4."""
    text = c.get("text_config", None)
    if not isinstance(text, Mapping):
        raise c.error("text_config", text, "a mapping (the Qwen3.5 text decoder's config)")
    kind = "qwen3_5_moe_text" if moe else "qwen3_5_text"
    inner = _Config({**text, "model_type": kind}, f"{c.source} text_config")
    fields = _qwen3_5_text(inner, moe=moe)
    tie = c.flag("tie_word_embeddings", False)
    if inner.flag("tie_word_embeddings", tie) != tie:  # absent or null in text_config: the top-level value
        raise c.disagree("tie_word_embeddings", tie, "text_config.tie_word_embeddings", text["tie_word_embeddings"])
    fields["tied_embeddings"] = tie or fields["tied_embeddings"]
    c.seen(*_QWEN3_5_TOP)
    _warn_unread(inner, c.model_type, stacklevel=4)
    if c.data.get("vision_config") is not None:
        warnings.warn(f"{c.source}: the vision encoder and merger (vision_config) are not planned: the plan, its "
                      f"prediction and the emitted configs are the text decoder's ({kind})", HFModelPartWarning,
                      stacklevel=3)
    return fields


def _deepseek(c: _Config) -> dict[str, Any]:
    """DeepSeek-V2/V3: MLA attention; layer i is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0."""
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads")
    mla: MLASpec = validate(
        MLASpec,
        {
            "q_lora_rank": c.int("q_lora_rank", default=0),  # null (V2-Lite) = no query compression
            "kv_lora_rank": c.int("kv_lora_rank"),
            "qk_nope_head_dim": c.int("qk_nope_head_dim"),
            "qk_rope_head_dim": c.int("qk_rope_head_dim"),
            "v_head_dim": c.int("v_head_dim"),
        },
        f"{c.source} (MLA)",
    )
    n, experts = c.layers("num_hidden_layers"), c.int("n_routed_experts", default=0)
    first_k, freq = c.int("first_k_dense_replace", default=0, minimum=0), c.int("moe_layer_freq", default=1, minimum=1)
    moe_layers = [i for i in range(n) if experts > 0 and i >= first_k and i % freq == 0]
    if c.flag("attention_bias", False):
        raise c.error("attention_bias", True, "MLA projections without biases only")
    c.seen("num_key_value_heads")  # MLA has no KV heads of its own (the config repeats num_attention_heads)
    arch = {**_rope(c), "norm_eps": c.float("rms_norm_eps", 1e-6), "activation": _activation(c, "hidden_act", "silu"),
            "attention_dropout": c.float("attention_dropout", 0.0), "mtp_layers": c.int("num_nextn_predict_layers",
                                                                                         default=0)}
    if experts:
        arch["router"] = _deepseek_router(c)
    fields = {
        "arch": arch,
        "num_layers": n,
        "hidden_size": hidden,
        "ffn_hidden_size": c.int("intermediate_size"),
        "num_attention_heads": heads,
        "num_kv_heads": heads,  # MLA approximated as MHA for sharding
        "head_dim": None if hidden == heads * mla.v_head_dim else mla.v_head_dim,
        "vocab_size": c.int("vocab_size"),
        "tied_embeddings": c.flag("tie_word_embeddings", False),
        "mla": mla,
    }
    return fields | _moe_fields(
        c,
        n,
        moe_layers,
        num_experts=experts,
        moe_top_k=c.int("num_experts_per_tok"),
        moe_ffn_hidden_size=c.int("moe_intermediate_size"),
        num_shared_experts=c.int("n_shared_experts", default=0),
    )


def _dsa_mlp_layers(c: _Config, fields: dict[str, Any]) -> dict[str, Any]:
    """DeepseekV32Config / GlmMoeDsaConfig place the MoE by ``mlp_layer_types`` ("dense" / "sparse" per layer),
    default ``first_k_dense_replace`` dense layers then all sparse (configuration_deepseek_v32.py:133-135 @ transformers
    5.24.0); neither has DeepSeek-V3's ``moe_layer_freq`` (a published file's ``moe_layer_freq: 1`` agrees with that
    layout; another value transformers would ignore, so it is refused)."""
    n = int(fields["num_layers"])
    if c.int("moe_layer_freq", default=1) != 1:
        raise c.error("moe_layer_freq", c.data["moe_layer_freq"], f"1 (model_type '{c.model_type}' has no such key: "
                      "mlp_layer_types places the MoE layers)")
    types = c.get("mlp_layer_types", None)
    if types is None:
        return fields
    if not isinstance(types, list) or len(types) != n or not set(types) <= {"dense", "sparse"}:
        raise c.error("mlp_layer_types", types, f"a list of {n} 'dense' / 'sparse'")
    moe = [i for i, t in enumerate(types) if t == "sparse"]
    fields = {k: v for k, v in fields.items() if k not in ("first_dense_layers", "moe_layer_freq")}
    if not moe or not fields.get("num_experts"):
        raise c.error("mlp_layer_types", types, "at least one 'sparse' layer and n_routed_experts > 0")
    first_dense, freq = _moe_layout(n, moe, c)
    return fields | {"first_dense_layers": first_dense, "moe_layer_freq": freq}


def _dsa_fields(c: _Config, n: int, *, index_heads: int, glm: bool) -> dict[str, Any]:
    """The lightning indexer (``DSASpec``): ``index_n_heads`` (default ``index_heads``, the configuration class's),
    ``index_head_dim`` 128, ``index_topk`` 2048; every layer ``indexed_attention`` (``layer_types``). GLM-MoE-DSA's
    per-layer ``indexer_types`` ("full" runs the indexer, "shared" reuses the previous full layer's top-k;
    GlmMoeDsaConfig.__post_init__: ``index_topk_pattern``, else ``index_topk_freq`` / ``index_skip_topk_offset``)
    must be the every-N-th pattern ``DSASpec.shared_every`` / ``shared_offset`` express."""
    types = c.get("layer_types", None)
    if types is not None and (not isinstance(types, list) or len(types) != n or set(types) != {"indexed_attention"}):
        raise c.error("layer_types", types, f"{n} x 'indexed_attention' (every layer of model_type "
                      f"'{c.model_type}' runs DSA)")
    dsa: dict[str, Any] = {"index_heads": c.int("index_n_heads", default=index_heads, minimum=1),
                           "index_head_dim": c.int("index_head_dim", default=128, minimum=1),
                           "index_topk": c.int("index_topk", default=2048, minimum=1)}
    if not glm:
        return dsa
    every, offset = c.int("index_topk_freq", default=1, minimum=1), c.int("index_skip_topk_offset", default=2, minimum=0)
    want = ["full" if max(i - offset + 1, 0) % every == 0 else "shared" for i in range(n)]
    kinds = c.get("indexer_types", None)
    pattern = c.get("index_topk_pattern", None)
    if kinds is None and pattern is not None:
        if not isinstance(pattern, (str, list)) or not all(p in ("F", "S", "full", "shared") for p in pattern):
            raise c.error("index_topk_pattern", pattern, "a string of F (full) / S (shared) per layer")
        kinds = [{"F": "full", "S": "shared"}.get(p, p) for p in pattern]
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != n or not set(kinds) <= {"full", "shared"}:
            raise c.error("indexer_types", kinds, f"a list of {n} 'full' / 'shared'")
        if kinds[0] != "full":
            raise c.error("indexer_types", kinds, "layer 0 'full' (a shared layer reuses an earlier full layer's "
                          "top-k)")
        fit = next(((e, o) for e in range(1, n + 1) for o in range(n + 1)
                    if kinds == ["full" if max(i - o + 1, 0) % e == 0 else "shared" for i in range(n)]), None)
        if fit is None:
            raise c.error("indexer_types", kinds, "'full' every N-th layer from an offset (GlmMoeDsaConfig "
                          "index_topk_freq / index_skip_topk_offset); autoplan has no other sharing pattern")
        every, offset = fit
        if "index_topk_freq" in c.data and want != kinds:
            raise c.disagree("indexer_types", kinds, "index_topk_freq / index_skip_topk_offset", (
                c.data.get("index_topk_freq"), c.data.get("index_skip_topk_offset")))
    if every == 1:
        offset = 2  # no sharing: DSASpec's default (every layer 'full' whatever the offset)
    return dsa | {"shared_every": every, "shared_offset": offset}


def _deepseek_dsa(c: _Config, *, glm: bool) -> dict[str, Any]:
    """DeepSeek-V3.2 (``deepseek_v32``, transformers ``DeepseekV32Config`` / ``modeling_deepseek_v32`` @ 5.24.0) and
    GLM-5 (``glm_moe_dsa``, ``GlmMoeDsaConfig``: DeepseekV32's class with GLM's defaults and cross-layer top-k
    sharing): DeepSeek-V3's MLA decoder (``_deepseek``: ``AXK1Attention``, always with a query LoRA; MoE router, MTP
    depth) plus a DSA lightning indexer in every attention layer (``_dsa_fields``). Read and derived, not model
    facts of their own: ``head_dim`` (transformers sets it to qk_rope_head_dim), ``qk_head_dim`` (nope + rope), and
    ``rope_interleave`` (the MLA's RoPE is always interleaved there: ``apply_rotary_pos_emb_interleave``); GLM's
    ``indexer_rope_interleave`` (GlmMoeDsaIndexer always interleaves; DeepseekV32Indexer never: the key is not its
    class's and is reported unread there)."""
    fields = _dsa_mlp_layers(c, _deepseek(c))
    mla = fields["mla"]
    qk = c.int("qk_head_dim", default=mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    if qk != mla.qk_nope_head_dim + mla.qk_rope_head_dim:
        raise c.disagree("qk_head_dim", qk, "qk_nope_head_dim + qk_rope_head_dim",
                         mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    c.seen("head_dim")  # DeepseekV32Config.__post_init__ overwrites it with qk_rope_head_dim (the RoPE slice)
    for key in ("rope_interleave", *(("indexer_rope_interleave",) if glm else ())):
        if not c.flag(key, True):
            raise c.error(key, False, "true: transformers applies interleaved RoPE there whatever the key says "
                          f"(model_type '{c.model_type}')")
    if c.flag("mlp_bias", False):
        raise c.error("mlp_bias", True, "only false: no MLP / expert biases")
    if c.data.get("num_experts") is not None and c.data.get("n_routed_experts") is not None \
            and c.data["num_experts"] != c.data["n_routed_experts"]:
        raise c.disagree("num_experts", c.data["num_experts"], "n_routed_experts", c.data["n_routed_experts"],
                         "DeepseekV32Config re-routes num_experts to n_routed_experts")
    fields["dsa"] = _dsa_fields(c, fields["num_layers"], index_heads=32 if glm else 64, glm=glm)
    return fields


def _gpt_oss(c: _Config) -> dict[str, Any]:
    """GPT-OSS (transformers ``GptOssConfig`` / ``modeling_gpt_oss``; OpenAI's model card, arXiv:2508.10925 §2.1):
    every layer MoE (``num_local_experts``, top ``num_experts_per_tok`` of the router logits, softmax over them),
    biases on every linear and on the router, one learned sink logit per head, layers alternating a
    ``sliding_window`` with full attention (``layer_types``), YaRN RoPE, and the experts' clamped SwiGLU
    ``(clamp(up, ±limit) + 1) · g·σ(alpha·g)``, ``g = clamp(gate, max=limit)`` (``GptOssExperts._apply_gate``)."""
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads", minimum=1)
    n = c.layers("num_hidden_layers")
    experts, top_k = c.int("num_local_experts", minimum=1), c.int("num_experts_per_tok", minimum=1)
    # OpenAI's files repeat two facts under their original names (not GptOssConfig fields): they must agree
    legacy = {"experts_per_token": ("num_experts_per_tok", top_k)}
    if not c.flag("attention_bias", True):
        raise c.error("attention_bias", False, "only true: GptOssExperts and the router always have biases and "
                      "ModelSpec has one bias switch (linear_bias) for all linears")
    alpha = c.float("swiglu_alpha", 1.702)
    if alpha != 1.702:
        raise c.error("swiglu_alpha", alpha, "only 1.702: x*sigmoid(1.702x) is Megatron-Core's quick_gelu")
    c.seen("hidden_act")  # GptOssExperts ignores it (the gate is x*sigmoid(alpha x) whatever the config says)
    rope = _rope(c, 150000.0, {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                               "truncate": False, "original_max_position_embeddings": 4096})
    if "rope_scaling" in rope:
        legacy["initial_context_length"] = ("rope_scaling.original_max_position_embeddings",
                                            rope["rope_scaling"]["original_max_position_embeddings"])
    for key, (other, want) in legacy.items():
        got = c.get(key, want)
        if got != want:
            raise c.disagree(key, got, other, want, f"{key} is OpenAI's name for GptOssConfig's {other}")
    window = c.get("sliding_window", 128)
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise c.error("sliding_window", window, "a positive integer")
    full_every = _layer_types(c, n, 2)
    arch = {**rope, "norm_eps": c.float("rms_norm_eps", 1e-5),
            "sliding_window": None if full_every is None else window, "full_attention_every": full_every or 0,
            "attention_sinks": True, "activation": "quick_gelu",
            "glu_linear_offset": 1.0, "activation_clamp": c.float("swiglu_limit", 7.0),
            "attention_dropout": c.float("attention_dropout", 0.0),
            "router": {"score_function": "softmax", "norm_top_k": True, "aux_loss": "aux_loss",
                       "aux_loss_coeff": c.float("router_aux_loss_coef", 0.001)}}
    fields = {"arch": arch, **_decoder_shape(c, n, hidden, heads), "linear_bias": True}
    return fields | _moe_fields(c, n, list(range(n)), num_experts=experts, moe_top_k=top_k)


def _glm4_moe(c: _Config) -> dict[str, Any]:
    """GLM-4.5 / 4.6 / 4.7 (transformers ``Glm4MoeConfig`` / ``modeling_glm4_moe``): a Llama-style decoder whose
    q/k/v projections carry a bias iff ``attention_bias`` (o_proj never: ``Glm4MoeAttention``), with a per-head q/k
    RMSNorm iff ``use_qk_norm``, RoPE on the first ``partial_rotary_factor`` of each head (default 0.5, rotate-half:
    ``apply_rotary_pos_emb``), and layers >= ``first_k_dense_replace`` MoE (``Glm4MoeMoE``): ``n_routed_experts`` of
    ``moe_intermediate_size``, one shared MLP of ``n_shared_experts`` x that width, and ``Glm4MoeTopkRouter``: sigmoid
    scores plus ``e_score_correction_bias`` for selection only, groups (``n_group`` / ``topk_group``) ranked by the sum
    of their top-2 biased scores, weights renormalized iff ``norm_topk_prob`` and scaled by ``routed_scaling_factor``.
    ``num_nextn_predict_layers`` multi-token-prediction modules follow the decoder (in the checkpoint; transformers
    does not build them). Defaults are Glm4MoeConfig's."""
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads", minimum=1)
    n = c.layers("num_hidden_layers")
    rope = _rope(c, partial_default=0.5)
    arch: dict[str, Any] = {**rope, "norm_eps": c.float("rms_norm_eps", 1e-5),
                            "qk_norm": c.flag("use_qk_norm", False),
                            "activation": _activation(c, "hidden_act", "silu"),
                            "attention_dropout": c.float("attention_dropout", 0.0),
                            "mtp_layers": c.int("num_nextn_predict_layers", "num_mtp_layers", default=1)}
    experts, top_k = c.int("n_routed_experts", "num_local_experts", default=128), c.int("num_experts_per_tok", default=8)
    first_k = c.int("first_k_dense_replace", default=1, minimum=0)
    moe_layers = [i for i in range(n) if experts > 0 and i >= first_k]
    if moe_layers:
        groups, group_k = c.int("n_group", default=1, minimum=1), c.int("topk_group", default=1)
        grouped = groups > 1
        if grouped and top_k // max(group_k, 1) != 2:  # HF: .topk(2) per group; Megatron: topk // group_topk
            warnings.warn(f"{c.source}: n_group={groups}, topk_group={group_k}, num_experts_per_tok={top_k}: "
                          "Glm4MoeTopkRouter ranks groups by the sum of their top-2 scores, Megatron-Core by the sum "
                          f"of their top {top_k // max(group_k, 1)} (moe_utils.py:552-554 at core_v0.16.1)",
                          HFConfigWarning, stacklevel=3)
        # The config states no load-balancing loss: Megatron-Bridge's GLMMoEModelProvider trains GLM-4.5 with a
        # sequence-level aux loss of 1e-3 beside the expert bias (GLM45 bridge, src/megatron/bridge/models/glm/glm45_bridge.py).
        arch["router"] = {"score_function": "sigmoid", "norm_top_k": c.flag("norm_topk_prob", True),
                          "expert_bias": True, "num_groups": groups if grouped else 0,
                          "group_top_k": group_k if grouped else 0,
                          "top_k_scaling": c.float("routed_scaling_factor", 1.0),
                          "aux_loss": "seq_aux_loss", "aux_loss_coeff": 1e-3,
                          "fp32_logits": True}  # Glm4MoeTopkRouter: F.linear on float32 (modeling_glm4_moe.py:284)
    else:
        c.seen("n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor")
    shape = _decoder_shape(c, n, hidden, heads, ffn=10944, kv_heads=8)  # Glm4MoeConfig's defaults (not MHA)
    fields = {"arch": arch, **shape, "qkv_bias": c.flag("attention_bias", False)}
    width = c.int("moe_intermediate_size", default=1408, minimum=1)
    return fields | _moe_fields(c, n, moe_layers, num_experts=experts, moe_top_k=top_k, moe_ffn_hidden_size=width,
                                num_shared_experts=c.int("n_shared_experts", default=1))


def _olmoe(c: _Config) -> dict[str, Any]:
    """OLMoE (transformers ``OlmoeConfig`` / ``modeling_olmoe``): every layer MoE, ``num_experts`` SwiGLU experts of
    ``intermediate_size``, softmax over all experts then top-k, renormalized iff ``norm_topk_prob`` (default false:
    ``OlmoeTopKRouter``), a batch load-balancing loss of ``router_aux_loss_coef``. ``OlmoeAttention``: q_norm and
    k_norm are RMSNorms over the whole q / k projections (``ArchSpec.qk_norm_per_head`` false), q, k, v clamped to
    ``clip_qkv``, a bias on all four projections iff ``attention_bias``."""
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads", minimum=1)
    n = c.layers("num_hidden_layers")
    clip = c.get("clip_qkv", None)
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip <= 0):
        raise c.error("clip_qkv", clip, "a positive number or null")
    attention_bias = c.flag("attention_bias", False)
    if attention_bias:
        warnings.warn(f"{c.source}: attention_bias=true also puts a bias on OLMoE's o_proj ({hidden} weights per "
                      "layer); autoplan's models (and Megatron's --add-qkv-bias) have biases on q/k/v only",
                      HFConfigWarning, stacklevel=3)
    arch = {**_llama_arch(c, n, qwen=False, qk_norm=True, window=False), "norm_eps": c.float("rms_norm_eps", 1e-5),
            "qk_norm_per_head": False, "qkv_clip": None if clip is None else float(clip),
            "router": _router(c, coeff_key="router_aux_loss_coef", coeff_default=0.01, norm_default=False)}
    fields = {"arch": arch, **_decoder_shape(c, n, hidden, heads), "qkv_bias": attention_bias}
    return fields | _moe_fields(c, n, list(range(n)), num_experts=c.int("num_experts", "num_local_experts", default=64,
                                                                          minimum=1),
                                moe_top_k=c.int("num_experts_per_tok", default=8))


# transformers NemotronHConfig layer types (and the legacy names remap_legacy_layer_types accepts) -> Megatron-Core's
# hybrid symbols (NemotronHConfig._list_to_pattern)
_NEMOTRON_H_LAYERS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "mlp": "-",
                      "moe": "E"}


def _nemotron_h_pattern(c: _Config) -> str:
    """``hybrid_override_pattern`` (config.json of the published checkpoints) or ``layers_block_type`` (transformers
    5.x); with both they must agree; ``num_hidden_layers`` (deprecated in NemotronHConfig) must match its length."""
    pattern = c.get("hybrid_override_pattern", None)
    types = c.get("layers_block_type", c.get("layer_types", None))
    if pattern is not None and (not isinstance(pattern, str) or not pattern or set(pattern) - set("M*-E")):
        raise c.error("hybrid_override_pattern", pattern, "a string of M (Mamba), * (attention), - (MLP), E (MoE)")
    if types is not None:
        if not isinstance(types, list) or not types or not all(t in _NEMOTRON_H_LAYERS for t in types):
            raise c.error("layers_block_type", types, f"a list of {sorted(_NEMOTRON_H_LAYERS)}")
        from_types = "".join(_NEMOTRON_H_LAYERS[t] for t in types)
        if pattern is not None and pattern != from_types:
            raise c.error("layers_block_type", types, f"the same layers as hybrid_override_pattern '{pattern}'")
        pattern = from_types
    if pattern is None:
        raise UserInputError(f"{c.source}: missing key 'hybrid_override_pattern' or 'layers_block_type' "
                             "(model_type 'nemotron_h')")
    if len(pattern) > _LAYER_BOUND:
        raise UserInputError(f"{c.source}: hybrid_override_pattern is over {_LAYER_BOUND} layers")
    n = c.get("num_hidden_layers", len(pattern))
    if n != len(pattern):
        raise c.error("num_hidden_layers", n, f"{len(pattern)}, the hybrid pattern's length")
    return pattern


def _nemotron_h_mtp(c: _Config) -> tuple[int, str | None]:
    """(MTP depths, block pattern): ``num_nextn_predict_layers`` MTP modules, each the block
    ``mtp_hybrid_override_pattern`` (or ``mtp_layers_block_type``, transformers 5.x names), as Megatron-Bridge reads
    them into mtp_num_layers / mtp_hybrid_override_pattern (nemotron_h_bridge.py:305-307 @ v0.4.0). A block without
    depths is not read (the MTP layer types without MTP)."""
    depths = c.int("num_nextn_predict_layers", default=0)
    pattern = c.get("mtp_hybrid_override_pattern", None)
    types = c.get("mtp_layers_block_type", None)
    if not depths:
        c.seen("mtp_hybrid_override_pattern", "mtp_layers_block_type")
        return 0, None
    if pattern is not None and (not isinstance(pattern, str) or not pattern or set(pattern) - set("M*-E")):
        raise c.error("mtp_hybrid_override_pattern", pattern, "a string of M (Mamba), * (attention), - (MLP), "
                      "E (MoE), e.g. '*E'")
    if types is not None:
        if not isinstance(types, list) or not types or not all(t in _NEMOTRON_H_LAYERS for t in types):
            raise c.error("mtp_layers_block_type", types, f"a list of {sorted(_NEMOTRON_H_LAYERS)}")
        from_types = "".join(_NEMOTRON_H_LAYERS[t] for t in types)
        if pattern is not None and pattern != from_types:
            raise c.error("mtp_layers_block_type", types, f"the same layers as mtp_hybrid_override_pattern "
                          f"'{pattern}'")
        pattern = from_types
    if pattern is None:
        raise c.error("num_nextn_predict_layers", depths, "0, or a block for each depth: "
                      "mtp_hybrid_override_pattern (e.g. '*E') or mtp_layers_block_type")
    return depths, pattern


# NemotronHConfig's older key names (transformers models/nemotron_h/configuration_nemotron_h.py ``__post_init__``:
# each present one replaces the current field, whatever that holds) -> the current name.
_NEMOTRON_H_LEGACY = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_expand": "expand",
                      "mamba_dt_min": "time_step_min", "mamba_dt_max": "time_step_max",
                      "mamba_dt_limit": "time_step_limit", "mamba_dt_init_floor": "time_step_floor",
                      "mamba_conv_bias": "use_conv_bias", "mamba_chunk_size": "chunk_size"}


def _nemotron_h_key(c: _Config, current: str) -> str:
    """The key NemotronHConfig takes ``current``'s value from: its older name where present (refused where both
    spellings hold different values, which transformers would resolve silently in the older one's favour)."""
    legacy = next(old for old, new in _NEMOTRON_H_LEGACY.items() if new == current)
    if legacy not in c.data:
        return current
    c.seen(current)
    if c.data.get(current) is not None and c.data[current] != c.data[legacy]:
        raise c.disagree(legacy, c.data[legacy], current, c.data[current],
                         f"{legacy} is NemotronHConfig's older name for {current}")
    return legacy


def _nemotron_h(c: _Config) -> dict[str, Any]:
    """Nemotron-H / Nemotron 3 (transformers ``NemotronHConfig`` / ``modeling_nemotron_h``; Megatron-Core ``MambaModel``):
    a stack of single-mixer pre-norm blocks, one per pattern symbol: Mamba-2 (``NemotronHMamba2Mixer``), attention
    without position encoding (``NemotronHAttention``: no rotary; ``rope_theta`` / ``partial_rotary_factor`` are not
    read by it), a squared-ReLU MLP, or an MoE of squared-ReLU experts (sigmoid router with a selection-only score
    bias, top-k renormalized and scaled by ``routed_scaling_factor``; one shared MLP of
    ``moe_shared_expert_intermediate_size``, here ``num_shared_experts`` experts of the routed width; optional latent
    projections). Multi-token prediction is refused (not modelled for hybrid stacks)."""
    pattern = _nemotron_h_pattern(c)
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads", minimum=1)
    for key, what in (("mamba_proj_bias", "Megatron-Core's MambaMixer has no in/out projection bias "
                       "(mamba_mixer.py:264)"), ("use_bias", "no Mamba projection bias (mamba_mixer.py:264)"),
                      ("mlp_bias", "no MLP / expert biases"), ("residual_in_fp32", "bf16 residuals"),
                      ("attention_bias", "no attention biases")):
        if c.flag(key, False):
            raise c.error(key, True, f"only false: {what}")
    for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        got = c.get(key, want)
        if got != want:
            raise c.error(key, got, f"only '{want}' (Megatron-Core: --squared-relu MLPs; MambaMixer's activation "
                          "is fixed to silu, mamba_mixer.py:314)")
    mtp_layers, mtp_pattern = _nemotron_h_mtp(c)
    if c.get("sliding_window", None) is not None:
        raise c.error("sliding_window", c.data["sliding_window"], "null: NemotronHAttention attends to every key")
    eps = c.float("layer_norm_epsilon", 1e-5)
    if c.float("norm_eps", eps) != eps:  # both spellings: neither is to be preferred silently
        raise c.disagree("layer_norm_epsilon", eps, "norm_eps", c.data["norm_eps"],
                         "the RMSNorm epsilon under two names")
    # Read and not needed: initialisation (time_step_*, rescale_prenorm_residual), inference (cache dtype, kernels,
    # logits to keep), Megatron's shared-expert overlap (scheduling), ``expand`` (NemotronHMamba2Mixer takes
    # d_inner = mamba_num_heads * mamba_head_dim), the unused rotary keys, and the MTP layer types without MTP.
    c.seen(*(_nemotron_h_key(c, k) for k in ("time_step_min", "time_step_max", "time_step_floor", "time_step_limit",
                                              "expand")))
    c.seen("rescale_prenorm_residual", "mamba_ssm_cache_dtype", "use_mamba_kernels", "num_logits_to_keep",
           "moe_shared_expert_overlap", "rope_theta", "partial_rotary_factor", "n_shared_experts")
    fields: dict[str, Any] = {
        "num_layers": len(pattern), "hidden_size": hidden, "ffn_hidden_size": c.int("intermediate_size", minimum=1),
        "num_attention_heads": heads, "num_kv_heads": c.int("num_key_value_heads", default=heads, minimum=1),
        "head_dim": _head_dim(c, hidden, heads), "vocab_size": c.int("vocab_size"),
        "tied_embeddings": c.flag("tie_word_embeddings", False), "gated_mlp": False,
        "hybrid_pattern": pattern,
    }
    arch: dict[str, Any] = {"no_position_encoding": True, "norm_eps": eps, "activation": "relu2",
                            "attention_dropout": c.float("attention_dropout", 0.0),
                            "hidden_dropout": c.float("hidden_dropout", 0.0)}
    if mtp_layers:
        arch |= {"mtp_layers": mtp_layers, "mtp_pattern": mtp_pattern}
    ngroups, conv, chunk, bias = (_nemotron_h_key(c, k) for k in ("n_groups", "conv_kernel", "chunk_size",
                                                                   "use_conv_bias"))
    if "M" in pattern:
        fields["mamba"] = {"num_heads": c.int("mamba_num_heads", minimum=1), "head_dim": c.int("mamba_head_dim"),
                           "state_dim": c.int("ssm_state_size"), "num_groups": c.int(ngroups, minimum=1),
                           "conv_kernel": c.int(conv, default=4), "chunk_size": c.int(chunk, default=128),
                           "conv_bias": c.flag(bias, True)}
    else:
        c.seen("mamba_num_heads", "mamba_head_dim", "ssm_state_size", ngroups, conv, chunk, bias)
    if "E" in pattern:
        width = c.int("moe_intermediate_size", minimum=1)
        shared = c.int("moe_shared_expert_intermediate_size", default=0)
        if shared % width:
            raise c.error("moe_shared_expert_intermediate_size", shared, f"a multiple of moe_intermediate_size "
                          f"({width}): ModelSpec has one expert width (shared = k experts of it)")
        groups, group_k = c.int("n_group", default=1, minimum=1), c.int("topk_group", default=1)
        latent = c.get("moe_latent_size", None)
        fields |= {"num_experts": c.int("n_routed_experts", minimum=1), "moe_top_k": c.int("num_experts_per_tok"),
                   "moe_ffn_hidden_size": width, "num_shared_experts": shared // width,
                   "moe_latent_size": None if latent is None else c.int("moe_latent_size", minimum=1)}
        # The router (NemotronHTopkRouter): sigmoid scores + e_score_correction_bias for selection. The config has no
        # load-balancing loss key: Megatron-Bridge's NemotronHModelProvider trains with seq_aux_loss 1e-4
        # (src/megatron/bridge/models/nemotronh/nemotron_h_provider.py).
        arch["router"] = {"score_function": "sigmoid", "norm_top_k": c.flag("norm_topk_prob", True),
                          "expert_bias": True, "num_groups": groups if groups > 1 else 0,
                          "group_top_k": group_k if groups > 1 else 0,
                          "top_k_scaling": c.float("routed_scaling_factor", 1.0),
                          "aux_loss": "seq_aux_loss", "aux_loss_coeff": 1e-4,
                          "fp32_logits": True}  # NemotronHTopkRouter: F.linear on float32 (modeling_nemotron_h.py:774)
    else:
        c.seen("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
               "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "moe_latent_size")
    return fields | {"arch": arch}


def _nemotron(c: _Config) -> dict[str, Any]:
    """Nemotron-4 / Minitron (transformers ``NemotronConfig`` / ``modeling_nemotron``): a pre-norm decoder with
    ``NemotronLayerNorm1P`` (LayerNorm with a bias, scaling by ``weight + 1``: ``norm_zero_centered_gamma``), a
    non-gated MLP ``down(act(up(x)))`` (``hidden_act`` default relu2, squared ReLU), RoPE on the first
    ``partial_rotary_factor`` of each head (default 0.5, ``NemotronConfig.__post_init__``), q/k/v/o biases iff
    ``attention_bias`` and MLP biases iff ``mlp_bias`` (both default false), untied by default."""
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads", minimum=1)
    n = c.layers("num_hidden_layers")
    attention_bias, mlp_bias = c.flag("attention_bias", False), c.flag("mlp_bias", False)
    if attention_bias != mlp_bias:
        raise c.error("attention_bias / mlp_bias", (attention_bias, mlp_bias), "both true or both false: "
                      "Megatron biases every linear or none (--disable-bias-linear)")
    act = _activation(c, "hidden_act", "relu2", {"relu2": "relu2"})  # transformers ReLUSquaredActivation
    rope = _rope(c, partial_default=0.5)
    if c.data.get("num_key_value_heads") is None:  # not MHA: transformers builds no model of such a file
        # NemotronConfig keeps ``num_key_value_heads: int | None = None`` (configuration_nemotron.py:59; its
        # __post_init__, :74-77, defaults head_dim alone) and NemotronAttention divides by it (modeling_nemotron.py:238)
        # @ transformers 5.24.0: a TypeError, where LlamaConfig would read MHA
        raise UserInputError(f"{c.source}: missing key 'num_key_value_heads' (model_type 'nemotron'): NemotronConfig "
                             "leaves it None and transformers cannot build NemotronAttention without it; give the "
                             f"KV head count, a divisor of num_attention_heads={heads}, e.g. num_key_value_heads: "
                             f"{heads} for multi-head attention")
    arch = {**rope, "norm_eps": c.float("norm_eps", 1e-5), "norm_zero_centered_gamma": True, "activation": act,
            "attention_dropout": c.float("attention_dropout", 0.0)}
    shape = _decoder_shape(c, n, hidden, heads)
    return {"arch": arch, **shape, "gated_mlp": False, "norm": "layernorm", "linear_bias": attention_bias}


def _no_rope_every(c: _Config, n: int) -> int:
    """Llama 4's NoPE layers as ``ArchSpec.no_rope_every`` N: HF ``no_rope_layers`` (1 = the layer uses RoPE), where
    empty or absent ``[(i + 1) % no_rope_layer_interval != 0 for i in range(n)]`` (Llama4TextConfig.__post_init__,
    configuration_llama4.py:169-172 @ 5.24.0)."""
    interval = c.int("no_rope_layer_interval", default=4, minimum=1)
    flags = c.int_list("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) != n or not set(flags) <= {0, 1}:
        raise c.error("no_rope_layers", flags, f"a list of {n} flags, 1 where the layer uses RoPE")
    if all(flags):
        return 0
    if (every := _every_nth([not f for f in flags])) is not None:
        return every
    raise c.error("no_rope_layers", flags, "every N-th layer (N, 2N, ...) without RoPE: the pattern autoplan and "
                  "Megatron-Core's no_rope_freq N express (or RoPE on every layer)")


def _llama4_text(c: _Config) -> dict[str, Any]:
    """Llama 4's text decoder (transformers ``Llama4TextConfig`` / ``modeling_llama4`` @ 5.24.0, Meta's
    Llama-4-Scout-17B-16E / Maverick-17B-128E ``text_config``): MoE layers ``moe_layers`` (default every
    ``interleave_moe_layer_step``-th, from layer step - 1) of ``num_local_experts`` experts of width
    ``intermediate_size``, top-``num_experts_per_tok`` by logit with sigmoid weights, not renormalised, applied to the
    expert's input (``Llama4TextMoe``), plus one shared expert of the same width; dense layers of width
    ``intermediate_size_mlp``; no RoPE on every 4th layer (``no_rope_layers``), interleaved RoPE, a weightless q/k
    L2 norm on the RoPE layers (``use_qk_norm``), chunked attention (``attention_chunk_size``) on the RoPE layers and
    query temperature tuning (``attn_temperature_tuning``) on the NoPE ones. No load-balancing loss:
    ``Llama4ForCausalLM`` computes none (``router_aux_loss_coef`` is read by nothing in modeling_llama4.py)."""
    hidden, heads = c.int("hidden_size", default=5120), c.int("num_attention_heads", default=40, minimum=1)
    n = c.layers("num_hidden_layers", default=48)
    if c.flag("attention_bias", False):
        raise c.error("attention_bias", True, "only false: q/k/v/o biases without MLP biases are not represented")
    jitter = c.float("router_jitter_noise", 0.0)
    if jitter:
        raise c.error("router_jitter_noise", jitter, "only 0: input jitter is not modelled")
    c.seen("router_aux_loss_coef")  # no loss reads it (see above)
    experts, top_k = c.int("num_local_experts", default=16, minimum=1), c.int("num_experts_per_tok", default=1,
                                                                               minimum=1)
    step = c.int("interleave_moe_layer_step", default=1, minimum=1)
    c.seen("moe_layers")  # null: the default below (no HFConfigWarning for a key that was read)
    moe_layers = c.int_list("moe_layers") if c.data.get("moe_layers") is not None else list(range(step - 1, n, step))
    no_rope = _no_rope_every(c, n)
    c.seen("attention_chunk_size")
    chunk = c.data.get("attention_chunk_size", 8192)  # null: no chunking (Llama4TextConfig allows None)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0):
        raise c.error("attention_chunk_size", chunk, "a positive integer or null")
    want_types = ["chunked_attention" if (no_rope == 0 or (i + 1) % no_rope) and chunk is not None
                  else "full_attention" for i in range(n)]
    types = c.get("layer_types", want_types)
    if types != want_types:
        raise c.disagree("layer_types", types, "no_rope_layers / attention_chunk_size", want_types,
                         "Llama 4 chunks the RoPE layers' attention")
    temperature = None
    # Meta's Llama-4-Scout config.json writes attn_temperature_tuning 4, which modeling_llama4.py:360 reads for its
    # truth value (transformers 5.24.0's strict Llama4TextConfig refuses any non-bool, that file's 4 included)
    tuning = c.flag("attn_temperature_tuning", True, int_reason="Llama-4-Scout's config.json writes 4")
    if tuning and no_rope:
        floor, scale = c.int("floor_scale", default=8192, minimum=1), c.float("attn_scale", 0.1)
        # attn_scale 0 scales every NoPE query by log1p(floor((p + 1) / floor_scale)) * 0 + 1 = 1
        # (modeling_llama4.py:363-364 @ 5.24.0): no tuning, as transformers runs it
        temperature = {"floor_scale": floor, "attn_scale": scale} if scale else None
    c.seen("floor_scale", "attn_scale", "for_llm_compressor", "cache_implementation")  # the last two: inference
    arch = {**_rope(c, 500000.0), "rope_interleaved": True, "no_rope_every": no_rope, "attention_chunk": chunk,
            "attn_temperature": temperature, "qk_l2_norm": c.flag("use_qk_norm", True),
            "norm_eps": c.float("rms_norm_eps", 1e-5), "activation": _activation(c, "hidden_act", "silu"),
            "attention_dropout": c.float("attention_dropout", 0.0),
            "router": {"score_function": "sigmoid", "norm_top_k": False, "probs_on_input": True,
                       "aux_loss": "none", "aux_loss_coeff": 0.0}}
    # Llama4TextConfig's field defaults apply to an absent key (head_dim 128, 8 KV heads); an explicit null takes
    # __post_init__'s (hidden / heads, MHA: configuration_llama4.py:166-173 @ 5.24.0)
    head_dim = c.int("head_dim", default=128 if "head_dim" not in c.data else hidden // heads, minimum=1)
    kv = c.int("num_key_value_heads", default=8 if "num_key_value_heads" not in c.data else heads, minimum=1)
    shape = {"num_layers": n, "hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": kv,
             "head_dim": None if head_dim * heads == hidden else head_dim,
             "ffn_hidden_size": c.int("intermediate_size_mlp", default=16384, minimum=1),  # the dense layers'
             "vocab_size": c.int("vocab_size", default=202048),
             "tied_embeddings": c.flag("tie_word_embeddings", False)}
    return {"arch": arch, **shape} | _moe_fields(
        c, n, moe_layers, num_experts=experts, moe_top_k=top_k, num_shared_experts=1,  # the shared expert's width too
        moe_ffn_hidden_size=c.int("intermediate_size", default=8192, minimum=1))


# Llama4Config's own keys besides text_config: the image-token ids (bookkeeping) and the vision tower
_LLAMA4_TOP = frozenset({"text_config", "vision_config", "boi_token_index", "eoi_token_index", "image_token_index",
                         "tie_word_embeddings"})


def _llama4(c: _Config) -> dict[str, Any]:
    """Llama 4 as published (``Llama4Config``: ``text_config`` and a ``vision_config``): the text decoder
    (``Llama4ForCausalLM``) is what autoplan plans and emits; the vision encoder and projector are not (a warning
    says so). A bare ``Llama4TextConfig`` file (model_type ``llama4_text``) reads the same facts."""
    text = c.get("text_config", None)
    if not isinstance(text, Mapping):
        raise c.error("text_config", text, "a mapping (Llama4Config's text decoder)")
    inner = _Config({"model_type": "llama4_text", **text}, f"{c.source} text_config")  # its errors name the type
    fields = _llama4_text(inner)
    tie = c.flag("tie_word_embeddings", False)
    if inner.flag("tie_word_embeddings", tie) != tie:  # absent or null in text_config: the top-level value
        raise c.disagree("tie_word_embeddings", tie, "text_config.tie_word_embeddings", text["tie_word_embeddings"])
    fields["tied_embeddings"] = tie or fields["tied_embeddings"]
    c.seen(*_LLAMA4_TOP)
    _warn_unread(inner, "llama4", stacklevel=4)
    if c.data.get("vision_config") is not None:
        warnings.warn(f"{c.source}: the vision encoder and projector (vision_config) are not planned: the plan, its "
                      "prediction and the emitted configs are the text decoder's (Llama4ForCausalLM)",
                      HFModelPartWarning, stacklevel=3)
    return fields


def _gpt2(c: _Config) -> dict[str, Any]:
    """GPT-2: learned positions, LayerNorm, biases everywhere, GELU MLP of n_inner (None → 4h), tied."""
    hidden, heads = c.int("n_embd", "hidden_size"), c.int("n_head", "num_attention_heads")
    if not c.flag("scale_attn_weights", True) or c.flag("scale_attn_by_inverse_layer_idx", False):
        raise c.error("scale_attn_weights / scale_attn_by_inverse_layer_idx", "non-default",
                      "attention scaled by 1/sqrt(head_dim) only")
    c.seen("reorder_and_upcast_attn")  # numerics of the softmax, not the model
    embd, resid = c.float("embd_pdrop", 0.1), c.float("resid_pdrop", 0.1)
    if embd != resid:
        warnings.warn(f"{c.source}: embd_pdrop ({embd}) differs from resid_pdrop ({resid}); autoplan has one "
                      "hidden dropout and uses resid_pdrop", HFConfigWarning, stacklevel=3)
    return {
        "arch": {"norm_eps": c.float("layer_norm_epsilon", 1e-5), "activation": _activation(c, "activation_function",
                                                                                              "gelu_new"),
                 "attention_dropout": c.float("attn_pdrop", 0.1), "hidden_dropout": resid},
        "num_layers": c.layers("n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": c.int("n_inner", default=4 * hidden),
        "num_attention_heads": heads,
        "num_kv_heads": heads,
        "vocab_size": c.int("vocab_size"),
        "gated_mlp": False,
        "tied_embeddings": c.flag("tie_word_embeddings", True),
        "norm": "layernorm",
        "linear_bias": True,
        "learned_position_embeddings": c.int("n_positions", "max_position_embeddings"),
    }


def _gpt_neox(c: _Config) -> dict[str, Any]:
    """GPT-NeoX / Pythia: rotary, LayerNorm, biases, GELU MLP, untied unless tie_word_embeddings."""
    heads = c.int("num_attention_heads")
    if c.flag("use_parallel_residual", True):
        warnings.warn(f"{c.source}: use_parallel_residual=true (attention and MLP read the same input) is not "
                      "represented: ModelSpec and the emitters build sequential pre-norm blocks (same shapes and "
                      "cost, a different function)", HFConfigWarning, stacklevel=3)
    return {
        "arch": {"rope_theta": c.float("rotary_emb_base", 10000.0), "rotary_fraction": c.float("rotary_pct", 1.0),
                 "norm_eps": c.float("layer_norm_eps", 1e-5), "activation": _activation(c, "hidden_act", "gelu"),
                 "attention_dropout": c.float("attention_dropout", 0.0),
                 "hidden_dropout": c.float("hidden_dropout", 0.0)},
        "num_layers": c.layers("num_hidden_layers"),
        "hidden_size": c.int("hidden_size"),
        "ffn_hidden_size": c.int("intermediate_size"),
        "num_attention_heads": heads,
        "num_kv_heads": heads,
        "vocab_size": c.int("vocab_size"),
        "gated_mlp": False,
        "tied_embeddings": c.flag("tie_word_embeddings", False),
        "norm": "layernorm",
        "linear_bias": c.flag("attention_bias", True),
    }


def _bloom(c: _Config) -> dict[str, Any]:
    """BLOOM: ALiBi (no position table), LayerNorm, biases, GELU MLP of 4h, tied."""
    hidden, heads = c.int("hidden_size", "n_embed"), c.int("n_head", "num_attention_heads")
    c.seen("n_inner")  # BloomConfig has no such field: its MLP is always 4h (the published file carries null)
    if c.flag("apply_residual_connection_post_layernorm", False):
        raise c.error("apply_residual_connection_post_layernorm", True, "pre-norm residuals only")
    return {
        "arch": {"alibi": True, "norm_eps": c.float("layer_norm_epsilon", 1e-5), "activation": "gelu_tanh",
                 "attention_dropout": c.float("attention_dropout", 0.0),
                 "hidden_dropout": c.float("hidden_dropout", 0.0)},
        "num_layers": c.layers("n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": 4 * hidden,
        "num_attention_heads": heads,
        "num_kv_heads": heads,
        "vocab_size": c.int("vocab_size"),
        "gated_mlp": False,
        "tied_embeddings": c.flag("tie_word_embeddings", True),
        "norm": "layernorm",
        "linear_bias": True,
    }


_FAMILIES: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "bloom": _bloom,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "deepseek_v32": lambda c: _deepseek_dsa(c, glm=False),
    "gpt2": _gpt2,
    "gpt_oss": _gpt_oss,
    "glm4_moe": _glm4_moe,
    "glm_moe_dsa": lambda c: _deepseek_dsa(c, glm=True),
    "gpt_neox": _gpt_neox,
    "llama": _llama,
    "llama4": _llama4,
    "llama4_text": _llama4_text,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "nemotron": _nemotron,
    "nemotron_h": _nemotron_h,
    "olmoe": _olmoe,
    "qwen2": _qwen2,
    "qwen2_moe": lambda c: _qwen_moe(c, qkv_bias=True, qk_norm=False),
    "qwen3": _qwen3,
    "qwen3_moe": lambda c: _qwen_moe(c, qkv_bias=False, qk_norm=True),
    "qwen3_next": _qwen3_next,
    "qwen3_5": lambda c: _qwen3_5(c, moe=False),
    "qwen3_5_moe": lambda c: _qwen3_5(c, moe=True),
    "qwen3_5_text": lambda c: _qwen3_5_text(c, moe=False),
    "qwen3_5_moe_text": lambda c: _qwen3_5_text(c, moe=True),
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))


def _warn_unread(config: _Config, model_type: str, stacklevel: int) -> None:
    """The ``HFConfigWarning`` naming the keys of ``config`` its family's reader neither read nor knows harmless."""
    unread = sorted(set(config.data) - config.read - HARMLESS_KEYS)
    if unread:
        warnings.warn(f"{config.source}: keys not read by autoplan's '{model_type}' loader: {unread}. If they change "
                      "the architecture, the plan and the emitted configs do not reflect them", HFConfigWarning,
                      stacklevel=stacklevel)


def looks_like_hf_config(data: Mapping[str, Any]) -> bool:
    """True if ``data`` carries keys only a Hugging Face config has."""
    return not HF_MARKER_KEYS.isdisjoint(data)


def default_name(data: Mapping[str, Any], path: Path | None) -> str:
    """``_name_or_path``'s last component, else the folder of a ``config.json``, else the file stem."""
    name_or_path = str(data.get("_name_or_path") or "").rstrip("/\\")
    if name_or_path:
        return name_or_path.replace("\\", "/").rsplit("/", 1)[-1]
    if path is not None:
        return path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return str(data.get("model_type") or "hf-model")


def spec_from_hf_config(data: Mapping[str, Any], *, name: str | None = None, path: Path | None = None) -> ModelSpec:
    """Translate a parsed Hugging Face config (``path`` only names it in messages and the default name)."""
    source = f"config '{path}'" if path is not None else "Hugging Face config"
    model_type = data.get("model_type")
    if model_type is None:
        raise UserInputError(f"{source}: missing key 'model_type'; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    family = _FAMILIES.get(str(model_type))
    if family is None:
        raise UserInputError(
            f"{source}: unsupported model_type '{model_type}'; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    config = _Config(data, source)
    fields = family(config)
    _warn_unread(config, str(model_type), stacklevel=3)
    fields["name"] = name or default_name(data, path)
    return validate(ModelSpec, fields, f"model from {source}")
