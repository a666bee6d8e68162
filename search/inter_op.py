"""Inter-op pass: split the layers into pipeline stages (Alpa stage construction, Zheng et al. OSDI'22 §5).

Problem. Layers ``0..L-1`` (embedding and head folded into the first and last layer ranges by the driver)
are cut into contiguous stages; stage ``[i, j)`` placed on submesh kind ``k`` costs ``c[i, j, k]`` seconds per
micro-batch (the intra-op cost) and ``n_k`` device units. With ``m`` micro-batches the pipeline takes (Alpa
eq. 2, generalised to the schedules of ``cost_models.pipeline``)::

    T = α · Σ_i t_i + (m − α) · max_i t_i          α = 1 (1F1B, GPipe), 1/v (interleaved), 1/3 (ZB-H1)

and every stage must hold its in-flight micro-batches: ``static + act · inflight[s] ≤ M`` where ``s`` is
the number of stages from this one to the end (1F1B: stage ``p − s`` keeps ``min(s, m)`` micro-batches).

Algorithm (the kernel, ``stage_dp``). For a fixed bound ``t_max`` on every stage,

    F[s, i, d] = min over edges e = ([i, j), k) with c_e ≤ t_max and memory ok at s of
                 c_e + F[s − 1, j, d − n_k]                      F[0, L, 0] = 0, else +∞

is the least ``Σ t`` covering layers ``i..L−1`` with ``s`` stages on ``d`` device units. Table indexing:
``F[s, i, d]`` — ``s`` stages (0..S), ``i`` the first layer covered (0..L), ``d`` device units used (0..D).
Then ``T*(t_max) = α·F[S, 0, D] + (m − α)·t_max`` and the optimum is the least ``T*`` over ``t_max`` in the
sorted distinct stage costs. Alpa's early break: once ``m · t_max ≥ best`` no larger ``t_max`` can win
(``T ≥ m·max t`` because ``Σ t ≥ max t``). The first ``t_max`` worth trying is the bottleneck optimum (the
least achievable max stage cost), found by one min-max pass of the same recursion, so the infeasible
prefix of the sorted costs is skipped instead of scanned.

The table is an *edge list* (start, end, kind, cost, memory) rather than a dense ``L × L × K`` array:
the driver of ``search.planner`` only offers the ranges Megatron can express (``[first, q × (p−2), last]``
layers) so each ``F[s]`` costs ``O(edges)``; the differential tests offer every range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

INF = np.inf


@dataclass(frozen=True)
class StageEdges:
    """Candidate stages as parallel arrays (one entry per allowed (layer range, submesh kind))."""

    start: np.ndarray  # (E,) int: first layer of the stage
    end: np.ndarray  # (E,) int: one past its last layer
    cost: np.ndarray  # (E,) float: seconds per micro-batch
    static_mem: np.ndarray  # (E,) float: bytes independent of the micro-batches in flight
    act_mem: np.ndarray  # (E,) float: bytes per micro-batch in flight
    devices: np.ndarray  # (E,) int: device units of the submesh (0 when every stage uses the same one)


@dataclass(frozen=True)
class StageSolution:
    objective: float  # α·Σ t + (m − α)·max t
    stages: tuple[tuple[int, int, int], ...]  # (start, end, edge index) in pipeline order
    stage_costs: tuple[float, ...]
    t_max: float


def _layer_dp(edges: StageEdges, ok: np.ndarray, n_layers: int, n_stages: int, total_devices: int,
              inflight: np.ndarray, mem_limit: float, combine: str) -> np.ndarray:
    """Fill ``F[s, i, d]`` (module docstring). ``combine='sum'`` gives Σ t; ``'max'`` the bottleneck."""
    L, S, D = n_layers, n_stages, total_devices
    F = np.full((S + 1, L + 1, D + 1), INF)
    F[0, L, 0] = 0.0
    d_idx = np.arange(D + 1)
    for s in range(1, S + 1):
        sel = ok & (edges.static_mem + edges.act_mem * inflight[s] <= mem_limit)
        if not sel.any():
            continue
        e_start, e_end, e_cost, e_dev = edges.start[sel], edges.end[sel], edges.cost[sel], edges.devices[sel]
        prev_d = d_idx[None, :] - e_dev[:, None]  # (E, D+1)
        valid = prev_d >= 0
        prev = np.where(valid, F[s - 1, e_end[:, None], np.clip(prev_d, 0, D)], INF)
        val = prev + e_cost[:, None] if combine == "sum" else np.maximum(prev, e_cost[:, None])
        np.minimum.at(F[s], e_start, val)
    return F


def stage_dp(edges: StageEdges, *, n_layers: int, n_microbatches: int, inflight: Sequence[float],
             mem_limit: float = INF, n_stages: int | None = None, max_stages: int | None = None,
             total_devices: int = 0, alpha: float = 1.0) -> StageSolution | None:
    """Minimise ``α·Σ t + (m − α)·max t`` over contiguous stage splits (module docstring).

    ``n_stages`` fixes the stage count (Megatron: ``pp``); otherwise any count up to ``max_stages``.
    ``inflight[s]`` is the micro-batches held by a stage with ``s`` stages left (index 0 unused).
    ``total_devices`` units must be used exactly (0 when submeshes are implicit). ``None`` if no split fits.
    Ties between equal objectives go to the lowest ``t_max`` and then the lowest edge index per stage."""
    m, L, D = n_microbatches, n_layers, total_devices
    S = n_stages if n_stages is not None else (max_stages or L)
    infl = np.asarray(inflight, dtype=float)
    assert infl.size >= S + 1 and alpha > 0 and m >= alpha
    all_ok = np.ones(edges.cost.size, dtype=bool)

    def answer(F: np.ndarray) -> tuple[float, int]:
        if n_stages is not None:
            return float(F[S, 0, D]), S
        col = F[1:, 0, D]
        s = int(np.argmin(col))  # fewest stages among ties
        return float(col[s]), s + 1

    bottleneck, _ = answer(_layer_dp(edges, all_ok, L, S, D, infl, mem_limit, "max"))
    if not np.isfinite(bottleneck):
        return None
    t_values = np.sort(edges.cost[edges.cost >= bottleneck])
    t_values = t_values[np.concatenate([[True], t_values[1:] != t_values[:-1]])]  # distinct (np.unique imports numpy.ma)
    best = (INF, -1.0, 0, None)  # (objective, t_max, stages, F)
    for t_max in t_values:
        if m * t_max >= best[0]:
            break  # Alpa's early break
        F = _layer_dp(edges, edges.cost <= t_max, L, S, D, infl, mem_limit, "sum")
        total, s_used = answer(F)
        obj = alpha * total + (m - alpha) * t_max
        if obj < best[0]:
            best = (obj, float(t_max), s_used, F)
    obj, t_max, s_used, F = best
    assert F is not None
    return _reconstruct(edges, F, t_max, s_used, L, D, infl, mem_limit, alpha, m)


def _reconstruct(edges: StageEdges, F: np.ndarray, t_max: float, S: int, L: int, D: int, inflight: np.ndarray,
                 mem_limit: float, alpha: float, m: int) -> StageSolution:
    stages: list[tuple[int, int, int]] = []
    i, d = 0, D
    for s in range(S, 0, -1):
        target = F[s, i, d]
        cand = np.flatnonzero((edges.start == i) & (edges.cost <= t_max) & (edges.devices <= d)
                              & (edges.static_mem + edges.act_mem * inflight[s] <= mem_limit))
        vals = edges.cost[cand] + F[s - 1, edges.end[cand], d - edges.devices[cand]]
        hit = cand[np.isclose(vals, target, rtol=1e-12, atol=0.0)]
        assert hit.size, "DP reconstruction lost its path"
        e = int(hit[0])
        stages.append((i, int(edges.end[e]), e))
        i, d = int(edges.end[e]), d - int(edges.devices[e])
    assert i == L and d == 0
    costs = tuple(float(edges.cost[e]) for _, _, e in stages)
    obj = alpha * sum(costs) + (m - alpha) * max(costs)
    return StageSolution(obj, tuple(stages), costs, max(costs))


def brute_force(edges: StageEdges, *, n_layers: int, n_microbatches: int, inflight: Sequence[float],
                mem_limit: float = INF, n_stages: int | None = None, max_stages: int | None = None,
                total_devices: int = 0, alpha: float = 1.0) -> float:
    """Reference for the tests: the same objective by enumerating every path of edges (small inputs only)."""
    S = n_stages if n_stages is not None else (max_stages or n_layers)
    by_start: dict[int, list[int]] = {}
    for e in range(edges.cost.size):
        by_start.setdefault(int(edges.start[e]), []).append(e)
    best = INF

    def walk(i: int, path: list[int], d: int) -> None:
        nonlocal best
        if i == n_layers:
            k = len(path)
            if d != total_devices or (n_stages is not None and k != n_stages):
                return
            for pos, e in enumerate(path):
                if edges.static_mem[e] + edges.act_mem[e] * inflight[k - pos] > mem_limit:
                    return
            costs = [float(edges.cost[e]) for e in path]
            best = min(best, alpha * sum(costs) + (n_microbatches - alpha) * max(costs))
            return
        if len(path) >= S:
            return
        for e in by_start.get(i, []):
            walk(int(edges.end[e]), path + [e], d + int(edges.devices[e]))

    walk(0, [], 0)
    return best


# ==== driver: Megatron-expressible splits for one homogeneous pipeline ================================
@dataclass(frozen=True)
class StageTimes:
    """The timed part of ``StageTables`` (the same fields): what ``range_costs`` reads, for a split's time alone."""

    time: np.ndarray
    last_time: float
    first_time: float = 0.0
    range_time: np.ndarray | None = None


