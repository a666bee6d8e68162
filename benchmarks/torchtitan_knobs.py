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
# torchao's own torchtitan recipe benchmark (torchao/float8/README.md, pytorch/ao#1793): Llama3-8B, 8 H100, FSDP2,
# torch.compile, per-op SAC, batch size 1, sequence 8192; median tokens/s. Two published versions: the PR's first
# revision (0641e747b: bf16 6019, tensorwise 7190, rowwise 6649) and the merged README (8c81863ba: bf16 6150,
# "tensorwise with float8 all-gather" 7689.5, rowwise 6768). The data's torchtitan_8B_t1 runs have the same layout
# but batch size 2; the README's batch size 1 is priced here (on the runs' H100 96GB HBM2e).
README_BASE = "torchtitan_8B_t1_fsdp_compile_fp8"
README_TOKENS_PER_S = {"ao#1793 first revision": {"bf16": 6019, "tensorwise": 7190, "rowwise": 6649},
                       "ao README (merged; tensorwise with fp8 FSDP all-gather, not priced)":
                           {"bf16": 6150, "tensorwise": 7689.5, "rowwise": 6768}}


def readme_setup(run):  # type: ignore[no-untyped-def]
    """The README's batch size 1 on the published 8-GPU FSDP layout."""
    return replace(run, job=run.job.model_copy(update={"global_batch_size": 8}),
                   parallel=run.parallel.model_copy(update={"micro_batch_size": 1}))


def recipe_step(run, recipe: str | None) -> float:  # type: ignore[no-untyped-def]
    """Predicted step of ``run`` in bf16 (recipe None) or fp8 with ``recipe``."""
    if recipe is None:
        knobs = run.knobs.model_copy(update={"fp8_recipe": None})
        return replace(run, job=run.job.model_copy(update={"precision": "bf16"}), knobs=knobs).predict()
    return replace(run, knobs=run.knobs.model_copy(update={"fp8_recipe": recipe})).predict()


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

    from cost_models import knob_effects

    run = readme_setup(runs[README_BASE][1])
    steps = {r: recipe_step(run, r) for r in (None, "tensorwise", "rowwise", "rowwise_with_gw_hp")}
    print("\n| torchao README setup (8B, 8 GPUs, batch 1) | bf16 -> tensorwise | bf16 -> rowwise "
          "| tensorwise -> rowwise |")
    print("|---|---:|---:|---:|")
    for name, tps in README_TOKENS_PER_S.items():
        bf, tw, rw = tps["bf16"], tps["tensorwise"], tps["rowwise"]
        print(f"| published, {name} | {bf / tw - 1:+.1%} | {bf / rw - 1:+.1%} | {tw / rw - 1:+.1%} |")
    print(f"| predicted | {steps['tensorwise'] / steps[None] - 1:+.1%} | {steps['rowwise'] / steps[None] - 1:+.1%} "
          f"| {steps['rowwise'] / steps['tensorwise'] - 1:+.1%} |")
    band = []
    for eff in (0.90, 1.00):  # the published band of the rowwise CUTLASS kernel (knob_effects, pytorch#147971)
        knob_effects.ROWWISE_FWD_GEMM_EFFICIENCY, keep = eff, knob_effects.ROWWISE_FWD_GEMM_EFFICIENCY
        band.append(recipe_step(run, "rowwise") / steps["tensorwise"] - 1)
        knob_effects.ROWWISE_FWD_GEMM_EFFICIENCY = keep
    print(f"| predicted, rowwise CUTLASS forward GEMM at 0.90 / 1.00 of cuBLAS tensorwise | | | "
          f"{band[0]:+.1%} / {band[1]:+.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
