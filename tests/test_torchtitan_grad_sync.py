"""torchtitan 0.3.0's ZeRO-0 (``data_parallel_replicate_degree = dp``, ``data_parallel_shard_degree = 1``) under
gradient accumulation: FSDP2 ``fully_shard`` over (dp_replicate, fsdp = 1) all-reduces the gradients in every
micro-batch's backward, since the trainer never turns the sync off (``cost_models.targets.torchtitan`` cites the
code). Checked here on torchtitan's and torch's own modules (fake process group, 2 ranks, CPU), then the cost model
priced so: ``m`` all-reduces per step without PP, one with it, and the search's Scorer agreeing with ``estimate``."""

from __future__ import annotations

import inspect

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.collectives import RankStrides, group_collective_time_s
from cost_models.estimate import data_parallel_cost, dp_exposed_s, estimate, stage_time_parts
from cost_models.memory import GIB, stage_params
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for
from cost_models.validate import pipeline_split
from search.score import Scorer
from search.space import Layout
from titan_toys import titan_zero0_decoder

LLAMA = load_model("llama3-8b")
JOB = JobSpec(global_batch_size=64, seq_len=8192)


def _all_reduces_per_backward(monkeypatch: pytest.MonkeyPatch, microbatches: int) -> list[int]:
    """All-reduce calls after each of ``microbatches`` backwards of a 2-block decoder that torchtitan's
    ``apply_fsdp_to_decoder`` wraps on the mesh ``parallelize_llama`` picks for dp_replicate 2 x dp_shard 1
    (models/llama3/parallelize.py:74-77), as ``train_step`` runs them: ``loss.backward()`` per micro-batch."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    import torch.distributed as dist

    with titan_zero0_decoder(monkeypatch, 2, "float32", pp_enabled=False) as model:
        seen: list[int] = []
        real = dist.all_reduce

        def counting(tensor, *args, group=None, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(dist.get_world_size(group))
            return real(tensor, *args, group=group, **kwargs)

        monkeypatch.setattr(dist, "all_reduce", counting)
        after = []
        for _ in range(microbatches):
            model(torch.randint(0, 16, (2, 4))).sum().backward()
            after.append(len(seen))
        assert set(seen) == {2}  # over dp_replicate
        return after


def test_torchtitan_zero0_all_reduces_in_every_microbatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each backward all-reduces every FSDP unit with parameters (embedding, 2 blocks, [norm, lm_head]) again:
    3 micro-batches, 3x the calls of one, not one sync per step."""
    after = _all_reduces_per_backward(monkeypatch, 3)
    assert after[0] == 4
    assert after == [after[0], 2 * after[0], 3 * after[0]]


def test_torchtitan_trainer_never_turns_gradient_sync_off() -> None:
    """The accumulation loop (Trainer.train_step -> forward_backward_step) calls no no_sync /
    set_requires_gradient_sync / set_requires_all_reduce: what makes every micro-batch's backward sync."""
    pytest.importorskip("torchtitan")
    from torchtitan.trainer import Trainer

    src = "".join(inspect.getsource(f) for f in (Trainer.train_step, Trainer.forward_backward_step,
                                                  Trainer._forward_backward_body))
    assert "loss.backward()" in src and "gradient_accumulation_steps" in src
    for toggle in ("no_sync", "requires_gradient_sync", "requires_all_reduce", "is_last_backward"):
        assert toggle not in src


def _zero0(tp: int, pp: int) -> ParallelConfig:
    return ParallelConfig(tp=tp, pp=pp, zero_stage=0, sequence_parallel=tp > 1, recompute="full")


@pytest.mark.parametrize("pp", [1, 2])
def test_zero0_all_reduce_priced_per_microbatch_without_pp(pp: int) -> None:
    """torchtitan zero 0, 64 H100, tp 8: dp = 8/pp ranks all-reduce the fp32 gradient m times per step without PP
    (each behind its own micro-batch's backward: the exposed window is the whole step), once with PP (torch's
    pipelining stage syncs after the last backward); Megatron (DDP no_sync) once either way."""
    cluster = build_cluster("h100-sxm", 64)
    par = _zero0(8, pp)
    for target, calls in (("torchtitan", None), ("megatron", 1)):
        pred = estimate(LLAMA, cluster, JOB, par, target=target)
        rt = runtime_for(target, JOB, cluster, par)
        dp, m = pred.dp, pred.num_microbatches
        assert m > 1
        n = calls or (m if pp == 1 else 1)
        split = pipeline_split(LLAMA, par)
        strides = RankStrides.megatron(par.tp, 1, dp)
        per_stage = []
        for s, ids in enumerate(split.layer_ids):
            sp = stage_params(LLAMA, par, ids, first=s == 0, last=s == pp - 1)
            per_stage.append(n * group_collective_time_s("all_reduce", rt.reduce_bytes * sp.dense, dp,
                                                         strides.cp, cluster))
        dp_s, dp_bytes, _, blocking = data_parallel_cost(LLAMA, cluster, par, list(split.rank_layers), dp, strides,
                                                         m, split.layer_ids, rt)
        assert dp_s == pytest.approx(max(per_stage), rel=1e-9)
        stage = max(sum(parts.values()) for parts in stage_time_parts(LLAMA, cluster, JOB, par, rt, dp))
        window_m = m if (target == "torchtitan" and pp == 1) else 1
        assert pred.time.exposed_comm_s["dp"] == pytest.approx(
            blocking + max((dp_s - blocking) * (1 - cluster.efficiency.dp_overlap), dp_s - blocking - window_m * stage),
            rel=1e-9)
        assert pred.time.exposed_comm_s["dp"] == pytest.approx(
            dp_exposed_s(dp_s, 0, stage, m, cluster, blocking, window_m > 1), rel=1e-9)


@pytest.mark.parametrize("tp,pp", [(8, 1), (4, 1), (4, 2)])
def test_search_scores_torchtitan_zero0_as_estimate(tp: int, pp: int) -> None:
    """One cost model: the Scorer's DP pieces (``data_parallel_cost``, ``dp_sync_every_microbatch``) give estimate's
    step time, peak memory and composite cost on torchtitan zero-0 plans."""
    cluster = build_cluster("h100-sxm", 64)
    par = _zero0(tp, pp)
    dp = par.dp(64)
    lay = Layout(tp=tp, cp=1, pp=pp, dp=dp, ep=1, micro_batch_size=par.micro_batch_size,
                 m=JOB.global_batch_size // (par.micro_batch_size * dp), recompute=par.recompute, zero_stage=0,
                 hsdp_shard_size=None, schedule=par.schedule, vp=1, sequence_parallel=tp > 1, target="torchtitan")
    scorer = Scorer(LLAMA, cluster, JOB)
    fs = scorer.score(lay, tuple(pipeline_split(LLAMA, par).rank_layers))
    pred = estimate(LLAMA, cluster, JOB, par, target="torchtitan", software=Software(**scorer.chosen_knobs(lay)))
    assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
    assert fs.peak_memory_bytes / GIB == pytest.approx(pred.peak_memory_gib, rel=1e-9)
    assert fs.composite_cost == pytest.approx(pred.composite_cost, rel=1e-9)
