"""The meta-device comparison table (issue 11): model × framework × field → equal.

    python benchmarks/model_equivalence.py                 # every case, both frameworks
    python benchmarks/model_equivalence.py -f torchtitan   # one framework

For each case the framework's own builder makes the model from autoplan's emitted arguments on the meta device
(``python -m autoplan.validate.model_equivalence``, one process per case) and each field is compared with
transformers' model of the published config.json (tests/data/hf; Mistral-7B from the config the tests write).
A cell says ``equal`` or what differs; torchtitan's router cell names the facts the emitter warns it cannot train
(``autoplan.emit.torchtitan.balancing_warnings``). Prints a markdown table, then the CPU seconds per case.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoplan.catalog import load_model  # noqa: E402
from autoplan.emit.torchtitan import balancing_warnings  # noqa: E402
from tests.written_configs import MISTRAL_7B  # noqa: E402

HF = ROOT / "tests" / "data" / "hf"
CASES = [("llama3-8b", "llama3-8b"), ("llama3-70b", "llama3-70b"), ("llama3-405b", "llama3.1-405b"),
         ("mixtral-8x7b", "mixtral-8x7b"), ("qwen3-235b-a22b", "qwen3-235b-a22b"), ("deepseek-v3", "deepseek-v3"),
         ("mistral-7b config.json", None)]
TITAN = {"llama3-8b", "llama3-70b", "llama3-405b", "qwen3-235b-a22b", "deepseek-v3"}  # torchtitan 0.3.0 ships
FIELDS = ["params", "rope_inv_freq", "norm_eps", "qk_norm", "window", "softmax_scale", "router", "mtp_params"]


def cell(mine: object, theirs: object, field: str) -> str:
    if mine == "DIFFERENT":
        return "≠"
    if field == "rope_inv_freq" or mine == theirs:
        return "equal"
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return "≠ " + ", ".join(k for k in mine if mine[k] != theirs.get(k))
    return f"≠ ({mine} vs {theirs})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-f", "--framework", choices=["megatron-core", "torchtitan"], action="append")
    frameworks = ap.parse_args().framework or ["megatron-core", "torchtitan"]
    tmp = Path(tempfile.mkdtemp())
    mistral = tmp / "config.json"
    mistral.write_text(json.dumps(MISTRAL_7B))
    print("| model | framework | " + " | ".join(FIELDS) + " |")
    print("|---|---|" + "---|" * len(FIELDS))
    cpu = []
    for fw in frameworks:
        for name, stem in CASES:
            if fw == "torchtitan" and name not in TITAN:
                continue
            model, config = (name, HF / f"{stem}.json") if stem else (str(mistral), mistral)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            res = subprocess.run([sys.executable, "-m", "autoplan.validate.model_equivalence", model, str(config), fw],
                                 capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append((name, fw, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime))
            if res.returncode:
                print(f"| {name} | {fw} | FAILED: {res.stderr.strip().splitlines()[-1][:200]} |")
                continue
            rows = {r[2].split(" ")[0]: cell(r[3], r[4], r[2]) for r in json.loads(res.stdout)}
            if fw == "torchtitan" and rows.get("router", "equal") != "equal":
                rows["router"] += f" ({len(balancing_warnings(load_model(model)))} emitter WARNING(s))"
            print(f"| {name} | {fw} | " + " | ".join(rows.get(f, "-") for f in FIELDS) + " |", flush=True)
    print()
    for name, fw, s in cpu:
        print(f"{name:24s} {fw:14s} {s:7.1f} CPU s")


if __name__ == "__main__":
    main()
