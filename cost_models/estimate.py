"""Score one parallel configuration: step time, tokens/s, MFU, memory per GPU, composite cost.

Step time (critical path, with overlap — COST_MODEL.md §4–6):
``T = pipeline(t_i, m) + 2(p−1)·t_p2p + T_dp,exposed + T_optimizer`` where ``t_i`` is stage ``i``'s
per-micro-batch time (compute, recompute, TP and EP on the critical path, CP's ring net of the attention
it hides behind), PP sends overlap with compute except in the fill/drain (and, under Megatron's A2A overlap,
one per combined 1F1B step: ``combined_1f1b_p2p_s``), and DP/FSDP traffic hides under
the step's compute but for ``(1 − dp_overlap)`` (its tail) — never less than what the compute cannot cover.
Composite cost (seed 000 §6.7.7): ``C = w1·T_compute + w2·T_comm + w3·max(0, M_peak − M_limit)²``
with memory in GiB.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cost_models.collectives import RankStrides, group_collective_time_s
from cost_models.ep_comm import host_wait_s
from cost_models.gemm import hbm_time_s, matmul_time_s
from cost_models.host_cover import host_light_kinds, moe_host_cover_s
from cost_models.knob_effects import eager_elementwise, non_tn_fp8_gemm, unpriced_knob_notes
from cost_models.layer_cost import LayerCost, layer_cost
from cost_models.memory import (DEFAULT_RUNTIME, GIB, MemoryBreakdown, expert_shard_group, fsdp_unit_groups,
                                fsdp_units, graphs_for, hsdp_replicas, pp_unsharded_stage, stage_memory,
                                stage_params)
from cost_models.mtp import mtp_block_kinds, mtp_projection_flops_per_token, mtp_projection_time_s
from cost_models.moe import host_synced, moe_a2a_overlapped
from cost_models.muon import optimizer_step_s
from cost_models.op_cost import model_flops_per_token
from cost_models.op_traffic import memory_traffic_bytes, yarn_rope_notes
from cost_models.opgraph import DECODER_KINDS, LayerGraph, gemm_precision, layer_kind
from cost_models.pipeline import dualpipe_rank_share, pipeline_time_s
from cost_models.quant_layout import layer_in_bf16, mtp_in_bf16, mtp_layer_in_bf16, run_as
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets import Runtime, Software, runtime_for, target_model_notes
from cost_models.validate import check_parallel, pipeline_split


class CostWeights(BaseModel):
    """Weights of the composite cost; ``memory_s_per_gib2`` prices each GiB² over the limit in seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    compute: float = Field(default=1.0, ge=0)
    comm: float = Field(default=1.0, ge=0)
    memory_s_per_gib2: float = Field(default=10.0, ge=0)


