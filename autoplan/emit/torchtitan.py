"""torchtitan: CLI overrides for torchtitan 0.3.x and the TOML job file of torchtitan <= 0.2.x.

0.3.x (``torchtitan/config/manager.py``): ``--module M --config FN`` picks a ``config_registry``
function, then tyro overrides ``--<section>.<field>`` and the activation-checkpoint subcommand
``activation_checkpoint:{selective,full,none}`` (it must come last). Field names follow
``torchtitan/config/configs.py`` (``ParallelismConfig``, ``TrainingConfig``).

<= 0.2.x (``torchtitan/config/job_config.py``): one TOML file with ``[model] name/flavor``,
``[training]``, ``[parallelism]``, ``[activation_checkpoint] mode``. That parser does not type-check
the file, so ``toml_v02`` checks every value against ``V02_SCHEMA`` before writing it.

Only models torchtitan ships can be emitted; ``titan_model`` says clearly when a model is not one.
Where the shipped config function does not match the plan's precision (the stock ``llama3_405b``
converts linears to float8; the stock 8B/70B do not), a small config module is emitted beside the
overrides and ``--module`` points at it — the extension mechanism torchtitan 0.3 documents.
"""

from __future__ import annotations

from typing import Any

from autoplan.emit.launch import bash_array, script_header, slurm_script, torchrun_script
from autoplan.emit.plan import EmitPlan, dynamic_rope_notes
from autoplan.errors import ConfigError
from cost_models.specs import ModelSpec
from cost_models.targets.common import targets_that
# the shipped flavors are the torchtitan target's facts (its profile refuses the models they cannot build)
from cost_models.targets.torchtitan_models import TORCHTITAN_03, arch_overrides, titan_model
from cost_models.validate import pipeline_split

CONFIG_MODULE = "autoplan_torchtitan_config"
CONFIG_FN = "autoplan_config"


def needs_config_module(plan: EmitPlan) -> bool:
    """A config module is emitted when the shipped config function cannot express the plan: no function for the
    flavor, another precision, or an fp8 recipe other than the shipped converter's default (rowwise)."""
    t = titan_model(plan.model)
    recipe = plan.runtime("torchtitan").fp8_recipe
    return (not t.config_fn or t.config_precision != plan.job.precision or bool(arch_overrides(plan.model))
            or recipe not in (None, "rowwise"))


