"""Catalogs and model sources: catalog names, Hugging Face ``config.json`` files, autoplan spec files.

Public interface::

    load_model(source)        -> ModelSpec     # name/alias, HF config.json (or its folder), spec file, dict
    load_gpu(name)            -> GPUSpec
    efficiency_for(generation) -> Efficiency
    build_cluster(gpu, num_gpus, *, gpus_per_node, inter_node_gbps, nvlink_domain_size, profile) -> ClusterSpec
    model_names(), gpu_names() -> sorted names (model aliases resolve but are not listed)

Every bad input raises :class:`autoplan.errors.UserInputError` with a one-line message. The YAML
catalogs next to this file ship as package data and are read once per process.
"""

from autoplan.catalog.cluster import build_cluster, load_profile
from autoplan.catalog.hf import SUPPORTED_MODEL_TYPES
from autoplan.catalog.loader import load_model
from autoplan.catalog.registry import efficiency_for, gpu_names, load_gpu, model_aliases, model_names

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "build_cluster",
    "efficiency_for",
    "gpu_names",
    "load_gpu",
    "load_model",
    "load_profile",
    "model_aliases",
    "model_names",
]
