"""Request and response models of autoplan's JSON contract (CLI ``--format json``, Python API, ``batch`` lines).

One request shape serves ``estimate``, ``search`` and every line of ``autoplan batch``::

    {"id": "job-1", "kind": "search",                      # "search" (default) | "estimate"
     "model": "llama3-70b",                                # catalog name | HF config.json / spec path | {spec}
     "cluster": {"gpu": "h100-sxm", "num_gpus": 1024, "gpus_per_node": 8, "inter_node_gbps": 400},
     "job": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16"},
     "parallel": {"tp": 8, "pp": 8},                       # estimate: the layout; search: degrees to pin
     "target": "megatron",                                 # framework (search also: any)
     "software": {"grad_reduce_dtype": "bf16"},            # knobs (cost_models.targets.Software; omitted: defaults)
     "top": 3}                                             # search only: plans kept

Omitted fields take the defaults documented on each field (``JobSpec``: 1024 sequences of 8192 tokens, bf16;
cluster: ``h100-sxm`` with the catalog's node size, NVLink domain and NIC; ``ParallelConfig``: tp = pp = 1,
ZeRO-1, no recompute, 1F1B). Every response carries ``version``. ``autoplan schema`` prints the JSON Schema
of all of these (:func:`json_schema`).

Sizes are bounded (``MAX_NUM_GPUS``, ``MAX_GLOBAL_BATCH_SIZE``, ``MAX_SEQ_LEN``, ``MAX_TOP``, and after loading
``MAX_NUM_LAYERS``, ``MAX_NUM_EXPERTS``) so that no request can make the planner enumerate an absurd space;
nothing in a request is ever executed.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, SerializerFunctionWrapHandler, field_serializer,
                      field_validator, model_validator)

from autoplan import __version__
from autoplan.errors import UserInputError
from autoplan.inputs import MAX_NUM_EXPERTS, MAX_NUM_LAYERS, json_type  # noqa: F401  (limits: checked when a model is loaded)
from autoplan.request import MAX_NUM_GPUS, ClusterRequest
from cost_models.estimate import Prediction
from cost_models.goodput import FailureModel, Goodput
from cost_models.specs import (JobSpec, ModelSpec, ParallelConfig, Precision, Recompute, RecomputeModule, Schedule,
                               canonical_recompute_modules, modules_imply_selective, recompute_modules_error,
                               recompute_modules_list, zero_stage_is_not_a_bool)
from cost_models.targets import Software

MAX_GLOBAL_BATCH_SIZE = 1 << 24
MAX_SEQ_LEN = 1 << 24
MAX_TOP = 50
MAX_ID_CHARS = 256

Status = Literal["ok", "infeasible", "invalid", "error"]
Target = Literal["megatron", "torchtitan", "fsdp2", "any"]
FrameworkTarget = Literal["megatron", "torchtitan", "fsdp2"]
ESTIMATE_ANY = ("'any' is search's target (the best plans of every framework); estimate prices one framework's run "
                "of the layout, with its rules, runtime and efficiency set; valid: megatron, torchtitan, fsdp2")
RankBy = Literal["step", "goodput"]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


# ==== requests =====================================================================================
class JobRequest(_Strict):
    """The training job (``JobSpec`` with request-size bounds)."""

    global_batch_size: int = Field(default=JobSpec.model_fields["global_batch_size"].default, gt=0,
                                   le=MAX_GLOBAL_BATCH_SIZE, description="sequences per optimizer step")
    seq_len: int = Field(default=JobSpec.model_fields["seq_len"].default, gt=0, le=MAX_SEQ_LEN,
                         description="tokens per sequence")
    precision: Precision = Field(default="bf16", description="GEMM precision")
    optimizer: Literal["adam"] = "adam"

    def spec(self) -> JobSpec:
        return JobSpec(**self.model_dump())


class ClusterRequestBounded(ClusterRequest):
    """``ClusterRequest`` with ``num_gpus`` bounded (a request line may not ask for a million nodes)."""

    num_gpus: int = Field(gt=0, le=MAX_NUM_GPUS, description="number of GPUs", examples=[8, 64])


def _model_source(value: Any) -> Any:
    """A model is a name/path or a mapping; anything else is one message in those terms (not pydantic's two
    union branches, ``model.str: ...; model.dict[str,any]: ...``)."""
    if isinstance(value, (str, dict)):
        return value
    if isinstance(value, os.PathLike) and isinstance(os.fspath(value), str):  # a pathlib.Path: the file it names
        return os.fspath(value)
    raise ValueError("must be a catalog name (see `autoplan models`), a model file path (str or pathlib.Path) or a "
                     "mapping of model fields" + (", not a list" if isinstance(value, list) else ""))


ModelSource = Annotated[Union[str, dict[str, Any]], BeforeValidator(_model_source)]
MODEL_DESCRIPTION = ("catalog name (see `autoplan models`), path to a Hugging Face config.json or an autoplan "
                     "spec YAML/JSON, or an inline mapping of ModelSpec fields (or of a parsed HF config)")


class ParallelPins(_Strict):
    """Degrees and options a search must keep (every field optional; omitted = searched)."""

    tp: int | None = Field(default=None, gt=0, description="tensor-parallel degree")
    pp: int | None = Field(default=None, gt=0, description="pipeline stages")
    cp: int | None = Field(default=None, gt=0, description="context-parallel degree")
    ep: int | None = Field(default=None, gt=0, description="expert-parallel degree; divides tp*cp*dp (expert-TP 1)")
    vp: int | None = Field(default=None, gt=0, description="virtual stages per pipeline rank")
    micro_batch_size: int | None = Field(default=None, gt=0, description="sequences per micro-batch")
    sequence_parallel: bool | None = None
    zero_stage: Literal[0, 1, 2, 3] | None = None
    hsdp_shard_size: int | None = Field(default=None, gt=0, description="HSDP shard-group size")
    recompute: Recompute | None = None
    schedule: Schedule | None = None
    first_stage_layers: int | None = Field(default=None, gt=0)
    last_stage_layers: int | None = Field(default=None, gt=0)
    account_for_embedding_in_pipeline_split: bool | None = Field(
        default=None, description="the embedding counts as a layer of the pipeline split (Megatron)")
    account_for_loss_in_pipeline_split: bool | None = Field(
        default=None, description="the output layer and loss count as a layer of the pipeline split (Megatron)")
    recompute_modules: tuple[RecomputeModule, ...] | None = Field(
        default=None, description="Megatron --recompute-modules every plan uses (implies recompute 'selective'; "
        "targets that run them: megatron); ParallelConfig.recompute_modules' rules")

    _zero_stage_is_not_a_bool = field_validator("zero_stage", mode="before")(zero_stage_is_not_a_bool)
    # estimate's rules for the field (cost_models.specs), applied as ParallelConfig applies them
    _modules_list = field_validator("recompute_modules", mode="before")(recompute_modules_list)
    _canonical_modules = field_validator("recompute_modules", mode="after")(canonical_recompute_modules)

    @model_validator(mode="before")
    @classmethod
    def _modules_imply_selective(cls, data: Any) -> Any:
        return modules_imply_selective(data)

    @model_validator(mode="after")
    def _modules_need_selective(self) -> "ParallelPins":
        if (err := recompute_modules_error(self.recompute, self.recompute_modules)) is not None:
            raise ValueError(err)
        return self

    def given(self) -> dict[str, Any]:
        """The pinned fields only (an accounting switch set false is Megatron's default, not a pin)."""
        return {k: v for k, v in self.model_dump(exclude_none=True).items()
                if v is not False or not k.startswith("account_for_")}


class _RequestBase(_Strict):
    id: str | None = Field(default=None, max_length=MAX_ID_CHARS,
                           description="caller's id, echoed in the response line of a batch")
    model: ModelSource = Field(description=MODEL_DESCRIPTION, examples=["llama3-8b", "llama3-70b"])
    cluster: ClusterRequestBounded
    job: JobRequest = Field(default_factory=JobRequest)
    failures: FailureModel = Field(default_factory=FailureModel,
                                   description="interruptions, checkpoint storage and restarts (goodput)")


class EstimateRequest(_RequestBase):
    """Score one parallel configuration."""

    kind: Literal["estimate"] = "estimate"
    parallel: ParallelConfig = Field(default_factory=ParallelConfig,
                                     description="the layout to score (ParallelConfig defaults for omitted fields, "
                                     "except the target's own: torchtitan and fsdp2 ZeRO-3, fsdp2 kv_replication "
                                     "'replicate')")
    target: FrameworkTarget = Field(default="megatron", description="framework that runs the layout: its rules "
                                    "(cost_models.targets) refuse what it cannot run; it is priced as it runs")
    software: Software = Field(default_factory=Software, description="the target's knobs (omitted: its defaults; a "
                               "knob the target lacks is an error naming the target's knobs)")
    mtp_layers: int | None = Field(default=None, ge=0, le=16, description="multi-token-prediction modules trained "
                                   "(Megatron --mtp-num-layers), overriding the model's; 0 trains without MTP")

    @field_validator("target", mode="before")
    @classmethod
    def _not_any(cls, v: Any) -> Any:
        if v == "any":
            raise ValueError(ESTIMATE_ANY)
        return v


class SearchRequest(_RequestBase):
    """Find the best parallel configurations."""

    kind: Literal["search"] = "search"
    parallel: ParallelPins = Field(default_factory=ParallelPins, description="degrees to pin")
    top: int = Field(default=3, gt=0, le=MAX_TOP, description="how many plans to return")
    target: Target = Field(default="megatron", description="keep plans the named framework can run; any: the best "
                           "plans some target runs, each priced as its target runs it (plans[].target)")
    rank_by: RankBy = Field(default="step", description="rank by step time, or by tokens/s after failures")
    software: Software = Field(default_factory=Software, description="the target's knobs (omitted: its defaults; a "
                               "knob the target lacks is an error naming the target's knobs; any: only the targets that have them)")



R = TypeVar("R", bound=BaseModel)

REQUEST_KINDS: dict[str, type[SearchRequest] | type[EstimateRequest]] = {"search": SearchRequest,
                                                                          "estimate": EstimateRequest}


def parse_request(data: Any) -> SearchRequest | EstimateRequest:
    """Validate a request mapping (raises ``UserInputError`` naming the field, the value and the rule).

    Dispatches on ``kind`` by hand (absent: ``search``), so error locations read ``parallel.tp``."""
    if isinstance(data, (SearchRequest, EstimateRequest)):
        return data
    if not isinstance(data, dict):
        raise UserInputError(f"a request must be a JSON object, got {json_type(data)}")
    kind = data.get("kind", "search")
    cls = REQUEST_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise UserInputError(f"kind must be 'search' or 'estimate', got {kind!r:.60}")
    return validate_request(cls, data)


def validate_request(cls: type[R], data: Any) -> R:
    """``cls`` from a mapping in strict mode, after the input checks of :mod:`autoplan.inputs` (depth,
    finite numbers, valid Unicode); raises :class:`InvalidRequestError` (a ``UserInputError``)."""
    from autoplan.inputs import strict

    return strict(cls, data)


# ==== responses ====================================================================================
class ModelRecord(_Strict):
    name: str
    spec: ModelSpec = Field(description="the resolved spec; unset optional fields are omitted")

    @field_serializer("spec", mode="wrap")
    def _spec_without_nones(self, spec: ModelSpec, handler: SerializerFunctionWrapHandler) -> Any:
        return {k: v for k, v in handler(spec).items() if v is not None}


# Where a prediction's efficiencies come from (ClusterRecord.efficiency_basis; plan files are checked against it).
EfficiencyBasis = Literal["fitted", "prior", "profile"]


class ClusterRecord(_Strict):
    gpu: str
    num_gpus: int
    gpus_per_node: int
    inter_node_gbps: float = Field(description="scale-out Gbit/s per GPU")
    nvlink_domain_size: int
    efficiency_basis: EfficiencyBasis = Field(
        default="fitted", description="where the efficiencies behind every prediction come from: fitted to "
        "published runs of this GPU, priors (no measured run: calibrate before trusting), or a cluster profile")
    efficiency: dict[str, Any] | None = Field(
        default=None, description="the Efficiency fields a cluster profile (or the request's cluster.efficiency) set "
        "over the catalog's; None: none. A plan file keeps them: `emit --plan` and `compare` price it on this cluster")


class _Response(_Strict):
    version: str = Field(default=__version__, description="autoplan version that produced this response")
    model: ModelRecord
    cluster: ClusterRecord
    job: JobSpec


class Estimate(_Response):
    """The ``estimate`` response (``autoplan estimate --format json``)."""

    parallel: ParallelConfig
    prediction: Prediction
    goodput: Goodput | None = Field(default=None, description="after failures, checkpoints and restarts")


class Plan(_Strict):
    rank: int = Field(ge=1, description="1 = best")
    parallel: ParallelConfig
    prediction: Prediction
    explanation: str = Field(description="why this plan beats the next one")
    goodput: Goodput | None = Field(default=None, description="after failures, checkpoints and restarts")
    op_shardings: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="decoder layer kind → op → tensor-parallel mode the intra-op ILP chose "
                                          "(col/row[_sp], F heads, S/seq sequence-sharded, R replicated)")
    target: FrameworkTarget = Field(default="megatron", description="the framework that runs this plan: it is "
                                    "priced with that target's runtime, knobs and efficiency set, and `emit` writes "
                                    "for it (with search target any, the target each plan came from)")


