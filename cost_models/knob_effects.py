"""What a target's knobs change in the time of one layer (``cost_models.targets.Runtime``; COST_MODEL.md §2, §4).

No fitted factor here: each knob switches a physical mechanism on or off, or changes the bytes a kernel moves.

- **Fused element-wise kernels** (Transformer Engine, ``torch.compile``/Inductor) vs eager PyTorch: eager norms,
  rotary and SwiGLU make several HBM passes; the ratio is ``Efficiency.eager_traffic`` (counted from the eager op
  sequences: ``specs.EAGER_TRAFFIC``) and applies only where the runtime does not fuse (torchtitan without
  ``compile``, the fsdp2 module).
- **TP communication overlap** (Megatron ``--tp-comm-overlap``, TE userbuffers; torchtitan async TP, micro-pipelined
  all-gather/reduce-scatter matmuls, ``torch/distributed/_symmetric_memory``): only when the runtime overlaps;
  otherwise all of it is on the critical path. Megatron's userbuffers hide each collective behind its own GEMM
  (``te_userbuffers``: what its GEMM does not cover stays exposed); torchtitan's async TP hides the share
  ``Efficiency.tp_overlap``. ``tp_overlap`` 0 states a stack without TP overlap.
  torchtitan's Float8 tensorwise TP and Transformer Engine's fp8 sequence-parallel linears all-gather fp8
  (``Runtime.tp_gather_bytes`` / ``tp_grad_gather_bytes``, ``te_tp_gather_bytes``; ``tp_comm.tp_boundary_costs``).
- **Float8 recipe**: HBM bytes per element of each GEMM input (forward) and output gradient (backward) spent on
  casts, by scaling granularity: Transformer Engine's (``te_cast_bytes``: amax pass, copies written, what the norm
  kernel fuses, transposes only where the fp8 GEMM is TN-only) or torchao's Float8Linear, which also casts its
  weight every micro-batch (``TORCHAO_*``, as torchao's roofline counts them, MXFP8 too); ``rowwise_with_gw_hp``
  runs the weight-gradient GEMM in bf16; the rowwise recipes' forward GEMM runs the CUTLASS row-wise kernel
  (``ROWWISE_FWD_GEMM_EFFICIENCY``), their slow-accumulation backward GEMMs cuBLAS's tensorwise kernel with the
  output rescaled in a separate pass (``fp8_rescale_bytes``); a tensor a high-precision TP all-gather produced is
  cast unfused, and async TP leaves that all-gather unfused with its matmuls (``torchao_cast_after_gather``);
  block-scaled MXFP8 GEMMs run at the kernel time ratio TE measured against per-tensor fp8
  (``MXFP8_GEMM_TIME_RATIO``).
- **Context-parallel communication** (``cp_comm``): ring P2P (each K/V block overlaps the previous block's
  attention), all-gather (K/V gathered at once, overlapped with the local block only), Ulysses all-to-all (heads
  re-split over CP before and after attention; nothing to hide behind), and Megatron's hierarchical a2a+p2p
  (Ulysses inside a group of ``a`` ranks, the ring over ``cp/a`` of them).
"""

from __future__ import annotations

from typing import Literal

from cost_models.attention_cost import cp_ring
from cost_models.collectives import group_collective_time_s
from cost_models.mamba import cp_all_to_all
from cost_models.opgraph import LayerGraph
from cost_models.specs import ClusterSpec, Efficiency, JobSpec, MambaSpec, ParallelConfig
from cost_models.targets.common import Runtime
from cost_models.te_fp8 import MXFP8_GEMM_TIME_RATIO, TE_RECIPES, TeCast, te_cast_bytes


def non_tn_fp8_gemm(cluster: ClusterSpec) -> bool:
    """Whether the GPU's fp8 GEMM takes non-TN layouts (TE ``nvte_is_non_tn_fp8_gemm_supported``: sm_100-119 and
    sm_130+, i.e. Blackwell; Hopper's fp8 tensor cores take TN only)."""
    return cluster.gpu.generation == "blackwell"


def fp8_gemm_time_ratio(rt: Runtime | None, job: JobSpec) -> float:
    """Time of the recipe's fp8 GEMM kernel over the per-tensor-scaled fp8 GEMM the generation's
    ``fp8_gemm_speedup`` describes: ``MXFP8_GEMM_TIME_RATIO`` for block-scaled MXFP8 (TE's or torchao's: both call
    cuBLAS's MXFP8 GEMM), 1 otherwise."""
    if job.precision == "fp8" and rt is not None and rt.fp8_recipe == "mxfp8":
        return MXFP8_GEMM_TIME_RATIO
    return 1.0


