"""Tensor parallelism's collectives at each TP boundary of a layer (COST_MODEL.md §4): Megatron's f/g operators
(Shoeybi et al. 2019 §3; with sequence parallelism all-gather ↔ reduce-scatter, Korthikanti et al. 2022 §4.2.2), what
TP-comm overlap leaves exposed (``knob_effects.tp_overlap_mode``: exposed, a share, or TE userbuffers per GEMM), and
the QKV all-gather Megatron-Core adds when tp exceeds the KV heads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from cost_models.collectives import CollectiveKind, bytes_sent_per_rank, group_collective_time_s
from cost_models.dsa import dsa_fused
from cost_models.knob_effects import torchao_cast_after_gather, tp_overlap_mode
from cost_models.op_cost import OpCompute, job_precision_ops, kv_gather_width
from cost_models.op_traffic import COLUMN_KINDS
from cost_models.opgraph import LayerGraph, indexer_share
from cost_models.recompute import modules_in_effect, reruns
from cost_models.specs import ClusterSpec, Efficiency, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import Runtime
from cost_models.te_userbuffers import UbMethod, ub_exposed_s


def tp_exposed_fraction(t: int, eff: Efficiency, rt: Runtime | None = None) -> float:
    """Share of TP traffic left on the critical path where no per-collective model prices it
    (``knob_effects.tp_overlap_mode`` ``share``: torchtitan's async TP; the intra-op search's per-op pricing, which
    sees no runtime): ``tp_overlap`` of it hides behind the GEMMs it feeds, pipelined over t chunks (one per peer):
    the reduce-scatter of the last chunk has nothing left to hide behind, so at least 1/(2t) stays exposed.
    ``exposed``: all of it. Megatron's userbuffers: ``_userbuffers_boundary``."""
    if t <= 1:
        return 0.0
    if tp_overlap_mode(eff, rt, t, per_collective=False) == "exposed":
        return 1.0
    return max(1.0 - eff.tp_overlap, 1.0 / (2 * t))


TpRole = Literal["column", "row"]


def tp_boundaries(graph: LayerGraph) -> list[tuple[str, TpRole]]:
    """Where Megatron's f/g operators sit: the input of each column-parallel linear (siblings reading one
    tensor share it: ``linear_qkv``, ``linear_fc1``) and the output of each row-parallel one (§4)."""
    out: list[tuple[str, TpRole]] = []
    for op in graph.ops:
        if op.kind != "matmul":
            continue
        if graph.tensors[op.output].dim_kind in COLUMN_KINDS:
            entry: tuple[str, TpRole] = (op.inputs[0], "column")
        elif graph.tensors[op.inputs[0]].dim_kind in COLUMN_KINDS:
            entry = (op.output, "row")
        else:
            continue  # hidden → hidden (MLA down-projections): replicated weights, no collective
        if entry not in out:
            out.append(entry)
    return out


def tp_collectives(role: TpRole, sequence_parallel: bool,
                   recompute: str) -> tuple[tuple[CollectiveKind, Literal["fwd", "bwd"], float], ...]:
    """(collective, pass, calls per micro-batch) of one TP boundary on its full ``[tokens, width]`` bf16 tensor
    (Shoeybi et al. 2019 §3: column ``f`` = identity forward / all-reduce backward, row ``g`` = all-reduce
    forward; with SP, Korthikanti et al. 2022 §4.2.2: all-gather ↔ reduce-scatter). Full recompute repeats
    the forward's."""
    fwd = 2.0 if recompute == "full" else 1.0
    if role == "column":
        if sequence_parallel:
            return ("all_gather", "fwd", fwd), ("reduce_scatter", "bwd", 1.0)
        return (("all_reduce", "bwd", 1.0),)
    if sequence_parallel:
        return ("reduce_scatter", "fwd", fwd), ("all_gather", "bwd", 1.0)
    return (("all_reduce", "fwd", fwd),)


