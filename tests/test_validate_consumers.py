"""The real consumers accept the emitted configs (needs the `validate` extra; skipped without it).

Each case runs the frameworks' own code in a checker process: Megatron-core's TransformerConfig,
RankGenerator and initialize_model_parallel (fake backend, full world size); torchtitan 0.3.0's
ConfigManager, ParallelDims, build_mesh and the model's pipelining/parallelize functions on a meta
model; torch's DeviceMesh/TP/FSDP2/pipelining for the emitted FSDP2 module.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from autoplan.validate import megatron_lm

from autoplan.catalog import build_cluster, load_model
from autoplan.emit import EmitPlan, emit
from autoplan.errors import ConfigError
from cost_models.specs import JobSpec, ParallelConfig

pytestmark = pytest.mark.consumers

CASES = {
    "llama3-70b@1024 tp8 pp8": ("llama3-70b", 1024, 512, 8192, dict(tp=8, pp=8, recompute="selective")),
    "llama3-70b@1024 tp8 pp4 vp2": ("llama3-70b", 1024, 1024, 8192, dict(tp=8, pp=4, vp=2)),
    "llama3-405b@16384 tp8 pp16": ("llama3-405b", 16384, 2048, 8192, dict(tp=8, pp=16)),
    "llama3-405b@16384 131k tp8 cp16 pp16": ("llama3-405b", 16384, 2048, 131072,
                                             dict(tp=8, pp=16, cp=16, recompute="full")),
    "mixtral-8x22b@256 tp8 pp4 ep8": ("mixtral-8x22b", 256, 256, 4096, dict(tp=8, pp=4, ep=8)),
    "qwen3-235b-a22b@512 tp4 pp4 ep32": ("qwen3-235b-a22b", 512, 1024, 4096, dict(tp=4, pp=4, ep=32)),
    # ep 32 > dp*cp 16: EP spans the TP ranks (Megatron MoE parallel folding; torchtitan's efsdp = dp_shard*cp*tp/ep)
    "qwen3-235b-a22b@256 tp2 pp8 ep32 (EP spanning TP)": ("qwen3-235b-a22b", 256, 2048, 4096, dict(tp=2, pp=8, ep=32)),
    # GPT-OSS (windows every other layer, sinks, biases); pp 1 with EP: torchtitan's trainer needs CUDA graphs off
    "gpt-oss-120b@64 tp1 pp1 ep8": ("gpt-oss-120b", 64, 512, 4096, dict(tp=1, pp=1, ep=8)),
}


# Megatron only: fp8, MLA + shared experts + dense-first layers, uneven explicit stages.
MEGATRON_ONLY = {
    "llama3-70b@1024 fp8 tp8 pp4 vp2": ("llama3-70b", 1024, 1024, 8192, dict(tp=8, pp=4, vp=2), "fp8"),
    "deepseek-v3@2048 tp8 pp8 ep32 first5 last2": ("deepseek-v3", 2048, 2048, 4096,
                                                  dict(tp=8, pp=8, ep=32, first_stage_layers=5,
                                                       last_stage_layers=2), "bf16"),
    "llama3.1-405b@16384 tp8 pp8 cp2 vp8 (embedding+loss accounting)": ("llama3.1-405b", 16384, 2048, 8192,
                                                                        dict(tp=8, pp=8, cp=2, vp=8), "bf16"),
    # Megatron-Bridge's Qwen3-235B-A22B H100 layout: ep 32 > dp*cp 16, EP spans the TP ranks (expert-TP 1), in fp8 as
    # it ran: TransformerConfig asks Transformer Engine's version for MoE with fp8, answered by the version the
    # cluster's Megatron-LM pins (megatron_lm.stand_in_te_version; no TE installs on this CPU machine).
    "qwen3-235b-a22b@256 tp2 pp8 vp4 ep32 (EP spanning TP)": (
        "qwen3-235b-a22b", 256, 2048, 4096,
        dict(tp=2, pp=8, vp=4, ep=32, account_for_embedding_in_pipeline_split=True,
             account_for_loss_in_pipeline_split=True), "fp8"),
}


# torchtitan only: MLA (deepseek_v3's Attention.Config has kv_lora_rank and no n_kv_heads / head_dim).
TORCHTITAN_ONLY = {
    "deepseek-v3@64 tp1 pp1 ep64": ("deepseek-v3", 64, 64, 4096, dict(tp=1, pp=1, ep=64)),
}


def make(case: str, target: str = "megatron") -> EmitPlan:
    if case in MEGATRON_ONLY:
        model, gpus, gbs, seq, par, precision = MEGATRON_ONLY[case]
    elif case in TORCHTITAN_ONLY:
        (model, gpus, gbs, seq, par), precision = TORCHTITAN_ONLY[case], "bf16"
    else:
        (model, gpus, gbs, seq, par), precision = CASES[case], "bf16"
    if target != "megatron":
        par = {**par, "zero_stage": 3}  # torchtitan and plain FSDP2 shard with fully_shard (no ZeRO-1)
    return EmitPlan(load_model(model), build_cluster("h100-sxm", gpus),
                    JobSpec(global_batch_size=gbs, seq_len=seq, precision=precision), ParallelConfig(**par))


def report(checks) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(c.line() for c in checks)


@pytest.mark.parametrize("case", list(CASES) + list(MEGATRON_ONLY))
def test_megatron_consumers_accept(case: str) -> None:
    pytest.importorskip("megatron.core")
    pytest.importorskip("torch")
    from autoplan.validate import run_checks

    checks = run_checks(make(case), "megatron")
    assert len(checks) == 7 and all(c.ok for c in checks), report(checks)
    assert "identical" in checks[2].detail and "identical" in checks[3].detail
    assert "micro-batches" in checks[5].detail
    assert checks[6].skipped == (megatron_lm.checkout() is None), report(checks)  # real validate_args if present


@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith("mixtral")] + list(TORCHTITAN_ONLY))
def test_torchtitan_consumers_accept(case: str) -> None:
    pytest.importorskip("torchtitan")
    pytest.importorskip("torch")
    from autoplan.validate import run_checks

    plan = make(case, "torchtitan")
    checks = run_checks(plan, "torchtitan")
    assert len(checks) == 6 and all(c.ok for c in checks), report(checks)
    assert ("as planned" if plan.parallel.pp > 1 else "parallelize_fn applied") in checks[-1].detail


def test_torchtitan_mixtral_clear_message() -> None:
    pytest.importorskip("torchtitan")
    from autoplan.validate import run_checks

    from dataclasses import replace

    plan = make("mixtral-8x22b@256 tp8 pp4 ep8", "torchtitan")  # as DDP (zero 0) Megatron runs it too
    plan = replace(plan, parallel=plan.parallel.model_copy(update={"zero_stage": 0}))
    checks = run_checks(plan, "torchtitan")
    assert len(checks) == 1 and not checks[0].ok
    assert "does not ship mixtral-8x22b" in checks[0].detail and "--target megatron" in checks[0].detail


def test_fsdp2_consumers_accept() -> None:
    pytest.importorskip("torch")
    from autoplan.validate import run_checks

    checks = run_checks(make("llama3-70b@1024 tp8 pp4 vp2", "fsdp2"), "fsdp2")
    assert len(checks) == 3 and all(c.ok for c in checks), report(checks)


def test_fsdp2_plan_of_a_non_gated_mlp_names_only_its_modules() -> None:
    """nemotron4-15b (gated_mlp false: ``w2(act(w1 x))``, no w3) at tp 2: the emitted TP plan listed
    feed_forward.w3, which torch's parallelize_module skips with a warning only; the check builds the plan's MLP and
    fails on a plan key naming no module."""
    pytest.importorskip("torch")
    from autoplan.validate import run_checks

    plan = EmitPlan(load_model("nemotron4-15b"), build_cluster("h100-sxm", 8),
                    JobSpec(global_batch_size=64, seq_len=2048), ParallelConfig(tp=2, zero_stage=3))
    checks = run_checks(plan, "fsdp2")
    assert len(checks) == 3 and all(c.ok for c in checks), report(checks)


def test_shipped_table_matches_torchtitan() -> None:
    """autoplan's table of torchtitan models has the architectures torchtitan 0.3.0 really builds."""
    pytest.importorskip("torchtitan")
    import importlib

    from cost_models.targets.torchtitan_models import SHIPPED

    for t in SHIPPED:
        mod = importlib.import_module(f"torchtitan.models.{t.module}")
        mc = mod.model_registry(t.flavor).model
        layer = mc.layers[-1]
        experts = layer.moe.num_experts if getattr(layer, "moe", None) is not None else 0
        heads = layer.attention.n_heads
        kv = getattr(layer.attention, "n_kv_heads", None) or heads  # MLA: no KV heads (ModelSpec: = heads)
        got = (len(mc.layers), mc.dim, heads, kv, mc.vocab_size, experts)
        want = t.dims[:4] + t.dims[5:]
        assert got == want, t
        rope = layer.attention.rope
        assert (rope.theta, rope.scaling, layer.attention_norm.eps) == (t.rope_theta, t.rope_scaling, t.norm_eps), t
        if t.config_fn:
            assert callable(getattr(importlib.import_module(f"torchtitan.models.{t.module}.config_registry"),
                                    t.config_fn))
        assert _titan_attention_facts(mc) == t.attention, t
        assert (_titan_params(mc), _titan_router(mc)) == (t.params, t.router), t


