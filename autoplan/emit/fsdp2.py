"""FSDP2 + DTensor for plain PyTorch users: a Python module, emitted as text, that applies a plan.

The emitted module (``autoplan_parallelize.py``) builds a ``DeviceMesh`` with named axes
(``pp``, ``dp`` or ``dp_replicate``/``dp_shard``, ``tp``; ``tp`` innermost so a TP group is
consecutive ranks on one node), applies the tensor-parallel plan per module FQN
(``ColwiseParallel`` / ``RowwiseParallel`` / ``SequenceParallel``), ``fully_shard``s every block with
the plan's ``reshard_after_forward``, wraps blocks for the plan's activation recompute
(``checkpoint_wrapper``; selective = torch's selective checkpointing keeping GEMM/attention outputs),
and splits the model into pipeline stages scheduled with
``torch.distributed.pipelining``.

Model convention (torchtitan's Llama layout; adapt ``FQN`` in the emitted file for other names):
``tok_embeddings``, ``layers`` (an ``nn.ModuleDict`` keyed "0", "1", ...), ``norm``, ``output``; a
block has ``attention_norm``, ``attention.{wq,wk,wv,wo}``, ``ffn_norm``, ``feed_forward.{w1,w2,w3}``
(``w2(silu(w1 x) * w3 x)``; a non-gated MLP, ``gated_mlp`` false: ``w2(act(w1 x))``, no ``w3``);
attention infers its local head count from the projection's output width (so TP shards heads), and
``forward`` skips modules set to ``None`` (pipeline stages delete what they do not own).

Context and expert parallelism are not emitted for this target (use megatron or torchtitan).
"""

from __future__ import annotations

from autoplan.emit.launch import script_header, torchrun_script
from autoplan.emit.plan import EmitPlan
from autoplan.errors import ConfigError
from cost_models.validate import pipeline_split
from cost_models.targets import PROFILES

MODULE_NAME = "autoplan_parallelize"


def check_fsdp2(plan: EmitPlan) -> None:
    """The fsdp2 profile's layout rules (no CP, no EP: ``FSDP2Profile``), for a caller of ``fsdp2_module`` that
    skips emit's ``_check``."""
    PROFILES["fsdp2"].check_layout(plan.model, plan.cluster, plan.job, plan.parallel)


# The modes of the intra-op ILP's fsdp2 strategy set (cost_models.targets.fsdp2: SP one flag, K/V shard or
# replicate), per module FQN of a decoder block (torchtitan's Llama names, search.strategies.TORCHTITAN_MODULE).
BLOCK_MODULES = {"attn_norm": "attention_norm", "q_proj": "attention.wq", "k_proj": "attention.wk",
                 "v_proj": "attention.wv", "o_proj": "attention.wo", "mlp_norm": "ffn_norm",
                 "gate_proj": "feed_forward.w1", "up_proj": "feed_forward.w3", "down_proj": "feed_forward.w2"}
# A non-gated MLP (gated_mlp false: GPT-2, BLOOM, Nemotron-4) is ``w2(act(w1 x))`` in this layout: its one input
# projection (the op graph's up_proj, cost_models/opgraph.py) is w1, the module the activation reads; there is no w3.
PLAIN_MLP_MODULES = {**{op: fqn for op, fqn in BLOCK_MODULES.items() if op != "gate_proj"},
                     "up_proj": "feed_forward.w1"}
EMITTED_MODES = {"attention_norm": ("R", "S"), "ffn_norm": ("R", "S"), "attention.wo": ("row", "row_sp"),
                 "feed_forward.w2": ("row", "row_sp"), "feed_forward.w1": ("col", "col_sp"),
                 "feed_forward.w3": ("col", "col_sp"),
                 **{f"attention.w{x}": ("col", "col_sp", "col_kvrep", "col_sp_kvrep") for x in "qkv"}}