class TimeBreakdown(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    compute_s: float = Field(description="forward + backward of the binding stage over all micro-batches")
    recompute_s: float
    bubble_s: float = Field(description="pipeline fill/drain (compute idle), incl. PP sends in the fill")
    exposed_comm_s: dict[str, float] = Field(description="critical-path communication per dimension")
    optimizer_s: float
    host_bound_s: float = Field(default=0.0, description="the binding stage's MoE layers waiting on their host beyond "
                                "the device's work (Efficiency.moe_host_s_per_layer / moe_host_s_per_expert: "
                                "Megatron-Core's fitted values, else 0)")


class Prediction(BaseModel):
    """What the cost model predicts for one configuration (the `estimate` JSON contract)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float = Field(description="model FLOPs (no recompute, non-causal attention) / bf16 peak")
    tflops_per_gpu: float = Field(description="model TFLOP/s per GPU")
    peak_memory_gib: float = Field(description="device memory at the peak: allocated + the allocator reserve it cannot "
                                   "give back (all of it unless expandable segments) + CUDA context + NCCL buffers")
    peak_allocated_gib: float = Field(description="tensors alive at the peak (torch.cuda.max_memory_allocated)")
    peak_reserved_gib: float = Field(description="caching-allocator reserve at the peak (max_memory_reserved)")
    memory_limit_gib: float = Field(description="HBM less the memory headroom: what fits compares the peak with")
    memory_headroom_gib: float
    fits: bool
    over_memory_gib: float
    composite_cost: float
    num_microbatches: int
    dp: int
    layers_per_stage: list[int]
    pipeline_split: str = Field(default="", description="how the decoder layers are split over pipeline ranks and "
                                "virtual stages, and the Megatron flags that build it (empty without pipelining)")
    binding_stage: int = Field(description="the pipeline stage with the highest memory")
    slowest_stage: int
    time: TimeBreakdown
    memory_gib: dict[str, float] = Field(description="peak-memory stage, by kind")
    comm_volume_gib: dict[str, float] = Field(description="bytes each GPU sends per step, per dimension")
    software: dict[str, Any] = Field(default_factory=dict, description="every knob this prediction assumes: the "
                                     "target and its resolved knobs (cost_models.targets.Runtime.knobs), and how the "
                                     "target runs the layout where it differs (runs_as)")
    notes: list[str] = Field(default_factory=list, description="how the target runs what was asked where the knobs "
                             "alone do not say it, and knobs it runs that this prediction prices as having no effect "
                             "(cost_models.targets.Runtime.notes, knob_effects.unpriced_knob_notes)")


def estimate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
             weights: CostWeights | None = None, *, check: bool = True, target: str | None = None,
             software: Software | None = None, runtime: Runtime | None = None) -> Prediction:
    """Predict one configuration as ``runtime`` (a target's resolved ``cost_models.targets.Runtime``) runs it:
    how memory is held, the gradient dtype on the DP wire, the knobs. Without ``runtime``: ``target`` resolved
    with the knobs in ``software`` (``runtime_for``; no target: Megatron-Core's). Raises ``ConfigError`` when the
    configuration breaks a hard constraint."""
    if runtime is None:
        runtime = runtime_for(target, job, cluster, par, software)
    if check:
        from cost_models.targets import profile_for

        # the runtime's own target where the caller passes a resolved runtime (the search); None: ``any``
        prof = profile_for(target or runtime.target)
        if prof is not None:  # its rules: check_parallel as it runs it, its layout rules, its knobs' with the layout
            prof.check(model, cluster, job, par, runtime)
        else:  # no profile (``any``, ``deepseek``): Megatron's rules; tp > num_kv_heads is priced (opgraph.tp_divisor)
            check_parallel(model, cluster, job, par, allow_kv_replication=True)
    weights = weights or CostWeights()
    asked, model = model, _model_as_run(model, par, runtime)
    t, p, c = par.tp, par.pp, par.cp
    dp = cluster.num_gpus // (t * p * c)
    m = job.global_batch_size // (par.micro_batch_size * dp)
    split = pipeline_split(model, par)
    layers, ids = split.rank_layers, split.layer_ids
    graphs = graphs_for(model, job.seq_len)
    costs = {k: layer_cost(g, model, cluster, job, par, dp, runtime) for k, g in graphs.items()
             if k in DECODER_KINDS}
    head = head_cost(graphs["head"], cluster, job, par, runtime)
    strides = RankStrides.megatron(t, c, dp, par.ep)
    stage_parts = stage_time_parts(model, cluster, job, par, runtime, dp, graphs, costs, head)
    stage_t = [sum(parts.values()) for parts in stage_parts]
    slowest = max(range(p), key=lambda i: stage_t[i])
    pipe = pipeline_time_s(stage_t, m, par.schedule, par.vp)
    pp_fill = pp_fill_s(model, cluster, job, par, dp) + combined_1f1b_p2p_s(model, cluster, job, par, dp, m, runtime)
    dp_s, dp_bytes, opt_s, blocking = data_parallel_cost(model, cluster, par, layers, dp, strides, m, ids, runtime,
                                                         mtp_rank=split.mtp_rank)
    dp_exposed = dp_exposed_s(dp_s, par.zero_stage, stage_t[slowest], m, cluster, blocking,
                              dp_sync_every_microbatch(runtime, par.zero_stage, par.pp),
                              fsdp_gathered_once(runtime, par.zero_stage, par.pp))
    step = pipe + pp_fill + dp_exposed + opt_s

    mems = [stage_memory(model, job, par, dp, s, layers, m, graphs, runtime, ids[s], split.mtp_rank) for s in range(p)]
    binding = max(range(p), key=lambda i: mems[i].total)
    peak: MemoryBreakdown = mems[binding]
    peak_gib = peak.total / GIB
    limit = cluster.memory_limit_gib
    over = max(0.0, peak_gib - limit)

    sp_parts = stage_parts[slowest]
    exposed = {k: sp_parts[k] * m for k in ("tp", "ep", "cp")}
    exposed["pp"] = pp_fill
    exposed["dp"] = dp_exposed
    compute_s = sp_parts["compute"] * m
    recompute_s = sp_parts["recompute"] * m
    bubble = pipe - m * stage_t[slowest] + pp_fill
    comm_s = sum(exposed.values())
    composite = (weights.compute * (step - comm_s) + weights.comm * comm_s + weights.memory_s_per_gib2 * over**2)

    tokens = job.tokens_per_step
    # MFU counts the model asked for (a padded vocabulary's rows are the framework's, not the model's work)
    flops = _model_flops_per_step(asked, graphs if asked is model else graphs_for(asked, job.seq_len), job)
    per_gpu = flops / step / cluster.num_gpus
    # TP / CP / EP bytes of the rank that sends most, layer by layer (its kinds: dense-first, hybrid stacks)
    def busiest(field: str) -> float:
        return max(sum(getattr(costs[layer_kind(model, i)], field) for i in stage_ids) for stage_ids in ids)

    volume = {
        "tp": busiest("tp_bytes") * m / GIB,
        "cp": busiest("cp_bytes") * m / GIB,
        "ep": busiest("ep_bytes") * m / GIB,
        "pp": (2 * par.vp * pp_activation_bytes(model, job, par) * m / GIB) if p > 1 else 0.0,
        "dp": dp_bytes / GIB,
    }
    return Prediction(
        step_time_s=step,
        tokens_per_s=tokens / step,
        tokens_per_s_per_gpu=tokens / step / cluster.num_gpus,
        mfu=per_gpu / (cluster.gpu.peak_bf16_tflops * 1e12),
        tflops_per_gpu=per_gpu / 1e12,
        peak_memory_gib=peak_gib,
        peak_allocated_gib=peak.allocated / GIB,
        peak_reserved_gib=peak.reserved / GIB,
        memory_limit_gib=limit,
        memory_headroom_gib=cluster.memory_headroom_gib,
        fits=over == 0.0,
        over_memory_gib=over,
        composite_cost=composite,
        num_microbatches=m,
        dp=dp,
        layers_per_stage=layers,
        pipeline_split=split.describe(target or runtime.target) if p > 1 else "",
        binding_stage=binding,
        slowest_stage=slowest,
        time=TimeBreakdown(compute_s=compute_s, recompute_s=recompute_s, bubble_s=bubble, exposed_comm_s=exposed,
                           optimizer_s=opt_s, host_bound_s=sp_parts["host"] * m),
        memory_gib=peak.gib(),
        comm_volume_gib=volume,
        software=runtime.knobs(),
        notes=[*runtime.notes, *unpriced_knob_notes(cluster, runtime, par), *yarn_rope_notes(runtime, asked),
               *target_model_notes(target or runtime.target, asked, job),
               *([] if asked is model else [f"{runtime.target} pads the vocabulary {asked.vocab_size} -> "
                                           f"{model.vocab_size} (a multiple of tp={par.tp}): priced padded; MFU "
                                           f"counts the model's {asked.vocab_size}"])],
    )



def stage_time_parts(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, runtime: Runtime,
                     dp: int, graphs: dict[str, LayerGraph] | None = None, costs: dict[str, LayerCost] | None = None,
                     head: float | None = None) -> list[dict[str, float]]:
    """Per pipeline rank, its time per micro-batch by part (compute, recompute, tp, ep, cp, host): its decoder
    layers (``layer_cost``; bf16 ones under a quantized job, ``quant_layout``), the MoE host cover its own layers
    give (``host_cover_delta_s``), the heads and losses on the last rank and the MTP blocks on the MTP rank
    (``cost_models.mtp``); dualpipe averages each rank's two stages. ``estimate``'s stage times are the sums; the
    search's stage DP is held to them (tests/test_stage_dp_estimate.py). ``graphs`` / ``costs`` / ``head``: what
    ``estimate`` already priced (None: priced here)."""
    p = par.pp
    split = pipeline_split(model, par)
    ids = split.layer_ids
    graphs = graphs if graphs is not None else graphs_for(model, job.seq_len)
    if costs is None:
        costs = {k: layer_cost(g, model, cluster, job, par, dp, runtime) for k, g in graphs.items()
                 if k in DECODER_KINDS}
    if head is None:
        head = head_cost(graphs["head"], cluster, job, par, runtime)
    bf16_costs: dict[str, LayerCost] = {}  # layers run in bf16 under a quantized job (cost_models.quant_layout)
    m = job.global_batch_size // (par.micro_batch_size * dp)  # micro-batches per step

    def cost_of(kind: str, bf16: bool) -> LayerCost:
        if not bf16:
            return costs[kind]
        if kind not in bf16_costs:
            job_b, rt_b = run_as(job, runtime, "bf16")
            bf16_costs[kind] = layer_cost(graphs[kind], model, cluster, job_b, par, dp, rt_b)
        return bf16_costs[kind]

    # FSDP2's compute-stream work (its unshard copies; under PP its unsharded gradient accumulation, each backward)
    # over the (dense, expert) shard groups of its units, where the runtime runs them
    fsdp_groups = fsdp_unit_groups(par.zero_stage, par.tp, par.cp, dp, par.ep, par.hsdp_shard_size) \
        if fsdp_units(runtime, par.zero_stage) else None
    stage_parts: list[dict[str, float]] = []
    for s in range(p):
        parts = {"compute": 0.0, "recompute": 0.0, "tp": 0.0, "ep": 0.0, "cp": 0.0, "host": 0.0}
        rank_layers = [(i, layer_kind(model, i), cost_of(layer_kind(model, i),
                                                         layer_in_bf16(i, model.num_layers, job, runtime)))
                       for i in ids[s]]
        for _, _, lc in rank_layers:
            add_layers(parts, lc)
        parts["host"] += host_cover_delta_s(rank_layers, graphs, model, cluster, par, runtime)
        if s == p - 1:
            parts["compute"] += head * (1 + model.arch.mtp_layers)  # the main and MTP heads + losses: last rank
        if fsdp_groups is not None:
            sp = stage_params(model, par, ids[s], first=s == 0, last=s == p - 1,
                              mtp=None if split.mtp_rank is None else s == split.mtp_rank)
            parts["compute"] += fsdp2_compute_s(sp.dense, sp.expert, fsdp_groups, p, m, runtime, cluster)
        if model.arch.mtp_layers and s == split.mtp_rank:  # cost_models.mtp: the MTP blocks + projections, on the
            mtp_job = run_as(job, runtime, "bf16")[0] if mtp_in_bf16(job, runtime) else job  # last rank or a
            proj_gemm, proj_tp = mtp_projection_time_s(model, cluster, mtp_job, par)        # layout's standalone
            for j, k in enumerate(mtp_block_kinds(model)):                                   # MTP stage
                add_layers(parts, cost_of(k, mtp_layer_in_bf16(j, model.num_layers, job, runtime)),
                           model.arch.mtp_layers, *((proj_gemm, proj_tp) if j == 0 else ()))
        stage_parts.append(parts)
    if par.schedule == "dualpipe":  # each rank runs half the micro-batches through each of its two stages
        stage_parts = [{k: (stage_parts[a][k] + stage_parts[b][k]) / 2 for k in stage_parts[a]}
                       for a, b in (dualpipe_rank_share(s, p) for s in range(p))]
    return stage_parts


def pp_activation_bytes(model: ModelSpec, job: JobSpec, par: ParallelConfig) -> float:
    """One micro-batch's activation at a stage boundary: ``2·s·b·h`` bytes, ÷ cp, ÷ t with SP (§4)."""
    act = 2.0 * par.micro_batch_size * job.seq_len / par.cp * model.hidden_size
    return act / par.tp if par.sequence_parallel and par.tp > 1 else act


def pp_fill_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, dp: int) -> float:
    """PP sends on the critical path. In the steady state they overlap compute; in the fill the first
    micro-batch's forward, and in the drain the last one's backward, cross every chunk boundary in turn:
    ``p·v − 1`` sends each way (interleaving multiplies the boundaries by ``v``: Narayanan et al. SC'21 §2.2)."""
    if par.pp == 1:
        return 0.0
    return 2 * (par.pp * par.vp - 1) * pp_send_s(model, cluster, job, par, dp)


def pp_send_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, dp: int) -> float:
    """One micro-batch's activation (or its gradient) sent to the next (previous) pipeline stage."""
    strides = RankStrides.megatron(par.tp, par.cp, dp)
    return group_collective_time_s("send_recv", pp_activation_bytes(model, job, par), 2, strides.pp, cluster)


def combined_1f1b_p2p_s(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, dp: int, m: int,
                        rt: Runtime | None) -> float:
    """PP sends the A2A overlap's interleaved schedule leaves on the critical path beside ``pp_fill_s``'s: one per
    combined (steady 1F1B) step of the last stage, ``m·v − (v − 1)·p − 1`` of them (its warm-up count with the
    overlap's extra micro-batch, schedules.py:765-779). pp > 1 with Megatron-Core's ``overlap_moe_expert_parallel_comm``
    (which needs the interleaved schedule there).

    Megatron-Core 0.16.1 runs each 1F1B step of the interleaved schedule as one unit, the forward of one model chunk
    and the backward of another merged layer by layer (pipeline_parallel/schedules.py:1583-1725
    ``forward_backward_helper_wrapper`` with ``pp_pre_forward`` / ``pp_post_forward`` / ``pp_pre_backward`` /
    ``pp_post_backward``; combined_1f1b.py ``combined_1f1b_schedule_for_interleaved_pipelining``). In
    ``TransformerModelChunkSchedulePlan.run`` (models/common/model_chunk_schedule_plan.py:413-535) the step first
    waits for both received tensors (``pre_forward`` / ``pre_backward``: the forward input and the output grad, before
    any layer) and sends its own two (``post_forward`` / ``post_backward``) only after all of the chunk's layers have
    been issued: the backward's input grad is ready at the step's end (its chain ends with the chunk's first layer's
    attention backward, the last node issued). The plain interleaved schedule sends the forward's output half way
    through its step, before the backward runs, so the neighbour's wait is covered. Here stage ``s`` runs the
    backward of virtual micro-batch ``k`` in its ``k``-th steady step and needs stage ``s + 1``'s, which that stage
    computes in its own ``k``-th step; the forward it needs was computed two steps earlier (warm-up counts differ by 2
    per stage, plus the overlap's one extra warm-up micro-batch, the same on every stage). Two steps of the stage pair
    then span two step times plus a send each way: the period grows by one send per step. A max-plus run of
    Megatron's interleaved order (tests/test_combined_1f1b_p2p.py: its own schedule table and warm-up counts, uniform
    step times) gives the plain schedule exactly ``pp_fill_s``'s sends more than with free sends, the combined one
    those and this count more, within 1%. Not modelled: a chunk whose forward chain ends before the step does, so its
    forward send leaves early (a variant of that run with the forward done 0.3 of a step early: the same count at
    pp 2 and 4, about 20% fewer at pp 8 vp 4; issue-12, s26-a2aov)."""
    if par.pp == 1 or par.schedule != "interleaved" or not moe_a2a_overlapped(cluster, rt):
        return 0.0  # DualPipe pairs its chunks its own way (layer_cost prices its overlap)
    steps = max(0, m * par.vp - (par.vp - 1) * par.pp - 1)
    return steps * pp_send_s(model, cluster, job, par, dp)


def dp_exposed_s(dp_s: float, zero_stage: int, microbatch_s: float, m: int, cluster: ClusterSpec,
                 blocking_s: float = 0.0, every_microbatch: bool = False, gathered_once: bool = False) -> float:
    """DP/FSDP time left on the critical path. ZeRO-0/1/2 (Megatron ``--overlap-grad-reduce`` /
    ``--overlap-param-gather``) reduce gradients during the last micro-batch's backward and gather weights
    during the first one's forward: one micro-batch of compute can hide them. ZeRO-3/FSDP, and sharded gradients
    reduced in every micro-batch (``every_microbatch``: Megatron-FSDP ``optim_grads``), communicate in every
    micro-batch, behind the whole step's compute; a pipeline stage FSDP2 keeps gathered (``gathered_once``,
    ``fsdp_gathered_once``) gathers once, in the first micro-batch. Either way at least ``1 − dp_overlap`` of it
    (the tail after the last layer's backward) stays exposed. ``blocking_s`` (part of ``dp_s``) is waited for by the
    compute stream as soon as it starts (``data_parallel_cost``): exposed in full."""
    rest = dp_s - blocking_s
    window = microbatch_s * (m if (zero_stage == 3 and not gathered_once) or every_microbatch else 1)
    return blocking_s + max(rest * (1 - cluster.efficiency.dp_overlap), rest - window)


def host_cover_delta_s(rank_layers: Sequence[tuple[int, str, LayerCost]], graphs: dict[str, LayerGraph],
                       model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig, rt: Runtime) -> float:
    """What the neighbouring non-MoE layers' device work takes off one rank's MoE host waits (one micro-batch):
    each MoE layer's ``host_wait_s`` with its ``host_cover.moe_host_cover_s`` less the wait ``layer_cost`` priced
    without it. ``rank_layers``: (layer id, kind, cost) in forward order."""
    delta = 0.0
    covers = moe_host_cover_s(rank_layers, host_synced(cluster, par, rt), host_light_kinds(rt))
    for (_, kind, lc), cover in zip(rank_layers, covers):
        if cover > 0.0 and lc.host_s > 0.0:
            delta += host_wait_s(graphs[kind], model, cluster, par, rt, lc.total_s - lc.host_s, lc.forward_share,
                                 lc.sync_window_s, cover) - lc.host_s
    return delta


def add_layers(parts: dict[str, float], lc: LayerCost, n: int = 1, proj_gemm: float = 0.0, proj_tp: float = 0.0) -> None:
    """Add ``n`` layers of cost ``lc`` to a stage's parts (MTP blocks: a decoder layer each, cost_models.mtp,
    plus their projections' GEMM and TP time)."""
    parts["compute"] += n * (lc.forward_s + lc.backward_s) + proj_gemm
    parts["recompute"] += n * lc.recompute_s
    parts["tp"] += n * lc.tp_s + proj_tp
    parts["ep"] += n * lc.ep_s
    parts["cp"] += n * lc.cp_exposed_s
    parts["host"] += n * lc.host_s


def head_cost(graph: LayerGraph, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
              rt: Runtime | None = None) -> float:
    """Output projection (vocab-parallel) + loss, forward and backward, one micro-batch: the GEMM (×3 for
    dgrad + wgrad) and the final norm and cross-entropy by their HBM traffic (``op_traffic.LOSS_BYTES``)."""
    op = graph.op("lm_head")
    tokens = par.micro_batch_size * job.seq_len / par.cp
    gemm = matmul_time_s(tokens, op.weight_in, -(-op.weight_out // par.tp), cluster,
                         gemm_precision(op, job.precision))  # the output head runs bf16 (Op.quantized)
    eager = not rt.fused_loss if rt is not None else eager_elementwise(cluster.efficiency, None)
    mem_f, mem_b = memory_traffic_bytes(graph, None, job, par, rt, eager, non_tn_fp8_gemm(cluster))
    return 3 * gemm * (1 + cluster.efficiency.memory_bound_fraction) + hbm_time_s(mem_f + mem_b, cluster)


def dp_sync_every_microbatch(rt: Runtime, zero_stage: int, pp: int) -> bool:
    """Whether the gradient reduce ZeRO-0/1/2 price once per step runs in each of the ``m`` micro-batches instead
    (``dp_exposed_s``: behind the whole step's backward): Megatron-FSDP ``optim_grads`` (zero 2,
    ``rt.grad_reduce_every_microbatch``), or ZeRO-0 without pipelining where the trainer never turns the sync off
    (``rt.zero0_sync_every_microbatch``: torchtitan; the profile cites the code)."""
    return rt.grad_reduce_every_microbatch or (zero_stage == 0 and pp == 1 and rt.zero0_sync_every_microbatch)


def hsdp_reduces_per_step(par: ParallelConfig, m: int, every: bool) -> int:
    """Times per step the shard's gradient is all-reduced across HSDP replicas: Megatron once (``finish_grad_sync``
    per step; ``m`` where sharded gradients are reduced in every micro-batch, ``every``); FSDP2 (zero 3) in every
    micro-batch's ``post_backward`` without pipelining, once under it (torch 2.13 distributed/pipelining/stage.py:
    844-848 sets ``set_requires_gradient_sync(False)`` for each backward, :1164-1177 syncs in ``perform_reduce_grad``)."""
    if par.zero_stage == 3:
        return 1 if par.pp > 1 else m
    return m if every else 1


def data_parallel_cost(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig, layers: list[int], dp: int,
                       strides: RankStrides, m: int = 1, layer_ids: Sequence[Sequence[int]] | None = None,
                       rt: Runtime = DEFAULT_RUNTIME, mtp_rank: int | None = None) -> tuple[float, float, float, float]:
    """(DP time s, bytes sent, optimizer s, blocking s) of the heaviest stage. ZeRO-0 all-reduces gradients (once per
    step, or in each of the ``m`` micro-batches where ``dp_sync_every_microbatch``: torchtitan without PP);
    ZeRO-1/2 reduce-scatter gradients and all-gather updated weights; ZeRO-3 also all-gathers weights for the
    forward and again for the backward (COST_MODEL.md §4) — in every one of the ``m`` micro-batches, as FSDP2 does
    under gradient accumulation; under torch's pipelining once per step (``pp_fsdp_gathers``), the reduce-scatter
    once and blocking. Where the runtime reduces sharded gradients in every micro-batch
    (``rt.grad_reduce_every_microbatch``, Megatron-FSDP ``optim_grads``) the ZeRO-2 reduce-scatter runs ``m``
    times, and with ``vp`` model chunks the ``(vp − 1)/vp`` of it that belongs to the unbucketed chunks is
    ``blocking`` (waited for at the end of each chunk's backward: the target profile cites the code). Gradients travel in the target's reduce dtype (``rt.reduce_bytes``: fp32 in Megatron
    unless ``--grad-reduce-in-bf16``, megatron/training/arguments.py:716-723; fp32 in torch FSDP2's
    ``MixedPrecisionPolicy(reduce_dtype=fp32)``), weights in bf16 (``rt.gather_bytes``). FSDP2
    ``reshard_after_forward``: False drops the backward all-gather, an int ``r`` runs it inside groups of ``r``
    ranks (``fully_shard`` docstring). Sharded in groups (``memory.hsdp_replicas``), each shard's gradient is also
    all-reduced across the replicas, dense and expert alike (Megatron's and torch's code cited where it is priced)."""
    group = par.hsdp_shard_size or dp * par.cp
    expert_group = expert_shard_group(par.tp, par.cp, dp, par.ep, par.zero_stage, par.hsdp_shard_size)
    replicas = hsdp_replicas(dp * par.cp, par.hsdp_shard_size)
    worst = (0.0, 0.0, 0.0, 0.0)
    every = rt.grad_reduce_every_microbatch and par.zero_stage == 2
    bounds = [sum(layers[:s]) for s in range(len(layers) + 1)]
    for s in range(len(layers)):
        ids = range(bounds[s], bounds[s + 1]) if layer_ids is None else layer_ids[s]
        sp = stage_params(model, par, ids, first=s == 0, last=s == par.pp - 1,
                          mtp=None if mtp_rank is None else s == mtp_rank)
        total_s = total_b = blocking = 0.0
        # The dp·cp group is contiguous at stride tp; the expert-data-parallel group at stride ep.
        for params, g, stride in ((sp.dense, group, strides.cp), (sp.expert, expert_group, strides.edp)):
            if params <= 0 or g * replicas <= 1:
                continue
            grad, weight = rt.reduce_bytes * params, rt.gather_bytes * params
            ops: list[tuple[str, float, int, int]]  # (collective, payload, group, calls per step)
            if par.zero_stage == 0:  # once per step (DDP no_sync), or per micro-batch (``dp_sync_every_microbatch``)
                ops = [("all_reduce", grad, g, m if dp_sync_every_microbatch(rt, 0, par.pp) else 1)]
                if rt.optimizer == "dist_muon":  # the updated bf16 parameters, all-gathered in the step (cost_models.muon)
                    ops.append(("all_gather", weight, g, 1))
            elif par.zero_stage in (1, 2):
                ops = [("reduce_scatter", grad, g, m if every else 1), ("all_gather", weight, g, 1)]
            elif par.pp > 1:
                # Under pipelining torch backs every micro-batch with resharding after backward and gradient sync
                # off (stage.py:844-848 @ torch 2.13) and reduces once, in perform_reduce_grad after the stage's
                # last backward (:1164-1177), the compute stream waiting for it: one reduce-scatter, blocking. The
                # stage stays unsharded from its first backward on (memory: pp_unsharded_bytes); with
                # reshard_after_forward False (torchtitan's default under PP, distributed/fsdp.py:71-74) it is
                # gathered once per step (``pp_fsdp_gathers``); the others, after a reshard to groups of r ranks
                # (an int), inside them.
                r = rt.reshard_after_forward
                again = pp_fsdp_gathers(r, m, par.pp) - 1
                ops = [("all_gather", weight, g, 1), ("reduce_scatter", grad, g, 1)]
                if again:
                    ops.append(("all_gather", weight, g if r is True else min(int(r), g), again))
            else:
                r = rt.reshard_after_forward
                again = [] if r is False else [("all_gather", weight, g if r is True else min(int(r), g), m)]
                ops = [("all_gather", weight, g, m), *again, ("reduce_scatter", grad, g, m)]
            placed = [(kind, payload, n, calls, stride) for kind, payload, n, calls in ops]
            if replicas > 1:
                # Sharded in groups: each rank's reduce-scattered gradient shard is all-reduced across the replicas of
                # its shard group, dense and routed-expert gradients alike. Megatron (zero 1,
                # ``--num-distributed-optimizer- instances`` > 1): after each bucket group's reduce-scatter in the
                # instance, an all-reduce of that shard on ``inter_distributed_optimizer_instance_group``
                # (megatron/core/distributed/param_and_grad_buffer.py:459-486 @ core_v0.16.1) for the dense and the
                # expert buffers (distributed_data_parallel.py:226-235: every bucket group gets the one group), which
                # is the inter-partial expert data-parallel group (parallel_state.py:2012-2022, built at :1287-1309:
                # the outer level of edp = intra × instances, so its ranks step over whole instances: tp*hsdp). Both
                # run on one communication stream that waits on the backward's compute
                # (param_and_grad_buffer.py:411-422), so they overlap the backward as the reduce-scatter does, once
                # per step (``finish_grad_sync`` waits for the stream, :528-530). FSDP2 HSDP (zero 3):
                # ``foreach_reduce`` all-reduces the reduce-scatter output on the replicate group on its own stream
                # (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_collectives.py:634-672) each time FSDP2 syncs
                # gradients (``hsdp_reduces_per_step``; torchtitan does not call ``set_requires_all_reduce(False)``),
                # experts on ("dp_replicate", "efsdp") (``expert_shard_group``). Payload: the reduce dtype's shard
                # (fp32 ``grad_data`` in Megatron, FSDP2's ``reduce_dtype``).
                placed.append(("all_reduce", grad / g, replicas, hsdp_reduces_per_step(par, m, every),
                               strides.cp * group))
            for kind, payload, n, calls, at in placed:
                op_s = calls * group_collective_time_s(kind, payload, n, at, cluster)  # type: ignore[arg-type]
                total_s += op_s
                total_b += calls * (2 if kind == "all_reduce" else 1) * (n - 1) / n * payload
                if every and kind == "reduce_scatter":
                    blocking += op_s * (par.vp - 1) / par.vp
                elif pp_unsharded_stage(rt, par.zero_stage, par.pp) and kind != "all_gather":  # perform_reduce_grad,
                    blocking += op_s  # above (FSDP2's ZeRO-0 too: its all-reduce)
        if not rt.overlap_grad_reduce and par.zero_stage < 2:
            # Megatron without --overlap-grad-reduce reduces after the backward (and gathers in the step): exposed
            blocking = total_s
        if rt.optimizer != "adam":  # Muon: its state passes and Newton-Schulz GEMMs (cost_models.muon cites the code)
            on_mtp = bool(model.arch.mtp_layers) and s == (par.pp - 1 if mtp_rank is None else mtp_rank)
            opt_s = optimizer_step_s(model, cluster, par, ids, sp.dense, sp.expert, rt, group, expert_group, on_mtp)
        else:
            local = sp.dense / (group if par.zero_stage else 1) + sp.expert / (expert_group if par.zero_stage else 1)
            opt_s = rt.adam_bytes_per_param * local / (cluster.gpu.hbm_tbytes_per_s * 1e12)
        if total_s + opt_s > worst[0] + worst[2]:
            worst = (total_s, total_b, opt_s, blocking)
    return worst


def fsdp_gathered_once(rt: Runtime, zero_stage: int, pp: int) -> bool:
    """Whether FSDP2 gathers each unit once per step: a pipeline stage not resharded after forward (torchtitan's
    default under PP), ``pp_fsdp_gathers``."""
    return zero_stage == 3 and pp > 1 and rt.reshard_after_forward is False


def pp_fsdp_gathers(reshard_after_forward: bool | int, m: int, pp: int) -> int:
    """All-gathers per step of one FSDP2 unit of a pipeline stage (1F1B, ``m`` micro-batches): with resharding after
    backward off (torch 2.13 pipelining/stage.py:844-848) a unit gathered in a backward stays so. Not resharded after
    forward either: once, in the first forward. Resharded after each forward: every backward gathers it again, and
    so does each warm-up forward before the first backward (at most pp of them, the first stage's); a forward after
    a backward finds it gathered. tests/test_fsdp2_pipelining_sync.py counts torch's own calls."""
    return 1 if reshard_after_forward is False else m + min(m, pp)


def fsdp2_gathers_per_microbatch(rt: Runtime, pp: int, m: int) -> float:
    """Unshards per micro-batch of one FSDP2 unit: under pipelining ``pp_fsdp_gathers`` per step over its ``m``
    micro-batches; without, each forward gathers and each backward again unless ``reshard_after_forward`` is False
    (resharded after each backward, FSDP2's default: torch 2.13 _fully_shard.py ``reshard_after_backward``)."""
    if pp > 1:
        return pp_fsdp_gathers(rt.reshard_after_forward, m, pp) / m
    return 1.0 if rt.reshard_after_forward is False else 2.0


def fsdp2_unshard_copy_s(params: Any, group: int, gathers: float, rt: Runtime, cluster: ClusterSpec) -> Any:
    """Seconds per micro-batch of the copies FSDP2 runs on the compute stream to unshard ``params`` parameters
    (a float or an array) sharded over ``group`` ranks, ``gathers`` times per micro-batch (memory-bound kernels):
    over more than one rank, ``foreach_all_gather_copy_out`` splits the all-gather output into the unsharded
    parameters (read and write ``rt.gather_bytes``; torch 2.13 _fsdp_param_group.py ``wait_for_unshard``, on the
    current stream; the cast and copy-in run on the all-gather stream); over one rank (torchtitan's ZeRO-0, an
    expert group of one) ``wait_for_unshard`` casts the shard (``rt.weight_bytes``) to the gather dtype and copies it
    into the full-size output (l. 437-455). tests/test_fsdp2_buffers.py reads those buffers off torch's code."""
    per = 2.0 * rt.gather_bytes
    if group <= 1 and rt.weight_bytes != rt.gather_bytes:
        per += rt.weight_bytes + rt.gather_bytes
    return hbm_time_s(params * per * gathers, cluster)


def fsdp2_compute_s(dense: Any, expert: Any, groups: tuple[int, int], pp: int, m: int, rt: Runtime,
                    cluster: ClusterSpec) -> Any:
    """Seconds per micro-batch torch FSDP2 runs on the compute stream for a stage's ``dense`` and ``expert``
    parameters (floats or arrays) over their shard ``groups`` (``memory.fsdp_unit_groups``): the unshard copies
    (``fsdp2_unshard_copy_s``, ``fsdp2_gathers_per_microbatch`` times) and, under pipelining, the unsharded gradient
    accumulation (``pp_grad_accumulation_s``). ``stage_time_parts`` and the search's Scorer both price it here."""
    gathers = fsdp2_gathers_per_microbatch(rt, pp, m)
    out = fsdp2_unshard_copy_s(dense, groups[0], gathers, rt, cluster) \
        + fsdp2_unshard_copy_s(expert, groups[1], gathers, rt, cluster)
    if pp > 1:
        out = out + pp_grad_accumulation_s(dense + expert, m, rt, cluster)
    return out


def pp_grad_accumulation_s(params: Any, m: int, rt: Runtime, cluster: ClusterSpec) -> Any:
    """Seconds per micro-batch a pipeline stage FSDP2 holds unsharded (``memory.pp_unsharded_stage``) with ``params``
    parameters (a float or an array) spends accumulating its unsharded gradients over the step's ``m`` micro-batches
    (``rt.pp_grad_accumulation_bytes``: gradient sync off, ``targets.common.fsdp2_pp_grad_accumulation_bytes``):
    memory-bound kernels on the compute stream inside each backward, averaged over the micro-batches (the first only
    copies)."""
    first, later = rt.pp_grad_accumulation_bytes
    return hbm_time_s(params * (first + (m - 1) * later) / m, cluster)


def _model_as_run(model: ModelSpec, par: ParallelConfig, runtime: Runtime) -> ModelSpec:
    """The model as ``runtime``'s target builds it on ``par``'s TP group (``TargetProfile.runs_model``: Megatron's
    padded vocabulary), what is priced; the model itself without a profile."""
    from cost_models.targets import profile_for

    prof = profile_for(runtime.target)
    return model if prof is None else prof.runs_model(model, par.tp)


def _model_flops_per_step(model: ModelSpec, graphs: dict[str, LayerGraph], job: JobSpec) -> float:
    s = job.seq_len
    per_token = model_flops_per_token(graphs["head"], model, s)
    per_token += model.arch.mtp_layers * (per_token + sum(model_flops_per_token(graphs[k], model, s)
                                                          for k in mtp_block_kinds(model)))
    per_token += mtp_projection_flops_per_token(model)
    for i in range(model.num_layers):
        per_token += model_flops_per_token(graphs[layer_kind(model, i)], model, s)
    return per_token * job.tokens_per_step
