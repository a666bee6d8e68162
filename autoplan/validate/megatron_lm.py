"""Megatron-LM's own ``parse_args`` + ``validate_args`` (``megatron/training/arguments.py``) on emitted argument lists.

Megatron-LM ships in no PyPI package, so this runs only where a checkout is given: ``MEGATRON_LM_PATH`` (a folder
holding ``megatron/training/arguments.py``; autoplan's profile cites tag ``core_v0.16.1``, the release matching the
megatron-core 0.16.1 CI installs). Without it, ``autoplan validate`` reports the check as skipped and says why.

One child process imports the checkout (its ``megatron`` package shadows the installed megatron-core) and judges
many lists: ``python -m autoplan.validate.megatron_lm < cases.jsonl`` reads ``{"argv": [...], "world_size": N,
"env": {...}}`` lines and prints one ``{"ok": bool, "error": str}`` line each. Megatron reads the world size and
``CUDA_DEVICE_MAX_CONNECTIONS`` from the environment, so each case sets them as the emitted launch script would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ENV_VAR = "MEGATRON_LM_PATH"
# What pretrain_gpt.py needs beside the plan (data and schedule are the user's: DATA_ARGS in the launch script).
HARNESS_ARGS = ["--tokenizer-type", "NullTokenizer", "--mock-data", "--train-iters", "10", "--lr", "1e-4"]


def checkout() -> Path | None:
    """The Megatron-LM checkout named by ``MEGATRON_LM_PATH``, or None (unset or not a checkout)."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    p = Path(path).expanduser()
    return p if (p / "megatron" / "training" / "arguments.py").is_file() else None


def skip_reason() -> str:
    path = os.environ.get(ENV_VAR)
    if not path:
        return f"{ENV_VAR} is not set (point it at a Megatron-LM checkout, e.g. tag core_v0.16.1)"
    return f"{ENV_VAR}={path} holds no megatron/training/arguments.py"


def judge(cases: list[dict], timeout_s: float = 1800) -> list[dict]:
    """Run Megatron-LM's parse_args + validate_args on each case in one child process."""
    root = checkout()
    if root is None:
        raise RuntimeError(skip_reason())
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)  # the checkout's megatron package, not the installed megatron-core
    proc = subprocess.run([sys.executable, "-m", "autoplan.validate.megatron_lm"], input="\n".join(
        json.dumps(c) for c in cases) + "\n", capture_output=True, text=True, timeout=timeout_s, env=env,
        cwd=str(Path(__file__).resolve().parents[2]))
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if len(out) != len(cases):
        tail = " | ".join((proc.stderr or "").strip().splitlines()[-4:])
        raise RuntimeError(f"Megatron-LM checker exited {proc.returncode} after {len(out)} of {len(cases)}: {tail}")
    return out


def _child() -> int:  # pragma: no cover - runs in the child process
    import contextlib
    import io
    import warnings

    warnings.simplefilter("ignore")
    import torch

    import megatron.training.arguments as mlm_args
    from megatron.training.arguments import parse_args, validate_args

    # No GPU here: Megatron asks the device for its architecture (8 Ampere, 9 Hopper, 10 Blackwell); answer with the
    # plan's GPU, as the cluster it is emitted for would.
    arch = {"major": 9}
    mlm_args.get_device_arch_version = lambda: arch["major"]
    torch.cuda.get_device_capability = lambda *a, **k: (arch["major"], 0)

    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        arch["major"] = int(case.get("arch", 9))
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update({"WORLD_SIZE": str(case["world_size"]), "RANK": "0", "LOCAL_RANK": "0", **case.get("env", {})})
        sys.argv = ["pretrain_gpt.py", *case["argv"], *HARNESS_ARGS]
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                validate_args(parse_args())
            res = {"ok": True, "error": ""}
        except (AssertionError, ValueError, SystemExit) as e:  # Megatron's rules are asserts; argparse exits
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child())
