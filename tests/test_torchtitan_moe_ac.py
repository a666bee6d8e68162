"""torchtitan's activation checkpointing on MoE layers, as its code runs it (s11-ttdata), and its forced balance.

- Per-op SAC counts ``aten.mm`` (``nn.Linear``: projections, the router's gate, the shared experts) for its
  every-other-mm rule; the routed experts' ``torch._grouped_mm`` is in no save list, so it is never saved and always
  re-run (deepseek_v3/infra/parallelize.py ``_save_list`` @ f738a03^; 0.3.0 distributed/activation_checkpoint.py).
  MLA's ``wkv_b`` is one matmul (the graph's k_proj / v_proj pair).
- The backward re-runs the forward's dispatch and combine all-to-alls under full AC, and under per-op SAC before
  c4e2291 (2025-09-06), which added ``all_to_all_single`` to the save list.
- ``debug.moe_force_load_balance`` is round robin: ρ = 1, and the emitter passes the flag.
"""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.emit import EmitPlan
from autoplan.emit.torchtitan import torchtitan_overrides
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.layer_cost import layer_cost
from cost_models.memory import activation_bytes_per_microbatch, graphs_for, op_sac_saved
from cost_models.moe import moe_load_imbalance
from cost_models.recompute import ep_forward_repeats
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for
from cost_models.targets.torchtitan import PROFILE

JOB = JobSpec(global_batch_size=64, seq_len=4096)
SEL = ParallelConfig(tp=1, ep=8, micro_batch_size=8, zero_stage=3, recompute="selective")


def test_op_sac_never_saves_the_grouped_experts_and_counts_wkv_b_once() -> None:
    graph = graphs_for(load_model("deepseek-v3"), JOB.seq_len)["moe"]
    kept = {op for op, _ in op_sac_saved(graph)}
    assert not any(graph.op(op).kind == "experts" for op in kept)  # was: expert_up_proj (the 7th "mm") kept
    # torchtitan's mm order: wq_a S, wq_b R, wkv_a S, wkv_b R, wo S, then the shared experts' w1 R, w3 S, w2 R (+ the
    # SDPA output); the router gate is force-recomputed before it is counted (force_recompute_mm_shapes_by_fqns)
    assert ("k_proj" in kept) == ("v_proj" in kept)
    assert kept == {"q_down", "kv_down", "o_proj", "attn_core", "shared_up_proj"}
    dense = graphs_for(load_model("llama3-8b"), JOB.seq_len)["dense"]  # no experts, no MLA: as before
    assert {op for op, _ in op_sac_saved(dense)} == {"q_proj", "v_proj", "attn_core", "gate_proj", "down_proj"}


def test_op_sac_reruns_the_experts_and_saves_less() -> None:
    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 8)
    graph = graphs_for(model, JOB.seq_len)["moe"]
    rt = runtime_for("torchtitan", JOB, cluster, SEL, Software(compile=True))
    full = ParallelConfig(**{**SEL.model_dump(), "recompute": "none"})
    lc = layer_cost(graph, model, cluster, JOB, SEL, 1, rt)
    none = layer_cost(graph, model, cluster, JOB, full, 1, rt)
    assert lc.recompute_s > 0 and none.recompute_s == 0
    # the experts' three GEMM forwards are all in the recompute
    from cost_models.op_cost import op_compute
    experts_f = sum(op_compute(op, graph, model, cluster, JOB, SEL, rt).gemm_f for op in graph.ops
                    if op.kind == "experts")
    assert lc.recompute_s >= experts_f
    saved = activation_bytes_per_microbatch(graph, model, JOB, SEL, rt)
    assert saved < activation_bytes_per_microbatch(graph, model, JOB, full, rt)


