"""The goodput model: Young/Daly intervals on worked numbers, goodput monotone in MTBF, checkpoint bytes
from the plan's sharding."""

from __future__ import annotations

import math

import pytest
from scipy.optimize import minimize_scalar

from autoplan.catalog import load_model
from cost_models.goodput import (CHECKPOINT_BYTES_PER_PARAM, DEFAULT_INTERRUPTIONS_PER_GPU_HOUR, FailureModel,
                                 checkpoint_bytes_per_rank, daly_interval_s, goodput, goodput_fraction,
                                 young_interval_s)
from cost_models.specs import ParallelConfig
from cost_models.validate import stage_layers
from autoplan.request import ClusterRequest


def test_default_rate_is_llama3_interruptions():
    # Llama 3 §3.3.4: 419 interruptions in 54 days on 16,384 GPUs -> MTBF of the job in hours.
    mtbf_h = 54 * 24 / 419
    assert FailureModel().job_mtbf_hours(16384) == pytest.approx(mtbf_h, rel=1e-12)
    assert DEFAULT_INTERRUPTIONS_PER_GPU_HOUR * 16384 * mtbf_h == pytest.approx(1.0)
    assert FailureModel(mtbf_hours=7.5).job_mtbf_hours(16384) == 7.5


def test_young_and_daly_worked_numbers():
    # Worked by hand: checkpoint δ = 60 s, M = 3 h = 10,800 s.
    delta, m = 60.0, 10800.0
    young = math.sqrt(2 * 60 * 10800)  # = 1138.42 s
    assert young_interval_s(delta, m) == pytest.approx(young, rel=1e-12)
    x = 60 / (2 * 10800)
    daly = young * (1 + math.sqrt(x) / 3 + x / 9) - 60
    assert daly_interval_s(delta, m) == pytest.approx(daly, rel=1e-12)
    assert 1090 < daly < 1100  # 1138.42·(1 + 0.01757 + 0.00031) − 60 = 1098.7... see the line above
    # δ ≥ 2M: checkpoint every M.
    assert daly_interval_s(3 * m, m) == m


@pytest.mark.parametrize("delta,m,r", [(5.0, 11000.0, 600.0), (60.0, 10800.0, 0.0), (600.0, 3600.0, 300.0)])
def test_daly_interval_is_near_the_exact_optimum(delta, m, r):
    best = minimize_scalar(lambda t: -goodput_fraction(t, delta, r, m), bounds=(1e-3, 10 * m), method="bounded",
                           options={"xatol": 1e-6})
    tau = daly_interval_s(delta, m)
    assert tau == pytest.approx(best.x, rel=0.02)
    assert goodput_fraction(tau, delta, r, m) == pytest.approx(-best.fun, rel=1e-4)


def test_goodput_fraction_worked_number():
    # τ = 1000 s, δ = 10 s, R = 100 s, M = 10,000 s: 1000 / (10^4 · e^{0.01} · (e^{0.101} − 1)).
    expect = 1000 / (1e4 * math.exp(0.01) * (math.exp(0.101) - 1))
    assert goodput_fraction(1000.0, 10.0, 100.0, 1e4) == pytest.approx(expect, rel=1e-12)
    assert 0.9 < expect < 0.95


def _llama(n: int, par: ParallelConfig):
    model = load_model("llama3-405b")
    cluster = ClusterRequest(num_gpus=n).resolve()
    return model, cluster, par, stage_layers(model, par)


