"""Fidelity of the cost model against published, measured training runs.

Reads ``benchmarks/data/published_runs.json`` (a copy of ``shared/calibration/published_runs.json``: Megatron
SC'21 Table 1 on A100, the Megatron-Core README table on H100, NeMo 24.07 on H100 fp8) and the documented
resolutions of what the papers leave unstated (``benchmarks/data/resolutions.json``), predicts every run with
the catalog's per-generation efficiencies, and reports predicted vs measured step time (the primary metric:
SC'21 counts recompute FLOPs, NeMo/Megatron-Core count model FLOPs) and MFU, the error per group and per GPU
generation, the mean absolute percentage error (MAPE), the worst case, and the leave-one-out error of
``autoplan calibrate``'s fit within each generation.

    python benchmarks/fidelity.py                      # table + out/fidelity.svg + out/fidelity.md
    python benchmarks/fidelity.py --fit                # refit the catalog parameters per generation (prints YAML)
    python benchmarks/fidelity.py --no-loo             # skip the leave-one-out refits (faster)

The scatter plot is a hand-written SVG (no plotting dependency): predicted vs measured step time, log-log,
with the ±10% band.

What the model needs to get these right (all in ``cost_models``, each parameter per GPU generation in
``autoplan/catalog/gpus.yaml``, marked [fit] / [meas] / [prior] there):

- GEMMs: a saturation curve per dimension (``gemm_max``, ``gemm_half_dim``) under the HBM roofline; fp8 speeds
  GEMMs only (``fp8_gemm_speedup``) and adds Transformer Engine's cast traffic.
- Memory-bound kernels (norms, residual adds, activations, rotary, the fp32 loss, fp8 casts) by their HBM bytes
  at ``hbm_bus`` of the datasheet bandwidth: they are what makes small-``h`` models (1.7B, 8B) slower per FLOP.
- Attention: fused (``attention`` of peak on causal FLOPs), or — for the 2021 SC'21 runs, a documented software
  fact of those runs — Megatron's unfused path, whose s×s score traffic dominates small-``h`` layers.
- Collectives: ring α-β at nccl-tests bus bandwidth (``link_bus``, ``nic_bus``), NVLS all-reduce (``nvls_bus``),
  NCCL all-to-all over NVLink at alltoall_perf's (``a2a_link_ratio`` of ``link_bus``),
  hierarchical across nodes; Megatron's TP traffic hidden per collective behind its own GEMM (TE userbuffers:
  ``cost_models/te_userbuffers.py``), torchtitan async TP's by a share (``tp_overlap``), DP traffic hidden
  under backward but for its tail (``dp_overlap``); pipeline bubbles per schedule with uneven stages.

The catalog's [fit] values are ``--fit``'s output: pure bounded least squares on log step time over all runs of
a generation, the same fit ``autoplan calibrate`` runs (``test_fidelity.py`` checks the catalog is its fixed
point). One more [fit], alone and on its own runs: Megatron-Core's MoE host cost, per layer and per local expert
(``fit_moe_host`` on ``host_calibration_runs``, the MoE rows without A2A overlap of the more_runs groups flagged
``host_calibration``; printed last with its leave-one-release-out errors).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autoplan.calibrate import (DEFAULT_FIT_FIELDS, FRAMEWORK_FIT_FIELDS, PHYSICAL_BOUNDS, MeasuredRun,  # noqa: E402
                                ResolvedRun, fit, fit_joint, framework_entry, leave_one_out, on_gpu, resolve_run)
from autoplan.catalog.registry import (efficiency_catalog, efficiency_for, framework_efficiency,  # noqa: E402
                                       load_gpu, resolve_over)
from cost_models.attention_cost import ATTN_BWD_FACTOR  # noqa: E402
from cost_models.specs import ATTENTION_KERNEL_BENCH, ATTENTION_REF_KEYS, Efficiency  # noqa: E402
from cost_models.estimate import estimate  # noqa: E402
from cost_models.targets import framework_of  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
SHARED = ROOT.parent / "shared" / "calibration" / "published_runs.json"


def data_path() -> Path:
    """The project's copy; the shared original when the copy is missing."""
    own = DATA / "published_runs.json"
    return own if own.is_file() else SHARED


def _pad_vocab(v: int, tp: int) -> int:
    unit = 128 * tp  # Megatron --make-vocab-size-divisible-by 128, times tp
    return -(-v // unit) * unit


# Knobs a published case's `software` names, passed to its target's runtime (cost_models.targets).
RUN_KNOBS = ("compile", "async_tp", "fp8_recipe")
# Layout fields a case's `parallel` may add to the published ones (ParallelConfig's names), e.g. an uneven
# pipeline split a recipe states (Megatron --decoder-first/last-pipeline-num-layers).
OPTIONAL_PARALLEL = ("schedule", "first_stage_layers", "last_stage_layers", "account_for_embedding_in_pipeline_split",
                     "account_for_loss_in_pipeline_split", "hsdp_shard_size", "kv_replication", "pipeline_layout",
                     "recompute_modules")
# The inline model fields every case states (published_runs.json's schema); any other ModelSpec field may follow.
MODEL_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size",
              "gated_mlp")


def model_name(case: dict[str, Any]) -> str:
    """The model a case trains: its inline ``name`` or its catalog name (``{"catalog": ...}``)."""
    m = case["model"]
    return str(m.get("name") or m["catalog"])


