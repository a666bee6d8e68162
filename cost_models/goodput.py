"""Goodput under failures: the share of wall time that becomes training progress, once interruptions,
checkpoints and restarts are paid for.

Failures. Interruptions arrive as a Poisson process whose rate grows with the GPUs in the job:
``λ = r · N`` per hour, ``M = 1/λ`` the job's mean time between interruptions. The default rate ``r`` is
from Llama 3 405B pre-training: 419 unexpected interruptions in 54 days on 16,384 H100 (Llama 3 paper,
Dubey et al. 2024, §3.3.4), ``r = 419 / (54·24·16384) ≈ 1.97e-5`` per GPU-hour (M ≈ 3.1 h at 16,384 GPUs).
``mtbf_hours`` overrides M for the whole job.

Checkpoints are priced from the plan's own sharding. A checkpoint holds, once, every parameter's bf16
weight and its fp32 master copy and Adam moments: ``2 + 12`` bytes per parameter (memory.py's
WEIGHT_BYTES + OPTIM_BYTES). Each rank writes the state of its TP/PP/EP shard, and state replicated across the
data-parallel ranks is split among them (Megatron ``--ckpt-fully-parallel-save``; torch DCP's de-duplicated
save plans), so a rank of pipeline stage ``s`` writes ``14·(dense_s/(dp·cp) + expert_s/edp)`` bytes. Storage
bandwidth ``B`` (GB/s, aggregate) is shared evenly by the ``N`` ranks and a save ends with its slowest rank:
``W = N · max_s bytes_s / B`` (a balanced plan: the checkpoint's size over B; embeddings on the first stage
make it longer). Default B = 2 TB/s, the sustained throughput of the Tectonic store behind Llama 3 (§3.3.1).
A blocking save stalls training for ``δ = W``; an async save (Megatron ``--async-save``, DCP ``async_save``)
stalls only for the device-to-host copy, ``δ = bytes / staging``, while the write goes on, and the newest
checkpoint is durable only ``W`` after it was taken: a failure loses ``W`` more work, charged here to the
restart. A restart costs ``R = restart_s`` (re-schedule, launch, NCCL init; an assumption, not measured
here) plus reading the checkpoint back at the same bandwidth.

Interval and goodput (Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 22 (2006)): with exponential failures the wall time to do ``T_s`` of work checkpointing every ``τ`` is
``T_w = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s/τ``, so goodput = ``T_s/T_w``. The interval that maximises it
is Daly's higher-order estimate ``τ = √(2δM)·[1 + ⅓√(δ/2M) + (1/9)(δ/2M)] − δ`` for ``δ < 2M``, else ``M``;
its first term is Young's ``√(2δM)`` (CACM 17 (1974)). Checkpoints fall on step boundaries: the
interval is rounded to whole steps (at least one) and, for async saves, to no less than one write.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from cost_models.memory import GIB, OPTIM_BYTES, WEIGHT_BYTES, expert_data_parallel_size, stage_params
from cost_models.specs import ClusterSpec, ModelSpec, ParallelConfig
from cost_models.validate import pipeline_split

# Llama 3 405B pre-training (Dubey et al. 2024, §3.3.4, Table 5): interruptions, days, GPUs.
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16384
DEFAULT_INTERRUPTIONS_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
DEFAULT_CHECKPOINT_GBPS = 2000.0  # Tectonic, sustained 2 TB/s (Llama 3 §3.3.1)
DEFAULT_STAGING_GBPS = 50.0  # device→host copy per GPU: PCIe 5.0 x16 is 63 GB/s per direction, ~80% achieved
DEFAULT_RESTART_S = 600.0  # re-schedule + launch + NCCL init before reading the checkpoint (assumed, 10 min)
CHECKPOINT_BYTES_PER_PARAM = WEIGHT_BYTES + OPTIM_BYTES  # bf16 weight + fp32 master, Adam m and v


MAX_RESTART_S = 1e6  # a relaunch of over 11 days is no input anyone means


class FailureModel(BaseModel):
    """Inputs of the goodput model (every field has a documented default; see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    interruptions_per_gpu_hour: float = Field(default=DEFAULT_INTERRUPTIONS_PER_GPU_HOUR, gt=0, le=1,
                                              description="failure rate per GPU-hour (default: Llama 3 §3.3.4)")
    mtbf_hours: float | None = Field(default=None, gt=0, le=1e6,
                                     description="the job's mean time between interruptions; overrides the rate")
    checkpoint_gbps: float = Field(default=DEFAULT_CHECKPOINT_GBPS, gt=0, le=1e6,
                                   description="aggregate storage bandwidth for checkpoints, GB/s")
    async_save: bool = Field(default=False, description="async checkpoint save (stall only for the host copy)")
    staging_gbps: float = Field(default=DEFAULT_STAGING_GBPS, gt=0, le=1e4,
                                description="device-to-host copy bandwidth per GPU for async saves, GB/s")
    restart_s: float = Field(default=DEFAULT_RESTART_S, ge=0, le=MAX_RESTART_S,
                             description="time to relaunch after an interruption, before loading the checkpoint")

    def job_mtbf_hours(self, num_gpus: int) -> float:
        return self.mtbf_hours if self.mtbf_hours is not None else 1.0 / (self.interruptions_per_gpu_hour * num_gpus)


class Goodput(BaseModel):
    """Expected training progress after failures, checkpoints and restarts, for one plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mtbf_hours: float = Field(description="the job's mean time between interruptions")
    checkpoint_gib_per_rank: float = Field(description="bytes the busiest rank writes per checkpoint, GiB")
    checkpoint_total_gib: float = Field(description="checkpoint size, all ranks, GiB")
    checkpoint_write_s: float = Field(description="time until a checkpoint is durable")
    checkpoint_stall_s: float = Field(description="training time lost per checkpoint (blocking: the write)")
    restart_s: float = Field(description="per interruption: relaunch + checkpoint read (+ the async write lag)")
    interval_s: float = Field(description="training time between checkpoints (Daly's optimum, whole steps)")
    interval_steps: int = Field(ge=1)
    goodput: float = Field(description="share of wall time that is training progress (Daly 2006)")
    tokens_per_s: float = Field(description="tokens/s after failures: step throughput x goodput")
    lost_hours_per_day: float = Field(description="expected wall hours per day not turned into progress")
    async_save: bool


def young_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Young (1974): ``√(2δM)``."""
    return math.sqrt(2.0 * stall_s * mtbf_s)


def daly_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Daly (2006), higher order: ``√(2δM)[1 + ⅓√(δ/2M) + (1/9)(δ/2M)] − δ`` for ``δ < 2M``, else ``M``."""
    if stall_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = stall_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * stall_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - stall_s


def goodput_fraction(interval_s: float, stall_s: float, restart_s: float, mtbf_s: float) -> float:
    """``τ / (M·e^{R/M}·(e^{(τ+δ)/M} − 1))``: Daly (2006)'s wall time inverted (work per unit wall time). Where the
    denominator overflows a float (a restart or save hundreds of MTBFs long) the fraction is below 1e-300: 0."""
    try:
        return interval_s / (mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + stall_s) / mtbf_s))
    except OverflowError:
        return 0.0


def checkpoint_bytes_per_rank(model: ModelSpec, par: ParallelConfig, num_gpus: int, layers: list[int]) -> list[float]:
    """Bytes one rank of each pipeline stage writes (replicated state split across its data-parallel peers)."""
    dp = num_gpus // (par.tp * par.pp * par.cp)
    edp = expert_data_parallel_size(par.tp, par.cp, dp, par.ep)
    split = pipeline_split(model, par)  # the layers each rank holds (interleaved: every pp-th chunk)
    ids = split.layer_ids if split.rank_layers == list(layers) else None
    out, start = [], 0
    for s, n in enumerate(layers):
        held = ids[s] if ids is not None else range(start, start + n)
        sp = stage_params(model, par, held, first=s == 0, last=s == par.pp - 1, mtp=s == split.mtp_rank)
        start += n
        out.append(CHECKPOINT_BYTES_PER_PARAM * (sp.dense / (dp * par.cp) + sp.expert / edp))
    return out


def goodput(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig, layers: list[int], step_time_s: float,
            tokens_per_s: float, failures: FailureModel | None = None) -> Goodput:
    """Goodput of a plan whose step takes ``step_time_s`` (see the module docstring for every term)."""
    f = failures or FailureModel()
    n = cluster.num_gpus
    per_stage = checkpoint_bytes_per_rank(model, par, n, layers)
    ranks_per_stage = n // par.pp
    rank_bytes = max(per_stage)
    total_bytes = sum(per_stage) * ranks_per_stage
    write_s = n * rank_bytes / (f.checkpoint_gbps * 1e9)
    mtbf_s = f.job_mtbf_hours(n) * 3600.0
    restart = f.restart_s + write_s  # relaunch, then every rank reads its shard back
    if f.async_save:
        stall = rank_bytes / (f.staging_gbps * 1e9)
        restart += write_s  # the newest checkpoint is durable only W after it was taken
    else:
        stall = write_s
    tau = daly_interval_s(stall, mtbf_s)
    if f.async_save:
        tau = max(tau, write_s)  # one save in flight at a time
    steps = max(1, round(tau / step_time_s))
    if f.async_save:
        steps = max(steps, math.ceil(write_s / step_time_s))
    tau = steps * step_time_s
    g = goodput_fraction(tau, stall, restart, mtbf_s)
    return Goodput(mtbf_hours=mtbf_s / 3600.0, checkpoint_gib_per_rank=rank_bytes / GIB,
                   checkpoint_total_gib=total_bytes / GIB, checkpoint_write_s=write_s, checkpoint_stall_s=stall,
                   restart_s=restart, interval_s=tau, interval_steps=steps, goodput=g, tokens_per_s=tokens_per_s * g,
                   lost_hours_per_day=24.0 * (1.0 - g), async_save=f.async_save)


def goodput_upper_bound(model: ModelSpec, cluster: ClusterSpec, failures: FailureModel | None = None) -> float:
    """A goodput no plan of ``model`` on ``cluster`` can exceed: every rank writes at least its even share of
    ``14·params`` bytes (each parameter's state is written once; TP-replicated norms and tied copies only add),
    goodput falls with the stall and the restart, and the interval is the exact optimum, not a rounded one."""
    from scipy.optimize import minimize_scalar  # lazily: only search --rank-by goodput needs it

    f = failures or FailureModel()
    n = cluster.num_gpus
    rank_bytes = CHECKPOINT_BYTES_PER_PARAM * model.num_params / n
    write_s = n * rank_bytes / (f.checkpoint_gbps * 1e9)
    restart = f.restart_s + write_s + (write_s if f.async_save else 0.0)
    stall = rank_bytes / (f.staging_gbps * 1e9) if f.async_save else write_s
    mtbf_s = f.job_mtbf_hours(n) * 3600.0
    best = minimize_scalar(lambda t: -goodput_fraction(t, stall, restart, mtbf_s), bounds=(1e-9, 20 * mtbf_s),
                           method="bounded", options={"xatol": 1e-9 * mtbf_s})
    guess = max(-best.fun, goodput_fraction(daly_interval_s(stall, mtbf_s), stall, restart, mtbf_s))
    return min(1.0, guess * (1 + 1e-6))
