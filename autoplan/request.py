"""Requests as users write them (CLI flags, JSON, Python) and their resolution into specs.

The same shapes serve ``estimate``, ``search``, ``emit`` and batch lines; omitted fields take the
documented defaults (``JobSpec``: 1024 sequences of 8192 tokens, bf16; cluster: h100-sxm, catalog node
size and NIC)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autoplan.catalog import build_cluster, load_model
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec


class ClusterRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    gpu: str = Field(default="h100-sxm", description="GPU catalog name (see `autoplan hardware`)")
    num_gpus: int = Field(gt=0)
    gpus_per_node: int | None = Field(default=None, gt=0, description="None: the GPU catalog's")
    inter_node_gbps: float | None = Field(default=None, gt=0, description="per GPU, Gbit/s; None: catalog NIC")
    nvlink_domain_size: int | None = Field(default=None, gt=0, description="None: the GPU catalog's")
    profile: str | None = Field(default=None, description="cluster profile YAML from `autoplan calibrate`")

    def resolve(self) -> ClusterSpec:
        return build_cluster(self.gpu, self.num_gpus, gpus_per_node=self.gpus_per_node,
                             inter_node_gbps=self.inter_node_gbps, nvlink_domain_size=self.nvlink_domain_size,
                             profile=self.profile)


def model_record(model: ModelSpec) -> dict[str, Any]:
    return {"name": model.name, "spec": model.model_dump(exclude_none=True)}


def cluster_record(cluster: ClusterSpec) -> dict[str, Any]:
    return {"gpu": cluster.gpu.name, "num_gpus": cluster.num_gpus, "gpus_per_node": cluster.gpus_per_node,
            "inter_node_gbps": cluster.inter_node_gbps, "nvlink_domain_size": cluster.nvlink_domain_size}


def resolve(model: str | dict[str, Any], cluster: ClusterRequest, job: JobSpec) -> tuple[ModelSpec, ClusterSpec,
                                                                                           JobSpec]:
    return load_model(model), cluster.resolve(), job
