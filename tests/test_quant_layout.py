"""Layers and modules a quantized Megatron-Core run keeps out of its fp8 / NVFP4 recipe (``cost_models.quant_layout``):
``first_last_layers_bf16`` (knob ``bf16_layers``) and a Transformer Engine per-module recipe (knob ``quant_recipe``,
Megatron-Bridge's te_quant.cfg for Nemotron 3 Super's NVFP4 runs).

- The rule's layer indices (the main stack's global index; an MTP block's own numbering) as Megatron-Core reads them.
- A bf16 layer is priced as the same layer of a bf16 job; a recipe's module as a GEMM of its precision.
- The estimate adds exactly the bf16 layers' extra time; refusals name the rule and the valid choices.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError
from cost_models.estimate import estimate, graphs_for
from cost_models.gemm import matmul_time_s
from cost_models.layer_cost import layer_cost
from cost_models.op_cost import op_compute
from cost_models.op_traffic import local_widths
from cost_models.opgraph import layer_kinds
from cost_models.quant_layout import layer_in_bf16, mtp_layer_in_bf16, op_job, op_precision, run_as
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for
from search.score import Scorer

RECIPE = "nemotron_3_super_nvfp4"


def _super(precision: str = "nvfp4", **knobs):  # type: ignore[no-untyped-def]
    """Nemotron 3 Super as Megatron-Bridge's 64-GPU GB300 runs it (tp 1, ep 64, mbs 1, seq 8192)."""
    model, cluster = load_model("nemotron-3-super-120b-a12b"), build_cluster("gb300", 64)
    job = JobSpec(global_batch_size=512, seq_len=8192, precision=precision)
    par = ParallelConfig(tp=1, ep=64, micro_batch_size=1, zero_stage=1)
    sw = Software(megatron_core="0.18.0", moe_dispatcher="hybridep", moe_force_balance=True, **knobs)
    return model, cluster, job, par, sw


def test_layer_indices_follow_megatron_cores_rule() -> None:
    model, cluster, job, par, sw = _super(bf16_layers=(1, 14))
    rt = runtime_for("megatron", job, cluster, par, sw)
    n = model.num_layers
    # is_first_last_bf16_layer: i < S or i >= num_layers - E (global 0-based index)
    assert [i for i in range(n) if layer_in_bf16(i, n, job, rt)] == [0, *range(n - 14, n)]
    # the MTP block numbers its layers from 0 (its own HybridStack): S reaches them, E does not
    assert [mtp_layer_in_bf16(j, n, job, rt) for j in range(2)] == [True, False]
    assert not layer_in_bf16(0, n, job.model_copy(update={"precision": "bf16"}), rt)  # nothing to take out of bf16


def test_recipe_modules_run_at_their_precision() -> None:
    model, cluster, job, par, sw = _super(quant_recipe=RECIPE)
    rt = runtime_for("megatron", job, cluster, par, sw)
    graphs = graphs_for(model, job.seq_len)
    tokens = par.micro_batch_size * job.seq_len
    want = {("attention", "q_proj"): "bf16", ("attention", "o_proj"): "bf16", ("moe", "fc1_latent_proj"): "bf16",
            ("moe", "fc2_latent_proj"): "bf16", ("mamba", "out_proj"): "mxfp8", ("mamba", "in_proj"): "nvfp4",
            ("moe", "shared_up_proj"): "nvfp4", ("moe", "router"): "bf16"}
    for (kind, name), prec in want.items():
        op = graphs[kind].op(name)
        assert op_precision(op, graphs[kind], job.precision, rt) == prec, (kind, name)
    # a bf16 module: the bf16 GEMM, no cast; the MXFP8 out_proj: the fp8 GEMM at the MXFP8 kernel ratio
    q = graphs["attention"].op("q_proj")
    k, n = local_widths(q, graphs["attention"], 1)
    oc = op_compute(q, graphs["attention"], model, cluster, *op_job(q, graphs["attention"], job, rt)[:1], par,
                    op_job(q, graphs["attention"], job, rt)[1])
    assert oc.gemm_f == pytest.approx(matmul_time_s(tokens, k, n, cluster, "bf16"))
    out = graphs["mamba"].op("out_proj")
    j8, rt8 = run_as(job, rt, "mxfp8")
    assert (j8.precision, rt8.fp8_recipe) == ("fp8", "mxfp8")
    plain = op_compute(out, graphs["mamba"], model, cluster, job, par, replace(rt, module_precision=()))
    mx = op_compute(out, graphs["mamba"], model, cluster, j8, par, rt8)
    assert mx.gemm_f > plain.gemm_f  # MXFP8 is slower than the NVFP4 GEMM it replaces


