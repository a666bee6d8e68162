"""torchtitan 0.3 checks: the emitted overrides through torchtitan's own config, mesh and model code
(runs inside the checker process; rank 0's view of a fake process group at the plan's world size)."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Any

from autoplan.emit import EmitPlan
from autoplan.emit.torchtitan import module_fqns_per_model_part, titan_model
from cost_models.targets.torchtitan_models import ATTENTION_MODULE

# Spellings torchtitan's MeshAxisName uses for the axes autoplan plans.
_AXES = {"tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep"}


def _quiet() -> None:
    logging.getLogger().setLevel(logging.ERROR)
    for name in ("torchtitan", "root"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.simplefilter("ignore")


def _parse(out: Path) -> tuple[str, Any]:
    from torchtitan.config.manager import ConfigManager

    sys.path.insert(0, str(out))  # the emitted config module, when there is one
    args = [a for a in (out / "torchtitan_overrides.txt").read_text().split("\n") if a]
    cfg = ConfigManager().parse_args(args)
    p = cfg.parallelism
    return (f"--module {args[1]} --config {args[3]}: dp_replicate={p.data_parallel_replicate_degree} "
            f"dp_shard={p.data_parallel_shard_degree} tp={p.tensor_parallel_degree} "
            f"pp={p.pipeline_parallel_degree} cp={p.context_parallel_degree} ep={p.expert_parallel_degree}, "
            f"activation_checkpoint={_ac_name(cfg.activation_checkpoint)}"), cfg


def _ac_name(ac: Any) -> str:
    """The parsed activation-checkpoint config's class (``none`` when torchtitan parsed AC off to None)."""
    return "none" if ac is None else type(ac).__qualname__.split(".")[0]


def _knobs(plan: EmitPlan, cfg: Any) -> tuple[str, Any]:
    """The parsed config runs what was priced: compile (and what it covers), async TP, activation checkpointing, the
    attention kernel (``TitanModel.attn_backend``). The config function's own settings are the base the command line
    overrides (deepseek_v3_671b compiles the loss alone), so a knob the emitter leaves unsaid would run the config
    function's choice, not the plan's."""
    rt = plan.runtime("torchtitan")
    c = cfg.compile
    kernels = {type(layer.attention.inner_attention).__qualname__.split(".")[0]
               for layer in cfg.model_spec.model.layers}
    got = {"compile": c.enable, "components": sorted(c.components) if c.enable else None,
           "async_tp": c.enable_async_tensor_parallel, "ac": _ac_name(cfg.activation_checkpoint),
           "attention": sorted(kernels)}
    want = {"compile": rt.compile, "components": sorted(rt.compile_components.split("+")) if rt.compile else None,
            "async_tp": rt.async_tp, "ac": {"none": "none", "full": "FullAC", "selective": "SelectiveAC"}.get(
                plan.parallel.recompute, plan.parallel.recompute),
            "attention": [ATTENTION_MODULE[titan_model(plan.model).attn_backend]]}
    if got != want:
        raise AssertionError(f"parsed {got} != priced {want}")
    return ", ".join(f"{k}={v}" for k, v in got.items()) + " (as priced)", got


def _dims(plan: EmitPlan, cfg: Any) -> tuple[str, Any]:
    from torchtitan.distributed import ParallelDims

    pd = ParallelDims.from_config(cfg.parallelism, plan.cluster.num_gpus)
    want = {"tp": plan.parallel.tp, "pp": plan.parallel.pp, "cp": plan.parallel.cp, "ep": plan.parallel.ep,
            "dp": plan.dp}
    got = {"tp": pd.tp, "pp": pd.pp, "cp": pd.cp, "ep": pd.ep, "dp": pd.dp_replicate * pd.dp_shard}
    if got != want:
        raise AssertionError(f"ParallelDims {got} != plan {want}")
    return f"world {pd.world_size}: " + ", ".join(f"{k}={v}" for k, v in got.items()), pd


