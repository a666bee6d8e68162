"""Rank layout: which global ranks form each parallel group (pure functions, no torch).

Megatron-LM lays ranks out in the order ``tp-cp-ep-dp-pp``: the first axis varies fastest, so
consecutive ranks form a TP group (inside one node, over NVLink) and PP is the slowest axis (across
nodes). With ranks numbered ``r = i_0 + s_0 * (i_1 + s_1 * (i_2 + ...))`` for axis sizes ``s_k`` and
indices ``i_k`` in that order, a group "along" a set of axes holds the ranks that differ only in
those axes' indices.

Dense layers use the order with ``ep = 1`` (groups ``tp``, ``cp``, ``dp``, ``pp``, ``tp-pp``, ...);
expert layers re-cut the same ranks as ``etp-ep-edp-pp`` with ``edp = tp*cp*dp / (etp*ep)``.

Worked example (8 ranks, tp=2, cp=1, dp=2, pp=2, order ``tp-cp-ep-dp-pp``)::

    rank   0 1 2 3 4 5 6 7
    tp idx 0 1 0 1 0 1 0 1
    dp idx 0 0 1 1 0 0 1 1
    pp idx 0 0 0 0 1 1 1 1

    >>> rank_groups({"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 2}, "tp")
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    >>> rank_groups({"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 2}, "dp")
    [[0, 2], [1, 3], [4, 6], [5, 7]]
    >>> rank_groups({"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 2}, "pp")
    [[0, 4], [1, 5], [2, 6], [3, 7]]
    >>> rank_groups({"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 2}, "tp-dp")
    [[0, 1, 2, 3], [4, 5, 6, 7]]

Groups are listed in the order Megatron's ``RankGenerator.get_ranks`` lists them: group ``j``
enumerates the *other* axes' indices with the first of them fastest, and inside a group the selected
axes' indices run with the first selected axis fastest.
"""

from __future__ import annotations

from math import prod

DEFAULT_ORDER = "tp-cp-ep-dp-pp"


def _digits(index: int, shape: list[int]) -> list[int]:
    """Mixed-radix digits of ``index`` with the first dimension fastest: 5 in (2, 3) -> [1, 2]."""
    out = []
    for s in shape:
        out.append(index % s)
        index //= s
    return out


def rank_groups(sizes: dict[str, int], token: str, order: str = DEFAULT_ORDER) -> list[list[int]]:
    """The rank groups along the axes named in ``token`` (e.g. ``"tp"``, ``"tp-pp"``).

    ``sizes`` maps every axis in ``order`` to its degree; their product is the world size."""
    axes = order.split("-")
    missing = [a for a in axes if a not in sizes]
    if missing:
        raise ValueError(f"sizes lack axes {missing} of order '{order}'")
    wanted = token.split("-")
    unknown = [t for t in wanted if t not in axes]
    if unknown:
        raise ValueError(f"axes {unknown} of '{token}' are not in order '{order}'")
    shape = [int(sizes[a]) for a in axes]
    stride = [prod(shape[:k]) for k in range(len(shape))]
    sel = [k for k, a in enumerate(axes) if a in wanted]
    rest = [k for k, a in enumerate(axes) if a not in wanted]
    sel_shape, rest_shape = [shape[k] for k in sel], [shape[k] for k in rest]
    groups = []
    for g in range(prod(rest_shape)):
        base = sum(d * stride[k] for d, k in zip(_digits(g, rest_shape), rest))
        groups.append([base + sum(d * stride[k] for d, k in zip(_digits(i, sel_shape), sel))
                       for i in range(prod(sel_shape))])
    return groups


def megatron_layout(tp: int, cp: int, dp: int, pp: int, ep: int = 1, etp: int | None = None,
                    order: str = DEFAULT_ORDER) -> dict[str, list[list[int]]]:
    """Every group Megatron-LM builds for these degrees (dense: tp, cp, dp, pp, dp-cp, tp-pp, tp-cp,
    tp-dp-cp; experts: ep, etp, edp), keyed by name. ``etp`` defaults to ``tp`` (Megatron's default for
    ``--expert-tensor-parallel-size``)."""
    dense = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    out = {tok: rank_groups(dense, tok, order)
           for tok in ("tp", "cp", "dp", "pp", "dp-cp", "tp-pp", "tp-cp", "tp-dp-cp")}
    etp = tp if etp is None else etp
    world = tp * cp * dp * pp
    if (world // pp) % (etp * ep):
        raise ValueError(f"expert ranks tp*cp*dp = {world // pp} are not divisible by etp*ep = {etp}*{ep}")
    edp = world // pp // (etp * ep)
    expert_order = "-".join(a for a in order.split("-") if a != "cp")
    expert = {"tp": etp, "ep": ep, "dp": edp, "pp": pp}
    out["ep"] = rank_groups(expert, "ep", expert_order)
    out["etp"] = rank_groups(expert, "tp", expert_order)
    out["edp"] = rank_groups(expert, "dp", expert_order)
    return out


def rank_coordinates(rank: int, sizes: dict[str, int], order: str = DEFAULT_ORDER) -> dict[str, int]:
    """The index of ``rank`` along every axis: ``rank_coordinates(5, {tp:2, cp:1, ep:1, dp:2, pp:2})``
    is ``{tp: 1, cp: 0, ep: 0, dp: 0, pp: 1}``."""
    axes = order.split("-")
    return dict(zip(axes, _digits(rank, [int(sizes[a]) for a in axes])))
