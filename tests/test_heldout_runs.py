"""Held-out public runs (benchmarks/data/more_runs*.json, priced by benchmarks/heldout.py).

Every case loads and resolves like a calibration run (dp consistent with the GPU count, a source, a step time that
is the published throughput's), and — a REGRESSION GUARD, not a fidelity target — the held-out MAPE / worst error
stay within what was measured when the data landed (plus a small margin): a change to the cost model that makes
the held-out runs worse shows up here. The issue's targets (MAPE <= 10%, worst <= 35%) are reported by the script.
"""

from __future__ import annotations

import json

import pytest

from benchmark_modules import load_heldout


@pytest.fixture(scope="module")
def heldout():  # type: ignore[no-untyped-def]
    return load_heldout()


@pytest.fixture(scope="module")
def evaluated(heldout):  # type: ignore[no-untyped-def]
    return heldout.evaluate()


def test_every_case_loads_and_resolves(heldout, evaluated) -> None:
    rows, skipped, cases = evaluated
    files = heldout.default_files()
    assert files, "no benchmarks/data/more_runs*.json"
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)), "case ids repeat across the held-out files"
    assert {r.id for r in rows} | {cid for cid, _ in skipped} == set(ids)
    rejected = [f"{cid}: {why}" for cid, why in skipped if why.startswith("REJECTED")]
    assert not rejected, "cases the cost model rejects must say skip and why in their group: " + "; ".join(rejected)
    for path in files:
        data = json.loads(path.read_text())
        assert data["about"] and data["groups"]
        for g in data["groups"].values():
            assert g.get("source"), g
        for c in data["cases"]:
            assert c["source"] and c["group"] in data["groups"], c["id"]
            par, cl, job, meas = c["parallel"], c["cluster"], c["job"], c["measured"]
            assert par["dp"] * par["tp"] * par["pp"] * par["cp"] == cl["num_gpus"], c["id"]
            assert meas.get("basis"), c["id"]
            tps = meas.get("tokens_per_s_per_gpu")
            if tps:  # the step time is the published throughput's
                step = job["global_batch_size"] * job["seq_len"] / (tps * cl["num_gpus"])
                assert meas["step_time_s"] == pytest.approx(step, rel=1e-3), c["id"]


def test_catalog_models_and_moe_load(heldout) -> None:
    """A case may name a catalog model (MoE included); the group's resolutions and vocab padding still apply."""
    fidelity = heldout.fidelity
    rules = {"groups": {"g": {"source": "x", "case_models": {"c": {"tied_embeddings": False}}}}}
    case = {"id": "c", "group": "g", "source": "x", "model": {"catalog": "mixtral-8x7b"},
            "cluster": {"gpu": "h100-sxm", "num_gpus": 64, "gpus_per_node": 8, "inter_node_gbps_per_gpu": 400.0},
            "job": {"global_batch_size": 256, "seq_len": 4096, "micro_batch_size": 1, "precision": "bf16"},
            "parallel": {"tp": 1, "pp": 4, "dp": 16, "cp": 1, "ep": 8, "vp": None, "sequence_parallel": False,
                         "zero_stage": 1, "recompute": None},
            "measured": {"step_time_s": 1.0}}
    run = fidelity.resolve_run(fidelity.to_run(case, rules))
    assert run.model.num_experts == 8 and run.model.moe_top_k == 2
    assert run.model.vocab_size == 32000  # already a multiple of 128 (tp 1)
    assert fidelity.model_name(case) == "mixtral-8x7b"


