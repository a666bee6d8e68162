"""Gradient sync when the ZeRO state is sharded in groups (HSDP): each shard group reduce-scatters, then every shard is
all-reduced across the group's replicas, for dense and routed-expert gradients alike.

Megatron (zero 1, ``--num-distributed-optimizer-instances`` = dp*cp/hsdp): the reduce-scatter runs in the instance
(intra group: hsdp dense ranks, edp/instances expert ranks), then an all-reduce of the shard on the one
inter-instance group every bucket group gets (megatron/core/distributed/param_and_grad_buffer.py:459-486,
distributed_data_parallel.py:226-235, parallel_state.py:1287-1309, 2012-2022 @ core_v0.16.1). torchtitan (zero 3,
FSDP2 on (dp_replicate, fsdp) and experts on (dp_replicate, efsdp)): the same, in every micro-batch
(torch distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_reduce``). ``estimate.data_parallel_cost``."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.collectives import RankStrides, group_collective_time_s
from cost_models.estimate import data_parallel_cost, dp_exposed_s, estimate, stage_time_parts
from cost_models.memory import GIB, expert_shard_group, hsdp_replicas, stage_params
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for
from cost_models.validate import pipeline_split
from search.score import Scorer
from search.space import Layout

OLMOE = load_model("olmoe-1b-7b")
JOB = JobSpec(global_batch_size=256, seq_len=4096)


def _expected(model, cluster, par: ParallelConfig, target: str) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(DP seconds, bytes sent) of a pp-1 HSDP plan, collective by collective as the frameworks issue them."""
    assert par.pp == 1
    dp = par.dp(cluster.num_gpus)
    rt = runtime_for(target, JOB, cluster, par)
    m = JOB.global_batch_size // (par.micro_batch_size * dp)
    sp = stage_params(model, par, range(model.num_layers), first=True, last=True)
    strides = RankStrides.megatron(par.tp, par.cp, dp, par.ep)
    hsdp = par.hsdp_shard_size
    replicas = dp * par.cp // hsdp
    shards = ((sp.dense, hsdp, strides.cp),
              (sp.expert, expert_shard_group(par.tp, par.cp, dp, par.ep, par.zero_stage, hsdp), strides.edp))
    seconds = sent = 0.0
    for params, g, stride in shards:
        grad, weight = rt.reduce_bytes * params, rt.gather_bytes * params
        calls = m if par.zero_stage == 3 else 1  # FSDP2 reduces in every micro-batch; Megatron once per step
        gathers = 2 * m if par.zero_stage == 3 else 1  # FSDP2 (reshard_after_forward): forward + backward, each one
        seconds += calls * group_collective_time_s("reduce_scatter", grad, g, stride, cluster)
        seconds += gathers * group_collective_time_s("all_gather", weight, g, stride, cluster)
        sent += (g - 1) / g * (calls * grad + gathers * weight)
        # the all-reduce across the replicas, on the shard; its group steps over whole shard groups (tp*hsdp ranks)
        seconds += calls * group_collective_time_s("all_reduce", grad / g, replicas, par.tp * hsdp, cluster)
        sent += calls * 2 * (replicas - 1) / replicas * grad / g  # (pp 1: FSDP2 syncs in every micro-batch)
    return seconds, sent


