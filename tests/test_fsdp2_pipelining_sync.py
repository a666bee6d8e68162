"""FSDP2 under torch's pipelining: how often a stage's units gather and reduce per step, counted on torch's own code.

torch 2.13's ``PipelineStage`` backs every micro-batch with gradient sync and resharding after backward off
(distributed/pipelining/stage.py:844-848) and reduces once after the last backward (``perform_reduce_grad``,
:1164-1177). Here a 2-unit stage runs ``Schedule1F1B`` on a fake 2-rank data-parallel mesh (CPU), and the
all-gathers and reduce-scatters FSDP2 issues are counted per step: what ``estimate.data_parallel_cost`` prices
(``pp_fsdp_gathers``; one reduce-scatter, blocking) for torchtitan's default under PP (no reshard after forward,
torchtitan distributed/fsdp.py:71-74) and for resharding after forward.
"""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster
from cost_models.estimate import fsdp_gathered_once, pp_fsdp_gathers
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for

MICROBATCHES = 4
UNITS = 2


def _calls_per_step(monkeypatch: pytest.MonkeyPatch, reshard_after_forward: bool) -> tuple[int, int]:
    """(all-gathers, reduce-scatters) of the second step (the first also runs the stage's shape inference)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
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
        for layer in model.layers:  # one FSDP unit per block, the root holding none (torchtitan's wrapping)
            fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
        seen: list[str] = []
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
            schedule.step(torch.randn(8, 8), target=torch.randn(8, 8), losses=[])
        return seen.count("all_gather"), seen.count("reduce_scatter")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("reshard_after_forward", [False, True])
def test_stage_units_gather_and_reduce_as_priced(monkeypatch: pytest.MonkeyPatch, reshard_after_forward: bool) -> None:
    gathers, reduces = _calls_per_step(monkeypatch, reshard_after_forward)
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
