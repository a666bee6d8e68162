"""EP spanning the TP ranks (Megatron-Core MoE parallel folding, expert-TP 1).

With ``--expert-tensor-parallel-size 1`` Megatron-Core's expert RankGenerator re-cuts the ``tp·cp·dp`` ranks of a
pipeline stage as ``ep × edp`` (megatron/core/parallel_state.py:786-806): ``ep`` must divide ``tp·cp·dp``, not
``dp·cp``, and an EP group is ``ep`` consecutive ranks, TP peers included. The rule is the megatron target
profile's (``MegatronProfile.expert_ranks``); these tests hold it, the group geometry the cost model prices, and
the published Qwen3-235B-A22B layout (256 H100: tp 2, pp 8, dp 16, ep 32) to megatron-core's own code."""

from __future__ import annotations

import os
import warnings

import pytest
from click.testing import CliRunner

from autoplan.catalog import build_cluster, load_model
from cost_models.collectives import RankStrides, place_group
from cost_models.errors import ConfigError, divisors
from cost_models.estimate import estimate
from cost_models.layer_cost import layer_cost
from cost_models.memory import expert_data_parallel_size, graphs_for
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, TORCHTITAN

QWEN = load_model("qwen3-235b-a22b")  # 128 experts, top-8, hidden 4096
# Megatron-Bridge Qwen3-235B-A22B H100 recipe as the 25.09-26.04 performance tables publish it
RECIPE = dict(tp=2, pp=8, ep=32, vp=4, sequence_parallel=True, account_for_embedding_in_pipeline_split=True,
              account_for_loss_in_pipeline_split=True)
JOB = JobSpec(global_batch_size=2048, seq_len=4096, precision="fp8")


