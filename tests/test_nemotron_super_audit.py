"""Issue 12, located but not priced (s18): where is the Nemotron 3 Super Megatron-Bridge miss?

The 31 Blackwell Super rows split by sign: ep 64 (8 local experts: GB300 tp 1, GB200 / B200 tp 2 + SP, B200 tp 1)
-13..-29%, B300 ep 8 (64 local experts) +13..+31%, the latter predicted host-bound (``ep_comm.host_bound_s``, ~4.1 s of
10.6). These tests take each row's time the model leaves unpriced if its priced host wait were zero,
``measured - (predicted - host_bound_s)``, per MoE layer-micro-batch (the 40 'E' layers + MTP's, x micro-batches), and
record what locates it:

- it is per micro-batch, not per token: GB200 tp 2 + SP runs 16 micro-batches of 4096 tokens per rank where GB300
  tp 1 runs 8 of 8192, equal tokens per rank and step, and misses twice the seconds (the same ms per MoE
  layer-micro-batch). Not bytes or FLOPs, which tp 2 + SP leaves per step as they are;
- it is covered on Hopper: the H100 BF16 perf row (ep 32, seq 4096, 40 micro-batches) is priced within 5%, and the
  same ms per MoE layer-micro-batch added as device time would put it +33% slow (1680 MoE layer-micro-batches). A
  fixed device latency per layer is refuted; what behaves so is host issue the device hides only where its own work
  per layer is long;
- a per-MoE-layer-micro-batch term plus a small per-expert one (least squares, only to locate it) describes all 31
  Blackwell rows within 7.8% of their step: ~4.35 ms + ~0.051 ms per local expert, against the fitted host cost's
  2.48 + 0.352 ms (``frameworks.megatron``, fitted on 4-32 local experts). At ep 64 the priced host per MoE
  layer-micro-batch (5.3 ms) is 0.67-1.05x the rows' whole unpriced time, but the overlap hides it (the MoE layer's
  own backward covers its backward issue, the experts' window most of the forward's); at 64 local experts the fitted
  per-expert slope prices 25 ms, 2.6-4.4x the rows' whole unpriced time (so B300's NVFP4 rows, less device work to
  cover the host, are priced slower than MXFP8 where they ran faster: 3 of the 11 ranking misses).

So the miss looks like host issue that the overlap model hides at ep 64 and the per-expert slope over-prices at 64.
Neither is landed. ``host_cover`` is not the lever: with no cover at all (what-if, ``host_light_kinds`` empty) the ep 64
rows are priced the same (GB300 MXFP8 5.685 s) and B300 worse (10.57 -> 12.07 s). The slope and the overlap are the
47-row host fit's (s15 tried two host forms: loss 0.231 -> 0.294 / 0.271), and the code shows no second host sync:
HybridEP's dispatch / combine backwards reuse the forward's handle (fused_a2a.py HybridEPDispatch.backward /
HybridEPCombine.backward @ core_v0.18.0: no .item / .cpu / tolist; the combine's backward hands the library the
saved num_permuted_tokens, the library itself not read), TE's GroupedLinear backward its saved m_splits. It needs a
host-side profile (nsys) of one Super layer.

s26 (moefam), still located, not priced:

- The per-expert launch count is linear in local experts in every container these rows ran: Megatron-Bridge's uv.lock
  pins TransformerEngine 2.14.0+71bbefbf (v0.4.0, NeMo 26.04), 2.16.0+4220403e (v0.5.0, 26.06), 2.16.0+b9d690e0
  (v0.5.1, 26.06.01), 2.17.1+4329ff84 (v0.6.0, 26.08). In each, GroupedLinear calls ``general_grouped_gemm``, whose
  ``nvte_multi_tensor_gemm`` takes CUTLASS's grouped GEMM only on Hopper under NVTE_USE_CUTLASS_GROUPED_GEMM and
  otherwise loops one cuBLAS GEMM per expert over the compute streams (common/gemm/cublaslt_gemm.cu:969-1021, the
  launch :1008, and :1051-1070 @ 71bbefbf; :970 and :1052-1075 @ 4329ff84); 71bbefbf's and 4220403e's
  GroupedLinear have no other path, and the single-launch cuBLASLt grouped GEMM for MXFP8 / NVFP4 that b9d690e0 and
  4329ff84 add (``_GroupedLinear._forward_grouped_tensor``) runs only under NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM=1
  (module/grouped_linear.py:109 @ b9d690e0, :117 @ 4329ff84, default "0"), which no Bridge release v0.4.0..v0.6.0
  sets (git grep of the tags), nor Megatron-Core (core_v0.18.0 / core_v0.19.0 pass TE only single_grouped_weight /
  _bias, parameter storage, from moe_single_grouped_weight, default False: transformer_config.py:835 @
  core_v0.19.0). So "one launch for all experts" does not hold here, and the linear host form is the launch
  count's.
- With the MoE host cost at 0 every Blackwell row is predicted fast, the B300 ep 8 rows (64 local experts) as much
  as the ep 64 ones: -23..-35% against GB300 tp 1's -18..-24% (same tp, micro-batches and tokens), GB200 tp 2's
  -32..-39%. So B300's +13..+31% is the fitted per-expert host priced on top of a miss every layout shares; under
  ``host_bound_s``'s own form (window, cover) the B300 rows alone want ~0.27 ms per local expert at the catalog's
  per-layer term, 0.76x the fitted 0.352 (not the 1/4 of the additive location above). Lowering the slope alone
  cannot mend the family (per-layer term held; 0.25 ms: Super MAPE 19.5% -> 18.4%, the 47 host rows 5.3% -> 5.8%;
  0.15 ms: 21.8% / 7.7%).
- The GB200 BF16 card (-18.6%) is the same term, not a BF16 one: it leaves 2.64 s unpriced (3.9 ms per MoE
  layer-micro-batch) where the 26.08 MXFP8 / NVFP4 rows of its layout (tp 2 + SP, ep 64, the same graphs and
  dispatcher) leave 2.98 / 3.20 s; measured BF16 / MXFP8 = 1.066 where the model prices 1.120, so the precision
  moves less of the step than priced, and H100 BF16 (drop-and-pad at capacity 1.1, no per-layer host sync, no
  graphs, pp 2) stays within 5%."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmark_modules import heldout_rows
from cost_models.estimate import estimate

FILES = ("more_runs_bridge2.json", "more_runs_bridge_cards.json")
BLACKWELL = ("gb200", "gb300", "b200", "b300")


def _moe_layers(model: Any) -> int:
    """MoE layers one micro-batch runs: the stack's 'E' plus each MTP depth's."""
    mtp = model.arch.mtp_layers * (model.arch.mtp_pattern or "").count("E")
    return model.hybrid_pattern.count("E") + mtp


def _row(case: dict[str, Any], rules: dict[str, Any], heldout: Any, fidelity: Any) -> dict[str, Any]:
    run = heldout.resolve_run(fidelity.to_run(case, rules))
    cluster, par, job = run.cluster_with(), run.parallel, run.job
    pred = estimate(run.model, cluster, job, par, target=run.target, software=run.knobs, check=False)
    eff = cluster.efficiency
    experts = run.model.num_experts // par.ep
    lm = pred.num_microbatches * _moe_layers(run.model)
    unpriced = run.measured_step_time_s - (pred.step_time_s - pred.time.host_bound_s)

    def err_at(per_layer: float, per_expert: float) -> float:
        eff0 = eff.model_copy(update={"moe_host_s_per_layer": per_layer, "moe_host_s_per_expert": per_expert})
        return run.predict(eff0) / run.measured_step_time_s - 1
    return {"measured": run.measured_step_time_s, "predicted": pred.step_time_s, "lm": lm, "experts": experts,
            "unpriced": unpriced, "unpriced_ms": unpriced / lm * 1e3, "gpu": case["cluster"]["gpu"],
            "tokens_per_rank_step": pred.num_microbatches * par.micro_batch_size * job.seq_len
            / (par.tp if par.sequence_parallel else 1),
            "host_ms": 1e3 * (eff.moe_host_s_per_layer + eff.moe_host_s_per_expert * experts),
            "per_expert_ms": 1e3 * eff.moe_host_s_per_expert, "tp": par.tp,
            "zero_host": err_at(0.0, 0.0),
            "half_slope": err_at(eff.moe_host_s_per_layer, eff.moe_host_s_per_expert / 2),
            "at_catalog": pred.step_time_s / run.measured_step_time_s - 1}


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, Any]]:
    return heldout_rows(FILES, lambda case: "Nemotron_3_Super" in case["id"] and "natural" not in case["id"], _row)


def _blackwell(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows.values() if r["gpu"] in BLACKWELL]


def _locate(sel: list[dict[str, Any]]) -> np.ndarray:
    """Least squares (to locate the term, not to price it): unpriced s = lm x (a + b x local experts)."""
    x = np.array([[r["lm"], r["lm"] * r["experts"]] for r in sel], dtype=float)
    return np.linalg.lstsq(x, np.array([r["unpriced"] for r in sel]), rcond=None)[0]


def test_the_super_miss_is_per_micro_batch_not_per_token(rows) -> None:  # type: ignore[no-untyped-def]
    for rel in ("mb26.04", "mb26.04.01", "mb26.06", "mb26.06.01", "mb26.08"):
        for prec in ("MXFP8", "NVFP4"):
            a = rows[f"{rel}_Nemotron_3_Super_gb300_64gpu_{prec}"]  # tp 1, 8 micro-batches
            b = rows[f"{rel}_Nemotron_3_Super_gb200_64gpu_{prec}"]  # tp 2 + SP, 16 micro-batches
            assert a["tokens_per_rank_step"] == b["tokens_per_rank_step"] and b["lm"] == 2 * a["lm"]
            assert b["unpriced"] / a["unpriced"] > 1.6, (rel, prec)  # twice the micro-batches, ~twice the miss
            assert 0.8 < b["unpriced_ms"] / a["unpriced_ms"] < 1.5, (rel, prec)


def test_the_missing_term_is_hidden_on_hopper(rows) -> None:  # type: ignore[no-untyped-def]
    a, b = _locate(_blackwell(rows))
    h = rows["mbcard_Nemotron_3_Super_h100_64gpu_BF16"]
    assert abs(h["predicted"] / h["measured"] - 1) < 0.05  # priced right as it is
    as_device = h["predicted"] + h["lm"] * (a + b * h["experts"])
    assert as_device / h["measured"] - 1 > 0.2  # the same term as device time would put it > 20% slow


def test_one_per_layer_term_locates_every_blackwell_row(rows) -> None:  # type: ignore[no-untyped-def]
    sel = _blackwell(rows)
    assert len(sel) == 31 and {r["experts"] for r in sel} == {8, 64}
    a, b = _locate(sel)
    resid = [r["unpriced"] - r["lm"] * (a + b * r["experts"]) for r in sel]
    assert max(abs(e) / r["measured"] for e, r in zip(resid, sel)) < 0.1  # every row within 10% of its step (now 7.8%)
    assert 3e-3 < a < 6e-3  # s per MoE layer-micro-batch, about the priced host of one at ep 64...
    ep64 = [r for r in sel if r["experts"] == 8]
    assert all(0.6 < r["unpriced_ms"] / r["host_ms"] < 1.1 for r in ep64)  # ...which host_cover hides
    # The fitted per-expert host slope (4-32 local experts) does not carry to 64: the rows' slope is < 1/4 of it,
    # and at 64 local experts the priced host per MoE layer-micro-batch is > 2x the rows' whole unpriced time.
    assert b * 1e3 < 0.25 * sel[0]["per_expert_ms"]
    for r in sel:
        if r["experts"] == 64:
            assert r["host_ms"] > 2 * r["unpriced_ms"], r


def test_b300_misses_like_the_rest_without_host_cost(rows) -> None:  # type: ignore[no-untyped-def]
    sel = _blackwell(rows)
    assert all(r["zero_host"] < -0.1 for r in sel)  # every layout fast without the host term (now <= -14.6%)
    b300 = [r for r in sel if r["gpu"] == "b300"]
    gb300 = [r for r in sel if r["gpu"] == "gb300"]
    assert len(b300) == 6 and {r["experts"] for r in b300} == {64} and {r["experts"] for r in gb300} == {8}
    assert {r["tp"] for r in b300 + gb300} == {1}
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    b, g = mean([r["zero_host"] for r in b300]), mean([r["zero_host"] for r in gb300])
    assert b < g and g - b < 0.12  # B300 misses as GB300 does, a few points more (now -28.8% vs -21.1%)
    # the per-expert slope the B300 rows want under host_bound_s's form lies between half the fitted one and it
    assert mean([r["half_slope"] for r in b300]) < 0 < mean([r["at_catalog"] for r in b300])


def test_the_bf16_card_misses_the_seconds_of_its_quantized_layout(rows) -> None:  # type: ignore[no-untyped-def]
    bf16 = rows["mbcard_Nemotron_3_Super_gb200_64gpu_BF16"]
    for prec in ("MXFP8", "NVFP4"):
        q = rows[f"mb26.08_Nemotron_3_Super_gb200_64gpu_{prec}"]
        assert q["lm"] == bf16["lm"] and q["experts"] == bf16["experts"] == 8
        assert 0.75 < bf16["unpriced"] / q["unpriced"] < 1.0  # the same seconds, a little fewer (now 0.89 / 0.82)
        # the precision moves the measured step less than the priced one
        assert bf16["measured"] / q["measured"] < bf16["predicted"] / q["predicted"]
