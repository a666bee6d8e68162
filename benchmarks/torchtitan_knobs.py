"""torchtitan's published runs (../shared/calibration/published_runs.json, group torchtitan_h100_2024_12): measured vs
predicted step time, each run priced as torchtitan runs it with the knobs its ``software`` field names (compile,
async TP, Float8 recipe: ``cost_models.targets`` resolves them, ``cost_models.knob_effects`` prices them), and the
direction each knob moves the step, measured (pairs of published runs that differ in that knob alone) vs predicted.

    python benchmarks/torchtitan_knobs.py

The runs are resolved exactly as ``benchmarks/fidelity.py`` resolves them (its resolutions, the catalog's torchtitan
efficiencies, fitted there on all published runs together); nothing is fitted here.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _fidelity():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("fidelity_tt", ROOT / "benchmarks" / "fidelity.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fidelity_tt"] = mod
    spec.loader.exec_module(mod)
    return mod


# Published pairs that differ in one knob (same model, GPUs, layout): (before, after, knob change).
PAIRS = (("torchtitan_8B_t1_fsdp", "torchtitan_8B_t1_fsdp_compile", "compile off -> on (8B, FSDP 8)"),
         ("torchtitan_8B_t3_fsdp", "torchtitan_8B_t3_fsdp_compile", "compile off -> on (8B, FSDP 128)"),
         ("torchtitan_70B_t4_2d", "torchtitan_70B_t4_2d_asynctp", "async TP off -> on (70B, tp 8)"))
# Float8 recipes on a published fp8 layout (the data has tensorwise runs only: no measured pair).
RECIPE_RUNS = ("torchtitan_8B_t1_fsdp_compile_fp8", "torchtitan_70B_t4_2d_asynctp")
# The published end-to-end recipe gap nearest a run of the data: torchao/float8/README.md (pytorch/ao#1793), Llama3-8B
# on 8 H100, torchtitan, torch.compile, FSDP2, sequence 8192, per-op SAC: median tokens/s tensorwise 7190, rowwise
# 6649 — the layout of torchtitan_8B_t1_fsdp_compile_fp8 (8 H100, FSDP, compile, seq 8192, selective AC).
PUBLISHED_RECIPE_GAP = ("torchtitan_8B_t1_fsdp_compile_fp8", "rowwise", 7190 / 6649 - 1,
                        "torchao float8 README (ao#1793), 8B 8xH100 FSDP2 compile")


def main() -> int:
    fid = _fidelity()
    runs = {c["id"]: (c, r) for c, r in fid.published_runs() if r.target == "torchtitan-2024-12"}
    skipped = [(cid, why) for cid, why in fid.skipped_cases() if cid.startswith("torchtitan")]
    pred = {cid: r.predict() for cid, (_, r) in runs.items()}
    print("| run | knobs | measured s | predicted s | error |")
    print("|---|---|---:|---:|---:|")
    errs = []
    for cid, (case, run) in runs.items():
        knobs = " ".join(f"{k}={v}" for k, v in run.knobs.given().items()) or "defaults"
        err = pred[cid] / run.measured_step_time_s - 1
        errs.append(abs(err))
        print(f"| {cid} | {knobs} | {run.measured_step_time_s:.3f} | {pred[cid]:.3f} | {err:+.1%} |")
    print(f"| MAPE ({len(errs)} runs) | | | | {sum(errs) / len(errs):.1%} |")
    for cid, why in skipped:
        print(f"| {cid} | not priced: {why} | | | |")

    print("\n| knob change (published pair) | measured | predicted | same direction |")
    print("|---|---:|---:|:---:|")
    for a, b, name in PAIRS:
        meas = runs[b][1].measured_step_time_s / runs[a][1].measured_step_time_s - 1
        model = pred[b] / pred[a] - 1
        print(f"| {name} | {meas:+.1%} | {model:+.1%} | {'yes' if meas * model > 0 else 'NO'} |")

    print("\n| Float8 recipe (predicted; no measured pair in the data) | tensorwise s | recipe s | change |")
    print("|---|---:|---:|---:|")
    for cid in RECIPE_RUNS:
        run = runs[cid][1]
        base = replace(run, knobs=run.knobs.model_copy(update={"fp8_recipe": "tensorwise"})).predict()
        for recipe in ("rowwise", "rowwise_with_gw_hp"):
            other = replace(run, knobs=run.knobs.model_copy(update={"fp8_recipe": recipe})).predict()
            print(f"| {cid}: tensorwise -> {recipe} | {base:.3f} | {other:.3f} | {other / base - 1:+.1%} |")

    cid, recipe, published, source = PUBLISHED_RECIPE_GAP
    run = runs[cid][1]
    base = replace(run, knobs=run.knobs.model_copy(update={"fp8_recipe": "tensorwise"})).predict()
    other = replace(run, knobs=run.knobs.model_copy(update={"fp8_recipe": recipe})).predict()
    print(f"\n| tensorwise -> {recipe}, step time | published ({source}) | predicted ({cid}) |")
    print("|---|---:|---:|")
    print(f"| change | {published:+.1%} | {other / base - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
