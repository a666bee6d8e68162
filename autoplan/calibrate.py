"""Fit the physical efficiency parameters of the cost model to a user's own measured training runs.

Run file (JSON Lines, one measured run per line; blank lines and lines starting with ``#`` are skipped)::

    {"name": "70b-tp8pp4",                      # optional label, shown in reports
     "model": "llama3-70b",                     # catalog name, HF config.json path, spec path, or a spec mapping
     "cluster": {"gpu": "h100-sxm", "num_gpus": 256,          # autoplan.request.ClusterRequest fields
                 "gpus_per_node": 8, "inter_node_gbps": 400},  # (optional ones default to the catalog's)
     "job": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16"},   # cost_models.specs.JobSpec
     "parallel": {"tp": 8, "pp": 4, "micro_batch_size": 1, "recompute": "none",  # ParallelConfig fields
                  "sequence_parallel": true, "zero_stage": 1, "vp": 5},
     "measured_step_time_s": 6.42,              # measured seconds per optimizer step (steady state, mean)
     "software": {"flash_attention": true},     # optional: the run's attention kernel (default: the profile's)
     "source": "our cluster, 2025-01-12, mean of steps 50-150"}   # optional provenance

Every field except ``measured_step_time_s`` has the meaning (and defaults) it has in ``autoplan estimate``;
omitted ``parallel`` fields take ParallelConfig's defaults — write them all out to avoid surprises.

The fit (:func:`fit`) minimises the log step-time error ``Σ_i log(T̂_i / T_i)²`` over the chosen
:class:`~cost_models.specs.Efficiency` fields with ``scipy.optimize.least_squares``, each bounded to its
physical range (:data:`PHYSICAL_BOUNDS`), plus a weak pull toward the starting (catalog) value so that
parameters the runs cannot tell apart stay where the datasheets and nccl-tests put them rather than
drifting along a flat valley. Parameters the runs are insensitive to are held fixed and reported.
:func:`leave_one_out` refits without each run in turn and predicts it: the error a user should expect on a
configuration they have not measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from autoplan.catalog import load_model
from autoplan.catalog.registry import gpu_efficiency, resolve_over
from autoplan.errors import AutoplanError, UserInputError
from autoplan.request import ClusterRequest
from cost_models.estimate import estimate
from cost_models.specs import ClusterSpec, Efficiency, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets import Software, framework_of, profile_for

# Physical range of each fitted parameter (lower, upper) and why. A fit that ends on a bound is reported.
PHYSICAL_BOUNDS: dict[str, tuple[float, float]] = {
    # cuBLAS large-GEMM throughput / dense peak: A100 ≈ 0.80-0.90, H100 ≈ 0.70-0.80 (NVIDIA cuBLAS
    # benchmarks, Hopper tuning guide); nothing sustains more than 0.95 of the clock-boosted peak.
    "gemm_max": (0.40, 0.95),
    # Dim at which one saturation factor is 1/2: bounded by the smallest tile (64) and a full wave of
    # 128×256 tiles on 132 SMs.
    "gemm_half_dim": (8.0, 1024.0),
    # FlashAttention-2 forward ≈ 0.70 of A100 peak, FA-3 ≈ 0.75 of H100 (Dao 2023; Shah et al. 2024);
    # unfused attention can be far below.
    "attention": (0.10, 0.90),
    # nccl-tests bus bandwidth / nominal NVLink: 0.5-1.07 (NVLS on H100 exceeds the ring's nominal).
    "link_bus": (0.40, 1.10),
    # achieved / line rate of one NIC (IB/RoCE): 0.6-0.98.
    "nic_bus": (0.50, 0.98),
    # fp8 over bf16 GEMM speed-up: 1 (no gain) to 2 (peak ratio).
    "fp8_gemm_speedup": (1.0, 2.0),
    "dp_overlap": (0.0, 1.0),
    "tp_overlap": (0.0, 1.0),
    "memory_bound_fraction": (0.0, 0.5),
    "hbm_bus": (0.30, 0.95),
    "moe_imbalance": (1.0, 3.0),
    # Host time per local expert per MoE layer-micro-batch (ep_comm.host_bound_s): 0 (CUDA-graphed / device-bound)
    # to 2 ms (tens of Python-issued kernels per expert at ~10-20 µs each).
    "moe_host_s_per_expert": (0.0, 2e-3),
    # Host time per MoE layer-micro-batch whatever its experts (router, permutes, all-to-alls, module calls): 0 to
    # 10 ms (hundreds of host-issued ops at ~10-20 µs each).
    "moe_host_s_per_layer": (0.0, 1e-2),
    # NVLS all-reduce busbw / nominal NVLink (nccl-tests H100: 480 / 450).
    "nvls_bus": (0.5, 1.5),
    # Relative spread of identical GPUs' sustained speed (cost_models.gemm.straggler_pace): 0 to 5% (Sinha et al.
    # SC'22 measured 8% average spread across whole clusters of identical GPUs, i.e. σ ≈ 1%).
    "gpu_speed_sigma": (0.0, 0.05),
}
# Efficiency settings a run may state for itself (facts of its software stack, never fitted): the attention kernel,
# whether element-wise kernels are fused (torch.compile / TE), and tp_overlap 0 where the stack has no TP overlap
# (torchtitan without async TP).
SOFTWARE_SETTINGS = {"flash_attention", "attention_fa2", "compiled", "tp_overlap"}
# Per-framework parameters (gpus.yaml `frameworks`): what differs between training stacks on the same GPUs,
# what its GEMM dispatch, fp8 recipe and communication overlap make of the generation's physics. Its
# attention kernel (``attention_fa2``) and eager element-wise bytes (``op_traffic.EAGER_*``) are measured / counted, not fitted.
FRAMEWORK_FIT_FIELDS = ("gemm_max", "fp8_gemm_speedup", "tp_overlap", "dp_overlap")
# Of those, the ones stored as ratios to the GPU's own value (gpus.yaml `frameworks: <f>: scale:`): the stack's
# kernels relative to Megatron-Core/TE's on the same GPU — its GEMM dispatch (gemm_max) and its fp8 GEMMs' gain over
# its bf16 ones (fp8_gemm_speedup) are multiples of what the GPU's tensor cores sustain, so they carry to a GPU the
# framework was never measured on by scaling that GPU's value (as gpu_efficiency's `scale`). The overlap shares are
# absolute: the fraction of a collective the stack's schedule issues under compute (async TP's micro-pipelined
# matmuls, FSDP2's prefetch) is a property of the schedule, not of the GPU's kernels, and Megatron-Core's own share
# (generation tp_overlap 0 where unmeasured, e.g. Blackwell) says nothing about torchtitan's.
FRAMEWORK_RATIO_FIELDS = ("gemm_max", "fp8_gemm_speedup")
DEFAULT_FIT_FIELDS = ("gemm_max", "gemm_half_dim", "attention", "fp8_gemm_speedup", "tp_overlap", "dp_overlap")
PRIOR_WEIGHT = 1e-3  # residual weight of each parameter's (normalised) distance from its start value
_SENSITIVITY_FLOOR = 1e-4  # |d log T / d u| below this on every run: the runs cannot see the parameter


class MeasuredRun(BaseModel):
    """One line of a runs file (see the module docstring; `autoplan schema calibrate_run`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    name: str = ""
    model: str | dict[str, Any]
    cluster: ClusterRequest
    job: JobSpec = Field(default_factory=JobSpec)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    measured_step_time_s: float = Field(gt=0, description="measured seconds per optimizer step")
    software: dict[str, bool | float] = Field(default_factory=dict, description="settings of the run's software "
                                              f"stack, never fitted: {sorted(SOFTWARE_SETTINGS)}")
    target: str = Field(default="megatron", description="the framework that ran it: its memory facts and its "
                        "efficiency parameters (gpus.yaml `frameworks`)")
    knobs: Software = Field(default_factory=Software, description="the target's knobs the run used, e.g. "
                            "grad_reduce_dtype (cost_models.targets: unset = the target's default)")
    source: str = ""

    @field_validator("software")
    @classmethod
    def _known_settings(cls, v: dict[str, bool]) -> dict[str, bool]:
        unknown = sorted(set(v) - SOFTWARE_SETTINGS)
        if unknown:
            raise ValueError(f"unknown software setting(s) {unknown}; valid: {sorted(SOFTWARE_SETTINGS)}")
        return v


@dataclass(frozen=True)
class ResolvedRun:
    """A run with its specs resolved once (the fit evaluates it many times)."""

    name: str
    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    parallel: ParallelConfig
    measured_step_time_s: float
    software: dict[str, bool | float] = field(default_factory=dict)
    target: str = "megatron"
    knobs: Software = field(default_factory=Software)

    def cluster_with(self, eff: Efficiency | None = None) -> ClusterSpec:
        """The run's cluster with efficiency ``eff`` (default: its own) and the run's software settings."""
        eff = (eff or self.cluster.efficiency).model_copy(update=self.software)
        return self.cluster.model_copy(update={"efficiency": eff})

    def predict(self, eff: Efficiency | None = None) -> float:
        return estimate(self.model, self.cluster_with(eff), self.job, self.parallel, check=False,
                        target=self.target, software=self.knobs).step_time_s


def resolve_run(run: MeasuredRun, where: str | None = None) -> ResolvedRun:
    """Resolve names and check the configuration like ``autoplan estimate`` does; errors start with ``where``
    (the run's place in its file) and the run's name, so the bad one of many runs is found."""
    prof = profile_for(run.target)
    try:
        model = load_model(run.model)
        cluster = run.cluster.resolve(run.target)  # the efficiency set the target's profile names
        # as autoplan estimate (TargetProfile.prepare): the target's own ZeRO stage where the run leaves it unset
        # (torchtitan, fsdp: 3; Megatron's Muon: 0), the checks, then the layout the framework really runs
        # (torchtitan's ZeRO-0 with cp); a run without a profile (deepseek) gets estimate's own check
        par = prof.prepare(model, cluster, run.job, run.parallel, run.knobs).runs if prof is not None \
            else run.parallel
        estimate(model, cluster, run.job, par, target=run.target, software=run.knobs,
                 check=prof is None)  # raises ConfigError on a configuration it cannot price
    except AutoplanError as err:
        if where is None:
            raise
        named = f"{where} (run '{run.name}')" if run.name else where
        raise type(err)(f"{named}: {err}") from None  # the message already holds its valid choices / hint
    return ResolvedRun(run.name or model.name, model, cluster, run.job, par, run.measured_step_time_s,
                       dict(run.software), run.target, run.knobs)


MAX_RUNS_LINES = 10_000


def load_runs(path: str | Path) -> list[MeasuredRun]:
    """Parse a runs file; errors name the line (``run_lines`` gives each run's, for later errors)."""
    return [run for _, run in run_lines(path)]


def run_lines(path: str | Path) -> list[tuple[int, MeasuredRun]]:
    """The runs of a runs file with their line numbers; errors name the line."""
    from autoplan.inputs import parse_json, read_text, strict

    lines = read_text(path, what="runs file").splitlines()
    if len(lines) > MAX_RUNS_LINES:
        raise UserInputError(f"runs file '{path}' has {len(lines)} lines; the limit is {MAX_RUNS_LINES}")
    runs: list[tuple[int, MeasuredRun]] = []
    for i, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        data = parse_json(text, f"{path}:{i}")
        runs.append((i, strict(MeasuredRun, data, f"{path}:{i}")))
    if not runs:
        raise UserInputError(f"runs file '{path}' holds no runs")
    return runs


# ---- fitting ------------------------------------------------------------------------------------------------
@dataclass
class FitResult:
    """Fitted efficiency, what moved, and the error before/after (fractions, signed per run)."""

    efficiency: Efficiency
    start: Efficiency
    fitted: list[str]
    held: list[str]  # requested but not identifiable from these runs
    at_bound: list[str]
    errors_before: list[float]
    errors_after: list[float]
    names: list[str] = field(default_factory=list)

    @property
    def mape_before(self) -> float:
        return float(np.mean(np.abs(self.errors_before)))

    @property
    def mape_after(self) -> float:
        return float(np.mean(np.abs(self.errors_after)))


def _bounds(name: str) -> tuple[float, float]:
    if name not in PHYSICAL_BOUNDS:
        raise UserInputError(f"cannot fit '{name}'", valid=sorted(PHYSICAL_BOUNDS))
    return PHYSICAL_BOUNDS[name]


def _with(eff: Efficiency, names: Sequence[str], u: np.ndarray) -> Efficiency:
    values = {}
    for n, x in zip(names, u):
        lo, hi = _bounds(n)
        values[n] = lo + float(np.clip(x, 0.0, 1.0)) * (hi - lo)
    return eff.model_copy(update=values)


def _to_unit(eff: Efficiency, names: Sequence[str]) -> np.ndarray:
    out = []
    for n in names:
        lo, hi = _bounds(n)
        out.append(min(1.0, max(0.0, (getattr(eff, n) - lo) / (hi - lo))))
    return np.array(out)


def relative_errors(runs: Sequence[ResolvedRun], eff: Efficiency | None = None) -> list[float]:
    """(predicted − measured) / measured for each run."""
    return [r.predict(eff) / r.measured_step_time_s - 1.0 for r in runs]


def fit(runs: Sequence[ResolvedRun], start: Efficiency | None = None, fields: Iterable[str] = DEFAULT_FIT_FIELDS,
        *, prior_weight: float = PRIOR_WEIGHT, warm: Efficiency | None = None) -> FitResult:
    """Least-squares fit of ``fields`` of the runs' efficiency (all runs must share one GPU generation).

    ``start`` is the prior's centre and the first starting point (default: the runs' own efficiency);
    ``warm`` (a previous fit of nearly the same runs) replaces both starting points with one."""
    if not runs:
        raise UserInputError("no runs to fit")
    gens = {r.cluster.gpu.generation for r in runs}
    if len(gens) > 1:
        raise UserInputError(f"runs mix GPU generations {sorted(gens)}; fit one generation at a time")
    start = start or runs[0].cluster.efficiency
    names = [n for n in dict.fromkeys(fields)]
    for n in names:
        _bounds(n)
    u0 = _to_unit(start, names)
    meas = np.log([r.measured_step_time_s for r in runs])

    def log_pred(eff: Efficiency) -> np.ndarray:
        return np.log([r.predict(eff) for r in runs])

    # Identifiability: a parameter no run's step time responds to is held at its start value.
    base = log_pred(start)
    keep = []
    for i, n in enumerate(names):
        sens = 0.0
        for step in (-0.1, 0.1):  # probe both sides: a bound or a floor may flatten one of them
            u = u0.copy()
            u[i] = min(1.0, max(0.0, u[i] + step))
            if u[i] != u0[i]:
                sens = max(sens, float(np.max(np.abs(log_pred(_with(start, names, u)) - base))) / abs(u[i] - u0[i]))
        if sens > _SENSITIVITY_FLOOR:
            keep.append(i)
    fitted = [names[i] for i in keep]
    held = [n for n in names if n not in fitted]
    eff = start
    if fitted:
        u_start = u0[keep]
        w = math.sqrt(len(runs)) * prior_weight

        def residuals(u: np.ndarray) -> np.ndarray:
            r = log_pred(_with(start, fitted, u)) - meas
            return np.concatenate([r, w * (u - u_start)])

        # Two starts: the start values, and the middle of every physical range (a start on a plateau — e.g.
        # tp_overlap past the point where only the pipelining floor stays exposed — has no gradient to follow).
        inits = (u_start, np.full_like(u_start, 0.5)) if warm is None else (_to_unit(warm, fitted),)
        sols = [_least_squares(residuals, u0_) for u0_ in inits]
        sol = min(sols, key=lambda x: float(np.sum(residuals(x) ** 2)))
        eff = _with(start, fitted, sol)
        at_bound = [n for n, x in zip(fitted, sol) if x <= 1e-3 or x >= 1 - 1e-3]
    else:
        at_bound = []
    return FitResult(eff, start, fitted, held, at_bound, relative_errors(runs, start), relative_errors(runs, eff),
                     [r.name for r in runs])


@dataclass
class JointFit:
    """A generation's parameters and each framework's overrides, fitted together (``fit_joint``)."""

    efficiency: Efficiency  # the generation's (the reference stack, Megatron-Core)
    frameworks: dict[str, dict[str, Any]]  # framework → its FRAMEWORK_FIT_FIELDS, as stored (framework_entry)
    held: list[str]  # ("framework." +) names no run responds to, kept at their start
    at_bound: list[str]
    mape_before: float
    mape_after: float


def fit_joint(runs: Sequence[ResolvedRun], start: Efficiency, fields: Iterable[str] = DEFAULT_FIT_FIELDS,
              fw_starts: dict[str, dict[str, Any]] | None = None, fw_fields: Iterable[str] = FRAMEWORK_FIT_FIELDS,
              *, prior_weight: float = 0.0) -> JointFit:
    """One least-squares fit of a generation's ``fields`` and, per framework other than Megatron-Core among the
    runs, its ``fw_fields`` overrides — over every run of the generation at once. A framework's run still sees the
    generation's other parameters (its attention kernel as a stated fraction of the generation's, its HBM and
    links), so those are measured by every stack's runs, not only by the reference stack's."""
    if not runs:
        raise UserInputError("no runs to fit")
    gens = {r.cluster.gpu.generation for r in runs}
    if len(gens) > 1:
        raise UserInputError(f"runs mix GPU generations {sorted(gens)}; fit one generation at a time")
    fw_starts = fw_starts or {}
    gen_names = list(dict.fromkeys(fields))
    fw_names = list(dict.fromkeys(fw_fields))
    fws = sorted({f for r in runs if (f := framework_of(r.target)) not in (None, "megatron")})
    blocks = [("", gen_names)] + [(f, fw_names) for f in fws]
    names = [(f, n) for f, ns in blocks for n in ns]
    for _, n in names:
        _bounds(n)

    def effs(u: np.ndarray) -> dict[str, Efficiency]:
        gen = _with(start, gen_names, u[:len(gen_names)])
        out, i = {"megatron": gen}, len(gen_names)
        for f in fws:
            out[f] = _with(_over(gen, fw_starts.get(f, {})), fw_names, u[i:i + len(fw_names)])
            i += len(fw_names)
        return out

    u0 = np.concatenate([_to_unit(start, gen_names)] + [_to_unit(_over(start, fw_starts.get(f, {})), fw_names)
                                                          for f in fws])
    meas = np.log([r.measured_step_time_s for r in runs])

    def log_pred(u: np.ndarray) -> np.ndarray:
        e = effs(u)
        return np.log([r.predict(on_gpu(e[framework_of(r.target) or "megatron"], r)) for r in runs])

    base = log_pred(u0)
    keep = []
    for i in range(len(names)):
        sens = 0.0
        for step in (-0.1, 0.1):
            u = u0.copy()
            u[i] = min(1.0, max(0.0, u[i] + step))
            if u[i] != u0[i]:
                sens = max(sens, float(np.max(np.abs(log_pred(u) - base))) / abs(u[i] - u0[i]))
        if sens > _SENSITIVITY_FLOOR:
            keep.append(i)
    sol_full = u0.copy()
    at_bound: list[str] = []
    if keep:
        w = math.sqrt(len(runs)) * prior_weight
        u_start = u0[keep]

        def residuals(x: np.ndarray) -> np.ndarray:
            u = u0.copy()
            u[keep] = x
            return np.concatenate([log_pred(u) - meas, w * (x - u_start)])

        sols = [_least_squares(residuals, x0) for x0 in (u_start, np.full_like(u_start, 0.5))]
        sol = min(sols, key=lambda x: float(np.sum(residuals(x) ** 2)))
        sol_full[keep] = sol
        at_bound = [_label(names[i]) for i, x in zip(keep, sol) if x <= 1e-3 or x >= 1 - 1e-3]
    e = effs(sol_full)
    held = [_label(names[i]) for i in range(len(names)) if i not in keep]
    before = np.exp(base - meas) - 1.0
    after = np.exp(log_pred(sol_full) - meas) - 1.0
    return JointFit(e["megatron"], {f: framework_entry({n: float(getattr(e[f], n)) for n in fw_names}, e["megatron"])
                                    for f in fws}, held, at_bound,
                    float(np.mean(np.abs(before))), float(np.mean(np.abs(after))))


def _over(base: Efficiency, entry: dict[str, Any]) -> Efficiency:
    return base.model_copy(update=resolve_over(base, entry))


def on_gpu(eff: Efficiency, run: ResolvedRun) -> Efficiency:
    """A generation's (and framework's) efficiency as it prices ``run``: with the run's GPU's own facts over it
    (gpus.yaml ``gpu_efficiency``, e.g. MI325X's sustained-clock GEMM ratio to MI300X), as ``build_cluster`` resolves
    a cluster. ``fit_joint`` fits generation values; a run on a GPU with such an entry sees them through it. The
    entry's ratios and a framework's multiply, and their absolute fields are disjoint, so applying the GPU's entry
    after the framework's gives what the catalog's order (GPU, then framework) gives. The run's target profile's
    kernel facts on its generation (``cluster.target_kernel_fields``: cuDNN SDPA where the profile runs it) last."""
    from autoplan.catalog.cluster import target_kernel_fields

    own = gpu_efficiency(run.cluster.gpu.name)
    eff = _over(eff, own) if own else eff
    kernel = target_kernel_fields(run.target, run.cluster.gpu.generation)
    return eff.model_copy(update=kernel) if kernel else eff


def framework_entry(values: dict[str, float], base: Efficiency, ndigits: int | None = None) -> dict[str, Any]:
    """A framework's fitted values on the GPU whose efficiency is ``base``, as gpus.yaml ``frameworks`` stores them:
    ``FRAMEWORK_RATIO_FIELDS`` under ``scale`` as ratios to ``base``'s value, the rest absolute (``ndigits``: the
    ratios rounded so that ``registry.resolve_over(base, entry)`` gives ``values`` back to 1e-10)."""
    entry: dict[str, Any] = {k: v for k, v in values.items() if k not in FRAMEWORK_RATIO_FIELDS}
    scale = {k: v / float(getattr(base, k)) for k, v in values.items() if k in FRAMEWORK_RATIO_FIELDS}
    if ndigits is not None:
        scale = {k: round(v, ndigits) for k, v in scale.items()}
    return {"scale": scale, **entry} if scale else entry


def _label(name: tuple[str, str]) -> str:
    return f"{name[0]}.{name[1]}" if name[0] else name[1]


def _least_squares(residuals: Any, u0: np.ndarray) -> np.ndarray:
    from scipy.optimize import least_squares

    sol = least_squares(residuals, u0, bounds=(0.0, 1.0), diff_step=1e-3, x_scale=1.0, xtol=1e-12, ftol=1e-14,
                        gtol=1e-14, max_nfev=600)
    return np.asarray(sol.x)


def leave_one_out(runs: Sequence[ResolvedRun], start: Efficiency | None = None,
                  fields: Iterable[str] = DEFAULT_FIT_FIELDS, *, prior_weight: float = PRIOR_WEIGHT,
                  progress: Callable[[int, int], None] | None = None) -> list[float]:
    """For each run: fit on the others, predict it; signed relative errors in run order.
    ``progress(done, total)`` after each refit (one fit per run: the slow part of ``calibrate``)."""
    fields = tuple(fields)
    full = fit(runs, start, fields, prior_weight=prior_weight)  # warm start for each refit
    out = []
    for i, run in enumerate(runs):
        if progress is not None:
            progress(i, len(runs))
        rest = [r for j, r in enumerate(runs) if j != i]
        res = fit(rest, start, fields, prior_weight=prior_weight, warm=full.efficiency) if rest else None
        eff = res.efficiency if res else start
        out.append(run.predict(eff) / run.measured_step_time_s - 1.0)
    return out


# ---- profile -----------------------------------------------------------------------------------------------
def profile_mapping(gpu: str, eff: Efficiency, fitted: Iterable[str], cluster: ClusterSpec | None = None,
                    comment: str = "") -> dict[str, Any]:
    """The cluster-profile mapping ``autoplan.catalog.build_cluster(profile=...)`` reads."""
    def value(n: str) -> Any:
        v = getattr(eff, n)
        return v if v is None or isinstance(v, (bool, str)) else round(float(v), 6)

    out: dict[str, Any] = {"gpu": gpu, "efficiency": {n: value(n) for n in fitted}}
    if cluster is not None:
        out.update(gpus_per_node=cluster.gpus_per_node, inter_node_gbps=cluster.inter_node_gbps,
                   nvlink_domain_size=cluster.nvlink_domain_size)
    return out


def write_profile(path: str | Path, mapping: dict[str, Any], header: str = "") -> None:
    text = yaml.safe_dump(mapping, sort_keys=False)
    lines = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    from autoplan.outputs import output_target

    output_target(str(path), what="cluster profile").write_text(lines + text)
