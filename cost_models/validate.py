"""Hard constraints of a parallel layout (COST_MODEL.md §7) and the layer split over pipeline stages.

Every violation raises ``ConfigError`` naming the value, the constraint and the valid choices.
"""

from __future__ import annotations

from cost_models.errors import ConfigError, divisors
from cost_models.pipeline_split import (PipelineSplit, accounting_that_fits, layout_split, legal_vps, resolve,
                                       split_ok)
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import TargetProfile
from cost_models.targets.megatron import PROFILE as MEGATRON


def _valid(candidates: list[int], ok) -> list[int]:  # type: ignore[no-untyped-def]
    return [c for c in candidates if ok(c)]


def nvlink_tp_refusal(t: int, cluster: ClusterSpec) -> str:
    """Why ``tp=t`` is refused on ``cluster``'s NVLink domain. TP groups are contiguous rank blocks (Megatron's
    rank order, tp fastest), and TP all-reduces run in every layer, so a group must sit inside one NVLink
    domain: ``t`` must divide the domain size, or some block of ``t`` ranks straddles two domains (16 on a
    72-GPU NVL72 rack: ranks 64-79). Groups that reduce rarely (EP, DP) may straddle and are priced so."""
    domain, node = cluster.nvlink_domain_size, cluster.gpus_per_node
    msg = (f"tp={t} must divide the NVLink domain of {domain} GPUs (a TP group may not straddle two domains; "
           f"blocks of {t} ranks would)")
    smaller = [d for d in range(domain - 1, 0, -1) if d % t == 0 and d % node == 0 and d >= t]
    if t < domain and smaller:
        msg += (f"; with --nvlink-domain-size {smaller[0]} (using {smaller[0]} GPUs of each domain) "
                f"tp={t} stays inside one")
    return msg


