"""Compute time of one op, and of one layer (the sum over its ops), for one micro-batch on one rank (COST_MODEL.md §2).

Each matmul is sharded under TP as ``op_traffic.matmul_split`` says; ops on hidden-width tensors only (MLA
down-projections, the router) are replicated. Routed experts run with expert-TP 1: tokens, not weights, are split
across TP ranks (sequence parallel), and each rank runs ``e/ep`` experts on ``tokens·k·ep/e`` tokens each, times the
load imbalance ρ. Backward = 2× forward for GEMMs (dgrad + wgrad); the attention core as ``attention_cost`` prices
it; memory-bound kernels take ``op_traffic``'s bytes over the achieved streaming bandwidth."""

from __future__ import annotations

from dataclasses import dataclass, replace

from cost_models.attention_cost import ATTN_BWD_FACTOR, attention_kernel_factor, cp_merge_bytes, unfused_attention_s
from cost_models.dsa import dsa_fused, indexer_op_s
from cost_models.gemm import attention_time_s, cudnn_attention_time_s, hbm_time_s, matmul_time_s, straggler_pace
from cost_models.gdn import gdn_core_flops
from cost_models.mamba import ssd_flops
from cost_models.knob_effects import (eager_elementwise, fp8_forward_gemm_efficiency, fp8_gemm_time_ratio,
                                      non_tn_fp8_gemm, ring_steps, wgrad_in_bf16)
from cost_models.moe import (moe_load_imbalance, permutation_passes, quantization_padded, router_padding_share,
                             routed_rows)
from cost_models.op_traffic import local_widths, op_traffic_bytes
from cost_models.opgraph import DECODER_KINDS, LayerGraph, Op, gemm_precision, mean_keys_per_query, topk_keys_per_query
from cost_models.quant_layout import op_job
from cost_models.recompute import reruns
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import Runtime


@dataclass(frozen=True)
class OpCompute:
    """Seconds per micro-batch on one rank."""

    gemm_f: float  # GEMMs, forward (backward = 2×)
    attn_f: float  # attention core, forward
    attn_b: float  # attention core, backward
    mem_f: float  # memory-bound kernels, forward
    mem_b: float  # memory-bound kernels, backward
    wgrad_hp: float = 0.0  # extra backward time of weight-gradient GEMMs kept in bf16 (fp8 rowwise_with_gw_hp)
    op_sac_f: float | None = None  # forward work torchtitan's per-op SAC re-runs in the backward (None: not op-SAC)
    gemm_fwd_extra: float = 0.0  # forward GEMMs slower than the model's fp8 GEMM (torchao rowwise: CUTLASS kernel)
    # per op of the graph: the forward time a selective-recompute module re-running it adds (``cost_models.recompute``;
    # the attention core: its kernel, ``attn_f``, as plain ``selective`` has always priced it)
    op_rerun_f: tuple[float, ...] = ()
    # per op of the graph, its ``op_compute`` in the job's precision (a layer's sum only; ``job_precision_ops``)
    ops: tuple["OpCompute", ...] = ()

    @property
    def forward_s(self) -> float:
        return self.gemm_f + self.gemm_fwd_extra + self.attn_f + self.mem_f

    @property
    def backward_s(self) -> float:
        """GEMMs 2× forward (dgrad + wgrad); the attention core and memory-bound kernels as priced."""
        return 2 * self.gemm_f + self.attn_b + self.mem_b + self.wgrad_hp

    def forward_pass_s(self, recompute: str, graph: LayerGraph | None = None,
                       modules: frozenset[str] | None = None) -> float:
        """The forward pass's time: ``forward_s`` less the ops that run only in the recompute's re-run
        (``skips_forward``: DSA's indexer loss under a checkpoint that re-runs it)."""
        if graph is None or not self.op_rerun_f:
            return self.forward_s
        return self.forward_s - sum(f for op, f in zip(graph.ops, self.op_rerun_f)
                                    if skips_forward(op, graph, recompute, modules))

    def recompute_s(self, recompute: str, graph: LayerGraph | None = None,
                    modules: frozenset[str] | None = None) -> float:
        """Selective recompute repeats the attention core's forward (Megatron), or under torchtitan's per-op SAC
        what it did not save (``op_sac_f``), or with Megatron's ``modules`` (``cost_models.recompute``) the forward
        of every op they re-run; full recompute the whole forward."""
        if recompute == "selective" and self.op_sac_f is not None:
            return self.op_sac_f
        if recompute == "selective" and modules is not None and graph is not None and self.op_rerun_f:
            return sum(f for op, f in zip(graph.ops, self.op_rerun_f) if reruns(op, graph, modules))
        return {"none": 0.0, "selective": self.attn_f, "full": self.forward_s}[recompute]