@dataclass(frozen=True)
class StageTables:
    """Per-layer prefix sums the driver builds edges from (all per rank, per micro-batch where timed).

    ``time[i]`` = Σ of layer times before layer ``i`` (length L+1); likewise the memory arrays.
    ``first_*`` / ``last_*`` are the extras of the stage holding the embedding / the head."""

    time: np.ndarray
    static: np.ndarray
    act: np.ndarray
    last_time: float
    first_static: float
    last_static: float
    last_act: float
    stage_static: float = 0.0  # bytes every stage holds once (CUDA context, buffers, the recompute peak)
    range_static: np.ndarray | None = None  # (L+1, L+1) non-additive bytes of range [i, j) (ZeRO-3 buffers)
    range_time: np.ndarray | None = None  # (L+1, L+1) non-additive seconds of range [i, j) (MoE host cover cut at
    #                                       the stage's edges: search.score.Scorer.cover_table)
    range_peak: np.ndarray | None = None  # (L+1, L+1) bytes a stage of range [i, j) holds once, one layer at a time (a
    #                                       block-wide selective recompute's re-run: Scorer.block_transient_table)
    first_time: float = 0.0  # seconds per micro-batch the stage holding the embedding adds (its gradient accumulation)


def range_static_bytes(tables: StageTables, start: np.ndarray, end: np.ndarray) -> np.ndarray | float:
    """Non-additive bytes of the stages ``[start, end)``: ``range_static`` + ``range_peak`` (0 without either)."""
    out: np.ndarray | float = 0.0
    if tables.range_static is not None:
        out = out + tables.range_static[start, end]
    if tables.range_peak is not None:
        out = out + tables.range_peak[start, end]
    return out


