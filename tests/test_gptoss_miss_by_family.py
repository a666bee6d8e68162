"""Issue 12 (s26): how much of the GPT-OSS-120B Megatron-Bridge miss is GPT-OSS's own. Each held-out row's miss as
a share of the compute the model prices for it (GEMMs 3x forward, attention core, memory-bound kernels, summed over
its layers and micro-batches): ``(measured - predicted) / compute``.

- On H100 in BF16 only GPT-OSS misses: Llama 4 Maverick (LLMB 25.05) and Nemotron-3 Super (Bridge card) BF16 rows
  are priced within 0.1 of their compute, GPT-OSS-120B's BF16 rows (tp 1 pp 4 ep 8) miss 0.15-0.19 of theirs.
- On Blackwell most of GPT-OSS's miss is one other MoE models without sinks / window / biases / clamp have too:
  GB200: GPT-OSS 0.58-0.65, Maverick BF16 0.37-0.40, Nemotron-3 Super MXFP8 / NVFP4 (same releases) 0.57-0.71;
  GB300 0.40-0.42 against Nemotron-3 Super 0.32-0.38; B200 0.53-0.58 against 0.29-0.51. GPT-OSS's excess over
  Maverick on GB200 is about its own H100 miss. (B300 is left out: Nemotron-3 Super is priced 0.25-0.6 SLOW there,
  another miss.) Qwen3-30B / 235B MXFP8 on the same GPUs are priced right, so the shared part is not every
  Blackwell row: it needs a cause common to Maverick, Nemotron-3 Super and GPT-OSS (none is found here).
So the GPT-OSS-specific piece is ~0.05-0.25 of the priced compute (H100: ~2.3 ms per layer-micro-batch of 4096
tokens); the rest of its Blackwell miss is not GPT-OSS's. benchmarks/gpu/gptoss_glue_probe.py times the
Megatron-Core glue that only GPT-OSS runs, against its price."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from benchmark_modules import heldout_rows
from cost_models.estimate import estimate
from cost_models.op_cost import op_compute
from cost_models.opgraph import layer_graph, layer_kinds
from cost_models.quant_layout import op_job
from cost_models.targets import runtime_for

FILES = ("more_runs_gptoss.json", "more_runs_llama4.json", "more_runs_bridge2.json", "more_runs_bridge_cards.json")
GPT_OSS_BF16 = ("mb26.02.01_GPT_OSS_120B", "mb26.04_GPT_OSS_120B", "mb26.04.01_GPT_OSS_120B")


def _row(case: dict[str, Any], rules: dict[str, Any], heldout: Any, fidelity: Any) -> dict[str, Any]:
    run = heldout.resolve_run(fidelity.to_run(case, rules))
    cluster, par, job = run.cluster_with(), run.parallel, run.job
    pred = estimate(run.model, cluster, job, par, target=run.target, software=run.knobs, check=False)
    rt = runtime_for(run.target, job, cluster, par, run.knobs)
    per_mb = 0.0  # one micro-batch through every layer of the model on its rank's share (pp divides below)
    for kind, n in Counter(layer_kinds(run.model)).items():
        graph = layer_graph(run.model, kind, job.seq_len)
        for op in graph.ops:
            op_j, op_rt = op_job(op, graph, job, rt)
            c = op_compute(op, graph, run.model, cluster, op_j, par, op_rt)
            per_mb += n * (3 * c.gemm_f + c.attn_f + c.attn_b + c.mem_f + c.mem_b)
    compute = per_mb * pred.num_microbatches / par.pp
    return {"share": (run.measured_step_time_s - pred.step_time_s) / compute, "gpu": case["cluster"]["gpu"]}


def _kept(case: dict[str, Any]) -> bool:
    cid = case["id"]
    return (cid.startswith(GPT_OSS_BF16) or "LLAMA4-Maverick" in cid or "Nemotron_3_Super" in cid
            or (cid.startswith("mb26.04_Qwen3") and "natural" not in cid))


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, Any]]:
    return heldout_rows(FILES, _kept, _row)


def _shares(rows: dict[str, dict[str, Any]], what: str, gpu: str) -> list[float]:
    out = [r["share"] for cid, r in rows.items() if what in cid and r["gpu"] == gpu]
    assert out, (what, gpu)
    return out


def test_on_h100_only_gpt_oss_misses(rows) -> None:  # type: ignore[no-untyped-def]
    oss = _shares(rows, "GPT_OSS_120B", "h100-sxm")
    others = _shares(rows, "Maverick_h100-sxm_512gpu_BF16", "h100-sxm") \
        + _shares(rows, "mbcard_Nemotron_3_Super_h100_64gpu_BF16", "h100-sxm")
    assert len(oss) == 3 and len(others) == 3
    assert min(oss) > 0.14
    assert max(abs(s) for s in others) < 0.1


def test_most_of_the_gb200_miss_is_shared_with_maverick(rows) -> None:  # type: ignore[no-untyped-def]
    oss = float(np.mean(_shares(rows, "GPT_OSS_120B", "gb200")))
    maverick_bf16 = float(np.mean(_shares(rows, "Maverick_gb200_128gpu_BF16", "gb200")
                                  + _shares(rows, "Maverick_gb200_256gpu_BF16", "gb200")
                                  + _shares(rows, "Maverick_gb200_512gpu_BF16", "gb200")))
    h100_oss = float(np.mean(_shares(rows, "GPT_OSS_120B", "h100-sxm")))
    assert maverick_bf16 > 0.3  # a model without sinks / window / biases / clamp misses on GB200 too
    assert maverick_bf16 > 0.5 * oss  # ...more than half of what GPT-OSS misses there
    assert abs((oss - maverick_bf16) - h100_oss) < 0.15  # GPT-OSS's own part: about its H100 miss


@pytest.mark.parametrize("gpu", ["gb200", "gb300", "b200"])
def test_gpt_oss_misses_about_as_nemotron_3_super_on_blackwell(rows, gpu: str) -> None:  # type: ignore[no-untyped-def]
    oss = float(np.mean(_shares(rows, "GPT_OSS_120B", gpu)))
    nemo = float(np.mean([r["share"] for cid, r in rows.items() if "Nemotron_3_Super" in cid and r["gpu"] == gpu
                          and cid.startswith(("mb26.04_", "mb26.04.01_"))]))
    assert nemo > 0.3
    assert -0.1 < oss - nemo < 0.25


def test_qwen3_on_blackwell_is_the_control(rows) -> None:  # type: ignore[no-untyped-def]
    qwen = [r["share"] for cid, r in rows.items() if "Qwen3" in cid and r["gpu"] in ("gb200", "gb300", "b200", "b300")]
    assert len(qwen) >= 6
    assert max(abs(s) for s in qwen) < 0.2
