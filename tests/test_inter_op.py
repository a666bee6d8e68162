"""The stage DP (search.inter_op) equals brute force on small random cost tables (Alpa's
test_old_dp_vs_new_dp in spirit), with and without submesh device budgets, memory limits and schedules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search.inter_op import (
    StageEdges,
    StageTables,
    best_split,
    brute_force,
    chunked_costs,
    megatron_edges,
    mid_layer_choices,
    range_costs,
    stage_dp,
)

ALPHAS = (1.0, 0.5, 1.0 / 3.0)


@st.composite
def dp_problems(draw):  # type: ignore[no-untyped-def]
    L = draw(st.integers(1, 6))
    K = draw(st.integers(1, 3))
    dev = [draw(st.integers(0, 2)) for _ in range(K)]
    rows = []
    for i in range(L):
        for j in range(i + 1, L + 1):
            for k in range(K):
                if draw(st.booleans()) or (i == 0 and j == L):
                    cost = draw(st.integers(1, 40)) / 8  # coarse grid: ties happen
                    rows.append((i, j, cost, draw(st.floats(0, 1)), draw(st.floats(0, 0.4)), dev[k]))
    st_, en, co, sm, am, dv = (np.array(x) for x in zip(*rows))
    edges = StageEdges(st_.astype(np.int64), en.astype(np.int64), co.astype(float), sm.astype(float),
                       am.astype(float), dv.astype(np.int64))
    S = draw(st.integers(1, L))
    m = draw(st.integers(1, 9))
    kw = dict(n_layers=L, n_microbatches=m, inflight=[0.0] + [float(min(s, m)) for s in range(1, L + 2)],
              mem_limit=draw(st.sampled_from([np.inf, 0.6, 1.0, 1.8])), total_devices=draw(st.integers(0, 2 * S)),
              alpha=draw(st.sampled_from(ALPHAS)))
    if draw(st.booleans()):
        kw["n_stages"] = S
    else:
        kw["max_stages"] = S
    return edges, kw


@settings(max_examples=300, deadline=None)
@given(dp_problems())
def test_dp_equals_brute_force(problem) -> None:  # type: ignore[no-untyped-def]
    edges, kw = problem
    sol = stage_dp(edges, **kw)
    ref = brute_force(edges, **kw)
    if not np.isfinite(ref):
        assert sol is None
        return
    assert sol is not None
    assert sol.objective == pytest.approx(ref, rel=1e-12)
    # The reconstructed stages are a real path: contiguous, covering every layer once, on the budget.
    ends = [b for _, b, _ in sol.stages]
    assert [a for a, _, _ in sol.stages] == [0] + ends[:-1] and ends[-1] == kw["n_layers"]
    assert sum(int(edges.devices[e]) for *_, e in sol.stages) == kw["total_devices"]
    if "n_stages" in kw:
        assert len(sol.stages) == kw["n_stages"]
    m, a = kw["n_microbatches"], kw["alpha"]
    assert sol.objective == pytest.approx(a * sum(sol.stage_costs) + (m - a) * max(sol.stage_costs), rel=1e-12)


def _tables(rng: np.random.Generator, L: int, range_time: bool = False) -> StageTables:
    per = rng.integers(1, 6, size=L) / 4.0
    stat = rng.random(L)
    act = rng.random(L) * 0.2
    cum = lambda x: np.concatenate([[0.0], np.cumsum(x)])  # noqa: E731
    # a non-additive stage time ≥ 0 per range (the MoE host cover a stage's edges cut: Scorer.cover_table), coarse
    rt = np.triu(rng.integers(0, 3, size=(L + 1, L + 1)) / 4.0, 1) if range_time else None
    return StageTables(time=cum(per), static=cum(stat), act=cum(act), last_time=float(rng.integers(0, 8)) / 4,
                       first_static=float(rng.random()), last_static=float(rng.random()),
                       last_act=float(rng.random() * 0.3), stage_static=0.1, range_time=rt)


def _split_objective(t: StageTables, layers: list[int], m: int, alpha: float, inflight: list[float],
                     limit: float) -> float:
    b = np.concatenate([[0], np.cumsum(layers)])
    L, p = len(t.time) - 1, len(layers)
    costs, ok = [], True
    for s in range(p):
        i, j = b[s], b[s + 1]
        c = t.time[j] - t.time[i] + (t.last_time if j == L else 0) + (t.range_time[i, j] if t.range_time is not None
                                                                       else 0)
        mem = (t.static[j] - t.static[i] + (t.first_static if i == 0 else 0) + (t.last_static if j == L else 0)
               + t.stage_static + (t.act[j] - t.act[i] + (t.last_act if j == L else 0)) * inflight[p - s])
        ok &= mem <= limit
        costs.append(c)
    return alpha * sum(costs) + (m - alpha) * max(costs) if ok else np.inf


@pytest.mark.parametrize("seed", range(40))
def test_best_split_equals_enumeration_of_megatron_splits(seed: int) -> None:
    rng = np.random.default_rng(seed)
    L = int(rng.integers(2, 13))
    p = int(rng.integers(1, min(L, 6) + 1))
    m = int(rng.integers(p, 3 * p + 2))
    alpha = float(rng.choice(ALPHAS))
    t = _tables(rng, L, range_time=seed % 2 == 1)
    inflight = [0.0] + [float(min(s, m)) for s in range(1, p + 1)]
    limit = float(rng.choice([np.inf, 2.0, 4.0, 8.0]))
    got = best_split(t, n_stages=p, n_microbatches=m, inflight=inflight, mem_limit=limit, alpha=alpha)
    # Enumerate [first, q × (p−2), last] directly.
    ref, ref_split = np.inf, None
    for q in mid_layer_choices(L, p):
        for first in range(1, L):
            last = L - first - (p - 2) * q
            if p == 1:
                split = [L]
            elif last < 1:
                continue
            else:
                split = [first] + [q] * (p - 2) + [last]
            v = _split_objective(t, split, m, alpha, inflight, limit)
            if v < ref:
                ref, ref_split = v, split
            if p == 1:
                break
    if not np.isfinite(ref):
        assert got is None
        return
    assert got is not None and got[1] == pytest.approx(ref, rel=1e-12), (got, ref, ref_split)
    assert sum(got[0]) == L and len(got[0]) == p and min(got[0]) >= 1
    assert _split_objective(t, got[0], m, alpha, inflight, limit) == pytest.approx(ref, rel=1e-12)


def test_megatron_edges_only_offer_expressible_ranges() -> None:
    t = _tables(np.random.default_rng(0), 10)
    e = megatron_edges(t, 4, 3)
    ranges = set(zip(e.start.tolist(), e.end.tolist()))
    for a, b in ranges:
        assert a == 0 or b == 10 or b - a == 3
    # Every split it allows is [f, 3, 3, l] with f + l = 4.
    for f in range(1, 4):
        assert {(0, f), (f, f + 3), (f + 3, f + 6), (f + 6, 10)} <= ranges


def test_early_break_keeps_the_optimum_when_t_max_is_not_the_bottleneck() -> None:
    # Two stages: the balanced split has the least max; a lopsided one has the least sum. With m = 1
    # the objective is the plain sum, so the DP must look past the bottleneck t_max.
    rows = [(0, 1, 5.0), (1, 2, 5.0), (0, 2, 6.0)]
    st_, en, co = (np.array(x) for x in zip(*rows))
    z = np.zeros(3)
    edges = StageEdges(st_, en, co, z, z, np.zeros(3, dtype=np.int64))
    for m in (1, 2, 3):
        sol = stage_dp(edges, n_layers=2, n_microbatches=m, inflight=[0, 1, 1, 1], max_stages=2)
        ref = brute_force(edges, n_layers=2, n_microbatches=m, inflight=[0, 1, 1, 1], max_stages=2)
        assert sol is not None and sol.objective == pytest.approx(ref)


@pytest.mark.parametrize("seed", range(60))
def test_megatron_scan_gives_the_stage_dps_answer_ties_included(seed: int) -> None:
    # megatron_scan (the planner's path) must return the DP's split and objective bit for bit, on coarse
    # tables where many splits tie (equal sums, equal maxima), with and without ZeRO-3 range terms and range times.
    from search.inter_op import megatron_dp, megatron_scan

    rng = np.random.default_rng(1000 + seed)
    L = int(rng.integers(2, 17))
    t = _tables(rng, L, range_time=seed % 2 == 1)
    if seed % 3 == 0:
        largest = rng.integers(1, 4, size=L) / 8.0
        rs = np.zeros((L + 1, L + 1))
        for i in range(L):
            rs[i, i + 1:] = np.maximum.accumulate(largest[i:])
        t = StageTables(t.time, t.static, t.act, t.last_time, t.first_static, t.last_static, t.last_act,
                        t.stage_static, rs, t.range_time)
    for p in range(1, min(L, 7) + 1):
        m = int(rng.integers(p, 3 * p + 2))
        inflight = [0.0] + [float(min(s, m)) for s in range(1, p + 1)]
        for limit in (np.inf, 2.0, 3.0, 5.0):
            kw = dict(n_microbatches=m, inflight=inflight, mem_limit=limit, alpha=float(rng.choice(ALPHAS)))
            for q in mid_layer_choices(L, p):
                assert megatron_scan(t, p, q, **kw) == megatron_dp(t, p, q, **kw), (p, q, kw)
            ref = best_split(t, n_stages=p, solver=megatron_dp, **kw)
            assert best_split(t, n_stages=p, **kw) == ref == best_split(t, n_stages=p, solver=megatron_scan, **kw)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**31 - 1), st.booleans(), st.booleans())
def test_chunked_costs_is_each_chunk_priced_alone_and_summed_in_order(L: int, seed: int, first: bool,
                                                                     ranged: bool) -> None:
    # One vectorized range_costs for every chunk, summed per rank in order: bit for bit what pricing each chunk on
    # its own gives (the planner's bounds and Scorer.score compare such sums with ``>=``).
    rng = np.random.default_rng(seed)
    tables = StageTables(time=np.concatenate([[0.0], np.cumsum(rng.random(L))]), static=np.zeros(L + 1),
                         act=np.zeros(L + 1), last_time=float(rng.random()), first_static=0.0, last_static=0.0,
                         last_act=0.0, first_time=float(rng.random()) if first else 0.0,
                         range_time=rng.random((L + 1, L + 1)) if ranged else None)
    cuts = sorted({0, L, *(int(x) for x in rng.integers(0, L + 1, size=int(rng.integers(0, L + 1))))})
    chunks = list(zip(cuts[:-1], cuts[1:]))
    ranks = int(rng.integers(1, len(chunks) + 1))
    ranges = [chunks[r::ranks] for r in range(ranks)] + [[]]  # interleaved ranks, and a rank holding nothing
    alone = [float(sum(range_costs(tables, np.array([a]), np.array([b]))[0] for a, b in r)) for r in ranges]
    assert chunked_costs(tables, ranges).tolist() == alone
