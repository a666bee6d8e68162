"""α-β collective costs over a hierarchical topology (COST_MODEL.md §1).

Ring algorithms (Thakur, Rabenseifner & Gropp 2005; NCCL's bus-bandwidth convention). ``payload`` is the
full, unsharded tensor ``S`` in bytes; each rank sends:

=================  ===================  =====================================
collective         bytes each rank sends   ring time
=================  ===================  =====================================
all-reduce         2(n-1)/n · S         2(n-1)·α + 2(n-1)/n · S/B
all-gather, RS     (n-1)/n · S          (n-1)·α + (n-1)/n · S/B
all-to-all         (n-1)/n · S          (n-1)·α + (n-1)/n · S/B
send/recv          S                    α + S/B
=================  ===================  =====================================

A group of ``n`` ranks laid out at rank stride ``k`` (Megatron order tp-cp-ep-dp-pp: tp has stride 1)
either stays inside one NVLink domain (bandwidth = link × link_bus efficiency) or spans domains; then it is
hierarchical (NCCL): intra-domain reduce-scatter → inter-domain all-reduce of ``S / n_in`` → intra-domain
all-gather, the inter-domain part limited per GPU by its NIC (rail-optimized: one NIC per GPU).
Inside one domain an all-reduce uses NVLink SHARP (NVLS) where the switch supports it (``nvls_bus`` > 0:
Hopper/Blackwell NVSwitch); reduce-scatter and all-gather stay on the ring. Across nodes an all-reduce takes the
faster of ring and NCCL's double binary tree (latency 2·⌈log2 n⌉·α instead of 2(n−1)·α at thousands of nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from cost_models.specs import ClusterSpec

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]


def bytes_sent_per_rank(kind: CollectiveKind, payload_bytes: float, n: int) -> float:
    """Bytes each rank puts on the wire (the table above)."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n * payload_bytes
    if kind == "send_recv":
        return payload_bytes
    return (n - 1) / n * payload_bytes


def collective_time_s(kind: CollectiveKind, payload_bytes: float, n: int, bandwidth_bytes_per_s: float,
                      latency_s: float) -> float:
    """Ring α-β time of one collective on a flat group (the table above)."""
    if n <= 1:
        return 0.0
    steps = {"all_reduce": 2 * (n - 1), "send_recv": 1}.get(kind, n - 1)
    return steps * latency_s + bytes_sent_per_rank(kind, payload_bytes, n) / bandwidth_bytes_per_s