def _case_model(case: dict[str, Any], group: dict[str, Any]) -> dict[str, Any]:
    """The case's model as ModelSpec fields: an autoplan catalog entry (``{"catalog": "<name>"}``, MoE included) or
    the inline published fields (plus any other ModelSpec field the case states, e.g. ``num_experts``), then the
    group's documented resolutions (``model``, ``case_models``) over it (nested ``arch`` / ``mla`` field by field)."""
    from autoplan.catalog import load_model
    from cost_models.specs import ModelSpec

    m = case["model"]
    if "catalog" in m:
        base = load_model(m["catalog"]).model_dump()
    else:
        if m.get("moe"):
            raise NotImplementedError(f"{case['id']}: a 'moe' block is not read; state ModelSpec fields "
                                      "(num_experts, moe_top_k, ...) or use {\"catalog\": name}")
        extra = {k: v for k, v in m.items() if k in ModelSpec.model_fields and k != "name" and k not in MODEL_KEYS}
        base = {**{k: m[k] for k in MODEL_KEYS}, **extra}
    out = {**base, "name": case["id"]}
    for over in (group.get("model", {}), group.get("case_models", {}).get(case["id"], {})):
        for k, v in over.items():  # nested groups (arch, mla) are merged field by field, not replaced
            out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def to_run(case: dict[str, Any], rules: dict[str, Any]) -> MeasuredRun:
    """A published case as an ``autoplan calibrate`` run line, with the group's documented resolutions."""
    group = rules["groups"][case["group"]]
    cl, job, par = case["cluster"], case["job"], case["parallel"]
    model = _case_model(case, group)
    if group.get("vocab_padding", True):
        model["vocab_size"] = _pad_vocab(model["vocab_size"], par["tp"])
    per_case = group.get("cases", {}).get(case["id"], {})
    defaults = group.get("defaults", {})
    # a case's resolution first: it corrects the data where the run's own source says otherwise
    mbs = per_case.get("micro_batch_size") or job["micro_batch_size"] or defaults.get("micro_batch_size")
    vp = per_case.get("vp") or par["vp"] or defaults.get("vp") or 1
    sp = par["sequence_parallel"]
    if sp is None:
        sp = bool(defaults.get("sequence_parallel_when_tp")) and par["tp"] > 1
    parallel = {"tp": par["tp"], "pp": par["pp"], "cp": par["cp"], "ep": par["ep"], "vp": vp,
                "micro_batch_size": mbs, "sequence_parallel": sp, "zero_stage": par["zero_stage"],
                "recompute": par["recompute"] or "none",
                **{k: per_case[k] if k in per_case else par[k] for k in OPTIONAL_PARALLEL if k in par or k in per_case}}
    dp = cl["num_gpus"] // (par["tp"] * par["pp"] * par["cp"])
    assert dp == par["dp"], (case["id"], dp, par["dp"])
    sw = case.get("software") or {}
    software: dict[str, bool | float] = dict(group.get("software", {}))
    if "compile" in sw:
        software["compiled"] = bool(sw["compile"])
    if sw.get("framework", "megatron") != "megatron" and not sw.get("async_tp", False):
        software["tp_overlap"] = 0.0  # no TP overlap in this stack
    return MeasuredRun(
        name=case["id"], model=model,
        cluster={"gpu": group.get("gpu", cl["gpu"]), "num_gpus": cl["num_gpus"], "gpus_per_node": cl["gpus_per_node"],
                 "inter_node_gbps": cl["inter_node_gbps_per_gpu"]},
        job={"global_batch_size": job["global_batch_size"], "seq_len": job["seq_len"],
             "precision": job["precision"]},
        parallel=parallel, measured_step_time_s=case["measured"]["step_time_s"], source=case["source"],
        software=software, target=group.get("target", sw.get("framework", "megatron")),
        knobs={**group.get("knobs", {}), **per_case.get("knobs", {}), **{k: sw[k] for k in RUN_KNOBS if k in sw}})


