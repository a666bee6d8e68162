"""Megatron-LM (``pretrain_gpt.py``) with Megatron-Core 0.16 and Transformer Engine.

Rules cite Megatron-LM at tag core_v0.16.1 (commit 55ac7082, the release of the megatron-core 0.16.1 that CI
installs) (``MLM`` = ``megatron/training/arguments.py``, ``validate_args``
from line 293; ``TC`` = ``megatron/core/transformer/transformer_config.py``; ``MPC`` =
``megatron/core/model_parallel_config.py``). Run ``autoplan validate`` with ``MEGATRON_LM_PATH`` set to run
the real ``validate_args`` on an emitted argument list.

Run-time semantics:
- bf16 runs keep **fp32 main gradients** and all-reduce / reduce-scatter them in fp32 unless
  ``--grad-reduce-in-bf16`` (MLM:716-723); weights are bf16 (2 B), the optimizer holds fp32 master weights
  and Adam m, v (12 B). The distributed optimizer (ZeRO-1) shards the optimizer state only: the gradient
  buffer stays whole on every rank (Megatron ``docs/source/api-guide/dist_optimizer.md``: 6 + 12/d bytes per
  parameter with fp32 grads).
- ZeRO-2 is Megatron-FSDP ``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` (``MF`` =
  megatron-core 0.16.1 ``megatron/core/distributed/fsdp/src/megatron_fsdp/``; ``PGB`` = its
  ``param_and_grad_buffer.py``). The bf16 model weight buffer stays whole on every rank, the fp32 main weights
  and the main-gradient buffer are sharded over dp*cp (PGB:1857-1860; gradients fp32 unless
  ``--grad-reduce-in-bf16``, PGB:2024-2030 with ``grad_reduce_in_fp32 = accumulate_allreduce_grads_in_fp32``,
  training.py:1292): 2 + (4 + 12)/d bytes per parameter. Weights are never resharded: one bf16 all-gather per
  step after the optimizer (PGB:2875-2904, ``AllGatherPipeline`` buckets are released only for FSDP units, and
  ``optim_grads`` has none: mcore_fsdp_adapter.py:96-99). Gradients are reduce-scattered in *every*
  micro-batch's backward (megatron_fsdp.py:649-667, "With gradient-sharding strategies, gradient reduction
  occurs on every backward propagation"), overlap forced on (megatron_fsdp.py:277-283). Each backward holds
  its chunk's gradients unsharded until reduced: chunk 0 in buckets of max(40M, 1M*dp_cp) elements
  (training.py:1316-1319) with up to max(1e9, bucket) elements queued (megatron_fsdp.py:374-399,
  PGB:3088-3110); chunks 1.. of an interleaved pipeline run with bucketing disabled (training.py:1335), one
  bucket each, reduced when the chunk's backward ends and waited for right there (``_root_post_backward`` ->
  ``GradReducePipeline.reset``, megatron_fsdp.py:775-792, PGB:3030-3046): that reduce-scatter is exposed.
  Flags: Megatron-LM's "required configurations" (docs/discussions/megatron-fsdp-user-guide) add
  ``--use-distributed-optimizer --no-gradient-accumulation-fusion --ckpt-format fsdp_dtensor``; validate_args
  demands the checkpoint format (MLM:690) and no ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (MLM:687), and allows
  pipelining, experts, tied embeddings and ``--overlap-param-gather`` (MLM:598).
- ZeRO-3 is torch FSDP2 (``--use-torch-fsdp2``). Float16Module casts the model to bf16 before it is wrapped
  (training.py:1261-1263) and ``fully_shard`` gets no MixedPrecisionPolicy (torch_fully_sharded_data_parallel.py:82-85,
  the same at core_v0.12.0..0.19.0: mesh and reshard_after_forward only), so the shards are bf16 and the gradients
  are reduce-scattered in bf16 into bf16 shards whatever ``--accumulate-allreduce-grads-in-fp32`` says (it reaches
  only DDP's config, training.py:1287-1293): grad_reduce_dtype resolves to bf16. The optimizer is
  Float16OptimizerWithFloat16Params (the distributed optimizer is refused, MLM:613; optimizer/__init__.py:461): fp32
  master copies of the bf16 shards (optimizer.py:674) and Adam m, v; the bf16 gradient shards become fp32 main
  gradients only inside the step (optimizer.py:754-765), with no activations alive. 2 + 2 + 12 B, all sharded.
  The embedding and output layer are their own units (torch_fully_sharded_data_parallel.py:60-65;
  ``memory.zero3_head_unit_bytes``). An MTP module is not: the wrapper shards each module that is an instance of
  TransformerLayer, LanguageModelEmbedding, RotaryEmbedding or tensor_parallel.ColumnParallelLinear (l. 60-65,
  127-143; ColumnParallelLinear dropped under ``transformer_impl == "local"``, l. 112-118; ``_fsdp_modules`` set only
  by the HF wrappers), then the root (l. 146). MultiTokenPredictionLayer's ``transformer_layer`` is a
  TransformerLayer (its own unit), while its enorm, hnorm and final_layernorm (TENorm, which builds te.pytorch's
  RMSNorm / LayerNorm) and ``eh_proj`` (TEColumnParallelLinear, a te.pytorch.Linear, not a ColumnParallelLinear:
  extensions/transformer_engine.py:433-470, 934; extensions/transformer_engine_spec_provider.py:32-55;
  multi_token_prediction.py:432-439, 632-678) stay in the root unit, as does the decoder's final norm. The root gets
  the explicit ``reshard_after_forward`` (l. 84; TorchFullyShardedDataParallelConfig default True), so torch 2.13
  reshards it after forward and gathers it whole again for the backward (``fsdp_mtp_unit`` "root"). The same at
  core_v0.19.0 (the wrap set unchanged; the GPT path's MTP block is ``mtp_model_layer``, a TransformerLayer,
  multi_token_prediction.py:1000-1048).
  A hybrid stack's Mamba layers are the root's too (``fsdp_root_kinds``): MambaStack builds "M" as MambaLayer, a
  GraphableMegatronModule, not a TransformerLayer (ssm/mamba_block.py:121-158, ssm/mamba_layer.py:51;
  models/mamba/mamba_layer_specs.py:39-50), whose in_proj / out_proj are TELayerNormColumnParallelLinear
  (te.pytorch.LayerNormLinear) / TERowParallelLinear (< TELinear < te.pytorch.Linear; extensions/
  transformer_engine.py:470, 711, 1040), none a ColumnParallelLinear; "*" is a TransformerLayer, "-" an MLPLayer and
  "E" a MoETransformerLayer, both TransformerLayer subclasses (ssm/mlp_layer.py:13, transformer/transformer_layer.py:1228): their
  own units. Nothing in arguments.py:605-615 or training.py:1277-1290 refuses MambaModel under --use-torch-fsdp2
  (pretrain_mamba.py builds it with the same get_model), so it runs, with every Mamba layer gathered for the whole
  forward and again for the whole backward. The same at core_v0.19.0 (wrap set unchanged; HybridStack,
  models/hybrid/hybrid_block.py:134-200, builds "M" as MambaLayer, the others, GDN included, as TransformerLayer
  or its subclasses).
  Kept, not replaced by
  Megatron-FSDP ``optim_grads_params``: that one would lift FSDP2's pp/ep refusals, but its runtime differs
  (per-TransformerLayer units with a 2-unit prefetch, bf16 weight shards beside fp32 main weights,
  mcore_fsdp_adapter.py:96-97, megatron_fsdp.py:377-387) and is not priced here yet; one zero stage = one
  implementation, so a plan says by its stage what runs.
- HSDP exists only for the distributed optimizer (``--num-distributed-optimizer-instances``), not for FSDP2.
  (Megatron-FSDP also reads that flag, mcore_fsdp_adapter.py:203; autoplan does not price it: refused.)
- Adam moments in bf16 (knob ``adam_moments_dtype``) run Megatron's precision-aware optimizer
  (``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``, MLM:2840-2856; it needs the
  distributed optimizer, ``OC`` = megatron/core/optimizer/optimizer_config.py:375-380): Transformer Engine's FusedAdam
  holds m, v in bf16 (2 + 2 B) and the fp32 master weights as the 16 bits the bf16 weight lacks
  (``store_param_remainders``, default True from TE 2.1, OC:192-195, optimizer/__init__.py:365-387): 6 B sharded.
  Under an fp8 recipe other than delayed scaling the master stays Megatron's fp32 copy (OC:355-361, 4 B): 8 B.
- fp8 primary weights (knob ``fp8_param_gather``, ``--fp8-param-gather``, MLM:1398; distributed optimizer,
  MLM:655-657): the model's weights are Transformer Engine Float8Tensors in the fp8 parameter buffer (1 B, no bf16
  copy) and the distributed optimizer's weight all-gather moves fp8 (1 B). Under tensor scaling (delayed,
  tensorwise) a Float8Tensor used for the backward also keeps its transpose (1 B) unless the GPU runs FP8 GEMMs in
  non-TN layouts, SM 10.x Blackwell (TE ``Float8Tensor.update_usage`` with ``is_non_tn_fp8_gemm_supported``): 2 B on
  Hopper, 1 B on Blackwell. The fp32 master weights stay in full (TE's int16 remainder needs bf16 weights).
- Activation offload (knob ``cpu_offload_layers``, ``--cpu-offloading-num-layers N``, MLM:1236-1237): Transformer
  Engine's cpu_offload context around every decoder layer (megatron/core/transformer/transformer_block.py:303-312)
  moves the saved activations of layers 0..N-1 to host memory and back before their backward; TE's schedule
  (``transformer_engine/pytorch/cpu_offload.py`` @ 5671fd36 ``DefaultOffloadSynchronizer.
  _init_offload_synchronization_dicts``: layer i's offload finishes before layer L-N+i's forward) peaks at the
  activations of L-N layers. TE <= 2.9's handler (``AsyncDoubleBufferGroupOffloadHandler``, the "v1" path that
  Megatron-Bridge v0.1.x/v0.2.x runs pinned) releases group i at the commit of layer ``layer_window_map[i]``
  ((L//N)(i+1)-1): L-N+1 layers while the last layer runs forward, covered by the priced L-N layers + the head
  when the head saves at least one layer's bytes (tests/test_activation_offload.py). Megatron-Core refuses it with
  pipelining, with recompute and for N >= L (transformer_config.py:1137-1152). The host-link time is not priced.
- TP communication overlaps GEMMs with ``--tp-comm-overlap`` (needs sequence parallelism, MLM:916); DP
  traffic overlaps backward with ``--overlap-grad-reduce`` and forward with ``--overlap-param-gather``.
  With Megatron-FSDP (zero 2) the TP overlap still runs, so it is priced and emitted there too: validate_args only
  warns that TP with Megatron-FSDP wants other ``CUDA_DEVICE_MAX_CONNECTIONS`` settings (MLM:925-938) and
  disables nothing; ``initialize.py:171-173`` builds the userbuffer communicators whenever ``--tp-comm-overlap``
  is set, and megatron-core passes ``ub_overlap_ag/rs`` to every TE linear but the experts'
  (``megatron/core/extensions/transformer_engine.py:543-561``), with no Megatron-FSDP branch. Without
  ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (which Megatron-FSDP forbids, MLM:687) Transformer Engine orders the
  communication kernel before the GEMM itself on Hopper ("Fast Dependent Launch when
  CUDA_DEVICE_MAX_CONNECTIONS>1 ... needed only for Hopper, which uses persistent CTA execution":
  TransformerEngine ``transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp:118-133`` at 5671fd36,
  the 2.12 commit Megatron-LM core_v0.16.1's ``uv.lock`` pins).
- The optimizer (knob ``optimizer``, ``--optimizer adam|muon|dist_muon``, MLM:2056-2058): Muon orthogonalizes the
  momentum of every 2-D weight matrix by Newton-Schulz and leaves embeddings, output layer, norms and biases to Adam
  (``cost_models.muon`` cites megatron-core's muon.py / layer_wise_optimizer.py and prices its state, GEMMs and
  all-gather). validate_args refuses it with overlap of the gradient reduce or parameter gather, the distributed
  optimizer, torch FSDP2 and Megatron-FSDP (MLM:1177-1187, ``check_muon``): zero_stage 0, the DP all-reduce exposed
  after the backward; ``dist_muon`` (the layer-wise distributed optimizer) divides the optimizer state over the DP
  ranks itself and all-gathers the updated weights in the step.
- Elementwise kernels are TE's fused kernels (fused norms, SwiGLU).
- The caching allocator (knob ``expandable_segments``): Megatron-LM sets no ``PYTORCH_CUDA_ALLOC_CONF`` (none in
  megatron/ or examples/ at core_v0.16.1), so PyTorch's default allocator runs unless the launcher sets it:
  Megatron-Bridge's performance scripts set ``expandable_segments:True`` per model (v0.2.0 perf_plugins.py:250-252:
  Llama 3.1 405B fp8 on GB200; v0.4.1 :262-277 also DeepSeek-V3 on H100/GB200) and, from v0.5.0, for every run
  (utils/executors.py:48) but those with NCCL user buffers or Llama on Megatron-FSDP (perf_plugins.py:313-319):
  Megatron-Core refuses it with ``nccl_ub`` (distributed_data_parallel_config.py:156-161), which autoplan does not
  emit. On, the emitted launch scripts export it (``Runtime.env``) and ``cost_models.memory`` prices its reserve
  as releasable.
- The loss (knob ``cross_entropy_fusion``): Megatron-LM's default (``cross_entropy_loss_fusion=False``,
  megatron/core/model_parallel_config.py:241-249) is ``tensor_parallel.vocab_parallel_cross_entropy``
  (language_module.py:166): an fp32 copy of the bf16 logits, the fp32 softmax saved for backward, a bf16 gradient
  (6 B per logit at the peak). ``te`` (``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``,
  language_module.py:140-160, what Megatron-Bridge's and NeMo 2's performance scripts run) is Transformer Engine's
  ``parallel_cross_entropy``: one Triton kernel computes the loss and writes the gradient *in place* into the bf16
  logits, which are what it saves (TE v2.9 ``pytorch/cross_entropy.py`` ``CrossEntropyFunction.forward``
  ``ctx.save_for_backward(_input.detach())``, ``triton/cross_entropy.py`` ``tl.store(X_ptr + X_offsets, ...)``; its
  backward scales them in place, ``element_mul_kernel``): 2 B per logit, no fp32 copy.
- MoE (``cost_models.moe``; TC = transformer_config.py): ``moe_dispatcher`` alltoall = ``--moe-token-dispatcher-type
  alltoall``; deepep / hybridep = ``flex`` with ``--moe-flex-dispatcher-backend`` (TC:679-685; their kernels hold
  ``moe_deepep_num_sms`` 20 / ``moe_hybridep_num_sms`` 16 SMs, TC:722-726), which send a token once per remote NVLink
  domain; ``moe_a2a_overlap`` = ``--overlap-moe-expert-parallel-comm`` (TC:1852-1905: ep > 1, alltoall or flex, a
  virtual pipeline when pp > 1, no full recompute), the all-to-all hidden under another micro-batch's compute;
  ``moe_force_balance`` = ``--moe-router-force-load-balancing`` (random router logits, router.py:655-657);
  ``moe_capacity_factor`` = ``--moe-expert-capacity-factor C --moe-pad-expert-input-to-capacity`` (token drop: each
  expert padded to its capacity, token_dispatcher.py ``preprocess``); ``moe_router_padding`` =
  ``--moe-router-padding-for-quantization`` (TC:589-592, a flag from the dataclass, MLM:1621; fp8 / fp4 only and not
  the allgather dispatcher, TC:1621-1631): the dispatcher pads the routing map so each expert's count is a multiple
  of the quantized GEMM's alignment, and the experts skip TE's padding copies
  (``cost_models.moe.router_padding_share``).
  Unset: the catalog's dispatcher and overlap (``Efficiency``), dropless routing with the catalog's load imbalance.
- CUDA graphs (knobs ``cuda_graph_impl`` none / local / transformer_engine = ``--cuda-graph-impl``, TC:776-782;
  ``cuda_graph_scope`` = ``--cuda-graph-scope``, TC:784-791, empty = each whole layer; rules in
  ``check_cuda_graphs``): what a graph holds is replayed without the host issuing it op by op. Priced on MoE layers
  only (``moe.moe_layer_host_issued``): their dispatch and experts run eagerly unless the ``moe`` scope (token drop
  with padding), a whole-layer graph or ``full_iteration`` holds them; the dropless dispatchers sync host and device
  in every MoE layer (``moe.DISPATCHER_HOST_SYNC``), so they cannot be graphed in 0.16.1. Graphs' memory pool and
  the dense layers' launch overhead are not priced.
- fp8 (knob ``fp8_recipe``) runs TE's quantizers (``cost_models.te_fp8``): cast bytes per recipe and GPU (what a
  norm fuses, transposes only on TN-only fp8 GEMMs), sequence-parallel all-gathers of the quantized tensor (MXFP8:
  both copies of an output gradient), block-scaled MXFP8 GEMMs at TE's measured kernel time ratio.
- precision nvfp4 is ``--fp4-format e2m1 --fp4-recipe nvfp4`` (``TC``:508-529; exclusive with fp8, MLM:659-669):
  Megatron-Core wraps each decoder layer in TE's autocast with ``NVFP4BlockScaling`` (``megatron/core/fp4_utils.py``
  ``get_fp4_context``:120-161; TE runs it as an "fp8" recipe, so the runtime carries ``fp8_recipe="nvfp4"``), priced
  from ``cost_models.te_nvfp4``: all three GEMMs of every TE linear in FP4, the RHT quantization bytes, NVFP4
  sequence-parallel gathers, the column-wise copy saved for wgrad, TE's cached quantized weights. The output layer
  is Megatron's own ``ColumnParallelLinear`` outside the layers' autocast (``megatron/core/models/gpt/
  gpt_model.py``:241): bf16 (``layer_cost``). ``--first-last-layers-bf16`` (``TC``:486-495) is not a knob: every
  decoder layer runs NVFP4, as Megatron-Bridge's ``bf16_with_nvfp4_mixed`` sets it (``num_layers_at_start/end_in_bf16``
  0, mixed_precision.py@v0.3.0). TP communication overlap is refused: Megatron registers TE's userbuffers for fp8 or
  bf16 only (``megatron/training/initialize.py``:277-281, ``args.fp8`` is None under fp4) and TE's modules under the
  NVFP4 autocast ask for the fp8 ones (TE ``pytorch/module/base.py`` ``get_ub``:448-456 asserts "UB ... with
  use_fp8=True is not registered"); Megatron-Bridge's NVFP4 recipes turn it off (scripts/performance/configs/llama/
  llama3_llm_pretrain.py:79 @ v0.3.0).
"""