def _userbuffers_boundary(role: TpRole, elems: float, gemm_s: float, gather: float, grad_gather: float, t: int,
                          stride: int, cluster: ClusterSpec, fwd_calls: int) -> tuple[float, float]:
    """(exposed seconds, bytes each rank sends) of one TP boundary under TE userbuffers (``te_userbuffers``), its
    GEMM's forward time ``gemm_s`` (dgrad and wgrad take as long). Column: all-gather of the input (ring exchange
    under the forward GEMM), and in the backward the input's all-gather for the weight gradient (bulk, under dgrad)
    and the input gradient's reduce-scatter (bulk, under wgrad). Row: the output's reduce-scatter (pipelined over
    the forward GEMM), the output gradient's all-gather (ring exchange under dgrad)."""
    if role == "column":
        plan: tuple[tuple[CollectiveKind, float, UbMethod, int], ...] = (
            ("all_gather", gather, "ring_exchange", fwd_calls), ("all_gather", gather, "bulk", 1),
            ("reduce_scatter", 2.0, "bulk", 1))
    else:
        plan = (("reduce_scatter", 2.0, "pipeline", fwd_calls), ("all_gather", grad_gather, "ring_exchange", 1))
    seconds = nbytes = 0.0
    for kind, width_bytes, method, calls in plan:
        payload = width_bytes * elems
        comm = group_collective_time_s(kind, payload, t, stride, cluster)
        seconds += calls * ub_exposed_s(method, comm, gemm_s, t)
        nbytes += calls * bytes_sent_per_rank(kind, payload, t)
    return seconds, nbytes


def tp_boundary_costs(graph: LayerGraph, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, stride: int,
                      sequence_parallel: bool, rt: Runtime | None = None, model: ModelSpec | None = None,
                      ops: Sequence[OpCompute] | None = None) -> list[tuple[float, float]]:
    """(exposed seconds, bytes each rank sends) of every TP boundary of the layer for one micro-batch, with or
    without sequence parallelism: ``tp_collectives`` on the full ``[tokens, width]`` bf16 tensor (all-gathers at
    ``rt.tp_gather_bytes``, the backward's output-gradient ones at ``rt.tp_grad_gather_bytes``: fp8 under
    torchtitan's Float8 tensorwise TP and TE's fp8 linears), × the share TP-comm overlap leaves exposed
    (``tp_exposed_fraction``); under Megatron's userbuffers (``model`` given) each collective against its own GEMM
    (``ops``: ``op_cost.job_precision_ops`` of the graph, when the caller has them)."""
    t = par.tp
    fraction = tp_exposed_fraction(t, cluster.efficiency, rt)
    tokens = par.micro_batch_size * job.seq_len / par.cp
    out = []
    gather = rt.tp_gather_bytes if rt is not None else 2.0  # fp8 all-gathers: torchtitan's Float8 TP, TE's fp8
    grad_gather = gather if rt is None or rt.tp_grad_gather_bytes is None else rt.tp_grad_gather_bytes
    # Megatron --tp-comm-overlap: each collective against its own GEMM (te_userbuffers; the GEMMs need the model)
    userbuffers = tp_overlap_mode(cluster.efficiency, rt, t, sequence_parallel,
                                  per_collective=model is not None) == "userbuffers"
    for tensor, role in tp_boundaries(graph):
        elems = tokens * graph.tensors[tensor].width
        if userbuffers:
            assert model is not None
            ops = ops or job_precision_ops(graph, model, cluster, job, par, rt)
            gemm = sum(p.gemm_f + p.gemm_fwd_extra for op, p in zip(graph.ops, ops) if op.kind == "matmul"
                       and (op.inputs[0] == tensor if role == "column" else op.output == tensor))
            out.append(_userbuffers_boundary(role, elems, gemm, gather, grad_gather, t, stride, cluster,
                                             2 if par.recompute == "full" else 1))
            continue
        seconds = nbytes = 0.0
        for kind, _, calls in tp_collectives(role, sequence_parallel, par.recompute):
            ag = grad_gather if role == "row" else gather  # a row boundary all-gathers in the backward
            payload = (ag if kind == "all_gather" else 2.0) * elems
            # async TP cannot fuse an all-gather whose consumer is torchao's cast (knob_effects)
            whole = kind == "all_gather" and torchao_cast_after_gather(rt, job, sequence_parallel, role == "row")
            seconds += calls * group_collective_time_s(kind, payload, t, stride, cluster) * (1.0 if whole else fraction)
            nbytes += calls * bytes_sent_per_rank(kind, payload, t)
        out.append((seconds, nbytes))
    return out



