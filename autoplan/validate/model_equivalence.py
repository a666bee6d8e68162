"""The model a framework builds from autoplan's emitted config, compared with the Hugging Face model of the same
``config.json``, field by field, on the meta device (no weights are allocated).

Reference: ``transformers`` builds the HF model (``AutoModelForCausalLM.from_config``) and computes its RoPE
frequencies (``modeling_rope_utils.ROPE_INIT_FUNCTIONS``). Candidates: megatron-core's ``GPTModel`` (MLA for
DeepSeek) built from the TransformerConfig that the emitted Megatron argument list maps to (as Megatron-LM's
``core_transformer_config_from_args`` and ``gpt_builders.py`` do), and torchtitan's model built from the emitted
flavor (``torchtitan_equivalence``). Needs the ``validate`` extra. Rows: (model, framework, field, ours, theirs).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

Row = tuple[str, str, str, Any, Any]


def _hf(config: dict[str, Any]) -> tuple[Any, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(cfg)
    return cfg, model


def hf_reference(config: dict[str, Any], seq_len: int | None = None) -> dict[str, Any]:
    """The fields compared, as transformers' own model and config state them; dynamic-NTK RoPE at the training
    length ``seq_len`` (``dynamic_rope_update`` recomputes the frequencies with the sequence's length,
    modeling_rope_utils.py:101-111 @ 5.24.0; up to max_position_embeddings they are the initial ones)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg, model = _hf(config)
    rope = getattr(cfg, "rope_parameters", None) or {"rope_type": "default"}
    kind = rope.get("rope_type", "default")
    init = ROPE_INIT_FUNCTIONS[kind] if kind != "default" else None
    if init is None:
        base = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        dim = getattr(cfg, "qk_rope_head_dim", None) or getattr(cfg, "head_dim", None) or \
            cfg.hidden_size // cfg.num_attention_heads
        # partial rotary (GLM-4.5: 0.5): modeling_rope_utils' dim = int(head_dim * partial_rotary_factor)
        dim = int(dim * float(rope.get("partial_rotary_factor", 1.0)))
        import torch
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        scaling = 1.0
    else:
        inv_freq, scaling = init(cfg, "cpu", **({"seq_len": seq_len} if kind == "dynamic" else {}))
    attn = model.model.layers[0].self_attn
    names = {n for n, _ in model.named_modules()}
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "rope_inv_freq": inv_freq.double(),
        "norm_eps": float(getattr(cfg, "rms_norm_eps", None) or cfg.norm_eps),  # NemotronConfig: norm_eps
        "norm": norm_probe(model.model.layers[0].input_layernorm),
        "qk_norm": any(n.endswith(("self_attn.q_norm", "self_attn.q_a_layernorm")) for n in names),
        "window": window,
        # per layer where the attention module says (Qwen3, GPT-OSS); else the config's window (Mistral)
        "layer_windows": [getattr(layer.self_attn, "sliding_window", window) for layer in model.model.layers],
        "attention_sinks": sum(p.numel() for n, p in model.named_parameters() if n.endswith("self_attn.sinks")),
        "glu": _hf_glu(cfg),
        # the rotary module multiplies cos and sin by the RoPE attention factor (YaRN: 0.1 ln(factor) + 1 for
        # GPT-OSS; 1 for llama3 scaling and DeepSeek's mscale = mscale_all_dim), so q·k by its square
        "softmax_scale": float(attn.scaling) * float(scaling) ** 2,
        "router": _hf_router(config, model),
        # Llama 4: Llama4TextAttention.use_rope (no_rope_layers) and its weightless qk_norm on those layers only
        "rope_layers": [bool(getattr(layer.self_attn, "use_rope", True)) for layer in model.model.layers],
        "qk_l2_layers": [type(getattr(layer.self_attn, "qk_norm", None)).__name__ == "Llama4TextL2Norm"
                         for layer in model.model.layers],
        # (2i, 2i+1) pairs: the complex-number apply_rotary_emb of modeling_llama4 and modeling_deepseek_v2, or
        # DeepseekV3Attention's apply_rotary_pos_emb_interleave under config.rope_interleave (default true,
        # modeling_deepseek_v3.py:453-454 @ 5.24.0); the other families rotate the two halves (rotate_half)
        "rope_interleaved": hasattr(sys.modules[type(model).__module__], "apply_rotary_emb")
        or bool(getattr(cfg, "rope_interleave", False)),
    }


