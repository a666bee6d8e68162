"""The A2A overlap's interleaved pipeline (Megatron-Core's combined 1F1B) leaves one PP send per step on the critical
path (``cost_models.estimate.combined_1f1b_p2p_s``): the installed megatron-core's step structure and warm-up counts,
a max-plus run of its interleaved order (the plain schedule's fill/drain sends come out as ``pp_fill_s`` prices them,
the combined one's as those and one per steady step of the last stage), and ``estimate`` / the search's scorer
pricing it alike."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import combined_1f1b_p2p_s, estimate, pp_send_s
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software
from cost_models.validate import pipeline_split

schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
plan = pytest.importorskip("megatron.core.models.common.model_chunk_schedule_plan")


def test_a_combined_step_waits_for_both_receives_first_and_sends_after_every_layer() -> None:
    """TransformerModelChunkSchedulePlan.run: pre_forward / pre_backward (the receive waits) before the first layer,
    post_forward / post_backward (the sends) after the last; the backward's last node is the first layer's attention
    backward, so its input grad is ready at the step's end."""
    src = inspect.getsource(plan.TransformerModelChunkSchedulePlan.run)
    first_layer = src.index("TransformerLayerSchedulePlan.run(")
    last_layer = src.rindex("TransformerLayerSchedulePlan.run(")
    assert src.index("pre_forward(") < first_layer and src.index("pre_backward(") < first_layer
    assert src.index("post_forward(") > last_layer and src.index("post_backward(") > last_layer
    layer = inspect.getsource(plan.TransformerLayerSchedulePlan.run)
    assert layer.rindex("b_layer.attn.backward(") > layer.rindex("f_layer.moe_combine.forward(")


def _warmup(pp: int, rank: int, vp: int, m: int, overlap: bool) -> int:
    comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: rank),
                           virtual_pipeline_model_parallel_size=vp)
    return schedules.get_pp_rank_microbatches(m, vp, pp, overlap_moe_expert_parallel_comm=overlap,
                                              p2p_communicator=comm)[2]


def test_the_overlap_adds_one_warmup_microbatch_on_every_stage() -> None:
    for rank in range(4):
        assert _warmup(4, rank, 3, 32, True) == _warmup(4, rank, 3, 32, False) + 1 == 2 * (4 - rank - 1) + 2 * 4 + 1


def _run(pp: int, vp: int, m: int, send: float, combined: bool, tf: float = 1.0, tb: float = 2.0) -> float:
    """Makespan of Megatron's interleaved order on ``pp`` stages (its schedule table and warm-up counts): warm-up
    forwards, then 1F1B steps (plain: the forward, then the backward, each sending its output when done; combined:
    one unit of tf + tb that sends both at its end), then cool-down backwards. A forward needs the previous stage's
    (stage pp − 1's previous chunk on stage 0), a backward the next stage's, ``send`` after it is done."""
    table = schedules.get_schedule_table(m, vp, pp)
    fwd = [(mb, c) for mb, c in table]
    bwd = [(mb, vp - 1 - c) for mb, c in table]  # get_model_chunk_id(forward=False)
    seqs = []
    for s in range(pp):
        w = _warmup(pp, s, vp, m, combined)
        seq: list[tuple[float, tuple | None, tuple | None]] = [(tf, fwd[i], None) for i in range(w)]
        for k in range(m * vp - w):
            seq += [(tf + tb, fwd[w + k], bwd[k])] if combined else [(tf, fwd[w + k], None), (tb, None, bwd[k])]
        seq += [(tb, None, bwd[i]) for i in range(m * vp - w, m * vp)]
        seqs.append(seq)
    done_f: dict[tuple, float] = {}
    done_b: dict[tuple, float] = {}
    pos, clock = [0] * pp, [0.0] * pp
    moved = True
    while moved:
        moved = False
        for s in range(pp):
            while pos[s] < len(seqs[s]):
                dur, f, b = seqs[s][pos[s]]
                deps = []
                if f is not None:
                    deps.append(done_f.get((s - 1, *f)) if s > 0 else
                                done_f.get((pp - 1, f[0], f[1] - 1)) if f[1] > 0 else 0.0)
                if b is not None:
                    deps.append(done_b.get((s + 1, *b)) if s < pp - 1 else
                                done_b.get((0, b[0], b[1] + 1)) if b[1] < vp - 1 else 0.0)
                if any(d is None for d in deps):
                    break
                start = max([clock[s], *(d + send for d in deps if d)])
                clock[s] = start + dur
                if f is not None:
                    done_f[(s, *f)] = clock[s]
                if b is not None:
                    done_b[(s, *b)] = clock[s]
                pos[s] += 1
                moved = True
    assert pos == [len(q) for q in seqs]
    return max(clock)


