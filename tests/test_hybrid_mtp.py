"""Multi-token prediction on a hybrid (Mamba-2 / attention / MoE) stack: Nemotron 3 Super's '*E' block.

Megatron-Core builds it from core_v0.17.0rc0 on (a block of hybrid layers per MTP depth between enorm/hnorm/eh_proj
and a final norm, the shared head and loss; megatron/core/models/hybrid/ at core_v0.18.0); 0.16.1, the pip package
autoplan validates against, has none: the megatron target's ``megatron_core`` knob decides. Numbers here are
recomputed from the model's published shapes, not read back from the cost model's helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from autoplan.catalog import build_cluster, load_model
from autoplan.catalog.hf import spec_from_hf_config
from autoplan.errors import UserInputError
from cost_models.errors import ConfigError
from cost_models.estimate import estimate, head_cost
from cost_models.layer_cost import layer_cost
from cost_models.memory import graphs_for, stage_params
from cost_models.mtp import mtp_stage_params
from cost_models.specs import JobSpec, ModelSpec, ParallelConfig
from cost_models.targets import Software, runtime_for

SUPER = "nemotron-3-super-120b-a12b"
HF = Path(__file__).parent / "data" / "hf" / "nemotron-3-nano-30b-a3b.json"
JOB = JobSpec(global_batch_size=512, seq_len=8192, precision="fp8")
PAR = ParallelConfig(tp=2, pp=1, cp=1, ep=64, micro_batch_size=1, zero_stage=1, sequence_parallel=True)
CORE18 = Software(megatron_core="0.18.0", fp8_recipe="mxfp8")


def _without_mtp(m: ModelSpec) -> ModelSpec:
    return m.model_copy(update={"arch": m.arch.model_copy(update={"mtp_layers": 0, "mtp_pattern": None,
                                                                   "mtp_repeated": False})})


def _with_arch(m: ModelSpec, **arch: object) -> dict:
    data = m.model_dump()
    data["arch"] |= arch
    return data


# ---- the spec ----------------------------------------------------------------------------------------------------
def test_catalog_super_carries_its_mtp_block() -> None:
    m = load_model(SUPER)
    assert (m.arch.mtp_layers, m.arch.mtp_pattern, m.arch.mtp_repeated) == (2, "*E", True)
    assert m.num_layers == 88 and (m.hybrid_pattern or "").count("*") == 8
    assert 120e9 < m.num_params < 121e9 and 12e9 < m.num_active_params < 13e9  # "120B-A12B"


@pytest.mark.parametrize(("arch", "message"), [
    ({"mtp_pattern": "*X"}, r"mtp_pattern '\*X': symbol\(s\) \['X'\].*e\.g\. '\*E'"),
    ({"mtp_pattern": "*E/*E"}, r"symbol\(s\) \['/'\]"),
    ({"mtp_pattern": None}, r"mtp_layers=2 on a hybrid stack needs arch.mtp_pattern"),
    ({"mtp_layers": 0, "mtp_repeated": False}, r"need mtp_layers >= 1"),
    ({"mtp_layers": 0, "mtp_pattern": None}, r"mtp_repeated \(True\).*need mtp_layers >= 1"),
])
def test_hybrid_mtp_spec_refusals(arch: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModelSpec.model_validate(_with_arch(load_model(SUPER), **arch))


def test_mtp_block_needs_its_layers_and_a_hybrid_stack() -> None:
    dense_hybrid = load_model("nemotron-h-8b")  # no experts
    with pytest.raises(ValidationError, match=r"mtp_pattern '\*E' has E layers: it needs num_experts > 0"):
        ModelSpec.model_validate(_with_arch(dense_hybrid, mtp_layers=1, mtp_pattern="*E"))
    ok = ModelSpec.model_validate(_with_arch(dense_hybrid, mtp_layers=1, mtp_pattern="M-"))
    assert ok.arch.mtp_pattern == "M-"
    with pytest.raises(ValidationError, match=r"mtp_pattern '\*E' is a hybrid stack's MTP block"):
        ModelSpec.model_validate(_with_arch(load_model("deepseek-v3"), mtp_pattern="*E"))


def test_hf_reader_takes_the_mtp_block() -> None:
    cfg = json.loads(HF.read_text()) | {"num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*E"}
    m = spec_from_hf_config(cfg, name="n")
    assert (m.arch.mtp_layers, m.arch.mtp_pattern, m.arch.mtp_repeated) == (1, "*E", False)
    cfg2 = {k: v for k, v in cfg.items() if k != "mtp_hybrid_override_pattern"} | {
        "mtp_layers_block_type": ["attention", "moe"]}
    assert spec_from_hf_config(cfg2, name="n") == m
    with pytest.raises(UserInputError, match=r"mtp_layers_block_type.*the same layers as mtp_hybrid_override_pattern"):
        spec_from_hf_config(cfg | {"mtp_layers_block_type": ["moe"]}, name="n")
    no_mtp = spec_from_hf_config(json.loads(HF.read_text()) | {"mtp_hybrid_override_pattern": "*E"}, name="n")
    assert no_mtp.arch.mtp_layers == 0 and no_mtp.arch.mtp_pattern is None


# ---- parameters and FLOPs, recomputed from the shapes --------------------------------------------------------------
def _super_block_params() -> tuple[int, int, int, int]:
    """(attention layer, MoE layer, routed experts, latent projections) of Nemotron 3 Super from its published
    shapes (hidden 4096, 32 x 128 queries, 2 KV heads, 512 experts of 2688 at latent 1024 (squared ReLU: fc1 + fc2),
    2 shared experts of 2688 at h, sigmoid router with no bias), RMSNorm pre-norms of h."""
    h, q, kv, e, f, lat = 4096, 32 * 128, 2 * 128, 512, 2688, 1024
    attention = h * (q + 2 * kv) + q * h + h
    experts = e * 2 * lat * f
    latent = 2 * h * lat
    moe = h * e + experts + 2 * (2 * h * f) + latent + h
    return attention, moe, experts, latent


def test_mtp_params_of_super_recomputed() -> None:
    m = load_model(SUPER)
    attention, moe, experts, latent = _super_block_params()
    h = 4096
    one = attention + moe + 2 * h * h + 3 * h  # block + eh_proj (2h -> h) + enorm, hnorm, final norm
    assert m.mtp_params == one  # mtp_use_repeated_layer: one module's weights for both depths
    two = ModelSpec.model_validate(_with_arch(m, mtp_repeated=False))
    assert two.mtp_params == 2 * one
    # on a last-stage rank (tp 2, ep 64): norms and the latent projections whole, the rest over TP, experts over EP
    dense, expert, _ = mtp_stage_params(m, 2, 64)
    assert expert == pytest.approx(experts / 64)
    assert dense == pytest.approx((attention - h) / 2 + h + (moe - experts - h - latent) / 2 + h + latent
                                  + 2 * h * h / 2 + 3 * h)
    base = stage_params(_without_mtp(m), PAR, list(range(88)), first=True, last=True)
    with_mtp = stage_params(m, PAR, list(range(88)), first=True, last=True)
    assert with_mtp.dense - base.dense == pytest.approx(dense) and with_mtp.expert - base.expert == pytest.approx(
        expert)


def test_mtp_flops_of_super_recomputed() -> None:
    """Model FLOPs per token that the MTP depths add, 3 x 2 per weight of each GEMM (Megatron's count): per depth
    the head (h x V), the attention layer's projections and core (non-causal, seq keys), the MoE layer's active
    weights (router, top 22 latent experts, 2 shared experts, latent projections) and eh_proj (2h x h)."""
    m = load_model(SUPER)
    cl = build_cluster("gb300", 64)
    h, V, q, kv, s, e, f, lat = 4096, 131072, 32 * 128, 2 * 128, 8192, 512, 2688, 1024
    att = 6 * (h * (q + 2 * kv) + q * h) + 6 * 2 * q * s
    moe = 6 * (h * e + 22 * 2 * lat * f + 2 * 2 * h * f + 2 * h * lat)
    per_depth = 6 * h * V + att + moe + 6 * 2 * h * h
    a = estimate(m, cl, JOB, PAR, target="megatron", software=CORE18)
    b = estimate(_without_mtp(m), cl, JOB, PAR, target="megatron", software=Software(fp8_recipe="mxfp8"))
    tokens = JOB.global_batch_size * JOB.seq_len

    def step_flops(p) -> float:  # type: ignore[no-untyped-def]
        return p.tflops_per_gpu * 1e12 * p.step_time_s * 64

    assert step_flops(a) - step_flops(b) == pytest.approx(2 * per_depth * tokens, rel=1e-9)


# ---- the version rule -------------------------------------------------------------------------------------------
def test_megatron_core_0161_refuses_hybrid_mtp_with_the_rule() -> None:
    m, cl = load_model(SUPER), build_cluster("gb300", 64)
    with pytest.raises(ConfigError) as err:
        estimate(m, cl, JOB, PAR, target="megatron", software=Software(fp8_recipe="mxfp8"))
    text = str(err.value)
    assert "megatron_core=0.16.1" in text and "core_v0.17.0rc0" in text and "hybrid_layer_allocation.py" in text
    assert "mamba_model.py @ core_v0.16.1" in text and "\n" not in text
    assert err.value.valid[0] == "megatron_core=0.17.0rc0" and "mtp_layers=0" in err.value.valid
    rt = runtime_for("megatron", JOB, cl, PAR, Software(fp8_recipe="mxfp8"))
    with pytest.raises(ConfigError, match="megatron_core=0.16.1"):  # search / emit / validate: check_runtime
        from cost_models.targets import PROFILES
        PROFILES["megatron"].check_runtime(m, cl, JOB, PAR, rt)
    for v in ("0.17.0rc0", "0.18.0", "0.19.0"):
        pred = estimate(m, cl, JOB, PAR, target="megatron", software=Software(megatron_core=v, fp8_recipe="mxfp8"))
        assert pred.step_time_s > 0 and pred.software["megatron_core"] == v  # the prediction says what it assumes
    # a hybrid stack without MTP is 0.16.1's (the default release is not listed among the knobs, as the profile's)
    plain = estimate(_without_mtp(m), cl, JOB, PAR, target="megatron", software=Software(fp8_recipe="mxfp8"))
    assert "megatron_core" not in plain.software
    with pytest.raises(ValidationError):
        Software(megatron_core="0.15.0")
    with pytest.raises(ConfigError, match="has no knob megatron_core"):
        runtime_for("torchtitan", JobSpec(global_batch_size=8, seq_len=2048), build_cluster("h100-sxm", 8),
                    ParallelConfig(zero_stage=3), Software(megatron_core="0.18.0"))


def test_emitter_refuses_hybrid_mtp_it_cannot_write() -> None:
    from autoplan.emit.megatron import mtp_not_emitted

    err = mtp_not_emitted(load_model(SUPER))
    assert err is not None and "--hybrid-layer-pattern <main>/<block>" in str(err) and "0.16.1" in str(err)
    assert mtp_not_emitted(load_model("deepseek-v3")) is None and mtp_not_emitted(load_model("nemotron-h-8b")) is None


# ---- the priced step ---------------------------------------------------------------------------------------------
def test_priced_step_runs_every_mtp_depth_on_the_last_stage() -> None:
    """pp 1: each of the 8 micro-batches runs 2 depths of (attention layer + MoE layer + head and loss) more, plus
    the projections; the layer and head costs are the main stack's (layer_cost / head_cost)."""
    m, cl = load_model(SUPER), build_cluster("gb300", 64)
    a = estimate(m, cl, JOB, PAR, target="megatron", software=CORE18)
    b = estimate(_without_mtp(m), cl, JOB, PAR, target="megatron", software=Software(fp8_recipe="mxfp8"))
    rt = runtime_for("megatron", JOB, cl, PAR, CORE18)
    g = graphs_for(m, JOB.seq_len)
    dp = 64 // PAR.tp
    block = sum(layer_cost(g[k], m, cl, JOB, PAR, dp, rt).total_s for k in ("attention", "moe"))
    head = head_cost(g["head"], cl, JOB, PAR, rt)
    micro = JOB.global_batch_size // dp
    assert a.step_time_s - b.step_time_s >= micro * 2 * (block + head) * 0.999
    assert a.step_time_s - b.step_time_s <= micro * 2 * (block + head) * 1.2  # + projections, DP tail
    assert a.peak_memory_gib > b.peak_memory_gib
