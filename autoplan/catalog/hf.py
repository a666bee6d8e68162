"""Hugging Face ``config.json`` → :class:`~cost_models.specs.ModelSpec`.

Supported ``model_type``: llama, mistral, mixtral, qwen2, qwen3, qwen2_moe, qwen3_moe, deepseek_v2,
deepseek_v3, gpt2, gpt_neox, bloom. Each family's key names and defaults follow its ``transformers``
configuration class. Approximations (all small; the parameter-count tests state the tolerances):

- **MLA** (deepseek_v2/v3): parameters and FLOPs are exact through ``ModelSpec.mla``; for sharding and
  activations MLA is treated as MHA with ``num_kv_heads = num_attention_heads`` and
  ``head_dim = v_head_dim`` (see ``MLASpec``). The multi-token-prediction module
  (``num_nextn_predict_layers``) is not counted.
- **Qwen2-MoE shared expert**: one shared expert of width ``shared_expert_intermediate_size``; ModelSpec
  has one expert width, so it becomes ``num_shared_experts = round(shared_width / moe_intermediate_size)``
  experts (exact for the public checkpoints: 5632 = 4 x 1408, 20480 = 8 x 2560). Its sigmoid gate
  (``hidden_size`` weights per layer) is ignored.
- **MoE layer placement**: HF's ``mlp_only_layers``/``decoder_sparse_step`` (Qwen) and
  ``first_k_dense_replace``/``moe_layer_freq`` (DeepSeek) are translated to ModelSpec's
  ``first_dense_layers``/``moe_layer_freq`` only when that reproduces the same set of MoE layers exactly;
  otherwise the config is rejected.
- **Ignored small tensors**: Qwen3's per-head q/k RMSNorms (2·head_dim per layer), BLOOM's embedding
  LayerNorm (2·hidden), Llama's ``attention_bias`` on the output projection (hidden per layer) and
  a Llama ``mlp_bias`` without ``attention_bias`` (with both, every linear has a bias: ``linear_bias``).
- ``head_dim`` equal to ``hidden_size / num_attention_heads`` is normalized to ``None`` so a config and
  the matching catalog entry give identical specs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autoplan.catalog.spec_file import validate
from autoplan.errors import UserInputError
from cost_models.specs import MLASpec, ModelSpec

_MISSING = object()

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

    def _req(self, *keys: str) -> Any:
        """The first of ``keys`` present with a non-null value (alternatives are synonyms)."""
        for key in keys:
            if self.data.get(key) is not None:
                return self.data[key]
        names = " or ".join(f"'{k}'" for k in keys)
        raise UserInputError(f"{self.source}: missing key {names} (model_type '{self.model_type}')")

    def get(self, key: str, default: Any) -> Any:
        value = self.data.get(key, _MISSING)
        return default if value is _MISSING or value is None else value

    def int_list(self, key: str) -> list[int]:
        """A list of integers under ``key`` (empty when absent)."""
        value = self.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise UserInputError(f"{self.source}: key '{key}' must be a list of integers, got {value!r}")
        return value

    def int(self, *keys: str, default: int | object = _MISSING, minimum: int | None = None) -> int:
        """An integer under the first present of ``keys`` (or ``default`` when none is); ``minimum``
        guards values used as divisors, which ModelSpec's own validation would see too late."""
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


# ---- families ---------------------------------------------------------------------------------


