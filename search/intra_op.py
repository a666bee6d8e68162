"""Intra-op pass: choose a sharding strategy for every operator of one layer on one logical mesh (ILP).

Formulation (Alpa, OSDI'22 §4.1, alpa ``auto_sharding.py``; edges over *layout classes*, below)
----------------------------------------------------------------------------------------------
Data: nodes ``v`` (operators after merging follow ops and fusing sibling matmuls) with strategies
``s ∈ S_v``, node cost ``c_vs`` (compute + communication inside the op, seconds per step), memory
``m_vs`` (bytes per device); edges ``(u, v)`` with a class map ``κ_u: S_u → A_u`` (the layout ``u`` gives
the edge's tensor), ``κ_v: S_v → B_v`` (the layout ``v`` wants) and a resharding cost ``R_uv[a, b]``;
tie groups ``g`` (target rules: "one ZeRO stage per layer") with a value ``τ_g(v, s)`` per member strategy.

Variables: ``x_vs ∈ {0,1}``; ``e_uv,ab ∈ [0,1]`` (integral whenever x is: constraints 3–4 leave one cell);
``y_gt ∈ {0,1}`` per tie group and value.

    (1) Σ_s x_vs = 1                                      ∀ v            one strategy per op
    (2) Σ_ab e_uv,ab = 1                                  ∀ (u,v)        one layout pair per edge
    (3) Σ_b e_uv,ab = Σ_{s: κ_u(s)=a} x_us                ∀ (u,v), a     row sums = s_u
    (4) Σ_a e_uv,ab = Σ_{s: κ_v(s)=b} x_vs                ∀ (u,v), b     column sums = s_v
    (5) Σ_v Σ_s m_vs x_vs ≤ M                             (if M given)   memory
    (6) Σ_t y_gt = 1;  Σ_{s: τ_g(v,s)=t} x_vs = y_gt      ∀ g, v∈g, t    target ties
    min Σ_v Σ_s c_vs x_vs + Σ_(u,v) Σ_ab R_uv,ab e_uv,ab

Edge variables live on layout classes, not strategy pairs: resharding depends only on the two layouts,
so this is the same optimum with |A|·|B| instead of |S_u|·|S_v| variables (exact). All saved
activations are live together at the start of backward, so one memory row (5) is the layer's peak.

Speed: follow ops merged and sibling matmuls fused (``strategies.build_nodes``); dominated strategies
pruned (``prune_dominated``, exact); all-zero edges dropped; MIP backend CBC via ``pywraplp``
(SEARCH_NOTES.md: fastest for the linearized edge form); results cached per request (``IntraOpCache``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from ortools.linear_solver import pywraplp

Status = Literal["optimal", "feasible", "infeasible", "timeout"]


# ==== generic problem ==============================================================================
@dataclass(frozen=True)
class IlpEdge:
    u: int
    v: int
    u_class: np.ndarray  # (|S_u|,) int: class of each strategy of u for this edge's tensor
    v_class: np.ndarray  # (|S_v|,) int
    cost: np.ndarray  # (|A_u|, |B_v|)


@dataclass(frozen=True)
class TieGroup:
    """Members' strategies must agree on one value (constraint 6). ``values[v][s]`` per member node v."""

    name: str
    values: dict[int, tuple[Hashable, ...]]


@dataclass(frozen=True)
class IlpProblem:
    names: tuple[str, ...]
    node_cost: tuple[np.ndarray, ...]  # per node, (|S_v|,)
    node_mem: tuple[np.ndarray, ...]  # per node, (|S_v|,) bytes
    edges: tuple[IlpEdge, ...] = ()
    ties: tuple[TieGroup, ...] = ()
    memory_limit: float | None = None

    def evaluate(self, choice: Sequence[int]) -> tuple[float, float]:
        """(objective, memory) of a full assignment — the reference the ILP must agree with."""
        cost = sum(float(c[s]) for c, s in zip(self.node_cost, choice))
        cost += sum(float(e.cost[e.u_class[choice[e.u]], e.v_class[choice[e.v]]]) for e in self.edges)
        mem = sum(float(m[s]) for m, s in zip(self.node_mem, choice))
        return cost, mem

    def feasible(self, choice: Sequence[int]) -> bool:
        for g in self.ties:
            if len({vals[choice[v]] for v, vals in g.values.items()}) > 1:
                return False
        _, mem = self.evaluate(choice)
        return self.memory_limit is None or mem <= self.memory_limit * (1 + 1e-9)


