"""DeepSeek sparse attention (``ModelSpec.dsa``) as the framework runs it: the lightning indexer's scores, the indexer
loss's dense attention scores, and the sparse MLA core (``opgraph._dsa_indexer`` builds the ops).

Two implementations exist in Megatron-Core:

- **unfused** (the only one of megatron-core 0.16.1; ``dsa_kernel_backend='none'``, the default, later):
  ``DSAIndexer._compute_index_scores`` (experimental_attention_variant/dsa.py:474-516) materializes the
  ``[s, b, H_I, s]`` scores in fp32 (``einsum`` on ``q.float()``, ``k.float()``) over *every* key, masking after;
  ReLU, the head weights and the head sum are separate passes over that tensor, and the ReLU output stays saved
  for the backward (the indexer's weights train through the KL loss). ``unfused_dsa_fn`` (dsa.py:638-688) is the core:
  fp32 ``bmm`` scores over all ``s`` keys per local head, the top-k mask added, an fp32 softmax (saved) and its bf16
  copy times V (saved by the second ``bmm``): dense attention through HBM, not a sparse kernel.
  ``compute_dsa_indexer_loss`` (dsa.py:161-252) recomputes the dense fp32 scores of every local head (query and key
  detached: no backward), softmaxes them, sums the heads, all-reduces ``[b, s, s]`` fp32 over TP (dsa.py:232-234),
  and takes the KL to the softmaxed index scores, whose softmax output and ``log`` input are saved.
- **fused** (cuDNN / TileLang kernels, ``dsa_kernel_backend`` from core_v0.19.0:
  experimental_attention_variant/dsa_cudnn_kernels.py, transformer_config.py:326 @ core_v0.19.0): the indexer over
  the causal keys only, the MLA core over each query's top-k keys (FlashMLA-style sparse attention), and the loss's
  dense distribution recomputed from the core's log-sum-exp (``dense_attn_score_recompute_wrapper``).

FLOPs per token (``opgraph``): indexer ``2·H_I·D_I`` per key, loss ``2·a·d_qk`` per key, over the causal keys; the
core ``2·a·(d_qk + d_v)`` per key over ``min(top-k, causal)`` keys (``opgraph.mean_keys_per_query``). Unfused, the
indexer and the loss compute every key (``s``: twice the causal FLOPs) and the core is Megatron's unfused attention
(``attention_cost.unfused_attention_s``, all ``s × s`` scores). MFU's model FLOPs count the indexer and the loss at
the design's causal keys (``op_cost.model_flops_per_token``).

DSAttention's TP collectives beyond the MLA's linears (the indexer's sequence-parallel gathers of its inputs,
dsa.py:557-559, and the loss's fp32 all-reduce, dsa.py:231-234; the cuDNN path's own at core_v0.19.0):
``tp_comm.dsa_tp_collectives``, priced with the layer's TP communication (``layer_cost``) and by the search's
intra-op strategies, which price DSA as the layout's runtime runs it (``dsa_path_runtime``, ``op_runtime``).
"""

from __future__ import annotations

from functools import lru_cache

from cost_models.gemm import matmul_time_s
from cost_models.opgraph import LayerGraph, Op, keys_per_query
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import Runtime

# The fused kernels (dsa_cudnn_kernels.py, dsa_tilelang_kernels.py) are first tagged core_v0.19.0 (Megatron-LM commits
# d1cab16a01 "Wiring cuDNN fused DSA kernels support with THD, CP and IndexShare (GLM5.2)" and 4f657171b1 "Add TileLang
# fused DSA kernels"), and even there run only under --dsa-kernel-backend cudnn / tilelang (default 'none': the
# unfused path, transformer_config.py:326 @ core_v0.19.0): the megatron target's ``dsa_kernel_backend`` knob
# (cudnn from megatron_core 0.19.0: ``targets.megatron.dsa_backend_error``).

# HBM bytes per element of the unfused indexer's fp32 [s, b, H_I, s] scores (dsa.py:499-511), forward: the einsum
# writes them (4), ReLU reads and writes (8), the head weighting reads and writes (8), the head sum reads (4);
# backward: the sum's expand writes (4), the weighting's backward reads the gradient and the ReLU output and writes
# its gradient, reading both again for the weights' gradient (4 + 4 + 4 + 8), ReLU's backward reads the gradient
# and its output and writes (12), the einsum's two backward GEMMs read the gradient (8).
INDEXER_SCORE_BYTES = (24.0, 44.0)
# HBM bytes per element of the unfused loss's fp32 [b, a/t, s, s] head scores (dsa.py:202-231): the bmm writes (4),
# the causal-mask add reads and writes (8), the softmax reads and writes (8), the head sum reads (4).
LOSS_HEAD_BYTES = 24.0
# ... and per element of its [b, s, s] fp32 tensors (dsa.py:207-247): the causal and index masks built (8), added to
# the index scores (8), the index softmax (8), the L1 normalization (12), the two logs (16), the KL product and sum
# (12); backward: the KL's and the softmax's backward over the index scores (24).
LOSS_ROW_BYTES = (64.0, 24.0)


def dsa_fused(rt: Runtime | None) -> bool:
    """Whether the run's DSA is the fused kernels' (the reference pricing, ``rt`` None or a target whose runtime is
    not Megatron's; megatron with ``dsa_kernel_backend`` cudnn) or Megatron-Core's unfused path (megatron's default)."""
    return rt is None or rt.target != "megatron" or rt.dsa_kernel_backend != "none"


def dsa_op(op: Op, model: ModelSpec) -> bool:
    """Whether ``op``'s price depends on the DSA path (``dsa_fused``): the indexer ops and a DSA model's core."""
    return model.dsa is not None and op.kind in ("indexer", "attention")


