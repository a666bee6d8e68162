"""What an emitter consumes: one fully resolved plan (model, cluster, job, parallel layout).

A plan comes from a plan JSON written by ``autoplan estimate --format json`` (top-level ``"parallel"``)
or ``autoplan search --format json`` (``"plans": [{"parallel": ..., "prediction": ...}, ...]``), or from
explicit specs. ``check_emittable`` runs the hard constraints before any file is written, so an
infeasible layout is refused by autoplan with the reason the framework itself would give.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from autoplan.errors import ConfigError, UserInputError
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets import PROFILES, Runtime, Software
from cost_models.targets.common import dynamic_rope_error

if TYPE_CHECKING:
    from autoplan.request import ClusterRequest

Target = Literal["megatron", "torchtitan", "fsdp2"]
TARGETS: tuple[Target, ...] = ("megatron", "torchtitan", "fsdp2")


@dataclass(frozen=True)
class EmitPlan:
    """One plan, resolved: everything an emitter needs and nothing else."""

    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    parallel: ParallelConfig
    software: Software = field(default_factory=Software)
    # decoder layer kind → op → tp mode the intra-op ILP chose (search JSON ``plans[i].op_shardings``); empty
    # for an estimate plan: the emitters then write the layout's uniform pattern
    op_shardings: dict[str, dict[str, str]] = field(default_factory=dict, hash=False, compare=False)

    def runtime(self, target: str) -> Runtime:
        """How ``target`` runs this plan (``cost_models.targets``): the knobs and env the emitters write."""
        return PROFILES[target].resolve(self.software, self.job, self.cluster, self.parallel)

    @property
    def dp(self) -> int:
        """Data-parallel degree, Megatron's convention: gpus / (tp * pp * cp)."""
        return self.parallel.dp(self.cluster.num_gpus)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per optimizer step per pipeline: B / (b * dp)."""
        return self.job.global_batch_size // (self.parallel.micro_batch_size * self.dp)

    @property
    def num_nodes(self) -> int:
        return self.cluster.num_nodes

    @property
    def procs_per_node(self) -> int:
        return min(self.cluster.gpus_per_node, self.cluster.num_gpus)


def dynamic_rope_notes(plan: EmitPlan) -> list[str]:
    """What the emitted run trains for a dynamic-NTK model within its length (``targets.common.dynamic_rope_error``)."""
    rs = plan.model.arch.rope_scaling
    if rs is None or rs.type != "dynamic" or dynamic_rope_error(plan.model, plan.job.seq_len, "") is not None:
        return []
    return [f"rope_scaling 'dynamic' (factor {rs.factor:g}): seq_len {plan.job.seq_len} <= max_position_embeddings "
            f"{rs.max_position_embeddings}, so transformers never rescales during this training "
            "(modeling_rope_utils.py:101 @ 5.24.0): emitted plain RoPE (base "
            f"{plan.model.arch.rope_theta:g}), the same function; the config's dynamic scaling applies beyond "
            f"{rs.max_position_embeddings} tokens at inference"]


def _read_json(path: str | Path) -> dict[str, Any]:
    from autoplan.inputs import json_type, parse_json, read_text

    data = parse_json(read_text(path, what="plan file"), f"plan file '{path}'")
    if not isinstance(data, dict):
        raise UserInputError(f"plan file '{path}' must hold one JSON object, not {json_type(data)}")
    return data


def _require(data: dict[str, Any], key: str, path: str | Path, kind: type = dict) -> Any:
    if key not in data:
        raise UserInputError(f"plan file '{path}' has no \"{key}\"")
    if not isinstance(data[key], kind):
        from autoplan.inputs import json_type

        raise UserInputError(f"plan file '{path}': \"{key}\" must be an {'array' if kind is list else 'object'}, "
                             f"not {json_type(data[key])}")
    return data[key]


def plan_from_dict(data: dict[str, Any], index: int | None = None, *, source: str = "<plan>",
                   target: str | None = None) -> EmitPlan:
    """Resolve a plan JSON object (estimate or search output) into an ``EmitPlan``, its cluster as ``target``
    runs on it (``ClusterRequest.resolve``: the efficiency set the target's profile names).

    ``index`` picks ``plans[index]`` of a search result (default 0); it is an error for an estimate
    result, which holds a single ``"parallel"``."""
    from autoplan.inputs import strict
    from autoplan.request import ClusterRequest

    model_rec = _require(data, "model", source)
    spec = model_rec.get("spec")
    if not isinstance(spec, dict):
        raise UserInputError(f"plan file '{source}': \"model\" must hold a \"spec\" object")
    spec = dict(spec)
    spec.setdefault("name", model_rec.get("name", "custom"))
    model = strict(ModelSpec, spec, f"plan file '{source}': model")
    creq = _cluster_request(data, source)
    cluster = _resolved(creq, target, source)
    job = strict(JobSpec, _require(data, "job", source), f"plan file '{source}': job")

    entry, where = _plan_entry(data, index, source)
    par = entry.get("parallel")
    if not isinstance(par, dict):
        raise UserInputError(f"plan file '{source}': {where or 'the plan'} has no \"parallel\" object")
    knobs = _priced_knobs(entry, source, where)
    shardings = (entry.get("op_shardings") or {}) if where else {}
    if not (isinstance(shardings, dict) and all(isinstance(v, dict) and all(
            isinstance(a, str) and isinstance(b, str) for a, b in v.items()) for v in shardings.values())):
        raise UserInputError(f"plan file '{source}': {_at(where, 'op_shardings')} must map layer kinds to "
                             "{op: mode} objects")
    headroom = _checked_headroom(entry, cluster.gpu.hbm_gib, source, where)
    if headroom is not None:  # the memory limit the plan was found under (search --memory-headroom), not the default
        cluster = _resolved(strict(ClusterRequest, {**creq.model_dump(), "memory_headroom": headroom},
                                   f"plan file '{source}': cluster"), target, source)
    parallel = strict(ParallelConfig, par, f"plan file '{source}': parallel")
    software = priced_software(knobs, f"plan file '{source}': {_at(where, 'prediction.software')}")
    return EmitPlan(model=model, cluster=cluster, job=job, parallel=parallel, software=software,
                    op_shardings=shardings)


def _cluster_request(data: dict[str, Any], source: str) -> ClusterRequest:
    """The plan file's cluster as a request: the recorded sizes and links, and the Efficiency fields a cluster profile
    set when it was priced (``ClusterRecord.efficiency``), so that it reloads on that cluster, not the catalog's."""
    from autoplan.inputs import strict
    from autoplan.request import ClusterRequest

    cl = _require(data, "cluster", source)
    if not isinstance(cl, dict) or "gpu" not in cl or "num_gpus" not in cl:
        raise UserInputError(f"plan file '{source}': \"cluster\" must hold \"gpu\" and \"num_gpus\"")
    _check_efficiency_basis(cl, source)
    if cl.get("efficiency_basis") == "profile" and cl.get("efficiency") is None:  # written before the field existed
        raise UserInputError(f"plan file '{source}' was priced on a cluster profile but does not record its efficiency "
                             "(cluster.efficiency; written by an older autoplan), so it would be re-priced on the "
                             "catalog's; run the search or estimate with --cluster again to write it anew")
    return strict(ClusterRequest, {k: cl.get(k) for k in ("gpu", "num_gpus", "gpus_per_node", "inter_node_gbps",
                                                          "nvlink_domain_size", "efficiency")},
                  f"plan file '{source}': cluster")


def _check_efficiency_basis(cl: dict[str, Any], source: str) -> None:
    """``cluster.efficiency_basis``, where the efficiencies came from (``schema.ClusterRecord``): one of its choices;
    ``profile`` without ``cluster.efficiency`` is refused by the caller. Absent: the record's default (fitted). Not
    checked against the fields or the catalog: a plan is re-priced on the fields it holds, and its new record says
    the basis anew (a hand-set field, or a GPU fitted since, leaves the old value stale, not wrong to load)."""
    from typing import get_args

    from autoplan.schema import EfficiencyBasis

    basis, choices = cl.get("efficiency_basis", "fitted"), get_args(EfficiencyBasis)
    if not isinstance(basis, str) or basis not in choices:
        raise UserInputError(f"plan file '{source}': cluster.efficiency_basis={basis!r:.40} is not one of "
                             f"{', '.join(choices)} (where the plan's efficiencies came from)")


def _resolved(creq: ClusterRequest, target: str | None, source: str) -> ClusterSpec:
    """``creq.resolve(target)``; what it refuses (an unknown GPU, a ``cluster.efficiency`` field the catalog's
    Efficiency does not take: checked there, over the catalog's values) names the plan file it came from."""
    try:
        return creq.resolve(target)
    except ConfigError as err:
        raise UserInputError(f"plan file '{source}': {err}") from None


def load_cluster_request(path: str | Path) -> ClusterRequest:
    """The cluster a plan file was priced on, as a request (``compare`` re-prices the plan on it)."""
    return _cluster_request(_read_json(path), str(path))


def _checked_headroom(entry: dict[str, Any], hbm_gib: float, source: str, where: str) -> float | None:
    """The memory headroom, as a fraction of HBM, that gives back the plan's ``prediction.memory_limit_gib`` (HBM
    less the headroom it was checked against: ``ClusterSpec.memory_limit_gib``); None when the file has none. A
    fraction, because ``memory_headroom`` below 1 reads as one (0.5 GiB would be 50%)."""
    limit = _object_at(entry, "prediction", source, where).get("memory_limit_gib")
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit <= hbm_gib:
        raise UserInputError(f"plan file '{source}': {_at(where, 'prediction.memory_limit_gib')}={limit!r:.40} "
                             f"must be a number of GiB in (0, {hbm_gib:g}], the GPU's HBM")
    return 1.0 - limit / hbm_gib


def _plan_index(index: int | None, n: int, source: str) -> int:
    """0-based position of ``--index`` (1-based, like the table's #1, #2, ...) among ``n`` plans."""
    i = 0 if index is None else index - 1
    if not 0 <= i < n:
        raise UserInputError(f"--index {index} is out of range: plan file '{source}' holds {n} plan(s) "
                             f"(valid: 1..{n})")
    return i


def plan_target(path: str | Path, index: int | None = None) -> str | None:
    """The target a plan file's plan was priced for (``plans[i].target`` / ``prediction.software.target``), so that
    ``emit``/``validate --plan`` without ``--target`` write for the framework the plan was found for; None when the
    plan names none. A malformed file, an ``index`` out of range or a target autoplan does not know is refused."""
    data = _read_json(path)
    entry, where = _plan_entry(data, index, str(path))
    found = entry.get("target")
    if found is None:
        found = _priced_knobs(entry, str(path), where).get("target")
    if found is not None and found not in TARGETS:
        raise UserInputError(f"plan file '{path}': {_at(where, 'target')}={found!r:.40} is not a target autoplan "
                             f"emits; valid: {', '.join(TARGETS)}")
    return found


def _plan_entry(data: dict[str, Any], index: int | None, source: str) -> tuple[dict[str, Any], str]:
    """The plan object ``index`` names (``plans[i]`` of a search result, or the whole estimate result) and where
    it sits (for messages)."""
    if "plans" not in data:
        if index not in (None, 1):
            raise UserInputError(f"--index {index} needs a search result (\"plans\"); '{source}' holds one plan")
        return data, ""
    plans = _require(data, "plans", source, list)
    if not plans:
        raise UserInputError(f"plan file '{source}' holds no plans (the search found none)")
    i = _plan_index(index, len(plans), source)
    if not isinstance(plans[i], dict):
        from autoplan.inputs import json_type

        raise UserInputError(f"plan file '{source}': plans[{i}] must be an object, not {json_type(plans[i])}")
    return plans[i], f"plans[{i}]"


def _at(where: str, key: str) -> str:
    """``key`` inside the plan object at ``where`` ("" for an estimate result), as a message names it."""
    return f"{where}.{key}" if where else key


def _priced_knobs(entry: dict[str, Any], source: str, where: str) -> dict[str, Any]:
    """``entry["prediction"]["software"]`` (the knobs the plan was priced with), each level checked to be an object."""
    pred = _object_at(entry, "prediction", source, where)
    return _object_at(pred, "software", source, _at(where, "prediction")) if pred else {}


def _object_at(parent: dict[str, Any], key: str, source: str, where: str) -> dict[str, Any]:
    """``parent[key]`` of the plan file ``source`` ({} when absent), refused naming where it is unless an object."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        from autoplan.inputs import json_type

        raise UserInputError(f"plan file '{source}': {_at(where, key)} must be an object, not {json_type(value)}")
    return value


def priced_software(knobs: dict[str, Any], what: str | None = None) -> Software:
    """The knobs a plan was priced with (``prediction.software``), as the user would set them: the priced target's
    own knobs only (another target's defaults are not requests), validated strictly (``"yes"`` is not true);
    errors name ``what``."""
    from autoplan.inputs import strict

    prof = PROFILES.get(str(knobs.get("target", "")))
    if prof is None:
        return Software()
    return strict(Software, {k: v for k, v in knobs.items() if k in prof.knobs and v is not None}, what)


def load_plan(path: str | Path, index: int | None = None, target: str | None = None) -> EmitPlan:
    """Read a plan JSON file (``autoplan estimate/search --format json``), its cluster as ``target`` runs on it."""
    return plan_from_dict(_read_json(path), index, source=str(path), target=target)


def emittable_targets(plan: EmitPlan) -> list[Target]:
    """The targets that accept ``plan`` as it is (with the knobs each of them has: another target's knobs are
    not requests there)."""
    from dataclasses import replace

    ok = []
    for t in TARGETS:
        own = {k: v for k, v in plan.software.given().items() if k in PROFILES[t].knobs}
        try:
            _check(replace(plan, software=Software(**own)), t)
        except ConfigError:
            continue
        ok.append(t)
    return ok


def check_emittable(plan: EmitPlan, target: Target) -> None:
    """:func:`_check`, and on a refusal the error names the targets that would take this plan."""
    try:
        _check(plan, target)
    except ConfigError as err:
        if target not in TARGETS:
            raise
        others = [t for t in emittable_targets(plan) if t != target]
        where = (f"this plan can be emitted for --target {' or '.join(others)}" if others
                 else "no target can emit this plan as it is")
        raise type(err)(f"{err}; {where}") from None


def _check(plan: EmitPlan, target: Target) -> None:
    """Refuse a layout the target framework would reject, with the reason it would give.

    The shared hard constraints live in ``cost_models.validate.check_parallel``; Megatron accepts
    ``tp`` a multiple of ``num_kv_heads`` (KV heads replicated) while torchtitan and plain DTensor
    TP shard KV heads and need ``num_kv_heads % tp == 0``."""
    if target not in TARGETS:
        raise ConfigError(f"unknown target '{target}'", valid=TARGETS)
    par = plan.parallel
    prof = PROFILES[target]  # the framework's rules, each citing its source (cost_models.targets)
    refusal = prof.model_error(plan.model)  # first: a model the target builds none of (a hybrid on torchtitan)
    if refusal is not None:
        raise refusal
    if par.schedule == "dualpipe":
        raise ConfigError("schedule 'dualpipe' is priced by `estimate` only (DeepSeek-V3's own framework); "
                          f"no {target} schedule runs it", valid=list(prof.schedules))
    prof.check(plan.model, plan.cluster, plan.job, plan.parallel, plan.runtime(target))
    if (err := prof.seq_len_error(plan.model, plan.job.seq_len)) is not None:
        raise err  # dynamic NTK beyond its length (the estimate's note reads it too); fsdp2: the user's model's RoPE
    # a fact the target's flags or shipped definitions cannot express (Megatron: linear RoPE, fixed llama3 values, an
    # activation / ALiBi / RoPE base without flags; torchtitan: a model it does not ship or cannot configure)
    if errs := prof.emit_model_errors(plan.model):
        raise errs[0]
    if target == "fsdp2":
        from autoplan.emit.fsdp2 import check_fsdp2

        check_fsdp2(plan)