def kv_gather_collectives(recompute: str) -> tuple[tuple[CollectiveKind, Literal["fwd", "bwd"], float], ...]:
    """(collective, pass, calls per micro-batch) of Megatron's QKV gather (``kv_gather_width``): all-gather forward
    (again under full recompute), reduce-scatter backward."""
    return ("all_gather", "fwd", 2.0 if recompute == "full" else 1.0), ("reduce_scatter", "bwd", 1.0)


def kv_replica_grad_collectives(graph: LayerGraph) -> tuple[CollectiveKind, Literal["fwd", "bwd"], float, float]:
    """(collective, pass, calls per micro-batch, bf16 payload bytes) of the replicated K/V weights' gradient
    reduction: DTensor turns the Partial gradient of a Replicate parameter into Replicate with one all-reduce."""
    params = sum(op.params for op in graph.ops if op.name in ("k_proj", "v_proj"))
    return "all_reduce", "bwd", 1.0, 2.0 * params


def kv_gather_cost(graph: LayerGraph, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                   stride: int) -> tuple[float, float]:
    """(exposed seconds, bytes each rank sends) for one micro-batch of Megatron's QKV gather (0 when t ≤ g), or
    with ``kv_replication='replicate'`` of the replicated K/V weights' gradient all-reduce. Both are plain
    collectives on the compute stream (``_gather_along_last_dim``, a DTensor redistribute), not the linear layers'
    userbuffer-overlapped ones: fully exposed (no ``tp_exposed_fraction``)."""
    width = kv_gather_width(graph, par.tp)
    if not width:
        return 0.0, 0.0
    if par.kv_replication == "replicate":
        kind, _, calls, payload = kv_replica_grad_collectives(graph)
        return (calls * group_collective_time_s(kind, payload, par.tp, stride, cluster),
                calls * bytes_sent_per_rank(kind, payload, par.tp))
    payload = 2.0 * par.micro_batch_size * job.seq_len / par.cp * width
    seconds = nbytes = 0.0
    for kind, _, calls in kv_gather_collectives(par.recompute):
        seconds += calls * group_collective_time_s(kind, payload, par.tp, stride, cluster)
        nbytes += calls * bytes_sent_per_rank(kind, payload, par.tp)
    return seconds, nbytes


