"""A MoE layer's expert-parallel all-to-alls (dispatch and combine, forward and backward: COST_MODEL.md §4) over
the NVLink / scale-out hierarchy, their overlap under Megatron-Core's combined 1F1B (``a2a_overlap``), and the
host-bound wait where the host issues the experts (``host_bound_s``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from cost_models.a2a_overlap import OverlapNodes, exposed_s as overlap_exposed_s
from cost_models.collectives import link_all_to_all_bandwidth, link_bandwidth, nic_bandwidth, place_group
from cost_models.moe import (host_synced, moe_dispatcher, moe_layer_host_issued, moe_load_imbalance,
                             router_padding_share)
from cost_models.op_cost import OpCompute, job_precision_ops, op_forward_s
from cost_models.opgraph import MOE_KINDS, LayerGraph
from cost_models.recompute import modules_in_effect
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import Runtime


def host_wait_s(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig,
                rt: Runtime | None, device_s: float, forward_share: float = 0.5, window_s: float = 0.0,
                cover_s: float = 0.0) -> float:
    """The host-bound wait a layer of ``graph``'s kind adds to ``device_s`` of device work (one micro-batch,
    forward + backward): ``host_bound_s`` on MoE layers whose experts the host issues (every ``MOE_KINDS`` layer: a
    Gated DeltaNet layer's MoE block is a transformer layer's, its dispatcher and grouped experts alike), else 0. ``forward_share`` /
    ``window_s``: ``LayerCost.forward_share`` / ``sync_window_s`` of the layer; ``cover_s``: the neighbouring non-MoE
    layers' device work the host runs ahead over (``host_cover.moe_host_cover_s``). The one rule ``layer_cost``,
    ``estimate`` and the search's ILP-solved layer times (search.score.layer_pieces) apply."""
    eff = cluster.efficiency
    if graph.kind not in MOE_KINDS or eff.moe_host_s_per_expert + eff.moe_host_s_per_layer <= 0 \
            or not moe_layer_host_issued(rt):
        return 0.0
    synced = host_synced(cluster, par, rt)
    return host_bound_s(device_s, model, cluster, par, forward_share if synced else None, window_s, cover_s)


# Of the kernels TE's GroupedLinear issues per local expert for fc1 and fc2 (layer-micro-batch), the forward's:
# quantize + fprop GEMM per linear = 4 of 10 (the backward: grad quantize, dgrad, wgrad per linear; host_bound_s).
HOST_FORWARD_SHARE = 4 / 10


