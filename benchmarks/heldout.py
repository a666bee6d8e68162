"""The cost model on held-out public measured runs: priced with the catalog as it is, never fitted on them.

Reads every ``benchmarks/data/more_runs*.json`` (format: the file's ``about``; groups carry their own documented
resolutions, cases follow ``published_runs.json``'s schema, models inline or ``{"catalog": name}``) and prices each
case exactly as ``fidelity.py`` prices its calibration runs (``fidelity.to_run`` → ``calibrate.resolve_run`` →
``cost_models.estimate.estimate`` with the run's target and knobs). Prints per case predicted vs measured step time
and the predicted peak memory (a run that really trained must be predicted to fit), MAPE / worst per source group,
framework (the target's efficiency set), GPU generation, precision, dense vs MoE, context parallelism, FSDP, scale
band and overall, the ordering of differently configured runs of one job (``fidelity.ranking``), and within a source
how GPU-seconds per sample change with the GPU count, measured vs predicted (``scaling``: the level error cancels).
Cases the model cannot express are listed with why.

    python benchmarks/heldout.py                 # table + out/heldout.md
    python benchmarks/heldout.py --files benchmarks/data/more_runs.json
    python benchmarks/heldout.py --what-if blackwell.attention=0.42   # diagnostic: size one suspected bias
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import fidelity  # noqa: E402
from autoplan.calibrate import resolve_run  # noqa: E402
from cost_models.errors import ConfigError  # noqa: E402
from cost_models.estimate import estimate  # noqa: E402
from cost_models.moe import moe_layer_host_issued  # noqa: E402
from cost_models.targets import framework_of, runtime_for  # noqa: E402


def default_files() -> list[Path]:
    return fidelity.more_runs_files()


@dataclass
class HeldRow:
    id: str
    group: str
    file: str
    generation: str
    precision: str
    moe: bool
    cp: int
    zero: int
    num_gpus: int
    measured_s: float
    predicted_s: float
    peak_gib: float
    limit_gib: float
    fits: bool
    recipe: str = ""  # fp8 recipe as the run states it ("default": the target's own), "" for bf16
    # MoE residual view (``moe_residuals``): micro-batches per step, layers on the binding stage, routed experts on a
    # rank, micro-batch size, and the MoE knobs the run carries
    microbatches: int = 0
    stage_layers: int = 0
    local_experts: int = 0
    mbs: int = 0
    moe_knobs: str = ""
    framework: str = ""  # the efficiency set the run is priced with (``framework_of`` its target; megatron's default)
    # a published peak (torchtitan logs: max_memory_reserved) and the prediction's reserved / allocated peaks, GiB
    measured_peak_gib: float = 0.0
    reserved_gib: float = 0.0
    allocated_gib: float = 0.0
    # the group's ``cases.<id>.layout_cannot_fit.why``: why the layout as published cannot have trained by the code
    # (the prediction's allocated peak alone is over the whole HBM; ``.recipe``: the job / parallel fields of the
    # layout the release's recipe runs, which fits), or ""
    cannot_fit: str = ""
    # MoE residual view, host side: the catalog's host issue of one MoE layer-micro-batch (moe_host_s_per_layer +
    # moe_host_s_per_expert x local experts, ms; 0 where a CUDA graph holds the experts), what the prediction prices
    # of it (host_bound_s over the binding stage's layer-micro-batches, ms), and the pipeline (pp, vp)
    host_issue_ms: float = 0.0
    host_priced_ms: float = 0.0
    pp: int = 1
    vp: int = 1
    # everything the run is but its GPU: model, GPU count, job, parallel layout, knobs, target (``sibling_gpus``)
    config: str = ""
    gpu: str = ""

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


def scale_band(n: int) -> str:
    return "<=64 GPUs" if n <= 64 else "65-256 GPUs" if n <= 256 else "257-1024 GPUs" if n <= 1024 else ">1024 GPUs"


def parse_what_if(items: list[str]) -> dict[tuple[str, str], Any]:
    """``GEN.FIELD=VALUE`` (an Efficiency field of a GPU generation, e.g. ``blackwell.attention=0.42``),
    ``GPU.nvlink_domain_size=N`` (a cluster field of one catalog GPU) or ``GPU.FIELD=VALUE`` (a numeric GPUSpec
    field of one catalog GPU, e.g. ``h100-sxm.nic_latency_us=30``) → {(scope, field): value}."""
    from cost_models.specs import Efficiency, GPUSpec

    out: dict[tuple[str, str], Any] = {}
    for item in items:
        scope_field, _, value = item.partition("=")
        scope, _, name = scope_field.partition(".")
        if not value or not name or name not in {*Efficiency.model_fields, *_gpu_fields(GPUSpec), "nvlink_domain_size"}:
            raise SystemExit(f"--what-if {item!r}: expected GEN.FIELD=VALUE (an Efficiency field), "
                             "GPU.nvlink_domain_size=N or GPU.FIELD=VALUE (a numeric GPUSpec field)")
        out[(scope, name)] = value if name == "moe_dispatcher" else (
            value.lower() == "true" if value.lower() in ("true", "false") else float(value))
    return out


def _gpu_fields(spec: Any) -> set[str]:
    """Numeric GPUSpec fields a what-if may set (latencies, bandwidths, peaks)."""
    return {f for f, info in spec.model_fields.items() if info.annotation in (int, float)}


def _with_what_if(cluster: Any, what_if: dict[tuple[str, str], Any]) -> Any:
    from cost_models.specs import GPUSpec

    gpu_fields = _gpu_fields(GPUSpec) - {"nvlink_domain_size"}
    eff = {f: v for (scope, f), v in what_if.items() if scope == cluster.gpu.generation and f != "nvlink_domain_size"
           and f not in gpu_fields}
    gpu = {f: v for (scope, f), v in what_if.items() if scope == cluster.gpu.name and f in gpu_fields}
    dom = what_if.get((cluster.gpu.name, "nvlink_domain_size"))
    if eff:
        cluster = cluster.model_copy(update={"efficiency": cluster.efficiency.model_copy(update=eff)})
    if gpu:
        cluster = cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update=gpu)})
    if dom is not None:
        cluster = cluster.model_copy(update={"nvlink_domain_size": int(dom)})
    return cluster


def host_calibration_ids() -> set[str]:
    """The rows ``fidelity.fit_moe_host`` fits the MoE host cost on (``fidelity.host_calibration_runs``)."""
    return {c["id"] for c, _ in fidelity.host_calibration_runs()}


def evaluate(files: list[Path] | None = None, what_if: dict[tuple[str, str], Any] | None = None
             ) -> tuple[list[HeldRow], list[tuple[str, str]], list[dict[str, Any]]]:
    """(rows, not priced (id, why), every case) over the held-out files. Not priced: the file's documented skips,
    and any case the cost model rejects (its ConfigError, marked 'REJECTED': the data should say skip and why).
    ``what_if`` (``parse_what_if``): a diagnostic override of catalog values, to size a suspected bias — never
    a fit, and the default run has none."""
    rows: list[HeldRow] = []
    skipped: list[tuple[str, str]] = []
    cases: list[dict[str, Any]] = []
    host_fitted = host_calibration_ids()  # the MoE host cost is fitted on them: no longer held out
    for path in files if files is not None else default_files():
        mine, rules = fidelity.load_cases(path)
        fitted = fidelity.calibration_groups(rules)  # joined the calibration set: no longer held out
        mine = [c for c in mine if c["group"] not in fitted and c["id"] not in host_fitted]
        cases += mine
        skipped += fidelity.skipped_cases(path)
        skip = {cid for cid, _ in skipped}
        resolved = []
        for case in mine:
            if case["id"] in skip:
                continue
            try:
                resolved.append((case, resolve_run(fidelity.to_run(case, rules))))
            except ConfigError as e:
                skipped.append((case["id"], f"REJECTED by the cost model: {e}"))
        for case, run in resolved:
            pred = estimate(run.model, _with_what_if(run.cluster_with(), what_if or {}), run.job, run.parallel,
                            target=run.target,
                            software=run.knobs, check=False)
            par = run.parallel
            rows.append(HeldRow(case["id"], case["group"], path.name, run.cluster.gpu.generation, run.job.precision,
                                run.model.num_experts > 0, par.cp, par.zero_stage,
                                run.cluster.num_gpus, run.measured_step_time_s, pred.step_time_s,
                                pred.peak_memory_gib, pred.memory_limit_gib, pred.fits,
                                (run.knobs.fp8_recipe or "default") if run.job.precision == "fp8"
                                else "nvfp4" if run.job.precision == "nvfp4" else "",
                                pred.num_microbatches, max(pred.layers_per_stage),
                                run.model.num_experts // par.ep if run.model.num_experts else 0, par.micro_batch_size,
                                " ".join(f"{k}={v}" for k, v in run.knobs.given().items() if k.startswith("moe_")),
                                framework_of(run.target) or run.target or "megatron",
                                case["measured"].get("peak_memory_gib") or 0.0, pred.peak_reserved_gib,
                                pred.peak_allocated_gib,
                                rules["groups"][case["group"]].get("cases", {}).get(case["id"], {})
                                .get("layout_cannot_fit", {}).get("why", ""),
                                *_host_view(run, pred),
                                config=repr((fidelity.model_name(case), run.cluster.num_gpus, run.job, par,
                                             sorted(run.knobs.given().items()), run.target)),
                                gpu=run.cluster.gpu.name))
    return rows, skipped, cases


def _host_view(run: Any, pred: Any) -> tuple[float, float, int, int]:
    """(host issue, host priced, pp, vp) of a run for ``moe_residuals``: the catalog's host issue of one MoE
    layer-micro-batch where the host issues the experts (``moe.moe_layer_host_issued`` of the run's runtime), and the
    prediction's ``host_bound_s`` over the binding stage's layer-micro-batches, both in ms."""
    par, cluster = run.parallel, run.cluster_with()
    local = run.model.num_experts // par.ep if run.model.num_experts else 0
    rt = runtime_for(run.target, run.job, cluster, par, run.knobs)
    eff = cluster.efficiency
    host = (eff.moe_host_s_per_layer + eff.moe_host_s_per_expert * local) * 1e3 \
        if local and moe_layer_host_issued(rt) else 0.0
    lm = pred.num_microbatches * max(pred.layers_per_stage)
    return host, pred.time.host_bound_s / lm * 1e3 if lm else 0.0, par.pp, par.vp or 1


def memory_summary(rows: list[HeldRow]) -> str:
    """The held-out runs with a published peak (torchtitan logs ``max_memory_reserved``) against the predicted
    reserved peak: n, MAPE, mean signed error, worst, and how many are over-predicted by the allocated peak alone
    (there the allocator reserve cannot be judged). Fitted on nothing."""
    peaks = [r for r in rows if r.measured_peak_gib > 0]
    if not peaks:
        return ""
    err = [r.reserved_gib / r.measured_peak_gib - 1 for r in peaks]
    worst = max(range(len(peaks)), key=lambda i: abs(err[i]))
    over = sum(r.allocated_gib > r.measured_peak_gib for r in peaks)
    return (f"Peak memory vs {len(peaks)} held-out published peaks (reserved): MAPE {sum(map(abs, err)) / len(err):.1%}, "
            f"mean signed {sum(err) / len(err):+.1%}, worst {err[worst]:+.1%} ({peaks[worst].id}); {over} over-predicted "
            "by the allocated peak alone")


KEYS: dict[str, Callable[[HeldRow], str]] = {
    "group": lambda r: r.group,
    "framework": lambda r: r.framework,
    "generation": lambda r: r.generation,
    "precision": lambda r: r.precision,
    "fp8 recipe": lambda r: r.recipe or "bf16",  # nvfp4: its own row
    "dense/MoE": lambda r: "MoE" if r.moe else "dense",
    "context parallel": lambda r: "cp > 1" if r.cp > 1 else "cp = 1",
    "FSDP": lambda r: "zero 3 (FSDP)" if r.zero == 3 else f"zero {r.zero}",
    "scale": lambda r: scale_band(r.num_gpus),
    "all": lambda r: "all",
}


def summarize(rows: list[HeldRow], key: str) -> list[tuple[str, int, float, float, float, str]]:
    """(name, n, MAPE, mean signed error, worst |error|, worst id) per value of ``key`` (KEYS)."""
    by: dict[str, list[HeldRow]] = defaultdict(list)
    for r in rows:
        by[KEYS[key](r)].append(r)
    out = []
    for name in sorted(by):
        rs = by[name]
        worst = max(rs, key=lambda r: abs(r.error))
        out.append((name, len(rs), sum(abs(r.error) for r in rs) / len(rs), sum(r.error for r in rs) / len(rs),
                    abs(worst.error), worst.id))
    return out


def same_job(case: dict[str, Any]) -> tuple[Any, ...]:
    """``fidelity.job_key`` within one source group: runs of one job published by one source (one software
    version). The same job in two container versions differs in software the cost model cannot see."""
    return (case["group"], *fidelity.job_key(case))


def ranking(rows: list[HeldRow], cases: list[dict[str, Any]]) -> tuple[int, int, list[str]]:
    """fidelity.ranking's definition (pairs of differently configured runs of one job, ``same_job``) on the
    held-out rows."""
    as_fid = [fidelity.Row(r.id, r.group, r.generation, r.measured_s, r.predicted_s, None, 0.0) for r in rows]
    return fidelity.ranking(as_fid, cases=cases, key=same_job)


def scaling(rows: list[HeldRow], cases: list[dict[str, Any]]) -> list[tuple[str, str, float, float]]:
    """What grows with GPU count, apart from the level: within one source, runs of one model, GPU, sequence length,
    precision and tp / pp / cp on different GPU counts (dp and batch vary). Each run's GPU-seconds per sample over
    those of the source's smallest such run, measured and predicted: (run, reference run, measured ratio, predicted
    ratio). A term that grows with GPU count (collectives over more nodes, stragglers) or with fewer micro-batches
    per pipeline (the bubble) shows here, whatever the per-source level error."""
    by_id = {c["id"]: c for c in cases}
    families: dict[tuple[Any, ...], list[HeldRow]] = defaultdict(list)
    for r in rows:
        c = by_id[r.id]
        p = c["parallel"]
        families[(r.group, fidelity.model_name(c), c["cluster"]["gpu"], c["job"]["seq_len"], r.precision,
                  p.get("tp"), p.get("pp"), p.get("cp"))].append(r)
    out = []
    for fam in families.values():
        if len({r.num_gpus for r in fam}) < 2:
            continue
        fam.sort(key=lambda r: (r.num_gpus, r.id))
        base = fam[0]

        def per_sample(r: HeldRow, t: float) -> float:
            return t * r.num_gpus / by_id[r.id]["job"]["global_batch_size"]
        for r in fam[1:]:
            if r.num_gpus == base.num_gpus:
                continue
            out.append((r.id, base.id, per_sample(r, r.measured_s) / per_sample(base, base.measured_s),
                        per_sample(r, r.predicted_s) / per_sample(base, base.predicted_s)))
    return out


def sibling_gpus(rows: list[HeldRow]) -> list[tuple[str, str, float, float]]:
    """Runs of one source that differ in their GPU alone (same model, GPU count, job, layout, knobs and target: the
    ``config`` of each row; different ``gpu``): (run, its sibling on the other GPU, measured step-time ratio run /
    sibling, predicted ratio). What the catalog says one GPU is worth against another, against what the same recipe
    measured on both; the per-source level error cancels."""
    by: dict[tuple[str, str], list[HeldRow]] = defaultdict(list)
    for r in rows:
        by[(r.group, r.config)].append(r)
    out = []
    for fam in by.values():
        fam.sort(key=lambda r: r.id)
        for i, a in enumerate(fam):
            for b in fam[i + 1:]:
                if a.gpu != b.gpu:
                    out.append((a.id, b.id, a.measured_s / b.measured_s, a.predicted_s / b.predicted_s))
    return sorted(out)


def repeat_floor(rows: list[HeldRow]) -> tuple[int, int, float, float]:
    """Runs measured more than once as the model sees them (same ``config`` and ``gpu``; in practice the same
    recipe in several releases): (families, rows, floor MAPE, the model's MAPE on those rows). The floor is the MAPE
    of the best single step time per family, what any model pricing only what the runs state must miss on them."""
    fams: dict[tuple[str, str], list[HeldRow]] = defaultdict(list)
    for r in rows:
        fams[(r.config, r.gpu)].append(r)
    multi = [f for f in fams.values() if len(f) > 1]
    n = sum(len(f) for f in multi)
    if not n:
        return 0, 0, 0.0, 0.0
    floor = 0.0
    for f in multi:
        ms = [r.measured_s for r in f]
        floor += min(sum(abs(p / m - 1.0) for m in ms) for p in ms)  # the best is one of the measured values
    return len(multi), n, floor / n, sum(abs(r.error) for f in multi for r in f) / n


def _ratio_table(pairs: list[tuple[str, str, float, float]]) -> list[str]:
    """Markdown rows of (run, reference, measured ratio, predicted ratio), with the predicted one's difference."""
    return ["| run | vs | measured | predicted | difference |", "|---|---|---:|---:|---:|"] + [
        f"| {a} | {b} | {m:.3f} | {p:.3f} | {p / m - 1:+.1%} |" for a, b, m, p in pairs]


def render(rows: list[HeldRow], skipped: list[tuple[str, str]], cases: list[dict[str, Any]]) -> str:
    lines = ["| case | group | gen | prec | GPUs | measured s | predicted s | error | peak GiB / limit | fits |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.id} | {r.group} | {r.generation} | {r.precision} | {r.num_gpus} | {r.measured_s:.3f} | "
                     f"{r.predicted_s:.3f} | {r.error:+.1%} | {r.peak_gib:.1f} / {r.limit_gib:.1f} | "
                     f"{'yes' if r.fits else 'NO'} |")
    lines += ["", "Catalog parameters as they are (nothing fitted on these runs). Mean signed error > 0: predicted "
              "slow.", "", "| scope | n | MAPE | mean signed | worst abs error | worst case |",
              "|---|---:|---:|---:|---:|---|"]
    for key in KEYS:
        for name, n, mape, mean, worst, wid in summarize(rows, key):
            lines.append(f"| {key}: {name} | {n} | {mape:.1%} | {mean:+.1%} | {worst:.1%} | {wid} |")
    if cases:
        right, total, wrong = ranking(rows, cases)
        lines += ["", f"Ranking: {right}/{total} pairs of differently configured runs of one job ordered right"
                  + (f" ({right / total:.0%}; target >= 85%)" if total else "")
                  + (f"; wrong: {', '.join(wrong)}" if wrong else "")]
        pairs = scaling(rows, cases)
        if pairs:
            lines += ["", "Scaling within a source (GPU-seconds per sample vs the source's smallest run of the same model, "
                      "GPU, sequence, precision and tp/pp/cp; the level error cancels):", ""] + _ratio_table(pairs)
    siblings = sibling_gpus(rows)
    if siblings:
        lines += ["", "The same run on two GPUs (one source; model, GPU count, job, layout and knobs equal; step-time "
                  "ratio first / second):", ""] + _ratio_table(siblings)
    fams, n, floor, model = repeat_floor(rows)
    if n:
        lines += ["", f"Measured more than once (same configuration and GPU, e.g. one recipe in several releases): "
                  f"{fams} runs, {n} rows; the best single step time per run misses them by {floor:.1%} MAPE (what no "
                  f"model of the stated configuration can beat); the model: {model:.1%}"]
    over = [f"{r.id} ({r.peak_gib:.1f} vs {r.limit_gib:.1f} GiB)" for r in rows if not r.fits and not r.cannot_fit]
    bad = [f"{r.id} ({r.peak_gib:.1f} GiB)" for r in rows if r.cannot_fit]
    sound = [r for r in rows if not r.cannot_fit]
    lines += ["", f"Runs that really trained, predicted to fit under the default headroom: "
              f"{sum(r.fits for r in rows)}/{len(rows)}"
              + (f"; {sum(r.fits for r in sound)}/{len(sound)} of the layouts that can fit by the code "
                 f"(published layouts that cannot, their case's layout_cannot_fit: {', '.join(bad)})" if bad else "")
              + (f"; predicted NOT to fit: {', '.join(over)}" if over else "")]
    mem = memory_summary(rows)
    if mem:
        lines += ["", mem]
    fitted = sorted(g for path in default_files() for g in fidelity.calibration_groups(fidelity.load_cases(path)[1]))
    if fitted:
        lines += ["", f"Not held out (joined the calibration set; scored by benchmarks/fidelity.py): {', '.join(fitted)}"]
    host = sorted(host_calibration_ids())
    if host:
        lines += ["", f"Not held out (the {len(host)} rows the MoE host cost frameworks.megatron.moe_host_s_per_layer "
                  "/ moe_host_s_per_expert is fitted on: the MoE rows without A2A overlap, hybrid stacks apart, of the "
                  f"host_calibration groups; scored by benchmarks/fidelity.py host_fit_report): {', '.join(host)}"]
    if skipped:
        lines += ["", "Not priced (the model cannot express them yet):"] + [f"- {cid}: {why}" for cid, why in skipped]
    return "\n".join(lines)


def moe_residuals(rows: list[HeldRow]) -> str:
    """Per MoE run: (measured − predicted) step time spread over the binding stage's layer-micro-batches, in ms — a
    term the cost model lacks shows as an excess that tracks what causes it (here: routed experts per rank, micro-batch
    size and the run's MoE knobs). A diagnostic view, fitted on nothing."""
    lines = ["| case | mbs | experts / rank | error | excess per layer-micro-batch (ms) | MoE knobs | pp / vp "
             "| host issue (ms) | host priced (ms) |",
             "|---|---:|---:|---:|---:|---|---|---:|---:|"]
    for r in sorted((r for r in rows if r.moe), key=lambda r: (r.local_experts, r.mbs, r.id)):
        lines.append(f"| {r.id} | {r.mbs} | {r.local_experts} | {r.error:+.1%} | {_excess_ms(r):+.2f} | {r.moe_knobs} "
                     f"| {r.pp} / {r.vp} | {r.host_issue_ms:.2f} | {r.host_priced_ms:.2f} |")
    # the A2A-overlap runs whose experts the host issues: excess over the host issue the prediction left unpriced
    hyb = "moe_dispatcher=hybridep"
    for name, sel in (("alltoall / deepep, pp > 1 (interleaved: combined 1F1B per model chunk)",
                       lambda r: r.pp > 1 and hyb not in r.moe_knobs),
                      ("alltoall / deepep, pp = 1", lambda r: r.pp == 1 and hyb not in r.moe_knobs),
                      ("hybridep", lambda r: hyb in r.moe_knobs)):
        mine = [r for r in rows if r.moe and "moe_a2a_overlap=True" in r.moe_knobs and r.host_issue_ms > 0 and sel(r)]
        ratio = [_excess_ms(r) / (r.host_issue_ms - r.host_priced_ms) for r in mine
                 if r.host_issue_ms > r.host_priced_ms]
        if ratio:
            lines.append(f"\nA2A overlap with host-issued experts, {name}: {len(mine)} runs, excess / (host issue − "
                         f"host priced) median {statistics.median(ratio):.2f} "
                         f"(range {min(ratio):.2f}..{max(ratio):.2f})")
    return "\n".join(lines)


def _excess_ms(r: HeldRow) -> float:
    """(measured − predicted) over the binding stage's layer-micro-batches, ms."""
    return (r.measured_s - r.predicted_s) / (r.microbatches * r.stage_layers) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=Path, nargs="*", help="held-out files (default: benchmarks/data/more_runs*.json)")
    ap.add_argument("--out", type=Path, default=ROOT / "out", help="folder for heldout.md")
    ap.add_argument("--what-if", action="append", default=[], metavar="GEN.FIELD=VALUE",
                    help="diagnostic only: override a catalog value (e.g. blackwell.attention=0.42, "
                         "gb200.nvlink_domain_size=64) to size a suspected bias; not a fit")
    ap.add_argument("--moe-residuals", action="store_true",
                    help="also print each MoE run's excess time per layer-micro-batch (diagnostic)")
    args = ap.parse_args(argv)
    what_if = parse_what_if(args.what_if)
    rows, skipped, cases = evaluate(args.files or None, what_if)
    table = render(rows, skipped, cases)
    if what_if:
        table = (f"WHAT-IF (not the catalog): {', '.join(args.what_if)}\n\n") + table
    if args.moe_residuals:
        table += "\n\nMoE residuals (measured − predicted):\n\n" + moe_residuals(rows)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "heldout.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
