"""Device work the host can run ahead over between MoE layers whose experts it issues (``ep_comm.host_bound_s``).

A dropless dispatcher blocks the host once per MoE layer, in the forward only (``moe.DISPATCHER_HOST_SYNC``). Nothing
blocks it in the backward: the dispatch / combine backwards reuse the forward's sizes (HybridEP: the saved handle,
``HybridEPDispatch.backward`` / ``HybridEPCombine.backward`` in fused_a2a.py @ core_v0.18.0; alltoall: the saved
splits), TE's ``_GroupedLinear.backward`` its saved ``m_splits`` (a host list), and no other module of a layer waits
on the device. So a backward queues each non-MoE layer's device work (a hybrid stack's Mamba-2 / attention layers,
a dense layer between MoE layers) ahead of the next MoE layer in backward order — the one before it in forward
order — and that layer's backward issue runs beside it: the host's excess over the MoE layer's own backward is
covered by it too. The forward gets no such cover (the next MoE layer's sync drains whatever the host queued).
Where no sync drains the device (drop-and-pad; or the A2A overlap, whose one sync waits on the forward's attention
node while the other micro-batch's backward experts stay queued: ``a2a_overlap.queued_at_host_sync``), the host runs
ahead in both passes: the forward of the non-MoE layers before the MoE layer covers it as well.

Transformer stacks whose decoder layers are all MoE layers (or whose dense layers come first: DeepSeek's, Kimi's)
get no cover: a dense-first layer runs after every MoE layer in the backward. Only layers a CUDA graph holds count
(``host_light_kinds``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cost_models.layer_cost import LayerCost
from cost_models.opgraph import MOE_KINDS
from cost_models.targets.common import Runtime

# The CUDA graph scope that captures a non-MoE layer kind whole (Megatron-Core CudaGraphScope, enums.py @
# core_v0.16.1; "mamba" a hybrid stack's Mamba layer, "attn" its attention layer, "mlp" its MLP layer; a transformer
# layer needs both of its parts). A Gated DeltaNet layer (gdn_dense) is a TransformerLayer whose self_attention is the
# GatedDeltaNet module (experimental_attention_variant_module_specs.py:56-73 and 246-255 @ core_v0.16.1; the same in
# core_v0.19.0's hybrid gdn_layer, hybrid_layer_specs.py:105-117): the attn scope graphs it as it does attention
# (cuda_graphs.py:1648-1654 _layer_is_graphable, transformer_layer.py:979-980 _te_cuda_graph_capture run the
# self_attention whatever its module), the mlp scope its dense MLP (cuda_graphs.py:1662-1664); an empty scope (local
# or transformer_engine) or full_iteration (local) graphs the whole layer. No Megatron check refuses a graphed GDN
# layer (transformer_config.py:1716-1830 @ core_v0.16.1 names no attention variant).
GRAPH_SCOPES_OF_KIND: dict[str, tuple[str, ...]] = {"mamba": ("mamba",), "attention": ("attn",), "mlp": ("mlp",),
                                                    "dense": ("attn", "mlp"), "gdn_dense": ("attn", "mlp")}


def host_light_kinds(rt: Runtime | None) -> frozenset[str]:
    """The non-MoE layer kinds whose work the host issues as one CUDA graph replay (``rt``'s graph scope; an empty
    scope graphs every whole layer, ``full_iteration`` the whole step): only these count as cover. An eagerly issued
    layer's own host issue is not priced, so what it leaves to cover is unknown: none is counted."""
    if rt is None or rt.cuda_graph_impl == "none":
        return frozenset()
    scope = set(rt.cuda_graph_scope)
    if not scope or "full_iteration" in scope:
        return frozenset(GRAPH_SCOPES_OF_KIND)
    return frozenset(k for k, need in GRAPH_SCOPES_OF_KIND.items() if scope.issuperset(need))


def backward_device_s(lc: LayerCost) -> float:
    """A layer's device work in the backward (one micro-batch): its backward, the recompute run there, half its
    TP / CP collectives (as ``layer_cost`` splits them for ``forward_share``)."""
    return lc.backward_s + lc.recompute_s + (lc.tp_s + lc.cp_exposed_s) / 2


def forward_device_s(lc: LayerCost) -> float:
    """A layer's device work in the forward (one micro-batch): its forward and half its TP / CP collectives."""
    return lc.forward_s + (lc.tp_s + lc.cp_exposed_s) / 2


def moe_host_cover_s(layers: Sequence[tuple[int, str, LayerCost]], synced: bool,
                     light: frozenset[str]) -> list[float]:
    """Per entry of ``layers`` (layer id, kind, cost; forward order, one pipeline rank): the device work of the
    non-MoE layers queued ahead of it that the host's issue of an MoE layer runs beside — in the backward, the
    non-MoE layers after it up to the next MoE layer; without a per-layer sync (``synced`` False) also, in the
    forward, those before it back to the previous MoE layer. 0 for non-MoE entries. A run stops at a layer whose
    kind is not in ``light`` (``host_light_kinds``) and where the layer ids are not consecutive (an interleaved
    schedule's chunk boundary: other micro-batches run between)."""
    out = [0.0] * len(layers)
    for run in cover_runs(layers, synced, light):
        out[run.at] = run.cover_s()
    return out