def test_published_qwen3_layout_is_priced_and_ep_beyond_tp_cp_dp_is_refused() -> None:
    """ep 32 > dp·cp 16 (the old 'EP folds inside dp*cp' refused it) is legal: 32 | tp·cp·dp = 32. ep 64 is not:
    one line naming the value, the constraint, the source and the nearest valid degrees."""
    cluster = build_cluster("h100-sxm", 256)
    par = ParallelConfig(**RECIPE)
    dp = par.dp(cluster.num_gpus)
    assert (dp * par.cp) % par.ep != 0  # what the old rule refused
    pred = estimate(QWEN, cluster, JOB, par, target="megatron")
    assert pred.step_time_s > 0 and pred.time.exposed_comm_s["ep"] > 0 and pred.comm_volume_gib["ep"] > 0
    with pytest.raises(ConfigError) as err:
        estimate(QWEN, cluster, JOB, par.model_copy(update={"ep": 64}), target="megatron")
    msg = str(err.value)
    assert "ep=64 must divide tp*cp*dp = 2*1*16 = 32" in msg and "parallel_state.py" in msg
    assert err.value.valid[:2] == [32, 16]
    res = CliRunner().invoke(_cli(), ["estimate", "--model", "qwen3-235b-a22b", "--gpus", "256", "--tp", "2",
                                      "--pp", "8", "--ep", "64", "--seq-len", "4096", "--global-batch-size", "2048"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "ep=64 must divide tp*cp*dp" in res.output and "valid: 32, 16" in res.output


def test_torchtitan_cuts_experts_from_its_fsdp_ranks() -> None:
    """torchtitan 0.3.0 builds efsdp = dp_shard·cp·tp // ep: ep 32 with tp 2 and FSDP over dp 16 is legal, with
    ZeRO-0 (dp_replicate = dp, dp_shard 1) the expert ranks are cp·tp = 2 and ep 32 is refused with its rule."""
    assert TORCHTITAN.expert_layout_error(QWEN, tp=2, pp=1, cp=1, dp_cp=16, ep=32, zero=3, hsdp=None) is None
    err = TORCHTITAN.expert_layout_error(QWEN, tp=2, pp=1, cp=1, dp_cp=16, ep=32, zero=0, hsdp=None)
    assert err is not None and "dp_shard*cp*tp = 1*2" in str(err) and "parallel_dims.py" in str(err)


def test_megatron_expert_rule_is_megatron_cores() -> None:
    """autoplan accepts an (tp, cp, pp, ep) layout exactly when megatron-core's initialize_model_parallel does
    (fake process group, world 48, expert-TP 1), over a grid where ep often does not divide dp·cp."""
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    world = 48
    model = QWEN.model_copy(update={"num_experts": world})  # every ep degree divides the expert count
    os.environ.setdefault("MASTER_ADDR", "localhost")
    dist.init_process_group("fake", rank=0, world_size=world)
    spans_tp = refused = 0
    try:
        for tp in (1, 2, 4):
            for cp in (1, 3):
                for pp in (1, 2):
                    if world % (tp * cp * pp):
                        continue
                    dp = world // (tp * cp * pp)
                    for ep in divisors(world):
                        ours = MEGATRON.expert_layout_error(model, tp=tp, pp=1, cp=cp, dp_cp=dp * cp, ep=ep, zero=1,
                                                            hsdp=None) is None
                        try:
                            with warnings.catch_warnings():
                                warnings.simplefilter("ignore")
                                ps.initialize_model_parallel(
                                    tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                    context_parallel_size=cp, expert_model_parallel_size=ep,
                                    expert_tensor_parallel_size=1, create_gloo_process_groups=False,
                                    order="tp-cp-ep-dp-pp")
                            theirs = True
                        except RuntimeError:
                            theirs = False
                        finally:
                            ps.destroy_model_parallel()
                        assert ours == theirs, (tp, cp, pp, ep)
                        spans_tp += theirs and (dp * cp) % ep != 0
                        refused += not theirs
    finally:
        dist.destroy_process_group()
    assert spans_tp >= 5 and refused >= 5  # the grid holds both kinds of case


def test_expert_groups_are_megatron_cores() -> None:
    """The EP and expert-DP groups the cost model prices are megatron-core's: for the Qwen3 recipe the EP group is
    ranks 0..31 (both ranks of every TP pair, 4 HGX nodes of 8: 8 on NVLink, 4 domains), edp 1; with ep 8 the
    expert gradients reduce over edp = tp·cp·dp/ep = 4 ranks at stride ep."""
    pytest.importorskip("megatron.core")
    from megatron.core.parallel_state import RankGenerator

    cluster = build_cluster("h100-sxm", 256)
    tp, cp, dp, pp = 2, 1, 16, 8
    for ep in (32, 8):
        edp = expert_data_parallel_size(tp, cp, dp, ep)
        gen = RankGenerator(tp=1, ep=ep, dp=edp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
        dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
        strides = RankStrides.megatron(tp, cp, dp, ep)
        ep_group, edp_group = gen.get_ranks("ep")[0], gen.get_ranks("dp")[0]
        assert ep_group == [i * strides.ep for i in range(ep)]
        assert edp_group == [i * strides.edp for i in range(edp)]
        assert set(dense.get_ranks("tp")[0]) <= set(ep_group)  # EP spans the TP ranks
        nodes = {r // cluster.nvlink_domain_size for r in ep_group}
        place = place_group(ep, strides.ep, cluster)
        assert (place.n_outer, place.n_inner) == (len(nodes), ep // len(nodes))


def test_dispatch_volume_is_the_sequence_parallel_share() -> None:
    """Each rank dispatches its own 1/tp of a micro-batch's tokens (sequence parallel; expert-TP 1 gathers
    nothing): per all-to-all, tokens·k·h bytes-per-element × ρ, a fraction of it to ranks of other nodes (NIC) and
    of this node (NVLink) as megatron-core's EP group places them. Four all-to-alls per MoE layer."""
    pytest.importorskip("megatron.core")
    from megatron.core.parallel_state import RankGenerator

    cluster = build_cluster("h100-sxm", 256)
    job = JobSpec(global_batch_size=2048, seq_len=4096)  # bf16: 2-byte dispatch
    par = ParallelConfig(tp=2, pp=8, ep=32, sequence_parallel=True)
    assert cluster.efficiency.moe_dispatcher == "alltoall"
    group = RankGenerator(tp=1, ep=32, dp=1, pp=8, cp=1, order="tp-cp-ep-dp-pp").get_ranks("ep")[0]
    node = cluster.nvlink_domain_size
    remote = sum(r // node != group[0] // node for r in group) / len(group)
    local = sum(r // node == group[0] // node and r != group[0] for r in group) / len(group)
    tokens = par.micro_batch_size * job.seq_len / (par.cp * par.tp)
    per_a2a = tokens * QWEN.moe_top_k * QWEN.hidden_size * 2.0 * cluster.efficiency.moe_imbalance
    lc = layer_cost(graphs_for(QWEN, job.seq_len)["moe"], QWEN, cluster, job, par, 16)
    assert lc.ep_bytes == pytest.approx(4 * per_a2a * (remote + local), rel=1e-12)
    assert (remote, local) == (24 / 32, 7 / 32)


def test_search_can_choose_ep_spanning_tp() -> None:
    """The search space offers ep up to tp·cp·dp on Megatron (ep 32 with tp 2, dp 16); the plan it returns for
    such a layout is what estimate predicts for it (one cost model: the Scorer's EP and expert-DP groups are the
    estimate's)."""
    from search.space import Tally, ep_choices

    assert 32 in ep_choices(QWEN, "megatron", 2, 1, 16, {}, Tally())
    assert 64 not in ep_choices(QWEN, "megatron", 2, 1, 16, {}, Tally())
    assert ep_choices(QWEN, "fsdp2", 2, 1, 16, {}, Tally()) == [1]
    from search.planner import search

    from cost_models.targets import Software

    cluster = build_cluster("h100-sxm", 256)
    job = JobSpec(global_batch_size=2048, seq_len=4096, precision="fp8")
    res = search(QWEN, cluster, job, target="megatron", pins={"tp": 2, "pp": 8, "ep": 32, "vp": 4}, top_k=1)
    assert res.plans and res.plans[0].parallel.ep == 32
    plan = res.plans[0]
    knobs = {k: v for k, v in plan.prediction.software.items() if k in Software.model_fields}
    pred = estimate(QWEN, cluster, job, plan.parallel, target="megatron", software=Software(**knobs))
    assert plan.prediction.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
    assert plan.prediction.peak_memory_gib == pytest.approx(pred.peak_memory_gib, rel=1e-9)


def _cli():  # type: ignore[no-untyped-def]
    from autoplan.cli import cli

    return cli


def test_distributed_optimizer_instances_split_the_expert_group() -> None:
    """Megatron's distributed-optimizer instances (zero 1, hsdp < dp·cp) must divide the expert data-parallel size
    (parallel_state.py:1263-1265 @ core_v0.16.1), and they shard the expert state over edp / instances (:1266-1268):
    an ep-64 layout whose edp is 1 is refused with the shard sizes that work; at ep 8 (edp 8, 8 instances) every rank
    holds the whole expert Adam state, as with no sharding."""
    olmoe = load_model("olmoe-1b-7b")
    cluster, job = build_cluster("h100-sxm", 64), JobSpec(global_batch_size=256, seq_len=4096)
    with pytest.raises(ConfigError, match=r"8 distributed-optimizer instances .* expert data-parallel size "
                                          r"tp\*dp\*cp/ep = 1 .*valid: hsdp_shard_size=64"):
        estimate(olmoe, cluster, job, ParallelConfig(ep=64, zero_stage=1, hsdp_shard_size=8), target="megatron")
    sharded = estimate(olmoe, cluster, job, ParallelConfig(ep=8, zero_stage=1), target="megatron")
    grouped = estimate(olmoe, cluster, job, ParallelConfig(ep=8, zero_stage=1, hsdp_shard_size=8), target="megatron")
    unsharded = estimate(olmoe, cluster, job, ParallelConfig(ep=8, zero_stage=0), target="megatron")
    assert grouped.memory_gib["optimizer"] > 5 * sharded.memory_gib["optimizer"]
    # the expert part as zero 0 holds it (fp32 master + Adam moments: the same 12 B per parameter), the dense part
    # (about a third of zero 0's bytes here) sharded over the 8 ranks of an instance
    assert 0.6 * unsharded.memory_gib["optimizer"] < grouped.memory_gib["optimizer"] < unsharded.memory_gib["optimizer"]