def _mesh(plan: EmitPlan, pd: Any) -> str:
    import torchtitan.distributed.parallel_dims as pdm
    from torchtitan.distributed import utils as dist_utils

    pdm.device_type = "cpu"  # the fake backend needs no accelerator
    dist_utils.init_fake_mode(plan.cluster.num_gpus)
    pd.build_mesh()
    sizes = {}
    for ours, theirs in _AXES.items():
        mesh = pd.get_optional_mesh(theirs)
        sizes[ours] = 1 if mesh is None else mesh.size()
    batch = pd.get_optional_mesh("batch")
    sizes["dp"] = 1 if batch is None else batch.size()
    want = {"tp": plan.parallel.tp, "pp": plan.parallel.pp, "cp": plan.parallel.cp, "ep": plan.parallel.ep,
            "dp": plan.dp}
    if sizes != want:
        raise AssertionError(f"mesh axis sizes {sizes} != plan {want}")
    if pd.seq_len_divisor and plan.job.seq_len % pd.seq_len_divisor:
        raise AssertionError(f"seq_len {plan.job.seq_len} not divisible by {pd.seq_len_divisor}")
    tp_mesh = pd.get_optional_mesh("tp")
    tp_ranks = [] if tp_mesh is None else tp_mesh.mesh.flatten().tolist()
    if tp_ranks and tp_ranks != list(range(len(tp_ranks))):
        raise AssertionError(f"rank 0's TP group {tp_ranks} is not consecutive ranks")
    # The cost model prices the EP all-to-all on Megatron's expert strides (collectives.RankStrides: ep consecutive
    # ranks, TP peers included when ep spans them); torchtitan's sparse mesh pp x dp_replicate x efsdp x ep must agree.
    ep_mesh = pd.get_optional_mesh("ep") if plan.parallel.ep > 1 else None
    ep_ranks = [] if ep_mesh is None else ep_mesh.mesh.flatten().tolist()
    if ep_ranks:
        from cost_models.collectives import RankStrides

        p = plan.parallel
        stride = RankStrides.megatron(p.tp, p.cp, plan.dp, p.ep).ep
        if ep_ranks != [i * stride for i in range(p.ep)]:
            raise AssertionError(f"rank 0's EP group {ep_ranks[:8]}... is not the priced one (stride {stride})")
    return (f"world mesh {pd.world_mesh.size()} ranks; axis sizes " + ", ".join(f"{k}={v}" for k, v in sizes.items())
            + (f"; rank 0's TP group {tp_ranks}" if tp_ranks else "")
            + (f"; EP group ranks {ep_ranks[0]}..{ep_ranks[-1]} (as priced)" if ep_ranks else ""))


