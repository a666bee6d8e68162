"""Memory per GPU (COST_MODEL.md §3).

Resident state, mixed-precision Adam, bytes per parameter held by the rank (seeds eq. 29.7–29.10;
Rajbhandari et al. 2020, ZeRO §5): ``P = 2`` bf16 weights, ``G = 2`` bf16 grads, ``O = 12`` fp32 master,
m and v. With ZeRO over a shard group of ``R`` ranks: ``M0 = P+G+O``, ``M1 = P+G+O/R``,
``M2 = P+(G+O)/R``, ``M3 = (P+G+O)/R`` plus, for ZeRO-3/FSDP, one gathered layer and one prefetched.
TP, PP and EP divide what a rank holds before ZeRO does; routed-expert weights (expert-TP 1) shard over the
expert-data-parallel group ``tp·cp·dp/ep``, everything else over ``dp·cp`` (or the HSDP shard group).

Activations come from the operator graph (``opgraph``: Korthikanti et al. 2022 Table 2) with TP/SP/CP and
recompute; pipeline stages keep micro-batches in flight per schedule (§3): 1F1B stage ``i`` of ``p`` keeps
``min(p − i, m)``; interleaved multiplies stage 0's by ``1 + (p−1)/(p·v)``; ZB-H1 keeps 1F1B's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cost_models.opgraph import LayerGraph, Op, layer_graph
from cost_models.specs import JobSpec, ModelSpec, ParallelConfig

GIB = 2**30
WEIGHT_BYTES, GRAD_BYTES, OPTIM_BYTES = 2.0, 2.0, 12.0
CUDA_CONTEXT_GIB = 1.0  # CUDA context + cuBLAS/NCCL workspaces (measured ~0.8–1.2 GiB on H100)
COMM_BUFFER_GIB = 0.5  # NCCL channel buffers across a handful of communicators
FRAGMENTATION = 0.05  # caching-allocator fragmentation as a fraction of activation memory


def zero_state_bytes(params: float, zero_stage: int, shard_group: int) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes for ``params`` held by a rank under ZeRO over ``shard_group``."""
    r = max(1, shard_group)
    p, g, o = WEIGHT_BYTES * params, GRAD_BYTES * params, OPTIM_BYTES * params
    if zero_stage == 0:
        return p, g, o
    if zero_stage == 1:
        return p, g, o / r
    if zero_stage == 2:
        return p, g / r, o / r
    return p / r, g / r, o / r


@dataclass(frozen=True)
class StageParams:
    """Parameters one rank of a pipeline stage holds, split by how ZeRO shards them."""

    dense: float  # sharded over dp·cp (or the HSDP group)
    expert: float  # sharded over dp·cp/ep
    largest_layer: float  # for ZeRO-3's gathered + prefetched units


def stage_params(model: ModelSpec, par: ParallelConfig, first_layer: int, n_layers: int, *, first: bool,
                 last: bool) -> StageParams:
    t, e = par.tp, par.ep
    dense = expert = largest = 0.0
    for i in range(first_layer, first_layer + n_layers):
        ex = model.layer_expert_params(i)
        norms = model.norm_params_per_layer
        d = (model.layer_params(i) - ex - norms) / t + norms
        dense += d
        expert += ex / e  # expert TP = 1: experts are not split by tp
        largest = max(largest, d + ex / e)
    if first:
        dense += model.embedding_params / t
    if last:
        dense += model.head_params / t  # output projection (0 when tied) + final norm
        if model.tied_embeddings and par.pp > 1:  # the last stage keeps its own copy of the tied weight
            dense += model.vocab_size * model.hidden_size / t
    return StageParams(dense, expert, largest)


