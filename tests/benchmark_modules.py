"""Load a script of ``benchmarks/`` (not a package) as a module, for the tests that check its tables."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent


def load_benchmark(script: str, name: str) -> ModuleType:
    """``benchmarks/<script>.py`` as module ``name``, registered in ``sys.modules`` (dataclasses resolve their
    annotations through it)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{script}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_heldout() -> ModuleType:
    """``benchmarks/heldout.py``, after the ``fidelity`` script it imports by that name."""
    load_benchmark("fidelity", "fidelity")
    return load_benchmark("heldout", "heldout")


def heldout_rows(files: tuple[str, ...], keep: Callable[[dict[str, Any]], bool],
                 row: Callable[[dict[str, Any], dict[str, Any], ModuleType, ModuleType], dict[str, Any]],
                 ) -> dict[str, dict[str, Any]]:
    """``row(case, rules, heldout, fidelity)`` for each case of ``benchmarks/data/<files>`` that ``keep`` keeps,
    by case id (the per-family audits of the held-out rows)."""
    heldout = load_heldout()
    fidelity = load_benchmark("fidelity", "fidelity")
    out = {}
    for name in files:
        cases, rules = fidelity.load_cases(ROOT / "benchmarks" / "data" / name)
        out.update({case["id"]: row(case, rules, heldout, fidelity) for case in cases if keep(case)})
    return out
