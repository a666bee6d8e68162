"""Logical device meshes and how their axes map onto physical links.

Vocabulary (ARCHITECTURE.md, torchtitan's ``DeviceMesh``): an *axis* is a dimension of the logical
device mesh; a *dim* is a dimension of a tensor. A strategy maps tensor dims onto mesh axes.

Axes (``MeshAxis``), outermost first:

- ``dp``  data parallel: each rank holds different sequences (batch dim).
- ``ep``  expert parallel. Dense ops treat it as a data axis; expert ops may shard experts over it. Megatron's
          MoE parallel folding (expert-TP 1) re-cuts the ``tp·cp·dp`` ranks of a stage as ``ep × edp``, so the
          EP group may span TP and CP ranks (``ep | tp·cp·dp``: ``TargetProfile.expert_ranks``); a rank's costs
          see ``ep`` peers holding their own ``1/(tp·cp)`` of a micro-batch's tokens either way (``per_rank``).
- ``cp``  context parallel: each rank holds a slice of every sequence (sequence dim); attention rings K/V.
- ``tp``  tensor (model) parallel: weights split by heads / FFN columns / vocab, or activations by sequence (SP).

Rank strides are Megatron's (``cost_models.collectives.RankStrides``, the one copy): the dense layers'
``RankGenerator`` orders ``tp-cp-dp-pp`` (tp fastest; megatron/core/parallel_state.py, ``order`` default
"tp-cp-ep-dp-pp" at line 562, ``decoder_rank_generator`` at 775), and the expert layers get their own
``RankGenerator(tp=expert_tensor_parallel_size, ep, dp=edp, cp=1)`` (lines 798–806) over the same ranks: with
expert-TP 1 the EP group is ``ep`` *consecutive* ranks (MoE parallel folding), not ranks strided by tp·cp::

    stride(tp) = 1,  stride(cp) = tp,  stride(ep) = 1,  stride(dp) = tp·cp

Worked example: 128 H100s (16 HGX nodes, NVLink domain 8), dp=16, tp=8. The tp group {0..7} has stride 1
and sits in one NVLink domain (link "nvlink", 8 ranks inside, 1 domain); the dp group {0, 8, …, 120} has
stride 8 and spans 16 domains with one rank in each (link "nic"). A tp=16 group would span 2 domains with 8
ranks in each ("nvlink+nic", hierarchical: NCCL reduces inside the domain, then across).

Collective times come from ``cost_models.collectives`` (ring α-β, hierarchical across domains,
COST_MODEL.md §1); this module only says which group each axis is.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from enum import Enum
from typing import Literal

from cost_models.collectives import (
    CollectiveKind,
    RankStrides,
    group_collective_time_s,
    link_bandwidth,
    nic_bandwidth,
    place_group,
)
from cost_models.errors import ConfigError
from cost_models.specs import ClusterSpec

LinkKind = Literal["local", "nvlink", "nic", "nvlink+nic"]


class MeshAxis(str, Enum):
    """A logical mesh axis (see the module docstring for the vocabulary)."""

    DP = "dp"
    EP = "ep"
    CP = "cp"
    TP = "tp"

    @property
    def is_data(self) -> bool:
        """Data-like for dense ops: ranks along it see different tokens and replicate the weights."""
        return self is not MeshAxis.TP


# Outermost → innermost; the innermost axis has rank stride 1 (Megatron order tp-cp-ep-dp).
AXIS_ORDER: tuple[MeshAxis, ...] = (MeshAxis.DP, MeshAxis.EP, MeshAxis.CP, MeshAxis.TP)


@dataclass(frozen=True)
class AxisLink:
    """The physical link(s) one axis' communication group crosses, with α-β per level.

    ``n_inner`` ranks of the group share an NVLink domain; the group spans ``n_outer`` domains.
    α is per ring step (s), β per byte (s/byte) at the achieved (bus-efficiency-scaled) bandwidth."""

    axis: MeshAxis
    size: int
    stride: int
    link: LinkKind
    n_inner: int
    n_outer: int
    alpha_inner_s: float
    beta_inner_s_per_byte: float
    alpha_outer_s: float
    beta_outer_s_per_byte: float

    @property
    def crosses_domain(self) -> bool:
        return self.n_outer > 1


@dataclass(frozen=True)
class LogicalMesh:
    """A logical mesh of ``Π sizes`` ranks on ``cluster`` (a whole cluster or one pipeline stage's submesh).

    Only axes of size > 1 are kept (a 1-rank mesh keeps ``dp`` of size 1). Build with ``from_degrees``."""

    cluster: ClusterSpec
    axes: tuple[MeshAxis, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        assert len(self.axes) == len(self.sizes) and len(set(self.axes)) == len(self.axes)
        assert list(self.axes) == [a for a in AXIS_ORDER if a in self.axes], "axes must follow AXIS_ORDER"

    @classmethod
    def from_degrees(cls, cluster: ClusterSpec, *, dp: int, tp: int = 1, cp: int = 1, ep: int = 1) -> "LogicalMesh":
        """Whole-cluster product mesh with Megatron degrees: ``dp`` counts all data-parallel ranks and ``ep`` is cut
        from it (the ``dp`` axis then has ``dp / ep`` ranks). Raises ``ConfigError`` for impossible degrees. An EP
        that spans TP/CP ranks (``ep ∤ dp``, MoE parallel folding) is no product of these axes; the search prices
        it on ``per_rank`` (a rank's costs are the same)."""
        for name, v in (("dp", dp), ("tp", tp), ("cp", cp), ("ep", ep)):
            if v < 1:
                raise ConfigError(f"{name}={v} must be >= 1")
        if dp % ep:
            raise ConfigError(f"ep={ep} must divide dp={dp} for a product mesh dp/ep × ep × cp × tp (an EP spanning "
                              "the TP/CP ranks is priced per rank: LogicalMesh.per_rank)",
                              valid=[d for d in range(1, dp + 1) if dp % d == 0])
        total = dp * tp * cp
        if total > cluster.num_gpus:
            raise ConfigError(f"mesh dp*cp*tp = {dp}*{cp}*{tp} = {total} exceeds num_gpus={cluster.num_gpus}")
        degree = {MeshAxis.DP: dp // ep, MeshAxis.EP: ep, MeshAxis.CP: cp, MeshAxis.TP: tp}
        axes = tuple(a for a in AXIS_ORDER if degree[a] > 1) or (MeshAxis.DP,)
        return cls(cluster, axes, tuple(degree[a] for a in axes))

    @classmethod
    def per_rank(cls, cluster: ClusterSpec, *, tp: int = 1, cp: int = 1, ep: int = 1) -> "LogicalMesh":
        """The smallest mesh with these degrees (no data axis beyond EP): what one rank's layer costs depend on.
        Strategies keep the batch sharded over ``dp``, so its size changes no per-rank cost. Any ``ep`` the target
        accepts, also one spanning the TP/CP ranks: each EP peer holds ``1/(tp·cp)`` of a micro-batch's tokens and
        the group's strides are Megatron's (EP consecutive ranks), as ``layer_cost`` prices it."""
        degree = {MeshAxis.DP: 1, MeshAxis.EP: ep, MeshAxis.CP: cp, MeshAxis.TP: tp}
        axes = tuple(a for a in AXIS_ORDER if degree[a] > 1) or (MeshAxis.DP,)
        return cls(cluster, axes, tuple(degree[a] for a in axes))

    # ---- shape ---------------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    def size(self, axis: MeshAxis) -> int:
        """Ranks along ``axis`` (1 when the mesh does not have it)."""
        return self.sizes[self.axes.index(axis)] if axis in self.axes else 1

    @cached_property
    def strides(self) -> RankStrides:
        """Megatron's rank strides for this mesh's degrees (``dp`` counts every data-parallel rank; computed once)."""
        ep = self.size(MeshAxis.EP)
        return RankStrides.megatron(self.size(MeshAxis.TP), self.size(MeshAxis.CP), self.size(MeshAxis.DP) * ep, ep)

    def stride(self, axis: MeshAxis) -> int:
        """Rank stride of ``axis`` (module docstring): tp 1, cp tp, ep 1 (expert folding), dp tp·cp."""
        st = self.strides
        return {MeshAxis.TP: st.tp, MeshAxis.CP: st.cp, MeshAxis.EP: st.ep, MeshAxis.DP: st.dp}[axis]

    @property
    def data_axes(self) -> tuple[MeshAxis, ...]:
        return tuple(a for a in self.axes if a.is_data)

    @property
    def label(self) -> str:
        """E.g. ``dp16×tp8``."""
        return "×".join(f"{a.value}{s}" for a, s in zip(self.axes, self.sizes))

    # ---- links ---------------------------------------------------------------------------------
    def link(self, axis: MeshAxis) -> AxisLink:
        """Which link ``axis`` crosses and its α/β (``cost_models.collectives.place_group``)."""
        c = self.cluster
        n, stride = self.size(axis), self.stride(axis)
        place = place_group(n, stride, c)
        kind: LinkKind
        if n <= 1:
            kind = "local"
        elif not place.crosses_domain:
            kind = "nvlink"
        else:
            kind = "nic" if place.n_inner == 1 else "nvlink+nic"
        return AxisLink(
            axis=axis, size=n, stride=stride, link=kind, n_inner=place.n_inner, n_outer=place.n_outer,
            alpha_inner_s=c.gpu.link_latency_us * 1e-6, beta_inner_s_per_byte=1.0 / link_bandwidth(c),
            alpha_outer_s=c.gpu.nic_latency_us * 1e-6, beta_outer_s_per_byte=1.0 / nic_bandwidth(c),
        )

    def crosses_domain(self, axis: MeshAxis) -> bool:
        return self.link(axis).crosses_domain

    def collective_time_s(self, kind: CollectiveKind, payload_bytes: float, axis: MeshAxis) -> float:
        """One collective over ``axis`` on the full (unsharded over that axis) payload (COST_MODEL.md §1)."""
        return group_collective_time_s(kind, payload_bytes, self.size(axis), self.stride(axis), self.cluster)

    def collective_time_multi_s(self, kind: CollectiveKind, payload_bytes: float,
                                axes: tuple[MeshAxis, ...]) -> float:
        """A collective over the product group of several axes (e.g. gradient sync over dp·cp). The group
        is placed at the stride of its innermost axis; exact when the axes are adjacent in rank order."""
        axes = tuple(a for a in axes if self.size(a) > 1)
        if not axes:
            return 0.0
        n = 1
        for a in axes:
            n *= self.size(a)
        stride = min(self.stride(a) for a in axes)
        return group_collective_time_s(kind, payload_bytes, n, stride, self.cluster)
