"""``build_cluster``: a ClusterSpec from a catalog GPU, optional overrides and a calibrated profile.

Precedence, highest first: explicit keyword arguments → cluster profile → GPU catalog defaults.

A cluster profile (written by ``autoplan calibrate``) is a YAML/JSON mapping::

    gpu: h100-sxm                 # must name the same GPU as the request
    efficiency: {gemm_max: 0.74, link_bus: 0.80}   # Efficiency fields; missing ones keep the catalog's
    gpus_per_node: 8              # optional
    inter_node_gbps: 400          # optional
    nvlink_domain_size: 8         # optional
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autoplan.catalog.registry import efficiency_for_gpu, framework_efficiency, load_gpu, resolve_over
from autoplan.catalog.spec_file import read_mapping, validate
from autoplan.errors import UserInputError
from autoplan.inputs import read_bytes, user_path
from cost_models.specs import ClusterSpec, Efficiency


class ClusterProfile(BaseModel):
    """The on-disk cluster-profile format (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str
    efficiency: dict[str, Any] = Field(default_factory=dict, description="Efficiency fields to override")
    gpus_per_node: int | None = Field(default=None, gt=0)
    inter_node_gbps: float | None = Field(default=None, gt=0)
    nvlink_domain_size: int | None = Field(default=None, gt=0)


@lru_cache(maxsize=16)
def _read_profile(resolved: str, mtime_ns: int, shown: str) -> ClusterProfile:
    del resolved, mtime_ns
    data = read_mapping(Path(shown))
    if "num_gpus" in data:  # the one field a user reaches for that a profile does not hold
        raise UserInputError(f"cluster profile '{shown}': num_gpus is not a profile field (a profile describes the GPU "
                             "and its links, not how many); give the count with --gpus (a request's cluster.num_gpus)")
    return validate(ClusterProfile, data, f"cluster profile '{shown}'")


def load_profile(path: str | Path) -> ClusterProfile:
    """Parse a cluster-profile file (cached per path and modification time)."""
    p = user_path(path)
    if not p.is_file():
        if p.exists():
            read_bytes(p, what="cluster profile")  # a directory, pipe or device: refused by name
        raise UserInputError(f"cluster profile '{path}' does not exist")
    resolved = p.resolve()
    return _read_profile(str(resolved), resolved.stat().st_mtime_ns, str(path))


def target_efficiency(target: str | None, generation: str | None = None) -> dict[str, Any]:
    """The Efficiency fields ``target`` sets over its GPU's, as gpus.yaml ``frameworks`` writes them (``scale``:
    ratios to the GPU's value; ``registry.resolve_over`` applies them): the set its profile names
    (``cost_models.targets.framework_of``, i.e. ``TargetProfile.efficiency_set``); on a ``generation`` where the
    profile's attention call puts cuDNN first (``TargetProfile.sdpa_cudnn_first``), ``attention_fa2`` off: SDPA
    runs cuDNN's kernel there, the one the generation's ``attention`` figure measures.
    ``None``/``any``/a runtime without a profile: none (the generation's, fitted on Megatron-Core runs). Lives here,
    not in cost_models, because the numbers are catalog data (ARCHITECTURE.md: cost_models loads no YAML)."""
    from cost_models.targets import framework_of

    name = framework_of(target)
    fields = framework_efficiency(name) if name else {}
    return {**fields, **target_kernel_fields(target, generation)} if fields else fields


def target_kernel_fields(target: str | None, generation: str | None) -> dict[str, Any]:
    """Efficiency facts of the kernel ``target``'s profile runs on a GPU ``generation``, over its framework set:
    ``attention_fa2`` off where its attention call puts cuDNN SDPA first (``TargetProfile.sdpa_cudnn_first``).
    The one rule ``build_cluster`` (through ``target_efficiency``) and the fit's view (``calibrate.on_gpu``) apply."""
    from cost_models.targets import sdpa_cudnn_first

    return {"attention_fa2": False} if generation in sdpa_cudnn_first(target) else {}


def job_nvlink_domain(rack: int, node: int, num_gpus: int) -> int:
    """The GPUs of one multi-node NVLink domain (NVL72-class rack of ``rack`` GPUs) a job gets, as NVIDIA launches
    jobs on such racks: a job within one rack gets all its GPUs there; a larger job is placed with Slurm
    ``--segment`` = the largest divisor of its node count that fits a rack (NeMo scripts/performance/executors.py,
    "add --segment flag to sbatch if job uses GB200 and goes beyond one rack"), so 64 nodes of 4 GB200 run as 4
    segments of 16 nodes: 64-GPU NVLink domains, and 32- or 64-rank groups stay inside one."""
    nodes, per_rack = max(1, num_gpus // node), max(1, rack // node)
    if nodes <= per_rack:
        return max(node, nodes * node)
    return node * max(s for s in range(per_rack, 0, -1) if nodes % s == 0)


def headroom_room_check(cluster: ClusterSpec) -> None:
    """Refuse a headroom whose ``memory_limit_gib`` leaves no more than the CUDA context and NCCL buffers every plan
    holds outside the allocator (``cost_models.memory.runtime_overhead_bytes``): no plan could fit, and the limit read
    "0 GiB". A headroom of all the HBM or more is the same case (its limit is 0). Names the largest valid value, in
    GiB and as a fraction (``ClusterSpec.memory_headroom_gib``: < 1 is a fraction)."""
    from cost_models.memory import GIB, runtime_overhead_bytes

    floor, left, hbm = runtime_overhead_bytes() / GIB, cluster.memory_limit_gib, cluster.gpu.hbm_gib
    if left > floor:
        return
    frac = math.floor((hbm - floor) / hbm * 1e4) / 1e4
    raise UserInputError(f"memory headroom {cluster.memory_headroom:g} leaves {left:.2f} GiB of {cluster.gpu.name}'s "
                         f"{hbm:g} GiB, no more than the {floor:g} GiB of CUDA context and NCCL buffers every plan "
                         f"holds: give less than {hbm - floor:g} GiB or a fraction of at most {frac:g} (default 0.05)")


def build_cluster(
    gpu: str,
    num_gpus: int,
    *,
    gpus_per_node: int | None = None,
    inter_node_gbps: float | None = None,
    nvlink_domain_size: int | None = None,
    profile: str | Path | None = None,
    memory_headroom: float | None = None,
    target: str | None = None,
    efficiency_fields: dict[str, Any] | None = None,
) -> ClusterSpec:
    """A homogeneous cluster of ``num_gpus`` catalog GPUs, as ``target`` runs on it. Fewer GPUs than one node is
    allowed (``gpus_per_node`` then stays the catalog's). Efficiency: the GPU generation's with the GPU's own facts
    over it (``efficiency_for_gpu``: gpus.yaml ``gpu_efficiency``), then the efficiency set
    the target's profile names (``target_efficiency``), then a cluster profile's own fields, then ``efficiency_fields``
    (a profile's ``efficiency`` given inline: what a plan file keeps of the profile it was found with).

    The one way every path (estimate, search, ``any``'s per-target candidates, emit, validate, scale, compare,
    calibrate, batch, serve) gets the cluster a target runs on: ``ClusterRequest.resolve(target)`` calls it."""
    spec = load_gpu(gpu)
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus <= 0:
        raise UserInputError(f"num_gpus ({num_gpus!r}) must be a positive integer")
    efficiency = efficiency_for_gpu(spec.name)
    overrides = target_efficiency(target, spec.generation)
    if overrides:  # the framework's ratios apply to this GPU's own values (its generation's and its own facts)
        efficiency = efficiency.model_copy(update=resolve_over(efficiency, overrides))
    prof = load_profile(profile) if profile is not None else ClusterProfile(gpu=spec.name)
    if load_gpu(prof.gpu).name != spec.name:
        raise UserInputError(f"cluster profile '{profile}' is for GPU '{prof.gpu}', not '{spec.name}'")
    if prof.efficiency:
        efficiency = validate(
            Efficiency, {**efficiency.model_dump(), **prof.efficiency}, f"efficiency in cluster profile '{profile}'"
        )
    if efficiency_fields:
        efficiency = validate(Efficiency, {**efficiency.model_dump(), **efficiency_fields}, "cluster efficiency")

    def pick(explicit: float | None, from_profile: float | None, default: float) -> float:
        return next((v for v in (explicit, from_profile) if v is not None), default)

    node = pick(gpus_per_node, prof.gpus_per_node, spec.gpus_per_node)
    # Where NVLink spans exactly one node (HGX, MI300X: catalog domain = node), a smaller node has a smaller
    # domain: NVLink does not cross the node boundary. NVL72-class racks keep their domain.
    domain_default = (min(spec.nvlink_domain_size, int(node)) if spec.nvlink_domain_size == spec.gpus_per_node
                      else job_nvlink_domain(spec.nvlink_domain_size, int(node), num_gpus))
    fields = {
        "gpu": spec,
        "num_gpus": num_gpus,
        "gpus_per_node": node,
        "nvlink_domain_size": pick(nvlink_domain_size, prof.nvlink_domain_size, domain_default),
        "inter_node_gbps": pick(inter_node_gbps, prof.inter_node_gbps, spec.nic_gbps),
        "efficiency": efficiency,
    }
    if memory_headroom is not None:
        if not memory_headroom >= 0:
            raise UserInputError(f"memory headroom {memory_headroom:g} must be at least 0: a fraction of HBM below 1 "
                                 f"or GiB (default 0.05)")
        fields["memory_headroom"] = memory_headroom
    cluster = validate(ClusterSpec, fields, f"cluster of {num_gpus} x {spec.name}")
    if memory_headroom is not None:
        headroom_room_check(cluster)
    return cluster
