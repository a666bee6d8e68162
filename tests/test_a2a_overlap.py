"""The A2A-overlap layer step (cost_models.a2a_overlap) against the installed megatron-core's combined 1F1B code:
issue order, streams, per-micro-batch event chains, what the combine node runs and where the dispatchers' host sync
falls in the step; and worked cases of the two-stream schedule, with and without the host as a third resource."""

from __future__ import annotations

import inspect
import re

import pytest

from cost_models.a2a_overlap import (HOST_SYNC_NODE, HOST_SYNC_WAITS_FOR, ISSUE_ORDER, NODE_STREAM, OverlapNodes,
                                     exposed_s, layer_step_s, queued_at_host_sync)

plan = pytest.importorskip("megatron.core.models.common.model_chunk_schedule_plan")


def test_issue_order_is_megatron_cores() -> None:
    """TransformerLayerSchedulePlan.run issues the nodes in ISSUE_ORDER (default ep_overlap_early_attn_memory_release
    off: attn backward last; the weight-gradient calls and MTP post-process are not nodes of an MoE decoder layer)."""
    src = inspect.getsource(plan.TransformerLayerSchedulePlan.run)
    calls = re.findall(r"(f|b)_layer\.(attn|moe_dispatch|mlp|moe_combine)\.(forward|backward)\(", src)
    # the attn backward appears twice (early-release branch first, default branch later): keep the default one
    order = [(mb, node) for mb, node, _ in calls]
    first = order.index(("b", "attn"))
    assert order[first + 1:].count(("b", "attn")) == 1
    order = order[:first] + order[first + 1:]
    assert tuple(order) == ISSUE_ORDER
    assert all(d == ("forward" if mb == "f" else "backward") for mb, _, d in calls)


def test_nodes_run_on_the_streams_priced() -> None:
    src = inspect.getsource(plan.TransformerLayerSchedulePlan._build_callable_nodes)
    for node, stream in NODE_STREAM.items():
        assert re.search(rf"self\.{node} = create_node\({stream}_stream, ", src), (node, stream)


def test_each_node_waits_for_and_records_its_microbatch_event() -> None:
    """stream_acquire_context: wait on the micro-batch's event before the node, record it after: a micro-batch's
    nodes are chained across the two streams; one event per micro-batch's chunk plan."""
    from megatron.core.pipeline_parallel import utils

    src = inspect.getsource(utils.stream_acquire_context.__wrapped__)
    assert src.index("event.wait(stream)") < src.index("yield") < src.index("event.record(stream)")
    node_src = inspect.getsource(utils.ScheduleNode._forward) + inspect.getsource(utils.ScheduleNode._backward)
    assert node_src.count("stream_acquire_context(self.stream, self.event)") == 2
    assert "self._event = torch.cuda.Event()" in inspect.getsource(plan.TransformerModelChunkSchedulePlan.__init__)


def test_combine_node_runs_unpermute_and_residual_and_attn_node_the_shared_experts() -> None:
    """What ep_comm.COMBINE_NODE_OPS puts on the comm stream: the combine node runs the all-to-all, then
    combine_postprocess (+ shared expert add) and the residual add; the shared experts run in the attention node."""
    fgc = pytest.importorskip("megatron.core.models.gpt.fine_grained_callables")
    src = inspect.getsource(fgc.build_transformer_layer_callables)
    comb = src[src.index("def submodule_combine_forward"):src.index("def mlp_wrapper")]
    assert comb.index("layer.mlp.combine(") < comb.index("layer.mlp.postprocess(") < comb.index("layer.mlp_bda(")
    attn = src[src.index("def submodule_attn_forward"):src.index("def submodule_dispatch_forward")]
    assert "shared_experts_compute(" in attn


