"""Tensor placements on a logical mesh and the α-β cost of converting between them (resharding).

A *placement* (``Placement``; not ``search.space.Layout``, which is a point of the search space) gives, for every mesh axis (in ``LogicalMesh.axes`` order), what the axis does to an
activation tensor of shape ``[tokens, width]``:

- ``R`` replicated;  ``B`` batch dim sharded;  ``S`` sequence dim sharded;  ``E`` tokens grouped by expert
  (after an MoE dispatch);  ``F`` feature dim sharded (heads / FFN columns / vocab);
- ``K`` KV heads replicated in groups: ``t > g`` ranks hold ``g`` KV heads, ``t/g`` copies of each
  (Megatron's KV replication for ``t`` a multiple of ``g``; COST_MODEL.md §7). Only KV tensors use it.

Per axis of ``n`` ranks, with ``X`` the tensor bytes unsharded over that axis (sharded as before on the
others), a conversion ``src → dst`` costs (COST_MODEL.md §1 ring times):

- equal: 0;   ``R → sharded``: 0 (each rank slices);   ``sharded → R``: all-gather(X);
- ``sharded → differently sharded``: all-to-all(X).

Backward moves the gradient the other way (``dst → src``): a forward all-gather comes back as a slice,
a forward slice as an all-gather — the consumer's partial-sum reductions are priced inside the consumer
op (``strategies``), so gradients arrive in the consumer's layout.
"""

from __future__ import annotations

from search.mesh import LogicalMesh

Placement = tuple[str, ...]
BF16_BYTES = 2.0
SHARDED = frozenset("BSEFK")


def shard_factor(letter: str, axis_size: int, kv_heads: int) -> int:
    """How many ways one axis splits a tensor held in ``letter``."""
    if letter == "R":
        return 1
    if letter == "K":
        return min(axis_size, kv_heads)
    return axis_size


def device_bytes(tokens: float, width: int, layout: Placement, mesh: LogicalMesh, kv_heads: int) -> float:
    """Bytes of one bf16 ``[tokens, width]`` tensor held by one rank in ``layout``."""
    b = tokens * width * BF16_BYTES
    for letter, n in zip(layout, mesh.sizes):
        b /= shard_factor(letter, n, kv_heads)
    return b


def reshard_time_s(tokens: float, width: int, src: Placement, dst: Placement, mesh: LogicalMesh,
                   kv_heads: int) -> float:
    """Forward time of converting one tensor from ``src`` to ``dst`` (axis by axis, module docstring)."""
    if src == dst:
        return 0.0
    t = 0.0
    cur = list(src)
    for i, axis in enumerate(mesh.axes):
        a, b = cur[i], dst[i]
        if a == b or a == "R":
            cur[i] = b
            continue
        full = list(cur)
        full[i] = "R"
        x = device_bytes(tokens, width, tuple(full), mesh, kv_heads)
        t += mesh.collective_time_s("all_gather" if b == "R" else "all_to_all", x, axis)
        cur[i] = b
    return t


def edge_time_s(tokens: float, width: int, src: Placement, dst: Placement, mesh: LogicalMesh, kv_heads: int,
                forward_repeats: int = 1) -> float:
    """Forward (× ``forward_repeats``, 2 under full recompute) plus backward resharding of one edge."""
    fwd = reshard_time_s(tokens, width, src, dst, mesh, kv_heads)
    bwd = reshard_time_s(tokens, width, dst, src, mesh, kv_heads)
    return forward_repeats * fwd + bwd
