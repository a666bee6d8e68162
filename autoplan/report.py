"""Human-readable rendering of predictions and plans (the table view of the JSON contract)."""

from __future__ import annotations

from cost_models.estimate import Prediction
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig


def describe_software(knobs: dict[str, object]) -> str:
    """Every knob a prediction assumed (``Prediction.software``), on one line."""
    def shown(v: object) -> object:  # a scope tuple as the flag takes it (attn,moe_router), not a Python tuple
        return ",".join(map(str, v)) if isinstance(v, (tuple, list)) else v

    return " ".join(f"{k}={shown(v)}" for k, v in knobs.items() if v is not None) or "defaults"


def describe_parallel(par: ParallelConfig, dp: int) -> str:
    parts = [f"dp={dp}", f"tp={par.tp}", f"pp={par.pp}"]
    if par.cp > 1:
        parts.append(f"cp={par.cp}")
    if par.ep > 1:
        parts.append(f"ep={par.ep}")
    if par.vp > 1:
        parts.append(f"vp={par.vp}")
    parts += [f"mbs={par.micro_batch_size}", f"zero={par.zero_stage}", f"recompute={par.recompute}"]
    if par.recompute_modules is not None:  # Megatron --recompute-modules (None: its default, core_attn)
        parts.append(f"recompute_modules={','.join(par.recompute_modules)}")
    if par.tp > 1:
        parts.append("sp" if par.sequence_parallel else "no-sp")
    if par.pp > 1:
        parts.append(f"schedule={par.schedule}")
    if par.hsdp_shard_size:
        parts.append(f"hsdp={par.hsdp_shard_size}")
    return " ".join(parts)


def _of_rack(cluster: ClusterSpec) -> str:
    """Where the job uses part of a multi-node NVLink rack (catalog.cluster.job_nvlink_domain), say so."""
    rack = cluster.gpu.nvlink_domain_size
    if rack > cluster.gpu.gpus_per_node and cluster.nvlink_domain_size < rack:
        return f" of each {rack}-GPU rack"
    return ""


def describe_job(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, efficiency_basis: str = "fitted") -> str:
    caution = (f"\ncaution: {cluster.gpu.name} efficiencies are priors (no measured run of this GPU): the times "
               "are estimates until `autoplan calibrate` fits them to your runs" if efficiency_basis == "prior" else "")
    return (f"{model.name} ({model.num_params / 1e9:.1f}B params) on {cluster.num_gpus} x {cluster.gpu.name} "
            f"({cluster.gpus_per_node}/node, NVLink domain {cluster.nvlink_domain_size}{_of_rack(cluster)}, "
            f"{cluster.inter_node_gbps:g} Gb/s per GPU); global batch {job.global_batch_size} x "
            f"{job.seq_len} tokens, {job.precision}{caution}")


def _cached(pred: Prediction) -> str:
    """What of the reserve the allocator gives back before an out-of-memory (expandable segments: not in the peak)."""
    cached = pred.memory_gib.get("allocator_cached", 0.0)
    return f" of which {cached:.1f} given back under pressure (expandable segments)" if cached > 0 else ""


def render_prediction(pred: Prediction, precision: str = "bf16") -> str:
    """The table view of a prediction; with fp8 the MFU line says its basis (the bf16 peak, as Megatron
    and the PaLM/MFU convention count it)."""
    t = pred.time
    comm = ", ".join(f"{k} {v:.3f}" for k, v in t.exposed_comm_s.items() if v > 0) or "none"
    mem = ", ".join(f"{k} {v:.1f}" for k, v in pred.memory_gib.items()
                    if k not in ("total", "allocated", "reserved", "overhead", "allocator_cached") and v > 0)
    vol = ", ".join(f"{k} {v:.2f}" for k, v in pred.comm_volume_gib.items() if v > 0) or "none"
    fit = "fits" if pred.fits else f"DOES NOT FIT: {pred.over_memory_gib:.1f} GiB over"
    return "\n".join([
        f"  step time        {pred.step_time_s:.3f} s   ({_plural(pred.num_microbatches, 'micro-batch', 'es')}, "
        f"layers per stage {_stages(pred.layers_per_stage)})",
        *([f"  pipeline split   {pred.pipeline_split}"] if pred.pipeline_split else []),
        f"  throughput       {pred.tokens_per_s:,.0f} tokens/s  ({pred.tokens_per_s_per_gpu:,.0f} per GPU)",
        f"  MFU              {pred.mfu * 100:.1f}%{' of the bf16 peak' if precision != 'bf16' else ''}  "
        f"({pred.tflops_per_gpu:.0f} model TFLOP/s per GPU)",
        f"  time breakdown   compute {t.compute_s:.3f} s, recompute {t.recompute_s:.3f} s, "
        f"bubble {t.bubble_s:.3f} s, optimizer {t.optimizer_s:.3f} s"
        + (f", host-bound {t.host_bound_s:.3f} s" if t.host_bound_s > 0 else ""),
        f"  exposed comm     {comm} (s)",
        f"  peak memory      {pred.peak_memory_gib:.1f} / {pred.memory_limit_gib:.1f} GiB on stage "
        f"{pred.binding_stage} ({fit}; allocated {pred.peak_allocated_gib:.1f}, reserved "
        f"{pred.peak_reserved_gib:.1f}{_cached(pred)}; limit = HBM less {pred.memory_headroom_gib:.1f} GiB headroom)",
        f"  memory (GiB)     {mem}",
        f"  traffic per GPU  {vol} (GiB/step)",
        *(f"  note             {n}" for n in pred.notes),
    ])


def _plural(n: int, word: str, suffix: str = "s") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}{suffix}"


def _stages(layers: list[int]) -> str:
    if len(set(layers)) == 1:
        return f"{layers[0]} x {len(layers)}"
    return "[" + ", ".join(str(x) for x in layers) + "]"


# ---- search results ------------------------------------------------------------------------------
def render_plan(rank: int, par: ParallelConfig, pred: Prediction, explanation: str, precision: str = "bf16",
                target: str | None = None) -> str:
    """One ranked plan: degrees and schedule (``target``: the framework that runs it, shown for ``--target any``),
    the prediction (with memory breakdown), and why it ranks here."""
    on = f"[{target}] " if target else ""
    return "\n".join([f"#{rank}  {on}{describe_parallel(par, pred.dp)}", render_prediction(pred, precision),
                      f"  software         {describe_software(pred.software)}",
                      f"  why              {explanation}"])


def render_search_stats(candidates: int, evaluated: int, pruned: dict[str, int], wall_time_s: float,
                        target: str) -> str:
    cut = ", ".join(f"{k} {v}" for k, v in sorted(pruned.items(), key=lambda kv: (-kv[1], kv[0])))
    return (f"searched {candidates} layouts for target {target} in {wall_time_s:.2f} s "
            f"({evaluated} split by the stage DP and scored); cut: {cut or 'none'}")