def range_costs(tables: StageTables | StageTimes, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Seconds per micro-batch of the stages ``[start, end)`` (arrays of any shape): the layers' prefix sums, the
    head on the stage that ends at L, ``first_time`` on the one that starts at 0, and ``range_time``. The one stage
    cost the DP, its scan and the Scorer read."""
    L = tables.time.size - 1
    cost = tables.time[end] - tables.time[start] + np.where(end == L, tables.last_time, 0.0)
    if tables.first_time:
        cost = cost + np.where(start == 0, tables.first_time, 0.0)
    if tables.range_time is not None:
        cost = cost + tables.range_time[start, end]
    return cost


def stage_costs(tables: StageTables, layers: Sequence[int]) -> np.ndarray:
    """``range_costs`` of the split with ``layers`` decoder layers per stage, in pipeline order."""
    bounds = np.concatenate([[0], np.cumsum(layers)]).astype(np.int64)
    return range_costs(tables, bounds[:-1], bounds[1:])


def chunked_costs(tables: StageTables | StageTimes, ranges: Sequence[Sequence[tuple[int, int]]]) -> np.ndarray:
    """``range_costs`` summed over each rank's layer ranges ``[a, b)`` (``host_cover.consecutive_ranges`` of its
    ids): an interleaved rank's chunks, priced as ``estimate`` sums them, where ``stage_costs`` would read one
    contiguous range of the rank's layer count (equal only where every layer costs the same)."""
    return np.array(split_chunk_costs(tables, flat_chunks([ranges]))[0])