@pytest.mark.parametrize("target, recompute, again", [
    ("torchtitan", "selective", 0.0),            # 0.3.0 saves all_to_all_single
    ("torchtitan-2025-08", "selective", 0.5),    # before c4e2291: the SAC recompute re-runs dispatch + combine
    ("torchtitan", "full", 0.5),                 # checkpoint_wrapper re-runs the whole block
    ("torchtitan-2025-08", "full", 0.5),
    ("torchtitan", "none", 0.0),
    ("megatron", "full", 0.5),                   # _checkpointed_forward re-runs whole layers, MoE ones included
    ("megatron", "selective", 0.0),              # core_attn only: the all-to-alls' outputs are kept
    ("fsdp2", "full", 0.5),
])
def test_recompute_reruns_the_forward_all_to_alls(target: str, recompute: str, again: float) -> None:
    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 8)
    zero = 1 if target == "megatron" else 3
    par = ParallelConfig(**{**SEL.model_dump(), "recompute": recompute, "zero_stage": zero})
    rt = runtime_for(target, JOB, cluster, par, Software())
    graph = graphs_for(model, JOB.seq_len)["moe"]
    assert ep_forward_repeats(graph, None, par, rt) == again
    assert ep_forward_repeats(graphs_for(model, JOB.seq_len)["dense"], None, par, rt) == 0.0


def test_torchtitan_forced_balance_is_round_robin() -> None:
    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 64)
    par = ParallelConfig(tp=1, ep=32, micro_batch_size=1, zero_stage=3, recompute="full")
    learned = runtime_for("torchtitan", JOB, cluster, par, Software())
    forced = runtime_for("torchtitan", JOB, cluster, par, Software(moe_force_balance=True))
    assert moe_load_imbalance(model, JOB, par, cluster, learned) == cluster.efficiency.moe_imbalance > 1.0
    assert moe_load_imbalance(model, JOB, par, cluster, forced) == 1.0
    a = estimate(model, cluster, JOB, par, target="torchtitan", check=False)
    b = estimate(model, cluster, JOB, par, target="torchtitan", software=Software(moe_force_balance=True), check=False)
    assert b.time.exposed_comm_s["ep"] < a.time.exposed_comm_s["ep"]
    plan = EmitPlan(model=model, cluster=cluster, job=JOB, parallel=par, software=Software(moe_force_balance=True))
    assert "--debug.moe_force_load_balance" in torchtitan_overrides(plan)
    dense, dpar = load_model("llama3-8b"), ParallelConfig(tp=1, zero_stage=3)
    rt = PROFILE.resolve(Software(moe_force_balance=True), JOB, cluster, dpar)
    with pytest.raises(ConfigError, match="dense model"):
        PROFILE.check_runtime(dense, cluster, JOB, dpar, rt)


def test_torchtitan_moe_glue_passes_are_its_codes() -> None:
    """Beside the all-to-alls torchtitan gathers / scatters the routed copies as its code does (0.3.0: reorder +
    _permute; _unpermute + scatter_add; 2025-08: gather + vstack + permute at any EP), and weights them by the scores
    in fp32 (one fused pass compiled, five eager); Megatron's rule is unchanged."""
    from cost_models.moe import permutation_passes

    cluster = build_cluster("h100-sxm", 8)
    par = ParallelConfig(tp=1, ep=8, micro_batch_size=1, zero_stage=3)
    rt = {c: runtime_for("torchtitan", JOB, cluster, par, Software(compile=c)) for c in (True, False)}
    assert permutation_passes(cluster, 32, rt[True], "dispatch", 8) == 2
    assert permutation_passes(cluster, 256, rt[True], "dispatch", 1) == 1
    assert permutation_passes(cluster, 32, rt[True], "combine", 8) == 3
    assert permutation_passes(cluster, 32, rt[False], "combine", 8) == 7
    old = runtime_for("torchtitan-2025-08", JOB, cluster, par, Software(compile=False))
    assert permutation_passes(cluster, 32, old, "dispatch", 1) == 3 and permutation_passes(cluster, 32, old, "combine", 8) == 7
    meg = runtime_for("megatron", JOB, cluster, par, Software())
    assert permutation_passes(cluster, 32, meg, "dispatch", 8) == permutation_passes(cluster, 32, meg, "combine", 8) == 2


