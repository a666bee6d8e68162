"""The s26-titan device probes (benchmarks/gpu/sdpa_backend_probe.py, rowwise_scaled_mm_probe.py) time the shapes
of the held-out rows they are to decide about: each probe shape recomputed from the case record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_modules import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _case(path: str, case_id: str) -> dict:
    return next(c for c in json.loads((ROOT / path).read_text())["cases"] if c["id"] == case_id)


@pytest.fixture()
def probes(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))  # the probes import probe_common beside them
    return (load_benchmark("gpu/sdpa_backend_probe", "sdpa_backend_probe"),
            load_benchmark("gpu/rowwise_scaled_mm_probe", "rowwise_scaled_mm_probe"))


def test_sdpa_probe_shapes_are_the_rows(probes) -> None:
    sdpa, _ = probes
    ds = _case("benchmarks/data/more_runs_torchtitan_moe.json", "tt_dsv3_16b_h100_8gpu_sdpa")
    mla, job = ds["model"]["mla"], ds["job"]
    assert sdpa.SHAPES["dsv3_16b"] == {"b": job["micro_batch_size"], "h": ds["model"]["num_attention_heads"],
                                       "s": job["seq_len"], "d_qk": mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"],
                                       "d_v": mla["v_head_dim"]}
    ll = _case("benchmarks/data/more_runs_torchtitan.json", "torchao_b200_8B_bf16")
    m = ll["model"]
    d = m["hidden_size"] // m["num_attention_heads"]
    assert sdpa.SHAPES["llama3_8b"] == {"b": ll["job"]["micro_batch_size"], "h": m["num_attention_heads"],
                                        "s": ll["job"]["seq_len"], "d_qk": d, "d_v": d}


@pytest.mark.parametrize("case_id, prefix", [("tt_asynctp_8B_rowwise_vanillatp", "8b_tp8"),
                                             ("tt_asynctp_70B_rowwise_vanillatp", "70b_tp8"),
                                             ("torchao_b200_8B_rowwise", "8b")])
def test_rowwise_probe_shapes_are_the_rows_per_rank_gemms(probes, case_id: str, prefix: str) -> None:
    _, mm = probes
    c = _case("benchmarks/data/more_runs_torchtitan.json", case_id)
    m, job, t = c["model"], c["job"], c["parallel"]["tp"]
    tokens = job["micro_batch_size"] * job["seq_len"]  # SP gathers the sequence before each column-parallel GEMM
    h, f, kv = m["hidden_size"], m["ffn_hidden_size"], m["num_kv_heads"] * m["hidden_size"] // m["num_attention_heads"]
    want = {"wq": (tokens, h, h // t), "wkv": (tokens, h, kv // t), "wo": (tokens, h // t, h),
            "w13": (tokens, h, f // t), "w2": (tokens, f // t, h)}
    got = {name: mm.SHAPES[f"{prefix}_{name}"] for name in want}
    assert got == want