# torchao Float8Linear (torchtitan's Float8), as torchao's own roofline counts its cast kernels
# (pytorch/ao torchao/testing/float8/roofline_utils.py ``get_tensor_memory_traffic_ovhd_s`` at 8c81863, ao#1793, the
# commit of its README's torchtitan recipe benchmark). Bytes per element of a GEMM's activation operand (its input
# in the forward, its output gradient in the backward): (unfused, fused with the producing kernel: the amax pass or
# the first read rides on the previous op under torch.compile).
# - tensorwise: amax (read 2), then one cast writing the fp8 copy and its transpose (2 + 1 + 1): 6; fused 4.
# - rowwise: the row-scaled fp8 copy and a bf16 transpose in one kernel (2 + 1 + 2), the transpose's own row-scaled
#   cast (2 + 1): 8; fused 6 ("can't fuse 1 and 2: that would need the whole tensor in shared memory").
# - rowwise_with_gw_hp: the row-scaled copy only (2 + 1; the weight-gradient GEMM takes bf16): 3; fused 1.
# - mxfp8 (torchao MXLinear, torchtitan's MXFP8LinearConverter: recipes mxfp8_cublas / mxfp8_cublas_rceil /
#   mxfp8_emulated, one roofline branch at ao d8bb51f63 l.188-203, the commit of its B200 torchtitan table): a dim0 and
#   a dim1 1x32-block cast, each reading the bf16 tensor (2 + 1 each; "assume that we can't profitably fuse kernel 1
#   and kernel 2"; the E8M0 scales, 1/32 B per element, not counted): 6; fused 4 (kernel 1 reads with the producer).
TORCHAO_ACT_CAST_BYTES: dict[str, tuple[float, float]] = {
    "tensorwise": (6.0, 4.0), "rowwise": (8.0, 6.0), "rowwise_with_gw_hp": (3.0, 1.0), "mxfp8": (6.0, 4.0)}
# ... and per weight element, every micro-batch (Float8Linear casts the gathered bf16 weight in each forward and
# again for the backward's grad_input GEMM, which needs it scaled along the other axis): (forward, backward).
# - tensorwise: amax (2) + cast (2 + 1) forward, a second cast (2 + 1) backward.
# - rowwise: row-scaled cast (2 + 1) forward; backward a bf16 transpose (2 + 2) and its cast (2 + 1).
# - rowwise_with_gw_hp: row-scaled cast (2 + 1) forward; backward a cast with the tensorwise scale (2 + 1).
# - mxfp8: the same two block casts of the weight (same roofline branch): dim0 for the forward (2 + 1), dim1 for the
#   backward's input-gradient GEMM (2 + 1).
TORCHAO_WEIGHT_CAST_BYTES: dict[str, tuple[float, float]] = {
    "tensorwise": (5.0, 3.0), "rowwise": (3.0, 7.0), "rowwise_with_gw_hp": (3.0, 3.0), "mxfp8": (3.0, 3.0)}


def eager_elementwise(eff: Efficiency, rt: Runtime | None) -> bool:
    """Whether norms, rotary, activations and the loss run op by op (``rt`` None: the efficiency's own setting)."""
    return not eff.compiled or (rt is not None and not rt.fused_elementwise)


TpOverlapMode = Literal["exposed", "share", "userbuffers"]


def tp_overlap_mode(eff: Efficiency, rt: Runtime | None, t: int, sequence_parallel: bool = True,
                    per_collective: bool = True) -> TpOverlapMode:
    """How a layer's TP collectives meet its GEMMs: the one decision ``layer_cost``, ``mtp`` and the intra-op search
    read.

    - ``exposed``: no TP group (t = 1), a stack or generation that states no TP overlap (``eff.tp_overlap`` 0:
      ``calibrate.SOFTWARE_SETTINGS``, gpus.yaml's unmeasured priors), or a runtime that does not overlap
      (``Runtime.tp_overlapped`` false): every collective on the critical path.
    - ``userbuffers``: Megatron ``--tp-comm-overlap`` (it requires sequence parallelism, Megatron-LM
      arguments.py) where the caller can price each collective against its own GEMM (``per_collective``):
      ``te_userbuffers``.
    - ``share``: otherwise ``eff.tp_overlap`` of the traffic hides (torchtitan's async TP; the intra-op search's
      per-op pricing, which sees no runtime): ``tp_comm.tp_exposed_fraction``."""
    if t <= 1 or eff.tp_overlap <= 0 or (rt is not None and not rt.tp_overlapped):
        return "exposed"
    if rt is not None and rt.tp_comm_overlap and sequence_parallel and per_collective:
        return "userbuffers"
    return "share"


