"""What every target profile shares: the knob request (``Software``), the resolved run-time semantics
(``Runtime``) and the ``TargetProfile`` interface. Framework rules live in the per-framework modules."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cost_models.errors import ConfigError, divisors, repeated_error
from cost_models.specs import ClusterSpec, Generation, JobSpec, ModelSpec, MoeDispatcher, ParallelConfig

TargetName = Literal["megatron", "torchtitan", "fsdp2"]
Selective = Literal["attention", "op_sac", "cheap"]
TARGET_NAMES: tuple[TargetName, ...] = ("megatron", "torchtitan", "fsdp2")
GradDtype = Literal["fp32", "bf16"]
CpCommType = Literal["p2p", "a2a", "allgather", "a2a+p2p"]
CrossEntropyFusion = Literal["none", "te"]
# Where a torch FSDP2 (ZeRO-3) run puts the output layer (+ final norm) and the token embedding
# (``memory.zero3_head_unit_bytes``): "own" = each its own ``fully_shard`` unit (torchtitan from 83e6941, 2025-07-28,
# to 0.3.0; Megatron-LM --use-torch-fsdp2); "root" = in the root unit, which stays gathered from the first forward to
# the end of the backward with their gradients unsharded until then (torchtitan before 83e6941; the fsdp2 target's
# emitted module).
FsdpHeadUnit = Literal["own", "root"]
# Where a torch FSDP2 (ZeRO-3) run puts an MTP module's projection ``eh_proj`` and its norms (enorm, hnorm, final
# norm) (``mtp.mtp_stage_params``, ``memory.zero3_head_unit_bytes``): "module" = with its block in one unit (torchtitan
# 0.3.0: MTPTransformerBlock holds them, models/deepseek_v3/mtp.py:109-134, and apply_fsdp_to_mtp_decoder shards it as
# one of model.layers, l. 281-320); "root" = in the root unit, each block layer its own unit (Megatron-LM
# --use-torch-fsdp2; the megatron profile's module doc cites the wrap set).
FsdpMtpUnit = Literal["module", "root"]
# Megatron-Core 0.16.1 CUDA graphs (transformer_config.py ``cuda_graph_impl`` / ``cuda_graph_scope``; enums.py
# ``CudaGraphScope``): the capture backend, and what it captures (empty = each whole transformer layer)
CudaGraphImpl = Literal["none", "local", "transformer_engine"]
# megatron-core 0.16.1 transformer/enums.py:70-79 CudaGraphScope (mamba: a hybrid stack's Mamba layers)
CudaGraphScope = Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"]


def graph_scope_error(names: Any) -> str | None:
    """What is wrong with ``names`` as CUDA graph scopes (the CLI's ``--cuda-graph-scope`` and a request's
    ``software.cuda_graph_scope`` say the same), or None."""
    valid = CudaGraphScope.__args__  # type: ignore[attr-defined]
    bad = [n for n in names if n not in valid]
    if bad:
        return f"{bad[0]!r} is not a CUDA graph scope (valid: {', '.join(valid)})"
    # Megatron keeps the list as given (megatron/training/arguments.py:1430, nargs '+', @core_v0.16.1) and a repeat
    # breaks its equality checks (full recompute needs scope == [full_iteration], megatron/core/transformer/
    # transformer_config.py:1780-1784 @core_v0.16.1): a repeat is refused, not merged
    return repeated_error(names, "scope")


# Megatron-LM --optimizer (megatron/training/arguments.py:2056-2058; sgd not offered): Adam, Muon for the 2-D weight
# matrices with Adam for the rest, or that pair under the layer-wise distributed optimizer (cost_models.muon)
OptimizerName = Literal["adam", "muon", "dist_muon"]
# --muon-tp-mode (arguments.py:1853-1855): Newton-Schulz on each TP shard, on the all-gathered matrix, or sharded
MuonTpMode = Literal["blockwise", "duplicated", "distributed"]
Fp8Recipe = Literal["delayed", "tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise", "mxfp8"]
# Megatron-Core releases a run may name (tags core_v<version> of NVIDIA/Megatron-LM): the megatron target's
# ``megatron_core`` knob. 0.16.1 is the pip package autoplan validates against; a later one gates only the rules that
# read it (``MegatronProfile.model_runtime_error``).
MegatronCoreVersion = Literal["0.16.1", "0.17.0rc0", "0.17.0", "0.17.1", "0.18.0", "0.18.2", "0.19.0"]
# Transformer Engine per-module quantization recipes a run may name (Megatron-Core ``TransformerConfig.quant_recipe``,
# loaded from a YAML of matchers: ``cost_models.targets.megatron.QUANT_RECIPES`` holds what each one says)
QuantRecipeName = Literal["nemotron_3_super_nvfp4"]
CORE_RELEASES: tuple[str, ...] = get_args(MegatronCoreVersion)  # in release order
DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0}


class Software(BaseModel):
    """Knobs a user may set (CLI flags, ``software`` in the JSON request). ``None`` = the target's default
    (``TargetProfile.resolve`` says which); a knob the target lacks is an error there."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    compile: bool | None = Field(default=None, description="torch.compile the model and loss (torchtitan)")
    compile_components: Literal["model+loss", "model", "loss"] | None = Field(
        default=None, description="torchtitan --compile.components under --compile: what torch.compile covers "
        "(default model and loss; torchtitan's DeepSeek-V3 configs of 2025-08..2026-03 compile the loss alone)")
    async_tp: bool | None = Field(default=None, description="torchtitan async TP (needs compile and tp > 1)")
    tp_comm_overlap: bool | None = Field(default=None, description="Megatron --tp-comm-overlap (TE userbuffers; "
                                         "needs sequence parallelism)")
    fp8_recipe: Fp8Recipe | None = Field(default=None, description="fp8 scaling recipe (precision fp8 only)")
    grad_reduce_dtype: GradDtype | None = Field(default=None, description="dtype of main gradients and of the DP "
                                                "gradient reduction")
    cp_comm_type: CpCommType | None = Field(default=None, description="context-parallel attention communication: "
                                            "p2p ring, a2a (Ulysses), allgather, a2a+p2p (hierarchical)")
    cp_a2a_size: Annotated[int, Field(ge=2)] | None = Field(
        default=None, description="a2a+p2p: ranks of the inner all-to-all group (Megatron "
        "--hierarchical-context-parallel-sizes a2a p2p: a ring over cp / this size)")
    overlap_grad_reduce: bool | None = Field(default=None, description="Megatron --overlap-grad-reduce")
    overlap_param_gather: bool | None = Field(default=None, description="Megatron --overlap-param-gather")
    cpu_offload_layers: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Megatron --cpu-offloading-num-layers: activations of the first N decoder layers "
        "kept in host memory between forward and backward (Transformer Engine cpu_offload; pp 1, no recompute)")
    fp8_param_gather: bool | None = Field(
        default=None, description="Megatron --fp8-param-gather: weights kept in fp8 (no bf16 copy) and all-gathered "
        "in fp8 (precision fp8, delayed or tensorwise scaling, distributed optimizer)")
    adam_moments_dtype: GradDtype | None = Field(
        default=None, description="dtype of Adam's m and v (Megatron bf16 = --use-precision-aware-optimizer "
        "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)")
    cross_entropy_fusion: CrossEntropyFusion | None = Field(
        default=None, description="Megatron cross-entropy: none (vocab_parallel_cross_entropy in fp32, Megatron-LM's "
        "default) or te (--cross-entropy-loss-fusion --cross-entropy-fusion-impl te: Transformer Engine's kernel, "
        "gradient written in place into the bf16 logits)")
    reshard_after_forward: bool | Annotated[int, Field(ge=2)] | None = Field(
        default=None, description="FSDP2 reshard_after_forward: true, false, or a group size to re-shard to "
        "(an int keeps the backward all-gather inside that group)")
    moe_dispatcher: MoeDispatcher | None = Field(
        default=None, description="MoE token dispatcher: alltoall (--moe-token-dispatcher-type alltoall), deepep or "
        "hybridep (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ...)")
    moe_a2a_overlap: bool | None = Field(
        default=None, description="Megatron --overlap-moe-expert-parallel-comm: EP all-to-all under another "
        "micro-batch's compute (ep > 1; vp with pp > 1)")
    moe_force_balance: bool | None = Field(
        default=None, description="Megatron --moe-router-force-load-balancing: random router logits (benchmarks): "
        "tokens spread uniformly over the experts; torchtitan --debug.moe_force_load_balance: round-robin experts, "
        "every expert the same count")
    moe_capacity_factor: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        default=None, description="Megatron --moe-expert-capacity-factor C --moe-pad-expert-input-to-capacity: "
        "token drop, every expert padded to C x its mean load")
    moe_router_padding: bool | None = Field(
        default=None, description="Megatron --moe-router-padding-for-quantization (fp8 / fp4 jobs): the router "
        "routes extra tokens so every expert's count is a multiple of the quantized GEMM's alignment, and the "
        "experts skip Transformer Engine's padding copies")
    moe_fused_grouped_mlp: bool | None = Field(
        default=None, description="Megatron-Core's fused MoE grouped MLP (--use-transformer-engine-op-fuser "
        "--moe-mlp-glu-interleave-size 32, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1; megatron_core 0.18.0 or later): "
        "Transformer Engine's CuTe DSL kernels run fc1 + GLU + MXFP8 quantize and fc2's dgrad + dGLU as one GEMM "
        "each (Blackwell, fp8_recipe mxfp8)")
    dsa_kernel_backend: Literal["none", "cudnn"] | None = Field(
        default=None, description="Megatron --dsa-kernel-backend (megatron_core 0.19.0 or later): 'cudnn' runs "
        "DeepSeek sparse attention through cuDNN's fused indexer / sparse-MLA kernels (cost_models.dsa prices the "
        "sparse design); 'none' (the default, and the only path of 0.16.1) the unfused reference")
    expandable_segments: bool | None = Field(
        default=None, description="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the launch environment: the "
        "caching allocator returns its free pages before an out-of-memory (the reserve need not fit in HBM)")
    cuda_graph_impl: CudaGraphImpl | None = Field(
        default=None, description="Megatron --cuda-graph-impl: none, local (Megatron-Core's CudaGraphManager; "
        "scope full_iteration = the whole forward-backward) or transformer_engine (TE make_graphed_callables per layer)")
    optimizer: OptimizerName | None = Field(
        default=None, description="Megatron --optimizer: adam, muon (Newton-Schulz-orthogonalized momentum for 2-D "
        "weight matrices, Adam for embeddings, output layer, norms, biases) or dist_muon (the same under the layer-wise "
        "distributed optimizer: whole parameters' optimizer state spread over the data-parallel ranks)")
    muon_tp_mode: MuonTpMode | None = Field(
        default=None, description="Megatron --muon-tp-mode (optimizer muon / dist_muon): Newton-Schulz on each TP rank's "
        "shard (blockwise, the default), on the matrix all-gathered over TP (duplicated), or sharded with an all-reduce "
        "per step (distributed)")
    cuda_graph_scope: tuple[CudaGraphScope, ...] | None = Field(
        default=None, description="Megatron --cuda-graph-scope: what is captured (attn, mlp, moe, moe_router, "
        "moe_preprocess, mamba: a hybrid stack's Mamba layers, full_iteration); empty = each whole transformer layer")
    megatron_core: MegatronCoreVersion | None = Field(
        default=None, description="the Megatron-Core release the run uses (tag core_v<version>; default 0.16.1, the "
        "pip package autoplan validates against): a hybrid stack's multi-token prediction needs 0.17.0rc0 or later")
    bf16_layers: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]] | None = Field(
        default=None, description="megatron (precision fp8 / nvfp4): the first S and last E decoder layers run in bf16, "
        "[S, E] (Megatron-Core first_last_layers_bf16 with num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16)")
    quant_recipe: QuantRecipeName | None = Field(
        default=None, description="megatron (precision nvfp4): a Transformer Engine per-module quantization recipe the "
        "run loads (Megatron-Core quant_recipe): nemotron_3_super_nvfp4 = Megatron-Bridge's te_quant.cfg for Nemotron 3 "
        "Super (attention and latent projections and the MTP block in bf16, the Mamba out_proj in MXFP8)")

    @field_validator("bf16_layers", mode="before")
    @classmethod
    def _bf16_pair(cls, v: object) -> object:
        """A JSON list [S, E] is the pair (strict mode takes no list for a tuple)."""
        return tuple(v) if isinstance(v, list) else v

    @field_validator("cuda_graph_scope", mode="before")
    @classmethod
    def _scope_names(cls, v: object) -> object:
        """A JSON list is the tuple (strict mode takes no list for a tuple); an unknown name says the valid ones."""
        if isinstance(v, (list, tuple)):
            if (err := graph_scope_error(v)) is not None:
                raise ValueError(err)
            return tuple(v)
        return v

    def given(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


KNOB_NAMES = ("compile", "compile_components", "async_tp", "tp_comm_overlap", "fp8_recipe", "grad_reduce_dtype", "cp_comm_type",
              "cp_a2a_size", "overlap_grad_reduce", "overlap_param_gather", "reshard_after_forward",
              "adam_moments_dtype", "cpu_offload_layers", "fp8_param_gather", "moe_dispatcher", "moe_a2a_overlap",
              "moe_force_balance", "moe_capacity_factor", "moe_router_padding", "moe_fused_grouped_mlp",
              "cross_entropy_fusion", "expandable_segments", "cuda_graph_impl", "cuda_graph_scope", "optimizer",
              "muon_tp_mode", "megatron_core", "bf16_layers", "quant_recipe", "dsa_kernel_backend")

# PyTorch's caching-allocator setting the launch environment carries (``Runtime.env``; ``cost_models.memory`` reads
# ``Runtime.expandable_segments``): ``expandable_segments:True`` maps memory into growable virtual segments. The
# variable Megatron-Core checks (``'expandable_segments:True' in os.getenv('PYTORCH_CUDA_ALLOC_CONF', '').split(',')``,
# megatron/core/distributed/distributed_data_parallel_config.py:156-161 @ core_v0.16.1) and torchtitan's launcher
# sets (run_llama_train.sh:22 @ 9dec370).
ALLOC_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS_ENV = (ALLOC_CONF_VAR, "expandable_segments:True")


@dataclass(frozen=True)
class Runtime:
    """How a target runs one job: every knob resolved, and the semantics the cost model prices.

    Bytes are per parameter held by a rank before ZeRO sharding; ``*_sharded`` say whether ZeRO-1/2/3 shard
    that piece (``cost_models.memory.zero_state_bytes``)."""

    target: str  # a TargetName, or a reference runtime autoplan prices but does not emit for ("deepseek")
    compile: bool = False
    compile_components: str = "model+loss"  # what compile covers (torchtitan compile.components): model_compiled
    async_tp: bool = False
    tp_comm_overlap: bool = True
    fp8_recipe: str | None = None
    fp8_impl: Literal["te", "torchao"] = "te"  # whose fp8 linear runs the recipe (knob_effects: cast bytes)
    grad_reduce_dtype: GradDtype = "fp32"
    cp_comm_type: CpCommType = "p2p"
    cp_a2a_size: int | None = None  # a2a+p2p: the inner all-to-all group (the ring runs over cp / it)
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    reshard_after_forward: bool | int = True
    adam_moments_dtype: GradDtype = "fp32"
    # Decoder layers whose saved activations live in host memory between forward and backward (the first N: TE
    # cpu_offload; ``memory.stage_memory`` drops them from the activation peak).
    cpu_offload_layers: int = 0
    fp8_param_gather: bool = False  # fp8 primary weights (weight_bytes / gather_bytes say what they cost)
    # MoE (cost_models.moe): None = the catalog efficiency's dispatcher / all-to-all overlap
    moe_dispatcher: MoeDispatcher | None = None
    moe_a2a_overlap: bool | None = None
    moe_force_balance: bool = False  # forced balance: ρ from Megatron's random logits or torchtitan's round robin (moe.moe_load_imbalance)
    moe_capacity_factor: float | None = None  # token drop with padding to capacity: ρ = the factor
    # the router pads each expert's count to the quantized GEMM's alignment (moe.router_padding_share)
    moe_router_padding: bool = False
    # Megatron-Core's fused grouped MLP (TE op fuser + CuTe DSL grouped GEMM-GLU kernels): the expert activation and
    # the MXFP8 casts around it ride the GEMM epilogues (op_traffic.FUSED_GROUPED_MLP); the megatron target's knob
    moe_fused_grouped_mlp: bool = False
    # DeepSeek sparse attention's kernels (megatron --dsa-kernel-backend; cost_models.dsa.dsa_fused)
    dsa_kernel_backend: str = "none"
    # HBM passes over the routed token copies a torch MoE makes beside its all-to-alls, ((dispatch with EP, without),
    # (combine with EP, without)), the score weighting apart (moe.permutation_passes); None = Megatron-Core's rule
    moe_passes: tuple[tuple[int, int], tuple[int, int]] | None = None
    # CUDA graphs (Megatron --cuda-graph-impl / --cuda-graph-scope): an MoE layer whose experts run inside a graph
    # is not issued op by op by the host (cost_models.moe.moe_layer_host_issued)
    cuda_graph_impl: CudaGraphImpl = "none"
    cuda_graph_scope: tuple[CudaGraphScope, ...] = ()
    # Whose cross-entropy kernel runs the loss: "none" (the framework's own: Megatron's fp32 vocab-parallel loss),
    # "te" (Transformer Engine's fused kernel; its bytes: op_traffic.TE_LOSS_BYTES, loss_bytes_per_logit below).
    cross_entropy_fusion: CrossEntropyFusion = "none"
    # The optimizer (Megatron --optimizer): "adam", or Muon with Adam for the non-matrix parameters
    # (``cost_models.muon`` prices its state, Newton-Schulz GEMMs and layer-wise all-gather)
    optimizer: OptimizerName = "adam"
    muon_tp_mode: MuonTpMode = "blockwise"
    megatron_core: str = CORE_RELEASES[0]  # the Megatron-Core release (megatron target; the rules reading it say which)
    # Decoder layers run in bf16 under a quantized job: the first S and the last E (``cost_models.quant_layout``)
    bf16_layers: tuple[int, int] = (0, 0)
    # Where this runtime prices a bf16 layer or module inside a quantized job (``quant_layout.run_as``): that job's
    # recipe (its fp8 recipe, or "nvfp4"), which Megatron-Core's grouped experts still pad for (``moe.run_pad_align``)
    quantized_run: str | None = None
    # Per-module precision of a quantization recipe (``quant_recipe``): (module group, precision) pairs
    # (``cost_models.quant_layout.MODULE_OPS`` names the groups)
    quant_recipe: str | None = None
    module_precision: tuple[tuple[str, str], ...] = ()
    weight_bytes: float = 2.0  # resident model weights (bf16 in Megatron, --use-torch-fsdp2 too; fp32 sharded params in torchtitan / the fsdp2 target)
    # Quantized weight copies the GEMM library caches beside the weights for the whole step, per parameter (TE's
    # weight workspace under NVFP4: ``te_nvfp4.NVFP4_WEIGHT_CACHE_BYTES``): of the weight each GEMM used, so never
    # sharded (under ZeRO-3 the cached copy is of the gathered weight).
    weight_cache_bytes: float = 0.0
    grad_bytes: float = 4.0  # main gradients (fp32 unless reduced in bf16)
    optimizer_bytes: float = 12.0  # fp32 master (if any) + Adam m, v
    gather_bytes: float = 2.0  # parameter all-gather payload per param (bf16 compute copy)
    tp_gather_bytes: float = 2.0  # bytes per element of the sequence-parallel TP all-gathers (fp8: 1; knob_effects)
    tp_grad_gather_bytes: float | None = None  # ... of the backward's output-gradient all-gathers (None: as above)
    fused_elementwise: bool = True  # the blocks' norms / rotary / activations fused (TE, Inductor) vs eager op by op
    # The head's final norm and loss fused (TE / Megatron's cross-entropy; torch.compile of the loss) vs torch's
    # cross_entropy on fp32 logits op by op (op_traffic.TORCH_LOSS_BYTES) and an eager final norm.
    fused_loss: bool = True
    # Megatron-Core's grouped experts clamp the activation and add fc2's bias in eager PyTorch (op_traffic
    # MCORE_EXPERT_*; only a model with a clamp / expert biases pays them): the megatron target's fact
    mcore_expert_glue: bool = False
    # Megatron-Core applies RoPE op by op, whatever apply_rope_fusion says, where YaRN scales the rotated q/k
    # (op_traffic.MCORE_UNFUSED_ROTARY_BYTES; only a standard-attention YaRN model with a concentration factor
    # != 1 pays it): the megatron target's fact
    mcore_yarn_unfused_rope: bool = False
    env: tuple[tuple[str, str], ...] = ()  # launch environment the framework requires
    notes: tuple[str, ...] = ()  # how the target runs what was asked (shown with the prediction)
    # ---- memory facts (cost_models.memory reads them; defaults = Megatron-Core with Transformer Engine) ----
    # Peak bytes of the loss per vocabulary entry per token (÷ TP: vocab-parallel). Megatron's
    # vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py) casts the bf16 logits to fp32
    # (4) and exponentiates in place; the bf16 gradient (2) is the only other copy: 6.
    loss_bytes_per_logit: float = 6.0
    # Bytes per saved GEMM input element under fp8: Transformer Engine saves the fp8 cast (1)
    # (transformer_engine/pytorch/module/linear.py ``saved_inputmat``).
    fp8_saved_bytes: float = 1.0
    # What "selective" recompute keeps: "attention" (Megatron: drops the attention core's score-sized tensors),
    # "op_sac" (torchtitan's per-op SAC), "cheap" (DeepSeek-V3: norms, MLA up-projections, SwiGLU recomputed).
    selective: Selective = "attention"
    # torch's per-op SAC (``selective`` "op_sac") keeps the MoE all-to-alls' outputs: torchtitan's save list holds
    # ``_c10d_functional.all_to_all_single`` (and the token counts' copy to the host) since c4e2291 (2025-09-06,
    # "Save _to_copy and a2a in selective AC policy"; 0.3.0 distributed/activation_checkpoint.py:61-64, 248-256).
    # False before: the backward's recompute re-runs the forward's dispatch and combine (recompute.ep_forward_repeats).
    sac_saves_a2a: bool = True
    # torch's per-op SAC keeps the attention core's output: torchtitan's save list holds the SDPA flash and efficient
    # kernels, and cuDNN's ``aten._scaled_dot_product_cudnn_attention`` only since b39377f9f (2025-12-01, #2095, "add
    # all SDPA backends to op_sac_save_list", after pytorch/torchtitan#2091). False where an older torchtitan runs
    # SDPA on cuDNN (``TargetProfile.sdpa_cudnn_first``: 3b85aa31f, 2025-05-14, on sm100): its ``_custom_policy``
    # returns PREFER_RECOMPUTE for the cuDNN op, so the backward re-runs the attention forward and its output is not
    # kept (op_cost._compute, memory.op_sac_saved).
    sac_saves_attention: bool = True
    # PyTorch SDPA runs the memory-efficient kernel for attention whose value head dim differs from its query/key head
    # dim (MLA: 192 / 128): the stack's backend list has FLASH_ATTENTION then EFFICIENT_ATTENTION with no cuDNN before
    # them, and flash refuses v != q/k ("Flash attention requires q,k,v to have the same last dimension", sdp_utils
    # ``check_head_dim_size_flash``). Priced at ``Efficiency.attention_efficient_fwd`` / ``_bwd`` of FlashAttention-2
    # (op_cost.op_compute). Set by the torchtitan 2024-12 / 2025 profiles off their cuDNN-first generations.
    sdpa_unequal_v_efficient: bool = False
    # torchtitan 0.3.0 builds no SDPA attention for a language model: models/common/config_utils.py
    # ``get_attention_config`` maps each model's ``attn_backend`` to FlexAttention (``flex``, the default of llama3,
    # qwen3, deepseek_v3, kimi_k2_7) or varlen FlashAttention (``varlen``, gpt_oss) and refuses ``sdpa``; both mask
    # per document (block-causal). True: the attention core runs the model's backend (``torchtitan_models.TitanModel.
    # attn_backend``), priced at the generation's measured FlexAttention / varlen rates (op_cost.titan_attention_rates).
    titan_attention: bool = False
    # ZeRO-3: bytes per parameter of the largest unit for the gathered units (current + prefetched [+ gradient]).
    gathered_unit_bytes: float = 4.0
    # ZeRO-3 with pp > 1: bytes per stage parameter kept unsharded through the step (torchtitan under PP).
    pp_unsharded_bytes: float = 0.0
    # ZeRO-3 with pp > 1: HBM bytes per stage parameter the runtime moves to accumulate the unsharded gradients
    # across micro-batches outside the backward's GEMMs, (in the first micro-batch, in each later one)
    # (``fsdp2_pp_grad_accumulation_bytes``; ``estimate.pp_grad_accumulation_s`` prices them)
    pp_grad_accumulation_bytes: tuple[float, float] = (0.0, 0.0)
    # ZeRO-3 (torch FSDP2): which unit holds the output layer and the embedding (``FsdpHeadUnit``)
    fsdp_head_unit: FsdpHeadUnit = "own"
    # ZeRO-3 (torch FSDP2): which unit holds an MTP module's projection and norms (``FsdpMtpUnit``)
    fsdp_mtp_unit: FsdpMtpUnit = "module"
    # ZeRO-3 (torch FSDP2): the decoder layer kinds (``opgraph.LayerKind``) the target's wrapper does not shard as
    # their own units, so they sit in the root unit, gathered through the forward and the backward
    # (``memory.stage_params`` leaves them out of the largest unit, ``memory.zero3_head_unit_bytes`` prices them)
    fsdp_root_kinds: frozenset[str] = frozenset()
    # Sharded gradients reduced in every micro-batch's backward (Megatron-FSDP ``optim_grads``): the DP
    # reduce-scatter runs m times per step, and each model chunk's backward holds its gradients unsharded in
    # ``grad_bytes`` until they are reduced (``memory.sharded_grad_transient_bytes``). ``grad_bucket_cap`` bounds
    # that, in elements, for a chunk split into buckets (vp = 1); a chunk with bucketing disabled (vp > 1) is one
    # bucket, and the compute stream waits for its reduce-scatter at the end of its backward: exposed.
    grad_reduce_every_microbatch: bool = False
    grad_bucket_cap: float = 0.0
    # ZeRO-0's gradient all-reduce runs in every micro-batch's backward without pipelining, as the gradients are
    # accumulated (the trainer never turns the data-parallel sync off): m all-reduces per step, each behind its own
    # micro-batch's backward. False: DDP's ``no_sync`` (Megatron: once per step). Under pp > 1 torch's pipelining
    # stage turns the sync off for every backward but the last (distributed/pipelining/stage.py:844-848): once.
    zero0_sync_every_microbatch: bool = False
    # ZeRO-0 is torch FSDP2 over one-rank shards, HSDP (dp_replicate, fsdp = 1) with the mixed-precision policy
    # (torchtitan since 00b7f5693, 2026-04-09, "replace amp and replicate with fully_shard": 0.3.0
    # models/llama3/parallelize.py ``apply_fsdp_to_decoder`` runs whatever the shard degree). Under pipelining such
    # a stage holds its bf16 parameters and gradient accumulators unsharded as ZeRO-3 does
    # (``memory.pp_unsharded_stage``).
    zero0_fsdp2: bool = False

    @property
    def model_compiled(self) -> bool:
        """torch.compile covers the model's blocks (compile on, "model" in its components): fused element-wise
        kernels, AOTAutograd's saved tensors, fused fp8 casts."""
        return self.compile and "model" in self.compile_components

    @property
    def expandable_segments(self) -> bool:
        """The launch environment sets the caching allocator's expandable segments (as Megatron-Core reads it)."""
        return "expandable_segments:True" in dict(self.env).get(ALLOC_CONF_VAR, "").split(",")

    def state_bytes(self, params: float, zero_stage: int, shard_group: int,
                    uncached: float = 0.0) -> tuple[float, float, float]:
        """(weights, grads, optimizer) bytes of ``params`` held by a rank under ZeRO over ``shard_group``;
        ``uncached`` of them are weights no TE linear uses (``memory.StageParams.outside_te``: no cached copy)."""
        from cost_models.memory import zero_state_bytes

        w, g, o = zero_state_bytes(params, zero_stage, shard_group,
                                   (self.weight_bytes, self.grad_bytes, self.optimizer_bytes))
        return w + self.weight_cache_bytes * (params - uncached), g, o  # TE caches the weight it used: the gathered one

    @property
    def adam_bytes_per_param(self) -> float:
        """HBM bytes of one Adam step per parameter: read and write the optimizer state, read the gradient, write
        the parameter, and read it too where it is the fp32 master (torch FSDP2). Megatron (fp32 main grads):
        12 + 4 + 12 + 2 = 30; torch FSDP2: 8 + 4 + 4 + 8 + 4 = 28."""
        master = self.weight_bytes if self.weight_bytes >= 4 else 0.0
        return 2 * self.optimizer_bytes + self.grad_bytes + self.weight_bytes + master

    @property
    def reduce_bytes(self) -> float:
        """Gradient bytes per parameter on the DP wire (reduce dtype)."""
        return DTYPE_BYTES[self.grad_reduce_dtype]

    @property
    def tp_overlapped(self) -> bool:
        """Whether TP collectives are hidden behind GEMMs (Megatron userbuffers or torchtitan async TP)."""
        return self.tp_comm_overlap or self.async_tp

    def knobs(self) -> dict[str, Any]:
        """Every knob this run assumes (what plans and predictions report): the target and each knob its profile
        offers, resolved (a reference runtime: all of them)."""
        from cost_models.targets import PROFILES

        prof = PROFILES.get(self.target)
        names = [n for n in KNOB_NAMES if (prof is None or n in prof.knobs)
                 and (n != "cp_a2a_size" or self.cp_comm_type == "a2a+p2p")  # a parameter of a2a+p2p only
                 and (n != "compile_components" or (self.compile and self.compile_components != "model+loss"))
                 # MoE knobs off their defaults (alltoall, no overlap, dropless learned routing), set by a knob or
                 # by a cluster profile's efficiency
                 and (not n.startswith("moe_") or getattr(self, n) not in (None, False, "alltoall"))
                 and (not n.startswith("cuda_graph_") or self.cuda_graph_impl != "none")
                 and (n not in ("optimizer", "muon_tp_mode") or self.optimizer != "adam")
                 # the Megatron-Core release where it is not the validated pip package's (the profile's version)
                 and (n != "megatron_core" or self.megatron_core != CORE_RELEASES[0])
                 and (n != "bf16_layers" or self.bf16_layers != (0, 0))
                 and (n != "quant_recipe" or self.quant_recipe is not None)
                 and (n != "dsa_kernel_backend" or self.dsa_kernel_backend != "none")]
        knobs = {n: getattr(self, n) for n in names}
        if knobs.get("fp8_recipe") == "nvfp4":  # precision nvfp4's TE recipe, not the fp8 knob
            knobs["fp8_recipe"] = None
        return {"target": self.target, **knobs}


@dataclass(frozen=True)
class Knob:
    """One knob a target offers: its allowed values and the target's default (a rule citing the source)."""

    name: str
    values: tuple[Any, ...]
    default: Any
    source: str
    int_values: bool = False  # also an integer > 1 (FSDP2 reshard_after_forward: a group size)


@dataclass(frozen=True)
class Prepared:
    """A user's layout as a target takes it (``TargetProfile.prepare``): ``par`` checked, with the target's
    defaults; ``runs`` the layout the framework really runs; ``runtime`` resolved on ``runs``; ``note`` how ``runs``
    differs from ``par`` (None: it runs as written)."""

    par: ParallelConfig
    runs: ParallelConfig
    runtime: Runtime
    note: str | None


def targets_that(accepts: Callable[["TargetProfile"], bool], but: str) -> list[str]:
    """The targets other than ``but`` whose profile ``accepts`` what ``but`` refuses, in ``PROFILES`` order: what a
    refusal suggests instead (``use_instead``), computed from the profiles' own rules rather than a name written in
    the message (as ``target_model_notes``' 'emit it for --target X')."""
    from cost_models.targets import PROFILES  # (the registry imports this module)

    return [name for name, prof in PROFILES.items() if name != but and accepts(prof)]


def use_instead(targets: list[str]) -> str:
    """A refusal's advice: the targets that accept it, or that none does."""
    return f"use --target {' or '.join(targets)}" if targets else "no target runs it"


def use_instead_at(runs: Callable[["TargetProfile", int], bool], zero: int, but: str) -> str:
    """A refusal's advice where the other targets' rules depend on the ZeRO stage (``runs(profile, stage)``: whether
    that target takes the layout at that stage): the targets that run it at ``zero``, the stage asked for; where none
    does, those that run it at another stage of theirs, each with its first such stage in its search order
    (``zero_stages``) named ('use --target megatron with zero_stage 1'); else that none runs it. A target is asked only
    at the stages it has."""
    from cost_models.targets import PROFILES  # (the registry imports this module)

    same = targets_that(lambda p: zero in p.zero_stages and runs(p, zero), but)
    if same:
        return use_instead(same)
    other = {t: next(z for z in PROFILES[t].zero_stages if runs(PROFILES[t], z))
             for t in targets_that(lambda p: any(runs(p, z) for z in p.zero_stages), but)}
    if other:
        return "use " + " or ".join(f"--target {t} with zero_stage {z}" for t, z in other.items())
    return use_instead([])


def dynamic_rope_error(model: ModelSpec, seq_len: int, framework: str) -> ConfigError | None:
    """Dynamic-NTK RoPE trains as plain RoPE only while no sequence is longer than ``max_position_embeddings``:
    transformers rescales once ``max(position_ids) + 1`` exceeds it (``dynamic_rope_update``,
    modeling_rope_utils.py:101 @ 5.24.0; below it ``_compute_dynamic_ntk_parameters`` gives the base unchanged,
    :329-341). Training positions run to seq_len - 1, so seq_len <= max_position_embeddings is plain RoPE, which
    the frameworks emit; a longer seq_len needs rescaled frequencies that ``framework`` has no setting for. The one
    rule: ``TargetProfile.seq_len_error`` (emit's refusal) and ``TargetProfile.job_notes`` (the estimate's note)."""
    rs = model.arch.rope_scaling
    if rs is None or rs.type != "dynamic" or seq_len <= (rs.max_position_embeddings or 0):
        return None
    return ConfigError(f"{model.name}: rope_scaling 'dynamic' (factor {rs.factor:g}) rescales RoPE once a "
                       f"sequence exceeds max_position_embeddings={rs.max_position_embeddings} (transformers "
                       f"dynamic_rope_update); seq_len={seq_len} would train rescaled frequencies, which {framework} "
                       "has no setting for", valid=[f"seq_len <= {rs.max_position_embeddings}"])


def chunked_attention_error(model: ModelSpec, seq_len: int, framework: str) -> ConfigError | None:
    """Chunked attention (``ArchSpec.attention_chunk``, Llama 4) equals full causal attention while a sequence fits in
    one chunk; ``framework`` has no chunked attention, so a longer ``seq_len`` would train a different mask. The one
    rule of ``TargetProfile.seq_len_error`` (emit) and ``job_notes`` (estimate) for such a target."""
    chunk = model.arch.attention_chunk
    if chunk is None or seq_len <= chunk:
        return None
    return ConfigError(f"{model.name}: attention_chunk={chunk} (each RoPE layer attends within chunks of {chunk} "
                       f"tokens); {framework} has no chunked attention, so seq_len={seq_len} would train full causal "
                       f"attention across chunks", valid=[f"seq_len <= {chunk}"])


class TargetProfile:
    """One framework (and version): legality, run-time semantics, knobs. Subclasses fill the tables."""

    name: TargetName
    version: str = ""
    # Which framework efficiency set (gpus.yaml ``frameworks``: GEMM efficiency, attention kernel, overlaps,
    # fitted on that framework's published runs) this target's kernels run with. The profile names the set; the
    # numbers are catalog data (``autoplan.catalog.cluster.target_efficiency`` reads them: cost_models loads no YAML).
    efficiency_set: str = ""
    # GPU generations on which the stack's attention call puts cuDNN fused attention first in PyTorch's SDPA
    # dispatch (``sdpa_kernel(backends, set_priority=True)``; sdp_utils.cpp ``select_sdp_backend`` runs the first
    # backend whose checks pass, and cuDNN SDPA's pass for causal bf16 head-dim-128 attention on sm80-sm121,
    # ``check_cudnn_hardware_support``). There SDPA runs cuDNN's kernel, priced at the generation's ``attention``
    # figure (itself a cuDNN measurement), not at FlashAttention-2's ``FA2_VS_CUDNN`` share of it (the framework
    # set's ``attention_fa2``): ``autoplan.catalog.cluster.target_efficiency``. ROCm builds have no cuDNN backend.
    sdpa_cudnn_first: tuple[Generation, ...] = ()
    schedules: tuple[str, ...] = ("1f1b", "interleaved")
    zero_stages: tuple[int, ...] = (0, 1, 3)  # search order
    cp_comm_types: tuple[str, ...] = ("p2p",)
    knobs: dict[str, Knob] = {}
    # Per-op strategy set the intra-op ILP may use on this target (search/strategies.py reads them):
    # sequence parallelism "flag" (one switch for the model, the layout's) or "forced" (on whenever tp > 1);
    # the loss "F" (vocab-parallel cross-entropy) and/or "R" (logits gathered, loss replicated); K/V projections
    # under TP: "shard" (heads split, num_kv_heads % tp == 0), "gather" (tp a multiple of num_kv_heads: QKV
    # split evenly, output all-gathered, one KV head per rank: Megatron-Core), "replicate" (K/V weights
    # replicated on every TP rank, each rank keeps its query heads' KV heads: a DTensor Replicate module).
    sequence_parallel: Literal["flag", "forced"] = "flag"
    # Why MoE layers under TP need sequence parallelism on every target (validate.check_parallel, search.space): the
    # target's own rule, or (default) what autoplan can price: routed experts at expert-TP 1 with their tokens split
    # over TP by SP (op_cost.op_compute, "experts")
    moe_sp_source: str = "autoplan prices routed experts at expert-TP 1 with their tokens split over tp by SP"
    loss_modes: tuple[str, ...] = ("F",)
    kv_modes: tuple[str, ...] = ("shard",)
    kv_source: str = ""  # where the K/V rule comes from
    # Hybrid Mamba stacks (``ModelSpec.hybrid_pattern``): "" = this target builds none (why, for the error)
    hybrid_models: bool = False
    # Whether the emitted run trains a MoE model's auxiliary load-balancing loss (``RouterSpec.aux_loss``); a target
    # without it says so when it emits one (and which targets train it)
    trains_moe_aux_loss: bool = True
    hybrid_refusal: str = "it builds no Mamba-2 mixer"
    # Gated DeltaNet layers of a transformer stack (ModelSpec.gdn): a target that builds and prices them
    gdn_models: bool = False
    gdn_refusal: str = "it builds no Gated DeltaNet mixer"
    # DeepSeek sparse attention (``ModelSpec.dsa``): whether this target builds it (megatron: DSAttention)
    dsa_models: bool = False
    # Why a target without the ``optimizer`` knob runs no Muon (the error names it)
    optimizer_refusal: str = "this target runs Adam only"
    # The framework that computes the emitted model's RoPE from autoplan's settings (``dynamic_rope_error`` names
    # it); "": the user's own model computes it (fsdp2), so no RoPE setting of the config is refused
    rope_framework: str = ""

    @property
    def kv_default(self) -> str:
        """The ``kv_replication`` this target's layouts carry where the user sets none: its own way of holding K/V
        heads under tp > num_kv_heads (fsdp2: 'replicate'), else the generic default 'gather' (ignored where tp
        divides the heads; torchtitan holds none). ``with_defaults`` and the search label layouts with it, so a
        searched plan and an estimate of the same layout say the same."""
        held = [m for m in self.kv_modes if m != "shard"]
        return "gather" if not held or "gather" in held else held[0]

    @property
    def allow_kv_replication(self) -> bool:
        """tp a multiple of num_kv_heads (KV heads held by tp / num_kv_heads ranks each)."""
        return "gather" in self.kv_modes or "replicate" in self.kv_modes

    # ---- knobs -----------------------------------------------------------------------------------------
    def resolve(self, software: Software | None, job: JobSpec, cluster: ClusterSpec,
                par: ParallelConfig | None = None) -> Runtime:
        """The run-time semantics of ``software`` on this target (defaults filled in); ``ConfigError`` for a
        knob the target lacks or a value it refuses. ``par`` (the layout) refines defaults that depend on it."""
        raise NotImplementedError

    def _knob_values(self, software: Software | None, job: JobSpec, cluster: ClusterSpec) -> dict[str, Any]:
        """Given knobs checked against ``knobs``; the rest left None."""
        given = software.given() if software is not None else {}
        for key, value in given.items():
            knob = self.knobs.get(key)
            if key == "optimizer" and knob is None:  # every target runs Adam; Muon only where its profile offers it
                if value != "adam":
                    raise ConfigError(f"optimizer={value}: {self.optimizer_refusal}", valid=["adam", "target megatron"])
                continue
            if knob is None:
                offered = ", ".join(sorted(self.knobs)) or "none"
                raise ConfigError(f"{self.name} has no knob {key} (its knobs: {offered})")
            is_int = isinstance(value, int) and not isinstance(value, bool)
            # by type as well as value: 0 == False and 1 == True, but an int is a group size, not a bool
            offered = any(value == v and type(value) is type(v) for v in knob.values)
            if knob.values and not offered and not (knob.int_values and is_int):
                raise ConfigError(f"{key}={value!r} is not a {self.name} choice ({knob.source})", valid=knob.values)
        return given

    # ---- knobs the search chooses ---------------------------------------------------------------------------
    # Knobs whose best value depends on the layout and that change the time of a layer, not numerics, model state or
    # DP traffic (activations they may: torchtitan's compile compiles the loss; the search's memory bounds take the
    # fewest bytes any setting saves, ``Scorer.act_floor``): the search prices each legal value per layout with
    # ``layer_cost`` and keeps the cheapest (``search.score.Scorer.chosen_knobs``). Not searched: numerics
    # (grad_reduce_dtype, fp8_recipe: the user's call), and overlaps whose default "on" is never slower in the cost
    # model (Megatron tp_comm_overlap, overlap_grad_reduce/param_gather: ``knob_effects.tp_overlap_mode``,
    # ``estimate.dp_exposed_s``).
    searched_knobs: tuple[str, ...] = ()

    def knob_options(self, name: str, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                     given: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        """Settings of one searched knob worth pricing on this layout (``given``: the user's knobs), the target's
        default first (each a dict of ``Software`` fields: a value may carry a parameter, e.g. a2a+p2p its group
        size); () or one: no choice."""
        return ()

    def layout_knob_options(self, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                            given: dict[str, Any]) -> list[dict[str, Any]]:
        """Settings of the knobs the search tries on this layout as layouts of their own, each priced whole: those
        that change memory as well as time (FSDP2 ``reshard_after_forward``) or the step beyond its layers' time per
        micro-batch (Megatron's EP A2A overlap: the combined 1F1B's pipeline sends), the target's default ({}) first;
        [{}]: none. Those among them that change a layer's time are ``layer_time_layout_knobs``."""
        return [{}]

    # Layout knobs (``layout_knob_options``) that change a decoder layer's time or activations: the search keys its
    # per-layer caches on them (``search.score.Scorer.bound_key``); the others change only memory or the step.
    layer_time_layout_knobs: frozenset[str] = frozenset()
    # Layout knobs that change no byte ``estimate`` prices in memory (``cost_models.memory`` never reads them): the
    # search bounds a layout's memory once for all their settings (``search.score.Scorer.memory_lower_bound``).
    memory_neutral_layout_knobs: frozenset[str] = frozenset()

    def knob_floor(self) -> tuple[dict[str, Any], bool] | None:
        """Searched-knob settings under which ``layer_cost`` (and ``head_cost``) are at most what any legal setting
        gives, and whether the layer's exposed CP traffic is to be left out of that floor (it need not be a legal
        setting). The search bounds layouts with it and prices every setting only for the layouts it visits.
        None: price every setting for every bound."""
        return None

    def knob_candidates(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                        software: Software | None) -> list[dict[str, Any]]:
        """The legal settings of the searched knobs the user left unset on this layout (the user's knobs kept),
        as ``Software`` fields to add to the user's; the target's defaults first, then in ``knob_options`` order
        (the search's tie order). Empty when nothing is left to choose or no setting is legal with the user's
        knobs (the user's knobs then decide, and ``check_runtime`` says why)."""
        given = software.given() if software is not None else {}
        options = [o for o in (self.knob_options(n, model, cluster, job, par, given) for n in self.searched_knobs
                               if n not in given) if len(o) > 1]
        if not options:
            return []
        out: list[dict[str, Any]] = []
        for combo in itertools.product(*options):
            fields: dict[str, Any] = {}
            for part in combo:
                fields.update(part)
            try:
                rt = self.resolve(Software(**given, **fields), job, cluster, par)
                self.check_runtime(model, cluster, job, par, rt)
            except ConfigError:
                continue
            out.append(fields)
        return out

    # ---- legality --------------------------------------------------------------------------------------
    def check(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
              rt: Runtime | None = None) -> None:
        """Raise ``ConfigError`` naming the framework rule (file:line) a layout breaks, and a legal neighbour."""
        from cost_models.validate import check_parallel

        err = self.model_error(model)  # a model the target builds no layout of: no degree would help, so it comes
        if err is not None:  # before the layout's rules (check_parallel's expert rule would say ep, not the model)
            raise err
        check_parallel(model, cluster, job, par, allow_kv_replication=self.allow_kv_replication, profile=self)
        if model.mla is None and par.tp > model.num_kv_heads and par.kv_replication not in self.kv_modes:
            held = [m for m in self.kv_modes if m != "shard"]
            raise ConfigError(f"kv_replication={par.kv_replication} with tp={par.tp} > num_kv_heads="
                              f"{model.num_kv_heads}: {self.name} replicates KV heads by "
                              f"{' or '.join(held)} ({self.kv_source})", valid=held)
        self.check_layout(model, cluster, job, par)
        if rt is not None:
            self.check_runtime(model, cluster, job, par, rt)

    # Megatron's layout fields this target runs (``ParallelConfig.pipeline_layout`` / ``recompute_modules``)
    megatron_fields: tuple[str, ...] = ()
    # Whether the search weighs explicit pipeline layouts (``pipeline_split.layout_candidates``) for the interleaved
    # splits this target's split flags cannot build (the target's own layout rules are ``pipeline_layout``'s)
    searches_pipeline_layouts: bool = False

    def megatron_field_error(self, field: str) -> ConfigError | None:
        """Why this target cannot run Megatron's layout ``field`` (``pipeline_layout`` / ``recompute_modules``) set,
        or None where it runs it (``megatron_fields``): ``check_layout``'s rule, and the search's on a pin."""
        if field in self.megatron_fields:
            return None
        flag = {"pipeline_layout": "--pipeline-model-parallel-layout", "recompute_modules": "--recompute-modules"}[field]
        others = targets_that(lambda p: field in p.megatron_fields, self.name)
        return ConfigError(f"{field}: {self.name} has no such setting (it is Megatron-LM's {flag}); "
                           f"{use_instead(others)}", valid=[*(f"target {t}" for t in others), f"{field} unset"])

    def check_layout(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig) -> None:
        """Target rules on the layout alone (what the search space filters on: ``layout_error``)."""
        for field in ("pipeline_layout", "recompute_modules"):
            if getattr(par, field) is not None and (err := self.megatron_field_error(field)) is not None:
                raise err
        err = self.layout_error(model, tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep, zero=par.zero_stage,
                                hsdp=par.hsdp_shard_size, dp_cp=par.dp(cluster.num_gpus) * par.cp,
                                schedule=par.schedule)
        if err is not None:
            raise err

    def layout_error(self, model: ModelSpec, *, tp: int, pp: int, cp: int, ep: int, zero: int, hsdp: int | None,
                     dp_cp: int, schedule: str) -> ConfigError | None:
        """The first target rule the layout breaks (cheap: integers only, so the search calls it per layout)."""
        err = self.model_error(model)
        if err is not None:
            return err
        if zero not in self.zero_stages:
            return ConfigError(f"zero_stage={zero}: {self.zero_reason(zero)}", valid=sorted(self.zero_stages))
        if schedule not in self.schedules:
            return ConfigError(f"schedule {schedule}: {self.name} has no such schedule (its pipeline schedules: "
                               + ", ".join(self.schedules) + ")", valid=self.schedules)
        if hsdp == 1 and dp_cp > 1:
            return self.one_rank_group_error(zero, cp, dp_cp)
        if hsdp is not None and (hsdp < dp_cp or zero == 0):  # the whole group under ZeRO-0 still shards nothing
            err = self.hsdp_error(zero, hsdp, cp, dp_cp)
            if err is not None:
                return err  # (a target that takes this HSDP group still applies its other rules below)
        return (self.target_layout_error(model, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero)
                or self.expert_layout_error(model, tp=tp, pp=pp, cp=cp, dp_cp=dp_cp, ep=ep, zero=zero, hsdp=hsdp))

    # ---- expert parallelism (MoE parallel folding) ----------------------------------------------------------
    # Routed experts run with expert-TP ``expert_tensor_parallel`` (1: tokens, not expert weights, split over the
    # TP ranks; ``op_cost.op_compute``), and the expert layers re-cut some ranks of one pipeline stage as
    # ep × edp, an EP group being ``ep`` consecutive ranks (``collectives.RankStrides``). Which ranks, and the
    # source of the rule, are the target's (``expert_ranks``); None: the target runs no expert parallelism.
    expert_tensor_parallel: int | None = None
    expert_rule: str = ""  # where the framework cuts the expert ranks (file:line)
    expert_count_rule: str = ""  # where it needs num_experts % ep == 0
    expert_refusal: str = ""  # why a target without expert parallelism has none (and where to go instead)

    def expert_ranks(self, *, tp: int, cp: int, dp_cp: int, zero: int, hsdp: int | None) -> tuple[int, str] | None:
        """(ranks of one pipeline stage the expert layers cut into ep × edp, their product as a formula with the
        values); None: no expert parallelism on this target."""
        return None

    def expert_layout_error(self, model: ModelSpec, *, tp: int, pp: int, cp: int, dp_cp: int, ep: int, zero: int,
                            hsdp: int | None) -> ConfigError | None:
        """The first expert-parallel rule ``ep`` breaks: a dense model, no EP on this target, ``num_experts % ep``,
        or ``ep`` not dividing the target's expert ranks (``expert_ranks``); the valid list is the ep degrees that
        pass both, nearest first. ``pp``: the layout's, for a refusal's advice (``FSDP2Profile``: the targets that
        run the layout), not a rule of the expert ranks (those are one stage's)."""
        if ep == 1:
            return None
        if not model.is_moe:
            return ConfigError(f"ep={ep} needs a MoE model; {model.name} is dense", valid=[1])
        cut = self.expert_ranks(tp=tp, cp=cp, dp_cp=dp_cp, zero=zero, hsdp=hsdp)
        if cut is None:
            return ConfigError(f"ep={ep}: {self.expert_refusal or f'the {self.name} target has no expert parallelism'}",
                               valid=[1])
        ranks, formula = cut
        valid = nearest(ep, [e for e in divisors(model.num_experts) if ranks % e == 0])
        if model.num_experts % ep:
            return ConfigError(f"ep={ep} does not divide num_experts={model.num_experts} ({self.expert_count_rule})",
                               valid=valid)
        if ranks % ep:
            return ConfigError(f"ep={ep} must divide {formula} = {ranks}: {self.name} cuts the expert layers' "
                               f"ep x edp from those ranks of a pipeline stage ({self.expert_rule})", valid=valid)
        return None

    def target_layout_error(self, model: ModelSpec, *, tp: int, pp: int, cp: int, ep: int,
                            zero: int) -> ConfigError | None:
        return None

    def check_runtime(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                      rt: Runtime) -> None:
        """Rules that tie knobs to the layout (e.g. TP overlap needs sequence parallelism)."""

    def model_error(self, model: ModelSpec) -> ConfigError | None:
        """Why this target cannot build ``model`` at all (any layout); None: it can."""
        if model.is_hybrid and not self.hybrid_models:
            others = targets_that(lambda p: p.hybrid_models, self.name)
            return ConfigError(f"{model.name} is a hybrid Mamba-2 stack (hybrid_pattern): the {self.name} target "
                               f"cannot run it ({self.hybrid_refusal}); {use_instead(others)}",
                               valid=[f"target {t}" for t in others])
        if model.gdn is not None and not self.gdn_models:
            others = targets_that(lambda p: p.gdn_models, self.name)
            return ConfigError(f"{model.name} has Gated DeltaNet linear-attention layers (gdn): the {self.name} target "
                               f"cannot run them ({self.gdn_refusal}); {use_instead(others)}",
                               valid=[f"target {t}" for t in others])
        if model.dsa is not None and not self.dsa_models:
            others = targets_that(lambda p: p.dsa_models, self.name)
            return ConfigError(f"{model.name} has DeepSeek sparse attention (a lightning indexer choosing each query's "
                               f"top-{model.dsa.index_topk} keys over MLA): the {self.name} target cannot run it (its "
                               f"models build dense attention only; autoplan emits no indexer for it); "
                               f"{use_instead(others)}", valid=[f"target {t}" for t in others])
        return None

    # How ``estimate`` prices a model whose emission this target refuses (``emit_model_errors``), and the name its
    # notes give the target
    refused_model_pricing: str = "priced as the model states it"
    emit_label: str = ""

    def emit_model_errors(self, model: ModelSpec) -> list[ConfigError]:
        """Why ``emit`` for this target refuses ``model`` although the target prices it (a fact its flags or its
        shipped definitions cannot express): every reason, in the order emit meets them; [] when it emits it. The one
        rule: emit's ``_check`` raises the first, ``model_notes`` says them all at estimate time."""
        return []

    def model_notes(self, model: ModelSpec) -> list[str]:
        """What a prediction of ``model`` on this target tells the user about the model itself: each reason
        ``emit_model_errors`` gives, and how it is priced all the same ([] for none). ``estimate`` adds them, with the
        targets that would emit the model (``cost_models.targets.target_model_notes``)."""
        label = self.emit_label or f"--target {self.name}"
        # each refusal's rule alone (ConfigError.reason, without its advice: target_model_notes adds the targets)
        return [f"not emittable for {label}: {err.reason} ({self.refused_model_pricing})"
                for err in self.emit_model_errors(model)]

    def seq_len_error(self, model: ModelSpec, seq_len: int) -> ConfigError | None:
        """Why this target's emitted run would not train ``model``'s RoPE at ``seq_len`` as the model states it
        (``dynamic_rope_error``); None: it would. ``emit`` refuses on it; ``job_notes`` says it at estimate time."""
        return dynamic_rope_error(model, seq_len, self.rope_framework) if self.rope_framework else None

    def job_notes(self, model: ModelSpec, job: JobSpec) -> list[str]:
        """``model_notes`` that depend on the job: a seq_len ``emit`` refuses (``seq_len_error``), priced all the same
        (dynamic NTK rescales frequencies, no cost)."""
        err = self.seq_len_error(model, job.seq_len)
        if err is None:
            return []
        how = ("or for --target fsdp2, whose model computes its own RoPE (RoPE scaling changes no cost: priced as "
               "plain RoPE)" if dynamic_rope_error(model, job.seq_len, "") is not None else
               "or for --target fsdp2, whose model computes its own attention (priced with the chunks' attention)")
        return [f"not emittable for --target {self.name} at seq_len {job.seq_len}: {err.reason}; emittable at "
                f"{', '.join(map(str, err.valid or []))}, {how}"]

    def model_runtime_error(self, model: ModelSpec, rt: Runtime) -> ConfigError | None:
        """Why this target, run with ``rt``'s knobs (its software version), cannot build ``model``; None: it can.
        ``estimate``, ``check_runtime`` (search, emit, validate) and the planner ask it."""
        return None

    def sp_split_error(self, seq_len: int, tp: int, cp: int) -> str | None:
        """Why this target's sequence parallelism cannot split a sequence of ``seq_len`` tokens over ``tp`` ranks
        (with ``cp``), None when it can (the default: DTensor shards unevenly). Read by validate.check_parallel,
        search.space and search.planner's pin reasons."""
        return None

    def interleave_error(self, model: ModelSpec) -> ConfigError | None:
        """Why this target cannot interleave ``model``'s pipeline (virtual stages); None: it can."""
        return None

    def hybrid_layout_error(self, model: ModelSpec, tp: int, cp: int) -> ConfigError | None:
        """The rule of this target's Mamba-2 mixer that (tp, cp) breaks for a hybrid ``model``; None: none (a target
        without hybrid models refuses them whole, ``model_error``)."""
        return None

    def pipeline_rule_error(self, model: ModelSpec, par: ParallelConfig) -> ConfigError | None:
        """A rule of this target's own pipeline split for ``model`` that replaces the generic Megatron-style split
        (``validate.check_parallel`` asks it before its layer-count and accounting checks, so their hints do not
        name settings the target ignores); None: the generic rules apply."""
        return None

    def zero_reason(self, zero_stage: int) -> str:
        return f"{self.name} has no ZeRO-{zero_stage}"

    def hsdp_error(self, zero: int, hsdp: int, cp: int, dp_cp: int) -> ConfigError | None:
        return ConfigError(f"hsdp_shard_size={hsdp}: {self.name} has no hybrid sharding")

    def one_rank_group_error(self, zero: int, cp: int, dp_cp: int) -> ConfigError:
        """``hsdp_shard_size`` = 1 under dp*cp > 1: shard groups of one rank shard nothing, and every rank
        all-reduces whole gradients over its dp*cp replicas — plain data parallelism. The frameworks would run it
        (Megatron: dp*cp distributed-optimizer instances of one rank, parallel_state.py:833-840 @ core_v0.16.1 only
        asks that they divide dp*cp; torchtitan: dp_shard 1 x dp_replicate dp is its replicate-only layout; FSDP2: a
        (dp, 1) mesh), but as ZeRO-0, not as sharding: refused, naming zero_stage=0 where the target runs it and the
        smallest shard groups that shard."""
        head = (f"hsdp_shard_size=1 shards nothing: one-rank shard groups replicated over dp*cp = {dp_cp} ranks are "
                "plain data parallelism")
        if zero == 0:  # already plain: the group size only misleads
            return ConfigError(f"{head}, which zero_stage=0 runs without it", valid=["hsdp_shard_size unset"])
        sizes = [s for s in range(2, dp_cp) if dp_cp % s == 0 and self.hsdp_error(zero, s, cp, dp_cp) is None][:3]
        plain = "zero_stage=0" if 0 in self.zero_stages else f"which {self.name} does not run: it always shards"
        return ConfigError(f"{head}, {plain}",
                           valid=(["zero_stage=0 with hsdp_shard_size unset"] if 0 in self.zero_stages else [])
                           + [f"hsdp_shard_size={s}" for s in sizes] + ["hsdp_shard_size unset"])

    def prepare(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                software: Software | None = None) -> Prepared:
        """What ``autoplan estimate`` and ``autoplan calibrate`` do with a user's layout, in one place: the target's
        defaults filled in (``with_defaults``), its layout rules (``check``), the knobs resolved and their rules
        with the layout (``check_runtime``), then the layout the framework really runs (``runs_as``) with the
        runtime resolved on it. ``ConfigError`` names the first rule broken."""
        par = self.with_defaults(par, software)
        self.check(model, cluster, job, par)
        rt = self.resolve(software, job, cluster, par)  # a knob the target lacks: error
        self.check_runtime(model, cluster, job, par, rt)
        runs, note = self.runs_as(par, cluster.num_gpus)
        if note is not None:
            rt = self.resolve(software, job, cluster, runs)
        return Prepared(par, runs, rt, note)

    def legal(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
              rt: Runtime | None = None) -> str | None:
        """None when the target accepts the layout, else the reason (the ``check`` message)."""
        try:
            self.check(model, cluster, job, par, rt)
        except ConfigError as err:
            return str(err)
        return None

    def runs_model(self, model: ModelSpec, tp: int) -> ModelSpec:
        """The model as the framework builds it on ``tp`` ranks, where that differs from the user's in a fact the
        cost model reads (Megatron pads the vocabulary to a multiple of tp: ``MegatronProfile.runs_model``); the
        model itself elsewhere (torchtitan and FSDP2 shard an uneven vocabulary as DTensor does, unpadded)."""
        return model

    def runs_as(self, par: ParallelConfig, num_gpus: int) -> tuple[ParallelConfig, str | None]:
        """The layout the framework really runs for ``par`` (e.g. torchtitan runs ZeRO-0 with cp > 1 as FSDP
        over cp), and a note saying so; ``par`` itself when it runs as written."""
        return self.whole_group_as_plain(par, num_gpus)

    # Where an HSDP shard group of all dp*cp ranks (one group, no replicas) is the target's plain sharding
    whole_group_source: str = ""

    def whole_group_as_plain(self, par: ParallelConfig, num_gpus: int) -> tuple[ParallelConfig, str | None]:
        """``hsdp_shard_size`` = dp*cp leaves one shard group and nothing to replicate over: every target runs its
        plain ZeRO/FSDP (``whole_group_source``), so that is the layout, with a note (priced the same)."""
        h = par.hsdp_shard_size
        if h is None or h != par.dp(num_gpus) * par.cp:
            return par, None
        kind = "FSDP (zero_stage=3)" if par.zero_stage == 3 else f"ZeRO-{par.zero_stage}"
        return par.model_copy(update={"hsdp_shard_size": None}), (
            f"hsdp_shard_size={h} is the whole dp*cp group (one shard group, no replicas): {self.name} runs it as "
            f"plain {kind} over dp*cp = {h} ({self.whole_group_source})")

    def with_defaults(self, par: ParallelConfig, software: Software | None = None) -> ParallelConfig:
        """``par`` with the target's own ZeRO stage where the user left it unset and the generic default (1) is
        one the target does not run with ``software``'s knobs (torchtitan, fsdp2: 3; ``default_zero_stage``), and
        its own way of holding K/V heads under tp > num_kv_heads where the user left ``kv_replication`` unset and
        the generic default (Megatron's 'gather') is not one (fsdp2: 'replicate'; ignored where tp divides them)."""
        update: dict[str, Any] = {}
        if "zero_stage" not in par.model_fields_set:
            zero = self.default_zero_stage(par.zero_stage, software)
            if zero != par.zero_stage:
                update["zero_stage"] = zero
        if "kv_replication" not in par.model_fields_set and par.kv_replication != self.kv_default:
            update["kv_replication"] = self.kv_default
        return par.model_copy(update=update) if update else par

    def default_zero_stage(self, generic: int, software: Software | None) -> int:
        """The ZeRO stage an unset one means on this target: the generic default where the target runs it, else
        its first."""
        return generic if generic in self.zero_stages else self.zero_stages[0]

    def runs_as_written(self, zero: int, cp: int) -> bool:
        """False when ``runs_as`` would turn this ZeRO stage into another layout (the search then offers only the
        layout that runs)."""
        return True

    def hsdp_choices(self, cluster: ClusterSpec, dp_cp: int, cp: int) -> list[int]:
        """Shard-group sizes the search tries for HSDP (ZeRO-3): an NVLink domain or a node."""
        return [s for s in sorted({cluster.gpus_per_node, cluster.nvlink_domain_size}) if 1 < s < dp_cp
                and dp_cp % s == 0]


def reshard_options(cluster: ClusterSpec, par: ParallelConfig, given: dict[str, Any],
                    int_groups: bool) -> list[dict[str, Any]]:
    """FSDP2 ``reshard_after_forward`` settings worth searching on a ZeRO-3 layout without pipelining (with pp > 1
    the stage stays gathered): the default (True: {}), False (no backward all-gather; the stage's gathered
    parameters held), and with ``int_groups`` a node or NVLink domain (the backward all-gather inside it; 1/r of
    them held)."""
    if "reshard_after_forward" in given or par.zero_stage != 3 or par.pp != 1:
        return [{}]
    group = par.hsdp_shard_size or par.dp(cluster.num_gpus) * par.cp
    out: list[dict[str, Any]] = [{}, {"reshard_after_forward": False}]
    if int_groups:
        out += [{"reshard_after_forward": r} for r in sorted({cluster.gpus_per_node, cluster.nvlink_domain_size})
                if 1 < r < group and group % r == 0]
    return out


def fsdp2_gathered_unit_bytes(reduce_dtype: GradDtype) -> float:
    """torch FSDP2 (``fully_shard``), per parameter of the largest unit: the gathered bf16 unit (2) and the
    prefetched next one (2), and in the backward the unit's bf16 gradient (2) and the reduce-scatter input it is
    copied into, in the reduce dtype whatever it is (torch 2.13 torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py:597-603 ``foreach_reduce``: allocate, then ``foreach_reduce_scatter_copy_in``): 10 with the
    fp32 reduce of ``MixedPrecisionPolicy(reduce_dtype=fp32)``, 8 with a bf16 reduce."""
    return 6.0 + (4.0 if reduce_dtype == "fp32" else 2.0)


def fsdp2_pp_unsharded_bytes(reduce_dtype: GradDtype) -> float:
    """torch FSDP2 under pipelining (torchtitan apply_fsdp: reshard_after_forward off with PP; torch/distributed/
    pipelining/stage.py backward_maybe_with_nosync: no reshard, no gradient sync but for the last micro-batch): the
    stage's bf16 parameters (2) and its unsharded gradients, accumulated in the reduce dtype
    (``fsdp2_pp_grad_accumulation_bytes``), stay through the step: 6 with an fp32 reduce, 4 with bf16."""
    return 2.0 + DTYPE_BYTES[reduce_dtype]


def fsdp2_pp_grad_accumulation_bytes(reduce_dtype: GradDtype) -> tuple[float, float]:
    """HBM bytes per stage parameter torch FSDP2 moves to accumulate a stage's unsharded gradients under pipelining,
    (first micro-batch, each later one). Gradient sync off, each backward leaves the unit's bf16 gradient on the
    unsharded parameter (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param_group.py ``post_backward``). Where the
    reduce dtype is wider (fp32), ``FSDPParam.to_accumulated_grad_if_needed`` copies it into
    ``unsharded_accumulated_grad`` in the reduce dtype (read 2, write 4), and each later micro-batch's
    ``accumulate_unsharded_grad_if_needed`` adds the new bf16 gradient to it (``+=``: read 2 + 4, write 4)
    (_fsdp_param.py). With a bf16 reduce autograd's ``AccumulateGrad`` adds into ``.grad`` in place (read 2 + 2,
    write 2) from the second micro-batch on. tests/test_fsdp2_pipelining_sync.py counts them on torch's code."""
    grad, acc = DTYPE_BYTES["bf16"], DTYPE_BYTES[reduce_dtype]
    if acc == grad:
        return 0.0, 3 * grad
    return grad + acc, grad + 2 * acc


# Peak bytes per logit of torch's cross_entropy on ``pred.float()`` (torchtitan/components/loss.py
# ``cross_entropy_loss``). Eager: the fp32 copy (4) and the saved log-softmax (4), and in the backward the fp32
# gradient of the log-probs (4) beside them: 12. Compiled (torchtitan compiles the loss with the model:
# compile.components defaults to ["model", "loss"], config/configs.py:298; components/loss.py ``_maybe_compile``):
# AOT autograd with Inductor's decompositions and min-cut partitioner (torch/_functorch/partitioners.py
# ``min_cut_rematerialization_partition``) saves the bf16 logits alone (2; plus per-token statistics) and recomputes
# the fp32 log-softmax in the backward, which returns the logits' gradient in bf16 (2): 4.
# tests/test_memory_vs_torch.py recounts both from torch's saved tensors. Under TP the loss is vocab-parallel
# (``_LossParallelCrossEntropy`` on the local ``.float()`` shard): not recounted here, priced as eager.
TORCH_LOSS_BYTES_PER_LOGIT = {"eager": 12.0, "compiled": 4.0}


def torch_memory_facts(reduce_dtype: GradDtype, compiled_loss: bool = False) -> dict[str, Any]:
    """Memory facts of a torch FSDP2 training loop (torchtitan 0.3.0, and the fsdp2 target's module);
    ``compiled_loss``: the cross-entropy runs under torch.compile (``TORCH_LOSS_BYTES_PER_LOGIT``)."""
    return dict(
        loss_bytes_per_logit=TORCH_LOSS_BYTES_PER_LOGIT["compiled" if compiled_loss else "eager"],
        # torchao Float8Linear casts in the backward again from the saved high-precision input (bf16: 2).
        fp8_saved_bytes=2.0,
        # per-op SAC (torchtitan/models/llama3/infra/parallelize.py ``_save_list`` and the ``mm_count % 2`` rule)
        selective="op_sac",
        gathered_unit_bytes=fsdp2_gathered_unit_bytes(reduce_dtype),
        pp_unsharded_bytes=fsdp2_pp_unsharded_bytes(reduce_dtype),
        pp_grad_accumulation_bytes=fsdp2_pp_grad_accumulation_bytes(reduce_dtype),
    )


def nearest(value: int, choices: list[int]) -> list[int]:
    """``choices`` ordered by distance to ``value`` (for 'a legal neighbour')."""
    return sorted(choices, key=lambda c: (abs(c - value), c))


__all__ = ["ALLOC_CONF_VAR", "EXPANDABLE_SEGMENTS_ENV", "FsdpHeadUnit", "FsdpMtpUnit", "reshard_options",
           "CpCommType", "DTYPE_BYTES", "fsdp2_gathered_unit_bytes", "fsdp2_pp_grad_accumulation_bytes",
           "fsdp2_pp_unsharded_bytes", "TORCH_LOSS_BYTES_PER_LOGIT", "torch_memory_facts", "Fp8Recipe", "GradDtype",
           "Knob", "Runtime", "Software", "TARGET_NAMES", "TargetName", "TargetProfile", "nearest"]