class SearchStats(_Strict):
    candidates: int = Field(description="layouts that passed the structural checks")
    evaluated: int = Field(description="layouts whose stage split was chosen and scored")
    pruned: dict[str, int] = Field(description="layouts cut, by reason")
    wall_time_s: float = Field(description="planner time for this request (the one field that varies run to run)")
    target: Target
    rank_by: RankBy = "step"
    ilp_solves: int = Field(default=0, description="intra-op ILP solves this search ran")
    ilp_cache_hits: int = Field(default=0, description="layer requests answered from the ILP cache")


class EmitReport(_Strict):
    """What ``search --emit DIR`` wrote for plan #1 (or why it could not)."""

    target: str = Field(description="the framework the files are for")
    dir: str
    files: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="where the target cannot follow the plan exactly "
                             "(what the emitter changed)")
    error: str | None = Field(default=None, description="why nothing was written (the search result stands)")


class SearchResult(_Response):
    """The ``search`` response (``autoplan search --format json``): plans best first."""

    plans: list[Plan]
    search: SearchStats
    emitted: EmitReport | None = Field(default=None, description="search --emit only")


class BatchLine(_Strict):
    """One output line of ``autoplan batch``: the input line's ``id`` and its outcome."""

    version: str = Field(default=__version__)
    id: str | None = Field(description="the request's id (null when the line had none or was unreadable)")
    line: int = Field(ge=1, description="1-based line number in the input")
    kind: Literal["search", "estimate"] | None = None
    status: Status
    result: SearchResult | Estimate | None = Field(default=None, description="present when status is ok")
    message: str | None = Field(default=None, description="why the line is not ok (one line)")


