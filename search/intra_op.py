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
    (7) then, keeping that objective ≤ its optimum: min Σ_v Σ_s m_vs x_vs   (lexicographic tie-break)

Edge variables live on layout classes, not strategy pairs: resharding depends only on the two layouts,
so this is the same optimum with |A|·|B| instead of |S_u|·|S_v| variables (exact). All saved
activations are live together at the start of backward, so one memory row (5) is the layer's peak.

Speed: follow ops merged and sibling matmuls fused (``strategies.build_nodes``); dominated strategies
pruned (``prune_dominated``, exact); all-zero edges dropped; up to ``ENUMERATE_UP_TO`` assignments every
one is evaluated at once in numpy (exact); larger problems: the LP relaxation first (GLOP; an integral
LP optimum is the ILP optimum), else the MIP backend CBC via ``pywraplp`` (SEARCH_NOTES.md: fastest for
the linearized edge form); results cached per request (``IntraOpCache``).
"""

from __future__ import annotations

import itertools
import time
from functools import lru_cache
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cost_models.errors import ConfigError, InfeasibleError
from cost_models.dsa import indexer_gathered
from cost_models.opgraph import TRANSFORMER_KINDS, LayerGraph, LayerKind, layer_graph
from cost_models.specs import ModelSpec, Precision, Recompute
from search.mesh import LogicalMesh, MeshAxis
from search.resharding import Placement, edge_time_s
from search.strategies import (
    TORCHTITAN_MODULE,
    TORCHTITAN_STYLE,
    SP_MODES,
    Comm,
    LayerContext,
    Node,
    Strategy,
    StrategySet,
    Target,
    build_nodes,
    node_strategies,
)

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
    method: str = ""  # "lp" (integral relaxation) or the MIP backend that solved it


# ==== solver =========================================================================================
def solve_ilp(problem: IlpProblem, *, time_limit_s: float = 10.0, backend: str = "auto",
              tie_break_memory: bool = True, enumerate_up_to: int | None = None) -> IlpSolution:
    """Solve the formulation in the module docstring. With ``tie_break_memory`` a second solve keeps the
    optimal cost (7) and minimizes memory, so equal-cost choices (ZeRO-0 vs ZeRO-1 traffic is equal)
    report the leaner one.

    ``backend="auto"`` first solves the LP relaxation with GLOP: an integral LP optimum is an ILP optimum
    (the relaxation's optimum is a lower bound that the integral point attains), and an infeasible LP means
    an infeasible ILP. These graphs are usually integral (SEARCH_NOTES.md, autoparallel #484); when the LP
    is fractional, the MIP backend CBC solves it (SEARCH_NOTES.md: fastest on the linearized edge form).
    Before that, up to ``enumerate_up_to`` (default ``ENUMERATE_UP_TO``) assignments are enumerated."""
    t0 = time.perf_counter()
    method = backend
    limit = ENUMERATE_UP_TO if enumerate_up_to is None else enumerate_up_to
    separable = _separable_optimum(problem) if backend == "auto" else None
    if separable is not None:
        sol, method = separable, "separable"
    elif backend == "auto" and _n_assignments(problem, limit) <= limit:
        sol, method = _enumerate(problem, tie_break_memory), "enumeration"
    elif backend == "auto":
        lp, tie_done = _solve_once(problem, "GLOP", False, time_limit_s, tie_break_memory)
        if lp is not None and (tie_done or lp.status == "infeasible"):
            sol, method = lp, "lp"
        elif lp is not None:  # integral optimum, fractional tie-break: finish (7) alone on the MIP
            sol, _ = _solve_once(problem, "CBC", True, time_limit_s, True, cost_bound=lp.objective)
            sol, method = (lp, "lp") if sol is None or sol.choice is None else (sol, "lp+CBC")
        else:
            sol, _ = _solve_once(problem, "CBC", True, time_limit_s, tie_break_memory)
            method = "CBC"
    else:
        sol, _ = _solve_once(problem, backend, True, time_limit_s, tie_break_memory)
    assert sol is not None
    return IlpSolution(sol.status, sol.choice, sol.objective, sol.memory, time.perf_counter() - t0,
                       sol.num_variables, method)


ENUMERATE_UP_TO = 1 << 15  # assignments: up to this, listing them all (vectorised) beats building an LP model


def _n_assignments(problem: IlpProblem, limit: int) -> int:
    n = 1
    for c in problem.node_cost:
        n *= c.size
        if n > limit:
            break
    return n


def _separable_optimum(problem: IlpProblem) -> IlpSolution | None:
    """Exact when it answers: Σ_v min_s c_vs is a lower bound on (1)–(6) (edges cost ≥ 0). Take every node's
    cheapest strategy (least memory among equals, then the first); if that assignment is feasible and crosses
    no costly edge it attains the bound, so it is optimal, and no other optimum holds less memory (each must
    also sit at every node's minimum cost). None when the bound is not attained."""
    choice = []
    for c, m in zip(problem.node_cost, problem.node_mem):
        best = int(np.lexsort((np.arange(c.size), m, c))[0])
        choice.append(best)
    choice_t = tuple(choice)
    if any(e.cost[e.u_class[choice_t[e.u]], e.v_class[choice_t[e.v]]] > 0 for e in problem.edges):
        return None
    if not problem.feasible(choice_t):
        return None
    obj, mem = problem.evaluate(choice_t)
    return IlpSolution("optimal", choice_t, obj, mem, 0.0, 0)


def _enumerate(problem: IlpProblem, tie_break_memory: bool) -> IlpSolution:
    """Exact: every assignment, objective then (7) memory, first in index order on ties. After
    ``prune_dominated`` most layer problems have one or two strategies per node (a single point when the
    target expresses one pattern), so this is the usual path. Vectorised: one array entry per assignment in
    ``itertools.product`` order, objective and memory summed in ``IlpProblem.evaluate``'s order (same floats),
    feasibility as ``IlpProblem.feasible`` (tests/test_intra_op_exact.py holds it to the plain loop)."""
    sizes = [c.size for c in problem.node_cost]
    if 0 in sizes:
        return IlpSolution("infeasible", None, None, None, 0.0, 0)
    n = len(sizes)

    def along(values: np.ndarray, *axes: int) -> np.ndarray:  # broadcast a per-strategy table over the grid
        shape = [1] * n
        for ax, k in zip(axes, values.shape):
            shape[ax] = k
        return values.reshape(shape)

    cost = np.zeros(sizes)
    for v, c in enumerate(problem.node_cost):
        cost = cost + along(c, v)
    if problem.edges:
        edge_sum = np.zeros(sizes)
        for e in problem.edges:
            pair = e.cost[e.u_class[:, None], e.v_class[None, :]]  # (|S_u|, |S_v|)
            term = (along(pair, e.u, e.v) if e.u < e.v else along(pair.T, e.v, e.u) if e.u > e.v
                    else along(pair.diagonal().copy(), e.u))
            edge_sum = edge_sum + term
        cost = cost + edge_sum
    mem = np.zeros(sizes)
    for v, m in enumerate(problem.node_mem):
        mem = mem + along(m, v)
    ok = np.ones(sizes, dtype=bool)
    for g in problem.ties:
        codes: dict[Hashable, int] = {}
        per_member = [along(np.array([codes.setdefault(t, len(codes)) for t in vals]), v)
                      for v, vals in g.values.items()]
        for other in per_member[1:]:
            ok &= other == per_member[0]
    if problem.memory_limit is not None:
        ok &= mem <= problem.memory_limit * (1 + 1e-9)
    if not ok.any():
        return IlpSolution("infeasible", None, None, None, 0.0, 0)
    cand = ok & (cost == cost[ok].min())
    if tie_break_memory:
        cand &= mem == mem[cand].min()
    flat = int(np.flatnonzero(cand)[0])  # C order = itertools.product order
    choice = tuple(int(x) for x in np.unravel_index(flat, sizes)) if n else ()
    obj, used = problem.evaluate(choice)
    return IlpSolution("optimal", choice, obj, used, 0.0, 0)


def _solve_once(problem: IlpProblem, backend: str, integer: bool, time_limit_s: float, tie_break_memory: bool,
                cost_bound: float | None = None) -> tuple[IlpSolution | None, bool]:
    """One model on one backend, built in OR-Tools order: data → variables → constraints → objective →
    solve → extract. Returns (solution, whether the tie-break (7) was applied). With ``integer=False``
    (LP relaxation) the solution is None when the optimum is fractional, and a fractional tie-break leaves
    the integral cost optimum untie-broken. ``cost_bound`` (a known optimum) skips straight to (7)."""
    # -- data: scale costs and memory to O(1e3) so solver tolerances are meaningful.
    scale = max([float(np.max(np.abs(c))) for c in problem.node_cost if c.size]
                + [float(np.max(np.abs(e.cost))) for e in problem.edges if e.cost.size] + [1e-30])
    k = 1e3 / scale
    mem_scale = max([float(np.max(np.abs(m))) for m in problem.node_mem if m.size]
                    + [abs(problem.memory_limit or 0.0), 1e-30])
    km = 1e3 / mem_scale
    from ortools.linear_solver import pywraplp  # lazily: 0.4 s to import, and most layer problems enumerate

    solver = pywraplp.Solver.CreateSolver(backend)
    if solver is None:
        raise RuntimeError(f"OR-Tools backend {backend!r} is not available")
    solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))

    # -- variables: dicts keyed by (node, strategy), (edge, a, b), (group, value)
    def binary(name: str) -> "pywraplp.Variable":
        return solver.BoolVar(name) if integer else solver.NumVar(0.0, 1.0, name)

    x: dict[tuple[int, int], "pywraplp.Variable"] = {
        (v, s): binary(f"x[{problem.names[v]},{s}]") for v, c in enumerate(problem.node_cost) for s in range(c.size)
    }
    e: dict[tuple[int, int, int], "pywraplp.Variable"] = {}
    for i, edge in enumerate(problem.edges):
        na, nb = edge.cost.shape
        for a, b in itertools.product(range(na), range(nb)):
            e[i, a, b] = solver.NumVar(0.0, 1.0, f"e[{i},{a},{b}]")
    y: dict[tuple[int, Hashable], "pywraplp.Variable"] = {}
    for gi, g in enumerate(problem.ties):
        for t in sorted({t for vals in g.values.values() for t in vals}, key=repr):
            y[gi, t] = binary(f"y[{g.name},{t}]")

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
    memory = sum(float(m[s]) * km * x[v, s] for v, m in enumerate(problem.node_mem) for s in range(m.size))
    if problem.memory_limit is not None:  # (5)
        solver.Add(memory <= problem.memory_limit * km * (1 + 1e-9), "c5")
    for gi, g in enumerate(problem.ties):  # (6)
        values = [t for (gj, t) in y if gj == gi]
        solver.Add(sum(y[gi, t] for t in values) == 1, f"c6[{g.name}]")
        for v, vals in g.values.items():
            for t in values:
                solver.Add(sum(x[v, s] for s, tv in enumerate(vals) if tv == t) == y[gi, t], f"c6[{g.name},{v},{t}]")

    # -- objective
    objective = (
        sum(float(c[s]) * k * x[v, s] for v, c in enumerate(problem.node_cost) for s in range(c.size))
        + sum(float(edge.cost[a, b]) * k * e[i, a, b] for (i, a, b) in e if (edge := problem.edges[i]).cost[a, b])
    )
    solver.Minimize(objective)

    # -- solve, with the status checked explicitly
    if cost_bound is not None:  # (7) directly, against the optimum found before
        solver.Add(objective <= cost_bound * k + 1e-7 * max(1.0, abs(cost_bound * k)), "c7")
        solver.Minimize(memory)
    code = solver.Solve()
    nvars = solver.NumVariables()
    if code == pywraplp.Solver.INFEASIBLE:  # for the LP too: the relaxation contains every ILP point
        return IlpSolution("infeasible", None, None, None, 0.0, nvars), False
    if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return (None if not integer else IlpSolution("timeout", None, None, None, 0.0, nvars)), False

    def integral() -> bool:
        return all(min(var.solution_value(), 1.0 - var.solution_value()) < 1e-6 for var in (*x.values(), *y.values()))

    def extract() -> IlpSolution:
        choice = tuple(int(np.argmax([x[v, s].solution_value() for s in range(c.size)]))
                       for v, c in enumerate(problem.node_cost))
        obj, mem = problem.evaluate(choice)
        status: Status = "optimal" if code == pywraplp.Solver.OPTIMAL else "feasible"
        return IlpSolution(status, choice, obj, mem, 0.0, nvars)

    if not integer and not integral():
        return None, False
    if cost_bound is not None or not tie_break_memory or code != pywraplp.Solver.OPTIMAL:
        return extract(), cost_bound is not None
    # -- lexicographic tie-break (7): among optimal assignments take the least memory (one more solve)
    first = extract()
    solver.Add(objective <= solver.Objective().Value() * (1 + 1e-9) + 1e-7, "c7")
    solver.Minimize(memory)
    if solver.Solve() not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        raise AssertionError("memory tie-break lost the optimum it was given")
    if not integer and not integral():
        return first, False
    return extract(), True


# ==== exact simplifications ======================================================================
@dataclass(frozen=True)
class Pruned:
    problem: IlpProblem
    kept: tuple[np.ndarray, ...]  # per node: original strategy indices kept, in order

    def lift(self, choice: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(self.kept[v][s]) for v, s in enumerate(choice))


def prune_dominated(problem: IlpProblem) -> Pruned:
    """Drop strategy i of node v when another strategy j of v is no worse everywhere: node cost, memory,
    every incident edge row/column, and the same value in every tie group. Such a
    j can replace i in any solution without raising the cost or breaking a constraint, so the optimum
    is unchanged. Also drops edges whose cost is all zero."""
    n = len(problem.names)
    keep = [np.ones(c.size, dtype=bool) for c in problem.node_cost]
    incident: list[list[tuple[IlpEdge, bool]]] = [[] for _ in range(n)]
    for edge in problem.edges:
        incident[edge.u].append((edge, True))
        incident[edge.v].append((edge, False))
    use_mem = True  # memory decides feasibility (5) and the tie-break (7)
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


# ==== one layer on one mesh ==========================================================================
@dataclass(frozen=True)
class IntraOpRequest:
    """What the planner asks for: one layer kind on one mesh. With the model and the mesh, the cache key."""

    kind: LayerKind
    seq_len: int
    micro_batch_size: int = 1
    recompute: Recompute = "none"
    precision: Precision = "bf16"
    target: Target = "megatron"
    num_microbatches: int = 1  # gradient-accumulation steps: per-step traffic is amortized over them
    activation_copies: int = 1  # micro-batches whose activations are alive at once
    memory_limit_bytes: float | None = None  # per device for this layer; None = unconstrained
    compute_weight: float = 1.0  # w1 of the composite cost (COST_MODEL.md §6)
    comm_weight: float = 1.0  # w2; memory is a hard constraint (5) here, not the w3 penalty
    sequence_parallel: bool | None = None  # None: chosen per op (tied per layer for megatron); True/False: forced
    kv_replication: Literal["gather", "replicate"] = "gather"  # tp > num_kv_heads: the layout's (ParallelConfig)
    strategies: StrategySet | None = None  # None: the target's; a set no target runs (benchmarks/ilp_gain.py)
    time_limit_s: float = 5.0
    # Megatron --recompute-modules under selective recompute (ParallelConfig.recompute_modules; None: core_attn)
    recompute_modules: tuple[str, ...] | None = None
    # DeepSeek sparse attention's kernels as the target runs them (Runtime.dsa_kernel_backend: megatron's "none", its
    # default, is Megatron-Core's unfused path; LayerContext.dsa_kernel_backend)
    dsa_kernel_backend: Literal["none", "cudnn"] = "none"

    def __post_init__(self) -> None:
        for name in ("seq_len", "micro_batch_size", "num_microbatches", "activation_copies"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 1")
        if self.time_limit_s <= 0 or self.compute_weight < 0 or self.comm_weight < 0:
            raise ValueError(f"time_limit_s ({self.time_limit_s}) must be > 0 and weights ({self.compute_weight}, "
                             f"{self.comm_weight}) >= 0")


@dataclass(frozen=True)
class EdgeReshard:
    producer: str
    consumer: str
    tensor: str
    src: Placement
    dst: Placement
    time_s: float  # per micro-batch, forward + backward


@dataclass(frozen=True)
class NodeChoice:
    node: str
    ops: tuple[str, ...]
    strategy: Strategy


@dataclass(frozen=True)
class IntraOpResult:
    request: IntraOpRequest
    mesh_label: str
    status: Literal["optimal", "feasible", "fallback"]  # fallback: solver hit its limit, uniform Megatron used
    choices: tuple[NodeChoice, ...]
    reshards: tuple[EdgeReshard, ...]
    objective_s: float  # per step: m·(compute + exposed comm + resharding)
    compute_s: float  # per micro-batch
    exposed_comm_s: float  # per micro-batch, inside ops
    reshard_s: float  # per micro-batch, on edges
    activation_bytes: float
    solve_time_s: float  # the ILP alone (building the cost tables not included)
    num_variables: int
    solver_method: str  # "lp" (integral relaxation), "CBC", or "" for the fallback
    strategies_generated: int
    strategies_after_pruning: int

    @property
    def time_per_microbatch_s(self) -> float:
        return self.compute_s + self.exposed_comm_s + self.reshard_s

    @property
    def memory_bytes(self) -> float:
        return self.activation_bytes

    def strategy(self, op: str) -> Strategy:
        """The strategy of the node holding ``op`` (a fused or follow op shares its node's)."""
        return next(c.strategy for c in self.choices if op in c.ops)

    def torchtitan_plan(self) -> dict[str, str]:
        """DTensor TP plan of this layer, module FQN → parallel style (modules left out are replicated)."""
        plan = {}
        for c in self.choices:
            style = TORCHTITAN_STYLE.get(c.strategy.tp or "")
            for op in c.ops:
                if style and op in TORCHTITAN_MODULE:
                    plan[TORCHTITAN_MODULE[op]] = style
        return plan

    def megatron_settings(self) -> dict[str, object]:
        """The per-layer choices as Megatron-LM settings (one value each when solved for ``megatron``)."""
        modes = {c.strategy.tp for c in self.choices}
        return {"sequence_parallel": bool(modes & SP_MODES),
                "expert_parallel": any(c.strategy.ep == "E" for c in self.choices)}

    def collectives(self, axis: MeshAxis | None = None, phase: str | None = None) -> list[tuple[str, Comm]]:
        """(node, collective) pairs, one entry per collective call kind (``Comm.count`` says how many)."""
        return [(c.node, k) for c in self.choices for k in c.strategy.comms
                if (axis is None or axis in k.axes) and (phase is None or k.phase == phase)]


class IntraOpCache:
    """Intra-op results keyed on (model, mesh, request); owned by the caller, with hit/miss counters.
    Identical layers (every dense layer of a model) are solved once; errors are cached and re-raised."""

    def __init__(self) -> None:
        self._store: dict[Hashable, IntraOpResult | ConfigError | InfeasibleError] = {}
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(model: ModelSpec, mesh: LogicalMesh, request: IntraOpRequest) -> Hashable:
        return (model, mesh.cluster, mesh.axes, mesh.sizes, request)

    def get_or_solve(self, model: ModelSpec, mesh: LogicalMesh, request: IntraOpRequest) -> IntraOpResult:
        k = self.key(model, mesh, request)
        if k in self._store:
            self.hits += 1
            found = self._store[k]
        else:
            self.misses += 1
            try:
                found = _solve_layer(model, mesh, request)
            except (ConfigError, InfeasibleError) as err:  # a "no" is an answer too: remember it
                found = err
            self._store[k] = found
        if isinstance(found, Exception):
            raise found
        return found

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def __len__(self) -> int:
        return len(self._store)


def solve_layer(model: ModelSpec, mesh: LogicalMesh, request: IntraOpRequest, *,
                cache: IntraOpCache | None = None) -> IntraOpResult:
    """Optimal per-op strategies for one layer kind on ``mesh``. Raises ``ConfigError`` when the target
    cannot shard the layer on this mesh and ``InfeasibleError`` when nothing fits the memory limit."""
    if cache is not None:
        return cache.get_or_solve(model, mesh, request)
    return _solve_layer(model, mesh, request)


@dataclass(frozen=True)
class LayerProblem:
    """One layer's ILP with the nodes and strategies its indices refer to."""

    nodes: tuple[Node, ...]
    strategies: tuple[tuple[Strategy, ...], ...]
    # u, v, tensor at u, tensor at v, layouts A of u, layouts B of v, reshard seconds per micro-batch (|A|×|B|)
    edges: tuple[tuple[int, int, str, str, tuple[Placement, ...], tuple[Placement, ...], np.ndarray], ...]
    problem: IlpProblem


@lru_cache(maxsize=64)
def _graph(model: ModelSpec, kind: LayerKind, seq_len: int, flash: bool) -> LayerGraph:
    return layer_graph(model, kind, seq_len, flash=flash)


def build_layer_problem(model: ModelSpec, mesh: LogicalMesh, req: IntraOpRequest) -> LayerProblem:
    """Nodes, their strategies and the ILP data (before pruning) for one request."""
    # -- data
    graph = _graph(model, req.kind, req.seq_len, mesh.cluster.efficiency.flash_attention)
    # Recompute (Megatron --recompute-*) applies to transformer layers; embedding and head keep their tensors.
    recompute = req.recompute if req.kind in TRANSFORMER_KINDS else "none"
    ctx = LayerContext(model, mesh, req.seq_len, req.micro_batch_size, recompute, req.precision, req.target,
                       req.activation_copies, req.sequence_parallel, req.kv_replication, req.strategies,
                       req.recompute_modules if recompute == "selective" else None, req.dsa_kernel_backend)
    nodes = build_nodes(graph)
    strategies = tuple(tuple(node_strategies(n, graph, ctx)) for n in nodes)
    m = req.num_microbatches
    producer = {t: i for i, n in enumerate(nodes) for t in n.outputs}
    tokens_factor = {op.output: op.tokens_factor for op in graph.ops}
    pairs = [(producer[t], v, t, t) for v, n in enumerate(nodes) for t in n.inputs if t in producer]
    if req.kind in TRANSFORMER_KINDS:  # steady state of stacked identical layers: layer_out feeds layer_in
        boundary = [t for n in nodes for t in n.inputs if t not in producer and t in graph.tensors]
        last = graph.ops[-1].output
        pairs += [(producer[last], v, last, t) for v, n in enumerate(nodes) for t in n.inputs if t in boundary]
    edges, ilp_edges = [], []
    repeats = 2 if req.recompute == "full" else 1
    for u, v, tu, tv in pairs:
        src = [s.out_layout(tu) for s in strategies[u]]
        dst = [s.in_layout(tv) for s in strategies[v]]
        a_layouts, b_layouts = tuple(dict.fromkeys(src)), tuple(dict.fromkeys(dst))
        tensor = graph.tensors[tu]
        tokens = ctx.tokens * tokens_factor.get(tu, 1.0)
        # (DSA's indexer computes its own inputs whole on every rank from the x and qr it gathers: no resharding)
        gathered = indexer_gathered(graph, tu)
        times = np.array([[0.0 if gathered else edge_time_s(tokens, tensor.width, a, b, mesh, model.num_kv_heads,
                                                             repeats)
                           for b in b_layouts] for a in a_layouts])  # per micro-batch, fwd + bwd
        cost = req.comm_weight * m * times
        edges.append((u, v, tu, tv, a_layouts, b_layouts, times))
        ilp_edges.append(IlpEdge(u, v, np.array([a_layouts.index(x) for x in src]),
                                 np.array([b_layouts.index(x) for x in dst]), cost))
    tie_names = sorted({name for ss in strategies for s in ss for name, _ in s.ties})
    ties = tuple(TieGroup(name, {v: tuple(dict(s.ties).get(name) for s in ss) for v, ss in enumerate(strategies)
                                 if any(name in dict(s.ties) for s in ss)}) for name in tie_names)
    problem = IlpProblem(
        tuple(n.name for n in nodes),
        tuple(np.array([s.cost_s(m, req.compute_weight, req.comm_weight) for s in ss]) for ss in strategies),
        tuple(np.array([s.memory_bytes for s in ss]) for ss in strategies),
        tuple(ilp_edges), ties, req.memory_limit_bytes,
    )
    return LayerProblem(nodes, strategies, tuple(edges), problem)


def _megatron_fallback(lp: LayerProblem) -> tuple[int, ...] | None:
    """Best uniform Megatron pattern (column QKV/FC1, row out/FC2, SP on or off) that fits."""
    best: tuple[float, tuple[int, ...]] | None = None
    for sp in (True, False):
        choice = uniform_choice(lp, sp)
        if choice is None or not lp.problem.feasible(choice):
            continue
        obj, _ = lp.problem.evaluate(choice)
        if best is None or obj < best[0]:
            best = (obj, choice)
    return None if best is None else best[1]


def uniform_choice(lp: LayerProblem, sp: bool) -> tuple[int, ...] | None:
    """Strategy indices of the uniform Megatron pattern (``layer_cost``'s), None when a node lacks its mode."""
    choice = []
    for node, ss in zip(lp.nodes, lp.strategies):
        want = _megatron_mode(node, sp)
        if not any(s.tp == want for s in ss) and any(s.tp == want + "_kvrep" for s in ss):
            want += "_kvrep"  # K/V replicated by the layout (tp > num_kv_heads, kv_replication='replicate')
        mode = want if any(s.tp == want for s in ss) else "R"  # tp = 1: everything is "R"
        idx = [i for i, s in enumerate(ss) if s.tp == mode]
        if not idx:
            return None
        choice.append(idx[0])
    return tuple(choice)


def _megatron_mode(node: Node, sp: bool) -> str:
    if node.kind in ("attention", "indexer", "loss"):
        return "F"
    if node.kind == "embedding":
        return "vocab_sp" if sp else "vocab"
    if node.kind == "experts":
        return "seq"
    if node.kind == "matmul" and node.role != "none":
        return ("col" if node.role == "column" else "row") + ("_sp" if sp else "")
    if node.kind == "matmul":
        return "seq" if sp else "R"
    return "S" if sp else "R"


def _solve_layer(model: ModelSpec, mesh: LogicalMesh, req: IntraOpRequest) -> IntraOpResult:
    lp = build_layer_problem(model, mesh, req)
    pruned = prune_dominated(lp.problem)
    sol = solve_ilp(pruned.problem, time_limit_s=req.time_limit_s)
    limit = req.memory_limit_bytes
    if sol.status == "infeasible":
        floor = sum(float(x.min()) for x in lp.problem.node_mem)
        raise InfeasibleError(
            f"{req.kind} layer on {mesh.label} ({req.target}) does not fit {limit / 2**30:.2f} GiB per device",
            hint=f"the leanest strategies need at least {floor / 2**30:.2f} GiB", closest=floor)
    status: Literal["optimal", "feasible", "fallback"]
    if sol.choice is not None:
        choice, status = pruned.lift(sol.choice), sol.status  # type: ignore[assignment]
    else:
        fb = _megatron_fallback(lp)
        if fb is None:
            raise InfeasibleError(f"intra-op solver hit its {req.time_limit_s} s limit on {req.kind}/{mesh.label} "
                                  "and no uniform Megatron pattern fits")
        choice, status = fb, "fallback"
    return _result(lp, req, mesh, choice, status, sol, pruned)


def _result(lp: LayerProblem, req: IntraOpRequest, mesh: LogicalMesh, choice: tuple[int, ...], status: Literal[
        "optimal", "feasible", "fallback"], sol: IlpSolution, pruned: Pruned) -> IntraOpResult:
    chosen = [ss[i] for ss, i in zip(lp.strategies, choice)]
    reshards = []
    for (u, v, tu, tv, a_l, b_l, times), e in zip(lp.edges, lp.problem.edges):
        a, b = e.u_class[choice[u]], e.v_class[choice[v]]
        if times[a, b] > 0:
            reshards.append(EdgeReshard(lp.nodes[u].name, lp.nodes[v].name, tu, a_l[a], b_l[b], times[a, b]))
    obj, _ = lp.problem.evaluate(choice)
    return IntraOpResult(
        request=req, mesh_label=mesh.label, status=status,
        choices=tuple(NodeChoice(n.name, tuple(op.name for op in n.ops), s) for n, s in zip(lp.nodes, chosen)),
        reshards=tuple(reshards), objective_s=obj,
        compute_s=sum(s.compute_s for s in chosen), exposed_comm_s=sum(s.exposed_s for s in chosen),
        reshard_s=sum(r.time_s for r in reshards), activation_bytes=sum(s.activation_bytes for s in chosen),
        solve_time_s=sol.solve_time_s, num_variables=sol.num_variables, solver_method=sol.method,
        strategies_generated=sum(len(ss) for ss in lp.strategies),
        strategies_after_pruning=sum(k.size for k in pruned.kept),
    )
