"""The intra-op ILP (and its exact simplifications) against brute-force enumeration on small graphs."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search.intra_op import IlpEdge, IlpProblem, IlpSolution, TieGroup, _enumerate, prune_dominated, solve_ilp


def brute_force(p: IlpProblem) -> tuple[float, tuple[int, ...]] | None:
    best: tuple[float, tuple[int, ...]] | None = None
    for choice in itertools.product(*(range(c.size) for c in p.node_cost)):
        if not p.feasible(choice):
            continue
        obj, _ = p.evaluate(choice)
        if best is None or obj < best[0]:
            best = (obj, choice)
    return best


@st.composite
def problems(draw: st.DrawFn) -> IlpProblem:
    n = draw(st.integers(1, 8))
    sizes = [draw(st.integers(1, 4)) for _ in range(n)]
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    # Costs with ties and zeros (real cost tables have many equal entries).
    node_cost = tuple(np.round(rng.exponential(1.0, s), draw(st.sampled_from([0, 1, 3]))) for s in sizes)
    node_mem = tuple(rng.uniform(0.0, 10.0, s) * 2**30 for s in sizes)
    edges = []
    for v in range(1, n):
        for u in rng.choice(v, size=min(v, int(rng.integers(0, 3))), replace=False):
            classes_u = int(rng.integers(1, sizes[u] + 1))
            classes_v = int(rng.integers(1, sizes[v] + 1))
            u_class = rng.integers(0, classes_u, sizes[u])
            v_class = rng.integers(0, classes_v, sizes[v])
            cost = rng.exponential(1.0, (classes_u, classes_v)) * (rng.random((classes_u, classes_v)) < 0.7)
            edges.append(IlpEdge(int(u), v, u_class, v_class, cost))
    ties = []
    if n >= 2 and draw(st.booleans()):
        members = rng.choice(n, size=int(rng.integers(2, n + 1)), replace=False)
        ties.append(TieGroup("zero", {int(v): tuple(int(t) for t in rng.integers(0, 2, sizes[v])) for v in members}))
    limit_kind = draw(st.sampled_from(["none", "loose", "tight", "infeasible"]))
    min_mem = sum(float(m.min()) for m in node_mem)
    max_mem = sum(float(m.max()) for m in node_mem)
    limit = {"none": None, "loose": max_mem, "tight": min_mem + 0.3 * (max_mem - min_mem),
             "infeasible": 0.99 * min_mem - 1.0}[limit_kind]
    return IlpProblem(tuple(f"op{i}" for i in range(n)), node_cost, node_mem, tuple(edges), tuple(ties), limit)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(["auto", "lp", "CBC"]))
def test_ilp_matches_brute_force(p: IlpProblem, backend: str) -> None:
    ref = brute_force(p)
    # "lp": the auto path with enumeration off (GLOP relaxation, CBC when fractional)
    sol = solve_ilp(p, backend="auto", enumerate_up_to=0) if backend == "lp" else solve_ilp(p, backend=backend)
    if ref is None:
        assert sol.status == "infeasible"
        return
    assert sol.status == "optimal"
    assert sol.choice is not None and p.feasible(sol.choice)
    assert np.isclose(sol.objective, ref[0], rtol=1e-6, atol=1e-9)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_pruning_keeps_the_optimum(p: IlpProblem) -> None:
    ref = brute_force(p)
    pruned = prune_dominated(p)
    assert all(k.size >= 1 for k in pruned.kept)
    sol = solve_ilp(pruned.problem)
    if ref is None:
        assert sol.status == "infeasible"
        return
    assert sol.status == "optimal" and sol.choice is not None
    lifted = pruned.lift(sol.choice)
    assert p.feasible(lifted)
    assert np.isclose(p.evaluate(lifted)[0], ref[0], rtol=1e-6, atol=1e-9)


def test_infeasible_memory_reports_status() -> None:
    p = IlpProblem(("a", "b"), (np.array([1.0, 2.0]), np.array([1.0])),
                   (np.array([5.0, 4.0]), np.array([3.0])), memory_limit=6.0)
    for backend in ("auto", "CBC", "SCIP"):
        assert solve_ilp(p, backend=backend).status == "infeasible"
    assert brute_force(p) is None


def test_fractional_relaxation_falls_back_to_the_mip() -> None:
    # Memory 5 allows "half of each" in the LP (cost 1.5·½ + 0·½) but no integral point below cost 2.
    p = IlpProblem(("a",), (np.array([0.0, 3.0, 2.0]),), (np.array([10.0, 0.0, 4.0]),), memory_limit=5.0)
    sol = solve_ilp(p)
    assert sol.status == "optimal" and sol.choice == (2,) and sol.objective == 2.0


def test_edge_classes_pick_the_cheap_pair() -> None:
    # u: strategies 0,1 give layout 0; strategy 2 gives layout 1. v wants layout 1 (cheap reshard only then).
    p = IlpProblem(("u", "v"), (np.array([1.0, 1.0, 1.5]), np.array([0.0])), (np.zeros(3), np.zeros(1)),
                   (IlpEdge(0, 1, np.array([0, 0, 1]), np.array([0]), np.array([[2.0], [0.0]])),))
    sol = solve_ilp(p)
    assert sol.status == "optimal" and sol.choice == (2, 0) and np.isclose(sol.objective, 1.5)


def _enumerate_loop(p: IlpProblem, tie_break_memory: bool) -> IlpSolution:
    """The plain loop ``_enumerate`` vectorises: objective, then memory, first in product order."""
    best: tuple[float, float, tuple[int, ...]] | None = None
    for choice in itertools.product(*(range(c.size) for c in p.node_cost)):
        if not p.feasible(choice):
            continue
        obj, mem = p.evaluate(choice)
        if best is None or (obj, mem if tie_break_memory else 0.0) < best[:2]:
            best = (obj, mem if tie_break_memory else 0.0, choice)
    if best is None:
        return IlpSolution("infeasible", None, None, None, 0.0, 0)
    return IlpSolution("optimal", best[2], *p.evaluate(best[2]), 0.0, 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.booleans(), st.booleans())
def test_vectorised_enumeration_equals_the_loop(p: IlpProblem, tie_break_memory: bool, coarse_mem: bool) -> None:
    # Same choice, objective and memory bit for bit, ties included (coarse memory makes (cost, memory) ties).
    if coarse_mem:
        p = IlpProblem(p.names, p.node_cost, tuple(np.round(m / 2**30) for m in p.node_mem), p.edges, p.ties,
                       None if p.memory_limit is None else round(p.memory_limit / 2**30))
    assert _enumerate(p, tie_break_memory) == _enumerate_loop(p, tie_break_memory)