@pytest.mark.parametrize("pp, vp, m", [(2, 24, 32), (2, 12, 64), (4, 12, 64), (8, 4, 64)])
def test_the_combined_schedule_exposes_one_send_per_step_the_plain_one_only_its_fill(pp: int, vp: int, m: int) -> None:
    send = 0.1
    plain = _run(pp, vp, m, send, False) - _run(pp, vp, m, 0.0, False)
    assert plain == pytest.approx(2 * (pp * vp - 1) * send)  # pp_fill_s's count
    combined = _run(pp, vp, m, send, True) - _run(pp, vp, m, 0.0, True)
    # estimate's pp term with the overlap: the fill/drain sends and one per steady step of the last stage
    steady = m * vp - _warmup(pp, pp - 1, vp, m, True)
    assert combined == pytest.approx(2 * (pp * vp - 1) * send + steady * send, rel=0.01)
    assert plain < 0.25 * combined


def test_estimate_and_scorer_price_the_sends_of_the_combined_steps() -> None:
    from search.score import Scorer
    from search.space import Layout

    model, cluster = load_model("qwen3-235b-a22b"), build_cluster("h100-sxm", 256)
    job = JobSpec(global_batch_size=1024, seq_len=4096, precision="bf16")
    par = ParallelConfig(tp=2, pp=8, vp=4, ep=32, micro_batch_size=1, schedule="interleaved", sequence_parallel=True)
    on = estimate(model, cluster, job, par, target="megatron", software=Software(moe_a2a_overlap=True))
    off = estimate(model, cluster, job, par, target="megatron", software=Software(moe_a2a_overlap=False))
    m, dp = on.num_microbatches, on.dp
    sends = (m * par.vp - (par.vp - 1) * par.pp - 1) * pp_send_s(model, cluster, job, par, dp)
    assert sends > 0.0
    assert on.time.exposed_comm_s["pp"] - off.time.exposed_comm_s["pp"] == pytest.approx(sends, rel=1e-12)
    assert combined_1f1b_p2p_s(model, cluster, job, par, dp, m, None) == 0.0  # the catalog's default: no overlap
    dualpipe = ParallelConfig(tp=2, pp=8, ep=32, micro_batch_size=1, schedule="dualpipe", sequence_parallel=True)
    rt = SimpleNamespace(moe_a2a_overlap=True)  # DualPipe's own pairing: not the combined 1F1B's sends
    assert combined_1f1b_p2p_s(model, cluster, job, dualpipe, dp, m, rt) == 0.0  # type: ignore[arg-type]
    assert combined_1f1b_p2p_s(model, cluster, job, par, dp, m, rt) == pytest.approx(sends)  # type: ignore[arg-type]
    lay = Layout(tp=2, cp=1, pp=8, dp=dp, ep=32, micro_batch_size=1, m=m, recompute=par.recompute, zero_stage=1,
                 hsdp_shard_size=None, schedule="interleaved", vp=4, sequence_parallel=True)
    fs = Scorer(model, cluster, job, software=Software(moe_a2a_overlap=True)).score(
        lay, tuple(pipeline_split(model, par).rank_layers))
    assert fs.step_time_s == pytest.approx(on.step_time_s, rel=1e-9)