class BatchSummary(_Strict):
    version: str = Field(default=__version__)
    total: int
    counts: dict[str, int] = Field(description="lines per status")
    wall_s: float
    plans_per_s: float = Field(description="ok lines answered per second of wall time")
    lines_per_s: float = Field(description="all lines answered per second of wall time")
    cache: dict[str, Any] = Field(default_factory=dict, description="hits, misses, hit_rate over all workers")


def json_schema() -> dict[str, Any]:
    """JSON Schema of every request and response, as ``autoplan schema`` prints it.

    ``request`` dispatches on ``kind`` the way :func:`parse_request` does (absent means ``search``);
    ``responses`` names the shape of each output."""
    from autoplan.calibrate import MeasuredRun

    defs: dict[str, Any] = {}
    scale_request, _ = _capacity()
    for model in (SearchRequest, EstimateRequest, MeasuredRun, Estimate, SearchResult, BatchLine, BatchSummary,
                  *_capacity()):
        mode = ("validation" if model in (SearchRequest, EstimateRequest, MeasuredRun, scale_request)
                else "serialization")
        s = model.model_json_schema(mode=mode, ref_template="#/$defs/{model}")
        defs.update(s.pop("$defs", {}))
        defs[model.__name__] = s
    request = {
        "description": "a search or estimate request, by kind (default search)",
        "if": {"type": "object", "properties": {"kind": {"const": "estimate"}}, "required": ["kind"]},
        "then": {"$ref": "#/$defs/EstimateRequest"},
        "else": {"$ref": "#/$defs/SearchRequest"},
    }
    responses = {name: {"$ref": f"#/$defs/{model.__name__}"} for name, model in _responses().items()}
    calibrate_run = {"description": "one line of an `autoplan calibrate` runs file (JSON Lines; blank lines and "
                                     "lines starting with # are skipped)", "$ref": "#/$defs/MeasuredRun"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "autoplan",
        "description": f"autoplan {__version__} requests and responses",
        "version": __version__,
        "request": request,
        "scale_request": {"$ref": "#/$defs/ScaleRequest"},
        "responses": responses,
        "calibrate_run": calibrate_run,
        "$defs": defs,
    }


