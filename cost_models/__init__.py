"""The world model: specs, operator graph, FLOPs, collectives, memory, pipeline and the composite cost.

Knows nothing of search or of the CLI (ARCHITECTURE.md)."""

from cost_models.specs import (
    ClusterSpec,
    Efficiency,
    GPUSpec,
    JobSpec,
    MLASpec,
    ModelSpec,
    ParallelConfig,
)

__all__ = ["ClusterSpec", "Efficiency", "GPUSpec", "JobSpec", "MLASpec", "ModelSpec", "ParallelConfig"]