def _dp_degrees(plan: EmitPlan) -> tuple[int, int, str]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree, fsdp_reshard_after_forward).

    ZeRO-3 is FSDP (HSDP with ``hsdp_shard_size``); ZeRO-0 is ``dp_replicate = dp`` (torchtitan still shards
    over cp: the profile prices it as FSDP over cp). ``reshard_after_forward`` as priced: torchtitan's "default"
    (reshard unless pipelining) when it matches, else "always" / "never"."""
    par, dp = plan.parallel, plan.dp
    r = plan.runtime("torchtitan").reshard_after_forward
    reshard = "default" if bool(r) == (par.pp == 1) else ("always" if r else "never")
    if par.zero_stage == 0:
        return dp, 1, reshard
    if par.hsdp_shard_size and par.hsdp_shard_size % par.cp == 0 and par.hsdp_shard_size // par.cp < dp:
        shard = par.hsdp_shard_size // par.cp
        return dp // shard, shard, reshard
    return 1, dp, reshard


def pipeline_schedule(plan: EmitPlan) -> str:
    par = plan.parallel
    if par.vp > 1:
        return "Interleaved1F1B"
    return "1F1B"


def module_fqns_per_model_part(plan: EmitPlan) -> list[list[str]]:
    """torchtitan FQNs per pipeline chunk (``tok_embeddings`` first, ``norm`` + ``lm_head`` last),
    following ``pipeline_split`` exactly (the split Megatron gets, uneven ones included). With ``vp`` chunks per
    rank, chunk ``c`` runs on rank ``c % pp`` (looped schedules)."""
    sizes = [n for *_, n in pipeline_split(plan.model, plan.parallel).chunk_order()]
    parts, start = [], 0
    for i, n in enumerate(sizes):
        part = [f"layers.{j}" for j in range(start, start + n)]
        start += n
        if i == 0:
            part.insert(0, "tok_embeddings")
        if i == len(sizes) - 1:
            part += ["norm", "lm_head"]
        parts.append(part)
    return parts


def _batch(plan: EmitPlan) -> tuple[int, int]:
    """(local_batch_size, pipeline_parallel_microbatch_size). With PP the local batch is the whole
    per-DP-rank batch, split into micro-batches by the schedule; without PP torchtitan runs
    ``local_batch_size`` at once and accumulates gradients up to ``global_batch_size``."""
    mbs = plan.parallel.micro_batch_size
    if plan.parallel.pp > 1:
        return plan.job.global_batch_size // plan.dp, mbs
    return mbs, mbs


def titan_settings(plan: EmitPlan) -> dict[str, dict[str, Any]]:
    """The plan as torchtitan fields, by section (shared by the 0.3 CLI and the 0.2 TOML)."""
    par = plan.parallel
    rep, shard, reshard = _dp_degrees(plan)
    local, micro = _batch(plan)
    p: dict[str, Any] = {
        "data_parallel_replicate_degree": rep,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": reshard,
        "tensor_parallel_degree": par.tp,
        "enable_sequence_parallel": bool(par.sequence_parallel),
        "pipeline_parallel_degree": par.pp,
        "context_parallel_degree": par.cp,
        "expert_parallel_degree": par.ep,
    }
    if par.pp > 1:
        p["pipeline_parallel_schedule"] = pipeline_schedule(plan)
        p["pipeline_parallel_microbatch_size"] = micro
        p["module_fqns_per_model_part"] = module_fqns_per_model_part(plan)
    t = {"local_batch_size": local, "global_batch_size": plan.job.global_batch_size, "seq_len": plan.job.seq_len}
    rt = plan.runtime("torchtitan")
    c: dict[str, Any] = {"enable": rt.compile, "enable_async_tensor_parallel": rt.async_tp}
    if rt.compile:  # compile.components (configs.py:298), always stated: the config functions set their own
        # (deepseek_v3_671b's and kimi_k2_7's compile the loss alone, the llama3 / qwen3 nvfp4 and mxfp8 ones the model)
        c["components"] = rt.compile_components.split("+")
    out = {"parallelism": p, "training": t, "compile": c}
    if rt.moe_force_balance:  # config/configs.py:365 (round-robin routing)
        out["debug"] = {"moe_force_load_balance": True}
    return out


def notes(plan: EmitPlan) -> list[str]:
    par, out = plan.parallel, []
    if par.zero_stage == 0 and par.cp > 1:
        out.append(f"zero_stage=0 with cp={par.cp}: torchtitan shards parameters over dp_shard x cp (FSDP over cp); "
                   "priced that way")
    if needs_config_module(plan):
        t, differs = titan_model(plan.model), arch_overrides(plan.model)
        why = (f"torchtitan ships {t.module} {t.flavor} without a config function" if not t.config_fn else
               f"torchtitan's {t.config_fn} trains in {t.config_precision}, the plan in {plan.job.precision}"
               if t.config_precision != plan.job.precision else
               f"{plan.model.name} differs from torchtitan's {t.module} {t.flavor} flavor in {sorted(differs)}")
        out.append(f"{why}: emitted {CONFIG_MODULE}.py (put its folder on PYTHONPATH; the launch scripts do)")
    out += attention_notes(plan) + v02_model_notes(plan)
    out += dynamic_rope_notes(plan) + balancing_warnings(plan.model) + router_precision_warnings(plan.model)
    return out


def attention_notes(plan: EmitPlan) -> list[str]:
    """The attention kernel torchtitan 0.3.0 builds (``Runtime.titan_attention``) and what its mask leaves unpriced:
    get_attention_config's backends mask per document (block-causal, from the dataloader's positions)."""
    rt = plan.runtime("torchtitan")
    if not rt.titan_attention:
        return []
    from cost_models.op_cost import titan_attention_rates

    kernel = {"flex": "FlexAttention", "varlen": "varlen FlashAttention"}[titan_model(plan.model).attn_backend]
    rates = titan_attention_rates(plan.model, plan.cluster, rt)
    how = (f"at its measured rate (forward {rates[0]:.2f}, backward {rates[1]:.2f} of cuDNN SDPA's)"
           if rates else "at the cuDNN SDPA figure (no measured rate for this kernel on "
           f"{plan.cluster.gpu.generation})")
    return [f"torchtitan 0.3.0 runs {plan.model.name}'s attention on {kernel} with per-document (block-causal) masks "
            f"from the dataloader's positions: priced {how}, as one document per {plan.job.seq_len}-token sequence; "
            "shorter documents do less attention work than priced"]


def balancing_warnings(model: ModelSpec) -> list[str]:
    """What torchtitan 0.3.0 cannot train of the model's MoE load balancing: its MoE has no auxiliary loss at all,
    only aux-loss-free balancing by a per-expert bias updated before each optimizer step (``MoE.Config.
    load_balance_coeff``, default 1e-3, in every flavor: torchtitan/models/common/moe.py, config_utils.py
    ``make_moe_config``; components/optimizer/optimizer.py's pre-hook). No config field adds the loss."""
    if not model.is_moe:
        return []
    r, out = model.arch.router, []
    if r.aux_loss != "none" and r.aux_loss_coeff:
        # the targets that train the loss and emit the model (target_model_notes' rule)
        others = targets_that(lambda p: p.trains_moe_aux_loss and p.model_error(model) is None
                              and not p.emit_model_errors(model), "torchtitan")
        where = (f"use --target {' or '.join(others)} for the published balancing" if others else
                 "no target emits this model with it")
        out.append(f"WARNING: {model.name}'s {r.aux_loss} load-balancing loss (coefficient {r.aux_loss_coeff:g}) is "
                   "not trained: torchtitan 0.3.0's MoE has no auxiliary loss (only the expert-bias balancing "
                   f"below); {where}")
    if not r.expert_bias:
        out.append(f"WARNING: {model.name} has no expert bias, but torchtitan 0.3.0 balances every MoE with one "
                   "(MoE load_balance_coeff 1e-3, aux-loss-free, arXiv 2408.15664); kept, since it is torchtitan's "
                   "only balancing")
    return out


def router_precision_warnings(model: ModelSpec) -> list[str]:
    """torchtitan 0.3.0 computes every MoE gate under a float32 autocast (TokenChoiceTopKRouter.forward,
    torchtitan/models/common/moe.py:297-299), with no knob: a model whose gate runs in the activations' dtype
    (``RouterSpec.fp32_logits`` false: Qwen, GPT-OSS, OLMoE) is trained with a more precise gate than published."""
    if not model.is_moe or model.arch.router.fp32_logits:
        return []
    return [f"WARNING: {model.name}'s router computes its logits in bf16, torchtitan 0.3.0 in fp32 (its gate runs "
            "under a float32 autocast, no knob): the same model, a more precise gate"]


def _flag(section: str, key: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return [f"--{section}.{key}" if value else f"--{section}.no-{key.replace('_', '-')}"]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):  # list[str] (compile.components):
        return [f"--{section}.{key}", ",".join(value)]  # one comma-joined value (config/manager.py list_str_rule)
    if isinstance(value, list):  # list[list[str]] (module_fqns_per_model_part): one comma-joined value per part
        return [f"--{section}.{key}", *(",".join(v) for v in value)]
    return [f"--{section}.{key}", str(value)]


# torchtitan 0.3.0's default SPMD backend ("spmd_types") follows PyTorch nightly; with the pinned
# torch 2.13.0 its FSDP step rejects the model's plain parameters. "partial_dtensor" (DTensor on the
# model-parallel axes, FSDP2 on the data axes) is the path the validate extra proves on that torch.
SPMD_BACKEND = "partial_dtensor"


def torchtitan_overrides(plan: EmitPlan) -> list[str]:
    """The torchtitan 0.3.x command line (after ``-m torchtitan.train``)."""
    t = titan_model(plan.model)
    module, fn = (CONFIG_MODULE, CONFIG_FN) if needs_config_module(plan) else (t.module, t.config_fn)
    args = ["--module", module, "--config", fn, "--parallelism.spmd_backend", SPMD_BACKEND]
    for section, fields in titan_settings(plan).items():
        for key, value in fields.items():
            args += _flag(section, key, value)
    # torchtitan 0.3.0 trainer.py:179-208 (_validate_cuda_graphs) refuses its default CUDA graphs with pipelining,
    # and with expert parallelism over the standard all-to-all dispatcher (it syncs with the host)
    if plan.parallel.pp > 1 or plan.parallel.ep > 1:
        args.append("--training.disable_cuda_graphs")
    args.append(f"activation_checkpoint:{plan.parallel.recompute}")  # subcommand: must come last
    return args


def config_module(plan: EmitPlan) -> str:
    """A torchtitan 0.3 ``config_registry``-style module: the shipped config, in the plan's precision, building
    the model the user asked for.

    bf16 from an fp8 config: start from the family's bf16 config function (building the fp8 one would
    construct its float8 converter, which needs torchao), swap in the flavor, re-apply the fp8 config's own
    settings (``keep``: compile, async TP, optimizer, schedule). fp8 from a bf16 config: the shipped config with a
    ``Float8LinearConverter`` (lm_head kept in bf16). Architecture differences from the flavor (``arch_overrides``)
    are set on every RoPE / RMSNorm config of the model."""
    t = titan_model(plan.model)
    fp8 = plan.job.precision == "fp8"
    over = arch_overrides(plan.model)
    differs = dict(over)
    mtp = over.pop("num_mtp_layers", 0)
    rope = {k: over[k] for k in ("theta", "scaling") if k in over}
    base = t.config_fn if (fp8 and t.config_fn) or (t.config_fn and t.config_precision == "bf16") else \
        (t.bf16_base or t.config_fn)
    why = (f"torchtitan's {t.config_fn} trains in {t.config_precision}" if t.config_fn and t.config_precision !=
           plan.job.precision else f"torchtitan ships the {t.flavor} flavor without a config function"
           if not t.config_fn else f"{plan.model.name} differs from torchtitan's {t.flavor} flavor: {differs}")
    lines = [
        f'"""torchtitan config for {t.module} {t.flavor} in {plan.job.precision} (generated by autoplan).',
        "",
        f"{why}; this one starts from {base}.",
        '"""',
        "",
        "import dataclasses",
        "",
        f"from torchtitan.models.{t.module} import model_registry",
        f"from torchtitan.models.{t.module}.config_registry import {base} as _base",
    ]
    recipe = plan.runtime("torchtitan").fp8_recipe
    if fp8 and recipe == "mxfp8":
        lines.append("from torchtitan.components.quantization.mx import MXFP8LinearConverter")
    elif fp8:
        lines.append("from torchtitan.components.quantization import Float8LinearConverter")
    keep = t.keep if base != t.config_fn else ()
    if any("default_adamw" in v or "LRSchedulersContainer" in v for _, v in keep):
        lines += ["from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw"]
    if any("CompileConfig" in v for _, v in keep):
        lines += ["from torchtitan.config import CompileConfig"]
    if rope or "eps" in over:
        lines += ["from torchtitan.models.common import RMSNorm, RoPE"]
    if mtp:
        lines += ["from torchtitan.models.common.config_utils import decoder_vocab_size",
                  "from torchtitan.models.deepseek_v3.mtp import MTPLoss"]
    lines += [
        "", "",
        "def _set(node, cls, **values):",
        '    """Set ``values`` on every ``cls`` config nested in ``node`` (each layer has its own copy)."""',
        "    seen = set()",
        "    stack = [node]",
        "    while stack:",
        "        x = stack.pop()",
        "        if id(x) in seen:",
        "            continue",
        "        seen.add(id(x))",
        "        if isinstance(x, cls):",
        "            for k, v in values.items():",
        "                setattr(x, k, v)",
        "        if dataclasses.is_dataclass(x):",
        "            stack += [getattr(x, f.name) for f in dataclasses.fields(x)]",
        "        elif isinstance(x, (list, tuple)):",
        "            stack += list(x)",
        "", "",
        f"def {CONFIG_FN}():", "    config = _base()"]
    extra = f", num_mtp_layers={mtp}" if mtp else ""
    compile_on = plan.runtime("torchtitan").model_compiled
    if fp8 and recipe == "mxfp8":
        lines += [
            f"    compile_on = {compile_on}  # the plan's compile (the command line sets compile.*, not _base())",
            f"    config.model_spec = model_registry({t.flavor!r}{extra}, converters=[",
            "        MXFP8LinearConverter.Config(model_compile_enabled=compile_on)])  # mxfp8: sm_100",
        ]
    elif fp8:
        lines += [
            f"    compile_on = {compile_on}  # the plan's compile (the command line sets compile.*, not _base())",
            f"    config.model_spec = model_registry({t.flavor!r}{extra}, converters=[",
            f"        Float8LinearConverter.Config(recipe_name={recipe!r}, filter_fqns=['lm_head'],",
            "                                     model_compile_enabled=compile_on)])",
        ]
    else:
        lines.append(f"    config.model_spec = model_registry({t.flavor!r}{extra})  # no float8 converter: bf16")
    lines += [f"    config.{k} = {v}  # " + (f"as in {t.config_fn}" if t.config_fn else f"for {t.flavor}")
              for k, v in keep]
    if mtp:  # as torchtitan's deepseek_v3_debugmodel_mtp: the MTP modules need their loss
        lines.append("    config.loss = MTPLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))")
    if rope:
        lines.append(f"    _set(config.model_spec.model, RoPE.Config, **{rope!r})  # {plan.model.name}'s RoPE")
    if "eps" in over:
        lines.append(f"    _set(config.model_spec.model, RMSNorm.Config, eps={over['eps']!r})  # "
                     f"{plan.model.name}'s norm epsilon")
    lines += ["    return config", ""]
    return "\n".join(lines)


# ---- torchtitan <= 0.2.x: TOML ----------------------------------------------------------------------

V02_SCHEMA: dict[str, dict[str, Any]] = {  # torchtitan 0.2.x config/job_config.py (0.2.0 and 0.2.2 agree here);
    # tests/test_emit.py parses the emitted file with 0.2.2's own ConfigManager where it is installed
    "job": {"description": str},
    "model": {"name": str, "flavor": str, "converters": list},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int},
    "parallelism": {
        "data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
        "fsdp_reshard_after_forward": ("default", "always", "never"), "tensor_parallel_degree": int,
        "disable_loss_parallel": bool, "enable_async_tensor_parallel": bool, "pipeline_parallel_degree": int,
        "pipeline_parallel_schedule": str, "pipeline_parallel_microbatch_size": int,
        "module_fqns_per_model_part": list, "context_parallel_degree": int, "expert_parallel_degree": int,
    },
    "activation_checkpoint": {"mode": ("selective", "full", "none"), "selective_ac_option": str},
    "compile": {"enable": bool, "components": list},
    "quantize.linear.float8": {"recipe_name": ("tensorwise", "rowwise", "rowwise_with_gw_hp"), "filter_fqns": list},
    "quantize.linear.mx": {"recipe_name": str, "filter_fqns": list},
}