def _titan_params(mc: Any) -> int:
    """The flavor's parameters as torchtitan builds it on the meta device, MTP apart (``TitanModel.params``)."""
    import torch

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = mc.build()
    return sum(p.numel() for k, p in model.named_parameters() if not k.startswith("mtp"))


def _titan_router(mc: Any) -> tuple[Any, ...] | None:
    """``TitanModel.router`` from the flavor's MoE router config (None for a dense flavor)."""
    moe = next((x.moe for x in mc.layers if getattr(x, "moe", None) is not None), None)
    if moe is None:
        return None
    r = moe.router
    return (r.top_k, r.score_func, bool(r.route_norm), r.route_scale, r.num_expert_groups or 0,
            r.num_limited_groups or 0)


def _titan_attention_facts(mc: Any) -> tuple[Any, ...]:
    """``TitanModel.attention`` read from torchtitan's model config: the per-layer windows (as a window and an
    every-N-th-layer-full period), sinks and biases of a layer's attention built on the meta device, the gated
    activation (``model_equivalence._titan_glu``)."""
    import torch

    from autoplan.validate.model_equivalence import _titan_glu

    windows = [getattr(x.attention, "sliding_window_size", None) for x in mc.layers]
    window = next((w for w in windows if w is not None), None)
    full = [w is None for w in windows]
    every = 0 if window is None or not any(full) else next(
        n for n in range(2, len(windows) + 1) if full == [(i + 1) % n == 0 for i in range(len(windows))])
    layer = mc.layers[0]
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names = [n for n, _ in layer.attention.build().named_parameters()]
    act, offset, clamp = _titan_glu(next((x.moe for x in mc.layers if getattr(x, "moe", None) is not None), None))
    return (window, every, any(n.endswith("sinks") for n in names), act, offset, clamp,
            any(n.endswith("bias") for n in names))


