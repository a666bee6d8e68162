"""Time of one layer for one micro-batch on one rank: compute from the operator graph, and the
critical-path collectives of TP, CP and EP (COST_MODEL.md §2, §4).

Sharding of each matmul under TP (Shoeybi et al. 2019, Megatron-LM §3): an op whose output has head/FFN/
vocab width is column-parallel (``n ÷ t``), one whose input has it is row-parallel (``k ÷ t``); ops on
hidden-width tensors only (MLA down-projections, the router) are replicated. Routed experts run with
expert-TP 1: tokens, not weights, are split across TP ranks (sequence parallel), and each rank runs
``e/ep`` experts on ``tokens·k·ep/e`` tokens each, times the load imbalance ρ.
Backward = 2× forward for GEMMs (dgrad + wgrad); FlashAttention's backward ≈ 2.5× its forward
(Dao 2023, FlashAttention-2 §3.2: recomputes P). Non-GEMM kernels (norms, rotary, activations) are
memory-bound and cost ``memory_bound_fraction`` of the GEMM time.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.collectives import RankStrides, group_collective_time_s
from cost_models.gemm import attention_time_s, matmul_time_s
from cost_models.opgraph import LayerGraph, Op
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig

ATTN_BWD_FACTOR = 2.5
_COLUMN_KINDS = {"q", "kv", "ffn", "expert_ffn", "vocab"}


@dataclass(frozen=True)
class LayerCost:
    """Seconds per micro-batch on one rank; ``*_bytes`` are bytes each rank sends."""

    forward_s: float
    backward_s: float
    recompute_s: float
    attention_s: float  # the attention core, fwd + bwd (what CP's ring can hide behind)
    tp_s: float
    ep_s: float
    cp_s: float
    tp_bytes: float
    ep_bytes: float
    cp_bytes: float

    @property
    def cp_exposed_s(self) -> float:
        """Ring attention overlaps each K/V block transfer with the previous block's compute."""
        return max(0.0, self.cp_s - self.attention_s)

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s + self.tp_s + self.ep_s + self.cp_exposed_s


def _matmul_split(op: Op, graph: LayerGraph, t: int) -> tuple[int, int]:
    out_kind = graph.tensors[op.output].dim_kind
    in_kind = graph.tensors[op.inputs[0]].dim_kind
    k, n = op.weight_in, op.weight_out
    if out_kind in _COLUMN_KINDS:
        return k, -(-n // t)
    if in_kind in _COLUMN_KINDS:
        return -(-k // t), n
    return k, n


def _compute(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
             par: ParallelConfig) -> tuple[float, float, float, float]:
    """(GEMM forward s, attention forward s, memory-bound forward s, attention flops) per micro-batch."""
    t = par.tp
    tokens = par.micro_batch_size * job.seq_len / par.cp
    gemm = attn = 0.0
    for op in graph.ops:
        if op.kind in ("matmul", "router"):
            k, n = _matmul_split(op, graph, t) if op.kind == "matmul" else (op.weight_in, op.weight_out)
            gemm += matmul_time_s(tokens, k, n, cluster, job.precision)
        elif op.kind == "experts":
            local_experts = model.num_experts // par.ep
            routed = tokens / (t if par.sequence_parallel else 1) * op.tokens_factor * par.ep
            per_expert = routed / model.num_experts * cluster.efficiency.moe_imbalance
            gemm += local_experts * matmul_time_s(per_expert, op.weight_in, op.weight_out, cluster, job.precision)
        elif op.kind == "attention":
            attn += attention_time_s(op.flops_per_token * tokens / t, cluster)
    return gemm, attn, gemm * cluster.efficiency.memory_bound_fraction, attn


def layer_cost(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
               par: ParallelConfig, dp: int) -> LayerCost:
    """Cost of one layer of ``graph.kind`` for one micro-batch on one rank."""
    t, c, e = par.tp, par.cp, par.ep
    strides = RankStrides.megatron(t, c, dp)
    gemm, attn, membound, _ = _compute(graph, model, cluster, job, par)
    forward = gemm + attn + membound
    backward = 2 * gemm + ATTN_BWD_FACTOR * attn + membound
    recompute = {"none": 0.0, "selective": attn, "full": forward}[par.recompute]
    h = model.hidden_size
    tokens = par.micro_batch_size * job.seq_len / c
    tp_s = tp_bytes = ep_s = ep_bytes = cp_s = cp_bytes = 0.0
    is_block = graph.kind in ("dense", "moe")
    if t > 1 and is_block:
        # Per transformer block: one all-reduce forward and one backward (or AG + RS with SP: same volume).
        blocks = 2 if graph.kind == "dense" or model.num_shared_experts else 1
        fwd_collectives = blocks * (2 if par.recompute == "full" else 1)
        n_ar = blocks + fwd_collectives
        payload = 2.0 * tokens * h
        tp_s = n_ar * group_collective_time_s("all_reduce", payload, t, strides.tp, cluster)
        tp_bytes = n_ar * 2.0 * (t - 1) / t * payload
    if graph.kind == "moe" and e > 1:
        # 4 all-to-alls per MoE layer per micro-batch (dispatch/combine, fwd/bwd), × imbalance ρ (§4).
        local_tokens = tokens / (t if par.sequence_parallel else 1)
        payload = local_tokens * model.moe_top_k * h * 2.0 * cluster.efficiency.moe_imbalance
        ep_s = 4 * group_collective_time_s("all_to_all", payload, e, strides.ep, cluster)
        ep_bytes = 4 * (e - 1) / e * payload
    if c > 1 and is_block:
        # Ring attention: 3·(c−1) K/V blocks of (s/c)·b·(w_k + w_v)/t · 2 bytes (fwd K,V; bwd K,V, dK,dV).
        kv_width = graph.tensors["k"].width + graph.tensors["v"].width
        block = tokens * kv_width / t * 2.0
        n_blocks = 3 * (c - 1)
        cp_s = n_blocks * group_collective_time_s("send_recv", block, 2, strides.cp, cluster)
        cp_bytes = n_blocks * block
    return LayerCost(forward, backward, recompute, attn * (1 + ATTN_BWD_FACTOR), tp_s, ep_s, cp_s, tp_bytes,
                     ep_bytes, cp_bytes)


def model_flops_per_token(graph: LayerGraph) -> float:
    """Training model FLOPs per token of one layer (no recompute): 3 × forward, attention counted
    without the causal discount (PaLM / Megatron convention for MFU)."""
    fwd = 0.0
    for op in graph.ops:
        if op.kind in ("matmul", "router", "experts"):
            fwd += op.flops_per_token * op.tokens_factor
        elif op.kind == "attention":
            fwd += op.flops_per_token * 2  # undo the causal halving
    return 3.0 * fwd
