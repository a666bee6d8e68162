"""torch FSDP2's gathered parameters and reduce-scatter inputs are buffers of their own, full size, beside the rank's
shards, at any shard group: one rank included, which is torchtitan 0.3.0's ZeRO-0 (FSDP2 over one-rank shards). So
``memory.zero3_transient_bytes`` and ``zero3_head_unit_bytes`` count them whole (not less the rank's own shard), and
``stage_memory`` prices torchtitan's ZeRO-0 units as ZeRO-3's at a shard group of 1."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import fsdp2_gathers_per_microbatch, fsdp2_unshard_copy_s
from cost_models.gemm import hbm_time_s
from cost_models.memory import graphs_for, stage_memory, stage_params, zero3_head_unit_bytes, zero3_transient_bytes
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import runtime_for
from titan_toys import titan_fsdp_decoder


def _unit_buffers(monkeypatch: Any, dp_replicate: int, dp_shard: int) -> dict[str, Any]:
    """Run one forward and backward of a 2-block decoder under torchtitan's FSDP2 wrapping (bf16 parameters, fp32
    reduce) and record, per block, what its forward computes with (the unsharded weight) beside its shard, and
    the reduce-scatter inputs ``foreach_reduce`` allocates."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    seen: dict[str, Any] = {"forward": [], "reduce": []}
    copy_in = _fsdp_collectives.foreach_reduce_scatter_copy_in

    def record_copy_in(grads: list[Any], out: Any, world_size: int) -> None:
        seen["reduce"].append((sum(g.numel() for g in grads), out.numel(), out.dtype))
        copy_in(grads, out, world_size)

    monkeypatch.setattr(_fsdp_collectives, "foreach_reduce_scatter_copy_in", record_copy_in)
    with titan_fsdp_decoder(monkeypatch, 2, "bfloat16", False, dp_replicate, dp_shard) as model:
        for block in model.layers.values():
            shard = block.weight.to_local()  # the rank's shard (a DTensor's local tensor) before the forward

            def check(mod: Any, args: Any, shard: Any = shard) -> None:
                w = mod.weight
                seen["forward"].append((w.numel(), w.dtype, shard.numel(), shard.dtype,
                                        w.untyped_storage().data_ptr() != shard.untyped_storage().data_ptr()))

            block.register_forward_pre_hook(check)
        model(torch.zeros(1, 4, dtype=torch.long)).float().sum().backward()
    return seen


@pytest.mark.parametrize("dp_replicate, dp_shard", [(2, 1), (1, 2)])
def test_fsdp2_gathers_into_and_reduces_from_full_buffers_of_their_own(monkeypatch: Any, dp_replicate: int,
                                                                       dp_shard: int) -> None:
    """At a shard group of 1 (torchtitan's ZeRO-0: dp_replicate 2 x fsdp 1) and of 2 (ZeRO-3): each block's forward
    computes with a full-size bf16 weight whose storage is not its fp32 shard's, and each unit's gradients are
    copied into a full-size fp32 reduce-scatter input."""
    seen = _unit_buffers(monkeypatch, dp_replicate, dp_shard)
    assert len(seen["forward"]) == 2
    for numel, dtype, shard_numel, shard_dtype, apart in seen["forward"]:
        assert (numel, str(dtype), str(shard_dtype)) == (64, "torch.bfloat16", "torch.float32")
        assert shard_numel == 64 // dp_shard and apart
    assert seen["reduce"], "no reduce-scatter input recorded"
    for grads, size, dtype in seen["reduce"]:
        assert size == grads and str(dtype) == "torch.float32"


def test_units_priced_whole_at_any_shard_group() -> None:
    """What the torch run above shows, in the cost model: the gathered units and the output unit's excess do not
    shrink with the shard group (8 or 512 ranks, the same bytes)."""
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    job = JobSpec(global_batch_size=16, seq_len=8192)
    par = ParallelConfig(tp=1, micro_batch_size=1, zero_stage=3, recompute="full")
    rt = runtime_for("torchtitan", job, cluster, par)
    assert zero3_transient_bytes(rt, 1, 1) == zero3_transient_bytes(rt, 512, 1) == (0.0, rt.gathered_unit_bytes)
    big = model.layer_params(0)
    assert zero3_head_unit_bytes(rt, model, 1, big, 1) == zero3_head_unit_bytes(rt, model, 1, big, 512) > 0