def test_megatron_instances_all_reduce_dense_and_expert_shards() -> None:
    """OLMoE, 64 H100, ep 8, zero 1, hsdp 8: 8 distributed-optimizer instances; edp 8 / 8 instances = 1, so the
    expert gradient is not reduce-scattered at all and its whole fp32 buffer is all-reduced across the 8 instances
    (over IB: the inter-instance group steps over 8 ranks). The step pays it: the DP time, the bytes, the exposed DP."""
    cluster = build_cluster("h100-sxm", 64)
    par = ParallelConfig(ep=8, zero_stage=1, hsdp_shard_size=8)
    pred = estimate(OLMOE, cluster, JOB, par, target="megatron")
    dp = pred.dp
    assert hsdp_replicas(dp, 8) == 8 and expert_shard_group(1, 1, dp, 8, 1, 8) == 1
    seconds, sent = _expected(OLMOE, cluster, par, "megatron")
    rt = runtime_for("megatron", JOB, cluster, par)
    sp = stage_params(OLMOE, par, range(OLMOE.num_layers), first=True, last=True)
    expert_ar = group_collective_time_s("all_reduce", rt.reduce_bytes * sp.expert, 8, 8, cluster)
    assert expert_ar > 0.1 * seconds  # the inter-instance expert all-reduce is a real part of it
    dp_s, dp_bytes, _, blocking = data_parallel_cost(OLMOE, cluster, par, [OLMOE.num_layers], dp,
                                                     RankStrides.megatron(1, 1, dp, 8), pred.num_microbatches,
                                                     rt=rt)
    assert dp_s == pytest.approx(seconds, rel=1e-9)
    assert dp_bytes == pytest.approx(sent, rel=1e-9)
    assert pred.comm_volume_gib["dp"] == pytest.approx(sent / GIB, rel=1e-9)
    stage = sum(stage_time_parts(OLMOE, cluster, JOB, par, rt, dp)[0].values())
    assert pred.time.exposed_comm_s["dp"] == pytest.approx(
        dp_exposed_s(seconds, 1, stage, pred.num_microbatches, cluster, blocking), rel=1e-9)


def test_torchtitan_hsdp_all_reduces_expert_shards_every_microbatch() -> None:
    """torchtitan, zero 3, hsdp 16 (dp_replicate 4 x dp_shard 16), ep 8: experts shard on efsdp = 16*1/8 = 2 ranks
    and all-reduce that shard over dp_replicate = 4 in every micro-batch, as the dense shard does."""
    cluster = build_cluster("h100-sxm", 64)
    par = ParallelConfig(ep=8, zero_stage=3, hsdp_shard_size=16)
    pred = estimate(OLMOE, cluster, JOB, par, target="torchtitan")
    assert expert_shard_group(1, 1, pred.dp, 8, 3, 16) == 2
    seconds, sent = _expected(OLMOE, cluster, par, "torchtitan")
    assert pred.comm_volume_gib["dp"] == pytest.approx(sent / GIB, rel=1e-9)
    rt = runtime_for("torchtitan", JOB, cluster, par)
    dp_s, *_ = data_parallel_cost(OLMOE, cluster, par, [OLMOE.num_layers], pred.dp,
                                  RankStrides.megatron(1, 1, pred.dp, 8), pred.num_microbatches, rt=rt)
    assert dp_s == pytest.approx(seconds, rel=1e-9)


@pytest.mark.parametrize("hsdp", [None, 16])
def test_fsdp2_under_pipelining_reduces_once_per_step(hsdp: int | None) -> None:
    """torchtitan (FSDP2) under pp 2: torch's pipelining stage backs every micro-batch with gradient sync off and
    resharding after backward off, and reduces once, in ``perform_reduce_grad`` after the stage's last backward
    (torch 2.13 distributed/pipelining/stage.py:844-848, 1164-1177), the compute stream waiting for it there: one
    reduce-scatter (and one replica all-reduce) per step, all of it blocking. torchtitan does not reshard after
    forward under PP (distributed/fsdp.py:71-74), so the stage is gathered once per step. Recomputed here per stage,
    collective by collective; before, gathers and reduce-scatter were priced in each of the m micro-batches (which
    held a calibration row entered with 4x its real micro-batch count: resolutions.json)."""
    cluster = build_cluster("h100-sxm", 64)
    par = ParallelConfig(pp=2, ep=8, zero_stage=3, hsdp_shard_size=hsdp)
    rt = runtime_for("torchtitan", JOB, cluster, par)
    pred = estimate(OLMOE, cluster, JOB, par, target="torchtitan")
    dp, m = pred.dp, pred.num_microbatches
    assert m > 1
    layers = pipeline_split(OLMOE, par).rank_layers
    strides = RankStrides.megatron(1, 1, dp, 8)
    group = hsdp or dp
    replicas = dp // group
    totals = []
    for s, ids in enumerate((range(0, layers[0]), range(layers[0], sum(layers)))):
        sp = stage_params(OLMOE, par, ids, first=s == 0, last=s == 1)
        total = blocking = 0.0
        for params, g, stride in ((sp.dense, group, strides.cp),
                                  (sp.expert, expert_shard_group(1, 1, dp, 8, 3, hsdp), strides.edp)):
            grad, weight = rt.reduce_bytes * params, rt.gather_bytes * params
            assert rt.reshard_after_forward is False
            total += group_collective_time_s("all_gather", weight, g, stride, cluster)  # once per step
            synced = group_collective_time_s("reduce_scatter", grad, g, stride, cluster)  # once per step
            if replicas > 1:
                synced += group_collective_time_s("all_reduce", grad / g, replicas, strides.cp * group, cluster)
            total += synced
            blocking += synced
        totals.append((total, blocking))
    dp_s, _, _, blocking = data_parallel_cost(OLMOE, cluster, par, list(layers), dp, strides, m, rt=rt)
    assert (dp_s, blocking) == pytest.approx(max(totals), rel=1e-9)
    assert blocking > 0


