"""`autoplan serve`: autoplan behind HTTP (FastAPI + uvicorn, the optional ``serve`` extra).

Endpoints: ``POST /v1/search``, ``/v1/estimate``, ``/v1/scale`` (one JSON request each, as ``autoplan schema``
describes), ``POST /v1/batch`` (NDJSON in, NDJSON out as it is answered, in input order, one line per request
line: ``autoplan batch``'s lines), ``GET /v1/models``, ``/v1/hardware``, ``/healthz``; the OpenAPI document
at ``/openapi.json`` is generated from the same pydantic models as ``autoplan schema``.

Outcomes: an answered request is 200 with ``status`` ``ok`` and the ``result``, or ``infeasible`` with the
``message`` and ``hint`` the CLI prints; a bad request is 4xx with ``status: invalid`` and the CLI's one-line
``message`` (400 unreadable JSON, 413 too large, 422 invalid); 503 when the queue is full, 504 past the time
limit. Work runs in a bounded pool of threads, each with its own ``Engine`` (engines are not thread-safe);
a search past its time limit is stopped at the planner's next progress call.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from autoplan import __version__
from autoplan.api import Engine, classify
from autoplan.batch.reader import Limits, Line, answer, read_lines
from autoplan.capacity import ScaleRequest, ScaleResult
from autoplan.errors import ConfigError, InfeasibleError, UserInputError
from autoplan.inputs import decode_text, json_type, parse_json
from autoplan.schema import BatchLine, Estimate, EstimateRequest, SearchRequest, SearchResult, validate_request

MIB = 1 << 20


@dataclass(frozen=True)
class ServeConfig:
    workers: int = 2
    max_body_bytes: int = MIB
    max_batch_lines: int = 1000
    time_limit_s: float = 60.0
    max_queue: int = 256
    """requests admitted (running or waiting) beyond the workers; more are answered 503"""
    allow_files: bool = False
    """let requests name files on the server (model paths, cluster profiles)"""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Problem(_Strict):
    """A request that was not answered: ``status`` and the one-line message the CLI prints."""

    version: str = __version__
    status: Literal["invalid", "error"]
    message: str


class _Outcome(_Strict):
    version: str = __version__
    id: str | None = Field(default=None, description="the request's id")
    status: Literal["ok", "infeasible"]
    message: str | None = Field(default=None, description="infeasible: why (one line, as the CLI prints it)")
    hint: str | None = Field(default=None, description="infeasible: what would work (e.g. the smallest cluster)")


class SearchOutcome(_Outcome):
    result: SearchResult | None = None


class EstimateOutcome(_Outcome):
    result: Estimate | None = None


class ScaleOutcome(_Outcome):
    result: ScaleResult | None = None


class Health(_Strict):
    status: Literal["ok"] = "ok"
    version: str = __version__
    workers: int
    in_flight: int


class _Deadline(Exception):
    pass


class _HTTPProblem(Exception):
    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


class Pool:
    """Bounded worker threads, one Engine each, a per-request time limit and an admission limit."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self._executor = ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="autoplan")
        self._local = threading.local()
        self._lock = threading.Lock()
        self.in_flight = 0

    def _engine(self) -> Engine:
        engine = getattr(self._local, "engine", None)
        if engine is None:
            engine = self._local.engine = Engine(allow_files=self.cfg.allow_files)
        return engine

    def admit(self, n: int = 1) -> None:
        with self._lock:
            if self.in_flight + n > self.cfg.workers + self.cfg.max_queue:
                raise _HTTPProblem(503, "error", f"server busy: {self.in_flight} requests in flight "
                                                 f"(limit {self.cfg.workers + self.cfg.max_queue}); retry later")
            self.in_flight += n

    def release(self, n: int = 1) -> None:
        with self._lock:
            self.in_flight -= n

    async def run(self, work: Callable[[Engine], Any]) -> Any:
        """``work(engine)`` on a worker under the time limit (raises ``_Deadline`` past it)."""
        limit = self.cfg.time_limit_s
        deadline = time.monotonic() + limit

        def task() -> Any:
            engine = self._engine()

            def check(done: int, total: int) -> None:
                del done, total
                if time.monotonic() > deadline:
                    raise _Deadline()
            engine.progress = check
            try:
                if time.monotonic() > deadline:  # waited in the queue past the limit
                    raise _Deadline()
                return work(engine)
            finally:
                engine.progress = None
        future = asyncio.get_running_loop().run_in_executor(self._executor, task)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout=limit + 1.0)
        except asyncio.TimeoutError:
            raise _Deadline() from None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _time_limit_message(cfg: ServeConfig) -> str:
    return f"the request ran past the time limit of {cfg.time_limit_s:g} s (--time-limit); narrow it or split it"


