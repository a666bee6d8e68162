"""What one rank of a Mamba-2 mixer holds under tensor and context parallelism, as megatron-core 0.16.1's
``MambaContextParallel`` splits it (megatron/core/ssm/mamba_context_parallel.py): heads and d_inner split tp·cp ways;
groups split tp ways, then cp ways where the TP shard has at least cp groups, otherwise each group's B and C are
repeated ``cp // groups_tp`` times before the all-to-all (:112-118, 164-183) and every CP rank runs one group.
What that costs: the conv1d + SSD scan's HBM bytes (``ssd_traffic_bytes``, priced by ``op_cost.op_compute``), the
layout copies around it at micro-batch > 1 (``layout_copy_bytes``) and the CP all-to-alls (``cp_all_to_all``, priced
by ``knob_effects.cp_comm``)."""

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
# mamba_ssm's mamba_split_conv1d_scan_combined; Dao & Gu 2024, arXiv:2405.21060 §7). No public measurement of these
# Triton kernels' achieved bandwidth or FLOP rate was found, so the op is priced MEMORY-BOUND by the bytes its kernels
# move (at HBM bandwidth x hbm_bus, as every other memory-bound kernel), or by its tensor-core work (``ssd_flops``) at
# the rate the Triton kernels sustain (``Efficiency.ssd_tflops``), whichever is longer. That rate is taken from the one
# public cross-generation measurement found (state-spaces/mamba#904: a Mamba-2 stack trains 1.51x faster on GB200
# than on H200, while its HBM bandwidth grows 1.67x and its tensor-core peak 2.5x): benchmarks/mamba2_scaling.py
# solves the one rate, the same on both GPUs, that reproduces the ratio (see gpus.yaml). See ssd_traffic_bytes.
BF16, FP32 = 2.0, 4.0


def ssd_traffic_bytes(mb: MambaSpec, t: int, cp: int = 1) -> tuple[float, float]:
    """HBM bytes per token of the rank's sequence shard (forward, backward) of one rank's conv1d + SSD scan at TP
    ``t``, CP ``cp`` (heads split ``t·cp`` ways over the whole sequence = ``1/t`` of them per local token; groups as
    megatron-core runs them, ``local_groups``: ``G/t`` per local token, more where CP repeats them). Kernel by kernel,
    each tensor read once and written once per kernel that takes it (mamba_ssm @ v2.2.6.post3 ssd_combined.py
    MambaSplitConv1dScanCombinedFn :767-930, _mamba_chunk_scan_combined_fwd :294-345 / _bwd :347-465; the same
    kernels at v2.2.4 and v2.3.0). Per token: x and z ``d``, B and C ``bc`` each, dt ``h`` (bf16, views of zxbcdt
    and of the conv output); dt (softplus) and its chunk cumsum fp32 ``h`` each; chunk states ``st`` = heads · head_dim
    · N / chunk; C·Bᵀ ``cb`` = groups · chunk (fp32). The backward's fp32 dB / dC / dCB partials are taken as one
    head split (``nsplits`` = 1: batch · chunks · heads >= SMs · heads / groups; Nano at 8k: 4096 >= 1184); the small
    per-chunk dD and ddA tile partials are not counted."""
    d, h, groups = mb.d_inner / t, mb.num_heads / t, local_groups(mb, t, cp)
    bc = groups * mb.state_dim
    conv = d + 2 * bc
    st = h * mb.head_dim * mb.state_dim / mb.chunk_size
    cb = groups * mb.chunk_size
    conv_fwd = BF16 * 2 * conv  # causal_conv1d_fwd: xBC in, conv output out
    cumsum = BF16 * h + FP32 * 2 * h  # _chunk_cumsum_fwd: dt in; softplus dt, dA_cumsum out
    chunk_state = BF16 * (bc + d) + FP32 * 2 * h + FP32 * st  # _chunk_state_fwd: B, x, dt, dA_cumsum -> states
    bmm = BF16 * 2 * bc + FP32 * cb  # _bmm_chunk_fwd: C, B -> C·Bᵀ
    chunk_scan = FP32 * cb + BF16 * (2 * d + bc + st) + FP32 * 2 * h + BF16 * 2 * d  # CB, x, z, C, states, dt,
    # dA_cumsum in; out and out_x out
    fwd = conv_fwd + cumsum + chunk_state + (FP32 + BF16) * st + bmm + chunk_scan  # _state_passing_fwd: out bf16
    partials = FP32 * 3 * bc  # a fp32 (.., nsplits, groups, N) gradient written, then .sum(2) read and written
    bwd = (conv_fwd + BF16 * 2 * h + cumsum + bmm + chunk_state  # recomputed: conv output, dt.clone(), cumsum, C·Bᵀ
           + FP32 * 2 * st  # _state_passing_fwd (fp32 out)
           + BF16 * 6 * d  # _chunk_scan_bwd_dz: x, z, out_x, dout in; dz, gated dout out
           + BF16 * (bc + d) + FP32 * h + FP32 * st  # _chunk_scan_bwd_dstates: C, dout, dA_cumsum -> dstates
           + FP32 * 2 * st + BF16 * 2 * st  # _state_passing_bwd: states, dstates in (fp32); both out in bf16
           + BF16 * (3 * d + bc + st) + FP32 * (3 * h + cb)  # _chunk_scan_chunk_state_bwd_dx: x, dout, B, CB,
           # dstates, dt, dA_cumsum in; dx, ddt out
           + BF16 * (d + st + bc) + FP32 * 2 * h + partials  # _chunk_state_bwd_db: x, dstates, B, dt, dA -> dB
           + BF16 * (d + st + bc) + FP32 * h + partials  # _chunk_scan_bwd_dC: dout, states, C, dA_cumsum -> dC
           + BF16 * 2 * d + FP32 * 2 * h + FP32 * 3 * cb  # _chunk_scan_bwd_dcb: x, dout, dt, dA -> dCB (+ sum)
           + 2 * (BF16 * 2 * bc + FP32 * (cb + bc))  # two _bmm_chunk_bwd: B / C, dCB, fp32 residual -> dC / dB
           + BF16 * 2 * d + FP32 * (3 * h + cb)  # _chunk_scan_bwd_ddAcs_stable: x, dout, dt, dA, CB -> ddA
           + FP32 * 12 * h  # ddA glue: flip, cumsum, flip, two adds (torch, fp32 per head and token)
           + FP32 * 2 * h + BF16 * 2 * h  # _chunk_cumsum_bwd: ddA, ddt, dt in; ddt out
           + BF16 * 3 * conv)  # causal_conv1d_bwd: xBC, dxBC in; dxBC out
    return fwd, bwd


