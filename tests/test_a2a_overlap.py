"""The A2A-overlap layer step (cost_models.a2a_overlap) against the installed megatron-core's combined 1F1B code:
issue order, streams, per-micro-batch event chains and what the combine node runs; and worked cases of the
two-stream schedule."""

from __future__ import annotations

import inspect
import re

import pytest

from cost_models.a2a_overlap import ISSUE_ORDER, NODE_STREAM, OverlapNodes, exposed_s, layer_step_s

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
