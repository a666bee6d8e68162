"""Which sets of Megatron's selective-recompute modules (``--recompute-modules``) are worth pricing for a model.

Megatron-Core 0.16.1 takes any subset of seven modules (transformer_config.py:1196-1210; what each re-runs and drops:
``cost_models.recompute``), 127 non-empty sets, too many to price on every layout. The search tries a ladder
instead: each module a model has is priced alone on one decoder layer stack, as seconds of re-run forward
(``layer_cost``: the ops it re-runs, the ``moe`` module's repeated all-to-alls where ``par`` has ep > 1) per byte of
activations it stops keeping (``activation_bytes_per_microbatch``). Modules are taken cheapest per byte first, the
greedy order of the fractional knapsack (Dantzig 1957), and the ladder is the prefixes of that order: each rung frees
the next-cheapest bytes. A module that frees nothing is left out; Megatron itself warns that ``core_attn`` under a
fused attention kernel needs no recompute (transformer_config.py:1224-1230). The order is priced once per request on
a reference layout (``par``); each rung is then priced exactly on every layout, so the order only decides which sets
are tried, never what a plan costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cost_models.layer_cost import layer_cost
from cost_models.memory import activation_bytes_per_microbatch
from cost_models.opgraph import LayerGraph
from cost_models.recompute import module_errors
from cost_models.specs import RECOMPUTE_MODULES, ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import Runtime
from cost_models.targets.megatron import dsa_recompute_error


def module_price(graphs: Mapping[str, LayerGraph], counts: Mapping[str, int], model: ModelSpec,
                 cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, rt: Runtime,
                 modules: tuple[str, ...]) -> tuple[float, float]:
    """(seconds of re-run, bytes freed) per micro-batch on one rank of the layers ``counts`` names (kind → layers)
    under selective recompute of ``modules``, against no recompute, on ``par``'s mesh."""
    none = par.model_copy(update={"recompute": "none", "recompute_modules": None})
    sel = par.model_copy(update={"recompute": "selective", "recompute_modules": modules})
    seconds = freed = 0.0
    for kind, n in counts.items():
        g = graphs[kind]
        seconds += n * (layer_cost(g, model, cluster, job, sel, 1, rt).total_s
                        - layer_cost(g, model, cluster, job, none, 1, rt).total_s)
        freed += n * (activation_bytes_per_microbatch(g, model, job, none, rt)
                      - activation_bytes_per_microbatch(g, model, job, sel, rt))
    return seconds, freed


@dataclass(frozen=True)
class ModuleLadder:
    """The ladder's module sets, smallest first (``sets``), and ``default``: whether Megatron's default set
    (``core_attn``, which a layout searches as ``recompute_modules`` None) runs for the model under the runtime at all
    (False: DeepSeek sparse attention before core_v0.19.0, ``targets.megatron.dsa_recompute_error``), so the search
    skips it. Both fields are given where a ladder is built: no ladder rebuilt from its sets alone re-allows the
    default."""

    sets: tuple[tuple[str, ...], ...]
    default: bool


# No module sets beside the default, which runs: a target without Megatron's ``--recompute-modules`` (its own
# selective recompute), or a caller that asks for the structure of the layouts alone.
NO_LADDER = ModuleLadder((), True)


def module_ladder(graphs: Mapping[str, LayerGraph], counts: Mapping[str, int], model: ModelSpec,
                  cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, rt: Runtime) -> ModuleLadder:
    """The module sets to price, smallest first: the prefixes of the modules ``model`` has that free bytes, ordered by
    re-run seconds per byte freed (ties: Megatron's order), each set in Megatron's order (``RECOMPUTE_MODULES``),
    none that the target profile refuses (``module_errors``; ``dsa_recompute_error``: no ``core_attn`` with DSA before
    core_v0.19.0, and then not the default either: ``ModuleLadder.default``). Empty where selective recompute is not
    Megatron's module recompute (``rt.selective``)."""
    if rt.selective != "attention":
        return NO_LADDER
    priced = []
    for rank, m in enumerate(RECOMPUTE_MODULES):
        if module_errors(model, par.model_copy(update={"recompute_modules": (m,)}), rt.fp8_recipe) is not None:
            continue
        if dsa_recompute_error(model, (m,), rt.megatron_core) is not None:
            continue
        seconds, freed = module_price(graphs, counts, model, cluster, job, par, rt, (m,))
        if freed > 0.0:
            priced.append((max(seconds, 0.0) / freed, rank, m))
    order = [m for _, _, m in sorted(priced)]
    return ModuleLadder(tuple(tuple(m for m in RECOMPUTE_MODULES if m in order[:i]) for i in range(1, len(order) + 1)),
                        default=dsa_recompute_error(model, ("core_attn",), rt.megatron_core) is None)