def efficient_sdpa(model: ModelSpec, cluster: ClusterSpec, rt: Runtime | None) -> bool:
    """Whether the attention core runs PyTorch SDPA's memory-efficient kernel in place of FlashAttention-2: the
    stack puts flash first with efficient next (``Runtime.sdpa_unequal_v_efficient``; priced as FA2 there,
    ``Efficiency.attention_fa2``), flash refuses the model's value head dim unequal to its query/key head dim (MLA),
    and the generation has the kernel's measured rate (``Efficiency.attention_efficient_fwd`` / ``_bwd``)."""
    eff, mla = cluster.efficiency, model.mla
    return (rt is not None and rt.sdpa_unequal_v_efficient and eff.attention_fa2 and mla is not None
            and mla.qk_nope_head_dim + mla.qk_rope_head_dim != mla.v_head_dim
            and eff.attention_efficient_fwd is not None and eff.attention_efficient_bwd is not None)


def titan_attention_rates(model: ModelSpec, cluster: ClusterSpec, rt: Runtime | None) -> tuple[float, float] | None:
    """(forward, backward) throughput of the attention kernel torchtitan 0.3.0 runs ``model`` on, over the cuDNN
    SDPA figure the generation prices (``Runtime.titan_attention``): FlexAttention's measured rates
    (``Efficiency.attention_flex_*``, the MLA pair where the value head dim differs from the query/key one) or varlen
    FlashAttention's (``attention_varlen_*``: gpt_oss). None: not that runtime, a model torchtitan does not ship or a
    generation without the rates (priced at the cuDNN figure)."""
    if rt is None or not rt.titan_attention:
        return None
    from cost_models.targets.torchtitan_models import UnsupportedModelError, titan_model

    try:
        backend = titan_model(model).attn_backend
    except UnsupportedModelError:
        return None
    eff, mla = cluster.efficiency, model.mla
    unequal = mla is not None and mla.qk_nope_head_dim + mla.qk_rope_head_dim != mla.v_head_dim
    fwd, bwd = ((eff.attention_varlen_fwd, eff.attention_varlen_bwd) if backend == "varlen" else
                (eff.attention_flex_mla_fwd, eff.attention_flex_mla_bwd) if unequal else
                (eff.attention_flex_fwd, eff.attention_flex_bwd))
    return None if fwd is None or bwd is None else (fwd, bwd)


