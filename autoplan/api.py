"""autoplan's Python API: the same requests and responses as the CLI's JSON.

    >>> import autoplan
    >>> r = autoplan.estimate({"model": "llama3-70b", "cluster": {"num_gpus": 1024},
    ...                        "job": {"global_batch_size": 512}, "parallel": {"tp": 8, "pp": 8}})
    >>> r.prediction.fits
    True

``search`` / ``estimate`` take a request model or a plain mapping (see :mod:`autoplan.schema`) and
return pydantic models (``SearchResult``, ``Estimate``: attributes, e.g. ``r.plans[0].parallel.tp``;
``r.model_dump(mode="json")`` is the CLI's ``--format json`` dict). They raise one hierarchy,
``autoplan.AutoplanError``: ``autoplan.InputError`` (bad or malformed input, incl. its subclass
``UserInputError``; the CLI's exit 2) or ``autoplan.InfeasibleError`` (no plan fits; exit 3). :func:`run_line` never raises: it turns any outcome into a
:class:`~autoplan.schema.BatchLine` with a status, which is what ``autoplan batch`` writes.

An :class:`Engine` holds what one process reuses across requests: resolved specs and finished responses
(keyed by the request minus its ``id``; deterministic failures too). Every cache is exact — a hit returns
what a miss would compute — so results never depend on which requests came before. (The planner's own
per-job tables live inside one ``search.planner.search`` call; sharing them across requests needs the
planner to accept them.)
The module-level functions share one default engine per process.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from autoplan.catalog.registry import catalog_model
from autoplan.catalog.spec_file import describe_validation_error, read_mapping
from autoplan.errors import ConfigError, InfeasibleError, UserInputError
from autoplan.request import cluster_record
from autoplan.schema import (MAX_ID_CHARS, MAX_NUM_EXPERTS, MAX_NUM_LAYERS, BatchLine, ClusterRecord, Estimate,
                             EstimateRequest, ModelRecord, Plan, SearchRequest, SearchResult, SearchStats, Status,
                             parse_request, validate_request)
from cost_models.estimate import estimate as estimate_prediction
from cost_models.targets import PROFILES
from cost_models.goodput import goodput
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.validate import with_explicit_split

RequestLike = SearchRequest | EstimateRequest | Mapping[str, Any]
Response = Estimate | SearchResult

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class _Failure:
    error: ConfigError | InfeasibleError


class LRU(Generic[K, V]):
    """A small least-recently-used map that counts its hits and misses."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[K, V] = OrderedDict()

    def get_or_compute(self, key: K, compute: Callable[[], V]) -> V:
        """``compute()`` once per key; a deterministic failure (bad input, infeasible) is remembered too."""
        if key in self._data:
            self.hits += 1
            self._data.move_to_end(key)
            value = self._data[key]
        else:
            self.misses += 1
            try:
                value = compute()
            except (ConfigError, InfeasibleError) as err:
                value = _Failure(err)  # type: ignore[assignment]
            self._data[key] = value
            if len(self._data) > self.maxsize:
                self._data.popitem(last=False)
        if isinstance(value, _Failure):
            raise value.error.with_traceback(None)
        return value

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._data)}


@dataclass(frozen=True)
class Resolved:
    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec


def _reads_files(req: SearchRequest | EstimateRequest) -> bool:
    """Whether the request names a file (model path, cluster profile): such responses are not cached,
    since the file may change between requests."""
    if req.cluster.profile is not None:
        return True
    return isinstance(req.model, str) and catalog_model(req.model) is None


def _bounded(model: ModelSpec) -> ModelSpec:
    from autoplan.catalog.loader import bounded

    return bounded(model)


def _path_like(text: str) -> bool:
    path = Path(text)
    return ("/" in text or "\\" in text or text.startswith("~")
            or path.suffix.lower() in (".json", ".yaml", ".yml") or path.exists())