from __future__ import annotations

import math
from typing import Any

from cost_models.errors import ConfigError, divisors
from cost_models.te_fp8 import te_tp_gather_bytes
from cost_models.recompute import module_errors, modules_in_effect
from cost_models.te_nvfp4 import NVFP4_SAVED_BYTES, NVFP4_WEIGHT_CACHE_BYTES
from cost_models.specs import RECOMPUTE_MODULES, ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import (DTYPE_BYTES, EXPANDABLE_SEGMENTS_ENV, CORE_RELEASES, Knob, Runtime,
                                        Software, TargetProfile, chunked_attention_error,
                                        fsdp2_gathered_unit_bytes, nearest)

# Named recipes (the ``quant_recipe`` knob): (module group of cost_models.quant_layout.MODULE_OPS, precision) per matcher.
# nemotron_3_super_nvfp4: Megatron-Bridge scripts/performance/configs/nemotronh/te_quant.cfg (identical v0.4.0 ..
# v0.5.1), loaded for Nemotron 3 Super's NVFP4 runs (nemotron_3_llm_pretrain.py set_nemotron_3_super_common_configs):
# matchers attn_qkv_bf16 "*.linear_qkv", attn_proj_bf16 "*.linear_proj", latent_bf16 "*mlp.fc[12]_latent_proj",
# mtp_bf16 "mtp.*" -> bf16; mamba_outproj_mxfp8 "*mixer.out_proj" -> mxfp8. Everything else keeps the run's NVFP4.
QUANT_RECIPES: dict[str, tuple[tuple[str, str], ...]] = {
    "nemotron_3_super_nvfp4": (("attention_proj", "bf16"), ("moe_latent_proj", "bf16"), ("mtp", "bf16"),
                               ("mamba_out_proj", "mxfp8")),
}
QUANT_RECIPE_SOURCE = ("NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/nemotronh/te_quant.cfg @ v0.4.0..v0.5.1 "
                       "(nemotron_3_llm_pretrain.py: NVFP4 runs); matchers applied by Megatron-Core "
                       "extensions/transformer_engine.py:275-323 @ core_v0.18.0")


COMMIT = "55ac7082"  # tag core_v0.16.1
# The first Megatron-Core tag whose MambaModel builds multi-token prediction (model_runtime_error)
HYBRID_MTP_SINCE = "0.17.0rc0"
# Megatron-Core's fused MoE grouped MLP (knob ``moe_fused_grouped_mlp``): TransformerConfig.use_transformer_engine_op_fuser
# and moe_mlp_glu_interleave_size first appear at tag core_v0.18.0 (transformer_config.py:465, :868; none at
# core_v0.17.1), where TEGroupedMLP builds the TE op-fuser MLP (moe/experts.py:268-273, :374-530); Megatron-LM makes
# them --use-transformer-engine-op-fuser / --moe-mlp-glu-interleave-size from the dataclass (training/arguments.py:2091
# ArgumentGroupFactory(TransformerConfig), argument_utils.py:101 names, :186 store_true for a bool).
FUSED_MLP_SINCE = "0.18.0"
FUSED_MLP = ("core_v0.18.0 megatron/core/transformer/moe/experts.py:315-372 _is_fused_impl_supported; "
             "TransformerEngine transformer_engine/pytorch/ops/fused/grouped_mlp.py @ d0067d0")
# The GLU interleave TE's fused kernel requires (grouped_mlp.py:809-813 validate_grouped_mlp_dims) and Megatron-Bridge's
# perf recipes set with it (scripts/performance/utils/overrides.py:238-240 @ v0.5.1), and the environment switch TE
# reads (grouped_mlp.py:946 ``is_supported``; Megatron-Core requires it for a GLU from core_v0.19.0,
# experts.py:398; Bridge's perf_plugins.py:308-309 @ v0.5.1 sets it)
FUSED_MLP_GLU_INTERLEAVE = 32
FUSED_MLP_ENV = ("NVTE_CUTEDSL_FUSED_GROUPED_MLP", "1")
# TE's fused kernel takes fc1 / fc2 widths that are multiples of 64 (grouped_mlp.py:783-794); others run unfused
FUSED_MLP_DIM_MULTIPLE = 64
MLM = f"Megatron-LM megatron/training/arguments.py@{COMMIT}"
MF = "megatron-core 0.16.1 megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py"
TRAINING = f"Megatron-LM megatron/training/training.py@{COMMIT}"
# Megatron-FSDP's gradient buckets (elements): get_model sets bucket_size = max(40M, 1M * dp_cp) (TRAINING:1316-1319)
# and MegatronFSDP queues reduce-scatters of up to max(1e9, bucket_size) elements (MF:374-399) before it waits.
MFSDP_MIN_BUCKET, MFSDP_BUCKET_PER_RANK, MFSDP_RS_QUEUE = 40e6, 1e6, 1e9
TC = f"Megatron-LM megatron/core/transformer/transformer_config.py@{COMMIT}"
TCFG = "megatron-core 0.16.1 megatron/core/transformer/transformer_config.py"
OC = f"Megatron-LM megatron/core/optimizer/optimizer_config.py@{COMMIT}"
# Precision-aware optimizer (bf16 Adam moments): master bytes per parameter. Transformer Engine's FusedAdam keeps
# the fp32 master as the int16 remainder beside the bf16 weight (store_param_remainders, OC:192-195) when it owns
# the master, i.e. without fp8 or under delayed scaling (OC:355-361); otherwise Megatron's fp32 main copy.
PRECISION_AWARE_MASTER_BYTES = {"remainder": 2.0, "fp32": 4.0}
PS = f"Megatron-LM megatron/core/parallel_state.py@{COMMIT}"
# Bytes per logit the loss holds at the peak (module docstring): Megatron's fp32 vocab-parallel loss 4 + 2; TE's
# in-place kernel the bf16 logits alone.
LOSS_BYTES_PER_LOGIT = {"none": 6.0, "te": 2.0}
LMM = f"Megatron-LM megatron/core/models/common/language_module/language_module.py@{COMMIT}"
TE_CP = "TransformerEngine pytorch/attention/dot_product_attention/context_parallel.py (a2a: heads % cp)"


def linear_rope_error(name: str, factor: float) -> ConfigError:
    """Linear RoPE scaling (positions / factor) is megatron-core's ``RotaryEmbedding(seq_len_interpolation_factor)``
    (rotary_pos_embedding.py:135-136), but Megatron-LM core_v0.16.1 never builds it: its flag
    ``--rotary-seq-len-interpolation-factor`` (int, arguments.py:1659) reaches only the legacy model
    (megatron/legacy/model/language_model.py:393); ``gpt_builders.py:95-111`` and ``mamba_builders.py`` build the
    model without it, so emitting the flag would train plain RoPE."""
    return ConfigError(f"{name}: linear RoPE scaling (factor {factor:g}: positions / factor) has no effect in "
                       "Megatron-LM core_v0.16.1: --rotary-seq-len-interpolation-factor reaches only the legacy model "
                       "(legacy/model/language_model.py:393); gpt_builders.py builds GPTModel without "
                       "seq_len_interpolation_factor, so the run would train plain RoPE")


# Megatron-core's fixed llama3 RoPE-scaling constants (RotaryEmbedding._apply_scaling defaults,
# megatron/core/models/common/embeddings/rotary_pos_embedding.py) and the factor: Megatron-LM core_v0.16.1's
# gpt_builders.py:95-111 passes GPTModel no rope_scaling_factor, so its default 8.0
# (megatron/core/models/gpt/gpt_model.py:105) trains whatever --rope-scaling-factor says (Llama 3.2: 32).
LLAMA3_FIXED = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def fixed_rope_error(name: str, rs: Any, fixed: dict[str, float], what: str) -> ConfigError | None:
    """The first of ``fixed``'s RoPE-scaling values ``rs`` differs from (Megatron-LM has no flag that sets it)."""
    for key, want in fixed.items():
        if float(getattr(rs, key)) != float(want):
            return ConfigError(f"{name}: rope_scaling.{key} = {getattr(rs, key)}; {what} fixes it at {want}",
                               valid=[want])
    return None


def rope_scaling_error(model: ModelSpec) -> ConfigError | None:
    """Why Megatron-LM core_v0.16.1 would not train ``model``'s RoPE scaling as the model states it (linear, or llama3
    with values other than the builder's); None: it would."""
    rs = model.arch.rope_scaling
    if rs is not None and rs.type == "linear":
        return linear_rope_error(model.name, rs.factor)
    if rs is not None and rs.type == "llama3":
        return fixed_rope_error(model.name, rs, LLAMA3_FIXED, "Megatron-LM core_v0.16.1's llama3 RoPE scaling "
                                "(megatron-core's defaults; gpt_builders.py passes no --rope-scaling-factor)")
    return None