def load_cases(path: Path | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(cases, rules) of a runs file: ``published_runs.json`` (default) with ``resolutions.json``, or a file that
    carries its own ``groups`` (the held-out ``more_runs*.json``: same group and case schema, see its ``about``)."""
    data = json.loads((path or data_path()).read_text())
    rules = {"groups": data["groups"]} if "groups" in data else json.loads((DATA / "resolutions.json").read_text())
    return data["cases"], rules


def skip_reason(case: dict[str, Any], rules: dict[str, Any]) -> str | None:
    """Why the model cannot express ``case`` yet (its group's ``cases.<id>.skip``), or None."""
    return rules["groups"].get(case["group"], {}).get("cases", {}).get(case["id"], {}).get("skip")


def skipped_cases(path: Path | None = None) -> list[tuple[str, str]]:
    """(id, why) of the published cases the model cannot express yet (resolutions.json ``skip``)."""
    cases, rules = load_cases(path)
    return [(c["id"], why) for c in cases if (why := skip_reason(c, rules))]


def published_runs(path: Path | None = None) -> list[tuple[dict[str, Any], ResolvedRun]]:
    cases, rules = load_cases(path)
    return [(c, resolve_run(to_run(c, rules))) for c in cases if not skip_reason(c, rules)]


def more_runs_files() -> list[Path]:
    """The held-out files (``benchmarks/heldout.py``): same case and group schema, each file with its groups."""
    return sorted(DATA.glob("more_runs*.json"))


def calibration_groups(rules: dict[str, Any]) -> set[str]:
    """Groups of a ``more_runs*.json`` file's rules (``load_cases``) that joined the calibration set
    (``"calibration": true``, with a ``calibration_basis``): fitted with published_runs.json, so no longer held out."""
    return {g for g, rule in rules["groups"].items() if rule.get("calibration")}


def host_calibration_groups(rules: dict[str, Any]) -> set[str]:
    """Groups of a ``more_runs*.json`` file whose MoE rows calibrate the MoE host cost alone (``"host_calibration":
    true``, with a ``host_calibration_basis``): ``fit_moe_host``'s runs, so no longer held out; their dense rows are."""
    return {g for g, rule in rules["groups"].items() if rule.get("host_calibration")}


def host_calibration_runs(with_overlap: bool = False) -> list[tuple[dict[str, Any], ResolvedRun]]:
    """(case, resolved run) of the MoE rows of every ``host_calibration_groups`` group, documented skips left out;
    a case's ``logo_group`` is its group's ``logo_group`` or the group (leave-one-group-out holds out a release).
    Rows with Megatron's A2A overlap (``moe_a2a_overlap``) are left out unless ``with_overlap``: the overlap
    interleaves two micro-batches on the one host thread the dispatcher's per-layer sync stalls, a host pattern
    ``host_bound_s`` does not describe, and they miss by more than any per-expert cost mends (``host_fit_report``) —
    they stay held out. Hybrid (Mamba) stacks are left out too: their graphed Mamba / attention layers cover part of
    the MoE layers' host issue (cost_models.host_cover) and their misses at 8 local experts are not host cost
    (issue-12.md, s11-super) — they stay held out (tests/test_heldout_runs.py HYBRID_MTP_GUARD)."""
    out = []
    for path in more_runs_files():
        cases, rules = load_cases(path)
        keep = host_calibration_groups(rules)
        for c in cases:
            if c["group"] in keep and not skip_reason(c, rules):
                run = resolve_run(to_run(c, rules))
                if run.model.num_experts > 0 and run.model.hybrid_pattern is None \
                        and (with_overlap or not run.knobs.given().get("moe_a2a_overlap")):
                    out.append(({**c, "logo_group": rules["groups"][c["group"]].get("logo_group", c["group"])}, run))
    return out


def calibration_cases() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(case, rules) of every calibration run: published_runs.json's, then the calibration groups of the
    ``more_runs*.json`` files. A case's ``logo_group`` is its source for leave-one-group-out (a group's
    ``logo_group``: a later transcription of one table is held out with that table)."""
    cases, rules = load_cases()
    out = [({**c, "logo_group": c["group"]}, rules) for c in cases]
    for path in more_runs_files():
        mine, more = load_cases(path)
        keep = calibration_groups(more)
        out += [({**c, "logo_group": more["groups"][c["group"]].get("logo_group", c["group"])}, more)
                for c in mine if c["group"] in keep]
    return out


def calibration_runs() -> list[tuple[dict[str, Any], ResolvedRun]]:
    """The runs the catalog is fitted on (``calibration_cases``), resolved; documented skips left out."""
    return [(c, resolve_run(to_run(c, rules))) for c, rules in calibration_cases() if not skip_reason(c, rules)]


@dataclass
class Row:
    id: str
    group: str
    generation: str
    measured_s: float
    predicted_s: float
    measured_mfu: float | None
    predicted_mfu: float
    loo_error: float | None = None
    logo_error: float | None = None

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


def _measured_mfu(case: dict[str, Any], pred_mfu: float, pred_s: float) -> float | None:
    """Measured MFU on the model's own FLOP count (ours, no recompute, non-causal attention): our predicted
    MFU scaled by predicted/measured step time, so both columns use one FLOP accounting."""
    return pred_mfu * pred_s / case["measured"]["step_time_s"]


def evaluate(with_loo: bool = True, with_logo: bool | None = None) -> list[Row]:
    """In-sample rows; ``with_loo``: leave-one-out within each generation's Megatron-Core runs;
    ``with_logo`` (default: as ``with_loo``): leave-one-group-out over every run (``leave_one_group_out``)."""
    runs = calibration_runs()
    rows = []
    for case, run in runs:
        pred = estimate(run.model, run.cluster_with(), run.job, run.parallel, target=run.target, software=run.knobs)
        rows.append(Row(case["id"], case["group"], run.cluster.gpu.generation, run.measured_step_time_s,
                        pred.step_time_s, _measured_mfu(case, pred.mfu, pred.step_time_s), pred.mfu))
    if with_loo:
        by_gen: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            if runs[i][1].target == "megatron":
                by_gen[r.generation].append(i)
        for idx in by_gen.values():
            errs = leave_one_out([runs[i][1] for i in idx], prior_weight=0.0)  # as the catalog fit
            for i, e in zip(idx, errs):
                rows[i].loo_error = e
    if with_loo if with_logo is None else with_logo:
        logo = leave_one_group_out(runs)
        for r in rows:
            r.logo_error = logo[r.id]
    return rows


def summarize(rows: list[Row], key: str) -> list[tuple[str, int, float, float, str, float | None]]:
    """(name, n, MAPE, worst |error|, worst id, LOO MAPE) per ``key`` (group / generation / all)."""
    return [x[:6] for x in summarize_logo(rows, key)]


def summarize_logo(rows: list[Row], key: str) -> list[tuple[Any, ...]]:
    """``summarize`` + (LOGO MAPE, LOGO worst |error|, LOGO worst id)."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        groups["all" if key == "all" else getattr(r, key)].append(r)
    out = []
    for name, rs in groups.items():
        worst = max(rs, key=lambda r: abs(r.error))
        loo = [abs(r.loo_error) for r in rs if r.loo_error is not None]
        lg = [r for r in rs if r.logo_error is not None]
        lw = max(lg, key=lambda r: abs(r.logo_error or 0.0)) if lg else None
        out.append((name, len(rs), sum(abs(r.error) for r in rs) / len(rs), abs(worst.error), worst.id,
                    sum(loo) / len(loo) if loo else None,
                    sum(abs(r.logo_error or 0.0) for r in lg) / len(lg) if lg else None,
                    abs(lw.logo_error or 0.0) if lw else None, lw.id if lw else None))
    return out


def render(rows: list[Row]) -> str:
    lines = ["| case | group | gen | measured s | predicted s | error | MFU meas | MFU pred | LOO error | LOGO error |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        loo = f"{r.loo_error:+.1%}" if r.loo_error is not None else "-"
        logo = f"{r.logo_error:+.1%}" if r.logo_error is not None else "-"
        mm = f"{r.measured_mfu:.3f}" if r.measured_mfu is not None else "-"
        lines.append(f"| {r.id} | {r.group} | {r.generation} | {r.measured_s:.3f} | {r.predicted_s:.3f} | "
                     f"{r.error:+.1%} | {mm} | {r.predicted_mfu:.3f} | {loo} | {logo} |")
    lines += ["", "In-sample: the catalog (one parameter set per generation, one per framework). LOO: refit without "
              "the run (Megatron-Core runs, per generation). LOGO: refit without the run's whole group (source) and "
              "predict it — the honest number.", "",
              "| scope | n | MAPE | worst abs error | worst case | LOO MAPE | LOGO MAPE | LOGO worst | LOGO worst case |",
              "|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for key in ("group", "generation", "all"):
        for name, n, mape, worst, wid, loo, lmape, lworst, lwid in summarize_logo(rows, key):
            f = (lambda v: f"{v:.1%}" if v is not None else "-")
            lines.append(f"| {key}: {name} | {n} | {mape:.1%} | {worst:.1%} | {wid} | {f(loo)} | {f(lmape)} | "
                         f"{f(lworst)} | {lwid or '-'} |")
    return "\n".join(lines)


def job_key(case: dict[str, Any]) -> tuple[Any, ...]:
    """The job a run trains: model, GPU, GPU count, global batch, sequence length (its layout, precision and
    software knobs are the configuration)."""
    return (model_name(case), case["cluster"]["gpu"], case["cluster"]["num_gpus"],
            case["job"]["global_batch_size"], case["job"]["seq_len"])


def ranking(rows: list[Row], logo: bool = False, cases: list[dict[str, Any]] | None = None,
            key: Callable[[dict[str, Any]], tuple[Any, ...]] | None = None) -> tuple[int, int, list[str]]:
    """Pairs of differently configured runs of one job (``job_key``): (ordered right, pairs, the wrong ones).
    A pair is right when the predicted step times order the two runs as the measured ones do; ``logo`` ranks with
    the leave-one-group-out predictions. A predicted tie (within 0.5%) on a measured difference counts wrong.
    ``cases``: the runs file's cases (default: the calibration set's); ``key``: what makes two runs one job
    (default ``job_key``)."""
    keys = {c["id"]: (key or job_key)(c) for c in (cases if cases is not None else [c for c, _ in calibration_cases()])}
    by_job: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for r in rows:
        if not logo or r.logo_error is not None:
            by_job[keys[r.id]].append(r)
    right = total = 0
    wrong: list[str] = []
    for rs in by_job.values():
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                pa, pb = ((x.measured_s * (1 + (x.logo_error or 0.0)) if logo else x.predicted_s) for x in (a, b))
                total += 1
                if abs(pa / pb - 1) > 0.005 and (pa < pb) == (a.measured_s < b.measured_s):
                    right += 1
                else:
                    wrong.append(f"{a.id} vs {b.id}")
    return right, total, wrong


def render_ranking(rows: list[Row]) -> str:
    lines = []
    for logo, name in ((False, "in-sample"), (True, "leave-one-group-out")):
        if logo and not any(r.logo_error is not None for r in rows):
            continue
        right, total, wrong = ranking(rows, logo)
        lines.append(f"Ranking ({name}): {right}/{total} pairs of differently configured runs of one job ordered "
                     f"right ({right / total:.0%}; target >= 85%)" + (f"; wrong: {', '.join(wrong)}" if wrong else ""))
    return "\n".join(lines)


def svg_scatter(rows: list[Row], title: str = "autoplan: predicted vs measured step time") -> str:
    """Log-log scatter with the y = x line and the ±10% band; colour by group."""
    w, h, pad = 640, 600, 70
    vals = [v for r in rows for v in (r.measured_s, r.predicted_s)]
    lo = 10 ** math.floor(math.log10(min(vals) * 0.8))
    hi = 10 ** math.ceil(math.log10(max(vals) * 1.25))
    llo, lhi = math.log10(lo), math.log10(hi)

    def px(v: float) -> float:
        return pad + (math.log10(v) - llo) / (lhi - llo) * (w - 2 * pad)

    def py(v: float) -> float:
        return h - pad - (math.log10(v) - llo) / (lhi - llo) * (h - 2 * pad)

    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    groups = list(dict.fromkeys(r.group for r in rows))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="24" text-anchor="middle" font-size="15">{title}</text>']
    out.append(f'<clipPath id="plot"><rect x="{pad}" y="{pad}" width="{w - 2 * pad}" height="{h - 2 * pad}"/>'
               '</clipPath>')
    band = [(lo, lo * 1.1), (hi, hi * 1.1), (hi, hi * 0.9), (lo, lo * 0.9)]  # 0.9 ≤ predicted / measured ≤ 1.1
    pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in band)
    out.append(f'<polygon points="{pts}" fill="#cccccc" fill-opacity="0.45" stroke="none" clip-path="url(#plot)"/>')
    out.append(f'<line x1="{px(lo):.1f}" y1="{py(lo):.1f}" x2="{px(hi):.1f}" y2="{py(hi):.1f}" stroke="#444" '
               f'stroke-dasharray="4 3"/>')
    out.append(f'<rect x="{pad}" y="{pad}" width="{w - 2 * pad}" height="{h - 2 * pad}" fill="none" stroke="#000"/>')
    for e in range(int(llo), int(lhi) + 1):
        v = 10.0**e
        for m in (1, 2, 5):
            t = m * v
            if not lo <= t <= hi:
                continue
            out.append(f'<line x1="{px(t):.1f}" y1="{h - pad}" x2="{px(t):.1f}" y2="{h - pad + 5}" stroke="#000"/>')
            out.append(f'<text x="{px(t):.1f}" y="{h - pad + 18}" text-anchor="middle">{t:g}</text>')
            out.append(f'<line x1="{pad - 5}" y1="{py(t):.1f}" x2="{pad}" y2="{py(t):.1f}" stroke="#000"/>')
            out.append(f'<text x="{pad - 8}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    out.append(f'<text x="{w / 2}" y="{h - 22}" text-anchor="middle">measured step time (s)</text>')
    out.append(f'<text x="18" y="{h / 2}" text-anchor="middle" transform="rotate(-90 18 {h / 2})">'
               f'predicted step time (s)</text>')
    for r in rows:
        c = colours[groups.index(r.group) % len(colours)]
        out.append(f'<circle cx="{px(r.measured_s):.1f}" cy="{py(r.predicted_s):.1f}" r="4.5" fill="{c}" '
                   f'fill-opacity="0.8"><title>{r.id}: measured {r.measured_s:.3g} s, predicted '
                   f'{r.predicted_s:.3g} s ({r.error:+.1%})</title></circle>')
    for i, g in enumerate(groups + ["±10% band"]):
        y = pad + 16 + 18 * i
        if g == "±10% band":
            out.append(f'<rect x="{pad + 10}" y="{y - 8}" width="10" height="10" fill="#cccccc"/>')
        else:
            out.append(f'<circle cx="{pad + 15}" cy="{y - 3}" r="4.5" fill="{colours[i % len(colours)]}"/>')
        out.append(f'<text x="{pad + 26}" y="{y + 1}">{g}</text>')
    out.append("</svg>")
    return "\n".join(out)


def memory_rows() -> list[tuple[str, float, float, dict[str, float]]]:
    """(id, measured GiB, predicted reserved GiB, predicted breakdown) for every published peak: the runs that
    report one (torchtitan: max over GPUs of ``torch.cuda.max_memory_reserved``) and the extra figures of
    ``data/published_memory.json`` that have no step time (its Table 6 cases)."""
    from autoplan.catalog import build_cluster, load_model
    from cost_models.specs import JobSpec, ParallelConfig

    out = []
    for case, run in calibration_runs():
        meas = case["measured"].get("peak_memory_gib")
        if meas:
            pred = estimate(run.model, run.cluster_with(), run.job, run.parallel, target=run.target, software=run.knobs)
            out.append((case["id"], meas, pred.peak_reserved_gib, pred.memory_gib))
    data = json.loads((DATA / "published_memory.json").read_text())
    for c in data["cases"]:
        if c["table"] != 6:  # the other tables' figures are runs above
            continue
        par = ParallelConfig(tp=c["tp"], pp=c["pp"], cp=c["cp"], micro_batch_size=c["micro_batch_size"],
                             zero_stage=3, recompute="full", sequence_parallel=c["tp"] > 1)
        job = JobSpec(global_batch_size=c["global_batch_size"], seq_len=c["seq_len"], precision="fp8")
        pred = estimate(load_model(c["model"]), build_cluster("h100-sxm-96g", c["num_gpus"], target="torchtitan"),
                        job, par, target="torchtitan")
        out.append((c["id"], c["measured_gib"], pred.peak_reserved_gib, pred.memory_gib))
    return out


def calibration_fits() -> list[tuple[str, float, float, bool]]:
    """(id, predicted device GiB, limit GiB under the default headroom, fits) for every calibration run, priced
    with the knobs its recipe states (issue #12: a configuration that really trained must fit)."""
    out = []
    for case, run in calibration_runs():
        pred = estimate(run.model, run.cluster_with(), run.job, run.parallel, target=run.target, software=run.knobs,
                        check=False)
        out.append((case["id"], pred.peak_memory_gib, pred.memory_limit_gib, pred.fits))
    return out


def render_fits(rows: list[tuple[str, float, float, bool]]) -> str:
    over = [f"{cid} ({gib:.1f} vs {lim:.1f} GiB)" for cid, gib, lim, ok in rows if not ok]
    return (f"Calibration runs predicted to fit under the default headroom: {sum(ok for *_, ok in rows)}/{len(rows)}"
            + (f"; over: {', '.join(over)}" if over else ""))


def render_memory(rows: list[tuple[str, float, float, dict[str, float]]]) -> str:
    lines = ["| case (torchtitan, H100 96GB) | measured GiB (reserved) | predicted reserved | error | predicted "
             "allocated | activations | transients | device (fits?) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for cid, meas, pred, parts in rows:
        lines.append(f"| {cid} | {meas:.1f} | {pred:.1f} | {pred / meas - 1:+.1%} | {parts['allocated']:.1f} | "
                     f"{parts['activations']:.1f} | {parts['transients']:.1f} | {parts['total']:.1f} |")
    errs = [abs(p / m - 1) for _, m, p, _ in rows]
    lines.append(f"| memory MAPE | | | {sum(errs) / len(errs):.1%} (worst {max(errs):.1%}) | | | | |")
    return "\n".join(lines)


def reserve_fit(rows: list[tuple[str, float, float, dict[str, float]]]) -> dict[str, object]:
    """What the published reserved peaks say about ``memory.ALLOCATOR_RESERVE`` (the reserve per byte of activations
    and transients): the value that minimises the memory MAPE on them with every other term as priced, and per run
    the implied ``(measured − allocated) / (activations + transients)``, which is an upper bound of the reserve where
    the allocated model misses terms (the torch.compile pairs: the same priced allocated peak, 5 GiB apart measured)."""
    from cost_models.memory import ALLOCATOR_RESERVE

    meas = [m for _, m, _, _ in rows]
    alloc = [parts["allocated"] for *_, parts in rows]
    churn = [parts["activations"] + parts["transients"] for *_, parts in rows]

    def mape(c: float) -> float:
        return sum(abs(a + c * u - m) / m for a, u, m in zip(alloc, churn, meas)) / len(rows)

    grid = [i / 1000 for i in range(0, 501)]
    best = min(grid, key=mape)
    implied = sorted(((m - a) / u, cid) for (cid, *_), a, u, m in zip(rows, alloc, churn, meas))
    return {"catalog": ALLOCATOR_RESERVE, "catalog_mape": mape(ALLOCATOR_RESERVE), "best": best,
            "best_mape": mape(best), "implied": implied}


def held_reserve_bound() -> tuple[float, str]:
    """The largest held reserve per byte of activations + transients under which every calibration run that holds
    one (PyTorch's default allocator) still fits under the default headroom, at its binding stage: (bound, run)."""
    out = []
    for case, run in calibration_runs():
        pred = estimate(run.model, run.cluster_with(), run.job, run.parallel, target=run.target, software=run.knobs,
                        check=False)
        g = pred.memory_gib
        if g["allocator"] > 0:
            churn = g["activations"] + g["transients"]
            out.append(((pred.memory_limit_gib - pred.peak_memory_gib + g["allocator"]) / churn, case["id"]))
    return min(out)


def render_reserve_fit(fit: dict[str, object]) -> str:
    implied = fit["implied"]
    assert isinstance(implied, list)
    lo, hi = implied[0], implied[-1]
    return (f"Allocator reserve per byte of activations + transients: catalog {fit['catalog']:.3f} (memory MAPE "
            f"{fit['catalog_mape']:.1%}); MAPE-optimal on these peaks {fit['best']:.3f} (MAPE {fit['best_mape']:.1%}); "
            f"per run (measured - allocated) / churn from {lo[0]:.3f} ({lo[1]}) to {hi[0]:.3f} ({hi[1]}); held "
            "(default allocator) at most {:.3f} for every calibration run to fit ({})".format(*held_reserve_bound()))


# DeepSeek-V3's published pre-training (arXiv 2412.19437): 2048 H800, PP 16 (DualPipe), EP 64 over 8 nodes, ZeRO-1
# DP, no TP, fp8, DeepEP-style dispatch (node-limited routing, fp8 dispatch, 20 SMs), sequences of 4096 tokens in
# batches of 15360, recompute of RMSNorm / MLA up-projection / SwiGLU. Step time from the report's own totals:
# 2664K H800 GPU hours for 14.8T tokens (Table 1, §1).
DSV3_GPU_HOURS, DSV3_TOKENS, DSV3_GPUS, DSV3_BATCH, DSV3_SEQ = 2.664e6, 14.8e12, 2048, 15360, 4096


def deepseek_v3_step_s() -> float:
    """Seconds per step implied by the report: GPU hours / GPUs / steps."""
    steps = DSV3_TOKENS / (DSV3_BATCH * DSV3_SEQ)
    return DSV3_GPU_HOURS * 3600 / DSV3_GPUS / steps


def deepseek_v3_prediction():  # type: ignore[no-untyped-def]
    """The cost model on DeepSeek-V3's published layout (target ``deepseek``: its report's memory facts)."""
    from autoplan.catalog import build_cluster, load_model
    from cost_models.specs import JobSpec, ParallelConfig

    cluster = build_cluster("h800", DSV3_GPUS)
    cluster = cluster.model_copy(update={"efficiency": cluster.efficiency.model_copy(
        update={"moe_dispatcher": "deepep", "moe_a2a_overlap": True})})
    job = JobSpec(global_batch_size=DSV3_BATCH, seq_len=DSV3_SEQ, precision="fp8")
    par = ParallelConfig(tp=1, pp=16, ep=64, micro_batch_size=1, schedule="dualpipe", recompute="selective",
                         zero_stage=1)
    return estimate(load_model("deepseek-v3"), cluster, job, par, target="deepseek")


def render_deepseek() -> str:
    pred = deepseek_v3_prediction()
    meas = deepseek_v3_step_s()
    t = pred.time
    return (f"DeepSeek-V3 on 2048 H800 (tp 1, pp 16 DualPipe, ep 64 DeepEP, fp8): predicted {pred.step_time_s:.1f} s "
            f"vs {meas:.1f} s from the report ({pred.step_time_s / meas - 1:+.1%}); compute {t.compute_s:.1f} s, "
            f"recompute {t.recompute_s:.1f} s, bubble {t.bubble_s:.1f} s, exposed EP {t.exposed_comm_s['ep']:.1f} s; "
            f"peak {pred.peak_memory_gib:.1f} GiB device (allocated {pred.peak_allocated_gib:.1f}, reserved "
            f"{pred.peak_reserved_gib:.1f}) of 80: {'fits' if pred.fits else 'DOES NOT FIT'}")


Params = tuple[dict[str, Efficiency], dict[str, dict[str, Any]]]
# fp8 / bf16 GEMM speed-up measured on large matmuls: H100, cuBLAS 12.9 (NVIDIA developer blog "Boosting Matrix
# Multiplication Speed and Flexibility with NVIDIA cuBLAS 12.9", 2025: 1.75x for large FP8 matmuls over BF16).
FP8_GEMM_MICROBENCH = {"hopper": 1.75}


# The runs cannot tell gemm_max from gemm_half_dim: along a ridge of the two the fit's cost is flat (on the 53
# calibration runs 0.823 / 578 and 0.717 / 329 fit within 0.1 point of MAPE; the latter predicts the 125 held-out runs
# of benchmarks/heldout.py 0.5 point worse, 14.7% vs 14.2%). The catalog fit therefore keeps that pair at its earlier
# fit (the 38 runs of sessions 2-3) and fits the other physical parameters; `autoplan calibrate` still fits all six.
GEMM_RIDGE = ("gemm_max", "gemm_half_dim")
CATALOG_FIT_FIELDS = tuple(f for f in DEFAULT_FIT_FIELDS if f not in GEMM_RIDGE)


def fit_params(runs: list[ResolvedRun], starts: dict[str, Efficiency] | None = None,
               fw_starts: dict[str, dict[str, Any]] | None = None, quiet: bool = True,
               also_gpus: dict[str, Any] | None = None, unseen_to_prior: bool = False) -> Params:
    """One set of physical parameters per GPU generation and one per framework, as the catalog is made: each
    generation's ``CATALOG_FIT_FIELDS`` and each other framework's ``FRAMEWORK_FIT_FIELDS`` overrides by one pure
    bounded least-squares fit over all of the generation's runs (``calibrate.fit_joint``): a torchtitan run measures
    the generation's attention kernel too (FlashAttention-2 at a stated fraction of it), not only its own GEMM and
    overlap efficiencies. A generation without Megatron-Core (reference) runs takes another generation's fit through
    ``transfer_efficiency`` (dimensionless efficiencies as they are, the GEMM saturation dim scaled by the ridge
    point); a framework without runs takes no overrides (Megatron-Core's values): what leave-one-group-out predicts
    a group from. ``unseen_to_prior`` (leave-one-group-out): a parameter no training run identifies falls back to its
    datasheet value rather than staying at the catalog's fit, which saw the held-out group."""
    starts = starts or efficiency_catalog()
    fw_starts = fw_starts if fw_starts is not None else {f: framework_efficiency(f) for f in ("torchtitan",)}
    gen_eff: dict[str, Efficiency] = {}
    fw: dict[str, dict[str, Any]] = {}
    gpus = {**(also_gpus or {}), **{g: _gen_gpu(runs, g) for g in {r.cluster.gpu.generation for r in runs}}}
    gens = sorted(gpus, key=lambda g: (g != "hopper", g))
    for gen in gens:
        mine = [r for r in runs if r.cluster.gpu.generation == gen]
        if any(r.target == "megatron" for r in mine):
            res = fit_joint(mine, starts[gen], CATALOG_FIT_FIELDS, fw_starts, FRAMEWORK_FIT_FIELDS)
            gen_eff[gen] = res.efficiency
            fw.update(res.frameworks)
            if unseen_to_prior and "fp8_gemm_speedup" in res.held:
                # no fp8 run left to see it: a GEMM micro-benchmark where there is one, else the datasheet's fp8/bf16
                # peak ratio — not the catalog's own fit, which saw the held-out runs
                g = gpus[gen]
                prior = min(FP8_GEMM_MICROBENCH.get(gen, math.inf), g.peak_fp8_tflops / g.peak_bf16_tflops)
                gen_eff[gen] = gen_eff[gen].model_copy(update={"fp8_gemm_speedup": prior})
            if not quiet:
                print(f"# {gen} (+ {sorted(res.frameworks)}): MAPE {res.mape_before:.1%} -> {res.mape_after:.1%}; "
                      f"held {res.held}; at bound {res.at_bound}", file=sys.stderr)
    for gen in gens:
        if gen not in gen_eff and gen_eff:  # no reference run of this generation: transfer another's physics
            src = next(iter(gen_eff))
            gen_eff[gen] = transfer_efficiency(gen_eff[src], gpus[src], gpus[gen], starts[gen])
        gen_eff.setdefault(gen, starts[gen])
    for f in sorted({framework_of(r.target) for r in runs} - {"megatron", None} - set(fw)):  # type: ignore[operator]
        fr = [r for r in runs if framework_of(r.target) == f]  # only on generations without reference runs
        gen = fr[0].cluster.gpu.generation
        start = gen_eff[gen].model_copy(update=resolve_over(gen_eff[gen], fw_starts.get(f, {})))
        one = fit(fr, start, FRAMEWORK_FIT_FIELDS, prior_weight=0.0)
        fw[f] = framework_entry({n: getattr(one.efficiency, n) for n in FRAMEWORK_FIT_FIELDS}, gen_eff[gen])
    return gen_eff, fw


def machine_balance(gpu: Any) -> float:
    """Peak dense bf16 FLOP per byte of HBM bandwidth: the roofline's ridge point (Williams et al. 2009)."""
    return gpu.peak_bf16_tflops / gpu.hbm_tbytes_per_s


def attention_kernel_share(generation: str) -> float | None:
    """Fused-attention kernel throughput as a share of the bf16 peak, forward and backward together (backward =
    ``ATTN_BWD_FACTOR`` × the forward FLOPs): the generation's cuDNN micro-benchmark (``ATTENTION_KERNEL_BENCH``,
    sources there) over its GPU's datasheet peak; None where no benchmark is recorded."""
    if generation not in ATTENTION_KERNEL_BENCH:
        return None
    gpu, fwd, bwd = ATTENTION_KERNEL_BENCH[generation]
    return kernel_share(fwd, bwd, load_gpu(gpu).peak_bf16_tflops)


def kernel_share(fwd: float, bwd: float, peak: float) -> float:
    """A fused-attention kernel's fwd+bwd share of peak: a forward FLOP and ``ATTN_BWD_FACTOR`` of backward."""
    return (1.0 + ATTN_BWD_FACTOR) / (1.0 / fwd + ATTN_BWD_FACTOR / bwd) / peak


def attention_half_keys_fit(sweep: dict[int, tuple[float, float]], peak: float) -> tuple[float, float]:
    """(share at long sequences, half-saturation keys per query) of ``a·x/(x + h)`` fitted in relative least squares
    to a causal kernel sweep (tokens -> (fwd, bwd) TFLOP/s; keys per query x = tokens/2): how
    ``Efficiency.attention_half_keys`` is made from ``BLACKWELL_ATTENTION_SWEEP``."""
    import numpy as np
    from scipy.optimize import least_squares

    x = np.array([t / 2 for t in sorted(sweep)], dtype=float)
    y = np.array([kernel_share(*sweep[t], peak) for t in sorted(sweep)])
    res = least_squares(lambda u: u[0] * x / (x + u[1]) / y - 1.0, [float(y.max()), ATTENTION_REF_KEYS / 4],
                        bounds=([0.0, 0.0], [1.0, 1e6]))
    return float(res.x[0]), float(res.x[1])


def transfer_efficiency(src: Efficiency, src_gpu: Any, dst_gpu: Any, dst_start: Efficiency) -> Efficiency:
    """A generation's fitted physics carried to a generation with no measured reference run.

    The tensor-core pipeline's large-GEMM efficiency (``gemm_max``), the fp8 ratio and the DP overlap are
    dimensionless and carry over. The GEMM saturation dim does not: a tile keeps the tensor cores fed only once
    its operand reuse (arithmetic intensity, ∝ the GEMM's dims) reaches the machine's ridge point, so
    ``gemm_half_dim`` scales with peak FLOP/s ÷ HBM bytes/s (roofline: Williams et al. 2009). The attention
    kernel's in-training share of peak scales by the ratio of the two generations' cuDNN micro-benchmark shares
    (``attention_kernel_share``) where both are recorded, else carries over. ``tp_overlap`` is a fact of the run's
    software (``software``), not of the GPU: kept at the target's start. The rest (link/NIC/NVLS bus efficiencies,
    HBM streaming share) are the target's own measurements."""
    carry = {n: getattr(src, n) for n in ("gemm_max", "attention", "fp8_gemm_speedup", "dp_overlap")}
    if dst_gpu is not None and src_gpu is not None:
        carry["gemm_half_dim"] = src.gemm_half_dim * machine_balance(dst_gpu) / machine_balance(src_gpu)
        kernel_src, kernel_dst = attention_kernel_share(src_gpu.generation), attention_kernel_share(dst_gpu.generation)
        if kernel_src and kernel_dst:
            carry["attention"] = src.attention * kernel_dst / kernel_src
    if dst_start.fp8_gemm_speedup <= 1.0:
        carry.pop("fp8_gemm_speedup")  # no fp8 tensor cores there
    return dst_start.model_copy(update=carry)


def _gen_gpu(runs: list[ResolvedRun], gen: str) -> Any:
    return next((r.cluster.gpu for r in runs if r.cluster.gpu.generation == gen and r.target == "megatron"),
                next((r.cluster.gpu for r in runs if r.cluster.gpu.generation == gen), None))


def predict_with(run: ResolvedRun, params: Params) -> float:
    gen_eff, fw = params
    eff = gen_eff[run.cluster.gpu.generation]  # a framework's ratios apply to the run's generation, as the catalog's
    return run.predict(on_gpu(eff.model_copy(update=resolve_over(eff, fw.get(framework_of(run.target), {}))), run))


def leave_one_group_out(runs: list[tuple[dict[str, Any], ResolvedRun]]) -> dict[str, float]:
    """Case id → signed error when its whole group (source) is left out of the fit (``fit_params``)."""
    out: dict[str, float] = {}
    def source(c: dict[str, Any]) -> str:
        return str(c.get("logo_group", c["group"]))

    for g in sorted({source(c) for c, _ in runs}):
        train = [r for c, r in runs if source(c) != g]
        # no start from the catalog's own fit of the held-out framework
        params = fit_params(train, fw_starts={}, unseen_to_prior=True, also_gpus={r.cluster.gpu.generation: _gen_gpu([x for _, x in runs],
                                                                                        r.cluster.gpu.generation)
                                                             for _, r in runs})
        for c, r in runs:
            if source(c) == g:
                out[c["id"]] = predict_with(r, params) / r.measured_step_time_s - 1.0
    return out


def fit_catalog() -> dict[str, dict[str, Any]]:
    """Refit the catalog (how its [fit] values were made): ``fit_params`` on every published run, and the MoE host
    cost (``fit_moe_host`` on ``host_calibration_runs``, the catalog's other values held) into ``frameworks.megatron``."""
    runs = [r for _, r in calibration_runs()]
    gen_eff, fw = fit_params(runs, quiet=False)
    out: dict[str, dict[str, Any]] = {g: {n: round(getattr(e, n), 4) for n in CATALOG_FIT_FIELDS}
                                      for g, e in gen_eff.items()}
    for f, entry in fw.items():
        # each fitted value rounded as written on the generation it was fitted on, then stored as its ratio to that
        # generation's written value (to 10 digits: the catalog gives the fitted value back exactly there)
        gen = next(r.cluster.gpu.generation for r in runs if framework_of(r.target) == f)
        written = efficiency_for(gen).model_copy(update={n: out[gen][n] for n in out.get(gen, {})})
        on_gen = resolve_over(gen_eff[gen], entry)
        out[f"framework {f}"] = framework_entry({n: round(float(v), 4) for n, v in on_gen.items()}, written,
                                                ndigits=10)
    host = fit_moe_host([r for _, r in host_calibration_runs()])
    out["framework megatron"] = {f: round(v, 6) for f, v in zip(HOST_FIELDS, host)}
    return out


# The MoE host cost (cost_models/ep_comm.host_bound_s): host seconds to issue one MoE layer per micro-batch under
# Megatron-Core + Transformer Engine, Efficiency.moe_host_s_per_layer (the layer's router, permutes, all-to-alls and
# module calls, one per layer) + moe_host_s_per_expert × local experts (GroupedLinear's per-expert work). A software
# cost of that stack, the same on every GPU generation (gpus.yaml frameworks.megatron). No public source gives it:
# fitted, the two jointly and alone, on the MoE rows of the host-calibration releases (host_calibration_runs), every
# other catalog value held. Bounds as autoplan calibrate's.
HOST_FIELDS = ("moe_host_s_per_layer", "moe_host_s_per_expert")
HOST_BOUNDS = tuple(PHYSICAL_BOUNDS[f] for f in HOST_FIELDS)
HOST_GRID = ((0.0, 1e-3, 6), (0.0, 1e-4, 11))  # (start, step, points) per field: a coarse grid before the local
# refinement (the loss is piecewise smooth: max(device, host) per layer, so it has kinks)
Host = tuple[float, float]  # (moe_host_s_per_layer, moe_host_s_per_expert)
ZERO: Host = (0.0, 0.0)


def with_host(run: ResolvedRun, value: Host) -> float:
    """``run``'s predicted step time with the MoE host cost ``value`` and its own efficiency otherwise."""
    return run.predict(run.cluster.efficiency.model_copy(update=dict(zip(HOST_FIELDS, value))))


def host_loss(runs: list[ResolvedRun], value: Host) -> float:
    """Σ log(T̂/T)² over ``runs`` at host cost ``value``: fit_params' (calibrate.fit's) loss."""
    return float(sum(math.log(with_host(r, value) / r.measured_step_time_s) ** 2 for r in runs))


def fit_moe_host(runs: list[ResolvedRun]) -> Host:
    """The (``moe_host_s_per_layer``, ``moe_host_s_per_expert``) minimising ``host_loss`` over ``runs`` within
    ``HOST_BOUNDS``: the best point of a coarse grid (``HOST_GRID``), then Nelder-Mead from it, clipped to the bounds.
    Deterministic; (0, 0) where no run is host-bound at any value."""
    from scipy.optimize import minimize

    def clip(x: Any) -> Host:
        return (min(max(float(x[0]), HOST_BOUNDS[0][0]), HOST_BOUNDS[0][1]),
                min(max(float(x[1]), HOST_BOUNDS[1][0]), HOST_BOUNDS[1][1]))

    (a0, da, na), (b0, db, nb) = HOST_GRID
    grid = [(a0 + i * da, b0 + j * db) for i in range(na) for j in range(nb)]
    losses = [host_loss(runs, v) for v in grid]
    k = min(range(len(grid)), key=lambda n: (losses[n], grid[n]))
    scale = (1e-3, 1e-4)  # the optimiser works in ms and 0.1 ms
    res = minimize(lambda x: host_loss(runs, clip((x[0] * scale[0], x[1] * scale[1]))),
                   [grid[k][0] / scale[0], grid[k][1] / scale[1]], method="Nelder-Mead",
                   options={"xatol": 1e-4, "fatol": 1e-9, "initial_simplex": [
                       [grid[k][0] / scale[0], grid[k][1] / scale[1]],
                       [grid[k][0] / scale[0] + 0.5, grid[k][1] / scale[1]],
                       [grid[k][0] / scale[0], grid[k][1] / scale[1] + 0.5]]})
    best = clip((res.x[0] * scale[0], res.x[1] * scale[1]))
    return best if host_loss(runs, best) < losses[k] else grid[k]


def host_fit_report(runs: list[tuple[dict[str, Any], ResolvedRun]] | None = None,
                    with_overlap: list[tuple[dict[str, Any], ResolvedRun]] | None = None) -> dict[str, Any]:
    """The host-cost fit and its errors: the fit on ``runs`` (default: ``host_calibration_runs()``), the signed errors
    at 0 and at the fit, leave-one-group-out (fit on the other releases, predict this one), and the robustness check:
    the fit with the A2A-overlap rows too (``with_overlap``, default ``host_calibration_runs(True)``) and those rows'
    errors at 0 / the fit / the fit with them."""
    runs = runs if runs is not None else host_calibration_runs()
    every = with_overlap if with_overlap is not None else host_calibration_runs(with_overlap=True)
    value = fit_moe_host([r for _, r in runs])
    value_all = fit_moe_host([r for _, r in every])
    logo: dict[str, float] = {}
    logo_value: dict[str, Host] = {}
    for g in sorted({c["logo_group"] for c, _ in runs}):
        logo_value[g] = fit_moe_host([r for c, r in runs if c["logo_group"] != g])
        logo.update({c["id"]: with_host(r, logo_value[g]) / r.measured_step_time_s - 1 for c, r in runs
                     if c["logo_group"] == g})
    mine = {c["id"] for c, _ in runs}

    def err(r: ResolvedRun, v: Host) -> float:
        return with_host(r, v) / r.measured_step_time_s - 1

    return {"value": value, "value_all": value_all, "logo_value": logo_value,
            "rows": [(c["id"], c["logo_group"], r.measured_step_time_s, err(r, ZERO), err(r, value), logo[c["id"]])
                     for c, r in runs],
            "all_errors": [err(r, value_all) for _, r in every],
            "others": [(c["id"], c["logo_group"], r.measured_step_time_s, err(r, ZERO), err(r, value),
                        err(r, value_all))
                       for c, r in every if c["id"] not in mine]}


def render_host_fit(rep: dict[str, Any]) -> str:
    def mape(xs: list[float]) -> str:
        return f"{sum(map(abs, xs)) / len(xs):.1%}" if xs else "-"

    lines = ["| case | release | measured s | host 0 | at fit | leave-release-out |", "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {cid} | {g} | {m:.3f} | {e0:+.1%} | {ef:+.1%} | {el:+.1%} |" for cid, g, m, e0, ef, el in rep["rows"]]
    zero, fit_e, logo_e = ([row[i] for row in rep["rows"]] for i in (3, 4, 5))

    def ms(v: Host) -> str:
        return f"{v[0] * 1e3:.3f} ms per layer + {v[1] * 1e3:.3f} ms per local expert"

    lines += ["", f"MoE host cost (frameworks.megatron.{HOST_FIELDS[0]} + {HOST_FIELDS[1]} × local experts, per "
              f"layer-micro-batch) fitted alone on these {len(zero)} rows: {ms(rep['value'])}. MAPE at 0: "
              f"{mape(zero)}; in-sample {mape(fit_e)} (worst {max(map(abs, fit_e)):.1%}); leave-one-release-out "
              f"{mape(logo_e)} (worst {max(map(abs, logo_e)):.1%}; "
              + ", ".join(f"fit without {g}: {ms(x)}" for g, x in rep["logo_value"].items()) + ")",
              "", "A2A-overlap rows of the same releases (not fitted on; held out): error at 0 / at the fit / at the fit "
              "with them", "", "| case | release | measured s | host 0 | at fit | fit with them |",
              "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {cid} | {g} | {m:.3f} | {e0:+.1%} | {ef:+.1%} | {ea:+.1%} |" for cid, g, m, e0, ef, ea in rep["others"]]
    lines += ["", f"With them ({len(rep['all_errors'])} rows): {ms(rep['value_all'])}, in-sample "
              f"{mape(rep['all_errors'])} (worst {max(map(abs, rep['all_errors'])):.1%})"]
    return "\n".join(lines)


def export_runs(folder: Path) -> list[Path]:
    """The published runs in the ``autoplan calibrate`` line format, one file per GPU."""
    by_gpu: dict[str, list[str]] = defaultdict(list)
    for c, rules in calibration_cases():
        run = to_run(c, rules)
        by_gpu[run.cluster.gpu].append(run.model_dump_json(exclude_defaults=True))
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for gpu, lines in by_gpu.items():
        path = folder / f"{gpu}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "out", help="folder for fidelity.svg / fidelity.md")
    ap.add_argument("--no-loo", action="store_true", help="skip the leave-one-out and leave-one-group-out refits")
    ap.add_argument("--fit", action="store_true", help="refit catalog parameters per generation and print them")
    ap.add_argument("--export-runs", type=Path, metavar="DIR",
                    help="write the published runs as `autoplan calibrate` run files, one per GPU (DIR/<gpu>.jsonl)")
    args = ap.parse_args(argv)
    if args.export_runs:
        export_runs(args.export_runs)
        return 0
    if args.fit:
        import yaml

        print(yaml.safe_dump(fit_catalog(), sort_keys=False))  # gpus.yaml efficiency / frameworks
        return 0
    rows = evaluate(with_loo=not args.no_loo)
    table = render(rows) + "\n\n" + render_ranking(rows) + "\n\nPeak memory vs published figures (cost_models.memory, target torchtitan):\n\n"
    mem_rows = memory_rows()
    table += render_memory(mem_rows) + "\n\n" + render_reserve_fit(reserve_fit(mem_rows))
    table += "\n\n" + render_fits(calibration_fits())
    table += "\n\n" + render_deepseek()
    table += "\n\nMoE host cost, fitted alone on its calibration rows (benchmarks/data/more_runs*.json host_calibration):\n\n"
    table += render_host_fit(host_fit_report())
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fidelity.md").write_text(table + "\n")
    (args.out / "fidelity.svg").write_text(svg_scatter(rows))
    print(f"\nwrote {args.out / 'fidelity.md'} and {args.out / 'fidelity.svg'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