# Measured (python benchmarks/heldout.py), per held-out file: MAPE and worst |error| of its priced cases, plus a
# small margin. At landing (session 4) 27.3% / 336%; after the NVL72 segment placement, Blackwell attention, fp8
# recipe and memory-knob fixes and the calibration refit: 14.2% / 63.2% on its 108 still-held-out runs. Session 5
# (s5-moe): the Qwen3 and Mixtral rows carry their recipes' MoE knobs (dispatcher, A2A overlap, forced balance, token
# drop): 12.4% / 64.9% on 113 runs (with EP-spanning-TP rows; the worst, Qwen3-30B B200 mbs 1, is host-bound).
# more_runs_bridge2.json (session 6, s6-rows: Bridge 26.02.01 / 26.04 / 26.06.01 / 26.08, Kimi-K2, 26.06 DeepSeek-V3):
# 9.6% / 53.5% on its 72 priced runs when it landed (the worst: Qwen3-235B B300 26.02.01, an alltoall vp-4 layout).
# more_runs_torchtitan.json (session 6, s6-tt): 33 torchtitan/torchao runs (H100, H200, B200, MI300X) at landing:
# 21.3% / 55.0% (the B200 and MI300X rows predicted ~2x fast: see issue-12.md).
# more_runs_gptoss.json (session 6, s6-gptoss): Megatron-Bridge's 31 GPT-OSS 120B rows (25.11-26.08) at landing:
# 38.1% / 56.9%, every row predicted fast (see issue-12.md, Session 6: GPT-OSS).
# s6-hostfit: the MoE host cost fitted on 21 MoE rows of more_runs.json (25.11 / 26.02, no A2A overlap; no longer held
# out): 10.0% / 61.6% on its 118 still-held-out runs; bridge2 9.7% / 38.6% (26.06.01's full_iteration 30B GB200 row,
# priced host-issued because megatron-core 0.16.1 cannot express its graphs).
# Guards re-measured at the session-6 review (after the host fit): gptoss 37.9% / 56.9% after the host fit.
# s7-gptoss: Megatron-Core's eager expert glue (op_traffic.MCORE_EXPERT_*: the activation clamp, fc2's per-expert
# bias) priced: gptoss 28.1% / 54.6%; no other file moves (GPT-OSS is the only held-out model with either).
# s7-ratios: torchtitan's gemm_max / fp8 speed-up stored as ratios to the GPU's value (MI300X no longer raised to
# Hopper's fitted absolute: its 4 rows −51.2% → −39.9%): torchtitan 19.8% / 55.0% (the worst: B200, power-limited);
# then cdna3's GEMM figures from AMD's MAF (fp8 1.4 → 1.82 makes MI300X's fp8 rows faster: −39.9% → −41.9%): 20.1%.
# s7-hybrid: bridge2's 20 Nemotron 3 Nano rows (hybrid Mamba-2 stacks) priced for the first time with their releases'
# recipe knobs, its other 72 rows identical: 12.0% / 38.6% on 92 runs (the Nano rows alone 20.5%, all predicted fast:
# Blackwell 24.0%, H100 6.5%; worst -29.7%).
# s7-a2a: the dropless dispatcher's per-layer host sync priced (ep_comm.host_bound_s) and the host cost refitted
# 0.69 -> 0.541 ms: bridge2 12.0 -> 10.9% (worst 38.6 -> 36.7%), gptoss 28.1 -> 27.5%, more_runs.json 9.9 -> 10.4% (worse:
# its host-bound A2A-overlap rows and 25.09 token-drop rows at the lower cost; worst 61.6 -> 63.3%, Qwen3-30B H100 overlap).
# s9-gptoss: Megatron-Core's op-by-op RoPE under YaRN (op_traffic.MCORE_UNFUSED_ROTARY_BYTES) priced: gptoss
# 26.5 -> 25.1% (worst 53.8 -> 52.9%); no other file moves (GPT-OSS is the only held-out standard-attention YaRN model).
# s9-amd: cdna3 fitted on 5 MI325X Megatron-Core runs (more_runs_amd.json; fp8 1.82 -> 1.30, attention 0.45 -> 0.39):
# the held-out torchao MI300X rows -41.6% -> -35.8%, torchtitan 20.1% -> 18.3%; more_runs_amd.json's one held-out
# row (Mixtral 8x7B bf16, EP 8, Primus) -42.2%.
# s9-hmtp: bridge2's 30 Nemotron 3 Super rows and the 3.5 Lightning row (hybrid MTP, megatron_core >= 0.17) priced for
# the first time, guarded apart so that the file's other rows keep their guard: 39.2% / 73.9% on 31 rows at landing (Super alone 40.0%)
# (Super GB300/GB200/B200 predicted fast, B300 ep 8 slow: its host-issued 64 local experts; see issue-12.md).
# s10-host: the deepep sync kept under the A2A overlap (moe.SYNC_DRAINS_UNDER_A2A_OVERLAP), then the MoE host cost
# per layer + per local expert (1.668 + 0.434 ms, fitted jointly on the same 21 rows): more_runs.json 10.1 -> 9.9%
# (worst 61.0%), bridge2 10.2 -> 9.9% (36.5 -> 36.1%), hybrid MTP rows 39.2 -> 33.5% (worst 73.9 -> 54.2%: Super B300's
# 64 local experts priced lower); torchtitan, gptoss, amd unchanged.
# s10-hybrid: bridge2's other rows 10.2% -> 8.5% (its 20 Nemotron 3 Nano rows 16.2% -> 8.1%: the SSD rate); with
# s10-host's host cost, landed together: 8.1% (worst 36.1%).
# s11-a2a: more_runs_ep_overlap.json, Megatron-Bridge's two published A/Bs of the EP A2A overlap at pp 1 (Qwen3-30B,
# 16 H100): 13.2% on 4 rows at landing, worst the alltoall overlap arm (-25.7%: the model hides 16.0 of the 17.8 s of
# all-to-all, the A/B shows 9.9 s gained).
# s11-ttdata: more_runs_torchtitan_moe.json, torchtitan's own DeepSeek-V3 runs from its commit messages (16B on 8
# H100-96GB, PR #1610; 671B on 512 H100, PR #2107): 30.4% / 37.9% on its 2 priced rows as found, both predicted fast;
# 25.8% / 33.2% with torchtitan's AC priced as its code runs MoE layers (op-SAC never saves the experts' grouped_mm
# and, before c4e2291, nor the all-to-alls; full AC re-runs dispatch and combine) and its round-robin forced balance;
# 19.8% / 23.1% with its MoE glue's gathers / scatters and fp32 score weighting as its code runs them
# (moe.permutation_passes: 16B -33.2% -> -23.1%, eager 2025-08 code; 671B -18.3% -> -16.4%); 20.0% / 23.6% with the
# 16B run's loss-only compile priced (torchtitan knob compile_components: the loss fused, 16B -23.6%, peak 93.6 -> 68.6
# GiB, now predicted to fit).
# review mend: torchtitan never counts the router gate among its alternating matmuls (force-recomputed first):
# the 16B row -23.6% -> -23.9% (peak 68.6 -> 71.8 GiB vs 78.1 measured): 20.2% / 24.0%.
# s11-hostfit: 26.04 / 26.04.01's 26 transformer MoE rows without A2A overlap calibrate the MoE host cost (with 25.11 /
# 26.02's 21: 2.648 ms + 0.365 ms/expert, was 1.668 + 0.434): they leave more_runs.json (12 rows, which were at 5.8%:
# the file 9.9% -> 10.3% on its remaining 106, 10.3% on those at main too) and bridge2 (14 rows: 8.1% -> 8.6% on 78;
# the same 78 at main 8.7%, worst 36.1 -> 36.8%, mb26.02.01 Qwen3-235B B300 -36.1 -> -36.8%); ep_overlap 13.3 -> 13.8%
# (the hybridep arm, ep 16: 8 local experts, +13.5 -> +15.7%: below ~14 local experts the new fit issues more);
# hybrid MTP rows 23.8% -> 20.5%, worst 49.1 -> 34.8% (Super B300, 64 local experts: 29.4 -> 26.0 ms per layer).
# s12-fusedmlp: the 24 rows whose Bridge recipe sets cutedsl_fused_grouped_mlp run the megatron knob
# moe_fused_grouped_mlp (TE's fused grouped MLP: the act pass and the casts' bf16 reads in the GEMM epilogues):
# Qwen3 13 rows 9.4% -> 6.2%, DeepSeek-V3 5 rows 16.1% -> 14.4% (all still over-predicted); more_runs.json 10.3% ->
# 10.2%, bridge2 8.6% -> 8.2%. GPT-OSS's 6 MXFP8 rows -9.8% -> -33.4% (mean signed): the fused op also drops
# Megatron-Core's eager clamp and per-expert fc2 bias (op_traffic.MCORE_EXPERT_*), which these rows were priced
# with though their recipe bypasses that code; they join the file's BF16 rows (-28..-35%, still with the glue):
# the file 25.1% -> 28.7%, worst 52.9% -> 53.3% (mb26.06.01 GPT-OSS GB200, measured 1.6x its 26.06 twin).
# s12-data: more_runs_bridge_cards.json, Megatron-Bridge's model verification cards (card.yaml @ cc59a637a): 11 rows
# priced as they came (6 more listed unpriced), 8 outside the hybrid MTP guard at 23.7% / 61.1% (the worst: GPT-OSS-120B's real-data
# functional run on 64 H100, -61.1%; its GB200 BF16 performance run -40.9%, as the table rows of more_runs_gptoss.json);
# its 3 Nemotron 3 Super rows join the hybrid MTP rows: 20.5% -> 19.4% on 34 (worst unchanged).
# s12-sdpa: torchtitan's SDPA runs cuDNN attention on sm100 from 3b85aa31f (2025-05-14; models/attention.py:204-211 @
# 6fc499f6, the B200 torchao run's commit), not FlashAttention-2: its attention core priced 1/0.62 faster, the 5 B200
# rows -49.5% -> -55.2% (worst rowwise -54.4% -> -59.6%); the file 18.4% -> 19.1%. A sourced kernel fact that widens a
# gap the run's 750 W power cap (mx_formats/README.md @ d8bb51f63: "8xB200 GPUs limited to 750W") leaves unpriced.
# s13-gptoss: the fused attention kernel's head-dim dependence (Efficiency.attention_d64: cuDNN 9.19.1 SDPA, d 64 /
# d 128 at equal keys per query, H200 0.796, GB200 0.728, GB300 0.706; d >= 128 unchanged) prices GPT-OSS's d-64
# attention core 1.26x (Hopper) / 1.37-1.42x (Blackwell) longer: more_runs_gptoss.json 28.8% -> 26.5%, worst 53.3% ->
# 51.9% (mb25.11 B200); the cards file 24.0% -> 23.6%, worst 61.1% -> 60.8% (GPT-OSS-120B's functional H100 run).
# s13-a2app: DeepEP's host sync under the A2A overlap read where the code has it (the dispatch node: the CPU waits
# inside Buffer.dispatch, fused_a2a.py:103-105; the expert node's .item() reads the CPU tensor it returned, :135), so
# it does not drain the device there either (was priced as draining): mb2602 Qwen3-30B H100 deepep -36.8% -> -45.0%,
# mb2604 DeepSeek-V3 B200 -12.0% -> -13.8%; more_runs.json 10.18% -> 10.28% (worst unchanged).
# s13-attncurve: Blackwell's attention_half_keys refit on cuDNN 9.19.1's 2k-32k sweeps (GB200 334 -> 837, GB300/B300
# 486 -> 777: 4k-token kernels 1.09x slower, 16k+ faster) and the MoE host cost refit with it (2.648 + 0.365 -> 2.430 +
# 0.370 ms): more_runs.json 10.3% -> 9.8% (NeMo long-sequence B200 rows +9..16% -> +3..6%); gptoss 26.5% -> 25.5%, worst
# 51.9% -> 51.1%; bridge2 8.2% -> 8.6%, worst 36.8% -> 37.5% (its 4k-token MoE rows, already predicted slow, slower);
# cards 23.6% -> 23.4%, worst 60.8% -> 61.0% (GPT-OSS H100: the host cost); hybrid MTP rows 19.4% -> 19.8%, worst 34.8%
# -> 35.2% (Super B300 NVFP4, predicted slow; both changes). Stated, not compensated.
# s14-hopmoe: NCCL's all-to-all holds SMs beside compute under the A2A overlap, one CTA per p2p channel (H100: 32 in
# a node, 16 across nodes, NCCL's logs on p5.48xlarge; moe.nccl_alltoall_ctas), as DeepEP's / HybridEP's were: the 7
# Hopper alltoall + overlap rows 3-11 points closer (Qwen3-235B H100 -23..-28% -> -21..-26%, the mbskill2605 overlap
# arm -25.7% -> -19.9%, mb2511 Qwen3-30B H100 FP8-CS -61.0% -> -49.9%); more_runs.json 9.9% -> 9.7%, worst 61.0% ->
# 49.9%; bridge2 8.6% -> 8.5%; ep_overlap 13.6% -> 12.1%, worst 25.7% -> 19.9%. No Blackwell value (no public log).
# s14-a2a: NCCL's all-to-all at its own NVLink busbw (Efficiency.a2a_link_bus, hopper 0.7442 / blackwell 0.7231 vs
# the ring's 0.82 / 0.7722) and the MoE host cost refit with it (2.430 + 0.370 -> 2.442 + 0.368 ms): more_runs.json
# 9.84% -> 9.78%, gptoss 25.49% -> 25.23% (worst 51.1% -> 50.9%), torchtitan_moe 20.2% -> 19.8% (worst 23.9% -> 23.2%),
# hybrid MTP 19.78% -> 19.71% (worst 35.2% -> 34.7%); the others unchanged.
# s14 combined (hopmoe + a2a, measured on the merged tree): more_runs.json 9.6% / 49.9%, gptoss 25.2% / 50.9%,
# ep_overlap 12.1% / 19.9%, torchtitan_moe 19.8% / 23.2%.
# s14 lead (reviewer): the dispatcher's SMs slow only the compute beside its all-to-alls while they run
# (layer_cost.a2a_sm_slowdown: C + f·min(A, C/(1 − f)), was C/(1 − f) for the whole layer): all rows 13.5% -> 13.2%;
# rows predicted slow gain (DeepSeek-V3 GB300 HybridEP +21% -> +12%, Qwen3-30B GB200/B300 +13..17% -> +3..9%; bridge2
# 8.5% -> 7.4%, ep_overlap 12.1% -> 10.5%), rows predicted fast lose (mb2511 Qwen3-30B H100 FP8-CS -49.9% -> -58.9%:
# more_runs worst 49.9% -> 58.9%; GPT-OSS GB200/GB300 overlap rows 4-6 points: gptoss 25.2% -> 26.5%, worst 50.9% ->
# 53.1%; the mbskill2605 overlap arm -19.9% -> -21.2%). Stated, not compensated.
# s15-hopmoe: TE's Fp8Padding / Fp8Unpadding copies of the routed rows around Megatron-Core's fp8 / fp4 grouped
# experts where the counts come unaligned (alltoall / DeepEP dropless; moe.quantization_padded) and the MoE host cost
# refit with them (2.442 + 0.368 -> 2.477 + 0.352 ms): the Hopper alltoall / DeepEP fp8 rows 1.5-2.4 points closer
# (Qwen3-235B H100 -20..-26% -> -18..-24%, mb2511 Qwen3-30B H100 FP8-CS -58.9% -> -56.5%, DeepSeek-V3 H100 1024
# -18.1% -> -15.8%), the over-predicted Super B300 rows 3.5-4 points closer (the lower per-expert cost); host-bound
# rows predicted fast lose 0.2-2 points (mb26.02.01 Qwen3-235B B300 -37.5% -> -38.7%: bridge2 worst 37.5% -> 38.7%;
# GPT-OSS H100 card -61.0% -> -61.2%). All rows 13.24% -> 13.16%; more_runs.json 9.6% / 58.9% -> 9.5% / 56.5%, hybrid
# MTP 19.7% / 34.7% -> 19.2% / 30.7%.
# s16-padding: routed-row kernels on the capacity rows under drop-and-pad (moe.routed_rows): the two Nemotron 3 Super
# H100 BF16 card rows at capacity 1.1 move +0.6 / +0.6 points (+0.6% -> +1.2%, -5.5% -> -4.9%): more_runs_bridge_cards
# 18.8% unchanged; router padding (moe_router_padding) on the HybridEP Super rows prices nothing. Guards unchanged.
# s21-l4data: more_runs_llama4.json, the public measured Llama 4 runs (NeMo 25.07's GB200 Scout row; dgxc-benchmarking
# v25.05.01's Maverick on 128/256/512 GB200, BF16 and FP8; its two H100 rows at ETP 4 listed unpriced): 22.6% / 26.8%
# on the 7 priced rows at landing (main 097ecdb), every one predicted fast: Scout -7.1%, Maverick -24.2..-26.8%.
# s21-nemo2507: more_runs_nemo2507.json, the NeMo 25.07 page's DGX-GB200 LLAMA3-8B / 70B / 3.1-405B rows (the only
# non-Llama-4 rows of the page in any stored copy), priced as they came: 5.6%, worst 10.9% (405B FSDP + 95 offloaded
# layers, -10.9%); all rows 13.16% -> 13.09% (317).
GUARDS = {"more_runs.json": (0.095, 0.566), "more_runs_bridge2.json": (0.075, 0.388),
          "more_runs_torchtitan.json": (0.191, 0.596), "more_runs_gptoss.json": (0.265, 0.531),
          "more_runs_amd.json": (0.422, 0.422), "more_runs_ep_overlap.json": (0.105, 0.212),
          "more_runs_torchtitan_moe.json": (0.199, 0.233), "more_runs_bridge_cards.json": (0.227, 0.612),
          "more_runs_llama4.json": (0.226, 0.268), "more_runs_nemo2507.json": (0.056, 0.109)}