FlatChunks = tuple[np.ndarray, np.ndarray, list[list[int]]]  # (starts, ends, per split the chunks of each rank)


def flat_chunks(splits: Sequence[Sequence[Sequence[tuple[int, int]]]]) -> FlatChunks:
    """Every chunk ``[a, b)`` of every rank of several splits (each a rank's ranges, as ``chunked_costs`` takes), in
    one pair of index arrays, with the number of chunks of each rank: ``split_chunk_costs``' input."""
    flat = [ab for ranks in splits for r in ranks for ab in r]
    return (np.array([a for a, _ in flat], dtype=np.int64), np.array([b for _, b in flat], dtype=np.int64),
            [[len(r) for r in ranks] for ranks in splits])


def split_chunk_costs(tables: StageTables | StageTimes, flat: FlatChunks) -> list[list[float]]:
    """``chunked_costs`` of each split of ``flat`` (its ranks' seconds), by one vectorized ``range_costs``: each
    rank's chunks summed in order, as one call per chunk would."""
    starts, ends, sizes = flat
    each = range_costs(tables, starts, ends).tolist() if starts.size else []
    out, i = [], 0
    for ranks in sizes:
        costs = []
        for n in ranks:
            costs.append(float(sum(each[i:i + n])))
            i += n
        out.append(costs)
    return out


def megatron_edges(tables: StageTables, n_stages: int, mid_layers: int) -> StageEdges:
    """Edges for splits ``[first, mid_layers × (p − 2), last]`` with ``first, last ≥ 1`` (what
    ``ParallelConfig.first_stage_layers/last_stage_layers`` can say). ``p ≤ 2`` ignores ``mid_layers``."""
    L = tables.time.size - 1
    p = n_stages
    starts: list[int] = []
    ends: list[int] = []
    if p == 1:
        starts, ends = [0], [L]
    else:
        q = mid_layers if p > 2 else 0
        span = L - (p - 2) * q  # layers left for the first and last stages
        for f in range(1, span):
            starts.append(0)
            ends.append(f)  # first stage
            starts.append(f + (p - 2) * q)
            ends.append(L)  # the matching last stage
            for k in range(p - 2):
                starts.append(f + k * q)
                ends.append(f + (k + 1) * q)
    pairs = sorted(set(zip(starts, ends)))
    st = np.array([a for a, _ in pairs], dtype=np.int64)
    en = np.array([b for _, b in pairs], dtype=np.int64)
    is_first, is_last = st == 0, en == L
    cost = range_costs(tables, st, en)
    static = (tables.static[en] - tables.static[st] + np.where(is_first, tables.first_static, 0.0)
              + np.where(is_last, tables.last_static + tables.last_act, 0.0) + tables.stage_static)
    static = static + range_static_bytes(tables, st, en)
    act = tables.act[en] - tables.act[st]  # the head's activations (last_act) are held once: in static
    return StageEdges(st, en, cost, static, act, np.zeros(st.size, dtype=np.int64))