@dataclass(frozen=True)
class CoverRun:
    """One MoE entry's cover (``moe_host_cover_s``) as a function of where a rank's contiguous share of the entries
    starts and ends: ``after[t]`` is the backward work of the first ``t`` run layers after it, ``before[t]`` the
    forward work of the ``t`` run layers before it (nearest first; ``(0.0,)`` where ``synced``)."""

    at: int
    after: tuple[float, ...]
    before: tuple[float, ...]

    def cover_s(self, start: int = 0, end: int | None = None) -> float:
        """The cover on a rank holding entries ``start ≤ at < end`` only (``end`` None: to the last): its runs
        stop at the rank's edges, as ``moe_host_cover_s`` on ``layers[start:end]`` stops them."""
        n_after = len(self.after) - 1 if end is None else min(len(self.after) - 1, end - self.at - 1)
        return self.after[n_after] + self.before[min(len(self.before) - 1, self.at - start)]


def cover_runs(layers: Sequence[tuple[int, str, LayerCost]], synced: bool, light: frozenset[str]) -> list[CoverRun]:
    """Per MoE entry of ``layers`` (``moe_host_cover_s``'s arguments), its ``CoverRun``: the running sums of the
    run of ``light`` layers with consecutive ids after it (``backward_device_s``) and, unless ``synced``, before it
    (``forward_device_s``)."""
    out = []
    for j, (i, kind, _) in enumerate(layers):
        if kind not in MOE_KINDS:
            continue
        out.append(CoverRun(j, _run(layers, j, 1, light, backward_device_s),
                            (0.0,) if synced else _run(layers, j, -1, light, forward_device_s)))
    return out


def _run(layers: Sequence[tuple[int, str, LayerCost]], j: int, step: int, light: frozenset[str],
         work: Callable[[LayerCost], float]) -> tuple[float, ...]:
    """Running sums of ``work`` over the entries next to ``j`` in direction ``step`` while their kind is in
    ``light`` and their ids stay consecutive (0 first)."""
    sums, prev, k = [0.0], layers[j][0], j + step
    while 0 <= k < len(layers):
        i_k, kind_k, lc_k = layers[k]
        if kind_k not in light or i_k != prev + step:
            break
        sums.append(sums[-1] + work(lc_k))
        prev, k = i_k, k + step
    return tuple(sums)


def range_wait_table(runs: Sequence[CoverRun], n: int, wait: Callable[[float], float]) -> np.ndarray:
    """``T[i, j]`` (``0 ≤ i < j ≤ n``): Σ over the MoE entries of ``layers[i:j]``
    (``runs = cover_runs(layers, …)``, ``n = len(layers)``) of ``wait`` at the cover a rank holding just those entries gives it (``CoverRun.cover_s``)
    less ``wait`` at the cover of the whole sequence: what a contiguous pipeline stage's own edges add to the
    whole stack's waits. ``wait``: an MoE layer's host wait given its cover (``ep_comm.host_wait_s``). Only an MoE
    entry whose run an edge cuts adds anything: its first ``len(before) − 1`` starts and ``len(after) − 1`` ends."""
    table = np.zeros((n + 1, n + 1))
    for run in runs:
        k, n_after, n_before = run.at, len(run.after) - 1, len(run.before) - 1
        full = wait(run.cover_s())
        # starts: each cut one (i > k − n_before), then every uncut one at once; likewise the ends
        starts = [(i, i + 1) for i in range(k - n_before + 1, k + 1)] + [(0, k - n_before + 1)]
        ends = [(j, j + 1) for j in range(k + 1, k + n_after + 1)] + [(k + n_after + 1, n + 1)]
        for i0, i1 in starts:
            for j0, j1 in ends:
                if i0 < i1 and j0 < j1:
                    table[i0:i1, j0:j1] += wait(run.cover_s(i0, j0)) - full
    return table


def consecutive_ranges(ids: Sequence[int]) -> list[tuple[int, int]]:
    """The maximal ranges ``[a, b)`` of consecutive layer ids in ``ids`` (one pipeline rank's, forward order): where
    ``moe_host_cover_s`` stops a run besides a layer kind (an interleaved rank's chunks, with other micro-batches run
    between them). One range for a contiguous stage."""
    out: list[tuple[int, int]] = []
    for i in ids:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def rank_wait_delta_s(table: np.ndarray, ids: Sequence[int]) -> float:
    """What one rank's own edges add to its MoE layers' host waits, from ``range_wait_table``: Σ over its
    ``consecutive_ranges`` of ``table[a, b]`` — a contiguous stage's entry, or an interleaved rank's chunks'."""
    return float(sum(table[a, b] for a, b in consecutive_ranges(ids)))

