"""Check emitted configs with the frameworks' own code (the ``validate`` extra).

``validate(plan, target)`` emits the plan into a temporary folder and runs the real consumers on it in
a fresh Python process (their process-group and mesh state is global; a process keeps it contained):

- megatron: the argument list parsed with Megatron-LM's flag names/types; megatron-core
  ``TransformerConfig`` built from it; ``RankGenerator`` groups equal to autoplan's rank layout;
  ``initialize_model_parallel`` under the fake process-group backend at the plan's world size.
- torchtitan: ``ConfigManager().parse_args(overrides)``; ``ParallelDims`` at the plan's world size;
  ``build_mesh()`` under the fake backend; the shipped model's architecture equals the plan's; the
  model's real ``pipelining_fn``/``parallelize_fn`` applied to a meta-device model (rank 0's view).
- fsdp2: the emitted module imports; its ``build_mesh`` builds the named mesh under the fake backend;
  ``parallelize`` applies to a meta-device tiny Llama on rank 0.

Without the extra installed, ``missing_extra()`` names what to install.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autoplan.emit import EmitPlan, Target, write_plan
from autoplan.errors import ConfigError, UserInputError

EXTRA_HINT = "pip install 'autoplan[validate]'  (torch==2.13.0, torchtitan==0.3.0, triton, megatron-core)"
NEEDS: dict[str, tuple[str, ...]] = {
    "megatron": ("torch", "megatron.core"),
    "torchtitan": ("torch", "torchtitan", "triton"),
    "fsdp2": ("torch",),
}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""
    skipped: bool = False

    def line(self) -> str:
        word = "SKIP" if self.skipped else ("PASS" if self.ok else "FAIL")
        return f"{word}  {self.name}" + (f": {self.detail}" if self.detail else "")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extra(target: Target) -> list[str]:
    """Modules of the ``validate`` extra that ``target``'s checks need and that are not installed."""
    return [m for m in NEEDS[target] if not _importable(m)]


def child_env() -> dict[str, str]:
    """The environment for checker/worker processes: this autoplan importable even when not installed."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def plan_to_json(plan: EmitPlan) -> dict:
    return {"model": plan.model.model_dump(mode="json"), "cluster": plan.cluster.model_dump(mode="json"),
            "job": plan.job.model_dump(mode="json"), "parallel": plan.parallel.model_dump(mode="json"),
            "software": plan.software.model_dump(mode="json", exclude_none=True)}


def run_checks(plan: EmitPlan, target: Target, emitted_dir: str | Path | None = None,
               timeout_s: float = 900) -> list[Check]:
    """Emit ``plan`` (into ``emitted_dir``, or a temporary folder) and run ``target``'s checks on it."""
    with tempfile.TemporaryDirectory(prefix="autoplan-validate-") as tmp:
        # Absolute: the checker runs with the temporary folder as its working directory.
        out = Path(emitted_dir).resolve() if emitted_dir is not None else Path(tmp) / "emitted"
        if emitted_dir is not None:  # a folder the user named that cannot be made is their error, not the plan's
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise UserInputError(f"cannot create output folder '{emitted_dir}': {err.strerror or err}") from None
        try:
            write_plan(plan, target, out)
        except ConfigError as e:
            return [Check(f"{target}: autoplan can emit this plan", False, str(e))]
        spec = Path(tmp) / "plan.json"
        spec.write_text(json.dumps(plan_to_json(plan)))
        env = child_env()
        cmd = [sys.executable, "-m", "autoplan.validate.worker", target, str(spec), str(out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            return [Check(f"{target}: checks finished", False, f"timed out after {timeout_s:.0f} s")]
        checks = []
        for line in proc.stdout.splitlines():
            if line.startswith("CHECK "):
                rec = json.loads(line[6:])
                checks.append(Check(rec["name"], rec["ok"], rec.get("detail", ""), rec.get("skipped", False)))
        if proc.returncode != 0 or not checks:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            checks.append(Check(f"{target}: checker process", False,
                                f"exit {proc.returncode}: " + " | ".join(tail)))
        return checks
