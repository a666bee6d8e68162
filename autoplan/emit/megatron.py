"""Megatron-LM: the ``pretrain_gpt.py`` argument list for a plan, and its launch scripts.

Flag names are those of Megatron-LM's ``megatron/training/arguments.py`` (``_add_network_size_args``,
``_add_distributed_args``, ``_add_training_args``, ``_add_moe_args``, ``_add_mla_args``,
``_add_transformer_engine_args``). ``megatron_parser()`` declares the subset autoplan writes, with the
same types and choices, so the emitted list is parsed back the way Megatron parses it; the
``validate`` extra then builds megatron-core's ``TransformerConfig`` from it.

Rank order is Megatron's default ``tp-cp-ep-dp-pp`` (see ``autoplan.emit.ranks``).
"""

from __future__ import annotations

import argparse
from typing import Any

from autoplan.emit.launch import bash_array, script_header, slurm_script, torchrun_script
from autoplan.emit.plan import EmitPlan, dynamic_rope_notes
from autoplan.errors import ConfigError
from cost_models.muon import MUON_NS_STEPS
from cost_models.targets import MEGATRON, Runtime
from cost_models.targets.common import CORE_RELEASES
from cost_models.targets.megatron import (PROFILE, FUSED_MLP_GLU_INTERLEAVE, fixed_rope_error, model_flags_error,
                                          padded_vocab_size, rope_scaling_error, vocab_divisor)
from cost_models.validate import pipeline_split

ENTRYPOINT = "pretrain_gpt.py"
# Hybrid Mamba stacks train with pretrain_mamba.py (mamba_builders.py: megatron-core's MambaModel from the --spec
# layer spec; Megatron-LM core_v0.16.1).
MAMBA_ENTRYPOINT = "pretrain_mamba.py"
MAMBA_SPEC = ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec")


def entrypoint(model: Any) -> str:
    """The Megatron-LM training script of ``model``."""
    return MAMBA_ENTRYPOINT if model.is_hybrid else ENTRYPOINT


def _expert_tp(plan: EmitPlan) -> int:
    """Expert-TP as the megatron target profile prices it (``MegatronProfile.expert_tensor_parallel``: 1, tokens,
    not expert weights, split across the TP ranks); Megatron's MoE parallel folding then re-cuts the tp*cp*dp ranks
    of a stage as ep x edp, so ep may span the TP ranks (``MegatronProfile.expert_ranks``)."""
    del plan
    etp = MEGATRON.expert_tensor_parallel
    assert etp is not None
    return etp