@dataclass(frozen=True)
class IlpSolution:
    status: Status
    choice: tuple[int, ...] | None
    objective: float | None
    memory: float | None
    solve_time_s: float
    num_variables: int


# ==== solver =========================================================================================
def solve_ilp(problem: IlpProblem, *, time_limit_s: float = 10.0, backend: str = "CBC") -> IlpSolution:
    """Solve the formulation in the module docstring. Builder order: data → variables → constraints →
    objective → solve → extract."""
    t0 = time.perf_counter()
    # -- data: scale costs to O(1e3) and memory to GiB so solver tolerances are meaningful.
    scale = max([float(np.max(np.abs(c))) for c in problem.node_cost if c.size]
                + [float(np.max(np.abs(e.cost))) for e in problem.edges if e.cost.size] + [1e-30])
    k = 1e3 / scale
    solver = pywraplp.Solver.CreateSolver(backend)
    if solver is None:
        raise RuntimeError(f"OR-Tools backend {backend!r} is not available")
    solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))

    # -- variables: dicts keyed by (node, strategy), (edge, a, b), (group, value)
    x: dict[tuple[int, int], pywraplp.Variable] = {
        (v, s): solver.BoolVar(f"x[{problem.names[v]},{s}]")
        for v, c in enumerate(problem.node_cost) for s in range(c.size)
    }
    e: dict[tuple[int, int, int], pywraplp.Variable] = {}
    for i, edge in enumerate(problem.edges):
        na, nb = edge.cost.shape
        for a, b in itertools.product(range(na), range(nb)):
            e[i, a, b] = solver.NumVar(0.0, 1.0, f"e[{i},{a},{b}]")
    y: dict[tuple[int, Hashable], pywraplp.Variable] = {}
    for gi, g in enumerate(problem.ties):
        for t in sorted({t for vals in g.values.values() for t in vals}, key=repr):
            y[gi, t] = solver.BoolVar(f"y[{g.name},{t}]")

    # -- constraints (numbers as in the module docstring)
    for v, c in enumerate(problem.node_cost):  # (1)
        solver.Add(sum(x[v, s] for s in range(c.size)) == 1, f"c1[{v}]")
    for i, edge in enumerate(problem.edges):
        na, nb = edge.cost.shape
        solver.Add(sum(e[i, a, b] for a in range(na) for b in range(nb)) == 1, f"c2[{i}]")  # (2)
        for a in range(na):  # (3)
            solver.Add(sum(e[i, a, b] for b in range(nb))
                       == sum(x[edge.u, s] for s in np.flatnonzero(edge.u_class == a)), f"c3[{i},{a}]")
        for b in range(nb):  # (4)
            solver.Add(sum(e[i, a, b] for a in range(na))
                       == sum(x[edge.v, s] for s in np.flatnonzero(edge.v_class == b)), f"c4[{i},{b}]")
    if problem.memory_limit is not None:  # (5)
        solver.Add(sum(float(m[s]) / 2**30 * x[v, s] for v, m in enumerate(problem.node_mem)
                       for s in range(m.size)) <= problem.memory_limit / 2**30 * (1 + 1e-9), "c5")
    for gi, g in enumerate(problem.ties):  # (6)
        values = [t for (gj, t) in y if gj == gi]
        solver.Add(sum(y[gi, t] for t in values) == 1, f"c6[{g.name}]")
        for v, vals in g.values.items():
            for t in values:
                solver.Add(sum(x[v, s] for s, tv in enumerate(vals) if tv == t) == y[gi, t], f"c6[{g.name},{v},{t}]")

    # -- objective
    solver.Minimize(
        sum(float(c[s]) * k * x[v, s] for v, c in enumerate(problem.node_cost) for s in range(c.size))
        + sum(float(edge.cost[a, b]) * k * e[i, a, b] for (i, a, b) in e if (edge := problem.edges[i]).cost[a, b])
    )

    # -- solve, with the status checked explicitly
    code = solver.Solve()
    nvars = solver.NumVariables()
    if code == pywraplp.Solver.INFEASIBLE:
        return IlpSolution("infeasible", None, None, None, time.perf_counter() - t0, nvars)
    if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return IlpSolution("timeout", None, None, None, time.perf_counter() - t0, nvars)

    # -- extract
    choice = tuple(int(np.argmax([x[v, s].solution_value() for s in range(c.size)]))
                   for v, c in enumerate(problem.node_cost))
    obj, mem = problem.evaluate(choice)
    status: Status = "optimal" if code == pywraplp.Solver.OPTIMAL else "feasible"
    return IlpSolution(status, choice, obj, mem, time.perf_counter() - t0, nvars)