def block_modes(plan: EmitPlan) -> dict[str, str]:
    """Module FQN → tp mode of a decoder block: the ILP's ``op_shardings`` of the plan's dense layer, or (a plan
    without them, e.g. from ``estimate``) the layout's uniform pattern. ``ConfigError`` for a mode this module
    does not emit (the fsdp2 strategy set never yields one)."""
    par = plan.parallel
    if par.tp == 1:
        return {}
    chosen = plan.op_shardings.get("dense") if plan.op_shardings else None
    if not chosen:
        sp = par.sequence_parallel
        kv = plan.model.mla is None and par.tp > plan.model.num_kv_heads and par.kv_replication == "replicate"
        col = "col_sp" if sp else "col"
        chosen = {"attn_norm": "S" if sp else "R", "mlp_norm": "S" if sp else "R", "q_proj": col,
                  "k_proj": col + ("_kvrep" if kv else ""), "v_proj": col + ("_kvrep" if kv else ""),
                  "o_proj": "row_sp" if sp else "row", "gate_proj": col, "up_proj": col,
                  "down_proj": "row_sp" if sp else "row"}
    out = {}
    for op, fqn in (BLOCK_MODULES if plan.model.gated_mlp else PLAIN_MLP_MODULES).items():
        if op not in chosen:
            continue
        mode = chosen[op]
        if mode not in EMITTED_MODES[fqn]:
            raise ConfigError(f"op_shardings: {op}={mode} is not a mode the fsdp2 module emits for {fqn} "
                              f"(it emits {', '.join(EMITTED_MODES[fqn])})", valid=list(EMITTED_MODES[fqn]))
        out[fqn] = mode
    if plan.model.mla is None and par.tp > plan.model.num_kv_heads and not out["attention.wk"].endswith("_kvrep"):
        raise ConfigError(f"tp={par.tp} > num_kv_heads={plan.model.num_kv_heads}: the fsdp2 module replicates the "
                          "K/V projections (kv_replication=replicate)", valid=["kv_replication=replicate"])
    return out


def stage_chunks(plan: EmitPlan) -> list[int]:
    """Decoder layers per pipeline chunk, in chunk order (chunk c runs on pp rank c % pp)."""
    return [n for *_, n in pipeline_split(plan.model, plan.parallel).chunk_order()]


def schedule_name(plan: EmitPlan) -> str:
    return "ScheduleInterleaved1F1B" if plan.parallel.vp > 1 else "Schedule1F1B"


def notes(plan: EmitPlan) -> list[str]:
    par, out = plan.parallel, []
    if par.zero_stage in (0, 1, 2) and plan.dp > 1:
        out.append(f"zero_stage={par.zero_stage}: emitted fully_shard with reshard_after_forward=False "
                   "(parameters stay gathered between forward and backward; optimizer state sharded)")
    if par.schedule == "zb-h1":
        out.append("schedule zb-h1: emitted Schedule1F1B (torch's zero-bubble schedules need 2+ stages per rank)")
    return out


