"""The checker process: ``python -m autoplan.validate.worker TARGET PLAN_JSON EMITTED_DIR``.

Prints one ``CHECK {json}`` line per check. Runs each check even when an earlier one failed, unless it
depends on the earlier one's result (then it is reported as failed with that reason)."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoplan.emit import EmitPlan
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets import Software


class Reporter:
    def __init__(self) -> None:
        self.failed = 0

    def check(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn``; it returns a detail string (or a (detail, value) tuple) or raises."""
        try:
            res = fn()
            detail, value = (res if isinstance(res, tuple) else (res, res))
            self.emit(name, True, "" if detail is None else str(detail))
            return value
        except Exception as e:  # noqa: BLE001 - every failure is reported, with its reason
            self.failed += 1
            msg = f"{type(e).__name__}: {e}".strip().splitlines()
            self.emit(name, False, " ".join(msg)[:600])
            if "--traceback" in sys.argv:
                traceback.print_exc()
            return None

    def emit(self, name: str, ok: bool, detail: str, skipped: bool = False) -> None:
        print("CHECK " + json.dumps({"name": name, "ok": ok, "detail": detail, "skipped": skipped}), flush=True)

    def skip(self, name: str, why: str) -> None:
        """A check that cannot run here (e.g. no Megatron-LM checkout), reported as such."""
        self.emit(name, True, why, skipped=True)


def load(path: str) -> EmitPlan:
    d = json.loads(Path(path).read_text())
    return EmitPlan(model=ModelSpec(**d["model"]), cluster=ClusterSpec(**d["cluster"]), job=JobSpec(**d["job"]),
                    parallel=ParallelConfig(**d["parallel"]), software=Software(**d.get("software", {})))


def main(argv: list[str]) -> int:
    target, plan_path, out_dir = argv[:3]
    plan = load(plan_path)
    rep = Reporter()
    if target == "megatron":
        from autoplan.validate.megatron_checks import run
    elif target == "torchtitan":
        from autoplan.validate.torchtitan_checks import run
    elif target == "fsdp2":
        from autoplan.validate.fsdp2_checks import run
    else:
        raise SystemExit(f"unknown target {target}")
    run(plan, Path(out_dir), rep)
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