HYBRID_MTP_ROWS = ("Nemotron_3_Super", "Nemotron_3_5_Lightning")
# s10-hybrid: the NVFP4 Super rows priced with their recipe's bf16 layers (first_last_layers_bf16, the last 14) and
# te_quant.cfg's per-module precision (cost_models.quant_layout): 39.2% -> 37.4% on the 31 rows; the worst, B300 NVFP4
# (over-predicted from its host-issued experts), 73.9% -> 77.7% as those layers' real bf16 GEMMs are added to it.
# s10-hybrid: the SSD kernels' tensor-core rate (Efficiency.ssd_tflops, from mamba#904's GB200/H200 ratio): 37.4% ->
# 32.1%; the B300 rows (host-bound, over-predicted) further up, worst 86.6%; bridge2's Nano rows -20% -> -8% (their
# guard below holds).
# Landed with s10-host's per-layer + per-expert host cost (Super B300's 64 local experts priced lower): 26.5% on the
# 31 rows, worst 66.9% (mb26.06 Super B300 NVFP4).
# s11-super: the graphed Mamba / attention layers' backward covers the MoE layers' backward host issue
# (cost_models.host_cover): 26.5% -> 23.8%, worst 66.9% -> 49.1% (still mb26.06 Super B300 NVFP4); Super GB200 NVFP4
# (host wait in the backward removed) -22..-26% -> -25..-29%.
HYBRID_MTP_GUARD = (0.193, 0.307)  # s14-a2a, s15-hopmoe: see GUARDS
MARGIN = 0.02


