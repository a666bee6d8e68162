"""Memory per GPU (COST_MODEL.md §3), per training framework.

Three numbers, as the tools report them:

* **allocated** — tensors alive at the peak (``torch.cuda.max_memory_allocated``): resident state,
  activations of the micro-batches in flight, and the transients of that moment (the layer being
  recomputed, ZeRO-3/FSDP's gathered units, the loss);
* **reserved** — what PyTorch's caching allocator holds (``max_memory_reserved``, what torchtitan prints):
  allocated plus the allocator's fragmentation, ``ALLOCATOR_RESERVE`` of the activation and transient
  bytes (blocks freed by one micro-batch that the next one's differently sized requests cannot reuse; weights,
  gradients and optimizer states are allocated once and do not churn);
* **device** — what must fit in HBM: allocated, the part of the reserve the allocator cannot give back, the
  CUDA context and NCCL's own buffers (neither goes through the caching allocator). Before raising an
  out-of-memory error the allocator frees its cached blocks and retries (PyTorch c10/cuda/CUDACachingAllocator.cpp
  ``DeviceCachingAllocator::malloc``; ``release_blocks``). With the default allocator only whole cached segments
  go back (``!block->prev && !block->next``): free blocks split off a segment that still holds a live tensor stay
  ("The only remaining 'cached' memory is split from a larger block that is partially in-use", its OOM path), so
  the whole reserve is priced as held. With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
  (``Runtime.expandable_segments``) every free block's pages are unmapped (``unmap_block``), so the reserve is a
  cache the allocator returns under pressure (``allocator_cached``): reported in ``reserved``, not in the device
  peak. What it cannot unmap (a free block's partial pages) is not priced: the memory headroom covers it.

Resident state per parameter a rank holds (the resolved ``cost_models.targets.Runtime`` of the target: the
profile is the one place these facts live):
Megatron-Core keeps bf16 weights (2), fp32 main gradients (4: ``--accumulate-allreduce-grads-in-fp32`` is
forced on for bf16, megatron/training/arguments.py, unless ``--grad-reduce-in-bf16``) and fp32 master + Adam
m, v (12), sharded by the distributed optimizer: ``6 + 12/d`` bytes (Megatron-Core docs,
``dist_optimizer.md``). FSDP2 (torchtitan, plain FSDP2: ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)``) shards fp32 parameters (4), fp32 gradients (4) and Adam m, v (8): ``16/d``, and gathers
bf16 units on the fly. TP, PP and EP divide what a rank holds before ZeRO does; routed-expert weights
(expert-TP 1) shard over the expert-data-parallel group ``tp·cp·dp/ep``, everything else over ``dp·cp``.
The generic ZeRO accounting of Rajbhandari et al. 2020 §5 (``P = 2, G = 2, O = 12``) is
:func:`zero_state_bytes`'s default.

Activations come from the operator graph (``opgraph``: Korthikanti et al. 2022 Table 2) with TP/SP/CP and
recompute; pipeline stages keep micro-batches in flight per schedule (§3): 1F1B stage ``i`` of ``p`` keeps
``min(p − i, m)``; interleaved multiplies stage 0's by ``1 + (p−1)/(p·v)``; ZB-H1 keeps 1F1B's; DualPipe
keeps ``p + 1`` on every rank, which holds two stages (DeepSeek-V3 report Table 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from cost_models.dsa import dsa_fused, unfused_saved_bytes
from cost_models.mamba import cp_a2a_widths
from cost_models.moe import router_padding_share
from cost_models.muon import optimizer_state_bytes
from cost_models.mtp import (mtp_activation_bytes, mtp_block_kinds, mtp_embedding_copy_params,
                             mtp_projection_saved_bytes, mtp_root_params, mtp_stage_params)
from cost_models.opgraph import DECODER_KINDS, LayerGraph, Op, gemm_precision, layer_graph, layer_kind, model_kinds, tp_divisor
from cost_models.quant_layout import op_precision
from cost_models.recompute import drops, is_mla, modules_in_effect
from cost_models.specs import JobSpec, MambaSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import FsdpMtpUnit, Runtime

GIB = 2**30
WEIGHT_BYTES, GRAD_BYTES, OPTIM_BYTES = 2.0, 2.0, 12.0  # ZeRO paper accounting (bf16 weights and grads)
# CUDA context with cuBLAS/cuDNN workspaces: ~0.5 GiB context + ~0.3 GiB of kernels/workspaces on H100 with
# CUDA 12 (nvidia-smi of an idle `torch.cuda.init()` + first GEMM); outside PyTorch's allocator.
CUDA_CONTEXT_GIB = 1.0
# NCCL's own buffers: NCCL_BUFFSIZE 4 MiB × channels (up to 32 on H100) × a few communicators (tp, dp, pp,
# ep): ~0.5 GiB; allocated by NCCL, outside PyTorch's allocator.
COMM_BUFFER_GIB = 0.5
# Caching-allocator fragmentation as a fraction of activation and transient bytes (what max_memory_reserved
# adds to max_memory_allocated; weights and optimizer states are allocated once). Bracketed by the published data
# (`python benchmarks/fidelity.py` prints it: ``fidelity.reserve_fit`` / ``held_reserve_bound``): torchtitan's
# reserved peaks (expandable segments; the only reserved figures) put the MAPE optimum at 0.156, but their
# (measured − allocated) / churn runs from 0.073 (compiled 8B, FSDP only: the best-known allocated peak) to 0.65
# (405B 1F1B), i.e. the optimum absorbs allocated terms the model misses (the compile pairs: same priced peak, 5 GiB
# apart); held with the default allocator, every calibration run that trained fits only up to 0.129. 0.10 lies
# inside both.
ALLOCATOR_RESERVE = 0.10


def held_reserve_fraction(runtime: Runtime) -> float:
    """The part of the allocator reserve (a fraction of the activation and transient bytes) that counts against
    HBM: all of it with PyTorch's default allocator, none with expandable segments (module docstring)."""
    return 0.0 if runtime.expandable_segments else ALLOCATOR_RESERVE