def ssd_flops(mb: MambaSpec, t: int, cp: int = 1) -> tuple[float, float]:
    """Tensor-core FLOPs per token of the rank's sequence shard (forward, backward) of the chunked SSD scan, kernel by
    kernel as ``ssd_traffic_bytes`` walks them (mamba_ssm @ v2.2.6.post3 ssd_combined.py :294-345 / :347-465), with
    ``d`` = d_inner / t, ``G`` groups (``local_groups``), chunk ``Q``, state ``N``. Forward: ``_bmm_chunk_fwd`` C·Bᵀ
    over the whole chunk square (2·Q·N·G), ``_chunk_state_fwd`` Bᵀ·x (2·d·N), ``_chunk_scan_fwd`` C·states (2·d·N)
    and the intra-chunk CB·x over the causal half it visits (Q·d). Backward: the recomputed C·Bᵀ and chunk states,
    ``_chunk_scan_bwd_dstates`` (2·d·N), ``_chunk_scan_chunk_state_bwd_dx`` (causal CBᵀ·dout, Q·d, and B·dstates,
    2·d·N), ``_chunk_state_bwd_db`` (2·d·N), ``_chunk_scan_bwd_dC`` (2·d·N), ``_chunk_scan_bwd_dcb`` (causal dout·xᵀ,
    Q·d), two ``_bmm_chunk_bwd`` (2·Q·N·G each) and ``_chunk_scan_bwd_ddAcs_stable`` (causal dout·xᵀ again, Q·d):
    6·Q·N·G + 10·d·N + 3·Q·d. The causal kernels visit their diagonal blocks in full: a slight undercount."""
    d, groups, q, n = mb.d_inner / t, local_groups(mb, t, cp), mb.chunk_size, mb.state_dim
    cb, state, intra = 2 * q * n * groups, 2 * d * n, q * d
    return cb + 2 * state + intra, 3 * cb + 5 * state + 3 * intra


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
