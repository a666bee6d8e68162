"""Time of one layer for one micro-batch on one rank (COST_MODEL.md §2, §4): its compute (``op_cost``) and the
critical-path collectives of TP (``tp_comm``), CP (``knob_effects.cp_comm``, ``attention_cost``) and EP
(``ep_comm``), with the host-bound wait of MoE layers."""

from __future__ import annotations

from dataclasses import dataclass, replace

from cost_models.a2a_overlap import OverlapNodes
from cost_models.attention_cost import ring_exposed_s, ring_steps_exposed_s
from cost_models.collectives import RankStrides
from cost_models.ep_comm import (a2a_overlap_compute_split, a2a_overlap_exposed_s, a2a_rows, host_wait_s,
                                 moe_all_to_all_parts)
from cost_models.knob_effects import cp_comm
from cost_models.moe import dispatcher_sm_fraction, moe_a2a_overlapped, moe_dispatcher
from cost_models.dsa import op_runtime
from cost_models.op_cost import OpCompute, _compute, job_precision_ops, op_compute, op_forward_s, op_recompute_s
from cost_models.opgraph import DECODER_KINDS, MOE_KINDS, LayerGraph
from cost_models.recompute import ep_forward_repeats, modules_in_effect
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import Runtime
from cost_models.tp_comm import dsa_tp_cost, kv_gather_cost, tp_boundary_costs


@dataclass(frozen=True)
class LayerCost:
    """Seconds per micro-batch on one rank; ``*_bytes`` are bytes each rank sends."""

    forward_s: float
    backward_s: float
    recompute_s: float
    attention_s: float  # the attention core, fwd + bwd (what CP's ring can hide behind)
    tp_s: float
    ep_s: float
    cp_s: float
    tp_bytes: float
    ep_bytes: float
    cp_bytes: float
    cp_window: float = 1.0  # share of the attention core CP traffic can hide behind (knob_effects.cp_comm)
    cp_unhidden_s: float = 0.0  # part of cp_s nothing hides (a2a+p2p's all-to-alls; knob_effects.cp_comm)
    # steps of a P2P ring, whose blocks hide step by step (ring_steps_exposed_s); 0: behind cp_window of the core
    cp_ring_steps: int = 0
    attention_f_s: float = 0.0  # the attention core's forward (of attention_s)
    host_s: float = 0.0  # host-bound wait beyond the device's work (host_bound_s)
    # where the dispatcher syncs the host each layer (host_wait_s): the share of the device work in the forward, and
    # the forward device work left to run beside the host's issue of the experts once the sync has released it
    forward_share: float = 0.5
    sync_window_s: float = 0.0

    @property
    def cp_exposed_s(self) -> float:
        """Ring attention overlaps each K/V block transfer with one step kernel (``ring_steps_exposed_s``; an
        all-gather only with the local block; Ulysses' all-to-alls with nothing; a2a+p2p: its ring as a ring, its
        all-to-alls with nothing)."""
        ring = self.cp_s - self.cp_unhidden_s
        if self.cp_ring_steps > 1:
            return self.cp_unhidden_s + ring_steps_exposed_s(ring, self.attention_f_s,
                                                             self.attention_s - self.attention_f_s, self.cp_ring_steps)
        return self.cp_unhidden_s + ring_exposed_s(ring, self.attention_s * self.cp_window)

    @property
    def total_s(self) -> float:
        return (self.forward_s + self.backward_s + self.recompute_s + self.tp_s + self.ep_s + self.cp_exposed_s
                + self.host_s)


def dsa_path_s(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, dp: int,
               rt: Runtime | None) -> float:
    """Seconds one layer's DeepSeek sparse attention costs on ``rt``'s path (``cost_models.dsa``: Megatron-Core's
    unfused one, or the fused kernels) beyond the reference pricing (``rt`` None: the fused design), for one
    micro-batch on one rank: its own ops on the unfused path (``dsa.op_runtime``) priced with ``rt`` less with None,
    each op's forward pass, backward and recompute as the intra-op strategies sum them (``op_forward_s``,
    ``op_recompute_s``), plus the TP collectives Megatron's DSAttention runs (``tp_comm.dsa_tp_cost``). 0 without
    DSA. What the search's per-op pricing adds to the reference where it hands DSA ``dsa.dsa_path_runtime``
    (search/strategies.py), so the Scorer's knob delta measures ``layer_cost`` against it (search/score.py
    ``knob_delta_s``)."""
    if rt is None or model.dsa is None or graph.kind not in DECODER_KINDS:
        return 0.0
    modules = modules_in_effect(par, None)
    seconds = 0.0
    for op in graph.ops:
        if op_runtime(op, model, rt) is None:
            continue
        for r, sign in ((rt, 1.0), (None, -1.0)):
            oc = op_compute(op, graph, model, cluster, job, par, r)
            seconds += sign * (op_forward_s(op, graph, oc, par.recompute, modules) + oc.backward_s
                               + op_recompute_s(op, graph, oc, par.recompute, modules))
    if par.tp > 1:
        seconds += dsa_tp_cost(graph, model, cluster, job, par, RankStrides.megatron(par.tp, par.cp, dp).tp, rt)[0]
    return seconds