def test_torchtitan_zero0_units_priced_as_zero3_at_one_rank() -> None:
    """torchtitan 0.3.0's ZeRO-0 without pipelining: its full replicas of the state, plus FSDP2's gathered units and
    output unit as ZeRO-3 prices them (shard group 1); run as DDP (``zero0_fsdp2`` off) it has none of them."""
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    job = JobSpec(global_batch_size=16, seq_len=8192)
    zero0 = ParallelConfig(tp=1, micro_batch_size=1, zero_stage=0, recompute="full")
    zero3 = zero0.model_copy(update={"zero_stage": 3})
    graphs = graphs_for(model, 8192)
    rt0, rt3 = (runtime_for("torchtitan", job, cluster, p) for p in (zero0, zero3))
    assert rt0.zero0_fsdp2
    m0 = stage_memory(model, job, zero0, 8, 0, [model.num_layers], 16, graphs, rt0)
    m3 = stage_memory(model, job, zero3, 8, 0, [model.num_layers], 16, graphs, rt3)
    ddp = stage_memory(model, job, zero0, 8, 0, [model.num_layers], 16, graphs, replace(rt0, zero0_fsdp2=False))
    sp = stage_params(model, zero0, range(model.num_layers), first=True, last=True)
    units = rt0.gathered_unit_bytes * sp.largest_layer + zero3_head_unit_bytes(rt0, model, 1, sp.largest_layer, 1)
    assert m0.transients == pytest.approx(m3.transients)
    assert m0.transients - ddp.transients == pytest.approx(units) and units > 1.5 * 2**30


def _unshard_copies(monkeypatch: Any, dp_replicate: int, dp_shard: int, policy: str) -> dict[int, int]:
    """Per block of the decoder: how many times one forward + backward copied its gathered parameters on the
    compute stream (``FSDPParamGroup.wait_for_unshard`` with an all-gather result to copy out)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    counts: dict[int, int] = {}
    wait = FSDPParamGroup.wait_for_unshard

    def counted(self: Any) -> None:
        if self._all_gather_result is not None:
            counts[id(self)] = counts.get(id(self), 0) + 1
        wait(self)

    monkeypatch.setattr(FSDPParamGroup, "wait_for_unshard", counted)
    with titan_fsdp_decoder(monkeypatch, 2, "bfloat16", False, dp_replicate, dp_shard, policy) as model:
        groups = [block._get_fsdp_state()._fsdp_param_group for block in model.layers.values()]
        model(torch.zeros(1, 4, dtype=torch.long)).float().sum().backward()
    return {i: counts.get(id(g), 0) for i, g in enumerate(groups)}


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module:UserWarning")  # the toy decoder's views: no in-place op
@pytest.mark.parametrize("dp_replicate, dp_shard", [(2, 1), (1, 2)])
def test_unshard_copies_per_microbatch_as_priced(monkeypatch: Any, dp_replicate: int, dp_shard: int) -> None:
    """torchtitan without PP: its "default" policy reshards each block after forward, so a block is unsharded twice
    per micro-batch (forward, backward); "never" keeps it to the backward: once. What
    ``fsdp2_gathers_per_microbatch`` says for reshard_after_forward True and False, at one rank as at two."""
    job, cluster = JobSpec(global_batch_size=8, seq_len=4096), build_cluster("h100-sxm", 8)
    rt = runtime_for("torchtitan", job, cluster, ParallelConfig(zero_stage=3))
    assert rt.reshard_after_forward is True
    for policy, runtime in (("default", rt), ("never", replace(rt, reshard_after_forward=False))):
        want = fsdp2_gathers_per_microbatch(runtime, 1, 1)
        assert _unshard_copies(monkeypatch, dp_replicate, dp_shard, policy) == {0: want, 1: want}, policy


def test_unshard_copy_bytes() -> None:
    """Per parameter and gather: the copy-out (read + write bf16) over a group; over one rank the cast of the fp32
    shard to bf16 and the copy into the output (torchtitan's fp32 shards); Megatron's bf16 shards need no cast."""
    job, cluster = JobSpec(global_batch_size=8, seq_len=4096), build_cluster("h100-sxm", 8)
    titan = runtime_for("torchtitan", job, cluster, ParallelConfig(zero_stage=3))
    mega = runtime_for("megatron", job, cluster, ParallelConfig(zero_stage=3))
    assert (titan.weight_bytes, titan.gather_bytes, mega.weight_bytes, mega.gather_bytes) == (4.0, 2.0, 2.0, 2.0)
    n = 1e9
    assert fsdp2_unshard_copy_s(n, 8, 2.0, titan, cluster) == pytest.approx(hbm_time_s(n * 4 * 2, cluster))
    assert fsdp2_unshard_copy_s(n, 1, 2.0, titan, cluster) == pytest.approx(hbm_time_s(n * 10 * 2, cluster))
    assert fsdp2_unshard_copy_s(n, 1, 1.0, mega, cluster) == pytest.approx(hbm_time_s(n * 4, cluster))
