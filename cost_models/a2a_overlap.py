"""Megatron-Core's EP A2A overlap (``overlap_moe_expert_parallel_comm``, the combined 1F1B schedule) as the code
schedules one MoE layer step: the forward of one micro-batch and the backward of another, issued by one host thread
onto two CUDA streams (megatron-core 0.16.1).

What runs where (models/common/model_chunk_schedule_plan.py:160-164 ``create_node``; models/gpt/
fine_grained_callables.py ``build_transformer_layer_callables``):

- comp stream: ``attn`` (attention block, pre-MLP norm, router, dispatch preprocess/permutation, and the shared
  experts: ``shared_experts_compute`` runs inside the attention node, the overlap requires
  ``moe_shared_expert_overlap`` off, transformer_config.py:1886-1888) and ``mlp`` (the routed experts with the
  dispatcher's post-/pre-processing around them, moe_layer.py:313-327 ``routed_experts_compute``);
- comm stream: ``moe_dispatch`` (the all-to-all) and ``moe_combine``: the all-to-all *and* what follows it in
  ``submodule_combine_forward`` (fine_grained_callables.py:544-583): the unpermutation (``combine_postprocess``),
  the shared-expert add and the residual add (``mlp_bda``). Autograd runs each backward op on its forward op's
  stream, so their gradients run on the comm stream too.

Issue order of one step (model_chunk_schedule_plan.py:215-253, ``TransformerLayerSchedulePlan.run``, default
``ep_overlap_early_attn_memory_release`` off): combine_bwd, attn_fwd, mlp_bwd, dispatch_fwd, dispatch_bwd, mlp_fwd,
combine_fwd, attn_bwd. Each stream runs its nodes in that order (FIFO). Each node first waits on its micro-batch's
one CUDA event and records it when done (pipeline_parallel/utils.py:120-126 ``stream_acquire_context``; one event per
micro-batch's chunk plan, model_chunk_schedule_plan.py:310): a micro-batch's nodes run strictly one after another
across the two streams (forward: attn → dispatch → mlp → combine → next layer's attn; backward: combine → mlp →
dispatch → attn → next layer's combine). Overlap happens only between the two micro-batches' chains.

The layer step's time is the steady-state period of that two-stream schedule (a max-plus recurrence, run here for a
few identical steps); what shows of the all-to-alls is the period less the layer's compute.

The host issues both micro-batches' nodes in that order, one thread. A dropless dispatcher blocks it once per layer
step, in the forward's dispatch node, on device work up to the forward's attention node (``HOST_SYNC_NODE``,
``HOST_SYNC_WAITS_FOR``: alltoall's D2H event, DeepEP's CPU wait for the routed counts, HybridEP's blocking
dispatch); the backward's experts, issued between the two, stay queued (``queued_at_host_sync``), so the sync does
not drain the device and the host's issue runs beside the device's work: ``ep_comm.host_bound_s`` prices the host
as max(device, host) here (``moe.host_synced``). On the 44 held-out A2A-overlap rows a three-resource version of the
recurrence (host, comp, comm; a node's device work neither starts before its issue starts nor ends before it ends;
that sync edge) gave the same period, and one whose sync drained every queued node would not explain their misses
either: host-bound, the device trails the host by about one node (issue-12, s13-a2app).

Not modelled: ``delay_wgrad_compute`` (its weight gradients move out of mlp_bwd / attn_bwd: priced inside them, as
without it). The Megatron-Bridge perf recipes set it with the overlap (scripts/performance/utils/overrides.py:148-153
@ v0.3.0); it issues the experts' wgrad after the forward's dispatch node (model_chunk_schedule_plan.py:231), so only
their dgrad is queued at the host sync. With the host as a third resource the host then shows only near host ≈ device,
by less than the wgrad's device time (tests/test_a2a_overlap.py); at the held-out rows' node times (B300 Qwen3-235B
host-bound, the H100 rows device-bound) the period did not move (one split of the host over the nodes tried). The one
public A/B measures 31.31 s → 31.20 s (Megatron-Bridge skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md @
067f987df), where splitting the wgrad out of the two-stream step would price its layer step −4% (issue-12, s16-moevp).
Concurrent kernels slow each other only by the SMs the dispatcher's kernels hold (priced by the caller:
DeepEP's / HybridEP's configured SMs, NCCL's all-to-all one CTA per p2p channel: moe.dispatcher_sm_fraction). They
also contend for memory bandwidth (Megatron-Bridge skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md @ 067f987df,
pitfall 6; NVIDIA/nccl#1428: an A100 GEMM 1.18 -> 2.08 ms beside an all-gather, "competing for memory bandwidth";
nccl#689: NCCL CTAs never share an SM), but no public source gives a rate for these kernels; and the held-out
A2A-overlap misses of the alltoall / DeepEP rows scale with the host-issued experts, not with the overlapped work
(issue-12, s11-a2a): they look like device + host, a serialisation no sync in this code path explains (s13-a2app).
"""

from __future__ import annotations

