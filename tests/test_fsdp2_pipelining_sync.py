"""FSDP2 under torch's pipelining: how often a stage's units gather and reduce per step, counted on torch's own code.

torch 2.13's ``PipelineStage`` backs every micro-batch with gradient sync and resharding after backward off
(distributed/pipelining/stage.py:844-848) and reduces once after the last backward (``perform_reduce_grad``,
:1164-1177). Here a 2-unit stage runs ``Schedule1F1B`` on a fake 2-rank data-parallel mesh (CPU), and the
all-gathers and reduce-scatters FSDP2 issues are counted per step: what ``estimate.data_parallel_cost`` prices
(``pp_fsdp_gathers``; one reduce-scatter, blocking) for torchtitan's default under PP (no reshard after forward,
torchtitan distributed/fsdp.py:71-74) and for resharding after forward. Under torchtitan's mixed precision (bf16
parameters, fp32 reduce) the bytes FSDP2 moves to accumulate the unsharded gradients over the micro-batches are
counted the same way: what ``estimate.pp_grad_accumulation_s`` prices (``fsdp2_pp_grad_accumulation_bytes``).
"""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster
from cost_models.estimate import fsdp_gathered_once, pp_fsdp_gathers
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for
from titan_toys import titan_zero0_decoder

MICROBATCHES = 4
UNITS = 2