def tree_all_reduce_time_s(payload_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """NCCL's double binary tree all-reduce across nodes (Sanders, Speck & Träff 2009, "Two-tree algorithms for full
    bandwidth broadcast, reduction and scan"; NCCL 2.4): a reduce up and a broadcast down two complementary trees,
    each carrying half the payload, so the latency term grows with ``2·⌈log2 n⌉`` hops instead of the ring's
    ``2(n−1)`` while the bandwidth term stays the ring's ``2(n−1)/n · S/B`` (full bandwidth)."""
    if n <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * latency_s + bytes_sent_per_rank("all_reduce", payload_bytes, n) / \
        bandwidth_bytes_per_s


def inter_node_all_reduce_s(payload_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """An all-reduce over ``n`` nodes as NCCL's tuner picks it: the faster of ring and double binary tree (NCCL has
    no tree for reduce-scatter / all-gather: those stay on the ring)."""
    return min(collective_time_s("all_reduce", payload_bytes, n, bandwidth_bytes_per_s, latency_s),
               tree_all_reduce_time_s(payload_bytes, n, bandwidth_bytes_per_s, latency_s))


@dataclass(frozen=True)
class GroupPlacement:
    """How a communication group of ``n`` ranks at rank stride ``stride`` sits on the cluster."""

    n: int
    n_inner: int  # ranks of the group that share one NVLink domain
    n_outer: int  # NVLink domains the group spans

    @property
    def crosses_domain(self) -> bool:
        return self.n_outer > 1


def place_group(n: int, stride: int, cluster: ClusterSpec) -> GroupPlacement:
    """Ranks ``r, r+stride, …`` (n of them) over NVLink domains of ``cluster.nvlink_domain_size`` GPUs.

    Groups tile the ranks in blocks of ``n·stride``; when a block does not divide the domain, some group
    straddles a domain boundary, and the slowest group sets the step, so the placement is the worst
    group's: ``gcd(n, domain/stride)`` ranks share a domain (a lower bound on the aligned part).
    Examples: tp=8 (stride 1) on HGX (domain 8) → (8 inner, 1 outer); dp=16 at stride 8 → (1, 16);
    cp=4 at stride 2 on NVL72 → (4, 1); a 64-rank EP group (stride 1) on NVL72 → (8, 8): the group at
    ranks 64–127 spans two racks."""
    domain = cluster.nvlink_domain_size
    if n <= 1:
        return GroupPlacement(n, 1, 1)
    if stride >= domain:
        return GroupPlacement(n, 1, n)
    span = n * stride
    if span <= domain and domain % span == 0:
        return GroupPlacement(n, n, 1)
    inner = math.gcd(n, domain // stride) if domain % stride == 0 else 1
    return GroupPlacement(n, inner, n // inner)


def link_bandwidth(cluster: ClusterSpec) -> float:
    """Achieved scale-up bandwidth per GPU per direction, bytes/s."""
    return cluster.gpu.link_gbytes_per_s * 1e9 * cluster.efficiency.link_bus


def link_all_to_all_bandwidth(cluster: ClusterSpec) -> float:
    """Achieved NCCL all-to-all bus bandwidth per GPU per direction inside one NVLink domain, bytes/s: nccl-tests
    alltoall_perf busbw (algbw·(n−1)/n: the bytes a rank sends to its n−1 peers over the time) is below the ring
    all-reduce's on the same NVLink, by ``Efficiency.a2a_link_ratio`` of it (benchmarks/gpu_facts.py
    NCCL_ALLTOALL_NVLINK over NCCL_ALLREDUCE_BUSBW): a ratio to ``link_bus``, so a cluster profile or calibration
    that lowers the ring's rate lowers the all-to-all's with it; ``link_bandwidth`` where the generation has no
    all-to-all figure."""
    ratio = cluster.efficiency.a2a_link_ratio
    return link_bandwidth(cluster) * (ratio if ratio else 1.0)


def nic_bandwidth(cluster: ClusterSpec) -> float:
    """Achieved scale-out bandwidth per GPU, bytes/s (Gbit/s → bytes/s)."""
    return cluster.inter_node_gbps / 8 * 1e9 * cluster.efficiency.nic_bus


def group_collective_time_s(kind: CollectiveKind, payload_bytes: float, n: int, stride: int,
                            cluster: ClusterSpec) -> float:
    """Time of one collective on a group placed on the cluster, hierarchical across NVLink domains."""
    if n <= 1 or payload_bytes <= 0:
        return 0.0
    place = place_group(n, stride, cluster)
    bw_in, lat_in = link_bandwidth(cluster), cluster.gpu.link_latency_us * 1e-6
    bw_out, lat_out = nic_bandwidth(cluster), cluster.gpu.nic_latency_us * 1e-6
    if not place.crosses_domain:
        if kind == "all_reduce" and cluster.efficiency.nvls_bus > 0:
            # NVLink SHARP: the switch reduces, each GPU sends S once and receives S once; NCCL reports it as
            # bus bandwidth (nccl-tests H100 HGX: ≈ 480 GB/s NVLS vs ≈ 370 GB/s ring, COST_MODEL.md §1).
            bw_in = cluster.gpu.link_gbytes_per_s * 1e9 * cluster.efficiency.nvls_bus
        elif kind == "all_to_all":
            bw_in = link_all_to_all_bandwidth(cluster)
        return collective_time_s(kind, payload_bytes, n, bw_in, lat_in)
    if place.n_inner == 1 or kind in ("all_to_all", "send_recv"):
        # Every byte that leaves the domain goes through the rank's own NIC.
        if kind == "all_reduce":
            return inter_node_all_reduce_s(payload_bytes, n, bw_out, lat_out)
        return collective_time_s(kind, payload_bytes, n, bw_out, lat_out)
    inner, outer = place.n_inner, place.n_outer
    if kind == "all_reduce":
        return (collective_time_s("reduce_scatter", payload_bytes, inner, bw_in, lat_in)
                + inter_node_all_reduce_s(payload_bytes / inner, outer, bw_out, lat_out)
                + collective_time_s("all_gather", payload_bytes, inner, bw_in, lat_in))
    # all-gather / reduce-scatter: inner phase on NVLink, outer phase on the NIC with S / inner per rank.
    return (collective_time_s(kind, payload_bytes, inner, bw_in, lat_in)
            + collective_time_s(kind, payload_bytes / inner, outer, bw_out, lat_out))


@dataclass(frozen=True)
class RankStrides:
    """Rank strides of each parallel dimension in Megatron's order ``tp-cp-ep-dp-pp`` (tp fastest).

    Routed experts run with expert-TP 1, so Megatron's MoE parallel folding lays the expert groups out
    as ``ep-edp`` over the same ``tp·cp·dp`` ranks: an EP group is ``ep`` consecutive ranks (stride 1) and
    the expert-data-parallel group steps over them (stride ``ep``). ``ep`` is needed only for ``edp``."""

    tp: int
    cp: int
    ep: int
    edp: int
    dp: int
    pp: int

    @classmethod
    def megatron(cls, tp: int, cp: int, dp: int, ep: int = 1) -> "RankStrides":
        return cls(tp=1, cp=tp, ep=1, edp=ep, dp=tp * cp, pp=tp * cp * dp)
