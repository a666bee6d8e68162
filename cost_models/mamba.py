"""What one rank of a Mamba-2 mixer holds under tensor and context parallelism, as megatron-core 0.16.1's
``MambaContextParallel`` splits it (megatron/core/ssm/mamba_context_parallel.py): heads and d_inner split tp·cp ways;
groups split tp ways, then cp ways where the TP shard has at least cp groups, otherwise each group's B and C are
repeated ``cp // groups_tp`` times before the all-to-all (:112-118, 164-183) and every CP rank runs one group."""

from __future__ import annotations

from cost_models.specs import MambaSpec


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
