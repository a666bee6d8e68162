"""Cross-check a chosen plan's per-layer cost against the intra-op ILP (``search.intra_op``, issue #3).

The stage DP and the ranking price a layer with ``cost_models.layer_cost`` — the uniform Megatron TP/SP
pattern that ``ParallelConfig`` can express and ``estimate`` (what users see) prices. The ILP searches
every per-op strategy the target can launch on the same stage mesh; for ``megatron``/``torchtitan`` that
is the same pattern (the two implementations agree within a few percent), for ``any`` it may find a
non-uniform sharding no ParallelConfig can express. ``intra_op_note`` says which, per layer kind. Opt-in
(``search(..., intra_op_check=True)``, ``autoplan search --intra-op-check``): importing OR-Tools and solving
costs ~1 s.
"""

from __future__ import annotations

from typing import Any

from cost_models.errors import ConfigError, InfeasibleError
from cost_models.estimate import Prediction
from cost_models.layer_cost import layer_cost
from cost_models.memory import graphs_for
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig


def intra_op_note(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, pred: Prediction,
                  target: str, cache: Any) -> str:
    """One sentence per layer kind: ILP time per micro-batch vs the cost model's, on the plan's stage mesh."""
    from search.intra_op import IntraOpRequest, solve_layer
    from search.mesh import LogicalMesh

    graphs = graphs_for(model, job.seq_len)
    mesh = LogicalMesh.from_degrees(cluster, dp=pred.dp, tp=par.tp, cp=par.cp, ep=par.ep)
    ilp_target = "megatron" if target == "megatron" else ("torchtitan" if target == "torchtitan" else "any")
    parts = []
    present = {"moe" if model.is_moe_layer(i) else "dense" for i in range(model.num_layers)}
    for kind in ("dense", "moe"):
        if kind not in present:
            continue
        ours = layer_cost(graphs[kind], model, cluster, job, par, pred.dp).total_s
        req = IntraOpRequest(kind=kind, seq_len=job.seq_len, micro_batch_size=par.micro_batch_size,  # type: ignore[arg-type]
                             recompute=par.recompute, precision=job.precision, target=ilp_target,  # type: ignore[arg-type]
                             num_microbatches=pred.num_microbatches,
                             sequence_parallel=par.sequence_parallel if par.tp > 1 else None)
        try:
            res = solve_layer(model, mesh, req, cache=cache)
        except (ConfigError, InfeasibleError) as err:
            parts.append(f"{kind}: ILP ({ilp_target}) has no strategy on {mesh.label} ({err})")
            continue
        ilp = res.time_per_microbatch_s
        parts.append(f"{kind} layer {ilp * 1e3:.2f} ms per micro-batch by the ILP ({ilp_target}, {res.status}) vs "
                     f"{ours * 1e3:.2f} ms in the cost model ({ilp / ours - 1:+.1%})")
    return f"Intra-op check on {mesh.label}: " + "; ".join(parts) + "."