def test_host_calibration_rows_are_not_held_out(heldout, evaluated) -> None:
    """The rows the MoE host cost is fitted on (fidelity.host_calibration_runs) leave the held-out set, exactly them:
    their releases' dense rows and A2A-overlap MoE rows stay held out, and the output names the rows it left out."""
    rows, skipped, cases = evaluated
    fitted = heldout.host_calibration_ids()
    assert fitted and not fitted & {c["id"] for c in cases}
    groups = {"megatron_bridge_25.11", "megatron_bridge_26.02", "megatron_bridge_26.04", "megatron_bridge_26.04.01",
              "megatron_bridge_26.04.01_more"}
    kept = [r for r in rows if r.group in groups]
    assert any(not r.moe for r in kept) and any(r.moe and "moe_a2a_overlap=True" in r.moe_knobs for r in kept)
    hybrid = [r for r in kept if "Nemotron_3" in r.id]  # s11-hostfit: the hybrid stacks of 26.04 / 26.04.01 stay held out
    assert len(hybrid) == 8 + 5 + 4 + 8 and all(r.moe for r in hybrid)
    assert not any(r.moe and "moe_a2a_overlap=True" not in r.moe_knobs for r in kept if r not in hybrid)
    text = heldout.render(rows, skipped, cases)
    assert all(cid in text.split("MoE host cost")[1] for cid in fitted)