def host_bound_s(device_s: float, model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig,
                 forward_share: float | None = None, window_s: float = 0.0, cover_s: float = 0.0) -> float:
    """Wait of one MoE layer (one micro-batch, forward + backward) on its host: the device finishes ``device_s`` of
    work, the host needs ``moe_host_s_per_layer`` + ``moe_host_s_per_expert`` × local experts to issue it (TE's
    GroupedLinear loops over the rank's experts, transformer_engine/pytorch/module/grouped_linear.py; the rest of
    the layer's issue, its router, permutes, all-to-alls and module calls, is one per layer whatever the experts).

    Without a per-layer sync (drop-and-pad dispatch: ``moe.dispatcher_syncs_host``; or under the A2A overlap, where
    every dispatcher syncs on the forward's attention with the backward's expert work issued after it still queued:
    ``moe.host_synced``, ``a2a_overlap.queued_at_host_sync``) the host runs ahead: the layer takes max(device, host),
    i.e. device + this. With it (``forward_share`` given: ``moe.host_synced``, dropless, ``moe.DISPATCHER_HOST_SYNC``)
    the sync blocks the host until the device has run the layer up to its experts, so the device queue is empty when
    the host starts issuing them: the forward's expert issue (``HOST_FORWARD_SHARE`` of the host work) overlaps only
    the device work after the sync (``window_s``: the experts, and the dispatch all-to-all where it is issued after
    the sync), the rest of the forward runs on the device alone; the backward has no sync, its issue overlaps its
    device work. So the wait is max(0, host_f − window) + max(0, host_b − device_b),
    ``device_b = (1 − forward_share)·device_s``.

    Priced only where the host issues the experts (``moe.moe_layer_host_issued``: no CUDA graph holds them). Per
    local expert, forward + backward of fc1 and fc2, the host issues TE 2.12's per-expert quantize, fprop, grad
    quantize, dgrad and wgrad (10 kernels: split_quantize and the multi-stream grouped GEMM loop over experts in
    C++, the scale swizzles are one multi-tensor call, pytorch/csrc/extensions/gemm.cpp:502-565) and its Python
    per-expert work (weight workspace, quantizer usage, main_grad / dummy wgrad, grouped_linear.py:106-500 at
    5671fd36) plus Megatron's per-parameter grad hook; the per-layer part (router, permute, dispatch, combine) is
    the per-layer term (both split forward / backward by ``HOST_FORWARD_SHARE``: an assumption inside the joint fit,
    not measured; the forward's router and preprocess are issued before the sync, yet priced as after it).
    ``cover_s``: other layers' device work queued where no sync drains it (``host_cover``), run beside the issue:
    added to the backward's device work (synced) or to the layer's (not synced). Nemotron 3 Super's Blackwell rows
    miss about this host per MoE layer-micro-batch as if uncovered, and far less than its slope at 64 local experts:
    located, not priced (tests/test_nemotron_super_audit.py)."""
    eff = cluster.efficiency
    host = eff.moe_host_s_per_layer + eff.moe_host_s_per_expert * (model.num_experts // par.ep)
    if forward_share is None:
        return max(0.0, host - device_s - cover_s)
    host_f = HOST_FORWARD_SHARE * host
    return max(0.0, host_f - window_s) + max(0.0, host - host_f - (1.0 - forward_share) * device_s - cover_s)


EP_ALL_TO_ALLS = 4  # per MoE layer per micro-batch: dispatch and combine, forward and backward (§4)


def a2a_rows(model: ModelSpec, job: JobSpec, par: ParallelConfig, cluster: ClusterSpec,
             rt: Runtime | None = None) -> float:
    """Token copies the busiest rank's all-to-all moves per routed copy: the imbalance ρ, plus the router's padded
    copies where they are padded before it (``moe.router_padding_share`` with ``a2a``: alltoall)."""
    rho = moe_load_imbalance(model, job, par, cluster, rt)
    return rho + router_padding_share(model, job, par, cluster, rt, a2a=True)


def ep_all_to_all(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                  stride: int, rt: Runtime | None = None) -> tuple[float, float]:
    """(seconds, bf16 payload bytes) of one dispatch or combine all-to-all over the ``par.ep`` ranks at
    ``stride``: the mean of ``moe_all_to_all``'s four (tokens split over TP with SP), × imbalance ρ (§4)."""
    tokens = par.micro_batch_size * job.seq_len / par.cp
    local_tokens = tokens / (par.tp if par.sequence_parallel else 1)
    rho = a2a_rows(model, job, par, cluster, rt)
    payload = local_tokens * model.moe_top_k * model.hidden_size * 2.0 * rho
    total_s, _ = moe_all_to_all(model, cluster, job, local_tokens, par.ep, stride, rho=rho,
                                dispatcher=moe_dispatcher(cluster, rt))
    return total_s / EP_ALL_TO_ALLS, payload


FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128  # fp8 element + one fp32 scale per 128-element tile (report §3.3.2)
# Ops of an MoE layer that run in the A2A overlap's combine node, on the comm stream after the combine all-to-all
# (fine_grained_callables.py:544-586 ``submodule_combine_forward``: ``combine_postprocess`` unpermutes, the shared
# expert's output is added, ``mlp_bda`` adds the residual); ``a2a_overlap.py`` says where every other op runs.
COMBINE_NODE_OPS = ("combine", "shared_add", "mlp_residual")


def a2a_overlap_compute_split(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                              par: ParallelConfig, rt: Runtime | None,
                              ops: Sequence[OpCompute] | None = None) -> OverlapNodes:
    """Compute seconds of one MoE layer per node of the A2A-overlap schedule (``a2a_overlap``): the ``mlp`` node is
    the routed experts (``experts`` ops, named ``expert_*``), the combine node's post-processing ``COMBINE_NODE_OPS``,
    the ``attn`` node everything else (attention block, norms, router, permutation, shared experts:
    fine_grained_callables.py:477 runs them in the attention node). ``ops``: ``op_cost.job_precision_ops`` of the
    graph, when the caller has them."""
    side = {"attn": [0.0, 0.0], "mlp": [0.0, 0.0], "comb": [0.0, 0.0]}
    modules = modules_in_effect(par, rt)
    for op, oc in zip(graph.ops, ops or job_precision_ops(graph, model, cluster, job, par, rt)):
        key = ("mlp" if op.kind == "experts" or op.name.startswith("expert_")
               else "comb" if op.name in COMBINE_NODE_OPS else "attn")
        side[key][0] += op_forward_s(op, graph, oc, par.recompute, modules)  # (op_cost.skips_forward)
        side[key][1] += oc.backward_s
    return OverlapNodes(*side["attn"], *side["mlp"], *side["comb"])


def a2a_overlap_exposed_s(a2a: list[float], nodes: OverlapNodes) -> float:
    """Exposed EP time of one layer under Megatron-Core's A2A overlap (``--overlap-moe-expert-parallel-comm``): the
    steady-state layer step of the combined 1F1B schedule as megatron-core issues it (two streams in FIFO order,
    one CUDA event per micro-batch chaining its nodes: ``cost_models.a2a_overlap``) less the layer's compute.
    ``a2a`` = the four all-to-alls as ``moe_all_to_all_parts`` orders them: forward dispatch, forward combine,
    combine's backward, dispatch's backward."""
    return overlap_exposed_s(a2a, nodes)


def moe_all_to_all(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, local_tokens: float, ep: int,
                   stride: int = 1, *, rho: float | None = None, dispatcher: str | None = None) -> tuple[float, float]:
    """(seconds, bytes each rank sends) of one MoE layer's four all-to-alls (dispatch and combine, forward and
    backward) for ``local_tokens`` tokens on one rank, over an EP group of ``ep`` ranks at ``stride``.

    The group spans ``D`` NVLink domains with ``n`` of its ranks in each (``place_group``). A token's ``k`` routed
    copies reach ``E[domains] = D·(1 − (1 − 1/D)^k)`` domains under uniform routing; group-limited routing with
    one group per domain caps it at the expected number of the ``M = topk_group`` chosen groups' domains,
    ``D·(1 − C(G − G/D, M)/C(G, M))`` (DeepSeek-V3: ≤ 4 nodes). A fraction ``(D − 1)/D`` of them is remote.
    Megatron's ``alltoall`` dispatcher sends each remote copy over the NIC (``k·(D−1)/D`` per token) and local
    copies over NVLink; DeepEP sends one copy per remote domain over the NIC and forwards copies to their GPUs
    over NVLink (``k·(1 − 1/n)``), the two links in parallel: the slower one sets the time; HybridEP (Megatron-Core's
    other flex backend, the one for multi-node NVLink) routes the same way. fp8 training with DeepEP dispatches in
    fp8 (forward dispatch and the backward of combine; combine stays bf16: report §3.3.3); HybridEP is priced in
    bf16. The busiest rank carries ``rho`` × the mean (default the catalog's ``moe_imbalance``;
    ``moe.moe_load_imbalance``); ``dispatcher`` defaults to the catalog's."""
    parts = moe_all_to_all_parts(model, cluster, job, local_tokens, ep, stride, rho=rho, dispatcher=dispatcher)
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def moe_all_to_all_parts(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, local_tokens: float, ep: int,
                         stride: int = 1, *, rho: float | None = None,
                         dispatcher: str | None = None) -> list[tuple[float, float]]:
    """``moe_all_to_all``'s four all-to-alls, (seconds, bytes) each: forward dispatch, forward combine, combine's
    backward (dispatch-shaped), dispatch's backward (combine-shaped)."""
    eff = cluster.efficiency
    k, h = model.moe_top_k, model.expert_input_size  # a latent MoE moves latent-wide tokens (moe_layer.py:265-270)
    place = place_group(ep, stride, cluster)
    d, n = place.n_outer, place.n_inner
    domains = d * (1 - (1 - 1 / d) ** k)
    g, mg = model.arch.router.num_groups, model.arch.router.group_top_k
    if g and mg and d > 1 and g % d == 0:
        per = g // d
        domains = min(domains, d * (1 - math.comb(g - per, mg) / math.comb(g, mg)))
    remote = domains * (d - 1) / d
    dispatcher = dispatcher or eff.moe_dispatcher
    deepep = dispatcher in ("deepep", "hybridep")  # one copy per remote domain, forwarded over NVLink
    fp8 = job.precision == "fp8" and dispatcher == "deepep"
    elem = [FP8_DISPATCH_BYTES if fp8 else 2.0, 2.0, FP8_DISPATCH_BYTES if fp8 else 2.0, 2.0]
    tok = local_tokens * h * (eff.moe_imbalance if rho is None else rho)
    # NCCL's all-to-all (the alltoall dispatcher: torch all_to_all_single) at its own NVLink busbw; DeepEP / HybridEP
    # forward over NVLink with their own kernels, not NCCL's: priced at the ring's (no measurement of theirs is used)
    bw_in = link_all_to_all_bandwidth(cluster) if not deepep else link_bandwidth(cluster)
    bw_out = nic_bandwidth(cluster)
    lat = (n - 1) * cluster.gpu.link_latency_us * 1e-6 + (d - 1) * cluster.gpu.nic_latency_us * 1e-6
    parts = []
    for b in elem:
        if d == 1:
            nic, nvl = 0.0, tok * k * (ep - 1) / ep * b
        elif deepep:
            nic, nvl = tok * remote * b, tok * k * (1 - 1 / n) * b
        else:
            nic, nvl = tok * k * (d - 1) / d * b, tok * k * (n - 1) / ep * b
        parts.append((lat + max(nic / bw_out, nvl / bw_in), nic + nvl))
    return parts
