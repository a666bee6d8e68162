"""`autoplan serve`: the planning service over HTTP (needs the 'serve' extra: FastAPI and uvicorn)."""

from __future__ import annotations

import click

from autoplan.cli import cli
from autoplan.cli.options import user_errors
from autoplan.errors import UserInputError


@cli.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on (0.0.0.0: all)")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--workers", type=click.IntRange(1, 256), default=2, show_default=True,
              help="worker threads that plan (each keeps its own caches)")
@click.option("--max-body-bytes", type=click.IntRange(256), default=1 << 20, show_default=True,
              help="largest request body (a batch included)")
@click.option("--max-batch-lines", type=click.IntRange(1), default=1000, show_default=True,
              help="most requests in one /v1/batch")
@click.option("--time-limit", "time_limit_s", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="seconds one request (one batch line) may plan")
@click.option("--max-queue", type=click.IntRange(0), default=256, show_default=True,
              help="requests waiting for a worker before new ones get 503")
@click.option("--files/--no-files", "allow_files", default=False, show_default=True,
              help="allow requests to name files on this machine (model paths, cluster profiles)")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
@user_errors
def serve_cmd(host: str, port: int, workers: int, max_body_bytes: int, max_batch_lines: int, time_limit_s: float,
              max_queue: int, allow_files: bool, log_level: str) -> None:
    """Serve the planner over HTTP: POST /v1/search, /v1/estimate, /v1/scale, /v1/batch (NDJSON); GET
    /v1/models, /v1/hardware, /healthz; the OpenAPI document at /openapi.json, interactive docs at /docs."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserInputError("autoplan serve needs FastAPI and uvicorn: pip install 'autoplan[serve]'") from None
    from autoplan.serve import ServeConfig, serve

    serve(host, port, ServeConfig(workers=workers, max_body_bytes=max_body_bytes, max_batch_lines=max_batch_lines,
                                  time_limit_s=time_limit_s, max_queue=max_queue, allow_files=allow_files),
          log_level=log_level)