# What memory is priced with when no runtime is given: Megatron-Core's defaults (fp32 main grads, distributed
# optimizer). Every fact per framework lives in its target profile (``cost_models.targets``: ``Runtime``).
DEFAULT_RUNTIME = Runtime(target="megatron")
# Bytes per vocabulary entry the operator graph's loss saves (opgraph: Megatron's bf16 logits + fp32 softmax).
GRAPH_LOSS_BYTES_PER_LOGIT = 6.0
# Outputs of the layer's norms (opgraph names): recomputed, not kept, under the "cheap" policy.
_NORM_OUTPUTS = frozenset({"attn_in", "mlp_in", "q_c", "kv_c", "head_in"})
# The attention core's output (opgraph name), input of the output projection. Flash-style kernels save it for their
# backward (Transformer Engine FusedAttnFunc.forward saves ``out`` beside q, k, v: its backward needs rowsum(dO*O)),
# so it is the same storage as the projection's saved bf16 input; under Transformer Engine fp8 the projection saves
# its own fp8 cast instead (``runtime.fp8_saved_bytes``) and the bf16 output stays saved by the core as well
# (unless the core is recomputed: Megatron's selective ``core_attn``).
_ATTN_OUTPUTS = frozenset({"ctx"})


def zero_state_bytes(params: float, zero_stage: int, shard_group: int,
                     bytes_per_param: tuple[float, float, float] = (WEIGHT_BYTES, GRAD_BYTES, OPTIM_BYTES),
                     ) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes for ``params`` held by a rank under ZeRO over ``shard_group``:
    ``M0 = P+G+O``, ``M1 = P+G+O/R``, ``M2 = P+(G+O)/R``, ``M3 = (P+G+O)/R``."""
    r = max(1, shard_group)
    pw, gw, ow = bytes_per_param
    p, g, o = pw * params, gw * params, ow * params
    if zero_stage == 0:
        return p, g, o
    if zero_stage == 1:
        return p, g, o / r
    if zero_stage == 2:
        return p, g / r, o / r
    return p / r, g / r, o / r


def fsdp_units(rt: Runtime, zero_stage: int) -> bool:
    """Whether the runtime runs the stage's parameters as torch FSDP2 units (gathered per unit, gradients
    reduce-scattered per unit): ZeRO-3, and the ZeRO-0 a runtime runs as FSDP2 over one-rank shards
    (``Runtime.zero0_fsdp2``), whose units are gathered and reduced as ZeRO-3's at a shard group of 1."""
    return zero_stage == 3 or (zero_stage == 0 and rt.zero0_fsdp2)


def pp_unsharded_stage(rt: Runtime, zero_stage: int, pp: int) -> bool:
    """Whether a pipeline stage holds its parameters unsharded through the step with their gradient accumulators
    (``rt.pp_unsharded_bytes``; their time ``rt.pp_grad_accumulation_bytes``): torch FSDP2 under torch's pipelining,
    which turns resharding after backward and gradient sync off for every micro-batch (stage.py:844-848), at ZeRO-3
    and at the ZeRO-0 a runtime runs as FSDP2 over one-rank shards (``Runtime.zero0_fsdp2``)."""
    return pp > 1 and fsdp_units(rt, zero_stage)


def reduce_input_bytes(rt: Runtime) -> float:
    """Bytes per parameter of FSDP2's reduce-scatter input (the unsharded gradient copied into the reduce dtype,
    _fsdp_collectives.py:597-606): what ``rt.gathered_unit_bytes`` adds beyond a unit's 6 B of gathered weight,
    gradient and prefetch (``targets.common.fsdp2_gathered_unit_bytes``)."""
    return rt.gathered_unit_bytes - 6.0


def zero3_transient_bytes(rt: Runtime, group: int, pp: int) -> tuple[float, float]:
    """ZeRO-3/FSDP bytes beyond the shards, as (per parameter of the stage, per parameter of its largest layer).
    The gathered units (``rt.gathered_unit_bytes`` of the largest layer); under pipelining what the runtime keeps
    unsharded through the step (``rt.pp_unsharded_bytes``), beside which a unit adds only its new bf16 gradient
    (before ``FSDPParam.accumulate_unsharded_grad_if_needed`` folds it in) and the reduce-scatter input
    (``reduce_input_bytes``; ``foreach_reduce`` frees the accumulated gradient after copying it in,
    _fsdp_collectives.py:603-606; tests/test_fsdp2_pipelining_sync.py counts one gather and one reduce per unit and
    step); otherwise FSDP2's ``reshard_after_forward``
    (``fully_shard`` docstring): True frees each unit after forward, False keeps the stage's gathered bf16
    parameters until backward, an int ``r`` keeps ``1/r`` of them. All are buffers of their own beside the rank's
    shards, whatever the shard group (``group``, 1 included): FSDP2 all-gathers into a full-size output it allocates
    (``FSDPParam.init_all_gather_outputs``; at a shard group of 1 ``FSDPParamGroup.wait_for_unshard`` copies the
    shard into it, torch 2.13 _fsdp_param_group.py:437-455) and reduce-scatters from a full-size input
    (``reduce_input_bytes``); tests/test_fsdp2_buffers.py checks both on torch's code."""
    group = max(1, group)
    r = rt.reshard_after_forward
    if pp > 1 and rt.pp_unsharded_bytes:  # the stage gathered and its accumulators held already: per unit, its new
        # bf16 gradient and (last micro-batch) the reduce-scatter input the accumulated one is copied into
        return rt.pp_unsharded_bytes, 2.0 + reduce_input_bytes(rt)
    if pp > 1:
        return 0.0, rt.gathered_unit_bytes
    if r is True:
        return 0.0, rt.gathered_unit_bytes
    if r is False:
        return rt.gather_bytes, rt.gathered_unit_bytes
    # an int equal to the shard group is True (torch 2.13 _fsdp_init.py:181-182 ``_get_post_forward_mesh_info``)
    return (0.0 if int(r) >= group else rt.gather_bytes / int(r)), rt.gathered_unit_bytes


