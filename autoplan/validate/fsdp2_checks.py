"""FSDP2 checks: the emitted module against torch itself (fake process group at the plan's world size;
the model is the plan's architecture as a tiny-Llama-layout model on the meta device, rank 0's view)."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path
from typing import Any

from autoplan.emit import EmitPlan


def _import(out: Path) -> tuple[str, Any]:
    sys.path.insert(0, str(out))
    ap = importlib.import_module("autoplan_parallelize")
    return f"PLAN={ap.PLAN}", ap


def _mesh(plan: EmitPlan, ap: Any) -> tuple[str, Any]:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=plan.cluster.num_gpus)
    mesh = ap.build_mesh("cpu")
    shape = dict(zip(mesh.mesh_dim_names, mesh.mesh.shape))
    want = {"pp": plan.parallel.pp, "tp": plan.parallel.tp}
    dp = shape.get("dp", 1) * shape.get("dp_replicate", 1) * shape.get("dp_shard", 1)
    if {k: shape[k] for k in want} != want or dp != plan.dp:
        raise AssertionError(f"mesh {shape} != plan pp={plan.parallel.pp} dp={plan.dp} tp={plan.parallel.tp}")
    tp_ranks = mesh["tp"].mesh.flatten().tolist()
    if tp_ranks != list(range(len(tp_ranks))):
        raise AssertionError(f"rank 0's TP group {tp_ranks} is not consecutive ranks")
    return f"DeviceMesh {shape}; rank 0's TP group {tp_ranks}", mesh


def _apply(plan: EmitPlan, ap: Any, mesh: Any) -> str:
    import torch

    from autoplan.validate.tiny_llama import TinyLlama, loss_fn

    m = plan.model
    with torch.device("meta"):
        model = TinyLlama(vocab=m.vocab_size, dim=m.hidden_size, n_layers=m.num_layers,
                          n_heads=m.num_attention_heads, n_kv_heads=m.num_kv_heads, hidden=m.ffn_hidden_size,
                          gated=m.gated_mlp)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts, schedule = ap.parallelize(model, mesh, loss_fn, torch.device("cpu"))
    # parallelize_module only warns on a plan key naming no submodule (torch/distributed/tensor/parallel/api.py,
    # "could not be resolved") and leaves that module unsharded: a plan for another model
    unresolved = [str(w.message).split(": no submodule")[0] for w in caught
                  if "could not be resolved" in str(w.message)]
    if unresolved:
        raise AssertionError(f"{unresolved[0]}: the TP plan names a module the model does not have")
    wq = parts[0].layers[next(iter(parts[0].layers.keys()))].attention.wq.weight
    local = tuple(wq.to_local().shape) if hasattr(wq, "to_local") else tuple(wq.shape)
    return (f"{len(parts)} chunk(s) on rank 0, layers {[list(p.layers.keys())[:1] + list(p.layers.keys())[-1:] for p in parts]}"
            f"; schedule {type(schedule).__name__ if schedule else None}; wq placements "
            f"{getattr(wq, 'placements', None)}, local shard {local}")


def run(plan: EmitPlan, out: Path, rep) -> None:  # type: ignore[no-untyped-def]
    ap = rep.check("fsdp2: the emitted autoplan_parallelize module imports", lambda: _import(out))
    if ap is None:
        return
    mesh = rep.check(f"torch: build_mesh() builds the named DeviceMesh (fake backend, {plan.cluster.num_gpus} ranks)",
                     lambda: _mesh(plan, ap))
    if mesh is None:
        return
    rep.check("torch: parallelize() applies TP, fully_shard and pipeline stages to a meta-device model (rank 0)",
              lambda: _apply(plan, ap, mesh))
