"""autoplan: automatic parallelism planning for large-model training.

Python API (the same requests as the CLI's JSON; the responses are pydantic models of the same shape —
``r.plans[0].parallel.tp``; ``r.model_dump(mode="json")`` is the CLI's JSON; see :mod:`autoplan.schema`).
Errors: ``autoplan.AutoplanError``, subclassed by ``InputError`` (exit 2 in the CLI) and ``InfeasibleError``
(exit 3)::

    import autoplan
    result = autoplan.search({"model": "llama3-70b", "cluster": {"num_gpus": 1024}})
    est = autoplan.estimate({"model": "llama3-70b", "cluster": {"num_gpus": 1024}, "parallel": {"tp": 8, "pp": 8}})
"""

__version__ = "0.1.0"

from autoplan.errors import AutoplanError, InfeasibleError, InputError, UserInputError  # noqa: E402
from autoplan.api import Engine, estimate, load_request, run, search  # noqa: E402
from autoplan.schema import (BatchLine, BatchSummary, Estimate, EstimateRequest, SearchRequest,  # noqa: E402
                             SearchResult, json_schema, parse_request)

__all__ = [
    "AutoplanError",
    "InfeasibleError",
    "InputError",
    "UserInputError",
    "BatchLine",
    "BatchSummary",
    "Engine",
    "Estimate",
    "EstimateRequest",
    "SearchRequest",
    "SearchResult",
    "__version__",
    "estimate",
    "json_schema",
    "load_request",
    "parse_request",
    "run",
    "search",
]