def test_worked_case_dispatch_forward_gates_the_expert_forward() -> None:
    """Dispatch forward 3, the rest 1 each; attn 1 / 2, mlp 3 (fwd) / 1 (bwd). One step, by the code's rules:
    comb_b [0,1] ‖ attn_f [0,1]; mlp_b [1,2] (after comb_b, its event) ‖ disp_f [1,4]; disp_b [4,5] (comm FIFO);
    mlp_f waits for disp_f (its event): [4,7], so the comp stream idles 2; comb_f [7,8] ‖ attn_b [7,9]. Next step's
    comb_b waits for attn_b (event): period 9 against 7 of compute. A three-phase split (combine_b | dispatch_f +
    dispatch_b beside mlp_b + mlp_f | combine_f) would find every phase covered and price 0."""
    nodes = OverlapNodes(attn_f=1.0, attn_b=2.0, mlp_f=3.0, mlp_b=1.0)
    a2a = [3.0, 1.0, 1.0, 1.0]  # dispatch fwd, combine fwd, combine bwd, dispatch bwd
    assert layer_step_s(a2a, nodes) == pytest.approx(9.0)
    assert exposed_s(a2a, nodes) == pytest.approx(2.0)


def test_compute_bound_step_hides_every_all_to_all_and_comm_bound_step_is_the_comm_stream() -> None:
    nodes = OverlapNodes(attn_f=2.0, attn_b=4.0, mlp_f=2.0, mlp_b=4.0)
    assert exposed_s([0.5, 0.5, 0.5, 0.5], nodes) == 0.0
    # all-to-alls longer than every compute node: the comm stream runs them back to back, 4 x 5
    assert layer_step_s([5.0, 5.0, 5.0, 5.0], nodes) == pytest.approx(20.0)
    # the combine node's post-processing sits on the comm stream behind its all-to-all
    assert layer_step_s([5.0, 5.0, 5.0, 5.0], OverlapNodes(2.0, 4.0, 2.0, 4.0, 0.5, 0.5)) == pytest.approx(21.0)


def test_host_sync_sits_in_the_dispatch_node_and_waits_on_the_attention_node() -> None:
    """Each dropless dispatcher's once-per-layer host sync (``moe.DISPATCHER_HOST_SYNC``) as the combined step runs
    it: the attention node runs the dispatcher's preprocess (alltoall: the D2H copies of the split sizes, ordered
    after the compute stream there), the dispatch node the sync (alltoall: that copy's event, not the device;
    DeepEP: its CPU wait for the routed counts, returned as a host list, so the expert node's ``.item()`` does not
    sync; HybridEP: its blocking dispatch). The backward's experts, issued between the two nodes, stay queued."""
    fgc = pytest.importorskip("megatron.core.models.gpt.fine_grained_callables")
    td = pytest.importorskip("megatron.core.transformer.moe.token_dispatcher")
    fa = pytest.importorskip("megatron.core.transformer.moe.fused_a2a")
    from megatron.core.transformer.moe.moe_layer import MoELayer

    src = inspect.getsource(fgc.build_transformer_layer_callables)
    attn = src[src.index("def submodule_attn_forward"):src.index("def submodule_dispatch_forward")]
    disp = src[src.index("def submodule_dispatch_forward"):src.index("def submodule_moe_forward")]
    assert "layer.mlp.preprocess(" in attn and "layer.mlp.dispatch(" in disp
    assert "token_dispatcher.dispatch_preprocess(" in inspect.getsource(MoELayer.preprocess)
    assert "token_dispatcher.token_dispatch(" in inspect.getsource(MoELayer.dispatch)
    # alltoall: D2H in the preprocess (the default dtoh point), event sync before the EP all-to-all
    a2a = td.MoEAlltoAllTokenDispatcher
    assert 'self.cuda_dtoh_point = "before_permutation_1"' in inspect.getsource(a2a.__init__)
    at = r'_maybe_dtoh_and_synchronize\(\s*"{}"'
    assert re.search(at.format("before_permutation_1"), inspect.getsource(a2a.dispatch_preprocess))
    assert re.search(at.format("before_ep_alltoall"), inspect.getsource(a2a.token_dispatch))
    assert '_maybe_update_cuda_sync_point("before_ep_alltoall")' in inspect.getsource(a2a.preprocess)
    sync = inspect.getsource(a2a._maybe_dtoh_and_synchronize)
    assert sync.index("wait_stream(torch.cuda.current_stream())") < sync.index("record_event()")
    assert "self.d2h_event.synchronize()" in sync and "torch.cuda.synchronize(" not in sync
    # deepep: the CPU waits inside the dispatch and gets the counts on the host
    deepep = inspect.getsource(fa.FusedDispatch.forward)
    assert "CPU will wait for GPU's signal" in deepep and "torch.tensor(num_recv_tokens_per_expert_list)" in deepep
    assert "self.tokens_per_expert = num_tokens_per_expert" in inspect.getsource(td._DeepepManager.dispatch)
    assert "self._comm_manager.dispatch(" in inspect.getsource(td.MoEFlexTokenDispatcher.token_dispatch)
    # hybridep: dropless leaves num_permuted_tokens None, so the dispatch blocks
    assert "non_blocking = num_permuted_tokens is not None" in inspect.getsource(fa.HybridEPDispatch.forward)
    assert "self.num_permuted_tokens = None" in inspect.getsource(td._HybridEPManager.__init__)
    # the model: the sync in the forward's dispatch node, on the forward's attention; the backward's experts between
    assert (HOST_SYNC_NODE, HOST_SYNC_WAITS_FOR) == (("f", "moe_dispatch"), ("f", "attn"))
    assert queued_at_host_sync() == (("b", "mlp"),)