def check_parallel(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, *,
                   allow_kv_replication: bool = False, profile: TargetProfile | None = None) -> None:
    """Raise ``ConfigError`` for the first broken hard constraint.

    ``allow_kv_replication``: Megatron also accepts tp a multiple of num_kv_heads (KV heads replicated,
    a memory/compute cost); torchtitan does not. ``profile``: the target whose expert-parallel rule applies
    (``TargetProfile.expert_layout_error``; None: Megatron's, MoE parallel folding: ep | tp*cp*dp)."""
    a, g, f = model.num_attention_heads, model.num_kv_heads, model.ffn_hidden_size
    t, p, c, e, v = par.tp, par.pp, par.cp, par.ep, par.vp
    n, domain = cluster.num_gpus, cluster.nvlink_domain_size
    tp_ok = _valid(divisors(domain), lambda x: a % x == 0 and (g % x == 0 or (allow_kv_replication and x % g == 0))
                   and f % x == 0)
    if a % t:
        raise ConfigError(f"tp={t} does not divide num_attention_heads={a}", valid=tp_ok)
    if g % t and not (allow_kv_replication and t % g == 0):
        raise ConfigError(f"tp={t} does not divide num_kv_heads={g}", valid=tp_ok)
    if f % t:
        raise ConfigError(f"tp={t} does not divide ffn_hidden_size={f}", valid=tp_ok)
    if t > domain or domain % t:
        raise ConfigError(nvlink_tp_refusal(t, cluster), valid=tp_ok)
    if p == 1 and (par.first_stage_layers is not None or par.last_stage_layers is not None):
        raise ConfigError("first_stage_layers / last_stage_layers need pp > 1 (with pp=1 there is one stage)")
    err = (profile or MEGATRON).pipeline_rule_error(model, par)  # e.g. MambaStack's split: no accounting at all
    if err is not None:
        raise err
    mp = t * p * c
    if n % mp:
        split = (par.first_stage_layers, par.last_stage_layers, par.account_for_embedding_in_pipeline_split,
                 par.account_for_loss_in_pipeline_split)
        pps = [f"pp={x}" for x in divisors(n // t) if (n // t) % (x * c) == 0
               and (x > 1 or v == 1)  # interleaving needs pp > 1
               and split_ok(model.num_layers, x, v, *split)][:12] if n % t == 0 else []
        cps = [f"cp={x}" for x in divisors(n // (t * p)) if x == 1 or job.seq_len % (2 * x) == 0][:12] \
            if n % (t * p) == 0 else []  # pp and tp divide: cp is the factor too many
        raise ConfigError(f"tp*pp*cp = {t}*{p}*{c} = {mp} does not divide num_gpus={n}",
                          valid=(cps or pps) if n % t == 0 else [f"tp={x}" for x in tp_ok if n % x == 0])
    dp = n // mp
    if par.pipeline_layout is None:
        split_chunks_error(model, par)
    pipeline_split(model, par)  # Megatron's split rules (ConfigError naming the rule)

    def microbatches_ok(m: int) -> bool:  # the two micro-batch rules below
        return not (par.schedule == "interleaved" and m % p) and not (p > 1 and m < p)

    if job.global_batch_size % (par.micro_batch_size * dp):
        per = job.global_batch_size // dp if job.global_batch_size >= dp else 0
        q = par.micro_batch_size * dp  # else: the nearest batch sizes below and above that this layout runs
        k = job.global_batch_size // q
        below = next((j * q for j in range(k, 0, -1) if microbatches_ok(j)), 0)
        above = next(j * q for j in range(k + 1, k + 2 * p + 2) if microbatches_ok(j))
        raise ConfigError(
            f"global_batch_size={job.global_batch_size} is not divisible by micro_batch_size*dp = "
            f"{par.micro_batch_size}*{dp} = {q}",
            valid=([f"mbs={x}" for x in divisors(per) if microbatches_ok(per // x)] or None
                   if per and job.global_batch_size % dp == 0 else None)
            or [f"global_batch_size={b}" for b in (below, above) if b > 0])
    m = job.global_batch_size // (par.micro_batch_size * dp)
    if par.schedule == "interleaved" and m % p:
        raise ConfigError(f"interleaved schedule needs micro-batches m={m} divisible by pp={p} (Megatron)")
    if p > 1 and m < p:
        raise ConfigError(f"1F1B needs micro-batches m={m} >= pp={p}; raise global_batch_size to at least "
                          f"{p * par.micro_batch_size * dp} or lower pp")
    if c > 1 and job.seq_len % (2 * c):
        raise ConfigError(f"cp={c} needs seq_len={job.seq_len} divisible by 2*cp = {2 * c} (load-balanced ring)",
                          valid=[x for x in divisors(job.seq_len // 2) if x <= 64 and n % (t * p * x) == 0])
    err = (profile or MEGATRON).expert_layout_error(model, tp=t, pp=p, cp=c, dp_cp=dp * c, ep=e, zero=par.zero_stage,
                                                    hsdp=par.hsdp_shard_size)
    if err is not None:
        raise err
    prof = profile or MEGATRON
    moe_sp = model.is_moe  # MoE under TP runs SP on every target (TargetProfile.moe_sp_source says why)
    if moe_sp and t > 1 and not par.sequence_parallel:
        raise ConfigError(f"MoE with tp={t} needs sequence_parallel on ({prof.name}: {prof.moe_sp_source})",
                          valid=["sequence_parallel on", "tp=1"])
    if t > 1 and par.sequence_parallel and (why := prof.sp_split_error(job.seq_len, t, c)) is not None:
        raise ConfigError(why + ("; MoE with tp > 1 needs sequence parallelism" if moe_sp else ""),
                          valid=([] if moe_sp else ["sequence_parallel off"])
                          + [f"tp={x}" for x in divisors(n) if x < t and prof.sp_split_error(job.seq_len, x, c) is None][-3:])
    if par.hsdp_shard_size is not None and (dp * c) % par.hsdp_shard_size:
        raise ConfigError(f"hsdp_shard_size={par.hsdp_shard_size} must divide dp*cp = {dp * c}",
                          valid=[d for d in divisors(dp * c) if d > 1 or dp * c == 1])  # 1 shards nothing
    check_precision(job, cluster)


def precisions(cluster: ClusterSpec) -> list[str]:
    """The GEMM precisions ``cluster``'s tensor cores run: bf16, fp8 where its fp8 peak exceeds bf16, nvfp4 where
    it has FP4 tensor cores (``GPUSpec.peak_fp4_tflops``: Blackwell)."""
    gpu = cluster.gpu
    return (["bf16"] + (["fp8"] if gpu.peak_fp8_tflops > gpu.peak_bf16_tflops else [])
            + (["nvfp4"] if gpu.peak_fp4_tflops else []))


def check_precision(job: JobSpec, cluster: ClusterSpec) -> None:
    """``ConfigError`` when the GPU has no tensor cores for the job's precision."""
    valid = precisions(cluster)
    if job.precision not in valid:
        cores = {"fp8": "fp8 tensor cores", "nvfp4": "FP4 tensor cores (NVFP4: Blackwell)"}[job.precision]
        raise ConfigError(f"precision {job.precision} is impossible on {cluster.gpu.name}: it needs {cores}",
                          valid=valid)


def split_chunks_error(model: ModelSpec, par: ParallelConfig) -> None:
    """``ConfigError`` when ``pp*vp`` chunks exceed the layer slots (``pipeline_split.split_ok``): with
    embedding/loss accounting they count as layers of the split, so chunk 0 may hold the embedding alone
    (megatron-core transformer_config.py __post_init__; Llama 3 paper §3.3.2 runs 126 layers on pp 16 × vp 8).
    The valid list is every vp ``split_ok`` accepts with the same split settings; the hint names the accounting
    flags when they make the requested vp legal."""
    L, p, v = model.num_layers, par.pp, par.vp
    e, lo = par.account_for_embedding_in_pipeline_split, par.account_for_loss_in_pipeline_split
    slots = L + e + lo
    if p * v <= slots:
        return
    what = f"num_layers={L}" + (f" + embedding{' + loss' if lo else ''} = {slots}" if e else
                                (f" + loss = {slots}" if lo else ""))
    msg = f"pp*vp = {p}*{v} = {p * v} pipeline chunks exceed {what} (a chunk would hold no layer)"
    fits = (accounting_that_fits(L, p, v, e, lo)
            if par.first_stage_layers is None and par.last_stage_layers is None else None)
    if fits is not None:
        flags = [f for f, on in (("--account-for-embedding-in-pipeline-split", fits[0]),
                                 ("--account-for-loss-in-pipeline-split", fits[1])) if on]
        parts = " + ".join(x for x, on in (("embedding", fits[0]), ("loss", fits[1])) if on)
        msg += f"; with {' '.join(flags)} vp={v} is legal ({p * v} slots = {L} layers + {parts})"
    valid = legal_vps(L, p, par.first_stage_layers, par.last_stage_layers, e, lo)
    raise ConfigError(msg, valid=[f"vp={x}" for x in valid] or None)


def pipeline_split(model: ModelSpec, par: ParallelConfig) -> PipelineSplit:
    """Megatron's split of the decoder layers over (pipeline rank, virtual stage) for ``par``
    (``cost_models.pipeline_split``): the explicit first/last counts or embedding/loss accounting when given,
    else even, else the uneven form ``resolve`` applies by itself; an explicit ``pipeline_layout`` as it says."""
    if par.pipeline_layout is not None:
        return layout_split(par.pipeline_layout, model.num_layers, model.arch.mtp_layers, par.pp)
    return resolve(model.num_layers, par.pp, par.vp, par.first_stage_layers, par.last_stage_layers,
                   par.account_for_embedding_in_pipeline_split, par.account_for_loss_in_pipeline_split)


def with_explicit_split(model: ModelSpec, par: ParallelConfig) -> ParallelConfig:
    """``par`` with the split ``pipeline_split`` chose by itself written into its fields (what runs, said)."""
    sp = pipeline_split(model, par)
    if not sp.auto:
        return par
    return ParallelConfig(**{**par.model_dump(), "first_stage_layers": sp.first_stage_layers,
                             "last_stage_layers": sp.last_stage_layers,
                             "account_for_embedding_in_pipeline_split": sp.account_for_embedding,
                             "account_for_loss_in_pipeline_split": sp.account_for_loss})


def stage_layers(model: ModelSpec, par: ParallelConfig) -> list[int]:
    """Decoder layers per pipeline rank (all of its virtual chunks together), as Megatron builds them.
    Example: 126 layers on pp 16 → [7, 8 × 14, 7] (embedding and loss each counted as a layer)."""
    return pipeline_split(model, par).rank_layers