def create_app(cfg: ServeConfig | None = None) -> FastAPI:
    """The FastAPI application (``uvicorn`` serves it; tests may too)."""
    cfg = cfg or ServeConfig()
    pool = Pool(cfg)
    app = FastAPI(title="autoplan", version=__version__,
                  description="Parallelism plans for large-model training: search, estimate, scale and batch "
                              "requests as `autoplan schema` describes them.")
    app.state.pool = pool
    app.state.config = cfg
    app.router.on_shutdown.append(pool.shutdown)
    errors: dict[int | str, dict[str, Any]] = {
        code: {"model": Problem, "description": text} for code, text in
        ((400, "unreadable JSON"), (413, "request too large"), (422, "invalid request (one-line message)"),
         (503, "server busy"), (504, "past the time limit"))}

    @app.exception_handler(_HTTPProblem)
    async def _problem(request: Request, exc: _HTTPProblem) -> JSONResponse:
        del request
        return JSONResponse(Problem(status=exc.status, message=exc.message).model_dump(mode="json"),  # type: ignore[arg-type]
                            status_code=exc.code, headers={"Retry-After": "1"} if exc.code == 503 else None)

    async def body_json(request: Request) -> Any:
        raw = await _read_body(request, cfg.max_body_bytes)
        try:
            return parse_json(decode_text(raw, "the request body"), "the request body")
        except UserInputError as err:
            raise _HTTPProblem(400, "invalid", " ".join(str(err).split())) from None

    async def answer_one(request: Request, kind: str, work: Callable[[Engine, Any], Any],
                         outcome: type[_Outcome]) -> Any:
        data = await body_json(request)
        if isinstance(data, dict):
            data.setdefault("kind", kind)
        rid = data.get("id") if isinstance(data, dict) and isinstance(data.get("id"), str) else None
        pool.admit()
        try:
            result = await pool.run(lambda engine: work(engine, data))
        except _Deadline:
            raise _HTTPProblem(504, "error", _time_limit_message(cfg)) from None
        except InfeasibleError as err:
            msg = " ".join(str(err.args[0] if err.args else err).split())
            return outcome(id=rid, status="infeasible", message=_strip_hint(msg, err.hint), hint=err.hint)
        except Exception as err:  # noqa: BLE001 — every failure is one line, never a traceback
            status, message = classify(err)
            code = 422 if status == "invalid" else 500
            raise _HTTPProblem(code, status, message) from None
        finally:
            pool.release()
        return outcome(id=rid, status="ok", result=result)

    def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
        return {"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}

    @app.post("/v1/search", response_model=SearchOutcome, responses=errors, openapi_extra=_body_doc(SearchRequest))
    async def search(request: Request) -> Any:
        """The best plans for a job (`autoplan search`)."""
        return await answer_one(request, "search", lambda e, d: e.search(_as(d, SearchRequest)), SearchOutcome)

    @app.post("/v1/estimate", response_model=EstimateOutcome, responses=errors,
              openapi_extra=_body_doc(EstimateRequest))
    async def estimate(request: Request) -> Any:
        """Score one parallel configuration (`autoplan estimate`)."""
        return await answer_one(request, "estimate", lambda e, d: e.estimate(_as(d, EstimateRequest)),
                                EstimateOutcome)

    @app.post("/v1/scale", response_model=ScaleOutcome, responses=errors, openapi_extra=_body_doc(ScaleRequest))
    async def scale(request: Request) -> Any:
        """The best plan at each GPU count of a sweep (`autoplan scale`)."""
        return await answer_one(request, "scale", lambda e, d: e.scale(_as(d, ScaleRequest)), ScaleOutcome)

    @app.post("/v1/batch", responses={**errors, 200: {"description": "one BatchLine (JSON) per request line, in "
                                                                     "input order", "content": {
                                                                         "application/x-ndjson": {}}}},
              openapi_extra={"requestBody": {"required": True, "content": {"application/x-ndjson": {
                  "schema": {"type": "array", "description": "one search or estimate request per line",
                             "items": {"oneOf": [{"$ref": "#/components/schemas/SearchRequest"},
                                                 {"$ref": "#/components/schemas/EstimateRequest"}]}}}}}})
    async def batch(request: Request) -> StreamingResponse:
        """NDJSON requests in, NDJSON `BatchLine`s out as they are answered, in input order."""
        raw = await _read_body(request, cfg.max_body_bytes)
        limits = Limits(max_line_bytes=cfg.max_body_bytes, max_lines=cfg.max_batch_lines,
                        max_total_bytes=cfg.max_body_bytes)
        try:
            lines = read_lines(io.BytesIO(raw), limits, name="the batch")
        except UserInputError as err:
            raise _HTTPProblem(413, "invalid", str(err).replace("(--max-lines)", "(--max-batch-lines)")
                               .replace("(--max-bytes)", "(--max-body-bytes)")) from None
        pool.admit(len(lines))
        futures = [asyncio.ensure_future(_answer_line(pool, cfg, line)) for line in lines]

        async def stream() -> AsyncIterator[bytes]:
            try:
                for fut in futures:
                    yield (await fut).encode("utf-8") + b"\n"
            finally:
                for fut in futures:
                    fut.cancel()
                pool.release(len(lines))
        return StreamingResponse(stream(), media_type="application/x-ndjson")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        """Catalog models (`autoplan models --format json`)."""
        from autoplan.catalog import load_model, model_aliases, model_names
        from autoplan.cli.catalog_cmd import model_record
        by_target: dict[str, list[str]] = {}
        for alias, target in model_aliases().items():
            by_target.setdefault(target, []).append(alias)
        return {"models": [model_record(load_model(n), by_target.get(n, [])) for n in model_names()]}

    @app.get("/v1/hardware")
    async def hardware() -> dict[str, Any]:
        """Catalog GPUs (`autoplan hardware --format json`)."""
        from autoplan.catalog import gpu_names, load_gpu
        return {"gpus": [load_gpu(n).model_dump(mode="json") for n in gpu_names()]}

    @app.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        return Health(workers=cfg.workers, in_flight=pool.in_flight)

    _openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's document, with the request models' schemas (the bodies are read by hand, to answer with
        the CLI's messages) generated by pydantic exactly as ``autoplan schema`` generates them."""
        if app.openapi_schema is None:
            doc = _openapi()
            comps = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in (SearchRequest, EstimateRequest, ScaleRequest):
                s = model.model_json_schema(mode="validation", ref_template="#/components/schemas/{model}")
                for name, sub in s.pop("$defs", {}).items():
                    comps.setdefault(name, sub)
                comps[model.__name__] = s
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


async def _answer_line(pool: Pool, cfg: ServeConfig, line: Line) -> str:
    try:
        _, _, text = await pool.run(lambda engine: answer(engine, line))
    except _Deadline:
        text = BatchLine(id=None, line=line.number, status="error",
                         message=_time_limit_message(cfg)).model_dump_json()
    return text


async def _read_body(request: Any, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _HTTPProblem(413, "invalid", f"request body is {declared} bytes; the limit is {limit} "
                                           "(--max-body-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _HTTPProblem(413, "invalid", f"request body is over the limit of {limit} bytes (--max-body-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def _strip_hint(message: str, hint: str | None) -> str:
    return message[: -len(hint) - 2] if hint and message.endswith(f". {hint}") else message


def _as(data: Any, cls: type[BaseModel]) -> Any:
    if not isinstance(data, dict):
        raise UserInputError(f"a request must be a JSON object, got {json_type(data)}")
    kind = data.get("kind")
    want = cls.model_fields["kind"].default
    if kind != want:
        raise UserInputError(f"request kind is {kind!r:.40}; POST it to /v1/{kind if kind in ('search', 'estimate', 'scale') else want}")
    return validate_request(cls, data)


def check_listen(host: str, port: int) -> None:
    """Refuse an address this machine cannot listen on (an unknown host name, a port in use, a privileged port)
    before the server starts: uvicorn would log it and exit 3, which autoplan's exit codes read as infeasible."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(addr)
    except (OSError, UnicodeError) as err:  # socket.gaierror is an OSError; an over-long label a UnicodeError
        why = getattr(err, "strerror", None) or str(err)
        raise UserInputError(f"cannot listen on {host}:{port}: {why}") from None


def serve(host: str, port: int, cfg: ServeConfig, *, log_level: str = "info") -> None:
    """Run the server until interrupted."""
    import uvicorn

    check_listen(host, port)

    uvicorn.run(create_app(cfg), host=host, port=port, log_level=log_level, limit_concurrency=None,
                timeout_keep_alive=5)


__all__ = ["ConfigError", "Problem", "ServeConfig", "create_app", "serve"]