def _record_accumulation(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Wraps FSDP2's two gradient-accumulation steps (torch 2.13 ``_fsdp_param.py``) to record, per call that did
    work, the bytes per element it read and wrote: the copy into the reduce-dtype accumulator (read the gradient,
    write the accumulator) and each ``+=`` (read both, write the accumulator)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    seen: list[float] = []
    to_acc, acc = FSDPParam.to_accumulated_grad_if_needed, FSDPParam.accumulate_unsharded_grad_if_needed

    def copied(self):  # type: ignore[no-untyped-def]
        grad = self._unsharded_param.grad
        to_acc(self)
        if grad is not None and self.unsharded_accumulated_grad is not None:
            seen.append(grad.element_size() + self.unsharded_accumulated_grad.element_size())

    def added(self):  # type: ignore[no-untyped-def]
        grad, into = self.unsharded_param.grad, self.unsharded_accumulated_grad
        acc(self)
        if grad is not None and into is not None:
            seen.append(grad.element_size() + 2 * into.element_size())

    monkeypatch.setattr(FSDPParam, "to_accumulated_grad_if_needed", copied)
    monkeypatch.setattr(FSDPParam, "accumulate_unsharded_grad_if_needed", added)
    return seen


def _calls_per_step(monkeypatch: pytest.MonkeyPatch, reshard_after_forward: bool,
                    reduce_dtype: str | None = None) -> tuple[int, int, list[float]]:
    """(all-gathers, reduce-scatters, HBM bytes per element of each gradient accumulation FSDP2 ran, in order) of the
    second step (the first also runs the stage's shape inference); ``reduce_dtype``: bf16 parameters reduced in it
    (torchtitan's mixed precision with "float32"), None: no mixed precision."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.testing._internal.distributed.fake_pg import FakeStore

    class Blocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(UNITS)])

        def forward(self, x):  # type: ignore[no-untyped-def]
            for layer in self.layers:
                x = layer(x)
            return x

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("pp", "dp"))
        model = Blocks()
        # torchtitan's mixed_precision_param / mixed_precision_reduce defaults (distributed/fsdp.py apply_fsdp)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=getattr(torch, reduce_dtype)) \
            if reduce_dtype else MixedPrecisionPolicy()
        for layer in model.layers:  # one FSDP unit per block, the root holding none (torchtitan's wrapping)
            fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward, mp_policy=mp)
        fully_shard(model, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward, mp_policy=mp)
        seen: list[str] = []
        accumulated = _record_accumulation(monkeypatch)
        gather, scatter = dist.all_gather_single, dist.reduce_scatter_single  # FSDP2's DefaultAllGather / ReduceScatter

        def counted(kind: str, real):  # type: ignore[no-untyped-def]
            def call(*args, **kwargs):  # type: ignore[no-untyped-def]
                seen.append(kind)
                return real(*args, **kwargs)
            return call

        monkeypatch.setattr(dist, "all_gather_single", counted("all_gather", gather))
        monkeypatch.setattr(dist, "reduce_scatter_single", counted("reduce_scatter", scatter))
        stage = PipelineStage(model, 0, 1, torch.device("cpu"), group=mesh.get_group("pp"))
        schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=lambda out, target: out.sum())
        for _ in range(2):
            seen.clear()
            accumulated.clear()
            schedule.step(torch.randn(8, 8), target=torch.randn(8, 8), losses=[])
        return seen.count("all_gather"), seen.count("reduce_scatter"), accumulated
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("reshard_after_forward", [False, True])
def test_stage_units_gather_and_reduce_as_priced(monkeypatch: pytest.MonkeyPatch, reshard_after_forward: bool) -> None:
    gathers, reduces, _ = _calls_per_step(monkeypatch, reshard_after_forward)
    # one stage (pp 1 of the pipeline API): its warm-up is one forward
    assert gathers == UNITS * pp_fsdp_gathers(reshard_after_forward, MICROBATCHES, 1)
    assert reduces == UNITS  # once per step, not per micro-batch
    assert (gathers == UNITS) == (not reshard_after_forward)


def test_torchtitan_keeps_the_stage_gathered_under_pp() -> None:
    """torchtitan's 'default' policy does not reshard after forward under PP; the target's runtime says so."""
    pytest.importorskip("torchtitan")
    from torchtitan.distributed.fsdp import get_fsdp_reshard_after_forward_policy

    assert get_fsdp_reshard_after_forward_policy("default", pp_enabled=True) is False
    assert get_fsdp_reshard_after_forward_policy("default", pp_enabled=False) is True
    cluster, job = build_cluster("h100-sxm", 64, target="torchtitan"), JobSpec(global_batch_size=64, seq_len=4096)
    par = ParallelConfig(pp=2, zero_stage=3)
    rt = runtime_for("torchtitan", job, cluster, par)
    assert rt.reshard_after_forward is False and fsdp_gathered_once(rt, 3, 2)  # its one gather: the first micro-batch
    resharded = runtime_for("torchtitan", job, cluster, par, Software(reshard_after_forward=True))
    assert not fsdp_gathered_once(resharded, 3, 2)  # gathers in every micro-batch, behind each of them


def test_unsharded_gradient_accumulation_bytes_as_torch_moves_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 parameters, fp32 reduce: each unit's two parameters (weight, bias) are copied into an fp32 accumulator in
    the first micro-batch and added to in each later one, the step's total what the price counts per parameter."""
    from cost_models.targets.common import fsdp2_pp_grad_accumulation_bytes

    _, _, seen = _calls_per_step(monkeypatch, False, reduce_dtype="float32")
    first, later = fsdp2_pp_grad_accumulation_bytes("fp32")
    params = 2 * UNITS
    assert len(seen) == params * MICROBATCHES  # every micro-batch, every parameter: none reduced in between
    assert sorted(seen) == sorted([first] * params + [later] * params * (MICROBATCHES - 1))
    assert (first, later) == (6.0, 10.0)


def test_bf16_reduce_leaves_the_accumulation_to_autograd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reduced in the parameter dtype, FSDP2 keeps no accumulator of its own (nothing copied or added by FSDPParam):
    autograd's AccumulateGrad adds each micro-batch's bf16 gradient into ``.grad`` in place, the (0, 6) priced."""
    from cost_models.targets.common import fsdp2_pp_grad_accumulation_bytes, fsdp2_pp_unsharded_bytes

    _, _, seen = _calls_per_step(monkeypatch, False, reduce_dtype="bfloat16")
    assert seen == []
    assert fsdp2_pp_grad_accumulation_bytes("bf16") == (0.0, 6.0)
    assert fsdp2_pp_unsharded_bytes("bf16") == 4.0 and fsdp2_pp_unsharded_bytes("fp32") == 6.0


def test_scorer_prices_the_accumulation_as_estimate() -> None:
    """A torchtitan ZeRO-3 pipeline: the stage times carry the accumulation (estimate.pp_grad_accumulation_s) and
    the search's Scorer prices the split to the same step time; zeroing the bytes removes exactly that much."""
    from dataclasses import replace

    from autoplan.catalog.registry import catalog_model
    from cost_models.estimate import estimate, pp_grad_accumulation_s, stage_time_parts
    from cost_models.memory import stage_params
    from cost_models.validate import pipeline_split
    from search.score import Scorer
    from search.space import Layout

    model = catalog_model("llama3-8b")
    cluster, job = build_cluster("h100-sxm", 16, target="torchtitan"), JobSpec(global_batch_size=32, seq_len=4096)
    par = ParallelConfig(pp=2, zero_stage=3, recompute="full")
    dp, m = 8, 32 // 8
    split = pipeline_split(model, par)
    lay = Layout(tp=1, cp=1, pp=2, dp=dp, ep=1, micro_batch_size=1, m=m, recompute="full", zero_stage=3,
                 hsdp_shard_size=None, schedule=par.schedule, vp=1, sequence_parallel=False, target="torchtitan")
    scorer = Scorer(model, cluster, job)
    sw = Software(**scorer.chosen_knobs(lay))  # the knobs the search sets on the layout (compile)
    rt = runtime_for("torchtitan", job, cluster, par, sw)
    with_acc = stage_time_parts(model, cluster, job, par, rt, dp)
    without = stage_time_parts(model, cluster, job, par, replace(rt, pp_grad_accumulation_bytes=(0.0, 0.0)), dp)
    for s in range(2):
        sp = stage_params(model, par, split.layer_ids[s], first=s == 0, last=s == 1)
        added = with_acc[s]["compute"] - without[s]["compute"]
        assert added == pytest.approx(pp_grad_accumulation_s(sp.dense + sp.expert, m, rt, cluster), rel=1e-12)
        assert added > 0
    pred = estimate(model, cluster, job, par, target="torchtitan", software=sw)
    assert pred.num_microbatches == m
    fs = scorer.score(lay, tuple(split.rank_layers))
    assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
    assert fs.composite_cost == pytest.approx(pred.composite_cost, rel=1e-9)


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module:UserWarning")  # the toy decoder's views: no in-place op
def test_torchtitan_zero0_under_pp_accumulates_as_zero3(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchtitan 0.3.0's ZeRO-0 (dp_replicate 2 x dp_shard 1) is FSDP2 too: ``apply_fsdp_to_decoder`` wraps the
    decoder on the (dp_replicate, fsdp) mesh with the mixed-precision policy, not resharded after forward with PP.
    Run through torch's pipelining it accumulates each parameter's gradient in an fp32 accumulator exactly as
    ZeRO-3 does (``Runtime.zero0_fsdp2``, ``memory.pp_unsharded_stage``)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from cost_models.memory import pp_unsharded_stage
    from cost_models.targets.common import fsdp2_pp_grad_accumulation_bytes

    with titan_zero0_decoder(monkeypatch, UNITS, "bfloat16", pp_enabled=True) as model:
        seen = _record_accumulation(monkeypatch)
        stage = PipelineStage(model, 0, 1, torch.device("cpu"), group=dist.new_group([0]))
        schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=lambda out, target: out.float().sum())
        for _ in range(2):
            seen.clear()
            schedule.step(torch.randint(0, 16, (8, 4)), target=torch.zeros(8), losses=[])
        params = sum(1 for _ in model.parameters())
    first, later = fsdp2_pp_grad_accumulation_bytes("fp32")
    assert sorted(seen) == sorted([first] * params + [later] * params * (MICROBATCHES - 1))
    cluster, job = build_cluster("h100-sxm", 16, target="torchtitan"), JobSpec(global_batch_size=32, seq_len=4096)
    rt = runtime_for("torchtitan", job, cluster, ParallelConfig(pp=2, zero_stage=0))
    assert rt.zero0_fsdp2 and pp_unsharded_stage(rt, 0, 2) and not pp_unsharded_stage(rt, 0, 1)
    older = runtime_for("torchtitan-2025-08", job, cluster, ParallelConfig(pp=1, zero_stage=0))
    assert not older.zero0_fsdp2  # DDP (replicate) before 00b7f5693


def test_zero0_under_pp_priced_unsharded_and_scored_as_estimate() -> None:
    """torchtitan ZeRO-0 on a pipeline: the stage's unsharded bf16 parameters and fp32 accumulators in memory (with
    its largest unit's new gradient and reduce-scatter input, as ZeRO-3's), the accumulation and the one-rank unshard
    copy in its stage time, the one all-reduce blocking (perform_reduce_grad), and the Scorer agreeing."""
    from dataclasses import replace

    from autoplan.catalog.registry import catalog_model
    from cost_models.collectives import RankStrides
    from cost_models.estimate import (data_parallel_cost, estimate, fsdp2_gathers_per_microbatch, fsdp2_unshard_copy_s,
                                      pp_grad_accumulation_s, stage_time_parts)
    from cost_models.memory import (GIB, graphs_for, reduce_input_bytes, stage_memory, stage_params,
                                    zero3_transient_bytes)
    from cost_models.validate import pipeline_split
    from search.score import Scorer
    from search.space import Layout

    model = catalog_model("llama3-8b")
    cluster, job = build_cluster("h100-sxm", 16, target="torchtitan"), JobSpec(global_batch_size=32, seq_len=4096)
    par = ParallelConfig(pp=2, zero_stage=0, recompute="full")
    dp, m = 8, 4
    lay = Layout(tp=1, cp=1, pp=2, dp=dp, ep=1, micro_batch_size=1, m=m, recompute="full", zero_stage=0,
                 hsdp_shard_size=None, schedule=par.schedule, vp=1, sequence_parallel=False, target="torchtitan")
    scorer = Scorer(model, cluster, job)
    sw = Software(**scorer.chosen_knobs(lay))
    rt = runtime_for("torchtitan", job, cluster, par, sw)
    split = pipeline_split(model, par)
    plain = replace(rt, zero0_fsdp2=False)
    graphs = graphs_for(model, job.seq_len)
    for s in range(2):
        sp = stage_params(model, par, split.layer_ids[s], first=s == 0, last=s == 1)
        with_stage, without = (stage_memory(model, job, par, dp, s, split.rank_layers, m, graphs, r, split.layer_ids[s])
                               for r in (rt, plain))
        held = with_stage.transients - without.transients  # the stage unsharded + the largest unit's gradient and
        unit = 2.0 + reduce_input_bytes(rt)  # reduce-scatter input, as ZeRO-3's stage under PP (shard group 1)
        assert held == pytest.approx(rt.pp_unsharded_bytes * (sp.dense + sp.expert) + unit * sp.largest_layer,
                                     rel=1e-12)
        assert zero3_transient_bytes(rt, 1, 2) == (rt.pp_unsharded_bytes, unit)
        added = stage_time_parts(model, cluster, job, par, rt, dp)[s]["compute"] \
            - stage_time_parts(model, cluster, job, par, plain, dp)[s]["compute"]
        copies = fsdp2_unshard_copy_s(sp.dense + sp.expert, 1, fsdp2_gathers_per_microbatch(rt, 2, m), rt, cluster)
        assert added == pytest.approx(pp_grad_accumulation_s(sp.dense + sp.expert, m, rt, cluster) + copies, rel=1e-12)
    strides = RankStrides.megatron(1, 1, dp)
    dp_s, _, _, blocking = data_parallel_cost(model, cluster, par, split.rank_layers, dp, strides, m, rt=rt)
    assert blocking == dp_s > 0  # the one all-reduce, after the last backward
    pred = estimate(model, cluster, job, par, target="torchtitan", software=sw)
    fs = scorer.score(lay, tuple(split.rank_layers))
    assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
    assert fs.peak_memory_bytes / GIB == pytest.approx(pred.peak_memory_gib, rel=1e-9)
