"""Megatron-Core's fused MoE grouped MLP (megatron knob ``moe_fused_grouped_mlp``): the HBM bytes it removes,
recomputed here from what Transformer Engine's CuTe DSL grouped GEMM-GLU / dGLU kernels read and write
(op_traffic.FUSED_GLU_BWD_INPUT_READS cites them); the saved activations; the refusals where TE / Megatron-Core would
not fuse; the emitted flags and environment; validate's version gate; the held-out rows that run it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.emit import EmitPlan
from autoplan.emit.megatron import megatron_args, megatron_files, parse_megatron_args
from autoplan.validate.megatron_checks import newer_flags_reason
from cost_models import op_traffic as L
from cost_models.errors import ConfigError
from cost_models.memory import op_activation_bytes
from cost_models.opgraph import layer_graph
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, runtime_for
from cost_models.targets.common import Software
from cost_models.te_fp8 import te_cast_bytes

FUSED = dict(fp8_recipe="mxfp8", moe_fused_grouped_mlp=True, megatron_core="0.18.2")
JOB = JobSpec(global_batch_size=512, seq_len=4096, precision="fp8")
PAR = ParallelConfig(tp=1, pp=1, ep=8, micro_batch_size=1)
DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"


def _layer(model_name: str, gpu: str = "gb300", **knobs: object):  # type: ignore[no-untyped-def]
    model, cluster = load_model(model_name), build_cluster(gpu, 64)
    rt = runtime_for("megatron", JOB, cluster, PAR, Software(**{**FUSED, **knobs}))  # type: ignore[arg-type]
    return model, cluster, layer_graph(model, "moe", JOB.seq_len), rt


def _delta(model, graph, rt) -> dict[str, tuple[float, float]]:  # type: ignore[no-untyped-def]
    """Per op: (fused - unfused) traffic bytes, forward / backward, for one micro-batch on one rank."""
    off = replace(rt, moe_fused_grouped_mlp=False)
    out = {}
    for op in graph.ops:
        on = L.op_traffic_bytes(op, graph, model, JOB, PAR, rt)
        was = L.op_traffic_bytes(op, graph, model, JOB, PAR, off)
        if on != was:
            out[op.name] = (on[0] - was[0], on[1] - was[1])
    return out


def test_removed_bytes_are_the_unfused_kernels_passes() -> None:
    """Qwen3-235B (SwiGLU, F = 1536 per expert), one micro-batch of 4096 tokens, top-8: 32,768 routed copies on a
    rank. Unfused, per routed copy: the SwiGLU kernel reads gate and up (2 x 2F bytes) and writes F bf16 (2F); the
    MXFP8 cast of fc2's input reads that bf16 F (2F) and writes both copies; backward the dSwiGLU reads gate, up and
    fc2's dgrad (4F + 2F) and writes dgate, dup (4F), and each of the gate / up output-gradient casts reads its bf16
    F (2F). Fused, the GLU epilogue writes the MXFP8 copies from registers and the dGLU epilogue reads the saved fc1
    output (4F) and writes fc1's gradient quantized: removed 8F forward, 10F backward."""
    model, _, graph, rt = _layer("qwen3-235b-a22b")
    f, routed = model.expert_ffn_hidden_size, 4096 * 8
    want = {"expert_act": (-(4 * f + 2 * f), -((4 * f + 2 * f + 4 * f) - 4 * f)),
            "expert_down_proj": (-2 * f, 0.0),
            "expert_gate_proj": (0.0, -2 * f), "expert_up_proj": (0.0, -2 * f)}
    got = _delta(model, graph, rt)
    assert set(got) == set(want)
    for name, (fwd, bwd) in want.items():
        assert got[name][0] == pytest.approx(fwd * routed) and got[name][1] == pytest.approx(bwd * routed), name
    assert sum(d[0] for d in got.values()) == pytest.approx(-8 * f * routed)
    assert sum(d[1] for d in got.values()) == pytest.approx(-10 * f * routed)
    # what stays: the epilogue's MXFP8 writes of fc2's input, 2 x (1 + 1/32) bytes per element
    down = next(o for o in graph.ops if o.name == "expert_down_proj")
    assert L.op_traffic_bytes(down, graph, model, JOB, PAR, rt)[0] == pytest.approx(
        (te_cast_bytes("mxfp8", True).input - 2.0) * f * routed)