def _canonical(req: SearchRequest | EstimateRequest) -> str:
    """The response cache's key: the request with the defaults it is answered with written out. An estimate's
    layout takes its target's (``TargetProfile.with_defaults``: torchtitan's ZeRO-3 for an unset ``zero_stage``,
    fsdp2's 'replicate' for an unset ``kv_replication``), so an unset field and the generic default written out,
    answered differently, get different keys."""
    if isinstance(req, EstimateRequest) and req.target in PROFILES:
        req = req.model_copy(update={"parallel": PROFILES[req.target].with_defaults(req.parallel, req.software)})
    return json.dumps(req.model_dump(mode="json", exclude={"id"}), sort_keys=True, separators=(",", ":"))


@dataclass
class Engine:
    """Per-process state reused across requests (see the module docstring). Not thread-safe."""

    max_responses: int = 4096
    max_resolved: int = 512
    allow_files: bool = True
    """False: refuse requests that name files (model paths, cluster profiles) — for services that take
    requests from people who should not make the server read its own disk."""
    max_scorers: int = 64
    progress: Callable[[int, int], None] | None = None
    """Called as the planner visits layouts when a call gives none (``serve`` stops a request past its time
    limit by raising from it)."""
    responses: LRU[str, Response] = field(init=False)
    resolved: LRU[str, Resolved] = field(init=False)
    scorers: LRU[str, Any] = field(init=False)
    """Planner sub-results (layer costs, parameter sums, DP times: ``search.score.Scorer``) per resolved
    (model, cluster, job): requests for the same job with other pins, targets or top-K reuse them."""

    def __post_init__(self) -> None:
        self.responses = LRU(self.max_responses)
        self.resolved = LRU(self.max_resolved)
        self.scorers = LRU(self.max_scorers)

    # ---- resolution ------------------------------------------------------------------------------
    def resolve(self, req: SearchRequest | EstimateRequest) -> Resolved:
        if not self.allow_files:
            if req.cluster.profile is not None:
                raise UserInputError("cluster profiles (files) are not allowed here; give the cluster fields inline")
            if isinstance(req.model, str) and catalog_model(req.model) is None and _path_like(req.model):
                raise UserInputError(f"model files ({req.model!r:.80}) are not allowed here; name a catalog model "
                                     "or give its spec inline")

        def compute() -> Resolved:
            from autoplan.catalog import load_model
            from autoplan.request import with_mtp_layers
            model = with_mtp_layers(load_model(req.model), getattr(req, "mtp_layers", None))
            return Resolved(_bounded(model), req.cluster.resolve(req.target), req.job.spec())
        if _reads_files(req):
            return compute()
        return self.resolved.get_or_compute(_job_key(req), compute)

    def resolve_parts(self, model: Any, cluster: Any, job: JobSpec, target: str = "megatron") -> Resolved:
        """``resolve`` for the parts of a request (``scale`` resolves one cluster size at a time)."""
        probe = SearchRequest(model=model, cluster=cluster.model_dump(), job=job.model_dump(), target=target)
        return self.resolve(probe)

    def scorer_family(self, model: Any, shape: Any, job: JobSpec, make: Callable[[], Any],
                      target: str = "megatron", software: Any = None) -> Any:
        """The cached Scorer a sweep derives every size's from: one per (model, cluster shape, sequence length,
        precision), whatever the GPU count or the global batch."""
        if shape.profile is not None or (isinstance(model, str) and catalog_model(model) is None):
            return make()
        key = json.dumps(["family", model, shape.model_dump(mode="json"), job.seq_len, job.precision,
                          _efficiency_key(target), software.given() if software is not None else {}],
                         sort_keys=True, separators=(",", ":"))
        return self.scorers.get_or_compute(key, make)

    def scale(self, request: Any, *, processes: int = 1) -> Any:
        """The best plan at each GPU count (``autoplan scale``; :mod:`autoplan.capacity`). ``processes`` > 1
        plans the sizes in forked processes (same results; only from a single-threaded program)."""
        from autoplan.capacity import as_scale_request, scale
        req = as_scale_request(request)
        if not self.allow_files and req.cluster.profile is not None:
            raise UserInputError("cluster profiles (files) are not allowed here; give the cluster fields inline")
        key = json.dumps(req.model_dump(mode="json", exclude={"id"}), sort_keys=True, separators=(",", ":"))
        if req.cluster.profile is not None or (isinstance(req.model, str) and catalog_model(req.model) is None):
            return scale(self, req, self.progress, processes)
        return self.responses.get_or_compute(key, lambda: scale(self, req, self.progress, processes))

    def compare(self, request: Any, labels: list[str] | None = None) -> Any:
        """Plans side by side, ranked, with why the best wins (``autoplan compare``; :mod:`autoplan.compare`)."""
        from autoplan.compare import as_compare_request, compare
        return compare(self, as_compare_request(request), labels)

    # ---- the two request kinds ------------------------------------------------------------------
    def estimate(self, request: RequestLike) -> Estimate:
        req = _as(request, EstimateRequest)
        return self._cached(req, lambda: self._estimate(req))  # type: ignore[return-value]

    def search(self, request: RequestLike, *, progress: Callable[[int, int], None] | None = None) -> SearchResult:
        """``progress(done, total)`` is called as the planner visits layouts (not on a cache hit)."""
        req = _as(request, SearchRequest)
        progress = progress or self.progress
        return self._cached(req, lambda: self._search(req, progress))  # type: ignore[return-value]

    def run(self, request: RequestLike) -> Response:
        req = parse_request(request)
        return self.estimate(req) if isinstance(req, EstimateRequest) else self.search(req)

    def _cached(self, req: SearchRequest | EstimateRequest, compute: Callable[[], Response]) -> Response:
        if _reads_files(req):
            return compute()
        return self.responses.get_or_compute(_canonical(req), compute)

    def _estimate(self, req: EstimateRequest) -> Estimate:
        r = self.resolve(req)
        prof = PROFILES[req.target]  # the framework's rules, each citing its source (cost_models.targets)
        # its defaults (torchtitan's ZeRO-3, Muon's 0), layout and knob rules, and the layout it really runs
        # (torchtitan: ZeRO-0 with cp > 1 runs as FSDP)
        prep = prof.prepare(r.model, r.cluster, r.job, req.parallel, req.software)
        par = prep.par
        pred = estimate_prediction(r.model, r.cluster, r.job, prep.runs, check=False, runtime=prep.runtime)
        if prep.note is not None:
            pred = pred.model_copy(update={"software": {**pred.software, "runs_as": prep.note}})
        good = goodput(r.model, r.cluster, par, pred.layers_per_stage, pred.step_time_s, pred.tokens_per_s,
                       req.failures)
        return Estimate(model=_model_record(r.model), cluster=_cluster_record(r.cluster, req), job=r.job,
                        parallel=with_explicit_split(r.model, par), prediction=pred, goodput=good)

    def _search(self, req: SearchRequest, progress: Callable[[int, int], None] | None = None) -> SearchResult:
        from search.sweep import ranked_search  # lazily: the solver stack is slow to import
        r = self.resolve(req)
        scorers = self.target_scorers(req, r)
        pins = req.parallel.given()
        if ({"first_stage_layers", "last_stage_layers"} & set(pins)) and "vp" not in pins:
            pins["vp"] = 1  # uneven first/last stages need vp 1 (Megatron rule): pinning them implies it
        if ({"first_stage_layers", "last_stage_layers"} & set(pins)) and pins.get("pp", 1) == 1:
            raise ConfigError("first_stage_layers / last_stage_layers pin a pipeline split: pin pp > 1 with them "
                              "(--pp)")
        if "pp" in pins and ({"first_stage_layers", "last_stage_layers"} & set(pins)):
            from cost_models.validate import stage_layers  # a split that cannot work is a bad pin (exit 2)
            stage_layers(r.model, ParallelConfig(**{k: pins[k] for k in ("pp", "vp", "first_stage_layers",
                                                                          "last_stage_layers") if k in pins}))
        found, goods = ranked_search(r.model, r.cluster, r.job, target=req.target, pins=pins,
                                     top_k=req.top, rank_by=req.rank_by, failures=req.failures, progress=progress,
                                     scorer=scorers)
        return SearchResult(model=_model_record(r.model), cluster=_cluster_record(r.cluster, req), job=r.job,
                            plans=[Plan.model_validate({**p.model_dump(), "goodput": g})
                                   for p, g in zip(found.plans, goods)],
                            search=SearchStats(candidates=found.candidates, evaluated=found.evaluated,
                                               pruned=found.pruned, wall_time_s=found.wall_time_s,
                                               target=req.target, rank_by=req.rank_by,
                                               ilp_solves=found.ilp_solves, ilp_cache_hits=found.ilp_cache_hits))

    def target_scorers(self, req: SearchRequest, r: Resolved) -> dict[str, Any]:
        """The Scorer (``search.score``) of each target the search runs, on the cluster as that target runs on
        it (``ClusterRequest.resolve(target)``: its profile's efficiency set), cached per job, efficiency set and
        knobs. ``any``: every target that has the knobs the user set (none has them all: the first target's error)."""
        from search.score import Scorer
        targets = search_targets(req.target)
        usable: list[str] = []
        first: ConfigError | None = None
        for t in targets:
            try:
                PROFILES[t].resolve(req.software, r.job, r.cluster)  # a knob the target lacks: error before the search
            except ConfigError as err:
                first = first or err
                continue
            usable.append(t)
        if not usable:
            assert first is not None
            if len(targets) > 1:
                raise ConfigError(f"no target runs the knobs {req.software.given()} ({first})")
            raise first
        out: dict[str, Any] = {}
        for t in usable:
            treq = req.model_copy(update={"target": t})
            rt = r if t == req.target else self.resolve(treq)

            def new_scorer(rt: Resolved = rt) -> Scorer:
                return Scorer(rt.model, rt.cluster, rt.job, software=req.software)
            key = _job_key(treq) + json.dumps(req.software.given(), sort_keys=True)
            out[t] = new_scorer() if _reads_files(req) else self.scorers.get_or_compute(key, new_scorer)
        return out

    def stats(self) -> dict[str, Any]:
        """Cache counters: finished responses, resolved specs, planner sub-results (scorers)."""
        return {"responses": self.responses.stats(), "resolved": self.resolved.stats(),
                "scorers": self.scorers.stats()}


