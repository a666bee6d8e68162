"""What one rank of a Mamba-2 mixer holds under tensor and context parallelism, as megatron-core 0.16.1's
``MambaContextParallel`` splits it (megatron/core/ssm/mamba_context_parallel.py): heads and d_inner split tp·cp ways;
groups split tp ways, then cp ways where the TP shard has at least cp groups, otherwise each group's B and C are
repeated ``cp // groups_tp`` times before the all-to-all (:112-118, 164-183) and every CP rank runs one group.
What that costs: the conv1d + SSD scan's HBM bytes (``ssd_traffic_bytes``, priced by ``layer_cost.op_compute``), the
layout copies around it at micro-batch > 1 (``layout_copy_bytes``) and the CP all-to-alls (``cp_all_to_all``, priced by ``knob_effects.cp_comm``)."""

from __future__ import annotations

from cost_models.collectives import group_collective_time_s
from cost_models.specs import ClusterSpec, MambaSpec


def cp_group_repeat(mb: MambaSpec, tp: int, cp: int) -> int:
    """``group_repeat_count``: how many times B and C of each TP-local group are repeated before the CP all-to-all
    (mamba_context_parallel.py:112-124; 1 without CP or where the TP shard has at least cp groups)."""
    groups_tp = mb.num_groups // tp
    return cp // groups_tp if cp > 1 and groups_tp < cp else 1


def local_groups(mb: MambaSpec, tp: int, cp: int) -> float:
    """B/C groups per token of a rank's sequence shard (``s/cp`` tokens): the rank runs ``ngroups_local_tpcp`` =
    max(groups_tp / cp, 1) groups over the whole sequence, i.e. ``groups_tp · repeat`` per local token."""
    return mb.num_groups / tp * cp_group_repeat(mb, tp, cp)


def cp_a2a_widths(mb: MambaSpec, tp: int, cp: int) -> tuple[float, float]:
    """Elements per local token that ``pre_conv_ssm`` (z, x, B·repeat, C·repeat, dt: :145-191) and ``post_conv_ssm``
    (the scan's d_inner output, :193-204) pass through their all-to-alls on one TP rank."""
    d = mb.d_inner / tp
    return 2 * d + 2 * local_groups(mb, tp, cp) * mb.state_dim + mb.num_heads / tp, d


# Mamba-2's fused causal conv1d + chunked SSD scan (Megatron-Core's training path, mamba_mixer.py:659-676:
# mamba_ssm's mamba_split_conv1d_scan_combined = causal_conv1d_fwd, then ssd_combined's _chunk_cumsum, _chunk_state,
# _state_passing, _bmm_chunk, _chunk_scan; Dao & Gu 2024, arXiv:2405.21060 §7). No public measurement of these Triton
# kernels' achieved bandwidth or FLOP rate was found, so the op is priced MEMORY-BOUND by the bytes its kernels move
# (at HBM bandwidth x hbm_bus, as every other memory-bound kernel): a lower bound where a kernel is compute- or
# latency-bound. Its tensor-core work (C·Bᵀ, chunk states, intra-chunk outputs: ~2·chunk·G·N + 2·chunk·d_inner +
# 4·d_inner·N FLOPs per token, a few % of the layer's projections) is not timed. See ssd_traffic_bytes.
SSD_BWD_READS = 2.0  # the backward kernels re-read the forward's inputs and states and write their gradients: 2x
# the forward's bytes, plus the conv output the memory-efficient path recomputes (ssd_combined.py backward)


def ssd_traffic_bytes(mb: MambaSpec, t: int, cp: int = 1) -> tuple[float, float]:
    """HBM bytes per token of the rank's sequence shard (forward, backward) of one rank's conv1d + SSD scan at TP
    ``t``, CP ``cp`` (heads split ``t·cp`` ways over the whole sequence = ``1/t`` of them per local token; groups as
    megatron-core runs them, ``local_groups``: ``G/t`` per local token, more where CP repeats them): read z,
    xBC, dt (bf16); the conv writes xBC and the scan reads it back; per chunk of ``chunk_size`` tokens the fp32 chunk
    states (heads · head_dim · N) are written, passed (read + written) and read, and the fp32 C·Bᵀ (G · chunk²)
    written and read; out_x and the gated y written (bf16)."""
    d, heads, groups = mb.d_inner / t, mb.num_heads / t, local_groups(mb, t, cp)
    conv = d + 2 * groups * mb.state_dim
    states = heads * mb.head_dim * mb.state_dim / mb.chunk_size
    cb = groups * mb.chunk_size
    fwd = 2.0 * (d + conv + heads) + 2.0 * 2 * conv + 4.0 * 4 * states + 4.0 * 2 * cb + 2.0 * 2 * d
    return fwd, SSD_BWD_READS * fwd + 2.0 * 2 * conv


def layout_copy_bytes(mb: MambaSpec, t: int, cp: int, batch: int) -> tuple[float, float]:
    """HBM bytes per local token (forward, backward) of the layout copies around the scan at micro-batch ``batch``:
    ``MambaMixer._ssm_training`` makes ``zxBCdt`` batch-major and the scan's output sequence-major again with
    ``rearrange(...).contiguous()`` (megatron-core 0.16.1 mamba_mixer.py:642, 678), and in backward in_proj's
    Transformer Engine module makes the permuted ``dzxbcdt`` contiguous (module/base.py ``grad_output_preprocess``:
    ``grad_output.reshape((-1, h)).contiguous()``). Each reads and writes its bf16 tensor. With one sequence per
    micro-batch the permuted views are already contiguous (torch ignores size-1 strides): no copy."""
    if batch == 1:
        return 0.0, 0.0
    zx, y = cp_a2a_widths(mb, t, cp)  # the scan's input (B, C repeated under CP) and its d_inner output
    return 2.0 * 2 * (zx + y), 2.0 * 2 * zx


def cp_all_to_all(mb: MambaSpec, cluster: ClusterSpec, tokens: float, tp: int, group: int,
                  stride: int) -> tuple[float, float]:
    """(seconds, bytes each rank sends) of the Mamba-2 mixer's context parallelism (megatron-core
    mamba_context_parallel.py ``pre_conv_ssm`` / ``post_conv_ssm``: the in_proj output re-split from sequence to heads
    before the conv1d + scan, B and C repeated where the TP shard has fewer groups than cp, its d_inner output back:
    ``cp_a2a_widths``; forward and backward), on the critical path (the scan needs the whole sequence of its
    heads)."""
    payload = tokens * sum(cp_a2a_widths(mb, tp, group)) * 2.0
    seconds = 2 * group_collective_time_s("all_to_all", payload, group, stride, cluster)
    return seconds, 2 * payload * (group - 1) / group
