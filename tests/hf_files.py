"""The published HF config.json files under tests/data/hf, read as the loader tests read them."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from autoplan.catalog.hf import HFConfigWarning, spec_from_hf_config
from cost_models.specs import ModelSpec

HF = Path(__file__).parent / "data" / "hf"


def hf_config(stem: str) -> dict[str, Any]:
    """The config.json saved as ``tests/data/hf/<stem>.json``."""
    return json.loads((HF / f"{stem}.json").read_text())


def hf_spec(stem: str, **change: Any) -> ModelSpec:
    """The spec of that file with ``change`` applied; a key the loader leaves unread fails the test (the published
    files have none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFConfigWarning)
        return spec_from_hf_config(hf_config(stem) | change, name=stem)