# ---- the consumers refuse what autoplan refuses, for the same reason -----------------------------------------

def test_megatron_rejects_what_autoplan_rejects() -> None:
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.transformer import TransformerConfig

    p = EmitPlan(load_model("llama3-70b"), build_cluster("h100-sxm", 48), JobSpec(global_batch_size=48),
                 ParallelConfig(tp=3))
    with pytest.raises(ConfigError) as ours:
        emit(p, "megatron")
    with pytest.raises(ValueError) as theirs:
        TransformerConfig(num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8,
                          tensor_model_parallel_size=3, params_dtype=torch.float32)
    assert "num_attention_heads=64" in str(ours.value) and "tp=3" in str(ours.value)
    assert "num_attention_heads (64)" in str(theirs.value) and "tensor_model_parallel_size (3)" in str(theirs.value)

    m = load_model("llama3-70b").model_copy(update={"num_kv_heads": 4, "num_attention_heads": 64})
    p = EmitPlan(m, build_cluster("h100-sxm", 48), JobSpec(global_batch_size=48), ParallelConfig(tp=6))
    with pytest.raises(ConfigError, match="does not divide"):
        emit(p, "megatron")
    with pytest.raises(ValueError, match="num_query_groups|num_attention_heads"):
        TransformerConfig(num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=4,
                          tensor_model_parallel_size=6, params_dtype=torch.float32)


def test_torchtitan_rejects_what_autoplan_rejects() -> None:
    pytest.importorskip("torchtitan")
    from torchtitan.config.configs import ParallelismConfig
    from torchtitan.distributed import ParallelDims

    p = EmitPlan(load_model("llama3-70b"), build_cluster("h100-sxm", 1000), JobSpec(global_batch_size=1000),
                 ParallelConfig(tp=8, pp=3))
    with pytest.raises(ConfigError, match=r"tp\*pp\*cp = 8\*3\*1 = 24 does not divide num_gpus=1000"):
        emit(p, "torchtitan")
    with pytest.raises(AssertionError, match="WORLD_SIZE"):
        ParallelDims.from_config(ParallelismConfig(tensor_parallel_degree=8, pipeline_parallel_degree=3,
                                                   data_parallel_shard_degree=41), 1000)