def _llama_like(c: _Config, *, qkv_bias: bool = False) -> dict[str, Any]:
    """Llama/Mistral/Qwen decoder: RMSNorm, SwiGLU, rotary, untied by default."""
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads", minimum=1)
    attention_bias, mlp_bias = bool(c.get("attention_bias", False)), bool(c.get("mlp_bias", False))
    return {
        "num_layers": c.int("num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": c.int("intermediate_size"),
        "num_attention_heads": heads,
        "num_kv_heads": c.int("num_key_value_heads", default=heads),
        "head_dim": _head_dim(c, hidden, heads),
        "vocab_size": c.int("vocab_size"),
        "tied_embeddings": bool(c.get("tie_word_embeddings", False)),
        "linear_bias": attention_bias and mlp_bias,
        "qkv_bias": qkv_bias or (attention_bias and not mlp_bias),
    }


def _llama(c: _Config) -> dict[str, Any]:
    return _llama_like(c)


def _qwen2(c: _Config) -> dict[str, Any]:
    return _llama_like(c, qkv_bias=True)  # Qwen2Attention: q/k/v always have a bias, o_proj none


def _mixtral(c: _Config) -> dict[str, Any]:
    fields = _llama_like(c)
    n = int(fields["num_layers"])
    return fields | _moe_fields(
        c, n, list(range(n)), num_experts=c.int("num_local_experts"), moe_top_k=c.int("num_experts_per_tok")
    )


def _qwen_moe(c: _Config, *, qkv_bias: bool) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE: layer i is sparse iff i ∉ mlp_only_layers and (i+1) % decoder_sparse_step == 0."""
    fields = _llama_like(c, qkv_bias=qkv_bias)
    n, experts = int(fields["num_layers"]), c.int("num_experts")
    step, dense_only = c.int("decoder_sparse_step", default=1, minimum=1), set(c.int_list("mlp_only_layers"))
    moe_layers = [i for i in range(n) if experts > 0 and i not in dense_only and (i + 1) % step == 0]
    moe_width = c.int("moe_intermediate_size", minimum=1)
    shared = round(c.int("shared_expert_intermediate_size", default=0) / moe_width)
    return fields | _moe_fields(
        c,
        n,
        moe_layers,
        num_experts=experts,
        moe_top_k=c.int("num_experts_per_tok"),
        moe_ffn_hidden_size=moe_width,
        num_shared_experts=shared,
    )


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
    n, experts = c.int("num_hidden_layers"), c.int("n_routed_experts", default=0)
    first_k, freq = c.int("first_k_dense_replace", default=0), c.int("moe_layer_freq", default=1, minimum=1)
    moe_layers = [i for i in range(n) if experts > 0 and i >= first_k and i % freq == 0]
    fields = {
        "num_layers": n,
        "hidden_size": hidden,
        "ffn_hidden_size": c.int("intermediate_size"),
        "num_attention_heads": heads,
        "num_kv_heads": heads,  # MLA approximated as MHA for sharding
        "head_dim": None if hidden == heads * mla.v_head_dim else mla.v_head_dim,
        "vocab_size": c.int("vocab_size"),
        "tied_embeddings": bool(c.get("tie_word_embeddings", False)),
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


def _gpt2(c: _Config) -> dict[str, Any]:
    """GPT-2: learned positions, LayerNorm, biases everywhere, GELU MLP of n_inner (None → 4h), tied."""
    hidden, heads = c.int("n_embd", "hidden_size"), c.int("n_head", "num_attention_heads")
    return {
        "num_layers": c.int("n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": c.int("n_inner", default=4 * hidden),
        "num_attention_heads": heads,
        "num_kv_heads": heads,
        "vocab_size": c.int("vocab_size"),
        "gated_mlp": False,
        "tied_embeddings": bool(c.get("tie_word_embeddings", True)),
        "norm": "layernorm",
        "linear_bias": True,
        "learned_position_embeddings": c.int("n_positions", "max_position_embeddings"),
    }


def _gpt_neox(c: _Config) -> dict[str, Any]:
    """GPT-NeoX / Pythia: rotary, LayerNorm, biases, GELU MLP, untied unless tie_word_embeddings."""
    heads = c.int("num_attention_heads")
    return {
        "num_layers": c.int("num_hidden_layers"),
        "hidden_size": c.int("hidden_size"),
        "ffn_hidden_size": c.int("intermediate_size"),
        "num_attention_heads": heads,
        "num_kv_heads": heads,
        "vocab_size": c.int("vocab_size"),
        "gated_mlp": False,
        "tied_embeddings": bool(c.get("tie_word_embeddings", False)),
        "norm": "layernorm",
        "linear_bias": bool(c.get("attention_bias", True)),
    }


def _bloom(c: _Config) -> dict[str, Any]:
    """BLOOM: ALiBi (no position table), LayerNorm, biases, GELU MLP of 4h, tied."""
    hidden, heads = c.int("hidden_size", "n_embed"), c.int("n_head", "num_attention_heads")
    return {
        "num_layers": c.int("n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": 4 * hidden,
        "num_attention_heads": heads,
        "num_kv_heads": heads,
        "vocab_size": c.int("vocab_size"),
        "gated_mlp": False,
        "tied_embeddings": bool(c.get("tie_word_embeddings", True)),
        "norm": "layernorm",
        "linear_bias": True,
    }


_FAMILIES: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "bloom": _bloom,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "llama": _llama,
    "mistral": _llama,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen2_moe": lambda c: _qwen_moe(c, qkv_bias=True),
    "qwen3": _llama,
    "qwen3_moe": lambda c: _qwen_moe(c, qkv_bias=False),
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))


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
    fields = family(_Config(data, source))
    fields["name"] = name or default_name(data, path)
    return validate(ModelSpec, fields, f"model from {source}")