def search_targets(target: str) -> tuple[str, ...]:
    """The targets a search for ``target`` ranks plans of: ``any`` = every target profile."""
    return tuple(PROFILES) if target == "any" else (target,)


def _efficiency_key(target: str) -> str | None:
    """The efficiency set a target's cluster takes (``target_efficiency``); None: the generation's. Targets that
    share a set share resolved specs and scorers."""
    from autoplan.catalog.cluster import target_efficiency
    from cost_models.targets import framework_of, sdpa_cudnn_first
    if not target_efficiency(target):
        return None
    cudnn = sdpa_cudnn_first(target)  # profiles of one set differ in the attention kernel they run
    return f"{framework_of(target)}/cudnn:{','.join(cudnn)}" if cudnn else framework_of(target)


def _job_key(req: SearchRequest | EstimateRequest) -> str:
    """What fixes the resolved specs: the model, cluster and job fields of a request, and the efficiency
    parameters its target sets over the GPU generation's (targets without any share one key)."""
    return json.dumps([req.model, req.cluster.model_dump(mode="json"), req.job.model_dump(mode="json"),
                       _efficiency_key(req.target), getattr(req, "mtp_layers", None)],
                      sort_keys=True, separators=(",", ":"))


def _as(request: RequestLike, cls: type[SearchRequest] | type[EstimateRequest]) -> Any:
    if isinstance(request, cls):
        return request
    if isinstance(request, (SearchRequest, EstimateRequest)):
        raise UserInputError(f"expected a {cls.__name__}, got a {type(request).__name__}")
    if not isinstance(request, Mapping):
        hint = ""
        if isinstance(request, (str, os.PathLike)):  # a model name or file where the request was meant
            hint = (f"; a model goes in it as {{\"model\": {json.dumps(str(request)[:80])}, \"cluster\": {{\"num_gpus\": ...}}}} "
                    "and a request file is read with autoplan.load_request(path)")
        raise UserInputError(f"a request must be a mapping, got {type(request).__name__}{hint}")
    data = dict(request)
    kind = cls.model_fields["kind"].default
    if data.setdefault("kind", kind) != kind:
        raise UserInputError(f"request kind is {data['kind']!r}; call {data['kind']}() for it")
    return validate_request(cls, data)