def test_gpt_oss_glue_runs_in_the_epilogues() -> None:
    """GPT-OSS (clamped quick-GeGLU, expert biases): fused, no eager clamp (the GLU epilogue clamps) and no per-expert
    fc2 bias add (TE's GroupedLinear adds it); from core_v0.19.0 fc2's bias is scaled by the probs and its gradients
    take one more read of fc2's bf16 output gradient (H = 2880 per routed copy)."""
    model, _, graph, rt = _layer("gpt-oss-120b")
    routed, f, h = 4096 * model.moe_top_k, model.expert_ffn_hidden_size, model.hidden_size
    act = next(o for o in graph.ops if o.name == "expert_act")
    down = next(o for o in graph.ops if o.name == "expert_down_proj")
    assert L.op_traffic_bytes(act, graph, model, JOB, PAR, rt) == pytest.approx((0.0, 2.0 * 2 * f * routed))
    later = replace(rt, megatron_core="0.19.0")
    d18 = L.op_traffic_bytes(down, graph, model, JOB, PAR, rt)
    d19 = L.op_traffic_bytes(down, graph, model, JOB, PAR, later)
    assert d19[0] == d18[0] and d19[1] - d18[1] == pytest.approx(2.0 * h * routed)
    unfused = L.op_traffic_bytes(down, graph, model, JOB, PAR, replace(rt, moe_fused_grouped_mlp=False))
    assert unfused[0] - d18[0] > L.MCORE_EXPERT_BIAS_BYTES["bf16"][0] * h * routed  # the glue's bias add is gone


def test_saved_activations_keep_no_clamped_copy() -> None:
    """The fused op saves the fc1 output once (grouped_mlp.py save_for_backward); Megatron's eager clamp kept it
    twice (the clamped copy)."""
    model, _, graph, rt = _layer("gpt-oss-120b")
    act = next(o for o in graph.ops if o.name == "expert_act")
    fused = op_activation_bytes(act, JOB, PAR, rt, graph)
    unfused = op_activation_bytes(act, JOB, PAR, replace(rt, moe_fused_grouped_mlp=False), graph)
    assert unfused == pytest.approx(2 * fused) and fused > 0
    model, _, graph, rt = _layer("qwen3-235b-a22b")  # no clamp: the same saved bytes
    for op in graph.ops:
        assert op_activation_bytes(op, JOB, PAR, rt, graph) == op_activation_bytes(
            op, JOB, PAR, replace(rt, moe_fused_grouped_mlp=False), graph)


def _refusal(model_name: str, gpu: str = "gb300", job: JobSpec = JOB, par: ParallelConfig = PAR,
             **knobs: object) -> ConfigError:
    model, cluster = load_model(model_name), build_cluster(gpu, 64)
    rt = runtime_for("megatron", job, cluster, par, Software(**{**FUSED, **knobs}))  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        MEGATRON.check_runtime(model, cluster, job, par, rt)
    return err.value


def test_accepted_where_te_fuses() -> None:
    for name in ("qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"):
        model, cluster, _, rt = _layer(name, "gb200")
        MEGATRON.check_runtime(model, cluster, JOB, PAR, rt)
        assert ("NVTE_CUTEDSL_FUSED_GROUPED_MLP", "1") in rt.env


@pytest.mark.parametrize("case,said,valid", [
    (dict(model_name="llama3-8b", par=ParallelConfig(tp=1, pp=1, micro_batch_size=1)), "a dense model",
     "moe_fused_grouped_mlp=false"),
    (dict(model_name="qwen3-235b-a22b", megatron_core="0.16.1"), "first appear at core_v0.18.0",
     "megatron_core=0.18.0"),
    (dict(model_name="qwen3-235b-a22b", megatron_core="0.17.1"), "first appear at core_v0.18.0",
     "megatron_core=0.19.0"),
    (dict(model_name="qwen3-235b-a22b", gpu="h100-sxm", fp8_recipe="blockwise"), "sm_100 only",
     "moe_fused_grouped_mlp=false"),
    (dict(model_name="qwen3-235b-a22b", fp8_recipe="delayed"), "fp8_recipe=delayed",
     "precision fp8 with fp8_recipe=mxfp8"),
    (dict(model_name="qwen3-235b-a22b", job=JobSpec(global_batch_size=512, seq_len=4096, precision="bf16"),
          fp8_recipe=None), "precision bf16", "precision fp8 with fp8_recipe=mxfp8"),
    (dict(model_name="qwen3-235b-a22b", par=ParallelConfig(tp=1, pp=1, ep=8, micro_batch_size=1,
                                                          recompute="selective", recompute_modules=("moe_act",))),
     "recompute_modules moe_act", "moe_fused_grouped_mlp=false"),
    (dict(model_name="qwen3-235b-a22b", par=ParallelConfig(tp=1, pp=1, ep=8, micro_batch_size=1, recompute="selective",
                                                          recompute_modules=("moe_act", "layernorm"))),
     "recompute_modules moe_act", "recompute_modules=layernorm"),
    # TE fuses only under a block-scaled recipe: the bf16 layers would run the op fuser's ops one by one
    (dict(model_name="qwen3-235b-a22b", bf16_layers=(1, 1)), "bf16_layers=1,1", "bf16_layers=0,0"),
])
def test_refusals_name_the_constraint(case: dict, said: str, valid: str) -> None:
    err = _refusal(**case)
    assert said in str(err) and valid in err.valid, (str(err), err.valid)


def test_refused_for_widths_te_does_not_fuse_and_other_targets() -> None:
    model, cluster = load_model("qwen3-235b-a22b"), build_cluster("gb300", 64)
    odd = model.model_copy(update={"moe_ffn_hidden_size": 1520})  # 1520 % 64 = 48
    rt = runtime_for("megatron", JOB, cluster, PAR, Software(**FUSED))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not a multiple of 64"):
        MEGATRON.check_runtime(odd, cluster, JOB, PAR, rt)
    with pytest.raises(ConfigError, match="has no knob moe_fused_grouped_mlp"):
        runtime_for("torchtitan", JOB, cluster, PAR, Software(moe_fused_grouped_mlp=True))