def test_estimate_adds_exactly_the_bf16_layers() -> None:
    model, cluster, job, par, sw = _super()
    base = estimate(model, cluster, job, par, target="megatron", software=sw)
    more = estimate(model, cluster, job, par, target="megatron", software=sw.model_copy(update={"bf16_layers": (0, 14)}))
    rt = runtime_for("megatron", job, cluster, par, sw)
    graphs, kinds = graphs_for(model, job.seq_len), layer_kinds(model)
    jb, rtb = run_as(job, rt, "bf16")
    extra = sum(layer_cost(graphs[k], model, cluster, jb, par, base.dp, rtb).total_s
                - layer_cost(graphs[k], model, cluster, job, par, base.dp, rt).total_s for k in kinds[-14:])
    assert extra > 0
    assert more.step_time_s - base.step_time_s == pytest.approx(extra * base.num_microbatches, rel=1e-9)
    both = estimate(model, cluster, job, par, target="megatron",
                    software=sw.model_copy(update={"bf16_layers": (0, 14), "quant_recipe": RECIPE}))
    assert both.step_time_s > more.step_time_s  # the recipe's bf16 modules and MTP block on top


@pytest.mark.parametrize("precision, knobs, says", [
    ("bf16", {"bf16_layers": (0, 2)}, "the job is bf16"),
    ("fp8", {"bf16_layers": (1, 1), "fp8_recipe": "delayed"}, "Delayed scaling"),
    ("fp8", {"quant_recipe": RECIPE, "fp8_recipe": "mxfp8"}, "NVFP4 runs' module recipe"),
    ("fp8", {"bf16_layers": (0, 89), "fp8_recipe": "mxfp8"}, "layers per pipeline stage"),
    ("fp8", {"bf16_layers": (1, 1)}, r"fp8_recipe=delayed \(the default\)"),
])
def test_refusals_name_the_rule(precision: str, knobs: dict, says: str) -> None:
    model, cluster, job, par, sw = _super(precision, **knobs)
    with pytest.raises(ConfigError, match=says):
        estimate(model, cluster, job, par, target="megatron", software=sw)


def test_nvfp4_has_no_bf16_layer_bound() -> None:
    """TransformerConfig bounds the counts under fp8 only (TC:993-1017 sits in ``if self.fp8``); get_fp4_context takes
    any count, so an NVFP4 run with more bf16 layers than the model has runs every layer in bf16."""
    model, cluster, job, par, sw = _super("nvfp4", bf16_layers=(0, 89))
    every = estimate(model, cluster, job, par, target="megatron", software=sw)
    assert every.step_time_s > estimate(model, cluster, job, par, target="megatron",
                                        software=sw.model_copy(update={"bf16_layers": (0, 14)})).step_time_s


def test_search_refuses_per_layer_precision() -> None:
    model, cluster, job, par, sw = _super(bf16_layers=(0, 14))
    with pytest.raises(ConfigError, match="priced for a given layout only"):
        Scorer(model, cluster, job, software=sw)


def test_emitter_refuses_what_it_cannot_write() -> None:
    from autoplan.emit.megatron import megatron_args
    from autoplan.emit.plan import EmitPlan

    model = load_model("llama3-8b")
    job = JobSpec(global_batch_size=64, seq_len=4096, precision="fp8")
    plan = EmitPlan(model, build_cluster("gb200", 8), job, ParallelConfig(tp=1, zero_stage=1),
                    Software(fp8_recipe="mxfp8", bf16_layers=(1, 1)))
    with pytest.raises(ConfigError, match="priced .*not emitted"):
        megatron_args(plan)
    assert megatron_args(replace(plan, software=Software(fp8_recipe="mxfp8")))  # without it: emitted