def norm_probe(module: Any) -> tuple[str, bool]:
    """(kind, zero-centered gamma) of a norm module, from what it computes: a CPU copy with its weight (and bias)
    zeroed runs on a random row. A LayerNorm's output is unchanged when a constant is added to its input (it
    subtracts the mean), an RMSNorm's is not; a zero-centered norm scales by weight + 1, so a zero weight still
    passes the normalized input through, where a plain one gives zeros."""
    import copy

    import torch

    probe = copy.deepcopy(module).to_empty(device="cpu").float()
    with torch.no_grad():
        for p in probe.parameters():
            p.zero_()
        x = torch.randn(2, probe.weight.shape[0], generator=torch.Generator().manual_seed(0))
        out = probe(x)
        zero_centered = bool(out.abs().max() > 0)
        if not zero_centered:
            probe.weight.fill_(1.0)
            out = probe(x)
        shifted = probe(x + 5.0)
    return ("layernorm" if torch.allclose(out, shifted, atol=1e-4) else "rmsnorm", zero_centered)


def _hf_glu(cfg: Any) -> tuple[str, float, float | None]:
    """(activation, offset on the linear half, clamp) of the gated MLP: GPT-OSS's experts compute
    ``(clamp(up, ±limit) + 1) · g·σ(alpha·g)`` (modeling_gpt_oss.GptOssExperts), i.e. quick-GELU at alpha 1.702."""
    if cfg.model_type == "gpt_oss":
        return ("quick_gelu" if cfg.swiglu_alpha == 1.702 else f"x*sigmoid({cfg.swiglu_alpha}x)", 1.0,
                float(cfg.swiglu_limit))
    # transformers' "relu2" (ReLUSquaredActivation) is megatron-core's squared_relu (activations.py)
    return ({"relu2": "squared_relu"}.get(cfg.hidden_act, cfg.hidden_act), 0.0, None)


def _hf_logits_fp32(model: Any) -> bool:
    """Whether transformers' gate computes its logits in fp32 from a bf16 model: its first router module (class name
    ending in 'Router'), cast to bf16, called on a bf16 meta input (DeepseekV3TopkRouter casts both operands to
    float32; Qwen3MoeTopKRouter does not)."""
    import torch

    router = next(m for _, m in model.named_modules() if type(m).__name__.lower().endswith("router"))
    router = router.to(torch.bfloat16)
    out = router(torch.empty(1, 1, router.weight.shape[-1], dtype=torch.bfloat16, device="meta"))
    return (out[0] if isinstance(out, tuple) else out).dtype == torch.float32


def _hf_router(c: dict[str, Any], model: Any) -> dict[str, Any] | None:
    experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
    if not experts:
        return None
    return {**_hf_router_config(c, experts), "logits_fp32": _hf_logits_fp32(model)}