def test_heldout_error_regression_guard(heldout, evaluated) -> None:
    """REGRESSION GUARD (not the issue's target): each file's held-out MAPE and worst error no worse than when
    they were measured (the cost model's physics changing for the worse shows here; for the better: lower them)."""
    rows, _, _ = evaluated
    hybrid_mtp = [r for r in rows if any(k in r.id for k in HYBRID_MTP_ROWS)]
    apart = {r.id for r in hybrid_mtp}
    guards = [(n, g, [r for r in rows if r.file == n and r.id not in apart]) for n, g in GUARDS.items()]
    for name, (mape_at, worst_at), mine in guards + [("hybrid MTP rows", HYBRID_MTP_GUARD, hybrid_mtp)]:
        assert mine, name
        (_, n, mape, _, worst, wid), = heldout.summarize(mine, "all")
        assert mape <= mape_at + MARGIN, f"{name}: held-out MAPE {mape:.1%} > {mape_at:.1%} + {MARGIN:.0%}"
        assert worst <= worst_at + MARGIN, f"{name}: held-out worst {worst:.1%} ({wid}) > {worst_at:.1%} + {MARGIN:.0%}"


def test_sibling_gpus_pair_one_sources_same_run_on_two_gpus(heldout, evaluated) -> None:
    """``sibling_gpus`` pairs rows of one source whose configuration (model, GPU count, job, layout, knobs, target)
    is equal and whose GPU differs; the ratios are the rows' own step times."""
    rows, _, _ = evaluated
    by_id = {r.id: r for r in rows}
    pairs = heldout.sibling_gpus(rows)
    assert pairs
    for a, b, measured, predicted in pairs:
        ra, rb = by_id[a], by_id[b]
        assert ra.group == rb.group and ra.config == rb.config and ra.gpu != rb.gpu
        assert measured == pytest.approx(ra.measured_s / rb.measured_s)
        assert predicted == pytest.approx(ra.predicted_s / rb.predicted_s)
    found = {(a, b) for a, b, _, _ in pairs}
    # the same Megatron-Bridge 25.11 recipe on GB200 and GB300 (8 GPUs, Llama 3 8B, FP8 current scaling)
    assert ("mb2511_LLAMA3_8B_gb200_8gpu_FP8-CS", "mb2511_LLAMA3_8B_gb300_8gpu_FP8-CS") in found
    # a 70B run whose CPU offload differs between its GB200 and GB300 recipes (40 vs 20 layers) is no such pair
    assert ("mb2602_LLAMA3_70B_gb200_64gpu_FP8", "mb2602_LLAMA3_70B_gb300_64gpu_FP8") not in found
    # two B200 recipes the model cannot tell apart (MXFP8 scale rounding) are one GPU: no pair
    assert ("torchao_b200_8B_mxfp8_cublas", "torchao_b200_8B_mxfp8_cublas_rceil") not in found


