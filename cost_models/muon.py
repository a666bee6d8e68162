"""Muon in Megatron-Core 0.16.1 (Megatron-LM ``--optimizer muon|dist_muon``): which parameters it takes, the state
it holds, the Newton-Schulz GEMMs it runs and the all-gather of the layer-wise distributed optimizer.

Sources (``MUON`` = megatron-core 0.16.1 megatron/core/optimizer/muon.py, ``LWO`` = .../layer_wise_optimizer.py,
``EO`` = Emerging-Optimizers v0.1.0 (d5363b4a, what Megatron-LM core_v0.16.1 pins: pyproject.toml:184)
emerging_optimizers/orthogonalized_optimizers/, ``MLM`` = Megatron-LM megatron/training/arguments.py):

- Which parameters: every 2-D parameter that is not the embedding or the output layer goes to Muon
  (MUON:251-258); the rest (embeddings, output layer, norms, biases, Mamba's conv1d / A_log / D / dt_bias) to Adam
  (MUON:321-333, ``get_megatron_optimizer``). Megatron holds weights as (out, in) matrices: the fused
  ``linear_qkv`` is split into its Q, K and V blocks before the iteration (``--muon-split-qkv`` default on,
  MLM:1840-1842, MUON:136-159); a gated MLP's ``linear_fc1`` (gate and up) and MLA's ``linear_kv_up_proj`` (K and V)
  are one matrix each; every routed expert is its own matrix (TE GroupedLinear ``weight{i}``); the router's gate
  (experts x h) is one matrix.
- State per parameter: ``Float16OptimizerWithFloat16Params`` keeps an fp32 master copy (4 B) of each bf16 weight
  (MUON:300-303, LWO:68-81), Muon a ``momentum_buffer`` like the master (4 B, MUON:208-212; EO
  orthogonalized_optimizer.py:151-152), Adam fp32 ``exp_avg`` and ``exp_avg_sq`` (MUON:214-220): 8 B for a Muon
  parameter, 12 B for an Adam one. Main gradients stay in DDP's fp32 buffer, whole on every rank: Muon refuses the
  distributed optimizer (MLM:1184, MUON:192-193). ``dist_muon`` (LWO:92-144) hands whole parameters to the ranks of
  the dp x cp group (experts: the expert-data-parallel group) in a ping-pong over the parameters sorted by size, and
  builds master copies and state for its own ones only (LWO:66-81): the optimizer state is divided, the gradient
  buffer and the bf16 weights are not.
- Newton-Schulz (EO muon_utils.py:67-161, 229-256): on the shorter side ``s`` of an ``s x l`` matrix (transposed
  if needed, :115-118), each of ``--muon-num-ns-steps`` (5, MLM:1851) steps runs ``A = X Xᵀ`` (s·l·s),
  ``B = b·A + c·A·A`` (s·s·s) and ``X = a·X + B·X`` (s·s·l): ``4·s²·l + 2·s³`` FLOP, in bf16 at the default
  ``--muon-fp32-matmul-prec medium`` (:140-147). ``--muon-tp-mode`` (knob ``muon_tp_mode``, MLM:1853): blockwise (the
  default) runs it on each TP rank's own shard with no communication (MUON:131, EO muon_utils.py:199-201); duplicated
  and distributed gather or all-reduce over TP (``matrix_step_s``). Without the layer-wise optimizer every DP rank
  orthogonalizes all of its matrices; with it, only those it owns.
- Communication (``estimate.data_parallel_cost``): DDP all-reduces the gradients after the backward (no
  ``--overlap-grad-reduce``, MLM:1181: exposed in full); ``dist_muon`` then all-gathers the updated bf16 parameters
  over the same groups (LWO:146-182, 221-229), in the optimizer step (exposed too).
- The step (``optimizer_step_s``): the element-wise passes over the state a rank holds, at HBM speed, and the
  Newton-Schulz GEMMs of its matrices through ``gemm.matmul_time_s``; under ``dist_muon`` the rank with the most
  Newton-Schulz time in the deal (``ping_pong_max``) sets it.

Not priced: the fp32 <-> bf16 casts around the iteration
and its workspace, Nesterov's extra lerp. (MLA's projections are not split: MUON:248-250 flags ``linear_qkv`` only.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from cost_models.collectives import group_collective_time_s
from cost_models.gemm import hbm_time_s, matmul_time_s
from cost_models.specs import ClusterSpec, ModelSpec, ParallelConfig

if TYPE_CHECKING:
    from cost_models.targets.common import Runtime

MUON_NS_STEPS = 5  # --muon-num-ns-steps default (MLM:1851)
MUON_TP_MODE = "blockwise"  # --muon-tp-mode default (MLM:1853)
MUON_STATE_BYTES = 8.0  # fp32 master + fp32 momentum_buffer per Muon parameter (module doc)
ADAM_STATE_BYTES = 12.0  # fp32 master + exp_avg + exp_avg_sq per Adam parameter (module doc)


@dataclass(frozen=True)
class Matrix:
    """One Muon parameter of a layer as Megatron holds it: ``rows x cols`` (out, in), ``count`` alike, the
    dimension TP splits (0 column-parallel, 1 row-parallel, None duplicated / expert), routed expert or not."""

    name: str
    rows: int
    cols: int
    count: int = 1
    tp_dim: int | None = 0
    expert: bool = False
    tp_limit: int = 0  # K/V of GQA: split over at most num_kv_heads ranks (0: no limit)

    def ranks(self, tp: int) -> int:
        """The TP ranks the matrix is split over (``tp_limit`` bounds GQA's K/V)."""
        return min(tp, self.tp_limit) if self.tp_limit else tp

    def local(self, tp: int) -> tuple[int, int]:
        """The shard one TP rank orthogonalizes under ``blockwise`` (MUON:131)."""
        t = self.ranks(tp)
        if self.tp_dim == 0:
            return max(1, self.rows // t), self.cols
        if self.tp_dim == 1:
            return self.rows, max(1, self.cols // t)
        return self.rows, self.cols


def _mlp(prefix: str, model: ModelSpec, width: int, h: int, *, count: int = 1, expert: bool = False) -> list[Matrix]:
    fc1 = (2 if model.gated_mlp else 1) * width  # gate and up fused in linear_fc1
    tp0, tp1 = (None, None) if expert else (0, 1)  # routed experts: expert-TP 1 (autoplan emits it)
    return [Matrix(f"{prefix}linear_fc1", fc1, h, count, tp0, expert),
            Matrix(f"{prefix}linear_fc2", h, width, count, tp1, expert)]


def _attention(model: ModelSpec) -> list[Matrix]:
    h, a = model.hidden_size, model.num_attention_heads
    if model.mla is None:
        return [Matrix("linear_q", model.q_dim, h), Matrix("linear_k", model.kv_dim, h, tp_limit=model.num_kv_heads),
                Matrix("linear_v", model.kv_dim, h, tp_limit=model.num_kv_heads),
                Matrix("linear_proj", h, model.q_dim, tp_dim=1)]
    m = model.mla
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    out = [Matrix("linear_q_down_proj", m.q_lora_rank, h, tp_dim=None),  # 'duplicated' (multi_latent_attention.py:409)
           Matrix("linear_q_up_proj", a * qk, m.q_lora_rank)] if m.q_lora_rank else [Matrix("linear_q_proj", a * qk, h)]
    return out + [Matrix("linear_kv_down_proj", m.kv_lora_rank + m.qk_rope_head_dim, h, tp_dim=None),  # :454
                  Matrix("linear_kv_up_proj", a * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
                  Matrix("linear_proj", h, a * m.v_head_dim, tp_dim=1)]


def _moe(model: ModelSpec) -> list[Matrix]:
    h, e = model.hidden_size, model.num_experts
    w_in, lat = model.expert_input_size, model.moe_latent_size
    out = [Matrix("router", e, h, tp_dim=None)]
    if lat:
        out += [Matrix("fc1_latent_proj", lat, h, tp_dim=None), Matrix("fc2_latent_proj", h, lat, tp_dim=None)]
    out += _mlp("experts.", model, model.expert_ffn_hidden_size, w_in, count=e, expert=True)
    if model.num_shared_experts:
        out += _mlp("shared_experts.", model, model.expert_ffn_hidden_size * model.num_shared_experts, h)
    return out


def layer_matrices(model: ModelSpec, layer: int, symbol: str | None = None) -> list[Matrix]:
    """The Muon parameters of decoder layer ``layer`` (module doc: which and in what shape); ``symbol``: a hybrid
    layer of that symbol instead (an MTP block's, ``ArchSpec.mtp_pattern``)."""
    h = model.hidden_size
    if model.hybrid_pattern is not None:
        sym = symbol or model.hybrid_pattern[layer]
        if sym == "M":
            mb = model.mamba
            assert mb is not None
            return [Matrix("in_proj", mb.in_proj_width, h), Matrix("out_proj", h, mb.d_inner, tp_dim=1)]
        if sym == "*":
            return _attention(model)
        if sym == "-":
            return _mlp("", model, model.ffn_hidden_size, h)
        return _moe(model)
    mlp = _moe(model) if model.is_moe_layer(layer) else _mlp("", model, model.ffn_hidden_size, h)
    if model.layer_is_gdn(layer):  # GatedDeltaNet's two linears (its conv1d weight is 3-D: Adam)
        g = model.gdn
        assert g is not None
        return [Matrix("in_proj", g.in_proj_width, h), Matrix("out_proj", h, g.value_dim, tp_dim=1)] + mlp
    return _attention(model) + mlp


def _mtp_block(model: ModelSpec) -> list[str | None]:
    """One MTP module's block layers as ``layer_matrices`` symbols: a hybrid ``mtp_pattern``'s, else the last layer."""
    return list(model.arch.mtp_pattern) if model.arch.mtp_pattern is not None else [None]


def mtp_matrices(model: ModelSpec) -> list[Matrix]:
    """The Muon parameters of the MTP modules (multi_token_prediction.py:410-440): each its block (a decoder layer
    like the last, or a hybrid ``mtp_pattern``) and ``eh_proj`` (h x 2h, column-parallel); their norms are Adam's;
    ``ModelSpec.mtp_weight_copies`` modules hold weights."""
    h, last = model.hidden_size, model.num_layers - 1
    one = [mx for sym in _mtp_block(model) for mx in layer_matrices(model, last, sym)] + [Matrix("eh_proj", h, 2 * h)]
    return one * model.mtp_weight_copies


def _stage_matrices(model: ModelSpec, layer_ids: Sequence[int], mtp: bool) -> list[Matrix]:
    out = [mx for i in layer_ids for mx in layer_matrices(model, i)]
    return out + (mtp_matrices(model) if mtp else [])


def stage_muon_params(model: ModelSpec, par: ParallelConfig, layer_ids: Sequence[int],
                      mtp: bool = False) -> tuple[float, float]:
    """(dense, expert) Muon parameters one rank of a stage holds (``mtp``: with the MTP modules), split as
    ``memory.stage_params`` splits them (dense matrices ÷ tp but the latent projections, experts ÷ ep), so that the
    rest of its count is Adam's."""
    dense = expert = 0.0
    for mx in _stage_matrices(model, layer_ids, mtp):
        n = mx.rows * mx.cols * mx.count
        if mx.expert:
            expert += n / par.ep
        else:
            dense += n if mx.name.endswith("latent_proj") else n / par.tp
    return dense, expert


def optimizer_state_bytes(model: ModelSpec, par: ParallelConfig, layer_ids: Sequence[int], dense: float,
                          expert: float, optimizer: str, group: int, expert_group: int,
                          mtp: bool = False) -> tuple[float, float]:
    """(dense, expert) optimizer-state bytes of a rank holding ``dense`` / ``expert`` parameters, of which
    ``stage_muon_params`` are Muon's (8 B) and the rest Adam's (12 B); ``dist_muon`` divides them over the DP
    group and the expert-data-parallel group (LWO:92-144; the ping-pong spreads whole parameters, priced even)."""
    md, me = stage_muon_params(model, par, layer_ids, mtp)
    od = MUON_STATE_BYTES * md + ADAM_STATE_BYTES * max(0.0, dense - md)
    oe = MUON_STATE_BYTES * me + ADAM_STATE_BYTES * max(0.0, expert - me)
    if optimizer == "dist_muon":
        return od / max(1, group), oe / max(1, expert_group)
    return od, oe


def ns_flops(rows: int, cols: int, steps: int = MUON_NS_STEPS) -> float:
    """FLOPs of Newton-Schulz on one ``rows x cols`` matrix: ``steps · (4·s²·l + 2·s³)`` (module doc)."""
    s, l = min(rows, cols), max(rows, cols)
    return steps * (4.0 * s * s * l + 2.0 * s**3)


@lru_cache(maxsize=4096)
def ns_time_s(rows: int, cols: int, cluster: ClusterSpec, steps: int = MUON_NS_STEPS) -> float:
    """Seconds of the Newton-Schulz GEMMs on one matrix (bf16, EO muon_utils.py:140-147, 251-255)."""
    s, l = min(rows, cols), max(rows, cols)
    return steps * (matmul_time_s(s, l, s, cluster) + matmul_time_s(s, s, s, cluster) + matmul_time_s(s, s, l, cluster))


@lru_cache(maxsize=4096)
def matrix_step_s(mx: Matrix, tp: int, mode: str, cluster: ClusterSpec) -> float:
    """Seconds one TP rank spends orthogonalizing one instance of ``mx`` under ``--muon-tp-mode`` ``mode`` (MUON:78-88,
    131; EO muon_utils.py:164-226). blockwise: Newton-Schulz on its own shard. duplicated: the fp32 momentum shards
    all-gathered over TP (:208-211), then the whole matrix on every rank. distributed: on the shard, transposed iff it
    is split by rows (:216-222), so ``X`` is ``n x k`` with ``n`` the unsplit side; each step's ``X Xᵀ`` (n x n, bf16)
    is all-reduced over TP (:251-253) and ``A·A`` runs whole on every rank. TP ranks are adjacent (stride 1)."""
    r, c = mx.local(tp)
    t = mx.ranks(tp)
    if mode == "blockwise" or mx.tp_dim is None or t <= 1:
        return ns_time_s(r, c, cluster)
    rows, cols = (r * t, c) if mx.tp_dim == 0 else (r, c * t)
    if mode == "duplicated":
        return group_collective_time_s("all_gather", 4.0 * rows * cols, t, 1, cluster) + ns_time_s(rows, cols, cluster)
    n, k = (c, r) if mx.tp_dim == 0 else (r, c)
    step = (matmul_time_s(n, k, n, cluster) + matmul_time_s(n, n, n, cluster) + matmul_time_s(n, n, k, cluster)
            + group_collective_time_s("all_reduce", 2.0 * n * n, t, 1, cluster))
    return MUON_NS_STEPS * step


def ping_pong_max(sizes: Sequence[tuple[float, float]], ranks: int) -> float:
    """The largest per-rank sum of costs when LWO:104-136 deals ``(numel, cost)`` items, sorted by numel (a stable
    sort), to ``ranks`` ranks in the order 0..r-1, r-1..0, 0..r-1, ..."""
    if ranks <= 1:
        return sum(c for _, c in sizes)
    loop = list(range(ranks)) + list(range(ranks))[::-1]
    load = [0.0] * ranks
    for i, (_, cost) in enumerate(sorted(sizes, key=lambda x: x[0])):
        load[loop[i % len(loop)]] += cost
    return max(load)


def adam_tensors(model: ModelSpec, layer: int, symbol: str | None = None) -> int:
    """Adam's parameter tensors in decoder layer ``layer`` (they take places in the layer-wise deal): its norms
    (weight, + bias for LayerNorm), MLA's q / kv latent norms, Qwen3's q / k norms, the linears' biases, the router's
    expert bias, a Mamba mixer's conv1d weight and bias, dt_bias, A_log, D and gated norm."""
    per_norm = 2 if model.norm == "layernorm" else 1
    mats = layer_matrices(model, layer, symbol)
    n = per_norm * (1 if model.hybrid_pattern is not None else 2)
    if model.hybrid_pattern is not None and (symbol or model.hybrid_pattern[layer]) == "M":
        mb = model.mamba
        return n + 5 + (1 if mb is not None and mb.conv_bias else 0)
    if symbol is None and model.layer_is_gdn(layer):
        n += 4  # GatedDeltaNet's conv1d weight, dt_bias, A_log, gated norm (no biases: gated_delta_net.py:146-215)
    if any(m.name.startswith("linear_q") for m in mats):  # an attention mixer
        if model.mla is not None:
            n += 2 if model.mla.q_lora_rank else 1
        elif model.arch.qk_norm:
            n += 2
    if model.linear_bias:
        n += sum(m.count for m in mats)
    elif model.qkv_bias:
        n += sum(1 for m in mats if m.name in ("linear_q", "linear_k", "linear_v"))
    if any(m.name == "router" for m in mats) and model.arch.router.expert_bias:
        n += 1
    return n


def newton_schulz_s(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig, layer_ids: Sequence[int],
                    optimizer: str, dense_adam: int, expert_adam: int, group: int, expert_group: int,
                    mtp: bool = False, tp_mode: str = MUON_TP_MODE) -> float:
    """Newton-Schulz seconds per step of one rank of a stage holding ``layer_ids``: every local matrix (muon), or
    the ones the layer-wise optimizer deals it (dist_muon: ``ping_pong_max`` over the dense and the expert
    parameters, ``dense_adam`` / ``expert_adam`` Adam parameters taking their places in the deal as 1-element
    items ahead of the matrices: norms and biases are the smallest)."""
    dense: list[tuple[float, float]] = []
    expert: list[tuple[float, float]] = []
    for mx in _stage_matrices(model, layer_ids, mtp):
        r, c = mx.local(par.tp)
        item = (float(r * c), matrix_step_s(mx, par.tp, tp_mode, cluster))
        (expert if mx.expert else dense).extend([item] * (mx.count // (par.ep if mx.expert else 1)))
    if optimizer != "dist_muon":
        return sum(c for _, c in dense) + sum(c for _, c in expert)
    return (ping_pong_max([(0.0, 0.0)] * dense_adam + dense, group)
            + ping_pong_max([(0.0, 0.0)] * expert_adam + expert, expert_group))


def optimizer_step_s(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig, layer_ids: Sequence[int],
                     dense: float, expert: float, rt: "Runtime", group: int, expert_group: int,
                     mtp: bool = False) -> float:
    """One rank's optimizer step under Muon: the element-wise passes over the state it holds (as
    ``Runtime.adam_bytes_per_param`` counts Adam's: read and write the state, read the gradient, write the bf16
    weight; a Muon parameter's state is its 8 B) at HBM speed, plus its Newton-Schulz GEMMs."""
    md, me = stage_muon_params(model, par, layer_ids, mtp)
    muon_b = 2 * MUON_STATE_BYTES + rt.grad_bytes + rt.weight_bytes
    dist = rt.optimizer == "dist_muon"
    traffic = 0.0
    for total, muon, g in ((dense, md, group), (expert, me, expert_group)):
        share = 1.0 / max(1, g) if dist else 1.0
        traffic += share * (muon_b * muon + rt.adam_bytes_per_param * max(0.0, total - muon))
    adam_dense = sum(adam_tensors(model, i) for i in layer_ids)
    if mtp:  # each module's layer, + enorm, hnorm and its final norm
        adam_dense += model.mtp_weight_copies * (sum(adam_tensors(model, model.num_layers - 1, sym)
                                                     for sym in _mtp_block(model)) + 3)
    return hbm_time_s(traffic, cluster) + newton_schulz_s(model, cluster, par, layer_ids, rt.optimizer, adam_dense,
                                                          0, group, expert_group, mtp, rt.muon_tp_mode)