def unpriced_knob_notes(cluster: ClusterSpec, rt: Runtime, par: ParallelConfig) -> list[str]:
    """Knobs the runtime runs (and the emitters launch) that this prediction prices as having no effect, so the
    user is told rather than shown a knob the step time does not contain."""
    out = []
    if rt.tp_comm_overlap and tp_overlap_mode(cluster.efficiency, rt, par.tp, par.sequence_parallel) == "exposed" \
            and par.tp > 1:
        out.append(f"tp_comm_overlap=True runs TE userbuffers, but the prediction prices every TP collective exposed: "
                   f"{cluster.gpu.name}'s tp_overlap is 0 (no measured run identifies TP overlap on "
                   f"{cluster.gpu.generation}; gpus.yaml), so the TP time shown is an upper bound")
    return out


def fp8_cast_bytes(rt: Runtime | None, non_tn_gemm: bool = False) -> TeCast:
    """Transformer Engine's cast bytes for the runtime's recipe (TE's delayed by default) on a GPU whose fp8 GEMM
    takes non-TN layouts or not (``non_tn_fp8_gemm``). torchao's per-row recipes reach here only for grouped expert
    GEMMs, for which no torchao roofline exists: priced as TE's default cast."""
    recipe = rt.fp8_recipe if rt is not None else None
    return te_cast_bytes(recipe if recipe in TE_RECIPES else None, non_tn_gemm)


def torchao_casts(rt: Runtime | None, job: JobSpec) -> tuple[float, float, float] | None:
    """(bytes per activation element, per weight element forward, backward) of torchao's Float8Linear casts for
    the runtime's recipe (``TORCHAO_*``; fused with the producer under torch.compile, except after a high-precision TP
    all-gather: ``torchao_cast_after_gather``), or None where the runtime's
    fp8 is not torchao's (Transformer Engine: ``fp8_cast_bytes``)."""
    if job.precision != "fp8" or rt is None or rt.fp8_impl != "torchao" or rt.fp8_recipe not in TORCHAO_ACT_CAST_BYTES:
        return None
    act = TORCHAO_ACT_CAST_BYTES[rt.fp8_recipe][1 if rt.model_compiled else 0]
    return (act, *TORCHAO_WEIGHT_CAST_BYTES[rt.fp8_recipe])


def torchao_cast_after_gather(rt: Runtime | None, job: JobSpec, sequence_parallel: bool,
                              backward: bool = False) -> bool:
    """Whether torchao's Float8Linear casts a tensor that a sequence-parallel TP all-gather just produced in high
    precision: regular DTensor TP (torchtitan's rowwise and MXFP8 recipes: "For rowwise recipes, we use regular TP
    and all-gather happens in high precision", torchtitan@820504e models/llama3/parallelize_llama.py:56-65) gathers
    the norm's bf16 output before the column-parallel linears and, in the backward, the bf16 output gradient before
    the row-parallel ones. Float8 tensorwise TP (``tp_gather_bytes`` 1) casts the local shard and gathers fp8.
    Two consequences: the cast cannot ride on the producing kernel even under torch.compile (an NCCL kernel sits
    between: unfused bytes of ``TORCHAO_ACT_CAST_BYTES``), and async TP's micro-pipelining, which fuses an
    all-gather only into the matmuls that consume it directly (torch/_inductor/fx_passes/micro_pipeline_tp.py
    ``_find_consumer_matmuls``: mm / _scaled_mm, through a reshape), finds the cast there and leaves the gather
    whole: "the matmul-reduce-scatters were being fused properly - however, the all-gather-matmul patterns were
    NOT" for rowwise float8 (pytorch/pytorch#149990, 2025-03, open; the reduce-scatter side: pytorch#149247)."""
    if not sequence_parallel or torchao_casts(rt, job) is None:
        return False
    gather = rt.tp_grad_gather_bytes if backward and rt.tp_grad_gather_bytes is not None else rt.tp_gather_bytes
    return gather > 1.0