def expert_data_parallel_size(tp: int, cp: int, dp: int, ep: int) -> int:
    """Ranks holding the same routed-expert shard. With expert-TP 1, Megatron's MoE parallel folding re-cuts the
    ``tp·cp·dp`` ranks of a stage as ``ep × edp`` (Megatron-Core ``expert_tensor_parallel_size=1``)."""
    return max(1, tp * cp * dp // ep)


def activation_bytes_per_microbatch(graph: LayerGraph, model: ModelSpec, job: JobSpec, par: ParallelConfig) -> float:
    """Bytes one layer saves for backward for one micro-batch on one rank (Korthikanti Table 2 generalised).

    ``tp``-split tensors ÷ t; ``seq``-split tensors ÷ t only with sequence parallelism; everything ÷ cp.
    Selective recompute drops the attention core's score-sized tensors (the ``5·a·s/h`` term); full
    recompute keeps only the layer input (÷ t with SP)."""
    if par.recompute == "full" and graph.kind in ("dense", "moe"):
        return recompute_input_bytes(model, job, par)
    return sum(op_activation_bytes(op, job, par) for op in graph.ops)


def recompute_input_bytes(model: ModelSpec, job: JobSpec, par: ParallelConfig) -> float:
    """What a layer keeps under full recompute: its bf16 input, ÷ cp, ÷ t with sequence parallelism."""
    sp = par.sequence_parallel and par.tp > 1
    return 2.0 * model.hidden_size * par.micro_batch_size * job.seq_len / par.cp / (par.tp if sp else 1)


def op_activation_bytes(op: Op, job: JobSpec, par: ParallelConfig) -> float:
    """Bytes one op saves for backward for one micro-batch on one rank, sharded as ``par`` says (no full
    recompute: that keeps only the layer input, ``recompute_input_bytes``)."""
    t = par.tp
    sp = par.sequence_parallel and t > 1
    tokens = par.micro_batch_size * job.seq_len / par.cp
    total = 0.0
    for s in op.saved:
        if par.recompute == "selective" and op.kind == "attention" and s.tensor not in op.inputs:
            continue
        div = t if (s.split == "tp" or sp) else 1
        if op.kind in ("experts", "dispatch", "combine") or s.tensor.startswith("expert_"):
            div = t if sp else 1  # expert TP = 1: tokens, not features, are split across TP ranks
        total += s.bytes_per_token * tokens / div
    return total


def inflight_microbatches(stage: int, par: ParallelConfig, m: int) -> float:
    """Micro-batches of activations stage ``stage`` holds at its peak (COST_MODEL.md §3)."""
    p = par.pp
    held = float(min(p - stage, m))
    if par.schedule == "interleaved" and stage == 0:
        held *= 1 + (p - 1) / (p * par.vp)
    return held


@dataclass(frozen=True)
class MemoryBreakdown:
    weights: float
    grads: float
    optimizer: float
    activations: float
    zero3_buffers: float
    overhead: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.zero3_buffers + self.overhead

    def gib(self) -> dict[str, float]:
        return {k: getattr(self, k) / GIB for k in
                ("weights", "grads", "optimizer", "activations", "zero3_buffers", "overhead", "total")}


def stage_memory(model: ModelSpec, job: JobSpec, par: ParallelConfig, dp: int, stage: int, layers: list[int],
                 m: int, graphs: dict[str, LayerGraph]) -> MemoryBreakdown:
    """Peak memory of one rank of pipeline stage ``stage``; ``layers`` = decoder layers per stage."""
    first_layer = sum(layers[:stage])
    n = layers[stage]
    first, last = stage == 0, stage == par.pp - 1
    sp = stage_params(model, par, first_layer, n, first=first, last=last)
    group = par.hsdp_shard_size or dp * par.cp
    expert_group = expert_data_parallel_size(par.tp, par.cp, dp, par.ep)
    w1, g1, o1 = zero_state_bytes(sp.dense, par.zero_stage, group)
    w2, g2, o2 = zero_state_bytes(sp.expert, par.zero_stage, expert_group)
    per_mb = 0.0
    for i in range(first_layer, first_layer + n):
        per_mb += activation_bytes_per_microbatch(graphs["moe" if model.is_moe_layer(i) else "dense"], model, job,
                                                  par)
    if par.recompute == "full" and n:
        # The layer being recomputed holds its full activations once (one micro-batch, one layer).
        full = par.model_copy(update={"recompute": "none"})
        per_mb_peak = activation_bytes_per_microbatch(graphs["dense"], model, job, full)
    else:
        per_mb_peak = 0.0
    if last:
        per_mb += activation_bytes_per_microbatch(graphs["head"], model, job, par)
    acts = per_mb * inflight_microbatches(stage, par, m) + per_mb_peak
    zero3 = 2 * WEIGHT_BYTES * sp.largest_layer * (1 - 1 / group) if par.zero_stage == 3 else 0.0
    overhead = (CUDA_CONTEXT_GIB + COMM_BUFFER_GIB) * GIB + FRAGMENTATION * acts
    return MemoryBreakdown(w1 + w2, g1 + g2, o1 + o2, acts, zero3, overhead)


@lru_cache(maxsize=256)
def graphs_for(model: ModelSpec, seq_len: int) -> dict[str, LayerGraph]:
    """The layer graphs a model needs, by kind (cached: specs are frozen and hashable)."""
    kinds = ["dense", "head", "embedding"] + (["moe"] if model.is_moe else [])
    return {k: layer_graph(model, k, seq_len) for k in kinds}  # type: ignore[arg-type]