@pytest.mark.parametrize("name,gpus,tp,pp,ep,zero,hsdp,target", [
    ("olmoe-1b-7b", 64, 1, 1, 8, 1, 8, "megatron"),
    ("olmoe-1b-7b", 64, 1, 2, 4, 1, 8, "megatron"),
    ("mixtral-8x7b", 64, 2, 2, 8, 1, 8, "megatron"),
    ("olmoe-1b-7b", 64, 1, 1, 8, 3, 16, "torchtitan"),
    ("olmoe-1b-7b", 64, 1, 2, 8, 3, 16, "torchtitan"),
])
def test_search_scores_hsdp_ep_plans_as_estimate(name: str, gpus: int, tp: int, pp: int, ep: int, zero: int,
                                                 hsdp: int, target: str) -> None:
    """One cost model: the search's Scorer (DP pieces from ``data_parallel_cost``, state pieces from
    ``expert_shard_group``) gives estimate's step time, peak memory and composite cost on HSDP + EP plans."""
    model = load_model(name)
    cluster = build_cluster("h100-sxm", gpus)
    par = ParallelConfig(tp=tp, pp=pp, ep=ep, zero_stage=zero, hsdp_shard_size=hsdp, sequence_parallel=tp > 1)
    dp = par.dp(gpus)
    assert hsdp_replicas(dp, hsdp) > 1
    lay = Layout(tp=tp, cp=1, pp=pp, dp=dp, ep=ep, micro_batch_size=par.micro_batch_size,
                 m=JOB.global_batch_size // (par.micro_batch_size * dp), recompute=par.recompute, zero_stage=zero,
                 hsdp_shard_size=hsdp, schedule=par.schedule, vp=1, sequence_parallel=tp > 1, target=target)
    scorer = Scorer(model, cluster, JOB)
    fs = scorer.score(lay, tuple(pipeline_split(model, par).rank_layers))
    pred = estimate(model, cluster, JOB, par, target=target, software=Software(**scorer.chosen_knobs(lay)))
    assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
    assert fs.peak_memory_bytes / GIB == pytest.approx(pred.peak_memory_gib, rel=1e-9)
    assert fs.composite_cost == pytest.approx(pred.composite_cost, rel=1e-9)


def test_replica_all_reduces_per_step_follow_when_the_framework_syncs() -> None:
    """Megatron's instances all-reduce once per step; FSDP2 in every micro-batch without pipelining, once with it
    (torch's pipelining stage turns gradient sync off until ``perform_reduce_grad``)."""
    from cost_models.estimate import hsdp_reduces_per_step

    assert hsdp_reduces_per_step(ParallelConfig(zero_stage=1, hsdp_shard_size=8), 8, False) == 1
    assert hsdp_reduces_per_step(ParallelConfig(zero_stage=3, hsdp_shard_size=8), 8, False) == 8
    assert hsdp_reduces_per_step(ParallelConfig(zero_stage=3, hsdp_shard_size=8, pp=2), 8, False) == 1