def model_flags_error(model: ModelSpec) -> ConfigError | None:
    """Why Megatron-LM core_v0.16.1 has no flags for ``model``'s MLP activation or positions; None: it has. The
    emitter refuses on it, ``MegatronProfile.model_notes`` says it at estimate time. Activations: --swiglu,
    --quick-geglu, --squared-relu, GELU (erf) by default (arguments.py:1331-1340); the GLU offset and clamp only with
    quick_gelu (transformer_config.py:1505-1509); positions: rope (integer --rotary-base), learned_absolute, none."""
    m, arch = model, model.arch
    if m.gated_mlp and arch.activation not in ("silu", "quick_gelu"):  # (relu2 gated: no flag either)
        return ConfigError(f"{m.name}: gated MLP with activation '{arch.activation}' (GeGLU) has no Megatron-LM flag",
                           valid=["silu (SwiGLU)", "quick_gelu (--quick-geglu)"])
    if not m.gated_mlp and arch.activation in ("silu", "quick_gelu"):
        return ConfigError(f"{m.name}: a non-gated {arch.activation} MLP has no Megatron-LM flag",
                           valid=["gelu", "gelu_tanh"])
    # GPT-OSS's clamped GLU: megatron-core applies both in the MLP and the grouped experts (transformer/mlp.py:
    # 221-225, moe/experts.py:723-727): act(clamp(gate, max=c)) * (clamp(up, -c, c) + offset)
    if arch.glu_linear_offset and arch.activation != "quick_gelu":
        return ConfigError(f"{m.name}: megatron-core takes glu_linear_offset only with quick_gelu",
                           valid=["quick_gelu"])
    if arch.activation_clamp is not None and arch.activation != "quick_gelu":
        return ConfigError(f"{m.name}: megatron-core clamps the GLU inputs only with quick_gelu "
                           "(activation_func_clamp_value)", valid=["quick_gelu"])
    if arch.alibi:
        return ConfigError(f"{m.name}: ALiBi has no Megatron-LM implementation", valid=["rope", "learned positions"])
    # Llama 4 (Scout): the weightless q/k norm on the RoPE layers only. --qk-l2-norm puts megatron-core's L2Norm in
    # every layer's spec (gpt_layer_specs.py:149-152 @ core_v0.16.1; no_rope_freq only drops the rotary,
    # attention.py:916-921); NeMo builds the RoPE-layers-only form with its own spec (get_llama4_layer_spec,
    # nemo/collections/llm/gpt/model/llama4_utils.py @ 8cfedd7203), which Megatron-LM's flags cannot select.
    if arch.qk_l2_norm and arch.no_rope_every:
        return ConfigError(f"{m.name}: q/k L2 norm on the RoPE layers only (no_rope_every={arch.no_rope_every}): "
                           "Megatron-LM's --qk-l2-norm normalises every layer's q and k, NoPE layers included",
                           valid=["qk_l2_norm false", "no_rope_every 0"])
    if m.is_moe and arch.router.probs_on_input and m.moe_top_k != 1:  # moe/experts.py:229-232, 657-660, 884-887
        return ConfigError(f"{m.name}: router weights on the expert input (probs_on_input) with top-{m.moe_top_k} "
                           "routing: megatron-core's moe_apply_probs_on_input takes top-1 only", valid=["moe_top_k 1"])
    if (err := dsa_model_error(m)) is not None:
        return err
    rope = not (m.learned_position_embeddings or arch.no_position_encoding)
    if rope and not float(arch.rope_theta).is_integer():
        return ConfigError(f"{m.name}: rope_theta {arch.rope_theta} is not an integer (--rotary-base is int)")
    return gdn_flags_error(m)


def gdn_flags_error(m: ModelSpec) -> ConfigError | None:
    """Why megatron-core 0.16.1's GatedDeltaNet cannot build ``m``'s GDN layers from Megatron-LM's flags; None: it
    can. Its conv and output gate use the model's ``activation_func`` (gated_delta_net.py:126-127, 326-336, 412-421),
    which causal_conv1d takes as silu only (:329) and Megatron-LM sets to silu with --swiglu; its chunk is fla's
    default (``chunk_gated_delta_rule`` is called without one, :382-391); the gated attention layers' output gate is
    not built for MLA (transformer_config.py:2071-2072)."""
    g, arch = m.gdn, m.arch
    if arch.attention_output_gate and m.mla is not None:
        return ConfigError(f"{m.name}: an attention output gate with MLA: 'Output gate is not supported for MLA yet' "
                           f"({TC}:2071-2072)", valid=["attention_output_gate false"])
    if g is None:
        return None
    if arch.activation != "silu" or not m.gated_mlp:
        return ConfigError(f"{m.name}: Gated DeltaNet with activation '{arch.activation}' (gated_mlp "
                           f"{m.gated_mlp}): megatron-core's GDN runs its conv and output gate through the MLP's "
                           f"activation_func, which causal_conv1d takes as silu only ({GDN}:126-127, 329), and "
                           "Megatron-LM's silu is --swiglu (a gated MLP)", valid=["activation silu with gated_mlp"])
    if g.chunk_size != 64:
        return ConfigError(f"{m.name}: gdn chunk_size={g.chunk_size} has no Megatron-LM flag (GatedDeltaNet calls "
                           f"fla's chunk_gated_delta_rule with its default chunk of 64, {GDN}:382-391)", valid=[64])
    return None


DSA_SPEC = "megatron-core 0.16.1 megatron/core/models/gpt/experimental_attention_variant_module_specs.py"
DSA_SRC = "megatron-core 0.16.1 megatron/core/transformer/experimental_attention_variant/dsa.py"


def dsa_model_error(m: ModelSpec) -> ConfigError | None:
    """DeepSeek sparse attention Megatron-LM core_v0.16.1 cannot build as ``m`` states it; None: it can
    (--experimental-attention-variant dsa, the --dsa-indexer-* flags). Its DSAttention runs an indexer in every
    layer of the block (experimental_attention_variant_module_specs.py:190-196: the pattern is all ones): no index
    sharing (GLM-5.2's IndexShare, ``dsa_indexer_topk_freq`` / ``dsa_indexer_skip_topk_offset``, arrived with
    core_v0.19.0's transformer_config.py:312-316); MLA only (:81)."""
    d = m.dsa
    if d is None:
        return None
    if d.shared_every != 1:
        return ConfigError(f"{m.name}: DSA index sharing (an indexer every {d.shared_every} layers from offset "
                           f"{d.shared_offset}, the others reusing its top-k): Megatron-LM core_v0.16.1 runs an indexer "
                           f"in every layer ({DSA_SPEC}:190-196); dsa_indexer_topk_freq exists from core_v0.19.0 only",
                           valid=["dsa shared_every 1"])
    if m.mla is None:  # ModelSpec refuses it too (specs._check_dsa)
        return ConfigError(f"{m.name}: DSA needs MLA ({DSA_SPEC}:81)", valid=["mla"])
    return None


# The first Megatron-Core release with the fused DSA kernels and --dsa-kernel-backend (cost_models.dsa)
FUSED_DSA_SINCE = "0.19.0"


def dsa_backend_error(model: ModelSpec, rt: Runtime) -> ConfigError | None:
    """Why ``dsa_kernel_backend`` cannot run as set: a model without DSA, or a Megatron-Core before the kernels
    (dsa_cudnn_kernels.py and TransformerConfig.dsa_kernel_backend first tagged core_v0.19.0, :326)."""
    if model.dsa is None:
        return ConfigError(f"dsa_kernel_backend={rt.dsa_kernel_backend} on {model.name}, which has no DeepSeek sparse "
                           "attention", valid=["dsa_kernel_backend=none"])
    later = CORE_RELEASES[CORE_RELEASES.index(FUSED_DSA_SINCE):]
    if rt.megatron_core not in later:
        return ConfigError(f"dsa_kernel_backend={rt.dsa_kernel_backend} with megatron_core={rt.megatron_core}: the "
                           f"fused DSA kernels and --dsa-kernel-backend exist from core_v{FUSED_DSA_SINCE} "
                           "(experimental_attention_variant/dsa_cudnn_kernels.py, transformer_config.py:326)",
                           valid=[f"megatron_core={v}" for v in later] + ["dsa_kernel_backend=none"])
    return None


# The first Megatron-Core release whose selective ``core_attn`` checkpoint hands DSAttention its x / qr
DSA_CORE_ATTN_RECOMPUTE_SINCE = "0.19.0"
DSA_CKPT_CALL = ("megatron-core 0.16.1 megatron/core/transformer/multi_latent_attention.py:279-282 -> "
                 "attention.py:394-411 (_checkpointed_attention_forward's custom_forward)")


def dsa_recompute_error(model: ModelSpec, modules: frozenset[str] | tuple[str, ...] | None,
                        megatron_core: str) -> ConfigError | None:
    """DeepSeek sparse attention under selective recompute of ``core_attn`` (``modules``: the set Megatron runs,
    ``cost_models.recompute.modules_in_effect``; None: no module recompute). Before core_v0.19.0, MLA's checkpointed
    branch (multi_latent_attention.py:279-282 @ core_v0.16.1; the same through core_v0.18.2, :379-382) calls
    ``_checkpointed_attention_forward``, whose ``custom_forward`` calls the core attention with query, key, value,
    mask, attn_mask_type, attention_bias and packed_seq_params only (attention.py:394-411; core_v0.18.x:
    ``_run_core_attention`` with no extra kwargs), while ``DSAttention.forward`` requires ``x`` and ``qr``
    (dsa.py:728-738): a TypeError on the first training step. Only the non-checkpointed branch passes them
    (:283-300). No validation refuses it. core_v0.19.0 passes them through the checkpoint
    (multi_latent_attention.py:372-391, attention.py:445-484 ``core_attention_extra_kwargs``)."""
    if model.dsa is None or not modules or "core_attn" not in modules:
        return None
    later = CORE_RELEASES[CORE_RELEASES.index(DSA_CORE_ATTN_RECOMPUTE_SINCE):]
    if megatron_core in later:
        return None
    rest = [m for m in RECOMPUTE_MODULES if m in modules and m != "core_attn"]
    instead = ([f"recompute_modules={','.join(rest)}"] if rest else
               ["recompute_modules without core_attn (e.g. mla_up_proj)", "recompute=full", "recompute=none"])
    return ConfigError(f"recompute_modules {','.join(m for m in RECOMPUTE_MODULES if m in modules)} (core_attn: "
                       f"Megatron's default when none are given) with {model.name}'s DeepSeek sparse attention and "
                       f"megatron_core={megatron_core}: the checkpointed core attention calls DSAttention without its "
                       f"x / qr inputs ({DSA_CKPT_CALL}; DSAttention.forward needs them, {DSA_SRC}:728-738), a "
                       f"TypeError on the first training step, through core_v0.18.2; core_v{DSA_CORE_ATTN_RECOMPUTE_SINCE} "
                       "passes them (attention.py:445-484)",
                       valid=instead + [f"megatron_core={v}" for v in later])


def dsa_layout_error(model: ModelSpec, cp: int) -> ConfigError | None:
    """DSAttention with context parallelism: TransformerConfig asserts ``context_parallel_size == 1``
    (transformer_config.py:1987-1990 @ core_v0.16.1, "Currently context parallelism is not supported by
    DSAttention!")."""
    if model.dsa is not None and cp > 1:
        return ConfigError(f"cp={cp} with DeepSeek sparse attention ({model.name}): megatron-core 0.16.1 does not "
                           f"support context parallelism in DSAttention ({TCFG}:1987-1990)", valid=["cp=1"])
    return None