_TEMPLATE = '''"""Parallelize a Llama-style model for one autoplan plan with FSDP2 + DTensor (generated by autoplan).

Usage, on every rank after torch.distributed.init_process_group (torchrun sets the environment):

    import autoplan_parallelize as ap
    mesh = ap.build_mesh("cuda")
    stage_modules, schedule = ap.parallelize(model, mesh, loss_fn, device)   # model built on "meta" or CPU
    # then: materialize / init weights of stage_modules, build the optimizer over them, and each step
    # schedule.step(...) when PLAN["pp"] > 1, else loss_fn(stage_modules[0](tokens), labels).backward()

Model convention: see FQN below (torchtitan's Llama layout).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

MODEL_NAME = __MODEL_NAME__
PLAN = __PLAN__
# Decoder layers per pipeline chunk; chunk c runs on pp rank c % pp (looped schedules).
STAGE_LAYERS = __STAGE_LAYERS__
SCHEDULE = __SCHEDULE__
RESHARD_AFTER_FORWARD = __RESHARD__  # bool, or a group size: re-shard to it after forward
REDUCE_DTYPE = __REDUCE__
FQN = {"embed": "tok_embeddings", "layers": "layers", "norm": "norm", "output": "output"}
# Tensor-parallel mode of each decoder-block module, as the intra-op ILP chose it (autoplan op_shardings):
# col / row = Megatron column / row parallel, _sp = sequence-parallel input / output (Shard(1)), S = sequence-
# parallel norm, R = replicated, *_kvrep on wk/wv = K/V projections replicated on every TP rank (ReplicatedKV).
# A non-gated MLP (w2(act(w1 x)), no w3) lists w1 and w2 only.
BLOCK_MODES = __BLOCK_MODES__
KV_HEADS = __KV_HEADS__
HEAD_DIM = __HEAD_DIM__


def mesh_shape() -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Mesh axes, slowest first: pp, then data parallel (split for HSDP), then tp (innermost)."""
    if PLAN["hsdp_shard"] and PLAN["hsdp_shard"] < PLAN["dp"]:
        shape = (PLAN["pp"], PLAN["dp"] // PLAN["hsdp_shard"], PLAN["hsdp_shard"], PLAN["tp"])
        return shape, ("pp", "dp_replicate", "dp_shard", "tp")
    return (PLAN["pp"], PLAN["dp"], PLAN["tp"]), ("pp", "dp", "tp")


def build_mesh(device_type: str) -> DeviceMesh:
    shape, names = mesh_shape()
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def dp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    names = mesh.mesh_dim_names
    return mesh["dp_replicate", "dp_shard"] if "dp_shard" in names else mesh["dp"]


class ReplicatedKV(ParallelStyle):
    """A K/V projection held whole on every TP rank (tp > num_kv_heads). Its weight is Replicate on the TP mesh;
    each rank keeps the KV heads its query heads use (rank r of t: head r // (t / KV_HEADS)). The output's
    gradient covers only this rank's query heads, so it leaves as Partial: DTensor sums the weight gradient over
    TP, and the input gradient joins the query projection's (reduce-scatter / all-reduce of the block input)."""

    def _partition(self, name, module, mesh):
        for pname, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(pname, nn.Parameter(distribute_tensor(param, mesh, [Replicate()])))

    def _input(self, module, inputs, mesh):
        x = inputs[0]
        x = x.redistribute(mesh, [Replicate()]) if isinstance(x, DTensor) else DTensor.from_local(
            x, mesh, [Replicate()], run_check=False)
        return (x, *inputs[1:])

    def _output(self, module, output, mesh):
        local = output.to_local(grad_placements=[Partial()])
        t, rank = mesh.size(), mesh.get_local_rank()
        head = rank // (t // KV_HEADS)
        return local[..., head * HEAD_DIM:(head + 1) * HEAD_DIM]

    def _apply(self, module, device_mesh):
        return distribute_module(module, device_mesh, self._partition, self._input, self._output)


def _style(fqn: str, mode: str):
    if mode == "S":
        return SequenceParallel()
    if mode.endswith("_kvrep") and fqn != "attention.wq":
        return ReplicatedKV()
    if mode.startswith("col"):
        return ColwiseParallel()
    if mode == "row_sp":
        return RowwiseParallel(output_layouts=Shard(1))
    if mode == "row":
        return RowwiseParallel()
    return None  # "R": replicated, left as is


def block_tp_plan() -> dict:
    """TP plan of one decoder block, by FQN inside the block, from BLOCK_MODES; the attention and MLP modules
    gather a sequence-parallel input (Shard(1)) for their column-parallel projections."""
    plan = {}
    for fqn, mode in BLOCK_MODES.items():
        style = _style(fqn, mode)
        if style is not None:
            plan[fqn] = style
    for module, first in (("attention", "attention.wq"), ("feed_forward", "feed_forward.w1")):
        if BLOCK_MODES.get(first, "").startswith("col_sp"):
            plan[module] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


def top_tp_plan(model: nn.Module, sequence_parallel: bool) -> dict:
    """TP plan of the embedding, final norm and output head that this stage still holds."""
    plan = {}
    if getattr(model, FQN["embed"], None) is not None:
        plan[FQN["embed"]] = RowwiseParallel(input_layouts=Replicate(),
                                             output_layouts=Shard(1) if sequence_parallel else Replicate())
    if sequence_parallel and getattr(model, FQN["norm"], None) is not None:
        plan[FQN["norm"]] = SequenceParallel()
    if getattr(model, FQN["output"], None) is not None:
        plan[FQN["output"]] = ColwiseParallel(input_layouts=Shard(1) if sequence_parallel else Replicate(),
                                              output_layouts=Replicate(), use_local_output=True)
    return plan


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    sp = PLAN["sequence_parallel"]
    top = top_tp_plan(model, sp)
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in getattr(model, FQN["layers"]).values():
        parallelize_module(block, tp_mesh, block_tp_plan())


def _sac_policy(ctx, op, *args, **kwargs):
    """Selective recompute: keep matmul and attention outputs, recompute the cheap element-wise ops."""
    from torch.utils.checkpoint import CheckpointPolicy

    keep = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_cudnn_attention.default,  # torch's first choice on sm90 / sm100
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(model: nn.Module) -> None:
    """Activation recompute per block: "full" recomputes the whole block in backward; "selective"
    keeps GEMM and attention outputs (torch's selective activation checkpointing)."""
    from functools import partial

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    layers = getattr(model, FQN["layers"])
    for name, block in list(layers.items()):
        if PLAN["recompute"] == "full":
            layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)
        elif PLAN["recompute"] == "selective":
            layers[name] = checkpoint_wrapper(block, preserve_rng_state=False,
                                              context_fn=partial(create_selective_checkpoint_contexts, _sac_policy))


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype | None = None) -> None:
    """fully_shard every block, then the root (embedding, norm and head go with the root)."""
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=REDUCE_DTYPE) if param_dtype else None
    kw = {"mesh": mesh, "reshard_after_forward": RESHARD_AFTER_FORWARD}
    if mp is not None:
        kw["mp_policy"] = mp
    for block in getattr(model, FQN["layers"]).values():
        fully_shard(block, **kw)
    fully_shard(model, **kw)


def split_chunk(model: nn.Module, chunk: int) -> nn.Module:
    """A copy of ``model`` keeping only pipeline chunk ``chunk`` (FQNs unchanged)."""
    part = copy.deepcopy(model) if len(STAGE_LAYERS) > 1 else model
    start = sum(STAGE_LAYERS[:chunk])
    keep = {str(i) for i in range(start, start + STAGE_LAYERS[chunk])}
    layers = getattr(part, FQN["layers"])
    for name in list(layers.keys()):
        if name not in keep:
            del layers[name]
    if chunk != 0:
        setattr(part, FQN["embed"], None)
    if chunk != len(STAGE_LAYERS) - 1:
        setattr(part, FQN["norm"], None)
        setattr(part, FQN["output"], None)
    return part


def parallelize(model: nn.Module, mesh: DeviceMesh, loss_fn, device: torch.device,
                param_dtype: torch.dtype | None = None):
    """Apply the plan on this rank. Returns (modules this rank holds, pipeline schedule or None)."""
    pp = PLAN["pp"]
    pp_rank = mesh.get_local_rank("pp") if pp > 1 else 0
    chunks = list(range(pp_rank, len(STAGE_LAYERS), pp))
    parts = [split_chunk(model, c) for c in chunks]
    for part in parts:
        if PLAN["tp"] > 1:
            apply_tp(part, mesh["tp"])
        if PLAN["recompute"] != "none":
            apply_ac(part)
        if PLAN["dp"] > 1:
            apply_fsdp(part, dp_mesh(mesh), param_dtype)
    if pp == 1:
        return parts, None
    from torch.distributed import pipelining

    group = mesh.get_group("pp")
    stages = [pipelining.PipelineStage(part, c, len(STAGE_LAYERS), device, group=group)
              for part, c in zip(parts, chunks)]
    cls = getattr(pipelining, SCHEDULE)
    n_micro = PLAN["num_microbatches"]
    schedule = cls(stages[0], n_micro, loss_fn=loss_fn) if len(stages) == 1 else cls(stages, n_micro,
                                                                                      loss_fn=loss_fn)
    return parts, schedule
'''