def _architecture(plan: EmitPlan, cfg: Any) -> str:
    mc = cfg.model_spec.model
    layer = mc.layers[-1]
    att = layer.attention
    m = plan.model
    names = ["layers", "dim", "heads"]
    got = [len(mc.layers), mc.dim, att.n_heads]
    want = [m.num_layers, m.hidden_size, m.num_attention_heads]
    if hasattr(att, "kv_lora_rank"):  # MLA (deepseek_v3/model.py Attention.Config): no n_kv_heads / head_dim
        mla_fields = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        names += list(mla_fields)
        got += [getattr(att, f) for f in mla_fields]
        want += [getattr(m.mla, f) if m.mla is not None else None for f in mla_fields]
    else:
        names += ["kv_heads", "head_dim"]
        got += [att.n_kv_heads or att.n_heads, att.head_dim or mc.dim // att.n_heads]
        want += [m.num_kv_heads, m.head_dim_resolved]
    names.append("vocab")
    got.append(mc.vocab_size)
    want.append(m.vocab_size)
    if getattr(layer, "moe", None) is not None:
        moe = layer.moe
        names += ["experts", "top_k", "expert_ffn"]
        got += [moe.num_experts, moe.router.top_k, moe.routed_experts.inner_experts.hidden_dim]
        want += [m.num_experts, m.moe_top_k, m.expert_ffn_hidden_size]
    else:
        names.append("ffn")
        got.append(layer.feed_forward.w1.out_features)
        want.append(m.ffn_hidden_size)
    if got != want:
        raise AssertionError(f"torchtitan {cfg.model_spec.name} {cfg.model_spec.flavor} has ({', '.join(names)}) "
                             f"{tuple(got)}, the plan {tuple(want)}")
    return f"{cfg.model_spec.name} {cfg.model_spec.flavor}: ({', '.join(names)}) = {tuple(got)}"


def _apply(plan: EmitPlan, cfg: Any, pd: Any, out: Path) -> str:
    import torch
    from torchtitan.distributed import utils as dist_utils

    ms = cfg.model_spec
    mc = ms.model
    dist_utils.set_spmd_backend(cfg.parallelism.spmd_backend)  # before the build, as the Trainer does
    mc.update_from_config(config=cfg)
    with torch.device("meta"):
        model = mc.build()
    common = dict(parallel_dims=pd, training=cfg.training, parallelism=cfg.parallelism,
                  compile_config=cfg.compile, ac_config=cfg.activation_checkpoint, dump_folder=str(out / "dump"))
    if pd.pp_enabled:
        loss_fn = cfg.loss.build(compile_config=cfg.compile)
        schedule, parts, first, last = ms.pipelining_fn(model, device=torch.device("cpu"), model_config=mc,
                                                        parallelize_fn=ms.parallelize_fn, loss_fn=loss_fn, **common)
        expected = module_fqns_per_model_part(plan)[0::plan.parallel.pp]  # rank 0's chunks, in order
        held = []
        for part in parts:
            names = []
            for n, _ in part.named_parameters():
                top = ".".join(n.split(".")[:2]) if n.startswith("layers.") else n.split(".")[0]
                if top not in names:
                    names.append(top)
            held.append(names)
        if [set(h) for h in held] != [set(w) for w in expected]:
            raise AssertionError(f"rank 0 holds {[h[:2] + h[-1:] for h in held]}, plan says "
                                 f"{[w[:2] + w[-1:] for w in expected]}")
        n_micro = getattr(schedule, "_n_microbatches", None)
        return (f"{type(schedule).__name__} with {n_micro} micro-batches; rank 0 holds {len(parts)} chunk(s) "
                "as planned: " + "; ".join(f"{h[0]}..{h[-1]} ({len(h)} modules)" for h in held))
    model = ms.parallelize_fn(model, **common)
    name, param = next(iter(model.named_parameters()))
    return f"parallelize_fn applied; {name}: {type(param).__name__} {getattr(param, 'placements', '')}"


def run(plan: EmitPlan, out: Path, rep) -> None:  # type: ignore[no-untyped-def]
    _quiet()
    try:
        titan_model(plan.model)
    except Exception as e:  # noqa: BLE001
        rep.emit("torchtitan: the model is one torchtitan ships", False, str(e))
        return
    cfg = rep.check("torchtitan: ConfigManager().parse_args accepts the emitted overrides", lambda: _parse(out))
    if cfg is None:
        return
    rep.check("torchtitan: the parsed compile / async TP / AC / attention kernel are the priced ones",
              lambda: _knobs(plan, cfg))
    rep.check("torchtitan: the shipped model's architecture equals the plan's", lambda: _architecture(plan, cfg))
    pd = rep.check(f"torchtitan: ParallelDims validates the degrees ({plan.cluster.num_gpus} ranks)",
                   lambda: _dims(plan, cfg))
    if pd is None:
        return
    ok = rep.check("torchtitan: build_mesh() under the fake process-group backend", lambda: _mesh(plan, pd))
    if ok is None:
        return
    what = "pipelining_fn + parallelize_fn" if plan.parallel.pp > 1 else "parallelize_fn"
    rep.check(f"torchtitan: the model's {what} apply to a meta-device model (rank 0)",
              lambda: _apply(plan, cfg, pd, out))
