"""Which precision each GEMM of a quantized run (precision fp8 / nvfp4) really runs in, where not every layer and
module runs the job's recipe. Two Megatron-Core mechanisms, both of the megatron target (its knobs ``bf16_layers`` and
``quant_recipe``; ``Runtime.bf16_layers`` / ``Runtime.module_precision``):

- ``first_last_layers_bf16`` with ``num_layers_at_start_in_bf16`` S / ``num_layers_at_end_in_bf16`` E
  (transformer_config.py:486-493 @ core_v0.16.1): a decoder layer whose global index ``i`` (0-based) has ``i < S`` or
  ``i >= num_layers - E`` runs outside the fp8 / fp4 autocast, i.e. in bf16 (fp8_utils.py:513-530
  ``is_first_last_bf16_layer``, fp4_utils.py:200-217 ``get_fp4_context`` @ core_v0.18.0; the hybrid stack enters it per
  layer with ``layer.layer_number - 1``, models/hybrid/hybrid_block.py:321-327). A hybrid stack's MTP block numbers its
  own layers from 1 (multi_token_prediction.py:846-851, its HybridStack built with ``pp_layer_offset=0``), so the rule
  sees its layers as 0, 1, ...: the first S of them run bf16 too (E counts from the main stack's end: none of them).
- a Transformer Engine per-module quantization recipe (``TransformerConfig.quant_recipe``, loaded from a YAML of
  glob matchers on module names, ``--te-precision-config-file``; applied to each TE module at ``finish_init``,
  models/hybrid/hybrid_model.py:315-318 @ core_v0.18.0): a matched module enters its own autocast. Where the layer's
  context is quantized the recipe overrides it (``override_quantized_autocast`` True by default), where it is not (a
  bf16 layer above) it does not (``override_nonquantized_autocast`` False): extensions/transformer_engine.py:115-125,
  275-323 @ core_v0.18.0. So a recipe's module precision applies in the quantized layers only.

Priced by running each op (``op_cost``) or layer (``estimate``) as a job of that precision: a bf16 GEMM with no casts,
or an MXFP8 GEMM (fp8 with the ``mxfp8`` recipe) inside an NVFP4 job. Activation memory follows the op-level choice
(``memory.op_activation_bytes``); a whole bf16 layer's saved inputs are still counted at the job's precision (a few %
of one layer's activations), and the search prices every layer at the job's precision (``bf16_layers`` is refused
there: ``search.score``). Also approximate: under NVFP4 the weight cache TE keeps of quantized weights
(``Runtime.weight_cache_bytes``) is still charged to the bf16 layers and modules (an over-count; Super tp 1 ep 64
with the last 14 layers bf16: about 1.4 GiB per rank), and an MXFP8 module's cache at the NVFP4 size."""

from __future__ import annotations

from dataclasses import replace

from cost_models.opgraph import LayerGraph, Op, gemm_precision
from cost_models.specs import JobSpec
from cost_models.targets.common import Runtime
from cost_models.te_fp8 import te_tp_gather_bytes

# Module groups a recipe's matchers name, as the op graph's GEMMs (cost_models.opgraph): Megatron-Core's standard
# attention ``linear_qkv`` / ``linear_proj`` (not MLA's differently named projections), the latent MoE's
# ``fc1_latent_proj`` / ``fc2_latent_proj`` (moe_layer.py), the Mamba mixer's ``out_proj`` (mamba_mixer.py); ``mtp``
# is every module under ``mtp.`` (the MTP block's layers and projections: estimate prices the block whole). The named
# recipes that map groups to precisions are the megatron target's (targets/megatron.py ``QUANT_RECIPES``).
MODULE_OPS: dict[str, tuple[str, ...]] = {
    "attention_proj": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "moe_latent_proj": ("fc1_latent_proj", "fc2_latent_proj"),
    "mamba_out_proj": ("out_proj",),
    "mtp": (),
}

def _is_mla(graph: LayerGraph) -> bool:
    return any(op.name == "kv_down" for op in graph.ops)


def op_precision(op: Op, graph: LayerGraph, precision: str, rt: Runtime | None) -> str:
    """The precision ``op``'s GEMM runs in: the job's (``gemm_precision``: unquantized ops stay bf16), unless the
    runtime's quantization recipe names its module ("bf16" or "mxfp8")."""
    base = gemm_precision(op, precision)
    if base == "bf16" or rt is None or not rt.module_precision:
        return base
    for group, prec in rt.module_precision:
        if op.name in MODULE_OPS.get(group, ()) and not (group == "attention_proj" and _is_mla(graph)):
            return prec
    return base


def run_as(job: JobSpec, rt: Runtime | None, precision: str) -> tuple[JobSpec, Runtime | None]:
    """(job, runtime) that price a GEMM (or a whole layer) running in ``precision`` inside ``job``: bf16 (no recipe,
    bf16 TP gathers), "mxfp8" (fp8 with Transformer Engine's MXFP8 recipe), or the job's own."""
    if precision == job.precision or (precision == "mxfp8" and job.precision == "fp8" and rt is not None
                                      and rt.fp8_recipe == "mxfp8"):
        return job, rt
    if precision == "bf16":
        return job.model_copy(update={"precision": "bf16"}), (None if rt is None else replace(
            rt, fp8_recipe=None, tp_gather_bytes=2.0, tp_grad_gather_bytes=2.0,
            quantized_run=rt.quantized_run or rt.fp8_recipe))
    if precision == "mxfp8":
        fwd, bwd = te_tp_gather_bytes("mxfp8")
        return job.model_copy(update={"precision": "fp8"}), (None if rt is None else replace(
            rt, fp8_recipe="mxfp8", tp_gather_bytes=fwd, tp_grad_gather_bytes=bwd))
    raise ValueError(f"no GEMM precision {precision!r} inside a {job.precision} job")


def op_job(op: Op, graph: LayerGraph, job: JobSpec, rt: Runtime | None) -> tuple[JobSpec, Runtime | None]:
    """(job, runtime) ``op_cost.op_compute`` prices ``op`` with (``op_precision``)."""
    if rt is None or not rt.module_precision:
        return job, rt
    prec = op_precision(op, graph, job.precision, rt)
    return (job, rt) if prec == gemm_precision(op, job.precision) else run_as(job, rt, prec)


def layer_in_bf16(index: int, num_layers: int, job: JobSpec, rt: Runtime | None) -> bool:
    """Whether decoder layer ``index`` (global, 0-based) runs in bf16 under ``first_last_layers_bf16``."""
    if rt is None or job.precision == "bf16" or rt.bf16_layers == (0, 0):
        return False
    start, end = rt.bf16_layers
    return index < start or index >= num_layers - end


def mtp_in_bf16(job: JobSpec, rt: Runtime | None) -> bool:
    """Whether the whole MTP block (its layers and projections) runs in bf16: a recipe's ``mtp`` matcher."""
    return (rt is not None and job.precision != "bf16"
            and any(group == "mtp" and prec == "bf16" for group, prec in rt.module_precision))


def mtp_layer_in_bf16(index: int, num_layers: int, job: JobSpec, rt: Runtime | None) -> bool:
    """Whether the MTP block's layer ``index`` (its own numbering from 0) runs in bf16: the recipe's ``mtp`` matcher,
    or ``first_last_layers_bf16`` reading the block's own numbering (module doc)."""
    return mtp_in_bf16(job, rt) or layer_in_bf16(index, num_layers, job, rt)