def zero3_head_unit_bytes(rt: Runtime, model: ModelSpec, tp: int, largest: Any, group: int,
                          root_layers: float = 0.0, root_grad_excess: float = 0.0) -> Any:
    """Bytes torch FSDP2's output-layer, embedding and root units add at the activation peak (the end of the forward
    and the start of the backward) to the decoder layers' gathered units (``rt.gathered_unit_bytes`` × the largest
    layer), on the one stage of a ZeRO-3 run without pipelining (with pp > 1 the whole stage stays unsharded:
    ``rt.pp_unsharded_bytes``). Buffers of their own beside the rank's shards, as ``zero3_transient_bytes``;
    ``largest`` may be an array.

    - ``rt.fsdp_head_unit == "own"`` (torchtitan 0.3.0 distributed/fsdp.py:193-207: ``fully_shard(tok_embeddings)``,
      ``fully_shard([norm, lm_head])``; Megatron-LM torch_fully_sharded_data_parallel.py:60-65, 127-143 @ core_v0.16.1:
      LanguageModelEmbedding and the output ColumnParallelLinear): the embedding unit is resharded after its forward
      and comes back only at the end of the backward, when the activations are gone. The output unit is the first of
      the backward (torch 2.13 _fully_shard/_fsdp_param_group.py ``post_backward``: reshard, then ``foreach_reduce``
      copies the unsharded gradient into a reduce-dtype reduce-scatter input, _fsdp_collectives.py:597-606, which
      stays until the next unit's post-backward, l. 639-658): its weight and gradient beside the prefetched last
      layer (4·O + 2·L), then the gradient and the reduce-scatter input (2·O + r·O + 2·L), then the last layer's
      backward beside that input (r·O + 6·L), r = ``gathered_unit_bytes`` − 6 (what a steady-state layer adds to
      its 6 B of weight, gradient and prefetch). What exceeds the layers' ``g·L`` is added. A tied weight
      (torchtitan ``fully_shard([tok_embeddings, norm, lm_head])``, not resharded after forward, l. 180-192) is held
      as the root is.
    - ``"root"`` (torchtitan before 83e6941, 2025-07-28: ``fully_shard(model)`` holds embedding, norm and output;
      the fsdp2 target's emitted ``apply_fsdp``): FSDP2 does not reshard the root after forward (``_lazy_init``; with
      an explicit True or int the root's post-forward reshards it and its pre-backward gathers it again) and, its inputs being
      token ids, runs its post-backward in the final callback (_fsdp_state.py:395-425): the gathered embedding,
      norm and output (2 B each) and the output layer's unsharded gradient (2 B) stay through the backward.

    Plus the MTP modules' projection and norms where the root holds them (``rt.fsdp_mtp_unit == "root"``, Megatron-LM
    --use-torch-fsdp2, the megatron profile's doc; their block layers are the units ``largest`` counts): gathered
    (``rt.gather_bytes``) through the forward and again from the start of the backward, as the root above. Their
    unsharded gradients (kept to the final callback) come after the MTP block's backward has freed its activations,
    past the peak: not counted.

    Plus the decoder layers the root holds (``rt.fsdp_root_kinds``; ``root_layers``: their parameters on the rank,
    ``StageParams.root_held``): gathered (``rt.gather_bytes``) as the root above; their unsharded gradients
    (reduced in the root's post-backward, the final callback, _fsdp_state.py:395-425) grow through the backward as
    the activations shrink: what they add above the activation peak is the caller's ``root_grad_excess``
    (``root_grad_excess_bytes``)."""
    group = max(1, group)
    out_w = model.vocab_size * model.hidden_size / tp  # the output projection's weight (the tied one when tied)
    head = model.head_params / tp  # output projection + final norm (the norm alone when tied)
    # An explicit reshard_after_forward frees the root after forward (True) or keeps 1/r of it (an int r, whose
    # 1/r zero3_transient_bytes counts) and gathers it whole again for backward (torch 2.13 _fully_shard.py:246,
    # _fsdp_state.py:205-207); False keeps it gathered, already counted there.
    r = rt.reshard_after_forward
    regathered = 0.0 if r is False else 1.0 if r is True or int(r) >= group else 1 - 1 / int(r)
    root_mtp = rt.gather_bytes * (mtp_root_params(model, tp, rt.fsdp_mtp_unit) + root_layers) * regathered \
        + root_grad_excess
    if rt.fsdp_head_unit == "root" or model.tied_embeddings:
        return 2.0 * (model.embedding_params / tp + head) * regathered + 2.0 * out_w + root_mtp
    g = rt.gathered_unit_bytes
    r = reduce_input_bytes(rt)
    big = np.asarray(largest, dtype=float)
    peak = np.maximum.reduce([4.0 * head + 2.0 * big, (r + 2.0) * head + 2.0 * big, r * head + 6.0 * big])
    out = np.maximum(peak - g * big, 0.0) + root_mtp
    return float(out) if out.ndim == 0 else out  # type: ignore[return-value]


def root_grad_excess_bytes(layer_acts: Sequence[float], layer_root_params: Sequence[float], head_act: float,
                           reduce_bytes: float) -> float:
    """What the unsharded gradients of the decoder layers a ZeRO-3 root unit holds (``Runtime.fsdp_root_kinds``)
    add above the activation peak of one micro-batch (pp 1), walking its backward: the head's activations are freed
    first; then, layer by layer from the last, a root layer's bf16 gradient (2 B per parameter, a buffer of its own
    beside the sharded gradients, as ``zero3_transient_bytes``) is whole while its activations are still held, and each
    layer's activations (``layer_acts``, in layer order) are freed after its backward; in the final callback the
    root's post-backward copies all of them into the ``reduce_bytes`` reduce-scatter input (torch 2.13
    _fsdp_state.py:395-425, _fsdp_collectives.py:597-606). The largest excess over the start of the backward, or 0:
    the activations a Mamba layer frees usually outweigh its gradients, so the peak stays where it was."""
    excess, peak, grads = -head_act, 0.0, 0.0
    for a, p in zip(reversed(layer_acts), reversed(layer_root_params)):
        g = 2.0 * p
        peak = max(peak, excess + g)
        excess += g - a
        grads += p
    return max(peak, excess + reduce_bytes * grads)


def sharded_grad_transient_bytes(rt: Runtime, layer_params: Any, n_layers: Any, vp: int) -> Any:
    """Gradients held unsharded during one model chunk's backward when gradients are sharded and reduced in every
    micro-batch (``rt.grad_reduce_every_microbatch``: Megatron-FSDP ``optim_grads``; the profile cites the code):
    a chunk of an interleaved pipeline (vp > 1) is one bucket, its whole gradient (``ceil(n/vp)`` of the rank's
    ``n`` layers); a bucketed chunk (vp = 1) holds at most ``rt.grad_bucket_cap`` elements in flight. In
    ``rt.grad_bytes`` (fp32 main gradients unless reduced in bf16). ``layer_params``: the rank's decoder-layer
    parameters of its stage (embedding and head not counted)."""
    if not rt.grad_reduce_every_microbatch:
        return 0.0
    n, p = np.asarray(n_layers, dtype=float), np.asarray(layer_params, dtype=float)
    held = p * np.ceil(n / vp) / np.maximum(n, 1.0) if vp > 1 else np.minimum(p, rt.grad_bucket_cap)
    out = np.where(n > 0, rt.grad_bytes * held, 0.0)  # also on arrays (the search's table of layer ranges)
    return float(out) if out.ndim == 0 else out  # type: ignore[return-value]