RESPONSES: dict[str, type[BaseModel]] = {"estimate": Estimate, "search": SearchResult, "batch_line": BatchLine,
                                         "batch_summary": BatchSummary}
SCHEMA_PARTS = ("request", "scale_request", "calibrate_run", *RESPONSES, "scale")


def _capacity() -> tuple[type[BaseModel], type[BaseModel]]:
    """``scale``'s request and response (:mod:`autoplan.capacity`, which builds on this module)."""
    from autoplan.capacity import ScaleRequest, ScaleResult
    return ScaleRequest, ScaleResult


def _responses() -> dict[str, type[BaseModel]]:
    return {**RESPONSES, "scale": _capacity()[1]}


def schema_for(name: str) -> dict[str, Any]:
    """A standalone schema for one of ``SCHEMA_PARTS`` (``request``, ``scale_request``, ``calibrate_run``,
    ``estimate``, ``search``, ``batch_line``, ``batch_summary``, ``scale``): that entry at the root, with every
    definition beside it."""
    full = json_schema()
    if name in ("request", "calibrate_run"):
        root = full[name]
    elif name == "scale_request":
        root = full["$defs"]["ScaleRequest"]
    else:
        root = full["$defs"][_responses()[name].__name__]
    return {"$schema": full["$schema"], **root, "$defs": full["$defs"]}