def a2a_sm_slowdown(sm_share: float, compute_s: float, a2a_s: float) -> float:
    """Factor on a layer's ``compute_s`` of compute run beside ``a2a_s`` of all-to-all whose kernels hold
    ``sm_share`` of the SMs while they run (``moe.dispatcher_sm_fraction``): during the all-to-all the compute
    progresses at 1 − f, so it ends f·min(A, C/(1 − f)) later; 1/(1 − f) once the all-to-all outlasts it."""
    if sm_share <= 0.0 or compute_s <= 0.0:
        return 1.0
    return 1.0 + sm_share * min(a2a_s, compute_s / (1.0 - sm_share)) / compute_s


def layer_tp_cost(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                  dp: int, rt: Runtime | None = None, compute: OpCompute | None = None) -> tuple[float, float]:
    """(exposed seconds, bytes each rank sends) of one decoder layer's TP collectives for one micro-batch on one rank:
    its boundaries (``tp_boundary_costs``), the K/V gather of replicated KV heads, unfused DSA's own; (0, 0) at tp 1
    or outside a decoder block. ``compute``: ``layer_compute`` of the same arguments, when the caller has it."""
    tp_s = tp_bytes = 0.0
    if par.tp > 1 and graph.kind in DECODER_KINDS:
        stride = RankStrides.megatron(par.tp, par.cp, dp).tp
        cc = compute if compute is not None else _compute(graph, model, cluster, job, par, rt)
        ops = cc.ops or None  # op_compute of each op in the job's precision, where cc holds them (job_precision_ops)
        for seconds, nbytes in tp_boundary_costs(graph, cluster, job, par, stride, par.sequence_parallel, rt,
                                                 model, ops):
            tp_s, tp_bytes = tp_s + seconds, tp_bytes + nbytes
        seconds, nbytes = kv_gather_cost(graph, cluster, job, par, stride)
        tp_s, tp_bytes = tp_s + seconds, tp_bytes + nbytes
        seconds, nbytes = dsa_tp_cost(graph, model, cluster, job, par, stride, rt)  # unfused DSA's own
        tp_s, tp_bytes = tp_s + seconds, tp_bytes + nbytes
    return tp_s, tp_bytes