def check_v02(doc: dict[str, dict[str, Any]]) -> None:
    """Type-check a 0.2.x job document against ``V02_SCHEMA`` (that parser would not)."""
    for section, fields in doc.items():
        if section not in V02_SCHEMA:
            raise ConfigError(f"torchtitan <= 0.2 has no section [{section}]", valid=sorted(V02_SCHEMA))
        schema = V02_SCHEMA[section]
        for key, value in fields.items():
            if key not in schema:
                raise ConfigError(f"torchtitan <= 0.2 has no field [{section}] {key}", valid=sorted(schema))
            want = schema[key]
            if isinstance(want, tuple):
                if value not in want:
                    raise ConfigError(f"[{section}] {key} = {value!r} is not allowed", valid=want)
            elif want is int:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ConfigError(f"[{section}] {key} must be an integer, not {value!r}")
                if value < 1 and not (key == "data_parallel_shard_degree" and value == -1):
                    raise ConfigError(f"[{section}] {key} must be >= 1, not {value}")
            elif not isinstance(value, want):
                raise ConfigError(f"[{section}] {key} must be a {want.__name__}, not {value!r}")


def v02_document(plan: EmitPlan) -> dict[str, dict[str, Any]]:
    t = titan_model(plan.model)
    settings = titan_settings(plan)
    par = dict(settings["parallelism"])
    par["disable_loss_parallel"] = not par.pop("enable_sequence_parallel")
    if "module_fqns_per_model_part" in par:  # 0.2's models name the output projection ``output`` (llama3/model/
        # model.py:458 @ v0.2.2; its pipeline split lists ["norm", "output"], distributed/pipeline_parallel.py:333),
        # and a part's unlisted modules become None: "lm_head" would drop it
        par["module_fqns_per_model_part"] = [["output" if n == "lm_head" else n for n in part]
                                             for part in par["module_fqns_per_model_part"]]
    rt = plan.runtime("torchtitan")
    par["enable_async_tensor_parallel"] = rt.async_tp  # 0.2 keeps it under [parallelism], 0.3 under [compile]
    # 0.2 registers its converters by section name (components/quantization/float8.py:238, mx.py:171 @ v0.2.2);
    # the output projection (0.2's ``output``) stays in bf16 as in the 0.3 config module's filter
    quant = {"mxfp8": "quantize.linear.mx"}.get(rt.fp8_recipe, "quantize.linear.float8")
    doc: dict[str, dict[str, Any]] = {
        "job": {"description": f"autoplan plan for {plan.model.name}"},
        "model": {"name": t.module, "flavor": t.flavor, "converters": [quant] if plan.job.precision == "fp8" else []},
        "training": settings["training"],
        "parallelism": par,
        "activation_checkpoint": {"mode": plan.parallel.recompute}
        | ({"selective_ac_option": "op"} if plan.parallel.recompute == "selective" else {}),
        "compile": {"enable": rt.compile} | ({"components": settings["compile"]["components"]} if rt.compile else {}),
    }
    if plan.job.precision == "fp8":
        doc[quant] = ({"recipe_name": rt.fp8_recipe} if quant.endswith("float8") else {}) | {"filter_fqns": ["output"]}
    return doc


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def v02_model_notes(plan: EmitPlan) -> list[str]:
    """What the 0.2 job file cannot say: it names a flavor, so differences from the flavor are not set there."""
    differs = arch_overrides(plan.model)
    if not differs:
        return []
    t = titan_model(plan.model)
    return [f"torchtitan_v02.toml names torchtitan's {t.module} {t.flavor} flavor only: {plan.model.name} differs from "
            f"0.3.0's in {sorted(differs)}, which the 0.3 command line sets and a 0.2 job file cannot (0.2's own "
            "flavors are not checked: the file trains whatever its flavor is)"]