def mid_layer_choices(n_layers: int, n_stages: int) -> list[int]:
    """Every middle-stage size that leaves ≥ 1 layer for both the first and the last stage."""
    if n_stages <= 2:
        return [0]
    return list(range(1, (n_layers - 2) // (n_stages - 2) + 1))


SplitSolver = Callable[..., "tuple[list[int], float] | None"]


class _Paths:
    """Every Megatron path ``[f, q × (p − 2), L − f − (p − 2)·q]`` for a list of middle sizes q, one array
    row per (q, f) (grouped by q, f ascending), with the DP's choice per q (``megatron_scan``'s docstring)."""

    def __init__(self, tables: StageTables, p: int, qs: Sequence[int], m: int, inflight: Sequence[float],
                 mem_limit: float, alpha: float):
        time = tables.time
        L = time.size - 1
        self.p, self.m, self.alpha = p, m, alpha
        if p == 1:
            n_f = np.ones(len(qs), dtype=np.int64)
            bounds = np.tile(np.array([0, L], dtype=np.int64), (len(qs), 1))
        else:
            qv = np.asarray(qs, dtype=np.int64) if p > 2 else np.zeros(len(qs), dtype=np.int64)
            n_f = np.maximum(L - (p - 2) * qv - 1, 0)  # f = 1 … L − (p − 2)·q − 1
            starts = np.cumsum(n_f) - n_f
            f = np.arange(int(n_f.sum()), dtype=np.int64) - np.repeat(starts, n_f) + 1
            bounds = np.empty((f.size, p + 1), dtype=np.int64)
            bounds[:, 0] = 0
            bounds[:, 1:p] = f[:, None] + np.repeat(qv, n_f)[:, None] * np.arange(p - 1)
            bounds[:, p] = L
        self.n_f, self.bounds = n_f, bounds
        self.pick = np.full(len(qs), -1, dtype=np.int64)
        if not bounds.shape[0]:
            return
        st, en = bounds[:, :-1], bounds[:, 1:]
        cost = range_costs(tables, st, en)  # the edges' costs, by the same float operations
        static = tables.static[en] - tables.static[st]
        static[:, 0] += tables.first_static
        static[:, -1] += tables.last_static + tables.last_act  # the head's activations: held once
        static += tables.stage_static
        static = static + range_static_bytes(tables, st, en)
        act = tables.act[en] - tables.act[st]
        infl = np.asarray(inflight, dtype=float)[p - np.arange(p)]  # stage k has p − k stages left
        ok = (static + act * infl <= mem_limit).all(axis=1)
        self.cost = cost
        if not ok.any():
            return
        total = cost[:, p - 1].copy()
        for k in range(p - 2, -1, -1):
            total = total + cost[:, k]  # the DP's order: F[s] = c + F[s − 1]
        t_max = cost.max(axis=1)
        obj = alpha * total + (m - alpha) * t_max
        # Per group (q), reductions over its rows: least objective, least t_max reaching it, least sum under it,
        # then the first row whose sum is within 1e-12 of that (np.isclose(total, F, rtol=1e-12, atol=0)).
        has = n_f > 0
        starts = (np.cumsum(n_f) - n_f)[has]
        gid = np.repeat(np.arange(has.sum()), n_f[has])

        def group_min(x: np.ndarray) -> np.ndarray:
            return np.minimum.reduceat(x, starts)

        best = group_min(np.where(ok, obj, INF))
        t_star = group_min(np.where(ok & (obj == best[gid]), t_max, INF))
        under = ok & (t_max <= t_star[gid])
        f_sum = group_min(np.where(under, total, INF))[gid]
        close = under & (np.abs(total - f_sum) <= 1e-12 * np.abs(f_sum))
        R = bounds.shape[0]
        first = group_min(np.where(close, np.arange(R), R))
        self.pick[np.flatnonzero(has)] = np.where(np.isfinite(best), first, -1)

    def answer(self, g: int) -> tuple[list[int], float] | None:
        """(layers per stage, objective) of group ``g``'s choice, as ``stage_dp`` reports it; None if none fits."""
        row = int(self.pick[g])
        if row < 0:
            return None
        costs = self.cost[row].tolist()
        return np.diff(self.bounds[row]).tolist(), self.alpha * sum(costs) + (self.m - self.alpha) * max(costs)


def megatron_scan(tables: StageTables, n_stages: int, mid_layers: int, *, n_microbatches: int,
                  inflight: Sequence[float], mem_limit: float, alpha: float) -> tuple[list[int], float] | None:
    """``stage_dp`` over ``megatron_edges(tables, n_stages, mid_layers)``, answered by scanning its paths.

    With fixed ``p`` and ``q`` a path is ``[f, q × (p − 2), L − f − (p − 2)·q]``: the first stage's size ``f``
    fixes it (a stage not starting at 0 nor ending at L spans q layers, and exactly p must cover L). So one
    array row per ``f`` holds the same edge costs and memory the DP reads (same float operations), the sum
    in the DP's order (F[s] = c + F[s − 1]: last stage first), and the DP's choice follows from its rules:
    the least objective, reached first at the least t_max (the smallest max stage cost among the optimal
    paths), then reconstructed at that t_max as the lowest edge index whose sum is within 1e-12 of F — the
    smallest f. Returns what ``stage_dp`` returns, as (layers per stage, objective); None when nothing fits.
    tests/test_inter_op.py holds it equal to the DP on tables with ties."""
    return _Paths(tables, n_stages, [mid_layers], n_microbatches, inflight, mem_limit, alpha).answer(0)


def megatron_dp(tables: StageTables, n_stages: int, mid_layers: int, *, n_microbatches: int,
                inflight: Sequence[float], mem_limit: float, alpha: float) -> tuple[list[int], float] | None:
    """The same answer from the general ``stage_dp`` (the reference ``megatron_scan`` is tested against)."""
    sol = stage_dp(megatron_edges(tables, n_stages, mid_layers), n_layers=tables.time.size - 1,
                   n_microbatches=n_microbatches, inflight=inflight, mem_limit=mem_limit, n_stages=n_stages,
                   alpha=alpha)
    return None if sol is None else ([b - a for a, b, _ in sol.stages], sol.objective)


def best_split(tables: StageTables, *, n_stages: int, n_microbatches: int, inflight: Sequence[float],
               mem_limit: float, alpha: float, solver: SplitSolver | None = None) -> tuple[list[int], float] | None:
    """The Megatron-expressible split minimising the pipeline time under the memory limit:
    (layers per stage, objective). Middle sizes are tried in order of a lower bound and cut once the
    bound reaches the best found (each middle stage costs ≥ q · cheapest layer; ``range_time`` ≥ 0 only adds).
    Every middle size's paths are scanned in one pass (``megatron_scan``'s answer per size); ``solver`` answers
    one size at a time instead (``megatron_scan`` or ``megatron_dp``, the same answers from the stage DP, for
    the tests)."""
    L = tables.time.size - 1
    m = n_microbatches
    per_layer = np.diff(tables.time)
    c_min = float(per_layer.min()) if per_layer.size else 0.0
    total = float(tables.time[-1]) + tables.last_time + tables.first_time
    p = n_stages

    def bound(q: int) -> float:
        t_lb = max(total / p, q * c_min if p > 2 else 0.0, (L - (p - 2) * q) * c_min / 2 if p > 1 else total)
        return alpha * total + (m - alpha) * t_lb

    qs = mid_layer_choices(L, p)
    paths = None if solver is not None else _Paths(tables, p, qs, m, inflight, mem_limit, alpha)
    best: tuple[list[int], float] | None = None
    for g in sorted(range(len(qs)), key=lambda g: (bound(qs[g]), qs[g])):
        if best is not None and bound(qs[g]) >= best[1]:
            break
        found = (paths.answer(g) if paths is not None else
                 solver(tables, p, qs[g], n_microbatches=m,  # type: ignore[misc]
                        inflight=inflight, mem_limit=mem_limit, alpha=alpha))
        if found is not None and (best is None or found[1] < best[1]):
            best = found
    return best