# torchao rowwise backward GEMMs (grad_input, grad_weight: ``use_fast_accum=False`` by default in
# ``Float8LinearConfig``) do not run the rowwise CUTLASS kernel, "so slow without fast-accum": they call cuBLAS's
# tensorwise kernel with unit scales and multiply the bf16 output by the outer product of the row scales afterwards
# (torchao/float8/float8_python_api.py ``addmm_float8_unwrapped``, pytorch/ao#1325; float8_ops.py at ao 6243040,
# the asyncTP runs' torchao: ``output *= post_inverse_scale``): read 2 + write 2 bytes per output element, for both
# backward GEMMs and under torch.compile too: "With torch.compile this unfortunately requires inductor to codegen
# at least one extra triton kernel *per GEMM* to be launched just for the rescaling" (pytorch/ao#2184, 2025-05-08).
# Each of q/k/v's grad_input is a full-width tensor rescaled on its own: torchtitan#1207's RCA (ao#2410) found
# rowwise wk / wv "approx 40%" slower than in bf16.
FP8_RESCALE_BYTES = 4.0


def fp8_rescale_bytes(rt: Runtime | None, job: JobSpec) -> tuple[float, float]:
    """HBM bytes per output element of the separate rescale pass after a backward fp8 GEMM: (grad_input,
    grad_weight). 0 outside torchao's rowwise recipes; ``rowwise_with_gw_hp`` runs grad_weight in bf16 (no
    rescale); compiled or not, the rescale is its own kernel (ao#2184)."""
    if job.precision != "fp8" or rt is None or rt.fp8_recipe not in ("rowwise", "rowwise_with_gw_hp"):
        return 0.0, 0.0
    return FP8_RESCALE_BYTES, (FP8_RESCALE_BYTES if rt.fp8_recipe == "rowwise" else 0.0)


# torchao rowwise forward GEMM (``use_fast_accum=True``): ``torch._scaled_mm`` with row-wise scales runs PyTorch's
# CUTLASS kernel (aten/src/ATen/native/cuda/RowwiseScaledMM.cu), tensor-wise scales cuBLASLt. Throughput of the
# former relative to the latter on H100, fast-accum, after the tile heuristics of pytorch#134781: "most shapes are
# within 90-100% of tensor-wise efficiency, but there's a long tail going down to 50%" (pytorch/pytorch#147971,
# 2025-02, the PyTorch of torchao's recipe benchmark). The middle of that band; the tail is not priced.
ROWWISE_FWD_GEMM_EFFICIENCY = 0.95


def fp8_forward_gemm_efficiency(rt: Runtime | None, job: JobSpec) -> float:
    """Forward fp8 GEMM throughput relative to the generation's fp8 GEMM (cuBLAS tensor-wise scaling): torchao's
    rowwise recipes run the CUTLASS row-wise kernel (``ROWWISE_FWD_GEMM_EFFICIENCY``); their slow-accum backward
    GEMMs run cuBLAS plus a rescale pass (``fp8_rescale_bytes``)."""
    if job.precision == "fp8" and rt is not None and rt.fp8_impl == "torchao" \
            and rt.fp8_recipe in ("rowwise", "rowwise_with_gw_hp"):
        return ROWWISE_FWD_GEMM_EFFICIENCY
    return 1.0


def wgrad_in_bf16(rt: Runtime | None, job: JobSpec) -> bool:
    """torchao ``rowwise_with_gw_hp``: the weight-gradient GEMM stays in high precision."""
    return job.precision == "fp8" and rt is not None and rt.fp8_recipe == "rowwise_with_gw_hp"


def _ulysses(graph: LayerGraph, cluster: ClusterSpec, tokens: float, tp: int, group: int,
             stride: int) -> tuple[float, float]:
    """(seconds, bytes each rank sends) of Ulysses' all-to-alls over ``group`` ranks at ``stride``: q, k, v re-split
    from sequence to heads before the attention core and its output back, forward and backward."""
    t = graph.tensors
    core = next(op for op in graph.ops if op.kind == "attention")
    width = sum(t[x].width for x in core.inputs) + t[core.output].width
    payload = tokens * width / tp * 2.0
    seconds = 2 * group_collective_time_s("all_to_all", payload, group, stride, cluster)
    return seconds, 2 * payload * (group - 1) / group