def test_cli_validate_pass_and_fail_lines(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("megatron.core")
    pytest.importorskip("torchtitan")
    from click.testing import CliRunner

    from autoplan.cli import cli

    monkeypatch.chdir(tmp_path)  # a relative -o: the checker process runs elsewhere and must still find it
    r = CliRunner().invoke(cli, ["validate", "--target", "megatron", "-o", "m", "--model", "llama3-8b",
                                 "--gpus", "64", "--global-batch-size", "64", "--seq-len", "4096", "--tp", "8",
                                 "--pp", "2"])
    assert r.exit_code == 0, r.output
    n_pass = 6 if megatron_lm.checkout() is None else 7
    skipped = ", 1 skipped (see SKIP)" if n_pass == 6 else ""
    assert r.stdout.count("PASS  ") == n_pass and f"{n_pass} of {n_pass} checks passed{skipped}\n" in r.stdout, r.stdout
    assert ("SKIP  Megatron-LM" in r.stdout) == (megatron_lm.checkout() is None)
    assert (tmp_path / "m" / "megatron_args.txt").exists()
    r = CliRunner().invoke(cli, ["validate", "--target", "torchtitan", "--model", "mixtral-8x22b", "--gpus", "256",
                                 "--global-batch-size", "256", "--tp", "8", "--pp", "4", "--ep", "8"])
    assert r.exit_code == 1 and "FAIL  " in r.stdout and "does not ship mixtral-8x22b" in r.stdout


# ---- the plans of issue 10's "Why": refused with Megatron's reason, or emitted as priced ----------------------------
def test_validate_fails_on_the_why_plans() -> None:
    pytest.importorskip("megatron.core")
    from autoplan.validate import run_checks

    ds3 = EmitPlan(load_model("deepseek-v3"), build_cluster("h800", 2048), JobSpec(global_batch_size=4096, seq_len=4096),
                   ParallelConfig(tp=1, pp=1, ep=256, zero_stage=3))
    checks = run_checks(ds3, "megatron")
    assert len(checks) == 1 and not checks[0].ok
    assert "--use-torch-fsdp2 is not supported with expert parallelism" in checks[0].detail
    hsdp = EmitPlan(load_model("llama3-8b"), build_cluster("h100-sxm", 64), JobSpec(global_batch_size=256),
                    ParallelConfig(tp=1, pp=1, zero_stage=3, hsdp_shard_size=8))
    checks = run_checks(hsdp, "megatron")
    assert len(checks) == 1 and not checks[0].ok and "--num-distributed-optimizer-instances" in checks[0].detail


def test_megatron_fsdp2_plan_is_emitted_as_validate_args_wants(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """ZeRO-3: --use-torch-fsdp2 with --no-gradient-accumulation-fusion, and no CUDA_DEVICE_MAX_CONNECTIONS=1."""
    pytest.importorskip("megatron.core")
    from autoplan.validate import run_checks

    p = EmitPlan(load_model("llama3-8b"), build_cluster("h100-sxm", 64), JobSpec(global_batch_size=64, seq_len=4096),
                 ParallelConfig(tp=8, pp=1, zero_stage=3))
    checks = run_checks(p, "megatron", tmp_path)
    assert all(c.ok for c in checks), report(checks)
    args = (tmp_path / "megatron_args.txt").read_text().split()
    assert "--use-torch-fsdp2" in args and "--no-gradient-accumulation-fusion" in args
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in (tmp_path / "train_megatron_torchrun.sh").read_text()


def test_megatron_core_builds_the_hierarchical_cp_groups_priced() -> None:
    """a2a+p2p (issue 10): the emitted --hierarchical-context-parallel-sizes build megatron-core's groups on the
    fake backend, rank 0's all-to-all group = 4 adjacent CP ranks (tp = 2 apart), its ring 2 ranks 8 apart: the
    strides knob_effects.cp_comm prices."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("einops")  # megatron-core's create_hierarchical_groups
    from dataclasses import replace

    from autoplan.validate import run_checks
    from cost_models.targets import Software

    plan = EmitPlan(load_model("llama3-8b"), build_cluster("h100-sxm", 64), JobSpec(global_batch_size=64,
                    seq_len=65536), ParallelConfig(tp=2, cp=8))
    checks = run_checks(replace(plan, software=Software(cp_comm_type="a2a+p2p", cp_a2a_size=4)), "megatron")
    assert all(c.ok for c in checks), report(checks)
    assert any("hierarchical CP groups [4, 2] (a2a ranks [0, 2, 4, 6], ring [0, 8])" in c.detail
               for c in checks), report(checks)