def test_repeat_floor_is_the_best_constant_per_repeated_run(heldout) -> None:
    """``repeat_floor`` on toy rows: a run measured at 1.0 and 1.2 s (predicted 1.1) and a single run. The best
    constant is one of the measured values: 1.0 misses the 1.2 s row by 1/6, 1.2 the 1.0 s row by 0.2 -> 1/6 over
    2 rows; the model misses both by 0.1 / 1.0 and 0.1 / 1.2."""
    def row(i: str, gpu: str, config: str, measured: float, predicted: float):  # type: ignore[no-untyped-def]
        return heldout.HeldRow(i, "g", "f", "hopper", "bf16", False, 1, 1, 8, measured, predicted, 1.0, 2.0, True,
                               config=config, gpu=gpu)

    rows = [row("a", "h100", "x", 1.0, 1.1), row("b", "h100", "x", 1.2, 1.1), row("c", "h100", "y", 1.0, 1.0),
            row("d", "h200", "x", 5.0, 1.0)]
    fams, n, floor, model = heldout.repeat_floor(rows)
    assert (fams, n) == (1, 2)
    assert floor == pytest.approx((1 - 1.0 / 1.2) / 2)
    assert model == pytest.approx((0.1 / 1.0 + 0.1 / 1.2) / 2)


def test_script_prints_the_summaries(heldout, evaluated, tmp_path) -> None:
    assert heldout.main(["--out", str(tmp_path)]) == 0
    text = (tmp_path / "heldout.md").read_text()
    for key in heldout.KEYS:
        assert f"| {key}: " in text
    assert "predicted to fit" in text


def test_what_if_is_diagnostic_only(heldout) -> None:
    """--what-if parses GEN.FIELD=VALUE / GPU.nvlink_domain_size=N, refuses anything else by name, and changes
    the price of the cases it names (the default run has no override)."""
    assert heldout.parse_what_if(["blackwell.attention=0.42", "gb200.nvlink_domain_size=64"]) == {
        ("blackwell", "attention"): 0.42, ("gb200", "nvlink_domain_size"): 64.0}
    with pytest.raises(SystemExit, match="GEN.FIELD=VALUE"):
        heldout.parse_what_if(["blackwell.no_such_field=1"])
    path = heldout.fidelity.DATA / "more_runs.json"
    base, _, _ = heldout.evaluate([path])
    faster, _, _ = heldout.evaluate([path], heldout.parse_what_if(["blackwell.attention=0.5"]))
    by_id = {r.id: r.predicted_s for r in faster}
    bw = [r for r in base if r.generation == "blackwell"]
    # a faster kernel can leave comm exposed: never slower (host-bound rows: the same time, to rounding)
    assert all(by_id[r.id] <= r.predicted_s * (1 + 1e-12) for r in bw)
    assert sum(by_id[r.id] < r.predicted_s * 0.99 for r in bw) > len(bw) // 2
    assert all(by_id[r.id] == r.predicted_s for r in base if r.generation == "hopper")


def test_throughput_derived_from_tflops_is_nemos_count(heldout) -> None:
    """Where only Model TFLOP/s is published (NeMo long-sequence tables), tokens/s = TFLOP/s / NeMo's FLOPs per token
    (nemo/utils/flops_formulas.py llama2/llama3 before the causal discount: L h^2 (12 + 12 g/a + 18 f/h + 12 s/h
    + 6 V/(L h)), V from NeMo's LLM_VOCAB_SIZE_MAP), recomputed here from the catalog model."""
    from autoplan.catalog import load_model

    vocab = {"llama2-7b": 32000, "llama3-8b": 128256}
    checked = 0
    for path in heldout.default_files():
        for c in json.loads(path.read_text())["cases"]:
            if c["measured"]["basis"] != "derived.tokens_per_s_from_model_tflops":
                continue
            m = load_model(c["model"]["catalog"])
            L, h, f, a, g, s = (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads,
                                m.num_kv_heads, c["job"]["seq_len"])
            v = vocab[c["model"]["catalog"]]
            per_token = L * h * h * (12 + 12 * g / a + 18 * f / h + 12 * s / h + 6 * v / (L * h))
            assert c["measured"]["tokens_per_s_per_gpu"] == pytest.approx(
                c["measured"]["tflops_per_gpu"] * 1e12 / per_token, abs=0.051), c["id"]  # stored to 0.1 tok/s
            checked += 1
    assert checked >= 17