def cp_comm(graph: LayerGraph, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, stride: int,
            rt: Runtime | None, mamba: MambaSpec | None = None) -> tuple[float, float, float, float, int]:
    """(seconds, bytes each rank sends, share of the attention core it can hide behind, seconds of it nothing
    hides, steps of the P2P ring it travels, 0 for none) of one layer's context-parallel traffic for one
    micro-batch, by ``rt.cp_comm_type`` (``p2p`` when ``rt`` is None). ``c`` = cp, ``t`` = tp, ``s·b/c`` tokens
    per rank, ``w_x`` the width of tensor x.

    - p2p ring (Liu et al. 2023, Ring Attention): ``3(c−1)`` K/V blocks of ``(s/c)·b·(w_k+w_v)/t`` bf16 (forward
      K, V; backward K, V and dK, dV), each beside one of the ``c`` step kernels of its pass
      (``attention_cost.ring_steps_exposed_s``).
    - allgather (torch ``context_parallel`` with its default all-gather rotater; Megatron ``all_gather``): the same
      blocks, gathered at once; only the local block's attention (1/c of it) runs before the wait.
    - a2a (Ulysses, Jacobs et al. 2023): q, k, v and the output re-split from sequence to heads and back, forward
      and backward: ``2·(w_q + w_k + w_v + w_o)/t`` per token, each rank sending ``(c−1)/c`` of its share; the
      attention needs the result, so nothing hides it. Heads after TP must divide by cp (the profile's rule).
    - a2a+p2p (Megatron ``--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes a r``, a·r = c; Transformer
      Engine ``AttnFuncWithCPAndKVP2P`` with ``cp_group = [a2a group, p2p group]``,
      transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py; Megatron-Core
      ``parallel_state.create_hierarchical_groups``: the a2a groups are ``a`` adjacent CP ranks, stride ``t``,
      the p2p ring links ranks ``a·t`` apart): Ulysses inside each a-group (``2·(w_q+w_k+w_v+w_o)/t`` per token,
      ``(a−1)/a`` of it sent, exposed), then the ring over ``r = c/a`` ranks on ``a·s/c`` tokens of ``1/a`` of the
      heads: ``3(r−1)`` K/V blocks of the p2p ring's size ``(s/c)·b·(w_k+w_v)/t``, hidden behind the core as the
      ring is. Seconds: ``2·A2A_a(s·b/c·(w_q+w_k+w_v+w_o)/t·2 B) + 3(r−1)·P2P(block)``; the ring's kernels run
      ``r`` steps (``ring_steps``)."""
    c = par.cp
    if c <= 1:
        return 0.0, 0.0, 0.0, 0.0, 0
    tokens = par.micro_batch_size * job.seq_len / c
    if any(op.kind == "ssm" for op in graph.ops):  # a Mamba-2 mixer: its own all-to-all CP, whatever cp_comm_type
        if mamba is None:
            raise ValueError("cp_comm: a Mamba-2 layer graph needs its MambaSpec")
        seconds, nbytes = cp_all_to_all(mamba, cluster, tokens, par.tp, c, stride)
        return seconds, nbytes, 0.0, 0.0, 0
    if not any(op.kind == "attention" for op in graph.ops):
        return 0.0, 0.0, 0.0, 0.0, 0  # a hybrid stack's MLP / MoE layer: token-wise, nothing to exchange
    kind = rt.cp_comm_type if rt is not None else "p2p"
    if kind == "a2a":
        seconds, nbytes = _ulysses(graph, cluster, tokens, par.tp, c, stride)
        return seconds, nbytes, 0.0, 0.0, 0
    if kind == "allgather":
        kv_width = graph.tensors["k"].width + graph.tensors["v"].width
        block = tokens * kv_width / par.tp * 2.0
        ag = group_collective_time_s("all_gather", block * c, c, stride, cluster)
        rs = group_collective_time_s("reduce_scatter", block * c, c, stride, cluster)
        return 2 * ag + rs, 3 * (c - 1) * block, 1.0 / c, 0.0, 0
    if kind == "a2a+p2p" and rt is not None and rt.cp_a2a_size:
        a = rt.cp_a2a_size
        a2a_s, a2a_b = _ulysses(graph, cluster, tokens, par.tp, a, stride)
        ring_s, ring_b = cp_ring(graph, cluster, job, par, stride * a, ring=c // a)
        return a2a_s + ring_s, a2a_b + ring_b, 1.0, a2a_s, ring_steps(par, rt)
    ring_s, ring_b = cp_ring(graph, cluster, job, par, stride)
    return ring_s, ring_b, 1.0, 0.0, ring_steps(par, rt)


def ring_steps(par: ParallelConfig, rt: Runtime | None) -> int:
    """Ring steps the attention runs per micro-batch, each one kernel on one K/V chunk and a merge of its partial
    result: ``cp`` for ring P2P and the all-gather variants that loop over the gathered chunks (TE
    ``AttnFuncWithCPAndKVAllGather``, torch ``_templated_ring_attention``); ``cp / a`` for a2a+p2p (the ring over
    the p2p level); 1 for Ulysses (the whole sequence on ``heads/c`` heads in one kernel)."""
    kind = rt.cp_comm_type if rt is not None else "p2p"
    if kind == "a2a":
        return 1
    if kind == "a2a+p2p" and rt is not None and rt.cp_a2a_size:
        return par.cp // rt.cp_a2a_size
    return par.cp