def test_compile_components_loss_alone_compiles_the_loss_only(tmp_path) -> None:  # noqa: ANN001
    """torchtitan compile.components (configs.py:298): torchtitan's DeepSeek-V3 configs compile the loss alone. The
    blocks then run eagerly (eager element-wise bytes, eager op-SAC saves) while the loss holds 4 B per logit, not 12;
    the emitted override parses back through torchtitan's ConfigManager."""
    pytest.importorskip("torchtitan")
    from autoplan.emit import write_plan
    from autoplan.validate.torchtitan_checks import _parse

    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    par = ParallelConfig(tp=1, zero_stage=3, recompute="selective")
    job = JobSpec(global_batch_size=8, seq_len=8192)
    rt = {c: runtime_for("torchtitan", job, cluster, par, Software(compile=True, compile_components=c))
          for c in ("loss", "model", "model+loss")}
    assert (rt["loss"].model_compiled, rt["loss"].fused_elementwise, rt["loss"].fused_loss) == (False, False, True)
    assert (rt["model"].model_compiled, rt["model"].fused_loss) == (True, False)
    assert rt["loss"].loss_bytes_per_logit == rt["model+loss"].loss_bytes_per_logit == 4.0
    assert rt["model"].loss_bytes_per_logit == 12.0
    eager = runtime_for("torchtitan", job, cluster, par, Software(compile=False))
    steps = {k: estimate(model, cluster, job, par, target="torchtitan", software=s, check=False).step_time_s
             for k, s in (("eager", Software(compile=False)), ("loss", Software(compile=True, compile_components="loss")),
                          ("all", Software(compile=True)))}
    assert steps["all"] < steps["loss"] < steps["eager"]
    assert eager.loss_bytes_per_logit == 12.0
    with pytest.raises(ConfigError, match="needs compile"):
        runtime_for("torchtitan", job, cluster, par, Software(compile_components="loss"))
    with pytest.raises(ConfigError, match="async_tp needs compile, with the model compiled"):
        runtime_for("torchtitan", job, cluster, ParallelConfig(tp=2, zero_stage=3),
                    Software(compile=True, compile_components="loss", async_tp=True))
    plan = EmitPlan(model=model, cluster=cluster, job=job, parallel=par,
                    software=Software(compile=True, compile_components="loss"))
    write_plan(plan, "torchtitan", tmp_path)
    _, cfg = _parse(tmp_path)
    assert cfg.compile.enable and list(cfg.compile.components) == ["loss"]


def test_compile_components_are_stated_over_the_config_functions_own(tmp_path) -> None:  # noqa: ANN001
    """torchtitan's deepseek_v3_671b config function compiles the loss alone (config_registry.py), and the command
    line overrides that base: a plan priced with the model compiled and async TP must say compile.components, or
    CompileConfig.__post_init__ refuses async TP ("requires 'model' in --compile.components"). The comma-joined
    value is torchtitan's list[str] rule (config/manager.py list_str_rule); validate's knob check reads it back."""
    pytest.importorskip("torchtitan")
    from autoplan.emit import write_plan
    from autoplan.validate.torchtitan_checks import _knobs, _parse

    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 16)
    par = ParallelConfig(tp=2, ep=8, zero_stage=3, recompute="selective")
    plan = EmitPlan(model=model, cluster=cluster, job=JOB, parallel=par,
                    software=Software(compile=True, async_tp=True))
    write_plan(plan, "torchtitan", tmp_path)
    _, cfg = _parse(tmp_path)
    assert cfg.compile.enable and cfg.compile.enable_async_tensor_parallel
    assert list(cfg.compile.components) == ["model", "loss"]
    assert _knobs(plan, cfg)[1]["components"] == ["loss", "model"]
    eager = EmitPlan(model=model, cluster=cluster, job=JOB, parallel=par, software=Software(compile=False))
    write_plan(eager, "torchtitan", tmp_path / "eager")
    _, cfg = _parse(tmp_path / "eager")
    assert not cfg.compile.enable and _knobs(eager, cfg)[1]["compile"] is False
    with pytest.raises(AssertionError, match="priced"):
        _knobs(plan, cfg)


def test_forced_balance_is_not_a_knob_of_torchtitan_before_it_existed() -> None:
    """debug.moe_force_load_balance came with 99fee810b (2025-10-03): the 2025 reference profiles refuse it."""
    cluster, par = build_cluster("h100-sxm", 8), ParallelConfig(tp=1, ep=8, zero_stage=3)
    with pytest.raises(ConfigError, match="moe_force_balance"):
        runtime_for("torchtitan-2025-08", JOB, cluster, par, Software(moe_force_balance=True))
    assert runtime_for("torchtitan", JOB, cluster, par, Software(moe_force_balance=True)).moe_force_balance