def _step_with_host(cost: dict, host: dict, drain: bool = False, steps: int = 16,
                    order: tuple = ISSUE_ORDER) -> float:
    """Steady-state period of the step with the host as a third resource: the host issues the nodes in ``order``
    (default ISSUE_ORDER; ``host`` seconds each), a node's device work neither starts before its issue starts nor
    ends before its issue ends, and the host blocks at HOST_SYNC_NODE until HOST_SYNC_WAITS_FOR has run (``drain``:
    until every stream has run all it was given, the sync the code does not have). A node not in ISSUE_ORDER
    (``DW``, the delayed weight gradients) runs on the compute stream without the micro-batch's event."""
    stream, event, ends, marks, h = {"comp": 0.0, "comm": 0.0}, {"f": 0.0, "b": 0.0}, {}, [], 0.0
    for _ in range(steps):
        marks.append(max(h, *stream.values()))
        for node in order:
            if node == HOST_SYNC_NODE:
                h = max(h, *stream.values()) if drain else max(h, ends[HOST_SYNC_WAITS_FOR])
            h0, h = h, h + host[node]
            if node not in ISSUE_ORDER:
                stream["comp"] = ends[node] = max(max(stream["comp"], h0) + cost[node], h)
                continue
            s = NODE_STREAM[node[1]]
            stream[s] = event[node[0]] = ends[node] = max(max(stream[s], event[node[0]], h0) + cost[node], h)
    half = steps // 2
    return (marks[-1] - marks[half]) / (steps - 1 - half)


@pytest.mark.parametrize("host_mlp, drained", [((0.5, 1.0), 6.5), ((2.0, 3.0), 7.75), ((3.0, 4.5), 9.0)])
def test_host_runs_beside_the_queued_backward_experts(host_mlp: tuple[float, float], drained: float) -> None:
    """attn 1 / 2, mlp 1 / 2, each all-to-all 0.25 (device period 6); the host issues each node in 0.25 but the
    experts, forward / backward ``host_mlp``. With the code's sync (on the forward's attention, the backward's
    experts queued) the step is max(device, host): what ep_comm.host_bound_s prices under the overlap. A sync that
    drained the device would cost more where the host is not far behind (6.5 against 6; 7.75 against 6.5), and
    nothing more where it is (9: the device trails the host by one node), never device + host (15)."""
    nodes = OverlapNodes(attn_f=1.0, attn_b=2.0, mlp_f=1.0, mlp_b=2.0)
    a2a = [0.25, 0.25, 0.25, 0.25]
    cost = {("f", "attn"): 1.0, ("b", "attn"): 2.0, ("f", "mlp"): 1.0, ("b", "mlp"): 2.0,
            ("f", "moe_dispatch"): 0.25, ("b", "moe_dispatch"): 0.25, ("f", "moe_combine"): 0.25,
            ("b", "moe_combine"): 0.25}
    host = {node: 0.25 for node in ISSUE_ORDER} | {("f", "mlp"): host_mlp[0], ("b", "mlp"): host_mlp[1]}
    assert layer_step_s(a2a, nodes) == pytest.approx(6.0)
    assert _step_with_host(cost, host) == pytest.approx(max(6.0, sum(host.values())))
    assert _step_with_host(cost, host, drain=True) == pytest.approx(drained)