def _model_record(model: ModelSpec) -> ModelRecord:
    return ModelRecord(name=model.name, spec=model)


def _cluster_record(cluster: ClusterSpec, req: Any = None) -> ClusterRecord:
    """The cluster as responses report it; ``req`` (any request with a ``cluster``) tells a profile apart."""
    from autoplan.catalog.registry import efficiency_is_prior

    asked = getattr(req, "cluster", None)
    fields = asked.efficiency_fields() if asked is not None else None
    profiled = fields is not None and (asked.profile is not None or bool(fields))  # an inline {} changes nothing
    basis = ("profile" if profiled else
             "prior" if efficiency_is_prior(cluster.gpu) else "fitted")
    return ClusterRecord(**cluster_record(cluster), efficiency_basis=basis, efficiency=fields)


# ==== module-level API (one default engine per process) ============================================
_DEFAULT: list[Engine] = []


def default_engine() -> Engine:
    if not _DEFAULT:
        _DEFAULT.append(Engine())
    return _DEFAULT[0]


def estimate(request: RequestLike) -> Estimate:
    """Score one parallel configuration (``autoplan estimate``)."""
    return default_engine().estimate(request)


def search(request: RequestLike, *, progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """The best plans for a job (``autoplan search``); ``progress(done, total)`` as layouts are visited."""
    return default_engine().search(request, progress=progress)


def scale(request: Any, *, processes: int = 1) -> Any:
    """The best plan at each GPU count of a sweep (``autoplan scale``): a ``ScaleRequest`` or mapping in, a
    ``ScaleResult`` out (:mod:`autoplan.capacity`). ``processes`` > 1 forks (single-threaded callers only)."""
    return default_engine().scale(request, processes=processes)


def compare(request: Any, labels: list[str] | None = None) -> Any:
    """Two or more plans (estimate requests) side by side: a ``CompareRequest`` or mapping in, a
    ``CompareResult`` out (:mod:`autoplan.compare`)."""
    return default_engine().compare(request, labels)


def run(request: RequestLike) -> Response:
    """``search`` or ``estimate`` by the request's ``kind`` (default ``search``)."""
    return default_engine().run(request)


def resolve(request: RequestLike) -> Resolved:
    """The specs a request names (model, cluster, job), as the engine resolves them."""
    return default_engine().resolve(parse_request(request) if isinstance(request, Mapping) else request)


def load_request(path: str | Path) -> SearchRequest | EstimateRequest:
    """A request from a JSON or YAML file (YAML through ``safe_load``)."""
    from autoplan.inputs import user_path

    return parse_request(read_mapping(user_path(path)))


# ==== outcomes as statuses (batch lines) ==========================================================
def classify(err: BaseException) -> tuple[Status, str]:
    """The batch status and one-line message of an exception."""
    if isinstance(err, ValidationError):
        return "invalid", describe_validation_error(err)
    if isinstance(err, InfeasibleError):
        return "infeasible", _one_line(str(err))
    if isinstance(err, (ConfigError, json.JSONDecodeError, RecursionError)):
        return "invalid", _one_line(str(err) or type(err).__name__)
    return "error", _one_line(f"internal error ({type(err).__name__}): {err}")


def _one_line(text: str, limit: int = 2000) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_line(engine: Engine, data: Any, line: int) -> BatchLine:
    """Run one parsed batch line; never raises (every outcome becomes a status)."""
    rid = peek_id(data)
    kind = _peek_kind(data)
    try:
        req = parse_request(data)
        result = engine.run(req)
    except Exception as err:  # noqa: BLE001 — a batch isolates every failure into its line
        status, message = classify(err)
        return BatchLine(id=rid, line=line, kind=kind, status=status, message=message)
    return BatchLine(id=req.id, line=line, kind=req.kind, status="ok", result=result)


def peek_id(data: Any) -> str | None:
    """The id of a parsed line, if it has a usable one (echoed even when the line is invalid)."""
    rid = data.get("id") if isinstance(data, dict) else None
    if not isinstance(rid, str):
        return None
    rid = rid[:MAX_ID_CHARS]
    try:
        rid.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape ("\ud800") cannot be written back out
        return None
    return rid


def _peek_kind(data: Any) -> Any:
    kind = data.get("kind", "search") if isinstance(data, dict) else None
    return kind if kind in ("search", "estimate") else None
