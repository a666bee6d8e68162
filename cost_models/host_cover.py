"""Device work the host can run ahead over between MoE layers whose experts it issues (``ep_comm.host_bound_s``).

A dropless dispatcher blocks the host once per MoE layer, in the forward only (``moe.DISPATCHER_HOST_SYNC``). Nothing
blocks it in the backward: the dispatch / combine backwards reuse the forward's sizes (HybridEP: the saved handle,
``HybridEPDispatch.backward`` / ``HybridEPCombine.backward`` in fused_a2a.py @ core_v0.18.0; alltoall: the saved
splits), TE's ``_GroupedLinear.backward`` its saved ``m_splits`` (a host list), and no other module of a layer waits
on the device. So a backward queues each non-MoE layer's device work (a hybrid stack's Mamba-2 / attention layers,
a dense layer between MoE layers) ahead of the next MoE layer in backward order — the one before it in forward
order — and that layer's backward issue runs beside it: the host's excess over the MoE layer's own backward is
covered by it too. The forward gets no such cover (the next MoE layer's sync drains whatever the host queued).
Where no sync exists at all (drop-and-pad, or the A2A overlap's dispatchers that do not drain), the host runs ahead
in both passes: the forward of the non-MoE layers before the MoE layer covers it as well.

Transformer stacks whose decoder layers are all MoE layers (or whose dense layers come first: DeepSeek's, Kimi's)
get no cover: a dense-first layer runs after every MoE layer in the backward. Only layers a CUDA graph holds count
(``host_light_kinds``)."""

from __future__ import annotations

from collections.abc import Sequence

from cost_models.layer_cost import LayerCost
from cost_models.targets.common import Runtime

# The CUDA graph scope that captures a non-MoE layer kind whole (Megatron-Core CudaGraphScope, enums.py @
# core_v0.16.1; "mamba" a hybrid stack's Mamba layer, "attn" its attention layer, "mlp" its MLP layer; a transformer
# layer needs both of its parts).
GRAPH_SCOPES_OF_KIND: dict[str, tuple[str, ...]] = {"mamba": ("mamba",), "attention": ("attn",), "mlp": ("mlp",),
                                                    "dense": ("attn", "mlp")}


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
    n = len(layers)
    out = [0.0] * n
    for j, (i, kind, _) in enumerate(layers):
        if kind != "moe":
            continue
        cover, prev = 0.0, i
        for k in range(j + 1, n):
            i_k, kind_k, lc_k = layers[k]
            if kind_k not in light or i_k != prev + 1:
                break
            cover, prev = cover + backward_device_s(lc_k), i_k
        if not synced:
            prev = i
            for k in range(j - 1, -1, -1):
                i_k, kind_k, lc_k = layers[k]
                if kind_k not in light or i_k != prev - 1:
                    break
                cover, prev = cover + forward_device_s(lc_k), i_k
        out[j] = cover
    return out
