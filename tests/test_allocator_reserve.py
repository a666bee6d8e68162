"""The caching allocator's reserve as the launch environment sets it (``cost_models.memory`` module docstring):
with PyTorch's default allocator the whole reserve counts against HBM; with ``expandable_segments:True`` it is
reported in ``reserved`` but given back before an out-of-memory, so the device peak is allocated + CUDA/NCCL. The
setting lives in the runtime's launch environment (what the emitters export); Megatron-Core reads the same string."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import estimate
from cost_models.memory import ALLOCATOR_RESERVE, GIB, graphs_for, stage_memory
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, TORCHTITAN, Software

H100 = build_cluster("h100-sxm", 8)
JOB = JobSpec(global_batch_size=16, seq_len=4096)
PAR = ParallelConfig(tp=2, pp=1, micro_batch_size=1, zero_stage=1, recompute="selective")
PARTS = ("weights", "grads", "optimizer", "activations", "transients", "allocator", "runtime")


@pytest.mark.parametrize("target,par", [("megatron", PAR), ("torchtitan", PAR.model_copy(update={"zero_stage": 3}))])
def test_expandable_segments_move_the_reserve_out_of_the_device_peak(target: str, par: ParallelConfig) -> None:
    model = load_model("llama3-8b")
    off = estimate(model, H100, JOB, par, target=target, software=Software(expandable_segments=False))
    on = estimate(model, H100, JOB, par, target=target, software=Software(expandable_segments=True))
    churn = on.memory_gib["activations"] + on.memory_gib["transients"]
    assert on.peak_allocated_gib == pytest.approx(off.peak_allocated_gib, rel=1e-12)
    assert on.peak_reserved_gib == pytest.approx(off.peak_reserved_gib, rel=1e-12)  # what max_memory_reserved shows
    assert on.peak_reserved_gib - on.peak_allocated_gib == pytest.approx(ALLOCATOR_RESERVE * churn, rel=1e-9)
    assert on.memory_gib["allocator"] == 0.0 and on.memory_gib["allocator_cached"] > 0
    assert off.memory_gib["allocator_cached"] == 0.0
    assert off.peak_memory_gib - on.peak_memory_gib == pytest.approx(ALLOCATOR_RESERVE * churn, rel=1e-9)
    assert on.peak_memory_gib == pytest.approx(on.peak_allocated_gib + on.memory_gib["runtime"], rel=1e-12)
    for pred in (on, off):  # the parts of the device peak add up to it
        assert sum(pred.memory_gib[k] for k in PARTS) == pytest.approx(pred.peak_memory_gib, rel=1e-9)


def test_target_defaults_are_their_launchers() -> None:
    """torchtitan's launcher exports expandable segments (run_llama_train.sh:22 @ 9dec370); Megatron-LM sets none."""
    assert TORCHTITAN.resolve(None, JOB, H100, PAR.model_copy(update={"zero_stage": 3})).expandable_segments
    assert not MEGATRON.resolve(None, JOB, H100, PAR).expandable_segments
    rt = MEGATRON.resolve(Software(expandable_segments=True), JOB, H100, PAR)
    assert rt.expandable_segments and dict(rt.env)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert dict(rt.env)["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # the other requirement is kept


def test_megatron_core_reads_the_exported_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The string the runtime exports is the one Megatron-Core checks: with it, nccl_ub is refused
    (megatron/core/distributed/distributed_data_parallel_config.py:156-161); without it, accepted."""
    from megatron.core.distributed import DistributedDataParallelConfig

    for knob in (True, False):
        rt = MEGATRON.resolve(Software(expandable_segments=knob), JOB, H100, PAR)
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
        for k, v in rt.env:
            monkeypatch.setenv(k, v)
        if knob:
            with pytest.raises(ValueError, match="expandable_segments"):
                DistributedDataParallelConfig(nccl_ub=True)
        else:
            DistributedDataParallelConfig(nccl_ub=True)


@pytest.mark.parametrize("target,flags,exported", [
    ("megatron", [], False), ("megatron", ["--expandable-segments"], True),
    ("torchtitan", ["--zero", "3"], True), ("torchtitan", ["--zero", "3", "--no-expandable-segments"], False),
    ("fsdp2", ["--zero", "3"], False), ("fsdp2", ["--zero", "3", "--expandable-segments"], True),
])
def test_emitted_launch_scripts_export_what_is_priced(tmp_path, target: str, flags: list[str],  # type: ignore[no-untyped-def]
                                                      exported: bool) -> None:
    from autoplan.cli import cli

    out = tmp_path / "emit"
    res = CliRunner().invoke(cli, ["emit", "--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--pp", "1",
                                   "--target", target, *flags, "-o", str(out)])
    assert res.exit_code == 0, res.output
    scripts = [p for p in out.rglob("*") if p.suffix in (".sh", ".sbatch")]
    assert scripts
    for p in scripts:
        assert ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in p.read_text()) == exported, p


def test_search_prices_the_held_reserve_as_estimate_does() -> None:
    from search.planner import search
    from search.score import Scorer

    model, job = load_model("llama3-8b"), JobSpec(global_batch_size=64, seq_len=8192)
    for knob in (True, False):
        sw = Software(expandable_segments=knob)
        res = search(model, H100, job, target="megatron", top_k=3, scorer=Scorer(model, H100, job, software=sw))
        assert res.plans
        for p in res.plans:
            chosen = {k: v for k, v in p.prediction.software.items() if k in ("cp_comm_type", "cp_a2a_size")}
            pred = estimate(model, H100, job, p.parallel, target="megatron",
                            software=Software(expandable_segments=knob, **chosen))
            assert p.prediction.peak_memory_gib == pytest.approx(pred.peak_memory_gib, rel=1e-9)
            assert p.prediction.software["expandable_segments"] is knob


def test_stage_memory_reserve_is_of_the_churn_only() -> None:
    """The reserve is a fraction of the activation and transient bytes; resident state adds none."""
    model = load_model("llama3-8b")
    rt = MEGATRON.resolve(None, JOB, H100, PAR)
    mem = stage_memory(model, JOB, PAR, 4, 0, [32], 8, graphs_for(model, JOB.seq_len), rt)
    assert mem.allocator == pytest.approx(ALLOCATOR_RESERVE * (mem.activations + mem.transients), rel=1e-12)
    assert mem.total - mem.reserved == pytest.approx(1.5 * GIB, rel=1e-12)


@pytest.mark.parametrize("gpu,impl,scope,register_off", [
    ("h100-sxm", "transformer_engine", ["attn"], True),  # MLM:1247-1253
    ("b200", "transformer_engine", ["attn"], True),
    ("h100-sxm", "local", ["full_iteration"], True),  # cuda_graphs.py:1413-1420: before SM 10
    ("b200", "local", ["full_iteration"], False),
    ("h100-sxm", "none", [], False),
])
def test_cuda_graphs_with_expandable_segments_export_what_megatron_asserts(gpu: str, impl: str, scope: list[str],
                                                                          register_off: bool) -> None:
    """Megatron-Core asserts NCCL_GRAPH_REGISTER=0 beside expandable segments for CUDA graphs (Transformer Engine's
    always; its local graphs before Blackwell): the runtime's launch environment carries it exactly then."""
    cluster = build_cluster(gpu, 8)
    sw = Software(expandable_segments=True, cuda_graph_impl=impl, **({"cuda_graph_scope": scope} if scope else {}))
    env = dict(MEGATRON.resolve(sw, JOB, cluster, PAR).env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert (env.get("NCCL_GRAPH_REGISTER") == "0") == register_off
    off = dict(MEGATRON.resolve(Software(cuda_graph_impl=impl, **({"cuda_graph_scope": scope} if scope else {})),
                                JOB, cluster, PAR).env)
    assert "NCCL_GRAPH_REGISTER" not in off and "PYTORCH_CUDA_ALLOC_CONF" not in off