@dataclass(frozen=True)
class StageParams:
    """Parameters one rank of a pipeline stage holds, split by how ZeRO shards them."""

    dense: float  # sharded over dp·cp (or the HSDP group)
    expert: float  # sharded over the expert-data-parallel group tp·cp·dp/ep
    largest_layer: float  # for ZeRO-3's gathered + prefetched units
    # of ``dense``: the embedding, output layer + final norm, a tied weight's or the MTP modules' embedding copy.
    # Megatron-Core runs them outside Transformer Engine's linears (VocabParallelEmbedding; the output layer is its own
    # ColumnParallelLinear, megatron/core/models/gpt/gpt_model.py:241 @ core_v0.16.1), so TE caches no quantized copy
    # of them (``Runtime.weight_cache_bytes``).
    outside_te: float = 0.0
    # of ``dense + expert``: the decoder layers of a kind the ZeRO-3 wrapper leaves in the root unit
    # (``Runtime.fsdp_root_kinds``), not counted in ``largest_layer``
    root_held: float = 0.0


def layer_rank_params(model: ModelSpec, par: ParallelConfig, i: int) -> tuple[float, float]:
    """(dense, expert) parameters of decoder layer ``i`` one rank holds: dense ÷ tp but the norms (+ a latent MoE's
    projections) and, with tp > num_kv_heads under kv_replication 'replicate', the K/V weights, on every TP rank;
    experts ÷ ep (expert TP = 1: experts are not split by tp)."""
    ex = model.layer_expert_params(i)
    whole = model.layer_unsplit_params(i)
    d = (model.layer_params(i) - ex - whole) / par.tp + whole \
        + model.layer_kv_whole_extra(i, par.tp, model.kv_replicated(par))
    return d, ex / par.ep


def root_layer_params(model: ModelSpec, par: ParallelConfig, layer_ids: Sequence[int],
                      root_kinds: frozenset[str]) -> list[float]:
    """Per layer of ``layer_ids``: its parameters on the rank where the ZeRO-3 root unit holds it, else 0."""
    return [sum(layer_rank_params(model, par, i)) if layer_kind(model, i) in root_kinds else 0.0 for i in layer_ids]


def stage_params(model: ModelSpec, par: ParallelConfig, layer_ids: Sequence[int], *, first: bool,
                 last: bool, mtp: bool | None = None, mtp_unit: FsdpMtpUnit = "module",
                 root_kinds: frozenset[str] = frozenset()) -> StageParams:
    """What one rank of a stage holding decoder layers ``layer_ids`` (+ embedding if ``first``, head if ``last``, the
    MTP modules if ``mtp``: default ``last``; an explicit pipeline layout may put them on another stage) holds;
    ``mtp_unit``: the runtime's ``fsdp_mtp_unit``, for the MTP modules' ZeRO-3 unit (``mtp_stage_params``);
    ``root_kinds``: its ``fsdp_root_kinds``, layers held by the root unit rather than their own (``root_held``)."""
    t, e = par.tp, par.ep
    dense = expert = largest = root = 0.0
    for i in layer_ids:
        d, ex = layer_rank_params(model, par, i)
        dense += d
        expert += ex
        if root_kinds and layer_kind(model, i) in root_kinds:
            root += d + ex
        else:
            largest = max(largest, d + ex)
    body = dense  # decoder layers (+ the MTP modules below): what TE's linears hold
    if first:
        dense += model.embedding_params / t
    if last:
        dense += model.head_params / t  # output projection (0 when tied) + final norm
        if model.tied_embeddings and par.pp > 1:  # the last stage keeps its own copy of the tied weight
            dense += model.vocab_size * model.hidden_size / t
    if last if mtp is None else mtp:  # the MTP modules (cost_models.mtp), and the embedding copy they need there
        mtp_dense, mtp_expert, mtp_largest = mtp_stage_params(model, t, e, mtp_unit)
        dense, expert, largest = dense + mtp_dense, expert + mtp_expert, max(largest, mtp_largest)
        body += mtp_dense
        if not first:
            dense += mtp_embedding_copy_params(model, t, par.pp, par.schedule, on_last=last)
    return StageParams(dense, expert, largest, dense - body, root)