def _plan(**knobs: object) -> EmitPlan:
    return EmitPlan(load_model("qwen3-235b-a22b"), build_cluster("gb300", 64), JOB,
                    ParallelConfig(tp=1, pp=4, ep=16, micro_batch_size=1), software=Software(**knobs))  # type: ignore[arg-type]


def test_emitted_flags_and_environment() -> None:
    on, off = _plan(**FUSED), _plan(fp8_recipe="mxfp8", megatron_core="0.18.2")
    argv = megatron_args(on)
    i = argv.index("--moe-mlp-glu-interleave-size")
    assert "--use-transformer-engine-op-fuser" in argv and argv[i + 1] == "32"
    ns = parse_megatron_args(argv)
    assert ns.use_transformer_engine_op_fuser and ns.moe_mlp_glu_interleave_size == 32
    scripts = megatron_files(on)
    assert all("NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in scripts[s] for s in ("train_megatron_torchrun.sh",
                                                                         "train_megatron_slurm.sbatch"))
    assert "--use-transformer-engine-op-fuser" not in megatron_args(off)
    assert "NVTE_CUTEDSL_FUSED_GROUPED_MLP" not in megatron_files(off)["train_megatron_torchrun.sh"]


def test_validate_needs_a_checkout_with_the_flags() -> None:
    """A core_v0.16.1 Megatron-LM checkout has no --use-transformer-engine-op-fuser: validate says so (skipped, with
    the release to point MEGATRON_LM_PATH at) instead of failing parse_args; 0.18.0+ or a plan without the knob runs."""
    on = _plan(**FUSED)
    why = newer_flags_reason(on, "0.16.1")
    assert why is not None and "core_v0.18.0" in why and "core_v0.18.2 checkout" in why
    assert newer_flags_reason(on, "0.18.2") is None and newer_flags_reason(on, "0.19.0") is None
    assert newer_flags_reason(on, "0.20.0rc0") is None and newer_flags_reason(on, "0.19.1") is None
    assert newer_flags_reason(on, "0.17.1") is not None and newer_flags_reason(on, None) is not None
    assert newer_flags_reason(on, "0.18.0rc0") is not None  # a pre-release of the first release with the flags
    assert newer_flags_reason(_plan(fp8_recipe="mxfp8"), "0.16.1") is None


def test_heldout_rows_of_recipes_with_cutedsl_fused_grouped_mlp() -> None:
    """The held-out rows whose Megatron-Bridge recipe sets cutedsl_fused_grouped_mlp run the knob under their
    release's Megatron-Core (>= 0.18.0) with the source; fp8_dot_product_attention stays unpriced."""
    rows = {}
    for path in DATA.glob("more_runs*.json"):
        data = json.loads(path.read_text())
        groups = data["groups"].values() if isinstance(data["groups"], dict) else data["groups"]
        for g in groups:
            rows.update({cid: c for cid, c in (g.get("cases") or {}).items() if isinstance(c, dict)})
    fused = {cid: c for cid, c in rows.items() if c.get("knobs", {}).get("moe_fused_grouped_mlp")}
    assert len(fused) == 27  # 26 Bridge table rows + the GB200 MXFP8 verification-card run (its recipe's op fuser)
    for cid, c in fused.items():
        assert c["knobs"]["megatron_core"] in ("0.18.0", "0.18.2", "0.19.0"), cid
        assert "use_transformer_engine_op_fuser" in c["fused_mlp_basis"], cid
        assert "cutedsl" not in c.get("unpriced", ""), cid
    assert "fp8_dot_product_attention" in fused["mb26.06.01_DeepSeekV3_gb300_256gpu_MXFP8"]["unpriced"]
    assert "unpriced" not in fused["mb26.06.01_DeepSeekV3_gb200_256gpu_MXFP8"]  # its only unpriced item
    assert not [cid for cid, c in rows.items()
                if any(w in c.get("unpriced", "") for w in ("cutedsl_fused_grouped_mlp", "op fuser", "op_fuser"))]


def test_the_compute_key_holds_what_the_fused_pricing_reads() -> None:
    """layer_compute's cache key (op_cost.layer_compute_key) changes with the knob and, under it, with the release
    (core_v0.19.0's scaled fc2 bias), as the compute part does."""
    from cost_models.op_cost import layer_compute, layer_compute_key

    model, cluster, graph, rt = _layer("gpt-oss-120b")
    for other in (replace(rt, moe_fused_grouped_mlp=False), replace(rt, megatron_core="0.19.0")):
        assert layer_compute_key(PAR, other) != layer_compute_key(PAR, rt)
        assert layer_compute(graph, model, cluster, JOB, PAR, other) != layer_compute(graph, model, cluster, JOB,
                                                                                      PAR, rt)