def layer_cost(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
               par: ParallelConfig, dp: int, rt: Runtime | None = None, compute: OpCompute | None = None,
               tp_cost: tuple[float, float] | None = None) -> LayerCost:
    """Cost of one layer of ``graph.kind`` for one micro-batch on one rank, as runtime ``rt`` runs it (its knobs:
    ``knob_effects``; None: the efficiency's own settings, as the intra-op ILP prices ops). ``compute``:
    ``layer_compute`` of the same arguments, ``tp_cost`` their ``layer_tp_cost``, when the caller has them."""
    c = par.cp  # (ep: read where a layer has experts, so a dense layer's cost reads none)
    strides = RankStrides.megatron(par.tp, c, dp)
    cc = compute if compute is not None else _compute(graph, model, cluster, job, par, rt)
    modules = modules_in_effect(par, rt)
    forward, backward = cc.forward_pass_s(par.recompute, graph, modules), cc.backward_s  # (op_cost.skips_forward)
    recompute = cc.recompute_s(par.recompute, graph, modules)
    tokens = par.micro_batch_size * job.seq_len / c
    ep_s = ep_bytes = cp_s = cp_bytes = 0.0
    is_block = graph.kind in DECODER_KINDS
    ops = cc.ops or None  # op_compute of each op in the job's precision, where cc holds them (job_precision_ops)
    tp_s, tp_bytes = tp_cost if tp_cost is not None else layer_tp_cost(graph, model, cluster, job, par, dp, rt, cc)
    e = par.ep if graph.kind in MOE_KINDS else 1
    if e > 1:
        local_tokens = tokens / (par.tp if par.sequence_parallel else 1)
        dispatcher = moe_dispatcher(cluster, rt)
        parts = moe_all_to_all_parts(model, cluster, job, local_tokens, e, strides.ep,
                                     rho=a2a_rows(model, job, par, cluster, rt), dispatcher=dispatcher)
        ep_s, ep_bytes = sum(p[0] for p in parts), sum(p[1] for p in parts)
        again = ep_forward_repeats(graph, modules, par, rt)  # a recompute that re-runs dispatch and combine
        ep_s, ep_bytes = ep_s * (1 + again), ep_bytes * (1 + again)
        if par.schedule == "dualpipe" or moe_a2a_overlapped(cluster, rt):
            # Dispatch/combine of one micro-batch run under another's compute (DualPipe pairs a forward and a
            # backward chunk; Megatron-Core's 1F1B A2A overlap merges them). The dispatcher's kernels run on SMs
            # taken from compute (DeepEP 20 of 132 on H800, DeepSeek-V3 report §3.2.2; NCCL's all-to-all one CTA per
            # p2p channel: moe.dispatcher_sm_fraction) while they run: compute beside them goes at 1 − f of its
            # rate, so C seconds of compute with A seconds of all-to-all beside it take C + f·min(A, C/(1 − f))
            # (C/(1 − f) once the all-to-alls outlast the compute). Under Megatron's overlap A is the four
            # overlapped all-to-alls; a ``moe`` recompute's re-run ones run exposed, outside its phases (below).
            beside = ep_s if par.schedule == "dualpipe" else sum(p[0] for p in parts)
            slow = a2a_sm_slowdown(dispatcher_sm_fraction(dispatcher, cluster, e, strides.ep), forward + backward,
                                   beside)
            forward, backward = forward * slow, backward * slow
            if par.schedule == "dualpipe":  # only what the layer's compute cannot cover stays exposed
                ep_s = max(0.0, ep_s - (forward + backward))
            else:
                nodes = a2a_overlap_compute_split(graph, model, cluster, job, par, rt, ops)
                nodes = OverlapNodes(*(x * slow for x in (nodes.attn_f, nodes.attn_b, nodes.mlp_f, nodes.mlp_b,
                                                          nodes.comb_f, nodes.comb_b)))
                # the ``moe`` module's re-run dispatch/combine sit in the backward's recompute, outside the steps
                ep_s = (a2a_overlap_exposed_s([p[0] for p in parts], nodes)
                        + again * sum(p[0] for p in parts))
    window, unhidden, ring_steps = 1.0, 0.0, 0
    if c > 1 and is_block:
        cp_s, cp_bytes, window, unhidden, ring_steps = cp_comm(graph, cluster, job, par, strides.cp, rt, model.mamba)
    out = LayerCost(forward, backward, recompute, cc.attn_f + cc.attn_b, tp_s, ep_s, cp_s, tp_bytes,
                    ep_bytes, cp_bytes, window, unhidden, cp_ring_steps=ring_steps, attention_f_s=cc.attn_f)
    if graph.kind in MOE_KINDS:
        # forward device work: compute, the forward's exposed all-to-alls (all of dispatch and combine without the
        # overlap), half of the TP/CP collectives; after the sync the host issues the experts beside the device
        # running them (and, for ``alltoall``, the dispatch all-to-all issued after its sync point)
        ep_fwd = 0.0 if e <= 1 or par.schedule == "dualpipe" or moe_a2a_overlapped(cluster, rt) \
            else (parts[0][0] + parts[1][0])
        expert_f = sum(oc.forward_s for op, oc in zip(graph.ops, ops or job_precision_ops(graph, model, cluster, job,
                                                                                          par, rt))
                       if op.kind == "experts")
        win = expert_f + (parts[0][0] if e > 1 and moe_dispatcher(cluster, rt) == "alltoall" else 0.0)
        share = (forward + ep_fwd + (tp_s + cp_s) / 2) / out.total_s if out.total_s > 0 else 0.5
        out = replace(out, forward_share=share, sync_window_s=win)
    host = host_wait_s(graph, model, cluster, par, rt, out.total_s, out.forward_share, out.sync_window_s)
    return replace(out, host_s=host) if host else out