DW = ("b", "mlp_dw")  # the backward experts' delayed weight gradients (``b_layer.mlp.backward_dw()``)


def test_delay_wgrad_issues_the_expert_wgrad_after_the_host_sync() -> None:
    """``delay_wgrad_compute`` (the Megatron-Bridge perf recipes set it with the overlap: scripts/performance/utils/
    overrides.py:148-153 @ v0.3.0 ``_set_moe_a2a_overlap_overrides``) issues the experts' weight gradients after
    the forward's dispatch node, where the host syncs (model_chunk_schedule_plan.py:231 @ core_v0.16.1), on the
    ambient compute stream without the micro-batch's event (TransformerLayerNode.backward_dw has no
    stream_acquire_context): the work queued at the sync is the backward experts' dgrad only."""
    fgc = pytest.importorskip("megatron.core.models.gpt.fine_grained_callables")
    src = inspect.getsource(plan.TransformerLayerSchedulePlan.run)
    assert src.index("f_layer.moe_dispatch.forward(") < src.index("b_layer.mlp.backward_dw()") \
        < src.index("b_layer.moe_dispatch.backward(")
    assert "stream_acquire_context" not in inspect.getsource(fgc.TransformerLayerNode.backward_dw)


@pytest.mark.parametrize("host_mlp", [(0.5, 1.0), (2.0, 3.0), (3.0, 4.5)])
def test_delayed_wgrad_never_serialises_the_host(host_mlp: tuple[float, float]) -> None:
    """The worked cases of ``test_host_runs_beside_the_queued_backward_experts`` under delay_wgrad_compute: the
    backward experts' device work (2) and host issue split evenly into dgrad (issued before the sync, queued at it)
    and wgrad (``DW``, issued after it). Device-bound (host 3 against device 6) or host-bound (host 9) the step stays
    max(device, host); near balance (host 6.5) less is queued at the sync and the host shows, by less than the
    wgrad's own device time (1), never device + host. So the delayed wgrad cannot be the device + host-sized misses
    of the held-out alltoall / DeepEP A2A-overlap rows (issue 12, s16-moevp), and stays unpriced (a2a_overlap.py)."""
    cost = {("f", "attn"): 1.0, ("b", "attn"): 2.0, ("f", "mlp"): 1.0, ("b", "mlp"): 1.0, DW: 1.0,
            ("f", "moe_dispatch"): 0.25, ("b", "moe_dispatch"): 0.25, ("f", "moe_combine"): 0.25,
            ("b", "moe_combine"): 0.25}
    host = {node: 0.25 for node in ISSUE_ORDER} | {("f", "mlp"): host_mlp[0], ("b", "mlp"): host_mlp[1] / 2,
                                                    DW: host_mlp[1] / 2}
    at = ISSUE_ORDER.index(HOST_SYNC_NODE) + 1
    order = ISSUE_ORDER[:at] + (DW,) + ISSUE_ORDER[at:]
    # device: the compute stream's work (6, the all-to-alls run beside it); issue: the host's
    device = sum(t for node, t in cost.items() if node == DW or NODE_STREAM[node[1]] == "comp")
    issue = sum(host.values())
    period = _step_with_host(cost, host, order=order)
    if abs(issue - device) > 1.0:
        assert period == pytest.approx(max(device, issue))
    else:
        assert max(device, issue) < period < max(device, issue) + cost[DW]
    assert period < device + issue - 2.0