def dsa_tp_collectives(graph: LayerGraph, model: ModelSpec, job: JobSpec, par: ParallelConfig,
                       rt: Runtime | None) -> tuple[tuple[CollectiveKind, Literal["fwd", "bwd"], float, float], ...]:
    """(collective, pass, calls per micro-batch, payload bytes) of the TP collectives Megatron-Core's DSAttention
    (``cost_models.dsa``; experimental_attention_variant/dsa.py) runs in one layer of ``graph`` beyond the MLA's own
    linears (tp > 1; none without an indexer; none for a runtime that is not Megatron's: the reference design), on the
    unfused path of megatron-core 0.16.1 (below) and with the cuDNN kernels (``dsa_kernel_backend`` cudnn, core_v0.19.0):

    - under sequence parallelism the indexer all-gathers its two inputs, the hidden states ``x`` ``[s, b, h]`` and
      the query latent ``qr`` ``[s, b, q_lora_rank]`` in bf16 (``gather_from_sequence_parallel_region``,
      dsa.py:557-559): forward only, since DSAttention detaches both before the indexer (dsa.py:762-763), so no
      reduce-scatter runs in the backward; again where the backward re-runs the indexer (full recompute, or a
      ``core_attn`` checkpoint around DSAttention: ``recompute.reruns``);
    - the indexer loss sums its softmaxed local heads' dense scores and all-reduces that ``[b, s, s]`` fp32 sum over
      TP (``torch.distributed.all_reduce``, dsa.py:231-234), once per micro-batch: the loss is built only with grad
      enabled (``self.training and torch.is_grad_enabled()``, dsa.py:799), so a checkpointed forward (full
      recompute: transformer_block.py:505-521), which runs under ``torch.no_grad()`` (tensor_parallel/random.py
      ``CheckpointFunction.forward`` :516-517; TE's ``te_checkpoint`` under fp8 not read here), skips it and the
      re-run under ``enable_grad`` (:556-557) computes it; query and key are detached (dsa.py:805-806), so no
      backward collective.

    The cuDNN path runs the same gathers: ``DSAIndexer.forward_before_topk`` gathers x and qr under SP
    (dsa.py:1273-1275 @ core_v0.19.0), called for either backend before the fused branch (:1980, :2037); and its loss
    all-reduces over TP the head-summed target of the local heads, built only with grad enabled (loss_coeff 0 under
    no_grad, dsa_cudnn_kernels.py:225-226 @ core_v0.19.0): dense (Megatron's default, ``DSASpec.sparse_loss`` False)
    the ``(b, s, s)`` fp32 scores and their ``(b, s)`` fp32 L1 denominators, two calls (``_all_reduce_tp_target``,
    :1911-1912; shapes :1689-1696), sparse the ``(b, s, top-k)`` fp32 target over the selected keys (:1818). (Its fused
    kernel runs only absorbed MLA, whose keys DSAttention gathers under SP, dsa.py:1782-1793 @ core_v0.19.0: the
    absorbed layout is not priced here; ``cost_models.dsa`` prices the fused design on MLA's own.)

    A shared-indexer layer kind (``opgraph.indexer_share``) runs them at that share of its layers."""
    t = par.tp
    if t <= 1 or model.dsa is None or model.mla is None or rt is None or rt.target != "megatron":
        return ()
    idx = [op for op in graph.ops if op.name == "idx_scores"]
    if not idx:
        return ()
    share = indexer_share(model, graph.kind)
    tokens = par.micro_batch_size * job.seq_len / par.cp
    out: list[tuple[CollectiveKind, Literal["fwd", "bwd"], float, float]] = []
    if par.sequence_parallel:
        modules = modules_in_effect(par, rt)
        again = par.recompute == "full" or (modules is not None and reruns(idx[0], graph, modules))
        calls = (2.0 if again else 1.0) * share
        out += [("all_gather", "fwd", calls, 2.0 * tokens * model.hidden_size),
                ("all_gather", "fwd", calls, 2.0 * tokens * model.mla.q_lora_rank)]
    if not dsa_fused(rt):  # the unfused loss's [b, s, s] (dsa.py:231-234)
        out.append(("all_reduce", "fwd", share, 4.0 * tokens * job.seq_len))
    elif model.dsa.sparse_loss:  # cuDNN's sparse target (dsa_cudnn_kernels.py:1818)
        out.append(("all_reduce", "fwd", share, 4.0 * tokens * min(model.dsa.index_topk, job.seq_len)))
    else:  # cuDNN's dense scores and their denominators (dsa_cudnn_kernels.py:1911-1912)
        out += [("all_reduce", "fwd", share, 4.0 * tokens * job.seq_len), ("all_reduce", "fwd", share, 4.0 * tokens)]
    return tuple(out)


def dsa_tp_cost(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                stride: int, rt: Runtime | None) -> tuple[float, float]:
    """(exposed seconds, bytes each rank sends) for one micro-batch of ``dsa_tp_collectives``: plain collectives on
    the compute stream (``gather_from_sequence_parallel_region``, ``torch.distributed.all_reduce``), not a linear
    layer's userbuffer-overlapped ones, so fully exposed (as ``kv_gather_cost``)."""
    seconds = nbytes = 0.0
    for kind, _, calls, payload in dsa_tp_collectives(graph, model, job, par, rt):
        seconds += calls * group_collective_time_s(kind, payload, par.tp, stride, cluster)
        nbytes += calls * bytes_sent_per_rank(kind, payload, par.tp)
    return seconds, nbytes