def expert_data_parallel_size(tp: int, cp: int, dp: int, ep: int) -> int:
    """Ranks holding the same routed-expert shard. With expert-TP 1, Megatron's MoE parallel folding re-cuts the
    ``tp·cp·dp`` ranks of a stage as ``ep × edp`` (Megatron-Core ``expert_tensor_parallel_size=1``)."""
    return max(1, tp * cp * dp // ep)


def hsdp_replicas(dp_cp: int, hsdp: int | None) -> int:
    """Copies of each ZeRO shard when the state is sharded in groups of ``hsdp`` < dp*cp ranks: Megatron's
    distributed-optimizer instances (``--num-distributed-optimizer-instances`` = dp*cp/hsdp, zero 1;
    megatron/core/parallel_state.py:838-840 @ core_v0.16.1) or torchtitan's / FSDP2's ``dp_replicate`` (zero 3;
    torchtitan 0.3.0 distributed/parallel_dims.py build_mesh). 1: one shard group spans dp*cp."""
    return dp_cp // hsdp if hsdp and hsdp < dp_cp else 1


def expert_shard_group(tp: int, cp: int, dp: int, ep: int, zero_stage: int, hsdp: int | None) -> int:
    """Ranks the routed experts' ZeRO state is sharded over (and their gradients reduce-scattered in): the expert
    data-parallel group, split into the ``hsdp_replicas`` copies when sharded in groups — under zero 1 Megatron's
    ``intra_partial_expert_data_parallel_size`` = edp / instances (megatron/core/parallel_state.py:1263-1268 @
    core_v0.16.1), under zero 3 torchtitan's ``efsdp`` = dp_shard*cp*tp/ep of the sparse mesh
    (dp_replicate, efsdp, ep), experts fully_shard on ["dp_replicate", "efsdp"] (torchtitan @ b5bcd76
    distributed/parallel_dims.py:280-282, 326-329; models/qwen3/parallelize.py:77-83): the same tp*dp*cp/ep /
    (dp*cp/hsdp)."""
    edp = expert_data_parallel_size(tp, cp, dp, ep)
    if zero_stage in (1, 3):
        return max(1, edp // hsdp_replicas(dp * cp, hsdp))
    return edp


def fsdp_unit_groups(zero_stage: int, tp: int, cp: int, dp: int, ep: int, hsdp: int | None) -> tuple[int, int]:
    """(dense, expert) shard groups of a stage's torch FSDP2 units (``fsdp_units``): ZeRO-3's (the HSDP group or
    dp·cp; ``expert_shard_group``), one rank each at the ZeRO-0 a runtime runs as FSDP2 over one-rank shards."""
    if zero_stage != 3:
        return 1, 1
    return hsdp or dp * cp, expert_shard_group(tp, cp, dp, ep, zero_stage, hsdp)


def op_sac_saved(graph: LayerGraph, saves_attention: bool = True) -> set[tuple[str, str]]:
    """(op, tensor) pairs torchtitan's per-op selective AC keeps: the outputs of the attention core and of every
    other ``aten.mm`` (torchtitan/models/llama3/infra/parallelize.py ``_save_list`` and the ``mm_count % 2`` rule);
    everything else is recomputed from them and the block input.

    The count runs over the layer's ``nn.Linear`` matmuls in forward order but the MoE router's gate: a matmul of a
    shape in ``force_recompute_mm_shapes_by_fqns`` (default ``["moe.router.gate"]``) is recomputed before it is
    counted (0.3.0 distributed/activation_checkpoint.py:196-198, 260-267; f738a03^ models/llama3/infra/
    parallelize.py:300-304); the routed experts' ``torch._grouped_mm`` is in no save list, so it neither counts nor is kept:
    the backward re-runs all three expert GEMMs (deepseek_v3/infra/parallelize.py ``_save_list`` @ f738a03^: mm, the
    SDPA kernels, reduce_scatter, max; torchtitan 0.3.0 distributed/activation_checkpoint.py:31-70 adds linear,
    flex_attention, topk, all_to_all_single, never ``_grouped_mm``). MLA's key and value up-projection is one
    ``wkv_b`` matmul (deepseek_v3/model/model.py ``Attention``): the graph's ``k_proj`` / ``v_proj`` pair counts once,
    both kept or both recomputed. ``saves_attention`` False (``Runtime.sac_saves_attention``: torchtitan before
    b39377f9f running SDPA on cuDNN, whose op is not in the list): the attention output is recomputed, not kept."""
    keep: set[tuple[str, str]] = set()
    mm = 0
    mla = any(op.name == "kv_down" for op in graph.ops)
    for op in graph.ops:
        if op.kind == "matmul":
            if not (mla and op.name == "v_proj"):  # wkv_b: counted with k_proj
                mm += 1
            if mm % 2 == 1:
                keep.add((op.name, op.output))
        elif op.kind == "attention" and saves_attention:
            keep.add((op.name, op.output))
    return keep


def unread_by_backward(graph: LayerGraph, kept: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Of ``kept``, the outputs only a residual add consumes: the add's backward reads neither input, so nothing in
    the backward needs them. Eager per-op SAC caches them anyway (every MUST_SAVE output, the MLP's down projection
    among them: torch/utils/checkpoint.py ``_CachingTorchDispatchMode``); under torch.compile AOTAutograd's min-cut
    partitioner saves only what the backward graph reads, so a compiled block drops them. Measured on CPU (torch
    2.13, torchtitan 0.3.0's Llama 3 block under its op-SAC policy, saved_tensors_hooks around the eager and the
    ``torch.compile(backend="inductor")`` forward): eager 8d + 2kv + 2f + 4H bytes per token, compiled 6d + 2kv + 2f +
    4H, the difference exactly the down projection's [tokens, d] bf16 output."""
    consumers: dict[str, list[Op]] = {}
    for op in graph.ops:
        for name in op.inputs:
            consumers.setdefault(name, []).append(op)
    return {(o, t) for o, t in kept if consumers.get(t) and all(c.name.endswith("_residual") for c in consumers[t])}


def activation_bytes_per_microbatch(graph: LayerGraph, model: ModelSpec, job: JobSpec, par: ParallelConfig,
                                    runtime: Runtime = DEFAULT_RUNTIME) -> float:
    """Bytes one layer saves for backward for one micro-batch on one rank (Korthikanti Table 2 generalised).

    ``tp``-split tensors ÷ t; ``seq``-split tensors ÷ t only with sequence parallelism; everything ÷ cp.
    Selective recompute: Megatron drops the attention core's score-sized tensors (the ``5·a·s/h`` term);
    torchtitan's per-op AC keeps the block input and the outputs :func:`op_sac_saved` names. Full
    recompute keeps only the layer input (÷ t with SP). The loss keeps ``runtime.loss_bytes_per_logit``
    per vocabulary entry (÷ t: vocab-parallel)."""
    if par.recompute == "full" and graph.kind in DECODER_KINDS:
        return recompute_input_bytes(model, job, par)
    if par.recompute == "selective" and runtime.selective == "op_sac" and graph.kind in DECODER_KINDS:
        t = par.tp
        sp = par.sequence_parallel and t > 1
        total = recompute_input_bytes(model, job, par)  # the block input
        tokens = par.micro_batch_size * job.seq_len / par.cp
        kept = op_sac_saved(graph, runtime.sac_saves_attention)
        if runtime.model_compiled:  # AOTAutograd saves only what the backward reads (unread_by_backward)
            kept -= unread_by_backward(graph, kept)
        for op_name, tensor in sorted(kept):
            op = graph.op(op_name)
            ten = graph.tensors[tensor]
            split_tp = ten.dim_kind in ("q", "kv", "ffn", "vocab") or (op.kind != "experts" and sp)
            total += ten.width * 2.0 * op.tokens_factor * tokens / (tp_divisor(t, ten.heads) if split_tp else 1)
        return total
    rows = 1.0 + router_padding_share(model, job, par, None, runtime)  # the router's padded copies, saved too
    return sum(op_activation_bytes(op, job, par, runtime, graph, model.mamba, rows) for op in graph.ops) \
        + dsa_unfused_activation_bytes(graph, model, job, par, runtime)


def dsa_unfused_activation_bytes(graph: LayerGraph, model: ModelSpec, job: JobSpec, par: ParallelConfig,
                                 runtime: Runtime) -> float:
    """The score-sized tensors Megatron-Core's unfused DSA saves (``cost_models.dsa.unfused_saved_bytes``), unless
    selective recompute re-runs the core attention (DSAttention is the MLA's core_attention: Megatron's ``core_attn``
    module, or plain selective recompute, checkpoints the indexer and the loss with it)."""
    return sum(dsa_unfused_op_bytes(op, graph, model, job, par, runtime) for op in graph.ops)


def dsa_unfused_op_bytes(op: Op, graph: LayerGraph, model: ModelSpec, job: JobSpec, par: ParallelConfig,
                         runtime: Runtime | None = DEFAULT_RUNTIME) -> float:
    """``op``'s share of ``dsa_unfused_activation_bytes`` (no full recompute: that keeps only the layer input): what
    the search's per-op memory adds to ``op_activation_bytes`` (search/strategies.py, with ``dsa.dsa_path_runtime``),
    so its layer sums to ``activation_bytes_per_microbatch``."""
    if model.dsa is None or dsa_fused(runtime) or graph.kind not in DECODER_KINDS:
        return 0.0
    modules = modules_in_effect(par, runtime)
    if par.recompute == "selective" and (modules is None or "core_attn" in modules):
        return 0.0
    return unfused_saved_bytes(op, graph, model, job, par)


# Selective modules whose checkpoint wraps a whole block (cost_models.recompute): ``mlp`` and ``shared_experts``
# (tensor_parallel.checkpoint / te_checkpoint) and ``moe`` (the whole MoE layer, moe_layer.py:694-708 @ core_v0.19.0).
_BLOCK_MODULES = frozenset({"mlp", "moe", "shared_experts"})


def block_recompute_transient_bytes(model: ModelSpec, job: JobSpec, par: ParallelConfig,
                                    graphs: dict[str, LayerGraph], runtime: Runtime, kinds: set[str]) -> float:
    """What one layer's backward holds beyond its kept activations while a block-wide selective checkpoint (``mlp``,
    ``moe``, ``shared_experts``) re-runs: ``CheckpointFunction.backward`` runs the block's forward again with grad
    enabled and backpropagates through it (megatron/core/tensor_parallel/random.py ``CheckpointFunction.backward`` @
    core_v0.19.0), so every tensor the block saves exists at once for that one layer and micro-batch (for ``moe``:
    the dispatched tokens, the experts' fc1 output, padded to capacity under drop-and-pad), as under full recompute
    (``stage_memory``'s transient). The finer modules inside the block (``moe_act``, ``layernorm``) still discard
    theirs. The largest over the stage's layer kinds; 0 without such a module."""
    modules = modules_in_effect(par, runtime)
    if modules is None or not modules & _BLOCK_MODULES:
        return 0.0
    rest = tuple(m for m in (par.recompute_modules or ()) if m not in _BLOCK_MODULES)
    rerun = par.model_copy(update={"recompute_modules": rest})  # model_copy: an empty tuple stays "selective"
    return max((activation_bytes_per_microbatch(graphs[k], model, job, rerun, runtime)
                - activation_bytes_per_microbatch(graphs[k], model, job, par, runtime)
                for k in kinds if k in graphs), default=0.0)


def recompute_input_bytes(model: ModelSpec, job: JobSpec, par: ParallelConfig) -> float:
    """What a layer keeps under full recompute: its bf16 input, ÷ cp, ÷ t with sequence parallelism."""
    sp = par.sequence_parallel and par.tp > 1
    return 2.0 * model.hidden_size * par.micro_batch_size * job.seq_len / par.cp / (par.tp if sp else 1)


def op_activation_bytes(op: Op, job: JobSpec, par: ParallelConfig, runtime: Runtime = DEFAULT_RUNTIME,
                        graph: LayerGraph | None = None, mamba: MambaSpec | None = None,
                        routed_rows: float = 1.0) -> float:
    """Bytes one op saves for backward for one micro-batch on one rank, sharded as ``par`` says (no full
    recompute: that keeps only the layer input, ``recompute_input_bytes``). The loss holds the runtime's
    bytes per logit (the graph's saved logits are Megatron's 2 + 4); under fp8 a GEMM's saved input takes the
    runtime's ``fp8_saved_bytes`` per element. ``mamba``: the Mamba-2 scan's saved ``zxbcdt`` is the tensor after
    megatron-core's CP all-to-all, B and C repeated (``mamba.cp_a2a_widths``; = in_proj_width / t without CP).
    ``routed_rows``: routed token copies per routed copy the experts run (``moe.router_padding_share`` + 1).

    TE's padding copies around Megatron-Core's quantized experts (``moe.quantization_padded``) add nothing here:
    ``_Fp8Padding`` / ``_Fp8Unpadding`` keep only the split lists for backward (ctx.m_splits, ctx.padded_m_splits:
    transformer_engine/pytorch/module/fp8_padding.py:41-44, fp8_unpadding.py:40-43 @ 001b2b1e), and the padded
    tensor fc1 saves is its own quantized input, counted as that (under align rows more per local expert, left out)."""
    t = par.tp
    sp = par.sequence_parallel and t > 1
    tokens = par.micro_batch_size * job.seq_len / par.cp
    # TE saves its cast (a recipe's bf16 module: its bf16 input; quant_layout.op_precision)
    quantized = (op_precision(op, graph, job.precision, runtime) if graph is not None
                 else gemm_precision(op, job.precision)) in ("fp8", "nvfp4", "mxfp8")
    fp8 = job.precision == "fp8"
    total = 0.0
    cheap = par.recompute == "selective" and runtime.selective == "cheap"
    modules = modules_in_effect(par, runtime)  # Megatron's selective modules (cost_models.recompute)
    graph_kind = graph.kind if graph is not None else "dense"
    mla = graph is not None and is_mla(graph)
    for s in op.saved:
        if modules is not None and drops(op, s.tensor, graph_kind, modules, mla):
            continue
        if cheap and op.kind == "attention" and s.tensor not in op.inputs:
            continue
        if cheap and (s.tensor in _NORM_OUTPUTS or op.kind == "attention"):
            continue  # recomputed: norm outputs; q, k, v from MLA's saved latents (the up-projections)
        if cheap and op.kind in ("matmul", "experts") and s.tensor.endswith("_act"):
            continue  # SwiGLU output: recomputed from its cached input
        if op.kind == "ssm" and mamba is not None and s.tensor in op.inputs:  # zxbcdt as the scan saves it
            total += 2.0 * cp_a2a_widths(mamba, t, par.cp)[0] * tokens
            continue
        div = (tp_divisor(t, s.heads) if s.split == "tp" else t) if (s.split == "tp" or sp) else 1
        if op.kind == "indexer":
            div = 1  # DSA's indexer runs whole on every TP rank, on the sequence gathered under SP (dsa.py:557-559)
        b = s.bytes_per_token
        if op.kind in ("experts", "dispatch", "combine") or s.tensor.startswith("expert_"):
            div = t if sp else 1  # expert TP = 1: tokens, not features, are split across TP ranks
            b *= routed_rows if op.tokens_factor > 1 else 1.0  # the router's padded copies (routed ops only)
            if runtime.moe_capacity_factor is not None and op.tokens_factor > 1:
                # drop-and-pad: every rank's experts receive ceil(T·k/E·c) rows from each source rank, padding
                # included (moe.moe_load_imbalance; token_dispatcher.py:1105-1119 _HybridEPManager.setup_metadata
                # ``num_permuted_tokens = capacity · ep · local experts`` @ core_v0.19.0): c × the routed copies
                b *= runtime.moe_capacity_factor
        if op.kind == "loss":
            b *= runtime.loss_bytes_per_logit / GRAPH_LOSS_BYTES_PER_LOGIT
        elif quantized and op.kind in ("matmul", "experts") and s.tensor in op.inputs:
            core_saves = par.recompute == "none" or (modules is not None and "core_attn" not in modules)
            kept_by_core = s.tensor in _ATTN_OUTPUTS and runtime.fp8_saved_bytes < 2.0 and core_saves
            b *= (runtime.fp8_saved_bytes + (2.0 if kept_by_core else 0.0)) / 2.0
        elif cheap and fp8 and op.kind == "elementwise" and op.name.endswith("act"):
            b *= runtime.fp8_saved_bytes / 2.0  # SwiGLU input cached in fp8
        if op.clamped and runtime.mcore_expert_glue and op.name.startswith("expert_") \
                and not runtime.moe_fused_grouped_mlp \
                and not (modules is not None and "moe_act" in modules):
            b *= 2.0  # Megatron-Core's eager clamp keeps the fc1 output and the fused activation its clamped copy
            # (fusions/fused_bias_geglu.py:424-440; op_traffic.MCORE_EXPERT_CLAMP_BYTES); under ``moe_act`` the
            # checkpoint keeps only the fc1 output. The fused grouped MLP saves what the graph does: the fc1 output
            # (bf16 ``c_tensor``, the act's saved inputs), the probs and fc1's / fc2's inputs columnwise MXFP8
            # (TE ops/fused/grouped_mlp.py @ d0067d0 :1746-1806 ``save_for_backward``: rowwise data dropped, as the
            # unfused TE GroupedLinear keeps for its wgrad: fp8_saved_bytes), and no clamped copy (clamp in the epilogue)
        total += b * tokens / div
    return total


def interleaved_warmup(stage: int, pp: int, vp: int, m: int, group: int | None = None) -> int:
    """Forward chunk-micro-batches rank ``stage`` runs before its first backward under Megatron's interleaved
    1F1B: megatron-core 0.16.1 ``pipeline_parallel/schedules.py`` ``get_pp_rank_microbatches`` (l. 758-787):
    ``2·(pp − rank − 1) + (vp − 1)·group``, capped at all ``m·vp`` chunk-micro-batches; ``group`` =
    ``microbatch_group_size_per_vp_stage``, default ``pp`` (``model_parallel_config.py`` l. 447)."""
    g = pp if group is None else group
    return min(2 * (pp - stage - 1) + (vp - 1) * g, m * vp)


def inflight_microbatches(stage: int, par: ParallelConfig, m: int) -> float:
    """Micro-batches of activations (in units of the stage's whole layer set) stage ``stage`` holds at its peak.

    1F1B: ``min(pp − stage, m)`` (warmup ``pp − stage − 1`` forwards, then one more before each backward).
    Interleaved: the warmup of :func:`interleaved_warmup` plus the steady state's one forward before its backward,
    at most all ``m·vp`` chunk-micro-batches, each ``1/vp`` of the stage's layers: stage 0 holds
    ``pp + (pp − 1)/vp`` (Korthikanti et al. 2022's ``pp·(1 + (pp−1)/(pp·vp))``) only while
    ``m·vp`` exceeds that; with ``m = pp`` every micro-batch is already in flight, so it holds ``m``."""
    p = par.pp
    if par.schedule == "dualpipe":
        # DeepSeek-V3 report Table 2: PP + 1 micro-batch chunks in flight on every rank (a chunk is one of the
        # rank's two stages, one per direction).
        return float(min(p + 1, m))
    if par.schedule == "interleaved" and par.vp > 1 and p > 1:
        v = par.vp
        return min(interleaved_warmup(stage, p, v, m) + 1, m * v) / v
    return float(min(p - stage, m))


@dataclass(frozen=True)
class MemoryBreakdown:
    weights: float
    grads: float
    optimizer: float
    activations: float
    # short-lived buffers at the peak: ZeRO-3/FSDP gathered units, torchtitan's unsharded PP stage state, the full-
    # recompute transient of the layer re-run, Megatron-FSDP's unsharded gradient bucket (was 'zero3_buffers')
    transients: float
    allocator: float  # caching-allocator reserve the allocator cannot give back (counts against HBM)
    runtime: float  # CUDA context + NCCL buffers (outside the allocator)
    allocator_cached: float = 0.0  # reserve it returns before an out-of-memory (expandable segments)

    @property
    def allocated(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.transients

    @property
    def reserved(self) -> float:
        """``max_memory_reserved``: allocated + the whole reserve (held and cached)."""
        return self.allocated + self.allocator + self.allocator_cached

    @property
    def total(self) -> float:
        """Device memory: what must fit in HBM (allocated, the held reserve, CUDA context and NCCL)."""
        return self.allocated + self.allocator + self.runtime

    @property
    def overhead(self) -> float:
        return self.allocator + self.runtime

    def gib(self) -> dict[str, float]:
        out = {k: getattr(self, k) / GIB for k in ("weights", "grads", "optimizer", "activations",
                                                    "transients", "allocator", "runtime", "allocator_cached",
                                                    "allocated", "reserved", "total")}
        out["overhead"] = self.overhead / GIB
        return out


def runtime_overhead_bytes() -> float:
    """CUDA context + NCCL buffers, per GPU."""
    return (CUDA_CONTEXT_GIB + COMM_BUFFER_GIB) * GIB


def stage_memory(model: ModelSpec, job: JobSpec, par: ParallelConfig, dp: int, stage: int, layers: list[int],
                 m: int, graphs: dict[str, LayerGraph], runtime: Runtime = DEFAULT_RUNTIME,
                 layer_ids: Sequence[int] | None = None, mtp_stage: int | None = None) -> MemoryBreakdown:
    """Peak memory of one rank of pipeline stage ``stage``; ``layers`` = decoder layers per stage, ``layer_ids``
    the ones this stage holds (default: contiguous; interleaved stages hold every ``pp``-th chunk); ``mtp_stage``
    the stage running the MTP modules (default the last; a layout's standalone MTP stage: their heads and losses
    stay on the last stage, gpt_model.py:592-640)."""
    n = layers[stage]
    ids = range(sum(layers[:stage]), sum(layers[:stage]) + n) if layer_ids is None else layer_ids
    first, last = stage == 0, stage == par.pp - 1
    dual = par.schedule == "dualpipe"
    mtp_at = par.pp - 1 if mtp_stage is None else mtp_stage
    standalone = bool(model.arch.mtp_layers) and mtp_at != par.pp - 1
    unit, root = runtime.fsdp_mtp_unit, runtime.fsdp_root_kinds if fsdp_units(runtime, par.zero_stage) else frozenset()
    sp = stage_params(model, par, ids, first=first, last=last, mtp=stage == mtp_at, mtp_unit=unit, root_kinds=root)
    if dual:  # each rank also holds the mirror stage p−1−i (DeepSeek-V3 report §3.2.1: "two copies")
        mirror = par.pp - 1 - stage
        start = sum(layers[:mirror])
        mp = stage_params(model, par, range(start, start + layers[mirror]), first=mirror == 0,
                          last=mirror == par.pp - 1, mtp_unit=unit, root_kinds=root)
        sp = StageParams(sp.dense + mp.dense, sp.expert + mp.expert, max(sp.largest_layer, mp.largest_layer),
                         sp.outside_te + mp.outside_te, sp.root_held + mp.root_held)
    group = par.hsdp_shard_size or dp * par.cp
    expert_group = expert_shard_group(par.tp, par.cp, dp, par.ep, par.zero_stage, par.hsdp_shard_size)
    w1, g1, o1 = runtime.state_bytes(sp.dense, par.zero_stage, group, uncached=sp.outside_te)
    w2, g2, o2 = runtime.state_bytes(sp.expert, par.zero_stage, expert_group)
    if runtime.optimizer != "adam":  # Muon's 8 B for the 2-D matrices, Adam's 12 B for the rest (cost_models.muon)
        o1, o2 = optimizer_state_bytes(model, par, ids, sp.dense, sp.expert, runtime.optimizer, group, expert_group,
                                       mtp=bool(model.arch.mtp_layers) and stage == mtp_at)
    layer_acts = [0.0 if i < runtime.cpu_offload_layers  # in host memory at the peak (TE cpu_offload; pp 1, the
                  else activation_bytes_per_microbatch(graphs[layer_kind(model, i)], model, job, par, runtime)
                  for i in ids]  # profile cites the schedule)
    per_mb = sum(layer_acts)
    if dual:  # a chunk runs on either of the rank's two stages: their mean
        per_mb = per_mb * (layers[stage] + layers[par.pp - 1 - stage]) / (2.0 * max(1, n))
    if standalone and stage == mtp_at:  # the MTP blocks and projections, in flight like the stage's layers
        mtp_block = sum(activation_bytes_per_microbatch(graphs[k], model, job, par, runtime)
                        for k in mtp_block_kinds(model))
        per_mb += model.arch.mtp_layers * mtp_block + mtp_projection_saved_bytes(model, job, par)
    transient = 0.0
    if par.recompute == "full" and n:
        # The layer being recomputed holds its full activations once (one micro-batch, one layer).
        full = par.model_copy(update={"recompute": "none"})
        # a hybrid stack or one with Gated DeltaNet layers: its largest layer kind
        kinds = model_kinds(model) if model.is_hybrid or model.gdn is not None else ["dense"]
        transient += max(activation_bytes_per_microbatch(graphs[k], model, job, full, runtime) for k in kinds)
    elif n:  # a block-wide selective checkpoint re-run: the stage's layer kinds (+ its MTP blocks')
        kinds_here = {layer_kind(model, i) for i in ids}
        if model.arch.mtp_layers and stage == mtp_at:
            kinds_here |= set(mtp_block_kinds(model))
        transient += block_recompute_transient_bytes(model, job, par, graphs, runtime, kinds_here)
    head = 0.0
    if last or (dual and first):
        head = activation_bytes_per_microbatch(graphs["head"], model, job, par, runtime)
        if standalone and not dual:
            head += model.arch.mtp_layers * head  # the MTP heads + losses (their blocks: the MTP stage)
        elif model.arch.mtp_layers:
            mtp_block = sum(activation_bytes_per_microbatch(graphs[k], model, job, par, runtime)
                            for k in mtp_block_kinds(model))
            head += mtp_activation_bytes(model, mtp_block, head, job, par)
    acts = per_mb * inflight_microbatches(stage, par, m) + head
    if fsdp_units(runtime, par.zero_stage):  # torch FSDP2's units: ZeRO-3, or ZeRO-0 over one-rank shards
        unit_group = fsdp_unit_groups(par.zero_stage, par.tp, par.cp, dp, par.ep, par.hsdp_shard_size)[0]
        per_param, per_largest = zero3_transient_bytes(runtime, unit_group, par.pp)
        transient += per_largest * sp.largest_layer + per_param * (sp.dense + sp.expert)
        if par.pp == 1:  # the output layer's, embedding's and root units (with pp > 1: the unsharded stage above)
            excess = root_grad_excess_bytes(layer_acts, root_layer_params(model, par, ids, root), head,
                                            reduce_input_bytes(runtime)) if sp.root_held else 0.0
            transient += zero3_head_unit_bytes(runtime, model, par.tp, sp.largest_layer, unit_group, sp.root_held,
                                               excess)
    if runtime.grad_reduce_every_microbatch and not dual:
        body = stage_params(model, par, ids, first=False, last=False)
        transient += sharded_grad_transient_bytes(runtime, body.dense + body.expert, n, par.vp)
    held = held_reserve_fraction(runtime)
    return MemoryBreakdown(w1 + w2, g1 + g2, o1 + o2, acts, transient, held * (acts + transient),
                           runtime_overhead_bytes(), (ALLOCATOR_RESERVE - held) * (acts + transient))


@lru_cache(maxsize=256)
def graphs_for(model: ModelSpec, seq_len: int) -> dict[str, LayerGraph]:
    """The layer graphs a model needs, by kind (cached: specs are frozen and hashable)."""
    if model.is_hybrid or model.gdn is not None:  # the mixers its pattern holds (opgraph.model_kinds)
        kinds: list[str] = ["head", "embedding", *model_kinds(model)]
    else:
        kinds = ["dense", "head", "embedding"] + (["moe"] if model.is_moe else [])
    return {k: layer_graph(model, k, seq_len) for k in kinds}  # type: ignore[arg-type]