def test_checkpoint_bytes_follow_the_sharding():
    par = ParallelConfig(tp=8, pp=16, cp=1, first_stage_layers=8, last_stage_layers=6)
    model, cluster, par, layers = _llama(16384, par)
    per = checkpoint_bytes_per_rank(model, par, cluster.num_gpus, layers)
    total = sum(per) * (cluster.num_gpus // par.pp)
    # Every parameter's weight + master + Adam moments written once (norms are replicated over TP ranks).
    assert total == pytest.approx(CHECKPOINT_BYTES_PER_PARAM * model.num_params, rel=2e-3)
    dp = cluster.num_gpus // (par.tp * par.pp)
    middle = next(i for i in range(1, par.pp - 1) if layers[i] == layers[0])
    # The embedding lives on the first stage: a middle stage of as many layers writes that much less.
    extra = CHECKPOINT_BYTES_PER_PARAM * model.embedding_params / par.tp / dp
    assert per[0] - per[middle] == pytest.approx(extra, rel=1e-9)
    # Twice the data parallelism: each rank writes half.
    half = checkpoint_bytes_per_rank(model, par, 2 * cluster.num_gpus, layers)
    assert half[1] == pytest.approx(per[1] / 2, rel=1e-12)


@pytest.mark.parametrize("name, gpus, par", [
    ("olmoe-1b-7b", 64, ParallelConfig(tp=1, pp=1, ep=8)),
    ("mixtral-8x7b", 64, ParallelConfig(tp=2, pp=2, ep=8)),
    ("mixtral-8x7b", 64, ParallelConfig(tp=4, pp=1, cp=2, ep=2)),
])
def test_moe_checkpoint_writes_every_expert_once(name: str, gpus: int, par: ParallelConfig) -> None:
    """A rank writes its EP shard (experts/ep) split over the edp ranks that replicate it: experts/(ep*edp) =
    experts/(tp*cp*dp), so the stage's tp*cp*dp ranks write each expert once and the whole checkpoint is the model's
    state (norms replicated over TP aside); dividing by edp is the per-rank share, not a loss of expert state."""
    from cost_models.memory import GIB, expert_data_parallel_size, stage_params

    model, cluster = load_model(name), ClusterRequest(num_gpus=gpus).resolve()
    layers = stage_layers(model, par)
    per = checkpoint_bytes_per_rank(model, par, gpus, layers)
    assert sum(per) * (gpus // par.pp) == pytest.approx(CHECKPOINT_BYTES_PER_PARAM * model.num_params, rel=2e-5)
    dp = gpus // (par.tp * par.pp * par.cp)
    edp = expert_data_parallel_size(par.tp, par.cp, dp, par.ep)
    sp = stage_params(model, par, range(layers[0]), first=True, last=par.pp == 1)
    assert sp.expert == pytest.approx(sum(model.layer_expert_params(i) for i in range(layers[0])) / par.ep)
    assert edp * par.ep == par.tp * par.cp * dp  # the stage's ranks: ep shards, each replicated edp times
    g = goodput(model, cluster, par, layers, 10.0, 1e6)
    assert g.checkpoint_gib_per_rank * GIB == pytest.approx(max(per))
    assert g.checkpoint_write_s == pytest.approx(gpus * max(per) / (FailureModel().checkpoint_gbps * 1e9))


def test_goodput_monotone_in_mtbf_and_blocking_costs_more():
    model, cluster, par, layers = _llama(16384, ParallelConfig(tp=8, pp=16))
    values = [goodput(model, cluster, par, layers, 6.0, 1e6, FailureModel(mtbf_hours=h)).goodput
              for h in (0.5, 1, 2, 3, 6, 12, 48, 500)]
    assert all(a < b for a, b in zip(values, values[1:]))
    assert 0 < values[0] and values[-1] < 1
    slow = FailureModel(checkpoint_gbps=50.0)
    blocking = goodput(model, cluster, par, layers, 6.0, 1e6, slow)
    asynchronous = goodput(model, cluster, par, layers, 6.0, 1e6, slow.model_copy(update={"async_save": True}))
    assert asynchronous.checkpoint_stall_s < blocking.checkpoint_stall_s
    assert asynchronous.goodput > blocking.goodput
    assert blocking.interval_steps * 6.0 == pytest.approx(blocking.interval_s)
    assert blocking.lost_hours_per_day == pytest.approx(24 * (1 - blocking.goodput))
    assert blocking.tokens_per_s == pytest.approx(1e6 * blocking.goodput)


def test_rank_by_goodput_is_the_goodput_order_of_every_plan():
    from autoplan import api

    req = {"model": "llama3-8b", "cluster": {"num_gpus": 64}, "job": {"global_batch_size": 256, "seq_len": 4096},
           "failures": {"checkpoint_gbps": 2.0, "mtbf_hours": 2.0}}
    by_good = api.search({**req, "rank_by": "goodput", "top": 3})
    every = api.search({**req, "top": 50})  # a wide net, ranked by step time
    want = sorted(every.plans, key=lambda p: -p.goodput.tokens_per_s)[:3]
    assert [p.goodput.tokens_per_s for p in by_good.plans] == pytest.approx([p.goodput.tokens_per_s for p in want])
    assert by_good.search.rank_by == "goodput"
    assert all(a.goodput.tokens_per_s >= b.goodput.tokens_per_s for a, b in zip(by_good.plans, by_good.plans[1:]))
    assert all(p.goodput.tokens_per_s == pytest.approx(p.prediction.tokens_per_s * p.goodput.goodput)
               for p in by_good.plans)


def test_cli_reports_goodput_and_takes_the_failure_flags():
    import json

    from click.testing import CliRunner

    from autoplan.cli import cli

    args = ["estimate", "--model", "llama3-8b", "--gpus", "64", "--tp", "2", "--pp", "1", "--format", "json"]
    out = {h: json.loads(CliRunner().invoke(cli, args + ["--mtbf-hours", str(h)]).stdout)["goodput"]
           for h in (1, 10)}
    assert out[1]["mtbf_hours"] == 1 and out[10]["mtbf_hours"] == 10
    assert out[1]["goodput"] < out[10]["goodput"]
    table = CliRunner().invoke(cli, args[:-2] + ["--async-save", "--checkpoint-gbps", "5"])
    assert table.exit_code == 0 and "goodput" in table.output and "async stall" in table.output
    bad = CliRunner().invoke(cli, args + ["--checkpoint-gbps", "0"])
    assert bad.exit_code == 2 and "--checkpoint-gbps" in bad.output


def test_an_mtbf_far_below_the_restart_is_no_goodput_not_an_overflow():
    """``search --rank-by goodput --mtbf-hours 1e-9`` was "internal error (OverflowError: math range error)": e^{R/M}
    overflows a float. The fraction is then below 1e-300: 0."""
    assert goodput_fraction(60.0, 1.0, 600.0, 3.6e-6) == 0.0
    assert goodput_fraction(60.0, 1.0, 0.0, 0.01) == 0.0  # e^{(τ+δ)/M} overflows alone
    from click.testing import CliRunner

    from autoplan.cli import cli

    r = CliRunner().invoke(cli, ["search", "--model", "llama3-8b", "--gpus", "8", "--rank-by", "goodput",
                                 "--mtbf-hours", "1e-9", "--top", "1"])
    assert r.exit_code == 0 and "goodput          0.0% -> 0 tokens/s" in r.stdout, r.output
    r = CliRunner().invoke(cli, ["search", "--model", "llama3-8b", "--gpus", "8", "--restart-minutes", "1e9"])
    assert r.exit_code == 2 and "'--restart-minutes': 1000000000.0 is not in the range 0<=x<=16666" in r.stderr
