"""torch FSDP2 (ZeRO-3) holds the output layer and the embedding as its frameworks wrap them
(``memory.zero3_head_unit_bytes``): their own units (torchtitan 0.3.0 and from 83e6941; Megatron-LM
--use-torch-fsdp2), or the root unit that stays gathered through the step (torchtitan before 83e6941; the fsdp2
target's emitted module). For Llama 3 (vocabulary 128256) the output unit is larger than a decoder layer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import estimate
from cost_models.memory import activation_bytes_per_microbatch, graphs_for, stage_memory, zero3_head_unit_bytes
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for


def test_llama3_output_unit_is_larger_than_a_layer() -> None:
    m = load_model("llama3-8b")
    assert m.head_params > 2 * m.layer_params(0)


def test_torchtitan_030_output_unit_in_the_backward() -> None:
    """torchtitan 0.3.0 (own units, fp32 reduce: r = 4): the output unit's gradient and reduce-scatter input beside
    the prefetched last layer, 6·O + 2·L, exceed a layer's 10·L; what exceeds it is added (whole: buffers beside
    the shards)."""
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    job = JobSpec(global_batch_size=16, seq_len=8192)
    par = ParallelConfig(tp=1, micro_batch_size=1, zero_stage=3, recompute="full")
    rt = runtime_for("torchtitan", job, cluster, par)
    assert rt.fsdp_head_unit == "own" and rt.gathered_unit_bytes == 10.0
    o, big = model.head_params, model.layer_params(0)
    extra = zero3_head_unit_bytes(rt, model, 1, big, 8)
    assert extra == pytest.approx(6 * o + 2 * big - 10 * big)
    mem = stage_memory(model, job, par, 8, 0, [model.num_layers], 16, graphs_for(model, 8192), rt)
    # before: the recomputed layer and the decoder layers' units (10 B per parameter of the largest) alone
    recomputed = activation_bytes_per_microbatch(graphs_for(model, 8192)["dense"], model, job,
                                                 par.model_copy(update={"recompute": "none"}), rt)
    assert mem.transients == pytest.approx(recomputed + 10 * big + extra)
    assert extra > 1.3 * 2**30  # 1.31 GiB


def test_root_unit_holds_embedding_and_output_through_the_step() -> None:
    """torchtitan of the 2024-12 runs (9dec370: fully_shard(model) holds embedding, norm, output) and the fsdp2
    target's module: the gathered embedding + norm + output (2 B) and the output layer's gradient (2 B)."""
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    job = JobSpec(global_batch_size=16, seq_len=8192)
    par = ParallelConfig(tp=1, micro_batch_size=1, zero_stage=3, recompute="full")
    vh = model.vocab_size * model.hidden_size
    want = 2 * (model.embedding_params + model.head_params) + 2 * vh  # whole: buffers beside the shards
    for target in ("torchtitan-2024-12", "torchtitan-2025", "fsdp2"):
        rt = runtime_for(target, job, cluster, par)
        assert rt.fsdp_head_unit == "root", target
        assert zero3_head_unit_bytes(rt, model, 1, model.layer_params(0), 8) == pytest.approx(want)
    assert runtime_for("torchtitan-2025-08", job, cluster, par).fsdp_head_unit == "own"
    assert runtime_for("megatron", job, cluster, par).fsdp_head_unit == "own"


def test_head_units_priced_on_the_one_zero3_stage_only() -> None:
    """With pp > 1 torchtitan keeps the stage unsharded (pp_unsharded_bytes holds embedding and output already):
    the head units add nothing there, and the last stage's transients are what they were."""
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 16)
    job = JobSpec(global_batch_size=16, seq_len=8192)
    par = ParallelConfig(tp=1, pp=2, micro_batch_size=1, zero_stage=3, recompute="full")
    rt = runtime_for("torchtitan", job, cluster, par)
    layers = [model.num_layers // 2] * 2
    own = stage_memory(model, job, par, 8, 1, layers, 16, graphs_for(model, 8192), rt)
    root = stage_memory(model, job, par, 8, 1, layers, 16, graphs_for(model, 8192), replace(rt, fsdp_head_unit="root"))
    assert own.transients == root.transients


def test_search_scorer_prices_the_head_units_as_estimate() -> None:
    """The stage DP's Scorer and ``estimate`` agree on ZeRO-3 layouts without pipelining (one cost model)."""
    from cost_models.validate import stage_layers
    from search.planner import to_parallel
    from search.score import Scorer
    from search.space import Tally, enumerate_layouts

    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 16)
    job = JobSpec(global_batch_size=32, seq_len=8192)
    for target in ("torchtitan", "fsdp2", "megatron"):
        layouts = [lay for lay in enumerate_layouts(model, cluster, job, target, {}, Tally())
                   if lay.zero_stage == 3 and lay.pp == 1]
        assert layouts, target
        scorer = Scorer(model, cluster, job)
        for lay in layouts[:: max(1, len(layouts) // 4)]:
            par = to_parallel(model, lay, tuple(stage_layers(model, to_parallel(model, lay, (model.num_layers,)))))
            fs = scorer.score(lay, tuple(stage_layers(model, par)))
            pred = estimate(model, cluster, job, par, target=target, software=Software(**scorer.chosen_knobs(lay)))
            assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9), (target, lay)


def test_megatron_torch_fsdp2_reduces_bf16_gradients() -> None:
    """--use-torch-fsdp2 wraps the bf16 model (Float16Module) with no MixedPrecisionPolicy: bf16 shards and bf16
    reduce-scatters whatever --accumulate-allreduce-grads-in-fp32 says; Float16OptimizerWithFloat16Params holds the
    fp32 master and Adam m, v (2 + 2 + 12 B); the gathered units' reduce-scatter input is bf16 (8 B, not 10)."""
    model, cluster = load_model("llama3-70b"), build_cluster("h100-sxm", 64)
    job = JobSpec(global_batch_size=64, seq_len=8192)
    par = ParallelConfig(tp=1, micro_batch_size=1, zero_stage=3, recompute="full")
    for sw in (None, Software(grad_reduce_dtype="fp32")):
        rt = runtime_for("megatron", job, cluster, par, sw)
        assert (rt.grad_reduce_dtype, rt.reduce_bytes, rt.gathered_unit_bytes) == ("bf16", 2.0, 8.0)
        assert (rt.weight_bytes, rt.grad_bytes, rt.optimizer_bytes) == (2.0, 2.0, 12.0)
    assert any("no effect" in n for n in runtime_for("megatron", job, cluster, par,
                                                     Software(grad_reduce_dtype="fp32")).notes)
    one = runtime_for("megatron", job, cluster, par.model_copy(update={"zero_stage": 1}))
    assert (one.grad_reduce_dtype, one.grad_bytes) == ("fp32", 4.0)  # the distributed optimizer: fp32 main grads
    # the DP reduce-scatter of a zero-3 step moves bf16: half the fp32 payload
    fsdp = estimate(model, cluster, job, par, target="megatron")
    assert fsdp.memory_gib["grads"] == pytest.approx(2 * model.num_params / 64 / 2**30)


def test_root_unit_regathered_under_an_integer_reshard() -> None:
    """An int reshard_after_forward r keeps 1/r of the root after forward (zero3_transient_bytes counts 1/r of every
    parameter) and gathers it whole for backward: the embedding + head weights add 1 - 1/r beyond that; the output
    layer's unsharded gradient is whole (a buffer of its own beside the shards: tests/test_fsdp2_buffers.py)."""
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 16)
    job = JobSpec(global_batch_size=16, seq_len=8192)
    par = ParallelConfig(tp=1, micro_batch_size=1, zero_stage=3, recompute="full")
    rt = replace(runtime_for("fsdp2", job, cluster, par), reshard_after_forward=8)
    assert rt.fsdp_head_unit == "root"
    vh, eh = model.vocab_size * model.hidden_size, model.embedding_params + model.head_params
    got = zero3_head_unit_bytes(rt, model, 1, model.layer_params(0), 16)
    assert got == pytest.approx(2 * eh * (1 - 1 / 8) + 2 * vh)
    assert zero3_head_unit_bytes(replace(rt, reshard_after_forward=False), model, 1, model.layer_params(0), 16) == \
        pytest.approx(2 * vh)