def megatron_args(plan: EmitPlan) -> list[str]:
    """The argv (without the entry point) that trains ``plan`` with Megatron-LM."""
    m, par, job = plan.model, plan.parallel, plan.job
    if (refusal := mtp_not_emitted(m)) is not None:
        raise refusal
    rt = plan.runtime("megatron")  # knobs and run-time semantics the plan was priced with
    if rt.bf16_layers != (0, 0) or rt.quant_recipe is not None:
        given = ", ".join(f"{k}={v}" for k, v in (("bf16_layers", list(rt.bf16_layers)), ("quant_recipe", rt.quant_recipe))
                          if v not in ([0, 0], None))
        raise ConfigError(f"{given}: priced (cost_models.quant_layout), not emitted: the emitter writes no "
                          "--first-last-layers-bf16 / --num-layers-at-*-in-bf16 nor a --te-precision-config-file "
                          "recipe (TransformerConfig fields of Megatron-Core; Megatron-Bridge sets them in its "
                          "mixed-precision and perf recipes)", valid=["bf16_layers unset", "quant_recipe unset"])
    a: list[str] = []

    def add(flag: str, value: Any = None) -> None:
        a.append(flag)
        if value is not None:
            a.append(str(value))

    # ---- parallelism -----------------------------------------------------------------------------
    add("--tensor-model-parallel-size", par.tp)
    add("--pipeline-model-parallel-size", par.pp)
    if par.vp > 1 and par.pipeline_layout is None:  # a layout sets vp itself (arguments.py:503-527)
        add("--num-virtual-stages-per-pipeline-rank", par.vp)
    add("--context-parallel-size", par.cp)
    if m.is_moe:
        add("--expert-model-parallel-size", par.ep)
        add("--expert-tensor-parallel-size", _expert_tp(plan))
    if par.tp > 1 and par.sequence_parallel:
        add("--sequence-parallel")
    for flag, value in pipeline_split(m, par).megatron_flags():  # the split the cost model priced
        add(flag, value)
    if par.cp > 1:
        add("--cp-comm-type", {"allgather": "all_gather"}.get(rt.cp_comm_type, rt.cp_comm_type))
        if rt.cp_comm_type == "a2a+p2p" and rt.cp_a2a_size:  # [a2a level, p2p level] (MLM:403-408)
            a.extend(["--hierarchical-context-parallel-sizes", str(rt.cp_a2a_size), str(par.cp // rt.cp_a2a_size)])
    dp_cp = plan.dp * par.cp
    if par.zero_stage == 1:
        add("--use-distributed-optimizer")
        if par.hsdp_shard_size and par.hsdp_shard_size < dp_cp:
            add("--num-distributed-optimizer-instances", dp_cp // par.hsdp_shard_size)
    elif par.zero_stage == 2:  # Megatron-FSDP optim_grads (cost_models.targets.megatron cites the code)
        add("--use-megatron-fsdp")
        add("--data-parallel-sharding-strategy", "optim_grads")
        add("--use-distributed-optimizer")  # Megatron-FSDP user guide's "required configurations"
        add("--no-gradient-accumulation-fusion")
        add("--ckpt-format", "fsdp_dtensor")  # arguments.py:690
    elif par.zero_stage == 3:  # torch FSDP2: arguments.py:1031-1049
        add("--use-torch-fsdp2")
        add("--no-gradient-accumulation-fusion")
        add("--ckpt-format", "torch_dist")
    if rt.optimizer != "adam":  # Muon (cost_models.muon cites the code): on DDP, no overlaps (arguments.py:1177-1187)
        add("--optimizer", rt.optimizer)
        add("--muon-num-ns-steps", MUON_NS_STEPS)  # what the prediction priced (Megatron-LM's defaults)
        add("--muon-tp-mode", rt.muon_tp_mode)
    if rt.overlap_grad_reduce:
        add("--overlap-grad-reduce")
    if rt.overlap_param_gather:
        add("--overlap-param-gather")
    if rt.grad_reduce_dtype == "bf16":
        add("--grad-reduce-in-bf16")
    if rt.fp8_param_gather:  # fp8 primary weights (cost_models.targets.megatron cites the code)
        add("--fp8-param-gather")
    if rt.cross_entropy_fusion == "te":  # TE's fused loss (cost_models.targets.megatron cites the code)
        add("--cross-entropy-loss-fusion")
        add("--cross-entropy-fusion-impl", "te")
    if rt.cpu_offload_layers:  # TE activation offload (cost_models.targets.megatron cites the code)
        add("--cpu-offloading-num-layers", rt.cpu_offload_layers)
    if rt.adam_moments_dtype != "fp32":  # precision-aware optimizer (cost_models.targets.megatron cites the code)
        add("--use-precision-aware-optimizer")
        add("--exp-avg-dtype", rt.adam_moments_dtype)
        add("--exp-avg-sq-dtype", rt.adam_moments_dtype)
    if rt.tp_comm_overlap:
        add("--tp-comm-overlap")
    if m.is_moe:  # MoE run-time knobs (cost_models.targets.megatron cites transformer_config.py)
        if rt.moe_dispatcher in ("deepep", "hybridep"):
            add("--moe-token-dispatcher-type", "flex")
            add("--moe-flex-dispatcher-backend", rt.moe_dispatcher)
        else:
            add("--moe-token-dispatcher-type", "alltoall")
        if rt.moe_a2a_overlap:
            add("--overlap-moe-expert-parallel-comm")
        if rt.moe_force_balance:
            add("--moe-router-force-load-balancing")
        if rt.moe_capacity_factor is not None:
            add("--moe-expert-capacity-factor", rt.moe_capacity_factor)
            add("--moe-pad-expert-input-to-capacity")
        if rt.moe_router_padding:  # a TransformerConfig field made a flag (arguments.py:1621 @ core_v0.16.1)
            add("--moe-router-padding-for-quantization")
        if rt.moe_fused_grouped_mlp:  # TE's fused grouped MLP (core_v0.18.0+ flags; its env rides Runtime.env)
            add("--use-transformer-engine-op-fuser")
            add("--moe-mlp-glu-interleave-size", FUSED_MLP_GLU_INTERLEAVE)
    if rt.cuda_graph_impl != "none":  # CUDA graphs (cost_models.targets.megatron.check_cuda_graphs cites the rules)
        add("--cuda-graph-impl", rt.cuda_graph_impl)
        if rt.cuda_graph_scope:  # none given: each whole layer (Megatron's default)
            a.append("--cuda-graph-scope")
            a.extend(rt.cuda_graph_scope)
        if "full_iteration" in rt.cuda_graph_scope:  # arguments.py:725-728
            add("--no-check-for-nan-in-loss-and-grad")
        if rt.cuda_graph_impl == "local" and par.ep > 1:  # arguments.py:1158-1160 asks it of every local graph
            add("--moe-pad-experts-for-cuda-graph-inference")
    # ---- batch -----------------------------------------------------------------------------------
    add("--micro-batch-size", par.micro_batch_size)
    add("--global-batch-size", job.global_batch_size)
    add("--seq-length", job.seq_len)
    add("--max-position-embeddings", max(job.seq_len, m.learned_position_embeddings))
    # ---- recompute -------------------------------------------------------------------------------
    if par.recompute == "selective" and par.recompute_modules != ():  # () recomputes nothing: no flag says that
        add("--recompute-granularity", "selective")
        if par.recompute_modules is not None:  # Megatron's default is core_attn (transformer_config.py:1193-1194)
            a.append("--recompute-modules")
            a.extend(par.recompute_modules)
    elif par.recompute == "full":
        add("--recompute-granularity", "full")
        add("--recompute-method", "uniform")
        add("--recompute-num-layers", 1)
    # ---- model -----------------------------------------------------------------------------------
    a += model_args(plan)
    # ---- precision -------------------------------------------------------------------------------
    add("--bf16")
    if job.precision == "fp8":
        add("--fp8-format", "hybrid")
        add("--fp8-recipe", rt.fp8_recipe)
    elif job.precision == "nvfp4":  # TransformerConfig.fp4 / fp4_recipe (cost_models.targets.megatron doc)
        add("--fp4-format", "e2m1")
        add("--fp4-recipe", "nvfp4")
    return a


# MLATransformerConfig's YaRN fields that Megatron-LM 0.16 has no flag for (megatron/core/transformer/
# transformer_config.py): a model needing other values cannot be expressed. llama3's: the profile's LLAMA3_FIXED.
YARN_FIXED = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def model_args(plan: EmitPlan) -> list[str]:
    """The model as Megatron-LM flags: shapes, positions (RoPE base/scaling), norms, activation, dropout, window,
    MLA, MoE routing and MTP, vocabulary padding. Raises ``ConfigError`` for a fact Megatron cannot express."""
    m, arch = plan.model, plan.model.arch
    a: list[str] = []

    def add(flag: str, value: Any = None) -> None:
        a.append(flag)
        if value is not None:
            a.append(str(value))

    add("--num-layers", m.num_layers)
    add("--hidden-size", m.hidden_size)
    add("--ffn-hidden-size", m.ffn_hidden_size)
    add("--num-attention-heads", m.num_attention_heads)
    if m.mla is None and m.num_kv_heads != m.num_attention_heads:
        add("--group-query-attention")
        add("--num-query-groups", m.num_kv_heads)
    if m.head_dim is not None and m.mla is None and m.head_dim * m.num_attention_heads != m.hidden_size:
        add("--kv-channels", m.head_dim)
    if (err := model_flags_error(m)) is not None:
        raise err  # activation, ALiBi, RoPE base: the rule the estimate's note quotes (MegatronProfile.model_notes)
    # activation: SwiGLU / quick-GeGLU (x*sigmoid(1.702x), GPT-OSS) / GELU (erf) / GELU tanh (--openai-gelu)
    if m.gated_mlp:
        add("--swiglu" if arch.activation == "silu" else "--quick-geglu")
    elif arch.activation == "relu2":
        add("--squared-relu")  # arguments.py:1338-1340: activation_func = squared_relu (relu(x)^2, Nemotron-H)
    # GPT-OSS's clamped GLU (quick_gelu only: model_flags_error)
    if arch.glu_linear_offset:
        add("--glu-linear-offset", arch.glu_linear_offset)
    if arch.activation_clamp is not None:
        add("--activation-func-clamp-value", arch.activation_clamp)
    add("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm")
    add("--norm-epsilon", arch.norm_eps)
    if arch.norm_zero_centered_gamma:  # TransformerConfig.layernorm_zero_centered_gamma (transformer_config.py:155-157)
        add("--apply-layernorm-1p")
    if arch.qk_norm or m.mla is not None:
        # Qwen3 / GLM per-head q/k RMSNorm; for MLA the q/kv latent RMSNorms (always in DeepSeek). A norm over the
        # whole projection (OLMoE) gets the per-head one, with a WARNING (``unbuilt_facts``).
        add("--qk-layernorm")
    if arch.qk_l2_norm:  # every layer: only without NoPE layers (model_flags_error)
        add("--qk-l2-norm")
    add("--attention-dropout", arch.attention_dropout)
    add("--hidden-dropout", arch.hidden_dropout)
    if not m.linear_bias:
        add("--disable-bias-linear")
        if m.qkv_bias:
            add("--add-qkv-bias")
    if arch.sliding_window:
        # HF: key j visible from query i iff i - W < j <= i (transformers masking_utils.sliding_window_overlay),
        # i.e. flash-attention's window (left W-1, right 0), which is what Megatron's --window-size is.
        add("--window-size", f"({arch.sliding_window - 1},0)")
        if arch.full_attention_every:  # layer_number % N == 0 attends fully (transformer/utils.py:451-466)
            add("--window-attn-skip-freq", arch.full_attention_every)
    if arch.attention_sinks:  # a learned per-head softmax offset: core_attention.softmax_offset
        add("--softmax-type", "learnable")
    if m.learned_position_embeddings:
        add("--position-embedding-type", "learned_absolute")
    elif arch.no_position_encoding:
        add("--position-embedding-type", "none")  # MambaModel / GPTModel: no rotary, no position table
    else:
        add("--position-embedding-type", "rope")
        add("--rotary-base", int(arch.rope_theta))  # an integer (model_flags_error)
        if arch.rotary_fraction != 1.0:
            add("--rotary-percent", arch.rotary_fraction)
        if arch.rope_interleaved:  # RotaryEmbedding: adjacent pairs (rotary_pos_embedding.py:167-172)
            add("--rotary-interleaved")
        if arch.no_rope_every:  # layer_number % N == 0 skips the rotary (transformer_config.py:1963-1978)
            add("--no-rope-freq", no_rope_pattern(m.num_layers, arch.no_rope_every))
        rs = arch.rope_scaling
        if (err := rope_scaling_error(m) or PROFILE.seq_len_error(m, plan.job.seq_len)) is not None:
            raise err  # the rules the estimate's notes quote (MegatronProfile.model_notes, job_notes)
        if rs is not None and rs.type == "llama3":
            add("--use-rope-scaling")
            add("--rope-scaling-factor", rs.factor)
        elif rs is not None and rs.type == "yarn" and m.mla is None:
            pass  # no Megatron-LM flag (``yarn_not_emitted``): plain RoPE, and the README says so
        elif rs is not None and rs.type == "yarn":
            if (err := fixed_rope_error(m.name, rs, YARN_FIXED, "Megatron-LM's MLA YaRN (no flag for these)")):
                raise err
            if not rs.truncate:
                raise ConfigError(f"{m.name}: YaRN with truncate=false has no Megatron-LM flag (MLA rounds the "
                                  "correction range)", valid=[True])
            add("--rope-type", "yarn")
            add("--rotary-scaling-factor", rs.factor)
            add("--mscale", rs.mscale)
            add("--mscale-all-dim", rs.mscale_all_dim)
        elif m.mla is not None:
            add("--rope-type", "rope")
    if not m.tied_embeddings:
        add("--untie-embeddings-and-output-weights")
    add("--make-vocab-size-divisible-by", vocab_divisor(m.vocab_size, plan.parallel.tp))
    if m.mla is not None:
        add("--multi-latent-attention")
        if m.mla.q_lora_rank:
            add("--q-lora-rank", m.mla.q_lora_rank)
        add("--kv-lora-rank", m.mla.kv_lora_rank)
        add("--qk-head-dim", m.mla.qk_nope_head_dim)
        add("--qk-pos-emb-head-dim", m.mla.qk_rope_head_dim)
        add("--v-head-dim", m.mla.v_head_dim)
    if m.dsa is not None:  # DSAttention (dsa_model_error: every layer, MLA); TransformerConfig fields as flags
        add("--experimental-attention-variant", "dsa")
        add("--dsa-indexer-n-heads", m.dsa.index_heads)
        add("--dsa-indexer-head-dim", m.dsa.index_head_dim)
        add("--dsa-indexer-topk", m.dsa.index_topk)
        # required: dsa.py:801-810 multiplies the KL by it in every training step (None would fail there)
        add("--dsa-indexer-loss-coeff", m.dsa.indexer_loss_coeff)
        if m.dsa.sparse_loss:
            add("--dsa-indexer-use-sparse-loss")
        add("--no-rope-fusion")  # transformer_config.py:1991 @ core_v0.16.1: "RoPE fusion is not supported"
        if plan.runtime("megatron").dsa_kernel_backend != "none":  # core_v0.19.0+ (dsa_backend_error)
            add("--dsa-kernel-backend", plan.runtime("megatron").dsa_kernel_backend)
    if m.is_moe:
        r = arch.router
        add("--num-experts", m.num_experts)
        add("--moe-router-topk", m.moe_top_k)
        add("--moe-ffn-hidden-size", m.expert_ffn_hidden_size)
        if m.num_shared_experts:
            add("--moe-shared-expert-intermediate-size", m.num_shared_experts * m.expert_ffn_hidden_size)
        if m.shared_gate_params:
            add("--moe-shared-expert-gate")
        if m.first_dense_layers or m.moe_layer_freq > 1:
            add("--moe-layer-freq", moe_layer_pattern(plan))
        add("--moe-router-score-function", r.score_function)
        if r.probs_on_input:  # top-1 only (model_flags_error): the expert's input scaled by its weight
            add("--moe-apply-probs-on-input")
        # Megatron's topk_softmax_with_capacity: softmax -> top-k -> renormalize is its default (top-k of logits,
        # then softmax); --moe-router-pre-softmax keeps the un-renormalized softmax probabilities. Sigmoid scores
        # are always renormalized over the chosen k (megatron/core/transformer/moe/moe_utils.py).
        if r.score_function == "softmax" and not r.norm_top_k:
            add("--moe-router-pre-softmax")
        elif r.score_function == "sigmoid" and not r.norm_top_k and m.moe_top_k > 1:
            raise ConfigError(f"{m.name}: sigmoid routing without top-k renormalization has no Megatron-LM flag")
        if r.expert_bias:
            add("--moe-router-enable-expert-bias")
        if r.fp32_logits:  # TopKRouter.gating: TE's GEMM of the bf16 input and weight with an fp32 output (router.py:
            add("--moe-router-dtype", "fp32")  # 94-100, moe_utils.py:1192-1193 @ core_v0.16.1); HF's gate casts both
        if r.num_groups:
            add("--moe-router-num-groups", r.num_groups)
            add("--moe-router-group-topk", r.group_top_k)
        if r.top_k_scaling != 1.0:
            add("--moe-router-topk-scaling-factor", r.top_k_scaling)
        add("--moe-router-load-balancing-type", r.aux_loss if r.aux_loss_coeff or r.aux_loss == "none" else "none")
        if r.aux_loss != "none" and r.aux_loss_coeff:
            add("--moe-aux-loss-coeff", r.aux_loss_coeff)
        add("--moe-grouped-gemm")
        # TE's fused permute / unpermute / sort-by-expert (moe_utils.fused_*): the dispatch and combine passes
        # cost_models.moe prices (MEGATRON_PERMUTE_PASSES) and what every Megatron-Bridge MoE recipe runs, so the
        # rows the MoE host cost is fitted on (qwen_provider.py:375 @ v0.1.0rc4, :397 @ v0.3.0; deepseek_v3.py:109 @
        # v0.1.0rc4, :266 @ v0.3.0). Megatron-LM's default is off (transformer_config.py:708 @ core_v0.16.1): torch
        # index_select / scatter_add / split-and-cat by expert instead, sized from host copies of the counts.
        add("--moe-permute-fusion")
        if m.moe_latent_size:
            add("--moe-latent-size", m.moe_latent_size)
    if m.is_hybrid:
        a.extend(hybrid_args(m))
    if arch.attention_output_gate:  # sigmoid(gate) on the core attention's output (attention.py:1196-1224)
        add("--attention-output-gate")
    if m.gdn is not None:
        a.extend(gdn_args(m))
    if arch.mtp_layers:
        add("--mtp-num-layers", arch.mtp_layers)
    return a


def mtp_not_emitted(m: Any) -> ConfigError | None:
    """Why the emitter writes no command line for ``m``'s MTP: it writes core_v0.16.1's flags (pretrain_mamba.py
    --hybrid-override-pattern), and what the megatron target's megatron_core rule says core_v0.16.1 cannot build (a
    hybrid stack's MTP block, a repeated MTP layer) takes the unified '--hybrid-layer-pattern <main>/<block>/<block>'
    (megatron/training/arguments.py:735-775, 854-866 @ core_v0.18.0) that this emitter does not write."""
    if MEGATRON.model_runtime_error(m, Runtime("megatron", megatron_core=CORE_RELEASES[0])) is None:
        return None
    return ConfigError(f"{m.name}: the megatron emitter writes Megatron-Core 0.16.1's flags, and its MTP (block "
                       f"{m.arch.mtp_pattern!r}, {m.arch.mtp_layers} depths, repeated {m.arch.mtp_repeated}) needs "
                       "core_v0.17.0rc0 or later ('--hybrid-layer-pattern <main>/<block>/...', "
                       "megatron/training/arguments.py:735-775 @ core_v0.18.0), which autoplan does not emit yet: "
                       "estimate and search price it (--megatron-core), emit refuses",
                       valid=["mtp_layers=0", "estimate / search only"])


def hybrid_args(m: Any) -> list[str]:
    """A hybrid stack's flags (pretrain_mamba.py): the layer pattern, the Mamba-2 mixer's shape (TransformerConfig's
    mamba_* fields, transformer_config.py:843-860, as arguments through ArgumentGroupFactory) and the layer spec
    (mamba_builders.py: --spec is required). The mixer's conv taps, scan chunk and conv bias are MambaMixer's
    defaults (d_conv 4, chunk_size 128, conv_bias True: mamba_mixer.py:144-170), which MambaLayer passes no flag
    for; another value is refused."""
    mb = m.mamba
    out = ["--is-hybrid-model", "--hybrid-override-pattern", m.hybrid_pattern, "--spec", *MAMBA_SPEC]
    if mb is None:
        return out
    fixed = {"conv_kernel": (mb.conv_kernel, 4), "chunk_size": (mb.chunk_size, 128), "conv_bias": (mb.conv_bias, True)}
    for name, (got, want) in fixed.items():
        if got != want:
            raise ConfigError(f"{m.name}: mamba {name}={got} has no Megatron-LM flag (MambaMixer builds {want}, "
                              "megatron/core/ssm/mamba_mixer.py:144-170)", valid=[want])
    return out + ["--mamba-num-heads", str(mb.num_heads), "--mamba-head-dim", str(mb.head_dim),
                  "--mamba-state-dim", str(mb.state_dim), "--mamba-num-groups", str(mb.num_groups)]


def gdn_args(m: Any) -> list[str]:
    """Gated DeltaNet layers of a transformer stack (pretrain_gpt.py: gpt_builders.py:49-53 builds
    ``get_transformer_block_with_experimental_attention_variant_spec``): the variant, its every-N-th-layer SDPA pattern
    (``--linear-attention-freq`` N, arguments.py:2749 ``la_freq_type``: layer i is SDPA iff (i + 1) % N == 0,
    experimental_attention_variant_module_specs.py:317-326) and the mixer's shape (TransformerConfig's linear_*
    fields, transformer_config.py:275-295, flags through ArgumentGroupFactory). The conv has no bias and q/k are
    L2-normalised in every GDN layer (GatedDeltaNet's defaults, gated_delta_net.py:77-88), as in Qwen3-Next."""
    g = m.gdn
    return ["--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq",
            str(g.full_attention_every), "--linear-conv-kernel-dim", str(g.conv_kernel), "--linear-key-head-dim",
            str(g.key_head_dim), "--linear-value-head-dim", str(g.value_head_dim), "--linear-num-key-heads",
            str(g.num_key_heads), "--linear-num-value-heads", str(g.num_value_heads)]


def no_rope_pattern(num_layers: int, every: int) -> str:
    """``--no-rope-freq`` for NoPE on every ``every``-th layer: the integer where it divides ``num_layers``, else
    Megatron's list expression (1 = the layer skips RoPE), since TransformerConfig asserts ``num_layers %
    no_rope_freq == 0`` for the integer form (transformer_config.py:1965-1973 @ core_v0.16.1; the list form only
    needs ``num_layers`` entries, :1974-1978; arguments.py:208-229 no_rope_freq_type evaluates it)."""
    whole, rest = divmod(num_layers, every)
    if not rest:
        return str(every)
    return f"([0]*{every - 1}+[1])*{whole}+[0]*{rest}"


def moe_layer_pattern(plan: EmitPlan) -> str:
    """``--moe-layer-freq`` as Megatron's list expression: ``([0]*3+[1]*58)`` for 3 dense then MoE."""
    flags = [1 if plan.model.is_moe_layer(i) else 0 for i in range(plan.model.num_layers)]
    runs: list[tuple[int, int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1] = (f, runs[-1][1] + 1)
        else:
            runs.append((f, 1))
    return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"


def megatron_parser() -> argparse.ArgumentParser:
    """The subset of Megatron-LM's argument parser that autoplan emits (same names, types, choices,
    ``allow_abbrev=False``). Used to type-check emitted lists and to map them onto megatron-core."""
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False, add_help=False)
    ints = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size",
            "--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage",
            "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
            "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
            "--num-distributed-optimizer-instances", "--micro-batch-size", "--global-batch-size",
            "--seq-length", "--max-position-embeddings", "--recompute-num-layers", "--num-layers",
            "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups", "--kv-channels",
            "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
            "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
            "--rotary-base", "--make-vocab-size-divisible-by", "--moe-router-num-groups", "--moe-router-group-topk",
            "--mtp-num-layers", "--cpu-offloading-num-layers", "--moe-latent-size", "--mamba-num-heads",
            "--mamba-head-dim", "--mamba-state-dim", "--mamba-num-groups", "--linear-conv-kernel-dim",
            "--linear-key-head-dim", "--linear-value-head-dim", "--linear-num-key-heads", "--linear-num-value-heads",
            "--dsa-indexer-n-heads", "--dsa-indexer-head-dim", "--dsa-indexer-topk"]
    # experimental attention variant (TransformerConfig fields made flags, arguments.py:1621 @ core_v0.16.1)
    p.add_argument("--experimental-attention-variant", choices=["gated_delta_net", "dsa"], default=None)
    p.add_argument("--linear-attention-freq", type=str, default=None)  # Megatron's la_freq_type (arguments.py:256)
    p.add_argument("--dsa-indexer-loss-coeff", type=float, default=None)
    p.add_argument("--dsa-indexer-use-sparse-loss", action="store_true")
    p.add_argument("--no-rope-fusion", action="store_false", dest="apply_rope_fusion")  # arguments.py:2045-2048
    p.add_argument("--dsa-kernel-backend", choices=["none", "tilelang", "cudnn"], default="none")  # core_v0.19.0
    p.add_argument("--hybrid-override-pattern", type=str, default=None)
    p.add_argument("--spec", type=str, nargs="*", default=None)
    p.add_argument("--no-gradient-accumulation-fusion", action="store_false", dest="gradient_accumulation_fusion")
    p.add_argument("--ckpt-format", choices=["torch", "torch_dist", "torch_dcp", "fsdp_dtensor"], default="torch_dist")
    p.add_argument("--cp-comm-type", nargs="+", default=["p2p"])
    p.add_argument("--data-parallel-sharding-strategy", default="no_shard",
                   choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    p.add_argument("--hierarchical-context-parallel-sizes", nargs="+", type=int, default=None)
    p.add_argument("--cross-entropy-fusion-impl", choices=["native", "te"], default="native")
    p.add_argument("--cuda-graph-impl", choices=["none", "local", "transformer_engine"], default="none")
    p.add_argument("--cuda-graph-scope", nargs="+", default=[],
                   choices=["full", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"])
    p.add_argument("--no-check-for-nan-in-loss-and-grad", action="store_false", dest="check_for_nan_in_loss_and_grad")
    p.add_argument("--fp8-recipe", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"],
                   default="delayed")
    p.add_argument("--optimizer", choices=["adam", "sgd", "muon", "dist_muon"], default="adam")  # arguments.py:2056
    p.add_argument("--muon-num-ns-steps", type=int, default=5)  # arguments.py:1851-1855
    p.add_argument("--muon-tp-mode", choices=["blockwise", "duplicated", "distributed"], default="blockwise")
    for flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype"):
        p.add_argument(flag, choices=["fp32", "fp16", "bf16", "fp8"], default="fp32")
    for flag in ints:
        p.add_argument(flag, type=int, default=None)
    for flag in ["--sequence-parallel", "--use-distributed-optimizer", "--use-torch-fsdp2", "--use-megatron-fsdp",
                 "--cross-entropy-loss-fusion",
                 "--overlap-grad-reduce",
                 "--overlap-param-gather", "--group-query-attention", "--swiglu", "--disable-bias-linear",
                 "--add-qkv-bias", "--untie-embeddings-and-output-weights", "--multi-latent-attention",
                 "--moe-grouped-gemm", "--bf16", "--qk-layernorm", "--use-rope-scaling",
                 "--moe-router-pre-softmax", "--moe-router-enable-expert-bias",
                 "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                 "--grad-reduce-in-bf16", "--tp-comm-overlap", "--use-precision-aware-optimizer",
                 "--fp8-param-gather", "--overlap-moe-expert-parallel-comm", "--moe-router-force-load-balancing",
                 "--moe-pad-expert-input-to-capacity", "--moe-pad-experts-for-cuda-graph-inference",
                 "--quick-geglu", "--squared-relu", "--is-hybrid-model", "--moe-shared-expert-gate",
                 "--apply-layernorm-1p", "--rotary-interleaved", "--attention-output-gate",
                 # TransformerConfig fields made flags by ArgumentGroupFactory (arguments.py:1621, argument_utils.py:166
                 # @ core_v0.16.1)
                 "--moe-router-padding-for-quantization", "--moe-permute-fusion", "--qk-l2-norm",
                 "--moe-apply-probs-on-input",
                 # core_v0.18.0+: TransformerConfig fields made flags by ArgumentGroupFactory (arguments.py:2091,
                 # argument_utils.py:101, :186)
                 "--use-transformer-engine-op-fuser"]:
        p.add_argument(flag, action="store_true")
    for flag, default in [("--norm-epsilon", 1e-5), ("--attention-dropout", 0.1), ("--hidden-dropout", 0.1),
                          ("--rotary-percent", 1.0), ("--rope-scaling-factor", 8.0), ("--rotary-scaling-factor", 1.0),
                          ("--mscale", 1.0), ("--mscale-all-dim", 0.0), ("--moe-router-topk-scaling-factor", None)]:
        p.add_argument(flag, type=float, default=default)
    p.add_argument("--window-size", type=lambda x: tuple(int(i) for i in x.strip("()").split(",")), default=None)
    p.add_argument("--window-attn-skip-freq", type=str, default=None)  # Megatron's moe_freq_type
    p.add_argument("--softmax-type", choices=["vanilla", "off-by-one", "learnable"], default="vanilla")
    p.add_argument("--glu-linear-offset", type=float, default=0.0)
    p.add_argument("--activation-func-clamp-value", type=float, default=None)
    p.add_argument("--rope-type", choices=["rope", "yarn"], default=None)
    p.add_argument("--moe-router-score-function", choices=["softmax", "sigmoid"], default="softmax")
    p.add_argument("--moe-router-dtype", choices=["fp32", "fp64"], default=None)
    p.add_argument("--moe-router-load-balancing-type", nargs="+", default=["aux_loss"])
    p.add_argument("--moe-aux-loss-coeff", type=float, nargs="+", default=[0.0])
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--recompute-modules", nargs="+", default=None)  # TransformerConfig list field: nargs '+'
    p.add_argument("--pipeline-model-parallel-layout", type=str, default=None)
    p.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm")
    p.add_argument("--position-embedding-type", choices=["learned_absolute", "rope", "mrope", "relative", "none"],
                   default="learned_absolute")
    p.add_argument("--moe-layer-freq", type=str, default="1")
    p.add_argument("--no-rope-freq", type=str, default=None)  # Megatron's no_rope_freq_type (arguments.py:208)
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"], default="allgather")
    p.add_argument("--moe-flex-dispatcher-backend", choices=["deepep", "hybridep"], default="deepep")
    p.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    p.add_argument("--moe-mlp-glu-interleave-size", type=int, default=None)  # core_v0.18.0 transformer_config.py:868
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"], default=None, dest="fp8")
    p.add_argument("--fp4-format", choices=["e2m1"], default=None, dest="fp4")
    p.add_argument("--fp4-recipe", choices=["nvfp4", "custom"], default="nvfp4")
    return p


def parse_megatron_args(argv: list[str]) -> argparse.Namespace:
    """Parse an emitted list with ``megatron_parser`` (unknown flags are an error, as in Megatron)."""
    parser = megatron_parser()
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ValueError(f"flags autoplan does not know: {unknown}")
    return ns


def yarn_not_emitted(m: Any) -> str:
    """The warning for YaRN on standard attention, which Megatron-LM 0.16.1's command line cannot build:
    ``--position-embedding-type`` offers no 'yarn' (arguments.py:1645) and ``--rope-type yarn`` is for MLA only
    (arguments.py:1357), although megatron-core's GPTModel has it (position_embedding_type 'yarn' with the
    config's yarn_* fields, models/gpt/gpt_model.py:172, as Megatron-Bridge's GPT-OSS provider sets them)."""
    rs = m.arch.rope_scaling
    if rs is None or rs.type != "yarn" or m.mla is not None:
        return ""
    return (f"WARNING: {m.name}'s YaRN RoPE scaling (factor {rs.factor:g} over {rs.original_max_position_embeddings} "
            "tokens) is not emitted: Megatron-LM 0.16.1's command line has YaRN only for MLA (arguments.py:1357; "
            "megatron-core's GPTModel has position_embedding_type 'yarn', which Megatron-Bridge sets); the run "
            f"trains plain RoPE (base {m.arch.rope_theta:g}) without YaRN's frequency ramp and attention-logit "
            f"factor: another function, priced as megatron-core runs YaRN (its RoPE op by op, rope_utils.py:279-284: "
            "slightly above the emitted plain RoPE's fused kernel)")


def unbuilt_facts(m: Any) -> list[str]:
    """WARNINGs for the model's attention facts Megatron-LM 0.16.1 has no flag for: megatron-core's q/k layernorm is
    one norm of kv_channels applied to every head (``SelfAttention`` builds ``q_layernorm`` with
    ``hidden_size=self.hidden_size_per_attention_head``, transformer/attention.py:1280-1288), and no clamp of q, k, v
    exists."""
    a, out = m.arch, []
    if a.qk_norm and not a.qk_norm_per_head and m.mla is None:
        out.append(f"WARNING: {m.name}'s q/k RMSNorms normalize the whole projection (q over {m.q_dim}, k over "
                   f"{m.kv_dim} channels; OLMoE); Megatron-LM's --qk-layernorm, emitted instead, normalizes each "
                   f"head over its {m.head_dim_resolved} channels (megatron/core/transformer/attention.py:1280-1288): the same "
                   "cost, another function, and per-head norm weights instead of per-channel ones")
    if a.qkv_clip is not None:
        out.append(f"WARNING: {m.name} clamps q, k and v to [-{a.qkv_clip:g}, {a.qkv_clip:g}] after their projections "
                   "(clip_qkv); Megatron-LM has no such clamp: the emitted run trains without it")
    return out


def temperature_not_emitted(m: Any, seq_len: int) -> list[str]:
    """The WARNING for Llama 4's attention temperature tuning (``ArchSpec.attn_temperature``), which neither
    Megatron-LM nor NeMo's Llama 4 (llama4_utils.py @ 8cfedd7203) has: exact below its first scaled position."""
    t = m.arch.attn_temperature
    if t is None or seq_len <= t.first_scaled_position():
        return []
    first = t.first_scaled_position()
    where = f"position {first}'s queries" if first == seq_len - 1 else f"positions {first}..{seq_len - 1}"
    return [f"attention temperature tuning (NoPE layers' queries x (1 + {t.attn_scale:g} log(1 + floor((p + 1) / "
            f"{t.floor_scale})))): Megatron-LM has none; at seq_len {seq_len} {where} of every "
            f"{m.arch.no_rope_every}th layer train without it (earlier positions are unscaled anyway)"]


def notes(plan: EmitPlan) -> list[str]:
    par, out = plan.parallel, []
    m = plan.model
    if yarn_not_emitted(m):
        out.append(yarn_not_emitted(m))
    out.extend(dynamic_rope_notes(plan))
    out.extend(unbuilt_facts(m))
    out.extend(temperature_not_emitted(m, plan.job.seq_len))
    if m.arch.activation == "gelu_tanh" and not m.gated_mlp:
        out.append("activation gelu_tanh: megatron-core's GPTModel has no tanh-approximate GELU flag (--openai-gelu "
                   "is legacy-model only); it trains with erf GELU")
    if (padded := padded_vocab_size(m.vocab_size, plan.parallel.tp)) != m.vocab_size:
        out.append(f"vocabulary {m.vocab_size} is not a multiple of tp={plan.parallel.tp}: Megatron pads it to "
                   f"{padded} (priced padded)")
    if m.is_moe and m.arch.router.aux_loss != "none" and not m.arch.router.aux_loss_coeff:
        out.append("the model states no load-balancing loss coefficient: emitted --moe-router-load-balancing-type none")
    if par.schedule == "zb-h1":
        out.append("schedule zb-h1: Megatron-LM has no ZB-H1 flag; emitted its default 1F1B")
    rt = plan.runtime("megatron")
    if rt.moe_fused_grouped_mlp:
        out.append(f"moe_fused_grouped_mlp: --use-transformer-engine-op-fuser and --moe-mlp-glu-interleave-size "
                   f"{FUSED_MLP_GLU_INTERLEAVE} are Megatron-LM core_v0.18.0+ flags (the run's megatron_core "
                   f"{rt.megatron_core}), with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 in the launch environment")
    n_pos, seq = m.learned_position_embeddings, plan.job.seq_len
    if n_pos and seq > n_pos:
        out.append(f"learned position table: the model has {n_pos} positions and the job runs {seq}-token "
                   f"sequences; emitted --max-position-embeddings {seq}, so rows {n_pos}..{seq - 1} are new "
                   "(untrained) parameters the prediction does not count")
    return out


# What a launch needs beyond the plan: named placeholders the user fills (environment variables; the script stops
# with the variable's name when a required one is unset). Flag names: Megatron-LM's arguments.py (_add_data_args,
# _add_tokenizer_args, _add_training_args, _add_learning_rate_args, _add_checkpointing_args, _add_logging_args).
USER_SETTINGS = """\
# ---- fill these in (export them, or edit the defaults) -------------------------------------------------
# DATA_ARGS: data and tokenizer flags, word-split, e.g.
#   --data-path /data/corpus_text_document --tokenizer-type HuggingFaceTokenizer --tokenizer-model /models/tok
#   or, to smoke-test without data: --mock-data --tokenizer-type NullTokenizer --vocab-size VOCAB_MINUS_ONE
#   (NullTokenizer adds an end-of-document token to --vocab-size).
DATA_ARGS="${DATA_ARGS:?set DATA_ARGS to the data and tokenizer flags (see the comment above)}"
TRAIN_ITERS="${TRAIN_ITERS:?set TRAIN_ITERS to the number of optimizer steps}"
LR="${LR:?set LR to the peak learning rate}"
MIN_LR="${MIN_LR:-0.0}"
LR_WARMUP_ITERS="${LR_WARMUP_ITERS:-0}"
LR_DECAY_STYLE="${LR_DECAY_STYLE:-cosine}"
CHECKPOINT_DIR="${CHECKPOINT_DIR:?set CHECKPOINT_DIR (checkpoints are saved to and resumed from it)}"
SAVE_INTERVAL="${SAVE_INTERVAL:-1000}"
LOG_DIR="${LOG_DIR:-$CHECKPOINT_DIR/tensorboard}"
LOG_INTERVAL="${LOG_INTERVAL:-10}"
EVAL_INTERVAL="${EVAL_INTERVAL:-1000}"
EVAL_ITERS="${EVAL_ITERS:-10}"
USER_ARGS=(
  --train-iters "$TRAIN_ITERS" --lr "$LR" --min-lr "$MIN_LR" --lr-warmup-iters "$LR_WARMUP_ITERS"
  --lr-decay-style "$LR_DECAY_STYLE"
  --save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR" --save-interval "$SAVE_INTERVAL"
  --log-interval "$LOG_INTERVAL" --tensorboard-dir "$LOG_DIR" --eval-interval "$EVAL_INTERVAL" --eval-iters "$EVAL_ITERS"
)"""


def megatron_files(plan: EmitPlan) -> dict[str, str]:
    """``megatron_args.txt`` (model and layout, one token per line), ``train_megatron_torchrun.sh`` (run on every
    node) and ``train_megatron_slurm.sbatch`` (``sbatch`` it). The scripts add the user's data, tokenizer, schedule,
    checkpoint and logging flags from named placeholders (``USER_SETTINGS``)."""
    args = megatron_args(plan)
    nodes, per_node = plan.num_nodes, plan.procs_per_node
    header = script_header(plan, "Megatron-LM", extra=[
        "Rank order tp-cp-ep-dp-pp (Megatron's default): consecutive ranks form a TP group, so each",
        f"TP group of {plan.parallel.tp} sits inside one node; pipeline stages are the slowest axis.",
        "Set MEGATRON_LM to your Megatron-LM checkout (not pip-installable; megatron-core alone has no",
        f"{entrypoint(plan.model)}) and the placeholders below; EXTRA_ARGS is appended last.",
        f"Vocabulary: the model's {plan.model.vocab_size} tokens stay unpadded when the tokenizer has them.",
    ])
    body = USER_SETTINGS + "\n" + bash_array("MEGATRON_ARGS", args)
    program = ['"${MEGATRON_LM:?set MEGATRON_LM to your Megatron-LM checkout}/' + entrypoint(plan.model) + '"',
               '"${MEGATRON_ARGS[@]}"', '"${USER_ARGS[@]}"', "${DATA_ARGS}", "${EXTRA_ARGS:-}"]
    env = dict(plan.runtime("megatron").env)  # Megatron's requirement (arguments.py:1453-1479); none with FSDP
    return {
        "megatron_args.txt": "\n".join(args) + "\n",
        "train_megatron_torchrun.sh": torchrun_script(header, body, program, nodes, per_node, env),
        "train_megatron_slurm.sbatch": slurm_script(header, body, program, nodes, per_node, env,
                                                   job_name=f"megatron-{plan.model.name}"),
    }