def _hf_router_config(c: dict[str, Any], experts: int) -> dict[str, Any]:
    """The router as the config.json states it (``c``); its booleans read as the catalog reads them
    (``_Config.flag``: a string such as "false" is refused, not taken for its truth value)."""
    from autoplan.catalog.hf import _Config

    flags = _Config(c, "config.json")
    if c.get("model_type") in ("llama4", "llama4_text"):  # Llama4Router: top-k logits, sigmoid of each, on the input
        return {"experts": experts, "top_k": c.get("num_experts_per_tok", 1), "score": "sigmoid", "groups": 1,
                "group_top_k": 1, "expert_bias": False, "scale": 1.0, "renormalize": False,
                "aux_coeff": 0.0, "probs_on_input": True}  # Llama4ForCausalLM computes no load-balancing loss
    if c.get("model_type") == "glm4_moe":  # Glm4MoeTopkRouter: sigmoid + e_score_correction_bias, always grouped
        groups = c.get("n_group", 1)
        return {"experts": experts, "top_k": c.get("num_experts_per_tok", 8), "score": "sigmoid", "groups": groups,
                "group_top_k": c.get("topk_group", 1) if groups > 1 else 1, "expert_bias": True,
                "scale": c.get("routed_scaling_factor", 1.0), "renormalize": flags.flag("norm_topk_prob", True),
                "aux_coeff": None, "probs_on_input": False}  # no load-balancing loss in the config (or the model)
    return {"experts": experts, "top_k": c["num_experts_per_tok"], "score": c.get("scoring_func", "softmax"),
            "groups": c.get("n_group", 1) if c.get("topk_method") == "noaux_tc" else 1,
            "group_top_k": c.get("topk_group", 1) if c.get("topk_method") == "noaux_tc" else 1,
            "expert_bias": c.get("topk_method") == "noaux_tc", "scale": c.get("routed_scaling_factor", 1.0),
            # Mixtral: top-k of the logits, softmax over them (renormalized); Qwen/DeepSeek: norm_topk_prob
            # GPT-OSS (GptOssTopKRouter): top-k of the logits, softmax over them, as Mixtral
            "renormalize": flags.flag("norm_topk_prob", c.get("model_type") in ("mixtral", "gpt_oss")),
            "aux_coeff": c.get("router_aux_loss_coef", c.get("aux_loss_alpha")), "probs_on_input": False}


def _init_megatron() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if not dist.is_initialized():  # one process: an in-memory store, no TCP port to collide with another check
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(1, 1)