def toml_v02(plan: EmitPlan) -> str:
    doc = v02_document(plan)
    check_v02(doc)
    out = ["# torchtitan <= 0.2.x job file (generated by autoplan); run with --job.config_file <this file>"]
    out += [f"# {n}" for n in v02_model_notes(plan)]
    for section, fields in doc.items():
        out.append(f"\n[{section}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
    return "\n".join(out) + "\n"


def torchtitan_files(plan: EmitPlan) -> dict[str, str]:
    args = torchtitan_overrides(plan)
    header = script_header(plan, f"torchtitan {TORCHTITAN_03}", extra=[
        "torchtitan builds its mesh as [pp, dp_replicate, dp_shard, cp, tp]; tp is innermost, so each TP",
        f"group of {plan.parallel.tp} consecutive ranks sits inside one node.",
        "Put --hf_assets_path / --dataloader.* flags for your setup in EXTRA_ARGS.",
    ])
    body = bash_array("TITAN_ARGS", args)
    env = dict(plan.runtime("torchtitan").env)  # the allocator setting torchtitan's launcher sets (the profile)
    files = {"torchtitan_overrides.txt": "\n".join(args) + "\n", "torchtitan_v02.toml": toml_v02(plan)}
    if needs_config_module(plan):
        files[f"{CONFIG_MODULE}.py"] = config_module(plan)
        body = 'export PYTHONPATH="$EMIT_DIR${PYTHONPATH:+:$PYTHONPATH}"\n' + body
    # `activation_checkpoint:...` must stay last for tyro: EXTRA_ARGS go before it when given.
    program = ["-m", "torchtitan.train", '"${TITAN_ARGS[@]:0:${#TITAN_ARGS[@]}-1}"', "${EXTRA_ARGS:-}",
               '"${TITAN_ARGS[-1]}"']
    files["train_torchtitan_torchrun.sh"] = torchrun_script(header, body, program, plan.num_nodes,
                                                            plan.procs_per_node, env)
    files["train_torchtitan_slurm.sbatch"] = slurm_script(header, body, program, plan.num_nodes,
                                                          plan.procs_per_node, env,
                                                          job_name=f"torchtitan-{plan.model.name}")
    return files