# ==== exact simplifications ======================================================================
@dataclass(frozen=True)
class Pruned:
    problem: IlpProblem
    kept: tuple[np.ndarray, ...]  # per node: original strategy indices kept, in order

    def lift(self, choice: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(self.kept[v][s]) for v, s in enumerate(choice))


def prune_dominated(problem: IlpProblem) -> Pruned:
    """Drop strategy i of node v when another strategy j of v is no worse everywhere: node cost, memory
    (when a limit is set), every incident edge row/column, and the same value in every tie group. Such a
    j can replace i in any solution without raising the cost or breaking a constraint, so the optimum
    is unchanged. Also drops edges whose cost is all zero."""
    n = len(problem.names)
    keep = [np.ones(c.size, dtype=bool) for c in problem.node_cost]
    incident: list[list[tuple[IlpEdge, bool]]] = [[] for _ in range(n)]
    for edge in problem.edges:
        incident[edge.u].append((edge, True))
        incident[edge.v].append((edge, False))
    use_mem = problem.memory_limit is not None
    for v in range(n):
        cost, mem = problem.node_cost[v], problem.node_mem[v]
        tie_vals = [g.values[v] for g in problem.ties if v in g.values]
        rows = [(edge.cost[edge.u_class] if is_u else edge.cost[:, edge.v_class].T) for edge, is_u in incident[v]]
        for i in range(cost.size):
            for j in range(cost.size):
                if i == j or not keep[v][j]:
                    continue
                if any(t[i] != t[j] for t in tie_vals):
                    continue
                if cost[j] > cost[i] or (use_mem and mem[j] > mem[i]):
                    continue
                if any(np.any(r[j] > r[i]) for r in rows):
                    continue
                strictly = (cost[j] < cost[i] or (use_mem and mem[j] < mem[i])
                            or any(np.any(r[j] < r[i]) for r in rows))
                if strictly or j < i:  # equal twins: keep the first
                    keep[v][i] = False
                    break
    kept = tuple(np.flatnonzero(k) for k in keep)
    remap = [np.full(k.size, -1) for k in keep]
    for v in range(n):
        remap[v][kept[v]] = np.arange(kept[v].size)
    edges = tuple(
        IlpEdge(e.u, e.v, e.u_class[kept[e.u]], e.v_class[kept[e.v]], e.cost)
        for e in problem.edges if np.any(e.cost)
    )
    ties = tuple(TieGroup(g.name, {v: tuple(vals[s] for s in kept[v]) for v, vals in g.values.items()})
                 for g in problem.ties)
    reduced = IlpProblem(
        problem.names, tuple(c[k] for c, k in zip(problem.node_cost, kept)),
        tuple(m[k] for m, k in zip(problem.node_mem, kept)), edges, ties, problem.memory_limit,
    )
    return Pruned(reduced, kept)