def vocab_divisor(vocab_size: int, tp: int) -> int:
    """The ``--make-vocab-size-divisible-by`` autoplan emits: the largest power of two <= 128 (Megatron's default)
    that keeps the model's vocabulary unpadded at ``tp``; 1 when tp does not divide it (Megatron then pads to the
    next multiple of tp: ``padded_vocab_size``)."""
    return next((d for d in (128, 64, 32, 16, 8, 4, 2) if vocab_size % (d * tp) == 0), 1)


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """The vocabulary Megatron-LM builds at ``tp`` under the emitted divisor: ``_vocab_size_with_padding``
    (megatron/training/tokenizer/tokenizer.py:117-130 @ core_v0.16.1) rounds it up to a multiple of
    ``make_vocab_size_divisible_by * tp``; with ``vocab_divisor`` that is the next multiple of tp."""
    multiple = vocab_divisor(vocab_size, tp) * tp
    return -(-vocab_size // multiple) * multiple


class MegatronProfile(TargetProfile):
    name = "megatron"
    rope_framework = "Megatron-LM"  # --position-embedding-type rope: no dynamic-NTK setting (seq_len_error)

    def seq_len_error(self, model: ModelSpec, seq_len: int) -> ConfigError | None:
        """Dynamic-NTK RoPE (the common rule) and chunked attention, which megatron-core 0.16.1 has not (no chunk
        in TransformerConfig / attention.py; NeMo chunks Llama 4's inputs in its own Llama4SelfAttention)."""
        return super().seq_len_error(model, seq_len) or chunked_attention_error(model, seq_len,
                                                                                "Megatron-LM core_v0.16.1")

    def runs_model(self, model: ModelSpec, tp: int) -> ModelSpec:
        """The model with Megatron's padded vocabulary (``padded_vocab_size``): the embedding, output layer and
        vocab-parallel loss are built, run and held at that size (VocabParallelEmbedding / ColumnParallelLinear of
        ``args.padded_vocab_size`` rows: gpt_builders.py:98 @ core_v0.16.1)."""
        v = padded_vocab_size(model.vocab_size, tp)
        return model if v == model.vocab_size else model.model_copy(update={"vocab_size": v})
    efficiency_set = "megatron"
    hybrid_models = True  # pretrain_mamba.py (MambaModel): mamba_layout_error, hybrid_pipeline_error
    gdn_models = True  # pretrain_gpt.py with experimental_attention_variant gated_delta_net: gdn_layout_error
    dsa_models = True  # DSAttention (dsa_model_error, dsa_layout_error; priced unfused: cost_models.dsa)
    version = "Megatron-LM core_v0.16.1 (55ac7082) / megatron-core 0.16.1"
    schedules = ("1f1b", "interleaved")
    # MoELayer.forward raises in training when the attention TP group has > 1 rank and SP is off
    moe_sp_source = "megatron-core 0.16.1 transformer/moe/moe_layer.py:379-383"
    zero_stages = (1, 0, 2, 3)
    cp_comm_types = ("p2p", "a2a", "allgather", "a2a+p2p")
    # Megatron-Core 0.16.1: TransformerConfig accepts num_query_groups a multiple or a divisor of tp
    # (transformer_config.py:939-946); with fewer groups than tp ranks linear_qkv is split evenly, its output
    # all-gathered and each rank keeps one group (attention.py:289-300, 1398-1416): "gather".
    kv_modes = ("shard", "gather")
    megatron_fields = ("pipeline_layout", "recompute_modules")  # cost_models.pipeline_layout / recompute
    # --pipeline-model-parallel-layout (arguments.py:504-527; PLL validate_layer_layout) builds the interleaved splits
    # no --decoder-first/last-pipeline-num-layers or accounting flag can (61 layers on pp 16 at any vp > 1), as
    # Megatron-Bridge's DeepSeek-V3 recipes do: the search weighs them (pipeline_split.layout_candidates)
    searches_pipeline_layouts = True
    kv_source = f"{TC}:939-946; megatron/core/transformer/attention.py:289-300, 1398-1416 @{COMMIT}"
    loss_modes = ("F",)  # vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py)
    knobs = {
        "grad_reduce_dtype": Knob("grad_reduce_dtype", ("fp32", "bf16"), "fp32",
                                  f"{MLM}:716-723 (--grad-reduce-in-bf16, line 2178)"),
        "tp_comm_overlap": Knob("tp_comm_overlap", (True, False), True,
                                f"{MLM}:916 (needs --sequence-parallel)"),
        "fp8_recipe": Knob("fp8_recipe", ("delayed", "tensorwise", "blockwise", "mxfp8"), "delayed",
                           f"{TC}:436-441 (mxfp8: Blackwell only)"),
        "cp_comm_type": Knob("cp_comm_type", ("p2p", "a2a", "allgather", "a2a+p2p"), "p2p",
                             f"{TC}:732-743 (--cp-comm-type, {MLM}:2341)"),
        "cp_a2a_size": Knob("cp_a2a_size", (), None,
                            f"{MLM}:403-408 (--hierarchical-context-parallel-sizes a2a p2p, product = cp; "
                            "megatron/core/model_parallel_config.py:48-53)", int_values=True),
        "overlap_grad_reduce": Knob("overlap_grad_reduce", (True, False), True, f"{MLM}:2243"),
        "overlap_param_gather": Knob("overlap_param_gather", (True, False), True,
                                     f"{MLM}:598-601 (distributed optimizer + overlap_grad_reduce)"),
        "cpu_offload_layers": Knob("cpu_offload_layers", (), 0,
                                   f"{MLM}:1236-1237 (--cpu-offloading-num-layers); {TCFG}:1137-1152",
                                   int_values=True),
        "fp8_param_gather": Knob("fp8_param_gather", (True, False), False,
                                 f"{MLM}:1398 (--fp8-param-gather), :655-657 (distributed optimizer)"),
        "cross_entropy_fusion": Knob("cross_entropy_fusion", ("none", "te"), "none",
                                     f"megatron/core/model_parallel_config.py:241-249 (--cross-entropy-loss-fusion "
                                     f"--cross-entropy-fusion-impl te); {LMM}:140-166"),
        "adam_moments_dtype": Knob("adam_moments_dtype", ("fp32", "bf16"), "fp32",
                                   f"{MLM}:2840-2856 (--use-precision-aware-optimizer --exp-avg-dtype/--exp-avg-sq-dtype)"
                                   f"; {OC}:375-380 (distributed optimizer only)"),
        "moe_dispatcher": Knob("moe_dispatcher", ("alltoall", "deepep", "hybridep"), "alltoall",
                               f"{TC}:675-685 (--moe-token-dispatcher-type, --moe-flex-dispatcher-backend)"),
        "moe_a2a_overlap": Knob("moe_a2a_overlap", (True, False), False,
                                f"{TC}:1852-1905 (--overlap-moe-expert-parallel-comm)"),
        "moe_force_balance": Knob("moe_force_balance", (True, False), False,
                                  f"{TC}:645-647 (--moe-router-force-load-balancing)"),
        "moe_capacity_factor": Knob("moe_capacity_factor", (), None,
                                    f"{TC}:690-698 (--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity)"),
        "moe_router_padding": Knob("moe_router_padding", (True, False), False,
                                   f"{TC}:589-592, :1621-1631 (--moe-router-padding-for-quantization; {MLM}:1621)"),
        "moe_fused_grouped_mlp": Knob("moe_fused_grouped_mlp", (True, False), False,
                                      f"{FUSED_MLP} (--use-transformer-engine-op-fuser --moe-mlp-glu-interleave-size "
                                      f"{FUSED_MLP_GLU_INTERLEAVE}, {FUSED_MLP_ENV[0]}=1; megatron_core "
                                      f"{FUSED_MLP_SINCE} or later)"),
        "dsa_kernel_backend": Knob("dsa_kernel_backend", ("none", "cudnn"), "none",
                                   "core_v0.19.0 transformer_config.py:326 (--dsa-kernel-backend; cuDNN fused DSA: "
                                   "experimental_attention_variant/dsa_cudnn_kernels.py; megatron_core "
                                   f"{FUSED_DSA_SINCE} or later)"),
        "expandable_segments": Knob("expandable_segments", (True, False), False,
                                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the launch environment "
                                    "(Megatron-LM sets none; megatron/core/distributed/distributed_data_parallel_config"
                                    ".py:156-161 refuses it with nccl_ub)"),
        "optimizer": Knob("optimizer", ("adam", "muon", "dist_muon"), "adam",
                          f"{MLM}:2056-2058 (--optimizer; sgd not offered), :1177-1187 (Muon's rules); "
                          "megatron/core/optimizer/muon.py, layer_wise_optimizer.py"),
        "muon_tp_mode": Knob("muon_tp_mode", ("blockwise", "duplicated", "distributed"), "blockwise",
                             f"{MLM}:1853-1855 (--muon-tp-mode); megatron/core/optimizer/muon.py:81-88, 131"),
        "cuda_graph_impl": Knob("cuda_graph_impl", ("none", "local", "transformer_engine"), "none",
                                f"{TC}:776-782, 1716-1720 (--cuda-graph-impl)"),
        "cuda_graph_scope": Knob("cuda_graph_scope", (), (),
                                 f"{TC}:784-791, 1688-1714 (--cuda-graph-scope; empty = each whole layer); "
                                 "megatron/core/transformer/enums.py:70-79 (CudaGraphScope)"),
        "bf16_layers": Knob("bf16_layers", (), (0, 0),
                            f"{TC}:486-493 (first_last_layers_bf16, num_layers_at_start_in_bf16 / _end_in_bf16), "
                            ":988-1017 (not with delayed scaling; each at most num_layers // pp); "
                            "megatron/core/fp8_utils.py:513-530, fp4_utils.py:200-217 @ core_v0.18.0"),
        "quant_recipe": Knob("quant_recipe", (), None,  # the names: Software.quant_recipe, QUANT_RECIPES
                             f"{TC}:877 (quant_recipe; {MLM} --te-precision-config-file); {QUANT_RECIPE_SOURCE}"),
        "megatron_core": Knob("megatron_core", CORE_RELEASES, "0.16.1",
                              "the Megatron-Core release (tag core_v<version>); the other rules of this profile cite "
                              "core_v0.16.1: the version gates hybrid MTP (model_runtime_error), the fused grouped MLP, "
                              "the fused DSA kernels and DSA's core_attn recompute (dsa_recompute_error)"),
    }

    searched_knobs = ("cp_comm_type", "cp_a2a_size")

    # MoE parallel folding: autoplan emits --expert-tensor-parallel-size 1 and prices routed experts so. The expert
    # RankGenerator (PS:786-806) re-cuts the world as etp-ep-edp-pp with edp = world // (etp*ep*pp), raising unless
    # world % (etp*ep*pp) == 0 (PS:791-795): with etp 1 that is ep | tp*cp*dp, so EP may span the TP (and CP) ranks.
    expert_tensor_parallel = 1
    expert_rule = (f"{PS}:786-806: the expert RankGenerator needs world_size % (expert_tensor_parallel_size*ep*pp) "
                   "== 0, with expert_tensor_parallel_size 1")
    expert_count_rule = f"{MLM}:1025-1028"

    whole_group_source = (f"dp*cp/hsdp = 1 distributed-optimizer instance: --num-distributed-optimizer-instances 1, "
                          f"its default, {MLM}:2333")

    def sp_split_error(self, seq_len: int, tp: int, cp: int) -> str | None:
        """SP scatters each CP rank's [s/cp, b, h] activations over TP along s and asserts it divides
        (megatron-core 0.16.1 tensor_parallel/mappings.py:69-70)."""
        if (seq_len // cp) % tp == 0:
            return None
        return (f"sequence_parallel with tp={tp} splits the {seq_len // cp} tokens of a CP rank over tp: seq_len/cp "
                "must be divisible by tp (megatron-core 0.16.1 tensor_parallel/mappings.py:69-70)")

    def expert_ranks(self, *, tp: int, cp: int, dp_cp: int, zero: int, hsdp: int | None) -> tuple[int, str] | None:
        return tp * dp_cp, f"tp*cp*dp = {tp}*{cp}*{dp_cp // cp}"

    def knob_options(self, name: str, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                     given: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        """cp_comm_type on cp > 1 (p2p, Megatron's default, first), with a2a+p2p at each inner size; cp_a2a_size
        when the user asked for a2a+p2p without one. Illegal ones (heads after TP, ``check_cp_comm``) are
        dropped by ``knob_candidates``."""
        if par.cp <= 1:
            return ()
        sizes = hierarchical_sizes(par.cp)
        if name == "cp_a2a_size":
            return tuple({"cp_a2a_size": a} for a in sizes) if given.get("cp_comm_type") == "a2a+p2p" else ()
        kinds = sorted(self.knobs["cp_comm_type"].values, key=lambda v: v != self.knobs["cp_comm_type"].default)
        out: list[dict[str, Any]] = []
        for kind in kinds:
            if kind != "a2a+p2p":
                out.append({"cp_comm_type": kind})
            elif "cp_a2a_size" in given:
                out.append({"cp_comm_type": kind})
            else:
                out += [{"cp_comm_type": kind, "cp_a2a_size": a} for a in sizes]
        return tuple(out)

    # the EP A2A overlap changes each MoE layer's exposed all-to-all and host wait (``layer_cost``)
    layer_time_layout_knobs = frozenset({"moe_a2a_overlap"})
    # and no memory, to one layer's activations: the combined 1F1B runs one more forward in the interleaved warmup
    # (schedules.py:775-779 @ core_v0.16.1) and then each forward paired layer by layer with a backward
    # (combined_1f1b.py), so a rank's peak holds the warmup + 1 chunk-micro-batches it holds without the overlap
    # (``memory.inflight_microbatches``)
    memory_neutral_layout_knobs = frozenset({"moe_a2a_overlap"})

    def layout_knob_options(self, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                            given: dict[str, Any]) -> list[dict[str, Any]]:
        """The EP A2A overlap (``--overlap-moe-expert-parallel-comm``) where ep > 1 and the user left it unset: the
        catalog's default first, then the other setting. A layout knob rather than a layer-time one
        (``knob_options``): beside each MoE layer's exposed all-to-all and host wait it adds the combined 1F1B's
        pipeline sends (``estimate.combined_1f1b_p2p_s``), which only the whole step prices. ``check_runtime`` drops
        it where Megatron refuses it (pp > 1 without a virtual pipeline, full recompute, MTP, hybrid stacks)."""
        if "moe_a2a_overlap" in given or par.ep <= 1:
            return [{}]
        return [{}, {"moe_a2a_overlap": not cluster.efficiency.moe_a2a_overlap}]

    def knob_floor(self) -> tuple[dict[str, Any], bool] | None:
        """a2a without its traffic: the attention core in one kernel (no ring steps: no per-step kernel slowdown,
        no merges; ``knob_effects.ring_steps``) and no CP traffic; every CP type runs at least that."""
        return {"cp_comm_type": "a2a"}, True

    def default_zero_stage(self, generic: int, software: Software | None) -> int:
        """Muon runs on DDP only (Megatron-LM refuses it with the distributed optimizer, MLM:1184; ``check_muon``):
        an unset ZeRO stage means 0 there, the distributed optimizer (1) otherwise."""
        return 0 if muon_optimizer(software) else super().default_zero_stage(generic, software)

    def zero_reason(self, zero_stage: int) -> str:
        return ("Megatron-LM runs ZeRO-0 (DDP), 1 (--use-distributed-optimizer), 2 (Megatron-FSDP optim_grads) "
                "and 3 (--use-torch-fsdp2)")

    def hsdp_error(self, zero: int, hsdp: int, cp: int, dp_cp: int) -> ConfigError | None:
        if zero == 2:
            return ConfigError(
                f"hsdp_shard_size={hsdp} with zero_stage=2: Megatron-FSDP's hybrid sharding "
                "(--num-distributed-optimizer-instances with --use-megatron-fsdp, "
                "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:203) is not priced by autoplan",
                valid=["zero_stage=1", "hsdp_shard_size unset"])
        if zero != 1:
            return ConfigError(
                f"hsdp_shard_size={hsdp} with zero_stage={zero}: Megatron-LM shards in groups only with the "
                f"distributed optimizer (--num-distributed-optimizer-instances, {MLM}:2333); --use-torch-fsdp2 "
                "always shards over the whole dp*cp group", valid=["zero_stage=1", "hsdp_shard_size unset"])
        return None

    def expert_layout_error(self, model: ModelSpec, *, tp: int, pp: int, cp: int, dp_cp: int, ep: int, zero: int,
                            hsdp: int | None) -> ConfigError | None:
        """The common expert rules, then the distributed optimizer's instances (``hsdp`` < dp*cp under zero 1): the
        expert data-parallel size tp*dp*cp/ep must be divisible by the dp*cp/hsdp instances (megatron/core/
        parallel_state.py:1263-1265 @ core_v0.16.1, "Expert data parallel size should be divisible by partial DistOpt
        shard factor"); valid: the shard sizes that keep it."""
        err = super().expert_layout_error(model, tp=tp, pp=pp, cp=cp, dp_cp=dp_cp, ep=ep, zero=zero, hsdp=hsdp)
        if err is not None or ep == 1 or zero != 1 or hsdp is None or hsdp >= dp_cp:
            return err
        edp, instances = tp * dp_cp // ep, dp_cp // hsdp
        if edp % instances == 0:
            return None
        sizes = [s for s in divisors(dp_cp) if s > 1 and edp % (dp_cp // s) == 0]
        return ConfigError(f"hsdp_shard_size={hsdp} with ep={ep}: {instances} distributed-optimizer instances "
                           f"(dp*cp/hsdp = {dp_cp}/{hsdp}) must divide the expert data-parallel size tp*dp*cp/ep = "
                           f"{edp} (megatron/core/parallel_state.py:1263-1265)",
                           valid=[f"hsdp_shard_size={s}" for s in sizes] + ["a smaller ep"])

    def target_layout_error(self, model: ModelSpec, *, tp: int, pp: int, cp: int, ep: int,
                            zero: int) -> ConfigError | None:
        err = self.hybrid_layout_error(model, tp, cp) or dsa_layout_error(model, cp)
        if err is not None:
            return err
        if zero != 3:
            return None
        if pp > 1:
            return ConfigError(f"zero_stage=3 with pp={pp}: --use-torch-fsdp2 is not supported with pipeline "
                               f"parallelism ({MLM}:609)", valid=["zero_stage=1", "pp=1"])
        if ep > 1:
            return ConfigError(f"zero_stage=3 with ep={ep}: --use-torch-fsdp2 is not supported with expert "
                               f"parallelism ({MLM}:611)", valid=["zero_stage=1", "ep=1"])
        if model.tied_embeddings:
            return ConfigError(f"zero_stage=3: --use-torch-fsdp2 requires --untie-embeddings-and-output-weights "
                               f"({MLM}:619); {model.name} ties them", valid=["zero_stage=1"])
        return None

    def interleave_error(self, model: ModelSpec) -> ConfigError | None:
        if model.is_hybrid:
            return ConfigError(f"{model.name}: the Mamba hybrid model does not support virtual/interleaved pipeline "
                               f"parallelism ({MAMBA_BLOCK}:173-176)", valid=["vp=1"])
        return None

    def hybrid_layout_error(self, model: ModelSpec, tp: int, cp: int) -> ConfigError | None:
        """MambaMixer's head / group split over TP and CP (``mamba_layout_error``); GatedDeltaNet's
        (``gdn_layout_error``)."""
        if model.gdn is not None:
            return gdn_layout_error(model, tp, cp)
        return mamba_layout_error(model, tp, cp) if model.mamba is not None else None

    def pipeline_rule_error(self, model: ModelSpec, par: ParallelConfig) -> ConfigError | None:
        """A hybrid stack is split by MambaStack's own rule (``hybrid_pipeline_error``), not TransformerBlock's."""
        return hybrid_pipeline_error(model, par) if model.is_hybrid else None

    def check_layout(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig) -> None:
        super().check_layout(model, cluster, job, par)
        err = self.pipeline_rule_error(model, par)
        if err is not None:
            raise err

    def emit_model_errors(self, model: ModelSpec) -> list[ConfigError]:
        """A model Megatron-LM has no flags for (``model_flags_error``: activation, ALiBi, RoPE base, Llama 4's
        RoPE-layers-only q/k norm) or whose RoPE scaling the emitted run would not train (``rope_scaling_error``, no
        cost: priced alike)."""
        return [err for err in (rope_scaling_error(model), model_flags_error(model)) if err is not None]

    def model_runtime_error(self, model: ModelSpec, rt: Runtime) -> ConfigError | None:
        """More bf16 layers than the model has (``bf16_layers_error``). A hybrid stack's multi-token prediction needs a Megatron-Core that builds it (``megatron_core`` knob):
        core_v0.16.1's MambaModel has no MTP (megatron/core/models/mamba/mamba_model.py, MambaStack only); the
        unified pattern '<main>/<block>/...' and MambaModel's MultiTokenPredictionBlock of hybrid layers arrived
        with commit 9d71cb1c ("Reapply: Add MTP support for hybrid models (#2363)", first tagged core_v0.17.0rc0:
        megatron/core/ssm/mamba_hybrid_layer_allocation.py parse_hybrid_pattern, models/mamba/mamba_model.py:
        173-253), moved to megatron/core/models/hybrid/hybrid_layer_allocation.py:194-277 and hybrid_model.py:
        180-291 at core_v0.18.0."""
        if (err := bf16_layers_error(model, rt, 1)) is not None:  # the pipeline-free bound (check_runtime: per stage)
            return err
        hybrid = model.is_hybrid and bool(model.arch.mtp_layers)
        if not (hybrid or model.arch.mtp_repeated):
            return None
        later = CORE_RELEASES[CORE_RELEASES.index(HYBRID_MTP_SINCE):]
        if rt.megatron_core in later:
            return None
        what = (f"{model.name}'s multi-token prediction on a hybrid stack (mtp_layers={model.arch.mtp_layers}, block "
                f"{model.arch.mtp_pattern!r}): Megatron-Core {rt.megatron_core}'s MambaModel builds no MTP "
                "(megatron/core/models/mamba/mamba_model.py @ core_v0.16.1)" if hybrid else
                f"{model.name}'s mtp_repeated: Megatron-Core {rt.megatron_core} has no mtp_use_repeated_layer "
                "(transformer_config.py @ core_v0.16.1)")
        return ConfigError(
            f"megatron_core={rt.megatron_core} with {what}; it builds from core_v{HYBRID_MTP_SINCE} "
            "(megatron/core/ssm/mamba_hybrid_layer_allocation.py parse_hybrid_pattern, transformer_config.py:68 "
            "mtp_use_repeated_layer; at core_v0.18.0 megatron/core/models/hybrid/hybrid_layer_allocation.py): set the "
            "megatron_core knob to the release the run uses, or mtp_layers 0",
            valid=[f"megatron_core={v}" for v in later] + ["mtp_layers=0"])

    def check_runtime(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                      rt: Runtime) -> None:
        if (err := self.model_runtime_error(model, rt)) is not None:
            raise err
        if rt.optimizer != "adam":  # first: its refusals name Muon, not the knobs it turns off
            check_muon(par, rt)
            if model.arch.attention_output_gate:
                raise ConfigError(f"optimizer={rt.optimizer} with {model.name}'s attention output gate: Muon splits "
                                  "linear_qkv by [heads/groups, 1, 1] x kv_channels per query group (megatron-core "
                                  "0.16.1 megatron/core/optimizer/muon.py:228-238, 144-149), a shape the gated "
                                  "projection (twice the query rows) does not have", valid=["optimizer=adam"])
        if (err := bf16_layers_error(model, rt, par.pp)) is not None:
            raise err
        if model.mamba is not None and job.precision != "bf16" and model.mamba.in_proj_width % 16:
            raise ConfigError(f"precision {job.precision}: Megatron-Core's Mamba in_proj output width "
                              f"{model.mamba.in_proj_width} (2 d_inner + 2 groups state + heads) must be a multiple of "
                              f"16 for fp8 ({MIXER}:241-245)", valid=["precision bf16"])
        if model.gdn is not None and job.precision != "bf16" and model.gdn.in_proj_width % 16:
            raise ConfigError(f"precision {job.precision}: Megatron-Core's GatedDeltaNet in_proj output width "
                              f"{model.gdn.in_proj_width} (2 key_dim + 2 value_dim + 2 value heads) must be a multiple "
                              f"of 16 for fp8 ({GDN}:139-145)", valid=["precision bf16"])
        if rt.tp_comm_overlap and job.precision == "nvfp4":
            raise ConfigError("tp_comm_overlap with precision nvfp4: Megatron registers TE's userbuffers for fp8 or "
                              "bf16 only (megatron/training/initialize.py:277-281) and TE's NVFP4 modules ask for the "
                              "fp8 ones (TE pytorch/module/base.py get_ub:448-456)", valid=["tp_comm_overlap=false"])
        if rt.tp_comm_overlap and not (par.tp > 1 and par.sequence_parallel):
            raise ConfigError(f"tp_comm_overlap needs tp > 1 with sequence parallelism ({MLM}:916)",
                              valid=["tp_comm_overlap=false"])
        if rt.overlap_param_gather and par.zero_stage not in (1, 2):
            raise ConfigError(f"overlap_param_gather needs the distributed optimizer or Megatron-FSDP, zero_stage=1 "
                              f"or 2 ({MLM}:598)", valid=["overlap_param_gather=false"])
        if par.zero_stage == 2 and not rt.overlap_grad_reduce:
            raise ConfigError(f"overlap_grad_reduce=false with zero_stage=2: Megatron-FSDP optim_grads always "
                              f"overlaps the gradient reduce-scatter ({MF}:277-283)", valid=["overlap_grad_reduce=true"])
        if rt.overlap_param_gather and not rt.overlap_grad_reduce:
            raise ConfigError(f"overlap_param_gather needs overlap_grad_reduce ({MLM}:601)",
                              valid=["overlap_grad_reduce=true"])
        if rt.adam_moments_dtype != "fp32" and par.zero_stage != 1:
            raise ConfigError(f"adam_moments_dtype={rt.adam_moments_dtype} with zero_stage={par.zero_stage}: "
                              f"--use-precision-aware-optimizer runs with the distributed optimizer only ({OC}:375-380)",
                              valid=["zero_stage=1", "adam_moments_dtype=fp32"])
        if rt.fp8_param_gather and par.zero_stage != 1:
            raise ConfigError(f"fp8_param_gather with zero_stage={par.zero_stage}: autoplan prices fp8 weights with the "
                              f"distributed optimizer only (torch FSDP2 turns it off with TE 2: {MLM}:625-630; "
                              "Megatron-FSDP's fp8 weights are not priced)",
                              valid=["zero_stage=1", "fp8_param_gather=false"])
        if rt.cpu_offload_layers:
            k = rt.cpu_offload_layers
            if k >= model.num_layers:
                raise ConfigError(f"cpu_offload_layers={k}: Megatron-Core offloads fewer layers than the model has "
                                  f"({model.num_layers}; {TCFG}:1137-1142)", valid=[f"0..{model.num_layers - 1}"])
            if par.pp > 1:
                raise ConfigError(f"cpu_offload_layers={k} with pp={par.pp}: no CPU offloading with pipeline "
                                  f"parallelism ({TCFG}:1144-1147)", valid=["pp=1", "cpu_offload_layers=0"])
            if par.recompute != "none":
                raise ConfigError(f"cpu_offload_layers={k} with recompute={par.recompute}: CPU offloading does not "
                                  f"work with activation recomputation ({TCFG}:1149-1152)",
                                  valid=["recompute=none", "cpu_offload_layers=0"])
        moe_knobs = [n for n, v in (("moe_dispatcher", rt.moe_dispatcher not in (None, "alltoall")),
                                    ("moe_a2a_overlap", bool(rt.moe_a2a_overlap)),
                                    ("moe_force_balance", rt.moe_force_balance),
                                    ("moe_capacity_factor", rt.moe_capacity_factor is not None),
                                    ("moe_router_padding", rt.moe_router_padding)) if v]
        if moe_knobs and not model.is_moe:
            raise ConfigError(f"{', '.join(moe_knobs)}: MoE settings on {model.name}, a dense model",
                              valid=[f"{n} unset" for n in moe_knobs])
        if rt.moe_a2a_overlap:
            if model.is_hybrid:
                raise ConfigError(f"moe_a2a_overlap on {model.name}, a hybrid Mamba stack: megatron-core's combined "
                                  "1F1B schedule runs GPTModel only (pipeline_parallel/combined_1f1b.py:336-341 "
                                  "asserts it; MambaModel is not one, models/mamba/mamba_model.py:27)",
                                  valid=["moe_a2a_overlap=false"])
            if par.ep <= 1:
                raise ConfigError(f"moe_a2a_overlap with ep={par.ep}: --overlap-moe-expert-parallel-comm needs expert "
                                  f"parallelism ({TC}:1862-1864)", valid=["ep > 1", "moe_a2a_overlap=false"])
            if par.pp > 1 and par.schedule != "interleaved":
                raise ConfigError(f"moe_a2a_overlap with pp={par.pp} and schedule {par.schedule}: "
                                  f"--overlap-moe-expert-parallel-comm needs a virtual pipeline when pp > 1 "
                                  f"({TC}:1857-1861)", valid=["schedule interleaved (vp > 1)", "moe_a2a_overlap=false"])
            if par.recompute == "full":
                raise ConfigError(f"moe_a2a_overlap with recompute=full: --overlap-moe-expert-parallel-comm refuses "
                                  f"full recomputation ({TC}:1870-1878)", valid=["recompute=selective",
                                                                                 "moe_a2a_overlap=false"])
            mtp = model.arch.mtp_layers
            if mtp > 1:
                raise ConfigError(f"moe_a2a_overlap with mtp_layers={mtp}: --overlap-moe-expert-parallel-comm supports "
                                  f"one MTP layer ({TC}:1889-1891)", valid=["mtp_layers=1", "moe_a2a_overlap=false"])
            if mtp and par.pp == 1:
                raise ConfigError(f"moe_a2a_overlap with an MTP layer and pp=1: --overlap-moe-expert-parallel-comm "
                                  f"needs pp > 1 with MTP ({TC}:1892-1897)", valid=["pp > 1", "moe_a2a_overlap=false"])
        if rt.moe_capacity_factor is not None and rt.moe_dispatcher == "deepep":
            raise ConfigError(f"moe_capacity_factor with moe_dispatcher=deepep: the flex dispatcher's DeepEP backend "
                              f"does not pad experts to capacity ({TC}:1074-1081)",
                              valid=["moe_dispatcher=alltoall", "moe_dispatcher=hybridep", "moe_capacity_factor unset"])
        if rt.moe_router_padding and (err := router_padding_error(job, rt)) is not None:
            raise err
        if rt.dsa_kernel_backend != "none" and (err := dsa_backend_error(model, rt)) is not None:
            raise err
        if rt.moe_fused_grouped_mlp and (err := self.fused_grouped_mlp_error(model, cluster, job, par, rt)) is not None:
            raise err
        check_cuda_graphs(model, par, rt)
        bad = module_errors(model, par, rt.fp8_recipe)  # --recompute-modules (cost_models.recompute cites the code)
        if bad is not None:
            raise ConfigError(bad, valid=[m for m in RECOMPUTE_MODULES if module_errors(
                model, par.model_copy(update={"recompute_modules": (m,)}), rt.fp8_recipe) is None])
        if (err := dsa_recompute_error(model, modules_in_effect(par, rt), rt.megatron_core)) is not None:
            raise err
        if par.cp > 1:
            check_cp_comm(model, par, rt.cp_comm_type, cluster, rt.cp_a2a_size)
        if rt.fp8_recipe == "mxfp8" and cluster.gpu.generation != "blackwell":
            raise ConfigError(f"fp8_recipe=mxfp8 runs on Blackwell only ({TC}:441); {cluster.gpu.name} is "
                              f"{cluster.gpu.generation}", valid=["delayed", "tensorwise", "blockwise"])

    def fused_grouped_mlp_error(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                                rt: Runtime) -> ConfigError | None:
        """Why the fused grouped MLP (knob ``moe_fused_grouped_mlp``) would not run as priced, or None. Megatron-Core
        asserts ``_is_fused_impl_supported`` (core_v0.18.0 experts.py:268-271): TE >= 2.14, expert-TP 1, no
        fine-grained offload of expert_fc1 / moe_act, probs not applied on the input, TE GroupedLinear fc1 / fc2, a
        SwiGLU or quick-GeGLU (or a weighted squared ReLU) activation (:315-372). Transformer Engine then fuses only
        on sm_100 (``get_device_compute_capability()[0] != 10``: grouped_mlp.py:948), under an MXFP8 or NVFP4 recipe
        (:842), with fc1 / fc2 widths multiples of 64 (:783-794); elsewhere the op fuser runs its ops one by one.
        autoplan prices the MXFP8 GLU kernels (op_traffic.FUSED_GLU_BWD_INPUT_READS): NVFP4 (a bf16 GLU output and a
        separate grouped quantize, :1557-1590) and the squared-ReLU kernels are refused, as is ``moe_act`` recompute
        (the fused op saves the fc1 output and fc2's input whatever it says: :1746-1806)."""
        off = "moe_fused_grouped_mlp=false"
        if not model.is_moe:
            return ConfigError(f"moe_fused_grouped_mlp on {model.name}, a dense model: it fuses the routed experts' "
                               f"grouped MLP ({FUSED_MLP})", valid=[off])
        later = CORE_RELEASES[CORE_RELEASES.index(FUSED_MLP_SINCE):]
        if rt.megatron_core not in later:
            return ConfigError(f"moe_fused_grouped_mlp with megatron_core={rt.megatron_core}: "
                               "--use-transformer-engine-op-fuser and --moe-mlp-glu-interleave-size first appear at "
                               f"core_v{FUSED_MLP_SINCE} (transformer_config.py:465, :868); set the megatron_core knob "
                               "to the release the run uses", valid=[f"megatron_core={v}" for v in later] + [off])
        if self.expert_tensor_parallel != 1:
            return ConfigError(f"moe_fused_grouped_mlp with expert_tensor_parallel_size={self.expert_tensor_parallel}: "
                               "the fused grouped MLP runs without expert tensor parallelism (experts.py:330-331)",
                               valid=["expert_tensor_parallel_size=1", off])
        if cluster.gpu.generation != "blackwell":
            return ConfigError(f"moe_fused_grouped_mlp on {cluster.gpu.name} ({cluster.gpu.generation}): Transformer "
                               "Engine's CuTe DSL grouped MLP kernels run on sm_100 only (grouped_mlp.py:948 "
                               "get_device_compute_capability()[0] != 10)", valid=["a Blackwell GPU (B200, GB200, "
                                                                                   "B300, GB300)", off])
        if job.precision != "fp8" or rt.fp8_recipe != "mxfp8":
            what = f"fp8_recipe={rt.fp8_recipe}" if job.precision == "fp8" else f"precision {job.precision}"
            return ConfigError(f"moe_fused_grouped_mlp with {what}: Transformer Engine fuses the grouped MLP under an "
                               "MXFP8 or NVFP4 recipe only (grouped_mlp.py:842), and autoplan prices the MXFP8 "
                               "kernels (NVFP4's GLU output is quantized by a separate grouped kernel, :1557-1590)",
                               valid=["precision fp8 with fp8_recipe=mxfp8", off])
        if not model.gated_mlp or model.arch.activation not in ("silu", "quick_gelu"):
            act = (f"gated {model.arch.activation}" if model.gated_mlp else f"non-gated {model.arch.activation}")
            return ConfigError(f"moe_fused_grouped_mlp on {model.name}'s {act} experts: Megatron-Core fuses SwiGLU and "
                               "quick-GeGLU (or a weighted squared ReLU, whose kernels autoplan does not price) "
                               "(experts.py:343-356)", valid=["a SwiGLU or quick-GeGLU MoE model", off])
        widths = {"expert input (hidden)": model.expert_input_size,
                  "moe_ffn_hidden_size": model.expert_ffn_hidden_size}
        bad = {n: w for n, w in widths.items() if w % FUSED_MLP_DIM_MULTIPLE}
        if bad:
            n, w = next(iter(bad.items()))
            return ConfigError(f"moe_fused_grouped_mlp on {model.name}: its {n} width {w} is not a multiple of "
                               f"{FUSED_MLP_DIM_MULTIPLE}; Transformer Engine's fused kernel refuses it and runs the ops "
                               "one by one (grouped_mlp.py:783-794 validate_grouped_mlp_dims)", valid=[off])
        if par.recompute == "selective" and par.recompute_modules is not None and "moe_act" in par.recompute_modules:
            rest = [m for m in par.recompute_modules if m != "moe_act"]
            return ConfigError("moe_fused_grouped_mlp with recompute_modules moe_act: the fused op saves the fc1 "
                               "output and fc2's input whatever the checkpoint asks (grouped_mlp.py:1746-1806), which "
                               "autoplan does not price",
                               valid=[f"recompute_modules={','.join(rest)}" if rest else "recompute_modules unset",
                                      off])
        if rt.bf16_layers != (0, 0):
            return ConfigError(f"moe_fused_grouped_mlp with bf16_layers={rt.bf16_layers[0]},{rt.bf16_layers[1]}: "
                               "Transformer Engine fuses the grouped MLP only under an MXFP8 / NVFP4 recipe "
                               "(grouped_mlp.py:842); in the bf16 layers its op fuser runs the ops one by one, which "
                               "autoplan does not price", valid=["bf16_layers=0,0", off])
        return None

    def resolve(self, software: Software | None, job: JobSpec, cluster: ClusterSpec,
                par: ParallelConfig | None = None) -> Runtime:
        k = self._knob_values(software, job, cluster)
        optimizer = k.get("optimizer", "adam")
        if "muon_tp_mode" in k and optimizer == "adam":
            raise ConfigError(f"muon_tp_mode={k['muon_tp_mode']} is a Muon setting (--muon-tp-mode, {MLM}:1853) and the "
                              "optimizer is adam", valid=["optimizer=muon", "optimizer=dist_muon", "muon_tp_mode unset"])
        if "fp8_recipe" in k and job.precision != "fp8":
            raise ConfigError(f"fp8_recipe={k['fp8_recipe']} needs precision fp8 (the job is {job.precision})",
                              valid=["precision fp8 (--precision fp8)", "fp8_recipe unset"])
        tp_sp = par is None or (par.tp > 1 and par.sequence_parallel)
        zero = par.zero_stage if par is not None else 1
        fsdp = zero == 3
        # --use-torch-fsdp2 reduce-scatters the bf16 model's gradients in bf16 (module doc); the knob reaches DDP only
        grad = "bf16" if fsdp else k.get("grad_reduce_dtype", "fp32")
        moments = k.get("adam_moments_dtype", "fp32")
        fp4 = job.precision == "nvfp4"
        # TE runs NVFP4 as an autocast recipe: the runtime carries it where the fp8 recipe goes (module doc)
        fp8_recipe = k.get("fp8_recipe", "delayed") if job.precision == "fp8" else "nvfp4" if fp4 else None
        fp8_params = bool(k.get("fp8_param_gather", False))
        if fp8_params and fp8_recipe not in ("delayed", "tensorwise"):
            raise ConfigError(f"fp8_param_gather with {'fp8_recipe=' + fp8_recipe if job.precision == 'fp8' else 'precision ' + job.precision}: "
                              "autoplan prices fp8 weights under tensor scaling only (precision fp8, delayed or "
                              "tensorwise)", valid=["fp8_recipe=delayed", "fp8_recipe=tensorwise",
                                                    "fp8_param_gather=false"])
        # fp8 weights: the fp8 data, plus its transpose where FP8 GEMMs run TN only (before Blackwell; module doc)
        weight = (1.0 if cluster.gpu.generation == "blackwell" else 2.0) if fp8_params else 2.0
        mfsdp = zero == 2  # Megatron-FSDP optim_grads
        cp_kind = k.get("cp_comm_type", "p2p")
        a2a_size = k.get("cp_a2a_size")
        if a2a_size is not None and cp_kind != "a2a+p2p":
            raise ConfigError(f"cp_a2a_size={a2a_size} is the inner group of cp_comm_type=a2a+p2p (the type is "
                              f"{cp_kind})", valid=["cp_comm_type=a2a+p2p", "cp_a2a_size unset"])
        if cp_kind == "a2a+p2p" and a2a_size is None and par is not None:
            a2a_size = default_a2a_size(par.cp, par.tp, cluster)
        env: tuple[tuple[str, str], ...] = ()
        if ((par is None or par.tp > 1 or par.cp > 1) and zero < 2 and cluster.gpu.generation != "blackwell"
                and not k.get("moe_a2a_overlap", cluster.efficiency.moe_a2a_overlap)):
            # MLM:925-953 (TP/CP before Blackwell, no FSDP: MLM:687; the EP all-to-all overlap wants more
            # connections: only a warning there, MLM:940-948)
            env = (("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)
        if k.get("moe_fused_grouped_mlp", False):  # TE fuses only with it (FUSED_MLP_ENV)
            env += (FUSED_MLP_ENV,)
        if k.get("expandable_segments", False):
            env += (EXPANDABLE_SEGMENTS_ENV,)
            # MLM:1247-1253 (illegal memory access otherwise); the local graphs assert it before Blackwell
            # (megatron/core/transformer/cuda_graphs.py:1413-1420, get_device_capability()[0] < 10)
            impl = k.get("cuda_graph_impl")
            if impl == "transformer_engine" or (impl == "local" and cluster.gpu.generation != "blackwell"):
                env += (("NCCL_GRAPH_REGISTER", "0"),)
        cap = 0.0
        if mfsdp:
            dp_cp = par.dp(cluster.num_gpus) * par.cp if par is not None else cluster.num_gpus
            bucket = max(MFSDP_MIN_BUCKET, MFSDP_BUCKET_PER_RANK * dp_cp)
            cap = max(MFSDP_RS_QUEUE, bucket) + bucket  # queued reduce-scatters + the bucket being filled
        ce = k.get("cross_entropy_fusion", "none")
        bf16_layers = tuple(k.get("bf16_layers", (0, 0)))
        if bf16_layers != (0, 0) and job.precision == "bf16":
            raise ConfigError(f"bf16_layers={list(bf16_layers)}: first_last_layers_bf16 takes layers out of an fp8 / "
                              f"fp4 run, and the job is bf16 ({TC}:486-493)", valid=["precision fp8", "precision nvfp4",
                                                                                  "bf16_layers unset"])
        if bf16_layers != (0, 0) and fp8_recipe == "delayed":
            said = "" if "fp8_recipe" in k else " (the default)"
            raise ConfigError(f"bf16_layers={list(bf16_layers)} with fp8_recipe=delayed{said}: \"Delayed scaling does not "
                              f"support first / last layer in BF16\" ({TC}:988-991)",
                              valid=["fp8_recipe=tensorwise", "fp8_recipe=blockwise", "fp8_recipe=mxfp8",
                                     "bf16_layers unset"])
        recipe = k.get("quant_recipe")
        if recipe is not None and not fp4:
            raise ConfigError(f"quant_recipe={recipe} is the NVFP4 runs' module recipe ({QUANT_RECIPE_SOURCE}); the "
                              f"job is {job.precision}", valid=["precision nvfp4", "quant_recipe unset"])
        return Runtime(
            bf16_layers=bf16_layers,  # type: ignore[arg-type]
            quant_recipe=recipe,
            module_precision=QUANT_RECIPES[recipe] if recipe is not None else (),
            target="megatron",
            cross_entropy_fusion=ce,
            loss_bytes_per_logit=LOSS_BYTES_PER_LOGIT[ce],
            # TEGroupedMLP (megatron/core/transformer/moe/experts.py:681-706, 609-626, 758): the activation clamp
            # ahead of the fused quick-GeGLU and fc2's per-expert bias run op by op (op_traffic.MCORE_EXPERT_*)
            mcore_expert_glue=True,
            # apply_rotary_pos_emb drops TE's fused RoPE when YaRN's concentration factor is not 1
            # (megatron/core/models/common/embeddings/rope_utils.py:279-284, the mscale attention.py:1102/1115
            # passes): q and k go through _apply_rotary_pos_emb_bshd op by op (op_traffic.MCORE_UNFUSED_ROTARY_BYTES)
            mcore_yarn_unfused_rope=True,
            tp_comm_overlap=k.get("tp_comm_overlap", tp_sp and (par is None or par.tp > 1) and not fp4),
            fp8_recipe=fp8_recipe,
            adam_moments_dtype=moments,
            cpu_offload_layers=k.get("cpu_offload_layers", 0),
            fp8_param_gather=fp8_params,
            # unset: the catalog's / cluster profile's, resolved here so that the checks, the emitter and the
            # report see what is priced (cost_models.moe reads the runtime first)
            moe_dispatcher=k.get("moe_dispatcher", cluster.efficiency.moe_dispatcher),
            moe_a2a_overlap=k.get("moe_a2a_overlap", cluster.efficiency.moe_a2a_overlap),
            moe_force_balance=bool(k.get("moe_force_balance", False)),
            moe_capacity_factor=k.get("moe_capacity_factor"),
            moe_router_padding=bool(k.get("moe_router_padding", False)),
            moe_fused_grouped_mlp=bool(k.get("moe_fused_grouped_mlp", False)),
            dsa_kernel_backend=k.get("dsa_kernel_backend", "none"),
            cuda_graph_impl=k.get("cuda_graph_impl", "none"),
            cuda_graph_scope=tuple(k.get("cuda_graph_scope", ())),
            megatron_core=k.get("megatron_core", "0.16.1"),
            # TE's fp8 linears all-gather quantized tensors under sequence parallelism (te_fp8.te_tp_gather_bytes)
            tp_gather_bytes=te_tp_gather_bytes(fp8_recipe)[0] if fp8_recipe else 2.0,
            tp_grad_gather_bytes=te_tp_gather_bytes(fp8_recipe)[1] if fp8_recipe else 2.0,
            grad_reduce_dtype=grad,
            cp_comm_type=cp_kind,
            cp_a2a_size=a2a_size,
            # Muon runs neither overlap (MLM:1181-1182): off unless asked for (then check_muon refuses it)
            optimizer=optimizer,
            muon_tp_mode=k.get("muon_tp_mode", "blockwise"),
            overlap_grad_reduce=k.get("overlap_grad_reduce", optimizer == "adam"),
            overlap_param_gather=k.get("overlap_param_gather", zero in (1, 2) and optimizer == "adam"),
            # FSDP2: bf16 shards (2 B), bf16 gradient shards (2 B), fp32 master + Adam m, v (12 B) (module doc)
            weight_bytes=2.0 if fsdp else weight,
            gather_bytes=1.0 if fp8_params else 2.0,
            grad_bytes=4.0 if grad == "fp32" else 2.0,
            optimizer_bytes=12.0 if fsdp else optimizer_bytes(moments, None if fp4 else fp8_recipe, fp8_params),
            fp8_saved_bytes=NVFP4_SAVED_BYTES if fp4 else 1.0,
            weight_cache_bytes=NVFP4_WEIGHT_CACHE_BYTES if fp4 else 0.0,
            # --use-torch-fsdp2 runs torch fully_shard (its gathered units); the loss, fp8 saves and selective
            # recompute are Megatron-Core / Transformer Engine's (Runtime defaults).
            gathered_unit_bytes=fsdp2_gathered_unit_bytes(grad) if fsdp else 4.0,
            fsdp_mtp_unit="root",  # --use-torch-fsdp2: eh_proj and the MTP norms in the root unit (module doc)
            fsdp_root_kinds=frozenset({"mamba"}),  # --use-torch-fsdp2: a hybrid stack's MambaLayers (module doc)
            grad_reduce_every_microbatch=mfsdp,
            grad_bucket_cap=cap,
            env=env,
            notes=(("zero_stage=2 runs as Megatron-FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy "
                    "optim_grads): gradients reduce-scattered in every micro-batch",) if mfsdp else ())
            + (("zero_stage=3 runs torch FSDP2 on the bf16 model with no mixed-precision policy: gradients are "
                f"reduce-scattered in bf16 (grad_reduce_dtype={k['grad_reduce_dtype']} has no effect there)",)
               if fsdp and k.get("grad_reduce_dtype") == "fp32" else ())
            + ((f"cpu_offload_layers={k['cpu_offload_layers']}: those layers' activations go to host memory and "
                "back each micro-batch; the memory is priced, the host-link time is not (taken as hidden)",)
               if k.get("cpu_offload_layers") else ()),
        )


def muon_optimizer(software: Software | None) -> bool:
    """Whether ``software`` asks for one of Megatron-LM's Muon optimizers (``--optimizer muon|dist_muon``)."""
    return software is not None and (software.optimizer or "adam") != "adam"


def check_muon(par: ParallelConfig, rt: Runtime) -> None:
    """Megatron-LM's Muon rules (validate_args, MLM:1177-1187; megatron/core/optimizer/muon.py:190-196): no
    gradient-reduce or parameter-gather overlap, no distributed optimizer, no torch FSDP2, no Megatron-FSDP. Muon
    runs on DDP (zero_stage 0); dist_muon spreads the optimizer state over the DP ranks itself."""
    opt = rt.optimizer
    what = {1: "the distributed optimizer (--use-distributed-optimizer", 2: "Megatron-FSDP (--use-megatron-fsdp",
            3: "Torch-FSDP2 (--use-torch-fsdp2"}
    line = {1: 1184, 2: 1186, 3: 1185}
    if par.zero_stage in what:
        alt = ["zero_stage=0"] + (["optimizer=dist_muon (zero_stage=0)"] if opt == "muon" else []) + ["optimizer=adam"]
        raise ConfigError(f"optimizer={opt} with zero_stage={par.zero_stage}: Muon does not support "
                          f"{what[par.zero_stage]}, {MLM}:{line[par.zero_stage]})", valid=alt)
    for knob, on, ln in (("overlap_grad_reduce", rt.overlap_grad_reduce, 1181),
                         ("overlap_param_gather", rt.overlap_param_gather, 1182)):
        if on:
            raise ConfigError(f"optimizer={opt} with {knob}: Muon does not support {knob.replace('_', ' ')} "
                              f"({MLM}:{ln})", valid=[f"{knob}=false", "optimizer=adam"])


def check_cuda_graphs(model: ModelSpec, par: ParallelConfig, rt: Runtime) -> None:
    """Megatron-Core 0.16.1's CUDA-graph rules (TransformerConfig.__post_init__, TC:1716-1830 and 1898-1906;
    Megatron-LM's --cuda-graph-scope help, MLM:1430-1444), plus one it leaves to capture time: a graph over a
    dropless MoE layer would capture its dispatcher's host sync (``moe.DISPATCHER_HOST_SYNC``), which CUDA graph
    capture forbids; Megatron states it for the ``moe`` scope ("moe cuda graph is only supported with
    drop-padding MoE", TC:1764-1770) and the whole layer / whole iteration hold the same MoE layer."""
    impl, scope = rt.cuda_graph_impl, rt.cuda_graph_scope
    names = ", ".join(scope) or "(whole layer)"
    if impl == "none":
        if scope:
            raise ConfigError(f"cuda_graph_scope={names} with cuda_graph_impl=none: nothing is captured without an "
                              f"implementation ({TC}:1716)", valid=["cuda_graph_impl=transformer_engine",
                                                                     "cuda_graph_scope unset"])
        return
    if rt.cpu_offload_layers:
        raise ConfigError(f"cuda_graph_impl={impl} with cpu_offload_layers={rt.cpu_offload_layers}: CUDA graphs are "
                          f"not supported with CPU offloading ({TC}:1722-1723)", valid=["cuda_graph_impl=none",
                                                                                       "cpu_offload_layers=0"])
    if "full_iteration" in scope:
        if impl != "local":
            raise ConfigError(f"cuda_graph_scope full_iteration with cuda_graph_impl={impl}: the whole-iteration "
                              f"graph is the local implementation's ({TC}:1738-1742)", valid=["cuda_graph_impl=local"])
        if scope != ("full_iteration",):
            raise ConfigError(f"cuda_graph_scope={names}: full_iteration captures everything and takes no other "
                              f"scope ({MLM}:1430-1444)", valid=["cuda_graph_scope=full_iteration"])
    elif impl == "local" and scope:
        raise ConfigError(f"cuda_graph_scope={names} with cuda_graph_impl=local: per-module scopes are the "
                          f"transformer_engine implementation's, local takes full_iteration or the whole layer "
                          f"({MLM}:1430-1444)", valid=["cuda_graph_impl=transformer_engine",
                                                       "cuda_graph_scope=full_iteration"])
    if "moe" in scope and "moe_router" in scope:
        raise ConfigError(f"cuda_graph_scope={names}: not both moe and moe_router ({TC}:1743-1746)",
                          valid=["moe", "moe_router"])
    if "moe_preprocess" in scope and "moe_router" not in scope:
        raise ConfigError(f"cuda_graph_scope={names}: moe_preprocess needs moe_router ({TC}:1747-1750)",
                          valid=["moe_router,moe_preprocess"])
    if not model.is_moe and ("moe" in scope or "moe_router" in scope):
        raise ConfigError(f"cuda_graph_scope={names} on {model.name}, a dense model: the moe scopes need experts "
                          f"({TC}:1751-1755)", valid=["attn", "mlp", "(whole layer)"])
    if model.is_moe:
        if "mlp" in scope and model.first_dense_layers == 0 and model.moe_layer_freq == 1:
            raise ConfigError(f"cuda_graph_scope={names}: mlp graphs dense layers and every layer of {model.name} "
                              f"is an MoE layer ({TC}:1757-1763)", valid=["moe_router", "attn"])
        dropless = rt.moe_capacity_factor is None
        if "moe" in scope and dropless:
            raise ConfigError(f"cuda_graph_scope={names}: the moe graph needs token drop with padding "
                              f"(moe_capacity_factor; {TC}:1764-1770)", valid=["moe_capacity_factor=1.0",
                                                                               "moe_router,moe_preprocess"])
        from cost_models.moe import DISPATCHER_HOST_SYNC, experts_graphed, moe_dispatcher

        if dropless and experts_graphed(rt):  # the moe scope is refused above: a whole layer or iteration here
            what = "whole-iteration" if scope else "whole-layer"
            raise ConfigError(f"cuda_graph_impl={impl} with a {what} graph on dropless MoE layers: the dispatcher "
                              f"syncs host and device in every MoE layer "
                              f"({DISPATCHER_HOST_SYNC[moe_dispatcher(None, rt)]}), which a CUDA graph cannot "
                              f"capture; Megatron states it for the moe scope ({TC}:1764-1770)",
                              valid=["moe_capacity_factor=1.0", _te_scope(impl, ROUTER_GRAPHS)])
    if par.recompute == "full" and scope != ("full_iteration",):
        raise ConfigError(f"cuda_graph_impl={impl} with recompute=full: full recompute runs only under the "
                          f"full_iteration graph ({TC}:1780-1784)", valid=["recompute=selective",
                                                                           "cuda_graph_scope=full_iteration"])
    if (par.recompute == "selective" and impl == "transformer_engine" and "moe_router" in scope
            and "moe" in (par.recompute_modules or ())):
        raise ConfigError(f"cuda_graph_scope={names} with recompute module moe: not with the moe_router graph under "
                          f"transformer_engine ({TC}:1788-1795)", valid=["cuda_graph_scope=attn",
                                                                         "recompute_modules without moe"])
    if par.recompute == "selective":  # graphed recompute takes no random numbers (TC:1797-1819)
        modules = par.recompute_modules if par.recompute_modules is not None else ("core_attn",)  # TC:1193-1194
        whole = not scope or "full_iteration" in scope
        if model.arch.attention_dropout and "core_attn" in modules and (whole or "attn" in scope):
            raise ConfigError(f"cuda_graph_scope={names} with recompute module core_attn and attention_dropout="
                              f"{model.arch.attention_dropout}: attention dropout is not supported with graphed "
                              f"attention recomputation ({TC}:1797-1811)",
                              valid=["recompute_modules without core_attn", "attention_dropout=0",
                                     _te_scope(impl, ("mlp",) if not model.is_moe else ("moe_router",))])
        graphed = [m for m in ("mlp", "moe") if m in modules and (whole or m in scope)]
        if model.arch.hidden_dropout and graphed:
            raise ConfigError(f"cuda_graph_scope={names} with recompute module {graphed[0]} and hidden_dropout="
                              f"{model.arch.hidden_dropout}: hidden dropout is not supported with graphed MLP/MoE "
                              f"recomputation ({TC}:1812-1819)",
                              valid=[f"recompute_modules without {graphed[0]}", "hidden_dropout=0",
                                     _te_scope(impl, ("attn",))])
    if rt.moe_a2a_overlap and (impl != "transformer_engine" or "moe" in scope or "mlp" in scope):
        raise ConfigError(f"moe_a2a_overlap with cuda_graph_impl={impl} scope {names}: the EP overlap takes "
                          f"transformer_engine graphs without the moe or mlp scope ({TC}:1898-1906)",
                          valid=[_te_scope(impl, ROUTER_GRAPHS), "moe_a2a_overlap=false"])


def router_padding_error(job: JobSpec, rt: Runtime) -> ConfigError | None:
    """Why ``moe_router_padding`` (--moe-router-padding-for-quantization) is refused, or None: Megatron-Core pads to
    the fp8 / fp4 alignment and raises without fp8 or fp4 (TC:1621-1625); with token drop and padding to capacity
    every count is the capacity (token_dispatcher.py:485-500), a case autoplan does not price with it; the
    alltoall dispatcher then syncs device and host in its preprocess (token_dispatcher.py:514-520), which Megatron
    asserts the moe_preprocess graph cannot hold (TC:1770-1778). That assertion reads only the deprecated alias
    moe_router_padding_for_fp8, so Megatron-Core lets --moe-router-padding-for-quantization through to a capture that
    syncs: autoplan refuses it before launch."""
    from cost_models.moe import moe_dispatcher

    off = "moe_router_padding=false"
    if job.precision == "bf16":
        return ConfigError("moe_router_padding with precision bf16: the router pads to the fp8 / fp4 GEMM's "
                           f"alignment and Megatron-Core refuses it without fp8 or fp4 ({TC}:1621-1625)",
                           valid=["precision fp8", "precision nvfp4", off])
    if rt.moe_capacity_factor is not None:
        return ConfigError(f"moe_router_padding with moe_capacity_factor={rt.moe_capacity_factor}: drop-and-pad "
                           "already sets every expert's count to its capacity (token_dispatcher.py:485-500); "
                           "autoplan prices router padding on dropless routing only",
                           valid=["moe_capacity_factor unset", off])
    if moe_dispatcher(None, rt) == "alltoall" and "moe_preprocess" in rt.cuda_graph_scope:
        return ConfigError("moe_router_padding with the alltoall dispatcher and cuda_graph_scope moe_preprocess: "
                           "the preprocess syncs to copy the padded counts to the host (token_dispatcher.py:513-520), "
                           "which a CUDA graph cannot capture; Megatron-Core asserts this only for the deprecated "
                           f"--moe-router-padding-for-fp8 ({TC}:1770-1778), so the run would fail at capture",
                           valid=["cuda_graph_scope without moe_preprocess", "moe_dispatcher=hybridep", off])
    return None


# What Megatron-Bridge's dropless MoE recipes graph: attention, router and the dispatcher's preprocess (the
# dispatch and the experts stay eager)
ROUTER_GRAPHS = ("attn", "moe_router", "moe_preprocess")


def _te_scope(impl: str, scope: tuple[str, ...]) -> str:
    """A per-module ``scope`` as a choice valid under ``impl``: per-module scopes are transformer_engine's
    (MLM:1430-1444), so under local the implementation changes with it."""
    pick = f"cuda_graph_scope={','.join(scope)}"
    return pick if impl == "transformer_engine" else f"cuda_graph_impl=transformer_engine {pick}"


def optimizer_bytes(moments: str, fp8_recipe: str | None, fp8_params: bool = False) -> float:
    """Optimizer state per parameter, before distributed-optimizer sharding: fp32 master + Adam m, v (12 B), or
    under the precision-aware optimizer (bf16 moments) the master TE or Megatron holds (module docstring) + 2 + 2:
    TE's int16 remainder only beside bf16 weights that TE's FusedAdam updates (no fp8 weights, no other recipe)."""
    if moments == "fp32":
        return 12.0
    master = "remainder" if fp8_recipe in (None, "delayed") and not fp8_params else "fp32"
    return PRECISION_AWARE_MASTER_BYTES[master] + 2 * DTYPE_BYTES[moments]


def hierarchical_sizes(cp: int) -> list[int]:
    """Inner (all-to-all) group sizes of a2a+p2p on ``cp`` ranks: the proper divisors (1 is p2p, cp is a2a)."""
    return [a for a in range(2, cp) if cp % a == 0]


def default_a2a_size(cp: int, tp: int, cluster: ClusterSpec) -> int | None:
    """The a2a group a user's a2a+p2p without a size gets: the largest that stays inside one NVLink domain (CP
    ranks sit ``tp`` apart: Megatron's tp-cp-ep-dp-pp order; "A2A communications in low-level CP groups (e.g.,
    via NVLink), and P2P communications in high-level CP groups", TC:743), else the smallest."""
    sizes = hierarchical_sizes(cp)
    inside = [a for a in sizes if tp * a <= cluster.nvlink_domain_size]
    return (inside or sizes or [None])[-1 if inside else 0]


def check_cp_comm(model: ModelSpec, par: ParallelConfig, kind: str, cluster: ClusterSpec,
                  a2a_size: int | None = None) -> None:
    """Context-parallel communication types and what they need (TC:732-743, MLM:403-408). Ulysses (a2a, and the
    a2a level of a2a+p2p) splits the query and KV heads a rank holds after TP over its all-to-all group."""
    if kind not in ("a2a+p2p", "a2a"):  # p2p and allgather need nothing of the heads
        return
    heads = model.num_attention_heads // par.tp
    kv = max(1, model.num_kv_heads // par.tp)
    # What the valid lists hold: the settings both rules below accept on this layout
    legal = [a for a in hierarchical_sizes(par.cp) if heads % a == 0 and kv % a == 0]  # a2a+p2p inner sizes
    flat = ["p2p", "allgather"] + (["a2a"] if heads % par.cp == 0 and kv % par.cp == 0 else [])
    if kind == "a2a+p2p":
        if a2a_size is None or a2a_size not in hierarchical_sizes(par.cp):
            raise ConfigError(f"cp_comm_type=a2a+p2p with cp={par.cp}: --hierarchical-context-parallel-sizes "
                              f"a2a p2p must multiply to cp ({MLM}:403-408) with both levels > 1 (cp_a2a_size="
                              f"{a2a_size})", valid=legal or [f"cp_comm_type={k}" for k in flat])
        if heads % a2a_size or kv % a2a_size:
            raise ConfigError(f"cp_comm_type=a2a+p2p with cp_a2a_size={a2a_size}: its all-to-all splits heads over "
                              f"{a2a_size} ranks, and after tp={par.tp} a rank has {heads} query / {kv} KV heads "
                              f"({TE_CP})", valid=legal or [f"cp_comm_type={k}" for k in flat])
    if kind == "a2a":
        if heads % par.cp or kv % par.cp:
            raise ConfigError(f"cp_comm_type=a2a with cp={par.cp}: Ulysses splits heads over CP, and after tp="
                              f"{par.tp} a rank has {heads} query / {kv} KV heads ({TE_CP})",
                              valid=flat + [f"a2a+p2p (cp_a2a_size={a})" for a in legal])


# Hybrid (Mamba) stacks: Megatron-LM's pretrain_mamba.py builds megatron-core's MambaModel / MambaStack.
MIXER = "megatron-core 0.16.1 megatron/core/ssm/mamba_mixer.py"
MAMBA_CP = "megatron-core 0.16.1 megatron/core/ssm/mamba_context_parallel.py"
MAMBA_BLOCK = "megatron-core 0.16.1 megatron/core/ssm/mamba_block.py"


def mamba_layout_error(model: ModelSpec, tp: int, cp: int) -> ConfigError | None:
    """Megatron-Core's Mamba-2 mixer sharding rules: every TP rank holds whole heads and whole B/C groups
    (mamba_mixer.py:250, 258), every CP rank whole heads of its TP shard (mamba_context_parallel.py:99-101), and the
    groups of a TP shard split evenly over CP or are repeated across it (:112-124)."""
    mb = model.mamba
    assert mb is not None
    if mb.num_heads % tp or mb.num_groups % tp:  # the valid tp divide both: the divisors of their gcd
        return ConfigError(f"tp={tp} must divide the Mamba heads ({mb.num_heads}) and groups ({mb.num_groups}) "
                           f"({MIXER}:250, 258)", valid=nearest(tp, divisors(math.gcd(mb.num_heads, mb.num_groups))))
    heads, groups = mb.num_heads // tp, mb.num_groups // tp

    def cp_ok(c: int) -> bool:
        return heads % c == 0 and (c % groups == 0 if groups < c else groups % c == 0)

    if cp > 1 and not cp_ok(cp):
        return ConfigError(f"cp={cp}: each CP rank needs whole Mamba heads of its TP shard ({heads} heads, "
                           f"{groups} groups at tp={tp}) and the groups split evenly or repeated across CP "
                           f"({MAMBA_CP}:99-124)", valid=nearest(cp, [c for c in divisors(heads) if cp_ok(c)]))
    return None


# Gated DeltaNet layers of a transformer stack: megatron-core 0.16.1 GatedDeltaNet inside GPTModel's TransformerBlock.
GDN = "megatron-core 0.16.1 megatron/core/ssm/gated_delta_net.py"
TC = "megatron-core 0.16.1 megatron/core/transformer/transformer_config.py"


def gdn_layout_error(model: ModelSpec, tp: int, cp: int) -> ConfigError | None:
    """TransformerConfig's rules for ``experimental_attention_variant='gated_delta_net'`` (transformer_config.py:
    948-983 @ core_v0.16.1): TP divides the key heads and the value heads (every rank whole heads of both), and no
    context parallelism ("Gated delta net does not support context parallel for now")."""
    g = model.gdn
    assert g is not None
    if g.num_key_heads % tp or g.num_value_heads % tp:  # the valid tp divide both: the divisors of their gcd
        return ConfigError(f"tp={tp} must divide the Gated DeltaNet key heads ({g.num_key_heads}) and value heads "
                           f"({g.num_value_heads}) ({TC}:975-982)",
                           valid=nearest(tp, divisors(math.gcd(g.num_key_heads, g.num_value_heads))))
    if cp > 1:
        return ConfigError(f"cp={cp}: megatron-core 0.16.1's Gated DeltaNet does not support context parallelism "
                           f"({TC}:979-983: 'Gated delta net does not support context parallel for now'; "
                           f"{GDN}:37 leaves its CP module unimported)", valid=["cp=1"])
    return None


def hybrid_pipeline_error(model: ModelSpec, par: ParallelConfig) -> ConfigError | None:
    """MambaStack's pipeline split (mamba_block.py:172-221): no virtual stages, no layout, the embedding / loss not
    counted as layers, and without first/last stage sizes L // pp layers on every stage (the remainder would be
    dropped: refused)."""
    if par.vp > 1:
        return PROFILE.interleave_error(model)
    if par.pipeline_layout is not None or par.account_for_embedding_in_pipeline_split \
            or par.account_for_loss_in_pipeline_split:
        return ConfigError(f"{model.name}: MambaStack splits its layers by count only ({MAMBA_BLOCK}:172-221): no "
                           "pipeline_layout, embedding or loss accounting", valid=["first_stage_layers / "
                                                                                  "last_stage_layers"])
    L = model.num_layers
    if par.first_stage_layers is None and par.last_stage_layers is None and L % par.pp:
        return ConfigError(f"pp={par.pp} must divide num_layers={L}: MambaStack gives every stage L // pp layers "
                           f"({MAMBA_BLOCK}:214-217)", valid=nearest(par.pp, divisors(L)))
    return None


PROFILE = MegatronProfile()


def bf16_layers_error(model: ModelSpec, rt: Runtime, pp: int) -> ConfigError | None:
    """``bf16_layers`` (first_last_layers_bf16) beyond what TransformerConfig accepts: under fp8 each count between 0
    and the decoder layers per pipeline stage, num_layers // pp (TC:993-1017, inside ``if self.fp8``; an NVFP4 run,
    ``fp8_recipe`` "nvfp4", has no such check and get_fp4_context takes any count), or None."""
    if rt.fp8_recipe in (None, "nvfp4"):
        return None
    per_stage = model.num_layers // pp
    if all(n <= per_stage for n in rt.bf16_layers):
        return None
    return ConfigError(f"bf16_layers={list(rt.bf16_layers)}: each count must be between 0 and the layers per pipeline "
                       f"stage, {model.num_layers} // pp {pp} = {per_stage} ({TC}:993-1017)",
                       valid=[f"bf16_layers=[{min(rt.bf16_layers[0], per_stage)}, {min(rt.bf16_layers[1], per_stage)}]"])