def megatron_model(argv: list[str], vocab_size: int) -> tuple[Any, Any]:
    """megatron-core's GPTModel (on meta) for an emitted argument list, at tp = pp = ep = 1 (the model, not the
    layout, is compared)."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_decoder_block_spec, get_gpt_layer_local_spec,
                                                           get_gpt_mtp_block_spec)
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    from autoplan.emit.megatron import parse_megatron_args
    from autoplan.validate.megatron_checks import gpt_model_kwargs, transformer_config_kwargs

    ns = parse_megatron_args(argv)
    if ns.experimental_attention_variant is not None:
        raise RuntimeError(f"--experimental-attention-variant {ns.experimental_attention_variant}: megatron-core 0.16.1 "
                           "builds that block only from Transformer Engine's spec (experimental_attention_variant_"
                           "module_specs.py:353-369 TESpecProvider; :390 get_gpt_layer_with_transformer_engine_spec), "
                           "absent on this CPU machine; tests/test_gdn.py checks megatron-core's GatedDeltaNet module "
                           "and layer patterns instead")
    _init_megatron()
    ns.padded_vocab_size = vocab_size
    if ns.experimental_attention_variant is not None:
        # megatron-core 0.16.1 builds DSAttention only through Transformer Engine's spec provider
        # (experimental_attention_variant_module_specs.py:188, 356-367: TESpecProvider, no local backend), and
        # the decoder block specs used below would build dense MLA layers without the indexer: no comparison.
        raise ValueError(f"--experimental-attention-variant {ns.experimental_attention_variant}: megatron-core "
                         "0.16.1 builds it only with Transformer Engine's spec provider "
                         "(experimental_attention_variant_module_specs.py:356-367); the model-equivalence check "
                         "builds the local (non-TE) spec, which has no DSA indexer, so it does not compare this model")
    mla, kw = transformer_config_kwargs(ns)
    kw.update(use_cpu_initialization=True, perform_initialization=False, tensor_model_parallel_size=1,
              pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None, context_parallel_size=1,
              expert_model_parallel_size=1, expert_tensor_parallel_size=1, sequence_parallel=False,
              num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None,
              recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
              # the dispatcher moves tokens, it is not part of the model; alltoall allocates a CUDA stream at build
              moe_token_dispatcher_type="allgather", moe_grouped_gemm=False,  # grouped GEMM: same parameters
              moe_permute_fusion=False)  # nor is the permutation (TE's fused one: a kernel this machine lacks)
    zero_centered = kw.pop("layernorm_zero_centered_gamma", False)  # see megatron_fields' "norm"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = (MLATransformerConfig if mla else TransformerConfig)(**kw)
        if cfg.num_moe_experts:
            spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False)
        else:
            spec = get_gpt_layer_local_spec(qk_layernorm=cfg.qk_layernorm, multi_latent_attention=mla,
                                            normalization=cfg.normalization)
        if mla:
            _parameterless_core_attention(spec)
        mtp = get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False) if cfg.mtp_num_layers else None
        # megatron-core 0.16's MLA builds YarnRotaryEmbedding without passing use_cpu_initialization, so it asks
        # torch.cuda.current_device(); on a CPU-only torch answer "cpu" for the duration of the build.
        saved = torch.cuda.current_device
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        # Without Transformer Engine, multi_latent_attention.TELinear is a placeholder (None or a mock, not a class)
        # and MLA's isinstance() check on it raises; a class nothing is an instance of gives the answer that check
        # means (not a TE linear).
        import megatron.core.transformer.multi_latent_attention as mla_mod
        saved_te = getattr(mla_mod, "TELinear", None)
        if not isinstance(saved_te, type):
            mla_mod.TELinear = type("NoTELinear", (), {})  # type: ignore[attr-defined]
        try:
            with torch.device("meta"):
                model = GPTModel(config=cfg, transformer_layer_spec=spec, mtp_block_spec=mtp, **gpt_model_kwargs(ns))
        finally:
            torch.cuda.current_device = saved  # type: ignore[assignment]
            mla_mod.TELinear = saved_te  # type: ignore[attr-defined]
    cfg.layernorm_zero_centered_gamma = zero_centered  # what the emitted arguments configure
    return cfg, model


def _parameterless_core_attention(spec: Any) -> None:
    """megatron-core 0.16's non-TE MLA spec pairs MLASelfAttention with a DotProductAttention that rejects its
    ``k_channels`` argument (a TE-only path). The core attention holds no parameters and the softmax scale is
    MLASelfAttention's own, so for building the model it is replaced by a parameterless stand-in."""
    import torch

    class CoreAttention(torch.nn.Module):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__()
            self.softmax_scale = kwargs.get("softmax_scale")

    layers = getattr(spec, "layer_specs", None) or [spec]
    for layer in layers:
        attn = layer.submodules.self_attention
        attn.submodules.core_attention = CoreAttention