def test_moe_residuals_spread_the_error_over_layer_micro_batches(heldout, evaluated) -> None:
    """``--moe-residuals``: each MoE run's (measured − predicted) over the binding stage's layer-micro-batches, with
    the routed experts per rank and the knobs it ran; dense runs are not listed."""
    rows, _, _ = evaluated
    moe = [r for r in rows if r.moe]
    assert moe and all(r.local_experts >= 1 and r.microbatches >= 1 and r.stage_layers >= 1 for r in moe)
    table = heldout.moe_residuals(rows)
    # (26.02's 30B B200 row and, from s11-hostfit, 26.04.01's 235B B200 row calibrate the MoE host cost: not held out)
    r = next(r for r in moe if r.id == "mb26.02.01_Qwen3_235B_a22B_b300_256gpu_MXFP8")
    assert (r.mbs, r.local_experts, r.microbatches, r.stage_layers) == (1, 128 // 8, 256, 94 // 8 + 1)
    excess = (r.measured_s - r.predicted_s) / (r.microbatches * r.stage_layers) * 1e3
    assert f"| {r.id} | 1 | 16 | {r.error:+.1%} | {excess:+.2f} | moe_force_balance=True |" in table
    # s11-a2a: the host side of the view: the catalog's host issue per layer-micro-batch where the host issues the
    # experts (16 local: per layer + 16 x per expert), none where a CUDA graph holds them (25.09's whole-layer graphs)
    fidelity = heldout.fidelity
    eff = next(run for c, run in fidelity.host_calibration_runs() if c["id"] == "mb2602_Qwen3_30B_a3B_b200_8gpu_MXFP8"
               ).cluster_with().efficiency
    assert r.host_issue_ms == pytest.approx((eff.moe_host_s_per_layer + 16 * eff.moe_host_s_per_expert) * 1e3)
    assert (r.pp, r.vp) == (8, 4) and 0 < r.host_priced_ms < r.host_issue_ms
    graphed = next(r for r in moe if r.id == "mb2509_Qwen3_30B_a3B_gb200_8gpu")
    assert graphed.host_issue_ms == 0.0 and graphed.host_priced_ms == 0.0
    assert "A2A overlap with host-issued experts, alltoall / deepep, pp > 1" in table
    assert not any(f"| {d.id} |" in table for d in rows if not d.moe)


def test_kimi_k2_rows_are_the_published_model(heldout) -> None:
    """The Kimi-K2 rows (more_runs_bridge2.json, inline from Megatron-Bridge's KimiK2Provider) resolve to one spec whose
    size is the published one — '32 billion activated parameters and 1 trillion total parameters' (Kimi K2 report,
    arXiv 2507.20534) — counted the way that gives the catalog's DeepSeek-V3 its paper's 671B total / 37B active."""
    fidelity = heldout.fidelity
    from autoplan.calibrate import resolve_run
    from autoplan.catalog.registry import catalog_model

    ds = catalog_model("deepseek-v3")
    assert ds.num_params == pytest.approx(671e9, rel=0.01) and 37e9 <= ds.num_active_params <= 38e9
    cases, rules = fidelity.load_cases(fidelity.DATA / "more_runs_bridge2.json")
    kimi = [resolve_run(fidelity.to_run(c, rules)).model for c in cases if c["id"].split("_")[1] == "Kimi"]
    assert len(kimi) == 4 and all(m.model_dump(exclude={"name"}) == kimi[0].model_dump(exclude={"name"}) for m in kimi)
    # the rows name the catalog entry (each resolved model takes its row's name)
    assert kimi[0].model_dump(exclude={"name"}) == catalog_model("kimi-k2").model_dump(exclude={"name"})
    k = kimi[0]
    assert k.num_experts == 384 and k.moe_top_k == 8 and k.num_shared_experts == 1 and k.first_dense_layers == 1
    assert 1.0e12 <= k.num_params <= 1.05e12
    assert 32e9 <= k.num_active_params <= 33.5e9


def test_memory_summary_scores_the_published_peaks_against_reserved(heldout, evaluated) -> None:
    """The held-out runs that publish a peak (torchtitan logs: max_memory_reserved) are scored against the
    predicted reserved peak; the line's MAPE recomputes from the rows."""
    rows = evaluated[0]
    peaks = [r for r in rows if r.measured_peak_gib > 0]
    assert peaks and all(r.allocated_gib < r.reserved_gib for r in peaks)
    mape = sum(abs(r.reserved_gib / r.measured_peak_gib - 1) for r in peaks) / len(peaks)
    line = heldout.memory_summary(rows)
    assert f"{len(peaks)} held-out published peaks" in line and f"MAPE {mape:.1%}" in line
    # REGRESSION GUARD: 25.8% (mean +22.5%) until s7-ratios priced torchtitan's compiled loss at its 4 B per logit
    # (targets.common.TORCH_LOSS_BYTES_PER_LOGIT): 8.9%, worst +24.3% (the torchao tutorial's H100 rows); 12.0%,
    # worst +33.5% since s10-units priced FSDP2's output-layer / embedding units (memory.zero3_head_unit_bytes,
    # +1.1..2.6 GiB on the 8B FSDP rows, every one of them compiled): compiled blocks are priced with eager's saved
    # activations, and the calibration's eager/compiled pairs (priced alike) measure 5 GiB apart (fidelity.py); 8.9%,
    # worst +26.4% since a compiled block's op-SAC drops the down projection's output (memory.unread_by_backward); 9.0%,
    # worst +28.6% since FSDP2's gathered units and reduce-scatter inputs are priced whole, not less the rank's own
    # shard (tests/test_fsdp2_buffers.py reads them off torch's code): +0.6 GiB on those same 8B rows
    worst = max(abs(r.reserved_gib / r.measured_peak_gib - 1) for r in peaks)
    assert mape <= 0.090 + MARGIN and worst <= 0.286 + MARGIN, (mape, worst)


def test_layouts_that_cannot_fit_are_over_the_whole_hbm(heldout, evaluated) -> None:
    """A case may say its published layout cannot have trained (``layout_cannot_fit``: why, and the ``recipe`` layout
    of its release): only where the prediction's allocated peak plus the CUDA context alone, every term from the code
    and no allocator reserve or headroom, is over the whole HBM — a near miss cannot be set apart — and the recipe's
    layout, priced the same way, fits under the default headroom. The fits line lists them apart."""
    import copy

    from cost_models.estimate import estimate

    rows, _, _ = evaluated
    flagged = {r.id: r for r in rows if r.cannot_fit}
    assert len(flagged) >= 3
    for path in heldout.default_files():
        cases, rules = heldout.fidelity.load_cases(path)
        for case in cases:
            entry = rules["groups"][case["group"]].get("cases", {}).get(case["id"], {}).get("layout_cannot_fit")
            if not entry:
                continue
            assert case["id"] in flagged and entry["why"] and entry["recipe"], case["id"]
            run = heldout.resolve_run(heldout.fidelity.to_run(case, rules))
            pred = estimate(run.model, run.cluster_with(), run.job, run.parallel, target=run.target,
                            software=run.knobs, check=False)
            hbm = pred.memory_limit_gib + pred.memory_headroom_gib
            assert not pred.fits and pred.peak_allocated_gib + pred.memory_gib["runtime"] > hbm, case["id"]
            alt = copy.deepcopy(case)
            for k, v in entry["recipe"].items():
                (alt["job"] if k == "micro_batch_size" else alt["parallel"])[k] = v
            run = heldout.resolve_run(heldout.fidelity.to_run(alt, rules))
            assert estimate(run.model, run.cluster_with(), run.job, run.parallel, target=run.target,
                            software=run.knobs, check=False).fits, case["id"]


# Runs that really trained whose allocated peak + CUDA context alone is over the whole HBM: the Llama 3 paper's 405B
# rows priced with zero 1 (fp32 gradients unsharded, 11.9 GiB; §3.3.2 says 'Our use of FSDP for Llama 3 shards optimizer
# states and gradients', but the megatron target's zero 2 is Megatron-FSDP, whose exposed per-chunk reduce-scatter
# prices the 8k-token rows +47..+50% slow: the group's target_basis and memory_basis). Issue 12, session 15.
OVER_THE_WHOLE_HBM = {"llama3_405b_t4_8192gpu_8k", "llama3_405b_t4_16384gpu_8k", "llama3_405b_t4_16384gpu_128k"}


def test_trained_runs_predicted_not_to_fit_are_near_misses_but_meta_405b(evaluated) -> None:
    """Of the runs that trained and are predicted not to fit (their layout not set apart by ``layout_cannot_fit``), each
    one's allocated peak plus the CUDA context and NCCL buffers is inside the whole HBM — the allocator reserve and the
    default headroom make the miss (e.g. Llama3-70B on GB200 with Megatron-FSDP and 40 layers offloaded: 172.5 + 1.5 of
    186 GiB) — except the listed Meta rows. A change that counts more allocated memory for a run that trained shows
    up here."""
    from cost_models.memory import GIB, runtime_overhead_bytes
    from cost_models.specs import DEFAULT_MEMORY_HEADROOM

    rows, _, _ = evaluated
    missed = [r for r in rows if not r.fits and not r.cannot_fit]
    assert missed
    runtime = runtime_overhead_bytes() / GIB
    over = {r.id for r in missed if r.allocated_gib + runtime > r.limit_gib / (1 - DEFAULT_MEMORY_HEADROOM)}
    assert over == OVER_THE_WHOLE_HBM


def test_nemotron_3_super_rows_run_without_tp_comm_overlap(heldout) -> None:
    """Megatron-Bridge's Nemotron 3 Super recipes build no CommOverlapConfig (recipes/common.py _pretrain_common
    comm_overlap=None; the perf configs set none at v0.4.0..v0.6.0), so Megatron-Core's tp_comm_overlap default False
    holds: the tp-2 GB200 MXFP8 rows must not take the megatron target's default (True with tp > 1 and SP)."""
    fidelity = heldout.fidelity
    from autoplan.calibrate import resolve_run
    from cost_models.estimate import runtime_for

    cases, rules = fidelity.load_cases(fidelity.DATA / "more_runs_bridge2.json")
    runs = [resolve_run(fidelity.to_run(c, rules)) for c in cases if "Nemotron_3_Super" in c["id"]]
    tp2 = [r for r in runs if r.parallel.tp > 1 and r.job.precision != "nvfp4"]
    assert len(tp2) == 5 and all(r.parallel.sequence_parallel for r in tp2)
    for r in runs:
        rt = runtime_for(r.target, r.job, r.cluster_with(), r.parallel, r.knobs)
        assert rt.tp_comm_overlap is False, r


def test_bridge_card_rows_run_their_recipes_routing(heldout) -> None:
    """more_runs_bridge_cards.json: the cards' performance recipes force-balance the experts (mock data), the
    functional pretraining runs route naturally (the commands' moe_router_force_load_balancing=false, the recipes'
    natural-routing configs); the Nemotron 3 Super H100 recipe pads experts to a 1.10 capacity; no card row is a
    calibration or host-calibration row (held out, never fitted)."""
    fidelity = heldout.fidelity
    from autoplan.calibrate import resolve_run
    from cost_models.estimate import runtime_for

    cases, rules = fidelity.load_cases(fidelity.DATA / "more_runs_bridge_cards.json")
    assert not fidelity.calibration_groups(rules) and not fidelity.host_calibration_groups(rules)
    assert len(cases) == 17 and all("card.yaml" in c["source"] for c in cases)
    skipped = {cid for cid, _ in fidelity.skipped_cases(fidelity.DATA / "more_runs_bridge_cards.json")}
    assert len(skipped) == 6  # GLM-5.2 (deterministic mode), DeepSeek-V4 Flash, the Qwen3.6 / 3.8 Gated-DeltaNet VLM jobs
    seen = set()
    for c in (c for c in cases if c["id"] not in skipped):
        run = resolve_run(fidelity.to_run(c, rules))
        rt = runtime_for(run.target, run.job, run.cluster_with(), run.parallel, run.knobs)
        if run.model.num_experts:
            perf = c["group"] == "megatron_bridge_cards_perf_2026_08"
            assert rt.moe_force_balance is perf, c["id"]
            seen.add(perf)
        if "Super_h100" in c["id"]:
            assert rt.moe_capacity_factor == pytest.approx(1.1) and run.parallel.recompute_modules, c["id"]
    assert seen == {True, False}