def op_compute(op: Op, graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
               par: ParallelConfig, rt: Runtime | None = None) -> OpCompute:
    """Compute time of one op for one micro-batch on one rank, sharded as ``par`` says (the uniform layer
    passes its config; the intra-op search passes each op's own sharding)."""
    t = par.tp
    eff = cluster.efficiency
    tokens = par.micro_batch_size * job.seq_len / par.cp
    gemm = attn_f = attn_b = wgrad_hp = fwd_extra = idx_mf = idx_mb = 0.0
    if op.kind in ("matmul", "router"):
        k, n = local_widths(op, graph, 1 if op.name in ("k_proj", "v_proj") and kv_replicated(graph, par) else t)
        rows = tokens
        if op.name.endswith("_latent_proj") and par.sequence_parallel and t > 1:
            rows = tokens / t  # replicated weights on the sequence-parallel shard (moe_layer.py:265-270, 343-345)
        gemm = matmul_time_s(rows, k, n, cluster, gemm_precision(op, job.precision))
        if op.kind == "matmul" and op.quantized:
            gemm *= fp8_gemm_time_ratio(rt, job)  # block-scaled MXFP8 kernel vs per-tensor fp8
        if op.kind == "matmul" and op.quantized and wgrad_in_bf16(rt, job):
            wgrad_hp = matmul_time_s(tokens, k, n, cluster, "bf16") - gemm
        if op.kind == "matmul" and op.quantized:
            fwd_extra = gemm * (1.0 / fp8_forward_gemm_efficiency(rt, job) - 1.0)
    elif op.kind == "experts":
        local_experts = model.num_experts // par.ep
        routed = tokens / (t if par.sequence_parallel else 1) * op.tokens_factor * par.ep
        # the router's padded copies ride on every rank's experts, the busiest's too (moe.router_padding_share)
        per_expert = routed / model.num_experts * (moe_load_imbalance(model, job, par, cluster, rt)
                                                   + router_padding_share(model, job, par, cluster, rt))
        gemm = local_experts * matmul_time_s(per_expert, op.weight_in, op.weight_out, cluster, job.precision) \
            * fp8_gemm_time_ratio(rt, job)
    elif op.kind == "indexer":  # DSA's indexer scores and loss scores (cost_models.dsa)
        attn_f, attn_b, idx_mf, idx_mb = indexer_op_s(op, model, cluster, job, par, rt)  # + unfused score passes
    elif op.kind == "attention" and model.dsa is not None and not dsa_fused(rt):
        attn_f, attn_b = unfused_attention_s(op, model, cluster, job, par)  # unfused_dsa_fn (cost_models.dsa)
    elif op.kind == "attention":
        if eff.flash_attention:
            steps = ring_steps(par, rt)
            slow = attention_kernel_factor(model, job, par, cluster, steps, graph.kind)
            flops = op.flops_per_token * tokens / t
            titan = titan_attention_rates(model, cluster, rt)
            if titan is not None:  # torchtitan 0.3.0: FlexAttention / varlen, not SDPA, at its rate over cuDNN's
                base = cudnn_attention_time_s(flops, cluster) * slow
                attn_f, attn_b = base / titan[0], ATTN_BWD_FACTOR * base / titan[1]
            else:
                attn_f = attention_time_s(flops, cluster) * slow
                attn_b = ATTN_BWD_FACTOR * attn_f
            if efficient_sdpa(model, cluster, rt):  # flash refuses v != q/k: SDPA's memory-efficient kernel runs
                attn_f, attn_b = attn_f / eff.attention_efficient_fwd, attn_b / eff.attention_efficient_bwd
        else:
            attn_f, attn_b = unfused_attention_s(op, model, cluster, job, par)
    passes = permutation_passes(cluster, model.num_experts // par.ep, rt, op.kind, par.ep) \
        if op.kind in ("dispatch", "combine") else 1
    pad = op.kind == "experts" and quantization_padded(model, job, par, cluster, rt)
    mem_f, mem_b = op_traffic_bytes(op, graph, model, job, par, rt, eager_elementwise(eff, rt),
                                    non_tn_fp8_gemm(cluster), passes, pad, eff.mcore_glue_time_ratio)
    mem_f, mem_b = mem_f + idx_mf, mem_b + idx_mb
    if routed_rows_op(op):  # capacity rows or the router's padded copies: moved, padded, activated like the routed
        rows = routed_rows(model, job, par, cluster, rt)
        mem_f, mem_b = mem_f * rows, mem_b * rows
    if op.kind == "attention" and par.cp > 1 and ring_steps(par, rt) > 1:
        merge_f, merge_b = cp_merge_bytes(op, graph, job, par, ring_steps(par, rt))
        mem_f, mem_b = mem_f + merge_f, mem_b + merge_b
    extra = gemm * eff.memory_bound_fraction
    mem_tf, mem_tb = hbm_time_s(mem_f, cluster), hbm_time_s(mem_b, cluster)
    if op.kind == "ssm" and model.mamba is not None and eff.ssd_tflops:
        # the SSD kernels' tensor-core work at the rate they sustain, where it takes longer than their bytes: one max
        # over the whole ssm op (its conv / cumsum / layout bytes included), as ssd_tflops was fitted, not per kernel
        flops_f, flops_b = ssd_flops(model.mamba, t, par.cp)
        rate = eff.ssd_tflops * 1e12 / straggler_pace(cluster)
        mem_tf, mem_tb = max(mem_tf, flops_f * tokens / rate), max(mem_tb, flops_b * tokens / rate)
    if op.kind == "gdn" and model.gdn is not None and eff.ssd_tflops:
        # the chunked gated delta rule's tensor-core work at the Triton chunked-scan rate (cost_models.gdn), where it
        # takes longer than its bytes: one max over the whole op, as for the SSD scan above
        flops_f, flops_b = gdn_core_flops(model, t)
        rate = eff.ssd_tflops * 1e12 / straggler_pace(cluster)
        mem_tf, mem_tb = max(mem_tf, flops_f * tokens / rate), max(mem_tb, flops_b * tokens / rate)
    return OpCompute(gemm, attn_f, attn_b, mem_tf + extra, mem_tb + extra, wgrad_hp, gemm_fwd_extra=fwd_extra)


def rerun_forward_s(op: Op, oc: OpCompute) -> float:
    """The forward time a selective-recompute module that re-runs ``op`` adds (``cost_models.recompute``): the
    attention core its kernel (``attn_f``, as plain ``selective`` has always priced it), any other op its forward."""
    return oc.attn_f if op.kind == "attention" else oc.forward_s


def skips_forward(op: Op, graph: LayerGraph, recompute: str, modules: frozenset[str] | None) -> bool:
    """Whether ``op`` runs only in the recompute's re-run, not in the forward pass: DeepSeek sparse attention's
    indexer loss (``idx_loss``) is built only with grad enabled (``self.training and torch.is_grad_enabled()``,
    megatron-core 0.16.1 experimental_attention_variant/dsa.py:799; core_v0.19.0 :1893), and a checkpointed forward
    runs under ``torch.no_grad()`` (tensor_parallel/random.py ``CheckpointFunction.forward`` :516-517) while its re-run
    runs under ``torch.enable_grad()`` (:556-557). So where the recompute re-runs it (full recompute, or a selective
    module that re-runs it: ``core_attn``, ``cost_models.recompute.reruns``) its forward is priced once, in the
    recompute (as ``tp_comm.dsa_tp_collectives`` prices its all-reduce once)."""
    if not (op.kind == "indexer" and op.name == "idx_loss"):
        return False
    if recompute == "full":
        return True
    if recompute == "selective" and modules is not None:
        return reruns(op, graph, modules)
    return False


def op_forward_s(op: Op, graph: LayerGraph, oc: OpCompute, recompute: str, modules: frozenset[str] | None) -> float:
    """One op's share of ``OpCompute.forward_pass_s`` (``oc``: the op's own ``op_compute``)."""
    return 0.0 if skips_forward(op, graph, recompute, modules) else oc.forward_s


def op_recompute_s(op: Op, graph: LayerGraph, oc: OpCompute, recompute: str, modules: frozenset[str] | None) -> float:
    """One op's share of ``OpCompute.recompute_s`` (``oc``: the op's own ``op_compute``): under Megatron's selective
    ``modules`` its forward where they re-run it, else its own ``recompute_s``; summed over a layer's ops, the
    layer's (the intra-op strategies price each op with it)."""
    if recompute == "selective" and modules is not None and oc.op_sac_f is None:
        return rerun_forward_s(op, oc) if reruns(op, graph, modules) else 0.0
    return oc.recompute_s(recompute)


def routed_rows_op(op: Op) -> bool:
    """Whether ``op``'s memory-bound work scales with the routed token copies: the dispatch / combine permutations,
    the experts and their activation."""
    return op.kind in ("dispatch", "combine", "experts") or (op.kind == "elementwise" and op.name.startswith("expert_"))


def _compute(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
             rt: Runtime | None = None) -> OpCompute:
    """Compute time of one layer for one micro-batch on one rank: the sum of ``op_compute`` over its ops."""
    parts = []
    for op in graph.ops:
        op_j, op_rt = op_job(op, graph, job, rt)  # a module's own precision under a quantization recipe
        parts.append(op_compute(op, graph, model, cluster, op_j, par, op_rt))
    total = OpCompute(*(sum(getattr(p, f) for p in parts)
                        for f in ("gemm_f", "attn_f", "attn_b", "mem_f", "mem_b", "wgrad_hp")),
                      gemm_fwd_extra=sum(p.gemm_fwd_extra for p in parts),
                      op_rerun_f=tuple(rerun_forward_s(op, p) for op, p in zip(graph.ops, parts)),
                      ops=tuple(parts) if rt is None or not rt.module_precision else ())
    if rt is None or rt.selective != "op_sac" or graph.kind not in DECODER_KINDS:
        return total
    # torchtitan's per-op SAC (parallelize_llama.py ``_save_list``, ``_custom_policy``: every other mm and the SDPA
    # output are saved, every other op is recomputed): the backward re-runs every memory-bound forward kernel (norms,
    # rotary, activation, residual adds, casts: eager or fused as the runtime runs them) and every other GEMM's
    # forward; the attention core is not re-run where the save list holds its kernel (``Runtime.sac_saves_attention``:
    # torchtitan before b39377f9f re-runs cuDNN's).
    from cost_models.memory import op_sac_saved  # memory imports this module's callers

    kept = op_sac_saved(graph, rt.sac_saves_attention)
    redo = sum(p.mem_f + (p.gemm_f + p.gemm_fwd_extra if op.kind in ("matmul", "experts", "router")
                          and (op.name, op.output) not in kept else 0.0)
               + (p.attn_f if op.kind == "attention" and (op.name, op.output) not in kept else 0.0)
               for op, p in zip(graph.ops, parts))
    return replace(total, op_sac_f=redo)

def kv_gather_width(graph: LayerGraph, t: int) -> int:
    """Width of the QKV output Megatron gathers across TP when ``t`` exceeds the KV heads (GQA), else 0.

    Megatron-Core 0.16.1 splits ``linear_qkv`` evenly over ``t`` ranks even when a rank's share is less than one KV
    group; it then all-gathers the whole ``[s, b, (a + 2g)·d]`` output over TP and keeps its own group's slice
    (``megatron/core/transformer/attention.py:1398-1416``, ``get_query_key_value_tensors``), whose backward is a
    reduce-scatter (``megatron/core/tensor_parallel/mappings.py:380-397``, ``_AllGatherFromTensorParallelRegion``).
    The weights stay sharded ``t`` ways; each rank then holds one K/V head (attention.py:289-300)."""
    k = graph.tensors.get("k")
    if k is None or not k.heads or t <= k.heads:
        return 0
    return graph.tensors["q"].width + k.width + graph.tensors["v"].width


def kv_replicated(graph: LayerGraph, par: ParallelConfig) -> bool:
    """K/V projections whole on every TP rank: t > num_kv_heads with ``kv_replication='replicate'`` (a DTensor
    ``Replicate`` module; each rank keeps the KV heads of its query heads). Their GEMMs run unsplit, their saved
    input is the one Q shares, and the weight gradient of each rank covers only its query heads: it is
    all-reduced over TP in backward (``kv_replica_grad_collectives``)."""
    return bool(kv_gather_width(graph, par.tp)) and par.kv_replication == "replicate"


def job_precision_ops(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                      rt: Runtime | None, compute: OpCompute | None = None) -> tuple[OpCompute, ...]:
    """``op_compute`` of each op of ``graph`` in the job's precision (what ``layer_cost``'s per-op terms read: the
    GEMMs under TP userbuffers, the A2A overlap's nodes, the experts' forward): ``compute``'s own parts, where it is
    ``layer_compute`` of the same arguments and no module runs in another precision, else computed."""
    if compute is not None and compute.ops:
        return compute.ops
    return tuple(op_compute(op, graph, model, cluster, job, par, rt) for op in graph.ops)


def layer_compute(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                  rt: Runtime | None = None) -> OpCompute:
    """``layer_cost``'s compute part (the sum of ``op_compute``). It reads neither ``par.recompute`` nor
    ``par.schedule``: callers pricing one layer under several recompute settings compute it once and pass it."""
    return _compute(graph, model, cluster, job, par, rt)


def layer_compute_key(par: ParallelConfig, rt: Runtime | None) -> tuple:
    """All ``layer_compute`` reads of ``par`` and ``rt`` (``op_compute``, ``op_traffic_bytes``, the ``knob_effects``
    helpers they call, the op-SAC branch): for one graph, model, cluster and job, equal keys give equal answers
    (callers cache on it; keep it in step with those functions)."""
    knobs = None if rt is None else (rt.model_compiled, rt.fp8_recipe, rt.fp8_impl, rt.fused_elementwise, rt.fused_loss,
                                     rt.selective, rt.sac_saves_attention,  # the op-SAC branch's attention re-run
                                     rt.sdpa_unequal_v_efficient,  # efficient_sdpa
                                     rt.titan_attention,  # titan_attention_rates
                                     ring_steps(par, rt), rt.moe_force_balance, rt.moe_capacity_factor,
                                     rt.moe_router_padding, rt.quantized_run,  # moe.router_padding_share, run_pad_align
                                     rt.mcore_expert_glue, rt.mcore_yarn_unfused_rope, rt.moe_dispatcher, rt.moe_passes,
                                     rt.moe_fused_grouped_mlp, rt.megatron_core,  # op_traffic.fused_grouped_mlp
                                     rt.dsa_kernel_backend,  # cost_models.dsa.dsa_fused
                                     rt.target, rt.tp_gather_bytes,
                                     rt.tp_grad_gather_bytes,  # these two: torchao_cast_after_gather
                                     rt.module_precision)  # quant_layout.op_job
    return par.tp, par.cp, par.ep, par.micro_batch_size, par.sequence_parallel, par.kv_replication, knobs


def model_flops_per_token(graph: LayerGraph, model: ModelSpec, seq_len: int) -> float:
    """Training model FLOPs per token of one layer (no recompute): 3 × forward, attention counted
    without the causal discount (PaLM / Megatron convention for MFU); a Mamba-2 scan as Megatron-LM counts it
    (``7 · d_inner · state``, training.py ``mamba_layer_flops``), a Gated DeltaNet core as it counts that
    (``gdn.gdn_model_flops``).

    DeepSeek sparse attention's ``indexer`` ops are model work as the MTP modules are (training math, not
    rematerialization or an implementation's waste): the indexer's scores (DeepSeek-V3.2-Exp report eq. 1) select
    every layer's top-k and train through the KL loss (3 × forward), the loss's dense target ``Q·Kᵀ`` is computed
    forward only (query and key detached, megatron-core 0.16.1 dsa.py:805-806: 1 × forward); both score each query
    against its keys, so counted as the attention core is, without the causal discount, at the design's causal key
    count (``opgraph._dsa_indexer``), whatever keys an implementation computes (the unfused path's every key).

    DSA's sparse core attends each query to its indexer's top-k keys, ``min(i + 1, k)`` for query ``i``
    (DeepSeek-V3.2-Exp report §2.1, k = 2048): no causal halving to undo (the mean is ≈ k, not ≈ s/2, and doubling it
    counted up to 2k keys a query, 3072 at s 4096), so it is counted at that exact mean (``opgraph.topk_keys_per_query``;
    Megatron-Bridge's DSA FLOPs' ``sparse_causal_context``, flop_utils.py @ 067f987df), derived from the op's FLOPs
    at the graph's mean (``opgraph.mean_keys_per_query``)."""
    fwd = 0.0
    once = 0.0  # forward-only work: no backward to count
    for op in graph.ops:
        if op.kind in ("matmul", "router", "experts", "ssm", "gdn"):
            fwd += op.flops_per_token * op.tokens_factor
        elif op.kind == "attention" and model.dsa is not None:  # the sparse core: its top-k keys, as it reads them
            fwd += (op.flops_per_token / mean_keys_per_query(model, graph.kind, seq_len)
                    * topk_keys_per_query(seq_len, model.dsa.index_topk))
        elif op.kind == "attention":
            fwd += op.flops_per_token * 2  # undo the causal halving
        elif op.kind == "indexer" and op.name == "idx_loss":
            once += op.flops_per_token * 2
        elif op.kind == "indexer":
            fwd += op.flops_per_token * 2
    return 3.0 * fwd + once