# The indexer's own linears and key norm (``opgraph._dsa_indexer``): DSAIndexer gathers their inputs x and qr under
# sequence parallelism (megatron-core 0.16.1 dsa.py:557-559; core_v0.19.0 :1273-1275, for either kernel backend) and
# runs them on the whole sequence of every TP rank ('duplicated' linears: ``op_cost`` prices them whole).
INDEXER_INPUT_OPS = frozenset({"idx_q_proj", "idx_k_proj", "idx_k_norm", "idx_weights_proj"})


def indexer_gathered(graph: LayerGraph, tensor: str) -> bool:
    """Whether ``tensor`` is one of the indexer's own inputs to its scores (an ``INDEXER_INPUT_OPS`` output): whole on
    every TP rank whatever layout the sequence-parallel region around it has; the gathers that make it whole are
    ``tp_comm.dsa_tp_collectives``' (of x and qr), so no resharding of it is priced (search/intra_op.py)."""
    return any(op.output == tensor and op.name in INDEXER_INPUT_OPS for op in graph.ops)


def op_runtime(op: Op, model: ModelSpec, rt: Runtime | None) -> Runtime | None:
    """The runtime ``op`` is priced with by per-op pricing whose other ops take the reference (None): ``rt`` for a DSA
    op (``dsa_op``) on the unfused path, else None (the reference prices the fused design: ``dsa_fused``)."""
    return rt if dsa_op(op, model) and not dsa_fused(rt) else None


@lru_cache(maxsize=None)
def dsa_path_runtime(target: str, dsa_kernel_backend: str = "none") -> Runtime:
    """A runtime saying only how ``target`` runs DSA (the target and ``dsa_kernel_backend``, every other field its
    default): what per-op pricing that prices every other op at the reference (``rt`` None) hands DSA's own pricing
    (``op_runtime``: ``indexer_op_s`` and the unfused core in ``op_cost.op_compute``; ``tp_comm.dsa_tp_collectives``;
    ``memory.dsa_unfused_op_bytes``), all of which read only its target and backend. The search's intra-op
    strategies price a layer with it, and ``layer_cost.dsa_path_s`` prices what it adds to the reference."""
    return Runtime(target=target, dsa_kernel_backend=dsa_kernel_backend)


def indexer_op_s(op: Op, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                 rt: Runtime | None) -> tuple[float, float, float, float]:
    """(forward GEMM s, backward GEMM s, forward HBM bytes, backward HBM bytes) of one ``indexer`` op for one
    micro-batch on one rank. ``idx_scores`` runs whole on every TP rank (duplicated, dsa.py:557-559): ``tokens·H_I``
    query rows against ``D_I``-wide keys, one key column per key the kernel computes; backward its two gradient
    GEMMs. ``idx_loss``: the local heads' ``Q·Kᵀ`` (``a/t`` heads), forward only."""
    d, mla = model.dsa, model.mla
    assert d is not None and mla is not None
    s = job.seq_len
    tokens = par.micro_batch_size * s / par.cp
    fused = dsa_fused(rt)
    causal_keys = op.flops_per_token / _flops_per_key(op, model)  # s/2, times a shared layer kind's indexer share
    keys = causal_keys if fused else causal_keys * s / keys_per_query(s, None, True)  # unfused: every key, masked
    if op.name == "idx_scores":
        rows = tokens * d.index_heads
        fwd = matmul_time_s(rows, d.index_head_dim, keys, cluster)
        elems = 0.0 if fused else rows * keys
        return fwd, 2.0 * fwd, INDEXER_SCORE_BYTES[0] * elems, INDEXER_SCORE_BYTES[1] * elems
    heads = model.num_attention_heads / par.tp
    d_qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    fwd = matmul_time_s(tokens * heads, d_qk, keys, cluster)
    if fused:
        return fwd, 0.0, 0.0, 0.0
    return (fwd, 0.0, LOSS_HEAD_BYTES * tokens * heads * keys + LOSS_ROW_BYTES[0] * tokens * keys,
            LOSS_ROW_BYTES[1] * tokens * keys)


def _flops_per_key(op: Op, model: ModelSpec) -> float:
    d, mla = model.dsa, model.mla
    assert d is not None and mla is not None
    if op.name == "idx_scores":
        return 2.0 * d.index_heads * d.index_head_dim
    return 2.0 * model.num_attention_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)


def unfused_saved_bytes(op: Op, graph: LayerGraph, model: ModelSpec, job: JobSpec, par: ParallelConfig) -> float:
    """What the unfused path saves for backward beyond the graph's own tensors, one micro-batch on one rank: the
    indexer's fp32 ReLU output ``[s, b, H_I, s]`` (saved by the head weighting, dsa.py:502-507; whole on every TP
    rank); the loss's softmaxed index scores and the ``log`` input, ``[b, s, s]`` fp32 each (dsa.py:227, 242); the
    core's fp32 softmax ``[b, a/t, s, s]`` and its bf16 copy (dsa.py:673-683) and the fp32 copies of Q and K its first
    ``bmm`` saves (dsa.py:654)."""
    d, mla = model.dsa, model.mla
    if d is None or mla is None:
        return 0.0
    s = job.seq_len
    tokens = par.micro_batch_size * s / par.cp
    share = op.flops_per_token / (_flops_per_key(op, model) * s / 2) if op.kind == "indexer" else 1.0
    if op.name == "idx_scores":
        return 4.0 * d.index_heads * s * tokens * share
    if op.name == "idx_loss":
        return 8.0 * s * tokens * share
    if op.kind == "attention":
        heads = model.num_attention_heads / par.tp
        d_qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        return (6.0 * s + 8.0 * d_qk) * heads * tokens
    return 0.0
