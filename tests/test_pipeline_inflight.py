"""Micro-batches of activations each pipeline stage holds at its peak, against megatron-core's own schedule.

The oracle is megatron-core 0.16.1 ``pipeline_parallel/schedules.py`` ``get_pp_rank_microbatches`` (the warmup count
``forward_backward_pipelining_with_interleaving`` and ``..._without_interleaving`` run): a rank holds its warmup
forwards plus the steady state's one forward before each backward, at most every chunk-micro-batch of the step.
Then the Llama 3 405B pre-training layout (Dubey et al. 2024, §3.3.2, Table 4)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import estimate
from cost_models.memory import inflight_microbatches
from cost_models.specs import JobSpec, ParallelConfig


def _megatron_held(rank: int, pp: int, vp: int | None, m: int) -> int:
    """Chunk-micro-batches rank ``rank`` holds at its peak, by megatron-core's own warmup count."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    group = SimpleNamespace(size=lambda: pp, rank=lambda: rank)
    comm = SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vp)
    total, _, warmup, _ = get_pp_rank_microbatches(m, vp or 1, pp, p2p_communicator=comm)  # group = pp (default)
    return min(warmup + 1, total)


@pytest.mark.parametrize("pp,vp,m", [(4, 2, 8), (4, 3, 12), (8, 4, 16), (8, 2, 64), (16, 2, 16), (16, 8, 16),
                                     (16, 2, 128)])
def test_interleaved_inflight_is_megatrons_warmup(pp: int, vp: int, m: int) -> None:
    par = SimpleNamespace(pp=pp, vp=vp, schedule="interleaved")
    for rank in range(pp):
        assert inflight_microbatches(rank, par, m) * vp == pytest.approx(_megatron_held(rank, pp, vp, m)), rank  # type: ignore[arg-type]


@pytest.mark.parametrize("pp,m", [(4, 4), (4, 9), (16, 16), (16, 64)])
def test_1f1b_inflight_is_megatrons_warmup(pp: int, m: int) -> None:
    par = SimpleNamespace(pp=pp, vp=1, schedule="1f1b")
    for rank in range(pp):
        assert inflight_microbatches(rank, par, m) == _megatron_held(rank, pp, None, m)  # type: ignore[arg-type]


def test_korthikanti_factor_only_when_enough_microbatches() -> None:
    """Stage 0 holds ``pp·(1 + (pp−1)/(pp·vp))`` when ``m·vp`` exceeds that, else every micro-batch (``m``)."""
    p, v = 16, 2
    assert inflight_microbatches(0, SimpleNamespace(pp=p, vp=v, schedule="interleaved"), 128) == pytest.approx(  # type: ignore[arg-type]
        p * (1 + (p - 1) / (p * v)))
    assert inflight_microbatches(0, SimpleNamespace(pp=p, vp=v, schedule="interleaved"), p) == p  # type: ignore[arg-type]


def test_llama3_405b_paper_layout() -> None:
    """16,384 H100, tp 8 pp 16 dp 128, 8k, 2048 sequences (m = 16), no activation checkpointing; the first chunk
    of the first stage holds only the embedding and the last chunk of the last stage only the output and loss:
    126 + 2 = 128 = 16 ranks × 8 virtual stages of one layer (Megatron's embedding/loss accounting)."""
    model, cluster = load_model("llama3-405b"), build_cluster("h100-sxm", 16384)
    job = JobSpec(global_batch_size=2048, seq_len=8192)
    par = ParallelConfig(tp=8, pp=16, vp=8, schedule="interleaved", account_for_embedding_in_pipeline_split=True,
                         account_for_loss_in_pipeline_split=True)
    pred = estimate(model, cluster, job, par)  # the layout is legal (pp·vp = 126 + 2 accounted layers)
    assert pred.num_microbatches == 16
    # m = pp: ranks 0-7 run every forward before their first backward and hold all 16 micro-batches; the old
    # stage-0 factor (1 + 15/128) counted 17.9 and the middle ranks 1F1B's 16 − rank.
    assert inflight_microbatches(0, par, 16) == 16 and inflight_microbatches(1, par, 16) == 16
    # With sharded gradients (ZeRO-2 memory: optimizer state and gradients sharded, weights not re-sharded after
    # forward) the layout fits in the H100's HBM; was 108.6 GiB with the old in-flight count. (The paper's fp32
    # accumulation over micro-batches holds the gradients whole until the step's reduce-scatter: held-out data.)
    fsdp = estimate(model, cluster, job, par.model_copy(update={"zero_stage": 2}), check=False)
    assert fsdp.peak_memory_gib < cluster.gpu.hbm_gib
    assert fsdp.peak_allocated_gib < pred.peak_allocated_gib - 10  # fp32 grads sharded over dp 128


def test_llama3_405b_paper_split_is_what_megatron_builds() -> None:
    """pp·vp = 128 chunks over 126 layers is legal with embedding/loss accounting: megatron-core's own
    ``TransformerConfig`` / ``get_num_layers_to_build`` give rank 0's first chunk and the last rank's last chunk
    no decoder layer (the paper's embedding-only and output-only chunks), every other chunk one."""
    from autoplan.emit import EmitPlan
    from autoplan.emit.megatron import megatron_args, parse_megatron_args
    from autoplan.validate.megatron_checks import megatron_layers_built

    par = ParallelConfig(tp=8, pp=16, vp=8, schedule="interleaved", account_for_embedding_in_pipeline_split=True,
                         account_for_loss_in_pipeline_split=True)
    plan = EmitPlan(load_model("llama3-405b"), build_cluster("h100-sxm", 16384),
                    JobSpec(global_batch_size=2048, seq_len=8192), par)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = megatron_layers_built(parse_megatron_args(megatron_args(plan)))
    sizes = [[n for _, n in chunks] for chunks in built]
    assert sizes[0] == [0] + [1] * 7 and sizes[-1] == [1] * 7 + [0]
    assert all(s == [1] * 8 for s in sizes[1:-1])