def _effective_inv_freq(rope: Any) -> Any:
    """The frequencies a Megatron rotary module applies: ``inv_freq`` for RoPE (llama3 scaling applied at init);
    for YaRN the blend ``YarnRotaryEmbedding.get_emb`` forms, computed with megatron-core's own ramp functions."""
    if not hasattr(rope, "inv_freq_extra"):
        return rope.inv_freq
    import torch
    from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding as yarn

    low, high = yarn._yarn_find_correction_range(rope.beta_fast, rope.beta_slow, rope.dim, rope.rotary_base,
                                                 rope.original_max_position_embeddings,
                                                 rope.correction_range_round_to_int)
    mask = 1.0 - yarn._yarn_linear_ramp_mask(low, high, rope.dim // 2, device="cpu").to(dtype=torch.float32)
    return rope.inv_freq_inter * (1 - mask) + rope.inv_freq_extra * mask


def megatron_fields(argv: list[str], vocab_size: int) -> dict[str, Any]:
    cfg, model = megatron_model(argv, vocab_size)
    named = dict(model.named_parameters())
    mods = dict(model.named_modules())
    attn = mods["decoder.layers.0.self_attention"]
    rope = getattr(model, "rotary_pos_emb", None) or attn.rotary_pos_emb
    router = None
    if cfg.num_moe_experts:
        router = {"experts": cfg.num_moe_experts, "top_k": cfg.moe_router_topk, "score": cfg.moe_router_score_function,
                  "groups": cfg.moe_router_num_groups or 1, "group_top_k": cfg.moe_router_group_topk or 1,
                  "expert_bias": cfg.moe_router_enable_expert_bias,
                  "scale": cfg.moe_router_topk_scaling_factor or 1.0,
                  # topk_softmax_with_capacity: sigmoid scores are always renormalized over the k chosen; softmax is
                  # renormalized unless moe_router_pre_softmax (megatron/core/transformer/moe/moe_utils.py)
                  # (sigmoid at top-1: the score itself, moe_utils.py:724 @ core_v0.16.1)
                  "renormalize": (cfg.moe_router_score_function == "sigmoid" and cfg.moe_router_topk > 1)
                  or (cfg.moe_router_score_function == "softmax" and not cfg.moe_router_pre_softmax),
                  "aux_coeff": cfg.moe_aux_loss_coeff, "probs_on_input": bool(cfg.moe_apply_probs_on_input),
                  # router.py:94-100: fp32 / fp64 gate output when set, else the input's dtype
                  "logits_fp32": cfg.moe_router_dtype in ("fp32", "fp64")}
    from megatron.core.transformer.utils import is_layer_window_attention

    window = cfg.window_size[0] + 1 if cfg.window_size else None
    core = attn.core_attention
    layers = [int(k.split(".")[2]) for k in mods if k.count(".") == 2 and k.startswith("decoder.layers.")]
    return {
        "layer_windows": [window if is_layer_window_attention(cfg.window_size, cfg.window_attn_skip_freq, i + 1)
                          else None for i in sorted(layers)],
        "attention_sinks": sum(p.numel() for k, p in named.items() if k.endswith("softmax_offset")
                               and not k.startswith("mtp.")),
        "glu": (cfg.activation_func.__name__, float(cfg.glu_linear_offset), cfg.activation_func_clamp_value),
        "params": sum(p.numel() for k, p in named.items() if not k.startswith("mtp.")),
        "mtp_params": sum(p.numel() for k, p in named.items() if k.startswith("mtp.")),
        "rope_inv_freq": _effective_inv_freq(rope).double(),
        "norm_eps": float(cfg.layernorm_epsilon),
        # the GPU run's TENorm takes both from the config (extensions/transformer_engine.py:442-461); the CPU build's
        # WrappedTorchNorm refuses zero-centered gamma (torch_norm.py:26-28), so the model above is built without it
        "norm": ("layernorm" if cfg.normalization == "LayerNorm" else "rmsnorm",
                 bool(cfg.layernorm_zero_centered_gamma)),
        "qk_norm": "decoder.layers.0.self_attention.q_layernorm" in mods and
                   not type(mods["decoder.layers.0.self_attention.q_layernorm"]).__name__ == "IdentityOp",
        "window": window,
        "softmax_scale": float(getattr(attn, "softmax_scale", None) or getattr(core, "softmax_scale", None) or
                               1.0 / (cfg.kv_channels ** 0.5)),
        "router": router,
        # megatron-core: no_rope_freq[i] = 1 skips the rotary (attention.py:916-921); the q/k norm module of each
        # layer's spec (L2Norm under --qk-l2-norm, gpt_layer_specs.py:149-152)
        "rope_layers": [not (cfg.no_rope_freq and cfg.no_rope_freq[i]) for i in sorted(layers)],
        "qk_l2_layers": [type(mods.get(f"decoder.layers.{i}.self_attention.q_layernorm")).__name__ == "L2Norm"
                         for i in sorted(layers)],
        # --rotary-interleaved, or MLA, whose rotary takes the (2i, 2i+1) pairs (x[0::2], x[1::2] before rotate_half:
        # rope_utils.py:115-118 @ core_v0.16.1, multi_latent_attention=config.multi_latent_attention)
        "rope_interleaved": bool(cfg.rotary_interleaved or cfg.multi_latent_attention),
    }


def _titan_config(plan: Any) -> Any:
    """torchtitan's Trainer.Config for the emitted plan: the emitted config module when there is one (executed as
    the launch script would import it), else the shipped config_registry function."""
    import importlib

    from autoplan.emit.torchtitan import CONFIG_FN, config_module, needs_config_module, titan_model

    t = titan_model(plan.model)
    if needs_config_module(plan):
        scope: dict[str, Any] = {}
        exec(compile(config_module(plan), "autoplan_torchtitan_config.py", "exec"), scope)  # noqa: S102 (ours)
        return scope[CONFIG_FN]()
    return getattr(importlib.import_module(f"torchtitan.models.{t.module}.config_registry"), t.config_fn)()


def _rope_freqs(rope_cfg: Any) -> Any:
    """The frequencies of a torchtitan RoPE module (built on CPU from the layer's config): the phase advance
    between positions 0 and 1 of its cache (complex ``freqs_cis`` or ``cos``/``sin``)."""
    import torch

    module = rope_cfg.build()
    bufs = dict(module.named_buffers())
    cache = next(iter(bufs.values()))
    if torch.is_complex(cache):
        return torch.angle(cache[1]).double()
    half = cache.shape[-1] // 4 if cache.shape[-1] == 2 * rope_cfg.dim else cache.shape[-1] // 2
    cos, sin = cache[1, :half], cache[1, cache.shape[-1] // 2:cache.shape[-1] // 2 + half]
    return torch.atan2(sin, cos).double()


def torchtitan_fields(plan: Any) -> dict[str, Any]:
    import torch

    cfg = _titan_config(plan)
    mc = cfg.model_spec.model
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = mc.build()
    named = dict(model.named_parameters())
    names = {n for n, _ in model.named_modules()}
    layer = mc.layers[0]
    moe = next((x.moe for x in mc.layers if getattr(x, "moe", None) is not None), None)
    router = None
    if moe is not None:
        r = moe.router
        router = {"experts": moe.num_experts, "top_k": r.top_k, "score": r.score_func,
                  "groups": r.num_expert_groups or 1, "group_top_k": r.num_limited_groups or 1,
                  "expert_bias": moe.load_balance_coeff is not None, "scale": r.route_scale,
                  "renormalize": bool(r.route_norm), "aux_coeff": None,  # torchtitan has no auxiliary loss
                  "logits_fp32": _titan_gate_fp32()}
    attn = dict(model.named_modules())["layers.0.attention"]
    head = getattr(layer.attention, "qk_nope_head_dim", 0) + getattr(layer.attention, "qk_rope_head_dim", 0) or \
        getattr(layer.attention, "head_dim", None) or mc.dim // layer.attention.n_heads
    scale = getattr(attn, "softmax_scale", None) or head ** -0.5
    return {
        "params": sum(p.numel() for k, p in named.items() if not k.startswith("mtp")),
        "mtp_params": sum(p.numel() for k, p in named.items() if k.startswith("mtp")),
        "rope_inv_freq": _rope_freqs(layer.attention.rope),
        "norm_eps": float(layer.attention_norm.eps),
        "norm": norm_probe(dict(model.named_modules())["layers.0.attention_norm"]),
        "qk_norm": any(n.endswith(("attention.q_norm", "attention.qk_norm")) for n in names),
        "window": getattr(layer.attention, "sliding_window_size", None),
        "layer_windows": [getattr(x.attention, "sliding_window_size", None) for x in mc.layers],
        "attention_sinks": sum(p.numel() for k, p in named.items() if k.endswith("attention.sinks")),
        "glu": _titan_glu(moe),
        "softmax_scale": float(scale),
        "router": router,
    }


def _titan_gate_fp32() -> bool:
    """Whether torchtitan's router computes its gate under a float32 autocast (0.3.0: TokenChoiceTopKRouter.forward,
    torchtitan/models/common/moe.py:297-299, every model). Read from its source: the autocast is to CUDA, which a
    CPU build cannot run."""
    import inspect

    from torchtitan.models.common.moe import TokenChoiceTopKRouter

    src = inspect.getsource(TokenChoiceTopKRouter.forward)
    return "torch.autocast" in src and "dtype=torch.float32" in src


def _titan_glu(moe: Any) -> tuple[str, float, float | None]:
    """torchtitan's gated MLP: GPT-OSS experts run ``swiglu(x, alpha=1.702, limit)`` (+1 on the linear half,
    torchtitan/models/gpt_oss/moe.py:67-73; alpha is that function's default); every other family SiLU-GLU
    (models/common feed-forward: F.silu(w1 x) * w3 x)."""
    inner = getattr(getattr(moe, "routed_experts", None), "inner_experts", None)
    if inner is not None and hasattr(inner, "swiglu_limit"):
        import inspect

        from torchtitan.models.gpt_oss.moe import swiglu

        alpha = inspect.signature(swiglu).parameters["alpha"].default
        return ("quick_gelu" if alpha == 1.702 else f"x*sigmoid({alpha}x)", 1.0, float(inner.swiglu_limit))
    return ("silu", 0.0, None)


# Compared for megatron-core only: torchtitan 0.3.0 ships no model with NoPE layers or a weightless q/k norm (it has
# no Llama 4: emit refuses it, cost_models/targets/torchtitan_models.py), and its ComplexRoPE takes HF's rotate-half
# weights through the state-dict adapter's q/k row permutation (torchtitan/models/llama3/state_dict_adapter.py), so
# its pair layout is not the function's by name
MEGATRON_ONLY = frozenset({"rope_layers", "qk_l2_layers", "rope_interleaved"})


def compare(model: Any, hf_config: dict[str, Any], framework: str) -> list[Row]:
    """Rows for one model: the emitted model of ``framework`` (megatron-core or torchtitan; a tp = pp = 1 plan)
    against transformers' model of the same config.json."""
    import torch

    from autoplan.catalog import build_cluster
    from autoplan.emit.megatron import megatron_args
    from autoplan.emit.plan import EmitPlan
    from cost_models.specs import JobSpec, ParallelConfig

    plan = EmitPlan(model=model, cluster=build_cluster("h100-sxm", 8), job=JobSpec(global_batch_size=8, seq_len=4096),
                    parallel=ParallelConfig(tp=1))
    ref = hf_reference(hf_config, plan.job.seq_len)
    ours = megatron_fields(megatron_args(plan), model.vocab_size) if framework == "megatron-core" else \
        torchtitan_fields(plan)
    rows: list[Row] = []
    for field, theirs in ref.items():
        if field in MEGATRON_ONLY and framework != "megatron-core":
            continue
        mine = ours[field]
        if field == "rope_inv_freq":
            # torchtitan's frequencies are read back from its float32 cache (phase at position 1): float32 tolerance
            same = mine.shape == theirs.shape and bool(torch.allclose(mine, theirs, rtol=1e-6, atol=1e-7))
            mine, theirs = (f"{mine.shape[0]} freqs", f"{theirs.shape[0]} freqs, max |diff| "
                            f"{float((mine - theirs).abs().max()) if mine.shape == theirs.shape else 'n/a':.1e}")
            rows.append((model.name, framework, field, mine if same else "DIFFERENT", theirs))
            continue
        if field == "softmax_scale":
            same = abs(mine - theirs) <= 1e-12 * abs(theirs)
            rows.append((model.name, framework, field, theirs if same else mine, theirs))
            continue
        rows.append((model.name, framework, field, mine, theirs))
    rows.append((model.name, framework, "mtp_params (vs ModelSpec.mtp_params)", ours["mtp_params"],
                 model.mtp_params))
    return rows


def main(argv: list[str]) -> int:
    """``python -m autoplan.validate.model_equivalence MODEL CONFIG_JSON [megatron-core|torchtitan]``: JSON rows on stdout (one process per
    model: megatron-core's parallel state and torch.distributed are process-global)."""
    import json
    import sys

    from autoplan.catalog import load_model

    warnings.simplefilter("ignore")
    model, config = load_model(argv[0]), json.loads(open(argv[1]).read())
    rows = compare(model, config, argv[2] if len(argv) > 2 else "megatron-core")
    json.dump([list(r) for r in rows], sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