def fsdp2_module(plan: EmitPlan) -> str:
    """The emitted module's text. Every value is written with ``repr`` (no user text in code)."""
    check_fsdp2(plan)
    par = plan.parallel
    rt = plan.runtime("fsdp2")  # reshard_after_forward and the reduce dtype the plan was priced with
    modes = block_modes(plan)
    values = {
        "tp": par.tp, "pp": par.pp, "dp": plan.dp, "vp": par.vp,
        "hsdp_shard": par.hsdp_shard_size or 0, "micro_batch_size": par.micro_batch_size,
        "global_batch_size": plan.job.global_batch_size, "seq_len": plan.job.seq_len,
        "num_microbatches": plan.num_microbatches, "sequence_parallel": bool(par.tp > 1 and par.sequence_parallel),
        "recompute": par.recompute,
    }
    text = _TEMPLATE
    for key, val in {"__MODEL_NAME__": repr(plan.model.name), "__PLAN__": repr(values),
                     "__STAGE_LAYERS__": repr(stage_chunks(plan)), "__SCHEDULE__": repr(schedule_name(plan)),
                     "__RESHARD__": repr(rt.reshard_after_forward), "__BLOCK_MODES__": repr(modes),
                     "__KV_HEADS__": repr(plan.model.num_kv_heads),
                     "__HEAD_DIM__": repr(plan.model.head_dim_resolved),
                     "__REDUCE__": "torch.bfloat16" if rt.grad_reduce_dtype == "bf16" else "torch.float32"}.items():
        text = text.replace(key, val)
    return text


def fsdp2_files(plan: EmitPlan) -> dict[str, str]:
    header = script_header(plan, "PyTorch FSDP2 + DTensor", extra=[
        "TRAIN_SCRIPT is your training script; it imports autoplan_parallelize from this folder."])
    body = 'export PYTHONPATH="$EMIT_DIR${PYTHONPATH:+:$PYTHONPATH}"'
    program = ['"${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script}"', "${EXTRA_ARGS:-}"]
    return {
        f"{MODULE_NAME}.py": fsdp2_module(plan),
        "train_fsdp2_torchrun.sh": torchrun_script(header, body, program, plan.num_nodes, plan.procs_per_node,
                                                   dict(plan.runtime("fsdp2").env)),  # the priced allocator
    }
