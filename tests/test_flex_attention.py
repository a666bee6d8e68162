"""torchtitan 0.3.0 runs its language models' attention on FlexAttention (or varlen FlashAttention), never SDPA:
the catalog's FlexAttention rates recomputed from the H200 probe, the backend of every shipped flavor read from the
installed torchtitan, and the price that follows (Runtime.titan_attention, op_cost.titan_attention_rates)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.catalog.registry import efficiency_for
from cost_models.op_cost import titan_attention_rates
from cost_models.memory import graphs_for
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for
from cost_models.targets.torchtitan_models import ATTENTION_MODULE, SHIPPED

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
PROBE = DATA / "h200_flex_attention_probe_2026_12_04.json"
VARLEN = DATA / "h200_flex_attention_probe_2026_12_04_varlen.json"  # the second run: varlen and the GPT-OSS shape
JOB = JobSpec(global_batch_size=8, seq_len=8192)


def _rows(path: Path = PROBE) -> dict[tuple[str, str], dict]:
    return {(r["case"], r["kernel"]): r for r in json.loads(path.read_text())["rows"] if "error" not in r}


def test_catalog_rates_are_the_probes_time_ratios() -> None:
    """Each rate is cuDNN's time over compiled FlexAttention's (varlen FlashAttention's at GPT-OSS's shape) at the
    probe's shape (forward; backward = forward + backward less the forward): hopper [meas], blackwell the same
    [prior]."""
    rows = _rows()
    want = {}
    for case, suffix in (("llama3_8b", ""), ("dsv3_16b", "_mla")):
        c, f = rows[(case, "cudnn")], rows[(case, "flex")]
        want[f"attention_flex{suffix}_fwd"] = c["fwd_ms"] / f["fwd_ms"]
        want[f"attention_flex{suffix}_bwd"] = c["bwd_ms"] / f["bwd_ms"]
    second = _rows(VARLEN)
    c, v = second[("gpt_oss_20b", "cudnn")], second[("gpt_oss_20b", "varlen")]
    want["attention_varlen_fwd"], want["attention_varlen_bwd"] = c["fwd_ms"] / v["fwd_ms"], c["bwd_ms"] / v["bwd_ms"]
    # the cuDNN reference repeats across the two runs within 1%
    assert second[("llama3_8b", "cudnn")]["fwd_ms"] == pytest.approx(rows[("llama3_8b", "cudnn")]["fwd_ms"], rel=0.01)
    for gen in ("hopper", "blackwell"):
        eff = efficiency_for(gen)
        for field, value in want.items():
            assert getattr(eff, field) == pytest.approx(value, abs=6e-5), (gen, field)
    # FlexAttention is slower than cuDNN at both shapes, the MLA backward most (q/k 192 rounded to 256)
    assert all(v < 1 for v in want.values()) and want["attention_flex_mla_bwd"] < 0.3


def test_every_shipped_flavor_builds_the_backend_priced() -> None:
    """The installed torchtitan 0.3.0: ``get_attention_config`` refuses SDPA for a language model, and each shipped
    flavor's model_registry (what the emitted config module builds) and config function (what the emitted command
    line names) build the attention kernel ``TitanModel.attn_backend`` says."""
    pytest.importorskip("torchtitan")
    from torchtitan.models.common.config_utils import get_attention_config

    with pytest.raises(ValueError, match="sdpa is no longer supported"):
        get_attention_config("sdpa")
    for t in SHIPPED:
        pkg = importlib.import_module(f"torchtitan.models.{t.module}")
        specs = [pkg.model_registry(t.flavor).model]
        if t.config_fn and t.config_precision == "bf16":  # an fp8 one builds torchao's converter (not installed)
            fn = getattr(importlib.import_module(f"torchtitan.models.{t.module}.config_registry"), t.config_fn)
            specs.append(fn().model_spec.model)
        for spec in specs:
            got = {type(layer.attention.inner_attention).__qualname__.split(".")[0] for layer in spec.layers}
            assert got == {ATTENTION_MODULE[t.attn_backend]}, (t.module, t.flavor, got)


@pytest.mark.parametrize(("model", "gpus", "par", "rates"), [
    ("llama3-8b", 8, ParallelConfig(tp=1, zero_stage=3), ("attention_flex_fwd", "attention_flex_bwd")),
    ("deepseek-v3", 64, ParallelConfig(tp=1, ep=64, zero_stage=3),
     ("attention_flex_mla_fwd", "attention_flex_mla_bwd")),
])
def test_torchtitan_03_prices_flex_attention(model: str, gpus: int, par: ParallelConfig,
                                             rates: tuple[str, str]) -> None:
    """The attention core of a torchtitan 0.3.0 plan costs the cuDNN-priced time over the FlexAttention rates (the
    MLA pair for DeepSeek-V3, the varlen pair for GPT-OSS); the 2025 reference profile (SDPA) keeps the SDPA price."""
    from cost_models.op_cost import op_compute

    m, cluster = load_model(model), build_cluster("h100-sxm", gpus)
    graph = graphs_for(m, JOB.seq_len)["moe" if m.is_moe else "dense"]
    attn = next(op for op in graph.ops if op.kind == "attention")
    new = runtime_for("torchtitan", JOB, cluster, par, Software(compile=True))
    old = runtime_for("torchtitan-2025-08", JOB, cluster, par, Software(compile=True))
    assert new.titan_attention and not old.titan_attention
    eff = cluster.efficiency
    assert titan_attention_rates(m, cluster, new) == (getattr(eff, rates[0]), getattr(eff, rates[1]))
    assert titan_attention_rates(m, cluster, old) is None
    from dataclasses import replace

    flex, sdpa = (op_compute(attn, graph, m, cluster, JOB, par, rt)
                  for rt in (new, replace(new, titan_attention=False)))
    assert flex.attn_f == pytest.approx(sdpa.attn_f / getattr(eff, rates[0]), rel=1e-12)
    assert flex.attn_b == pytest.approx(sdpa.attn_b / getattr(eff, rates[1]), rel=1e-12)
    gpt = load_model("gpt-oss-20b")
    assert titan_attention_rates(gpt, cluster, new) == (eff.attention_varlen_fwd, eff.attention_varlen_bwd)
    assert titan_attention_rates(gpt, build_cluster("a100-80g", 8), new) is None  # no rate on ampere: cuDNN's


def test_probe_shapes_are_the_models(monkeypatch) -> None:  # noqa: ANN001
    """The probe times the catalog models' own attention shapes (heads, KV heads, head dims)."""
    pytest.importorskip("torch")
    from benchmark_modules import load_benchmark

    monkeypatch.syspath_prepend(str(DATA.parent / "gpu"))  # the probes import probe_common beside them
    probe = load_benchmark("gpu/flex_attention_probe", "flex_attention_probe")
    for case, name in (("llama3_8b", "llama3-8b"), ("gpt_oss_20b", "gpt-oss-20b")):
        m, shape = load_model(name), probe.SHAPES[case]
        assert (shape["h"], shape["kv"], shape["d_qk"], shape["d_v"]) == \
            (m.num_attention_heads, m.num_kv_heads, m.head_dim_resolved, m.head_dim_resolved), case
    mla, shape = load_model("deepseek-v3").mla, probe.SHAPES["dsv3_16b"]
    assert (shape["d_qk"], shape["d_v"]) == (mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim)