from dataclasses import dataclass

# (micro-batch, node) in the order TransformerLayerSchedulePlan.run issues them (tests read the installed source)
ISSUE_ORDER: tuple[tuple[str, str], ...] = (
    ("b", "moe_combine"), ("f", "attn"), ("b", "mlp"), ("f", "moe_dispatch"),
    ("b", "moe_dispatch"), ("f", "mlp"), ("f", "moe_combine"), ("b", "attn"),
)
NODE_STREAM = {"attn": "comp", "mlp": "comp", "moe_dispatch": "comm", "moe_combine": "comm"}
# Where a dropless dispatcher's once-per-layer host sync falls in the step, the same for the three (megatron-core
# 0.16.1; the same lines' code at core_v0.17.1 / 0.18.0 / 0.19.0): in the forward's dispatch node, waiting on device
# work up to the forward's attention node. ``alltoall``: the D2H copies of the split sizes are ordered after the
# compute stream inside the attention node's preprocess (token_dispatcher.py:629-631 "before_permutation_1",
# :873 ``cuda_dtoh_stream.wait_stream(current_stream())``), the host waits on that copy's event in the dispatch
# node (:663-665 "before_ep_alltoall", :897-899 ``d2h_event.synchronize()``: one event, not the device).
# ``deepep``: the CPU waits inside DeepEP's ``Buffer.dispatch`` for the routed counts (fused_a2a.py:103-105), whose
# kernels follow the dispatch node's stream (its wait on the forward micro-batch's event: the attention node), and
# returns them as a host list (:135 ``torch.tensor(num_recv_tokens_per_expert_list)``, so the expert node's
# ``.item()``, token_dispatcher.py:1302, reads a CPU tensor and does not sync). ``hybridep``: the blocking
# ``dispatch_with_permute`` in the dispatch node (fused_a2a.py:365-383).
HOST_SYNC_NODE = ("f", "moe_dispatch")
HOST_SYNC_WAITS_FOR = ("f", "attn")
_STEPS = 8  # identical layer steps simulated; the period is the mean of the last half


@dataclass(frozen=True)
class OverlapNodes:
    """Device seconds of each node of one MoE layer for one micro-batch: compute of the ``attn`` and ``mlp`` nodes
    and of the combine node's post-processing (``comb_*``), forward and backward; the four all-to-alls apart."""

    attn_f: float
    attn_b: float
    mlp_f: float
    mlp_b: float
    comb_f: float = 0.0
    comb_b: float = 0.0

    @property
    def compute_s(self) -> float:
        return self.attn_f + self.attn_b + self.mlp_f + self.mlp_b + self.comb_f + self.comb_b


def queued_at_host_sync() -> tuple[tuple[str, str], ...]:
    """The nodes the host has issued when it blocks at ``HOST_SYNC_NODE`` whose device work the sync does not wait
    for: those issued after ``HOST_SYNC_WAITS_FOR`` (the backward's experts, ``("b", "mlp")``). Their device work is
    queued while the host resumes, so the sync does not leave the device idle (``moe.host_synced``)."""
    i, j = ISSUE_ORDER.index(HOST_SYNC_WAITS_FOR), ISSUE_ORDER.index(HOST_SYNC_NODE)
    return ISSUE_ORDER[i + 1:j]


def layer_step_s(a2a: list[float], nodes: OverlapNodes) -> float:
    """Steady-state time of one overlapped layer step (one layer's forward of micro-batch i and its backward of
    micro-batch j). ``a2a`` = the four all-to-alls as ``ep_comm.moe_all_to_all_parts`` orders them: forward
    dispatch, forward combine, combine's backward, dispatch's backward."""
    disp_f, comb_f, comb_b, disp_b = a2a
    cost = {("f", "attn"): nodes.attn_f, ("b", "attn"): nodes.attn_b,
            ("f", "mlp"): nodes.mlp_f, ("b", "mlp"): nodes.mlp_b,
            ("f", "moe_dispatch"): disp_f, ("b", "moe_dispatch"): disp_b,
            ("f", "moe_combine"): comb_f + nodes.comb_f, ("b", "moe_combine"): comb_b + nodes.comb_b}
    stream = {"comp": 0.0, "comm": 0.0}  # when each stream's last node ends
    event = {"f": 0.0, "b": 0.0}  # when each micro-batch's last node ends
    ends = []
    for _ in range(_STEPS):
        for mb, node in ISSUE_ORDER:
            s = NODE_STREAM[node]
            stream[s] = event[mb] = max(stream[s], event[mb]) + cost[(mb, node)]
        ends.append(max(stream.values()))
    half = _STEPS // 2
    return (ends[-1] - ends[half - 1]) / (_STEPS - half)


def exposed_s(a2a: list[float], nodes: OverlapNodes) -> float:
    """What the four all-to-alls add to one layer step beyond its compute (``layer_step_s`` − compute, ≥ 0)."""
    return max(0.0, layer_step_s(a2a, nodes) - nodes.compute_s)
