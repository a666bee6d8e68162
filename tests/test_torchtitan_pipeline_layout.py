"""An explicit pipeline layout on the torchtitan target: priced as ``pipeline_split`` says, emitted as torchtitan's
``parallelism.module_fqns_per_model_part`` and built by torchtitan's own ``pipelining_fn`` (``autoplan validate``);
layouts torchtitan's FQN parts cannot hold are refused, on every path that checks a target's layout rules, the cost
model's ``estimate(check=True)`` (what ``autoplan calibrate`` and the benchmarks run) included."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.emit import EmitPlan
from autoplan.emit.torchtitan import module_fqns_per_model_part
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ParallelConfig

JOB = JobSpec(global_batch_size=48, seq_len=4096)
LAYOUT = "E|t*8|t*8|t*8|t*8|L"  # not an even split: a chunk with the embedding alone, one with the loss alone


def _plan(layout: str, pp: int = 3, vp: int = 2) -> EmitPlan:
    par = ParallelConfig(tp=1, pp=pp, vp=vp, schedule="interleaved", zero_stage=3, pipeline_layout=layout)
    return EmitPlan(model=load_model("llama3-8b"), cluster=build_cluster("h100-sxm", 24), job=JOB, parallel=par)


def test_layout_is_priced_and_emitted_chunk_for_chunk() -> None:
    p = _plan(LAYOUT)
    pred = estimate(p.model, p.cluster, p.job, p.parallel, target="torchtitan")
    assert pred.layers_per_stage == [8, 16, 8]  # rank r holds chunks r and r + pp
    assert "module_fqns_per_model_part" in pred.pipeline_split and "Megatron" not in pred.pipeline_split
    ref = estimate(p.model, p.cluster, p.job, p.parallel, target="torchtitan-2025-08")  # priced, never emitted
    assert "module_fqns" not in ref.pipeline_split and "Megatron" not in ref.pipeline_split
    meg = estimate(p.model, p.cluster, p.job, p.parallel.model_copy(update={"zero_stage": 1}), target="megatron")
    assert f"Megatron --pipeline-model-parallel-layout '{LAYOUT}'" in meg.pipeline_split
    parts = module_fqns_per_model_part(p)
    assert parts[0] == ["tok_embeddings"] and parts[-1] == ["norm", "lm_head"]
    assert [sum(x.startswith("layers.") for x in part) for part in parts] == [0, 8, 8, 8, 8, 0]
    assert [x for part in parts for x in part if x.startswith("layers.")] == [f"layers.{i}" for i in range(32)]


@pytest.mark.consumers
def test_torchtitans_pipelining_builds_the_layouts_chunks() -> None:
    """torchtitan 0.3.0's ConfigManager, ParallelDims, build_mesh (fake backend) and pipelining_fn on a meta model:
    rank 0 holds the layout's chunks 0 and 3."""
    pytest.importorskip("torchtitan")
    from autoplan.validate import run_checks

    checks = run_checks(_plan(LAYOUT), "torchtitan")
    assert checks and all(c.ok for c in checks), [(c.name, c.detail) for c in checks if not c.ok]
    built = next(c for c in checks if "pipelining_fn" in c.name)
    assert "rank 0 holds 2 chunk(s) as planned" in built.detail


@pytest.mark.parametrize("layout,needle", [("Et*16|t*16mL", "does not build with pp=2"),
                                           ("Et*16||t*16|L", "stage 1 builds nothing")])
def test_layouts_torchtitan_cannot_hold_are_refused_by_estimate(layout: str, needle: str) -> None:
    model = load_model("llama3-8b")
    if "m" in layout:
        model = model.model_copy(update={"arch": model.arch.model_copy(update={"mtp_layers": 1})})
    par = ParallelConfig(tp=1, pp=2, zero_stage=3, pipeline_layout=layout)
    cluster = build_cluster("h100-sxm", 16)
    estimate(model, cluster, JOB, par.model_copy(update={"zero_stage": 1}), target="megatron")  # Megatron runs it
    with pytest.raises(ConfigError, match=needle):
        estimate(model, cluster, JOB, par, target="torchtitan")


def test_estimate_checks_the_targets_layout_rules() -> None:
    """``estimate(check=True)`` applies the target's layout rules as the API and the search do: torchtitan has no
    ZeRO-1; the 2025 reference torchtitan replicates ZeRO-0 with DDP, which refuses a mesh of more than one dimension
    (parallelize_llama.py:110-112 @ 820504e), where 0.3.0 runs it on any mesh."""
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 16)
    with pytest.raises(ConfigError, match="zero_stage=1"):
        estimate(model, cluster, JOB, ParallelConfig(tp=1, zero_stage=1), target="torchtitan")
    ddp_tp = ParallelConfig(tp=2, zero_stage=0)
    estimate(model, cluster, JOB, ddp_tp, target="torchtitan")
    for ref in ("torchtitan-2024-12", "torchtitan-2025", "torchtitan-2025-08"):
        with pytest.raises(ConfigError, match="DDP has not supported > 1D parallelism"):
            estimate(model, cluster, JOB, ddp_tp, target=ref)
        estimate(model, cluster, JOB, ParallelConfig(tp=1, zero_stage=0), target=ref)  # DDP alone: runs
        estimate(model, cluster, JOB, ParallelConfig(tp=1, cp=2, zero_stage=0), target=ref)  # FSDP over cp
    # an MoE model with EP on takes the FSDP branch (deepseek_v3/infra/parallelize.py:100 @ 6fc499f6): it runs
    moe = load_model("olmoe-1b-7b")
    estimate(moe, build_cluster("h100-sxm", 8), JOB, ParallelConfig(tp=2, ep=2, zero_stage=0, sequence_parallel=True),
             target="torchtitan-2025-08")


def test_estimate_checks_the_targets_knob_rules() -> None:
    """``estimate(check=True)`` applies the target's knob rules with the layout (``check_runtime``) as the API does:
    Megatron-LM refuses --tp-comm-overlap without sequence parallelism (arguments.py:916)."""
    from cost_models.targets import Software

    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 16)
    par = ParallelConfig(tp=2, sequence_parallel=False)
    with pytest.raises(ConfigError, match="tp_comm_overlap needs tp > 1 with sequence parallelism"):
        estimate(model, cluster, JOB, par, target="megatron", software=Software(tp_comm_overlap=True))
    estimate(model, cluster, JOB, par, target="megatron", software=Software(tp_comm_overlap=True), check=False)


def test_mtp_with_pipeline_or_context_parallelism_is_refused_as_torchtitan_refuses_it() -> None:
    """torchtitan 0.3.0's MTP raises NotImplementedError under pp > 1 or cp > 1 (models/deepseek_v3/mtp.py:200-208):
    a DeepSeek-V3 with its MTP layer is refused there, with or without a layout, and priced without it."""
    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 512)
    job = JobSpec(global_batch_size=1024, seq_len=4096)
    for extra in ({"pp": 8}, {"cp": 2}):
        par = ParallelConfig(tp=1, ep=32, zero_stage=3, **extra)
        with pytest.raises(ConfigError, match="MTP layer.*does not build with (pp=8|cp=2).*valid: mtp_layers=0"):
            estimate(model, cluster, job, par, target="torchtitan")
    plain = model.model_copy(update={"arch": model.arch.model_copy(update={"mtp_layers": 0})})
    estimate(plain, cluster, job, ParallelConfig(tp=1, ep=32, pp=8, zero_stage=3), target="torchtitan")
    estimate(model, cluster, job, ParallelConfig(tp=1, ep=32, zero_stage=3), target="torchtitan")
