"""Transformer Engine userbuffers (Megatron ``--tp-comm-overlap``): which TP collective hides behind which GEMM, and
what stays exposed — computed from the collective's and the GEMM's own times, not a fitted share.

TE's defaults (``transformer_engine/pytorch/module/base.py`` ``initialize_ub``, methods l.350-362, ``get_default_config``
l.375-395; what Megatron-LM runs with ``--tp-comm-overlap`` and no ``--tp-comm-overlap-cfg``), per TP block with
sequence parallelism:

- ``ring_exchange`` (``qkv_fprop``, ``fc1_fprop``: the all-gather of a column-parallel input; ``proj_dgrad``,
  ``fc2_dgrad``: the all-gather of a row-parallel output gradient): the GEMM runs in ``t`` chunks, one per peer,
  chunk i on the data already held while chunk i+1 arrives by copy engine (``use_ce``, one SM; no SM margin). The
  first chunk is local, so the all-gather's t−1 transfers hide behind t−1 of the t GEMM chunks:
  exposed = max(0, comm − gemm·(t−1)/t).
- ``pipeline`` (``proj_fprop``, ``fc2_fprop``: the reduce-scatter of a row-parallel output): the GEMM in
  ``num_splits`` = 4 chunks, each chunk's reduce-scatter (on 16 SMs) while the next chunk computes; the last chunk's
  reduce-scatter has nothing left to hide behind: exposed = comm/4 + 3·max(0, (comm − gemm)/4).
- ``bulk`` (``qkv_dgrad``/``fc1_dgrad``: the all-gather of the column-parallel input for the weight gradient, behind
  the dgrad GEMM; ``qkv_wgrad``/``fc1_wgrad``: the reduce-scatter of the input gradient, behind the wgrad GEMM): one
  collective under one whole GEMM: exposed = max(0, comm − gemm). ``external`` (``proj_wgrad``, ``fc2_wgrad``)
  reuses the gradient the ring exchange gathered: no collective.

The GEMMs keep every SM: TE 1.x, which the 2024 calibration runs used (Megatron-Core README, NeMo 24.03/24.07),
defaults ``set_sm_margin`` to False for every method (base.py @5ee9817 l.231). TE ≥ 2.0 sets it for ``pipeline`` and
``bulk`` (the GEMM then runs on SMs − 16, ``comm_gemm_overlap.cpp:143``), and NeMo / Megatron-Bridge recipes pass
tuned per-model configs (``tp_overlap_configs/userbuffers.py``: bulk without margin, pipeline with 20-24 SMs): neither
is priced (no run states its TE version or config).
"""

from __future__ import annotations

from typing import Literal

UB_PIPELINE_SPLITS = 4  # get_default_config: num_splits 4 for "pipeline" (ring_exchange: tp_size)

UbMethod = Literal["ring_exchange", "pipeline", "bulk"]


def ub_exposed_s(method: UbMethod, comm_s: float, gemm_s: float, t: int) -> float:
    """Seconds one userbuffers-overlapped collective adds to its GEMM's time (``comm_s``: the collective alone;
    ``gemm_s``: the GEMM alone): the part of the collective the GEMM does not cover."""
    if comm_s <= 0.0:
        return 0.0
    if method == "ring_exchange":  # t chunks, the first one local: t − 1 transfers under t − 1 GEMM chunks
        return max(0.0, comm_s - gemm_s * (t - 1) / t)
    if method == "bulk":
        return max(0.0, comm_s - gemm_s)
    n = UB_PIPELINE_SPLITS  # chunk j's reduce-scatter runs under chunk j+1's GEMM; the last one's is exposed
    return (n - 1) * max(0.0, (comm_s - gemm_s) / n) + comm_s / n
