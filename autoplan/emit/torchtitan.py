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

from dataclasses import dataclass
from typing import Any, Literal

from autoplan.emit.launch import bash_array, script_header, slurm_script, torchrun_script
from autoplan.emit.plan import EmitPlan
from autoplan.errors import ConfigError
from cost_models.specs import ModelSpec
from cost_models.validate import stage_layers

TORCHTITAN_03 = "0.3.0"
CONFIG_MODULE = "autoplan_torchtitan_config"
CONFIG_FN = "autoplan_config"


class UnsupportedModelError(ConfigError):
    """The model is not one torchtitan ships (so it has no config to override)."""


@dataclass(frozen=True)
class TitanModel:
    """A model torchtitan 0.3.0 ships: its module, flavor and ``config_registry`` function."""

    module: str  # --module
    flavor: str  # model_registry flavor (also [model] flavor in <= 0.2.x)
    config_fn: str  # config_registry function for this flavor; "" when torchtitan ships only the flavor
    config_precision: Literal["bf16", "fp8"]  # what config_fn trains in
    # architecture fingerprint: layers, hidden, heads, kv heads, ffn, vocab, experts
    dims: tuple[int, int, int, int, int, int, int]
    # For a config module: a shipped bf16 config function of the same family to start from (building
    # config_fn itself would construct its float8 converter), and config_fn's settings to keep.
    bf16_base: str = ""
    keep: tuple[tuple[str, str], ...] = ()


SHIPPED: tuple[TitanModel, ...] = (
    TitanModel("llama3", "8B", "llama3_8b", "bf16", (32, 4096, 32, 8, 14336, 128256, 0)),
    TitanModel("llama3", "70B", "llama3_70b", "bf16", (80, 8192, 64, 8, 28672, 128256, 0)),
    TitanModel("llama3", "405B", "llama3_405b", "fp8", (126, 16384, 128, 8, 53248, 128256, 0),
               bf16_base="llama3_70b",
               keep=(("hf_assets_path", "'./assets/hf/Llama-3.1-405B'"),
                     ("optimizer", "default_adamw(lr=8e-5)"),
                     ("lr_scheduler", "LRSchedulersContainer.Config(warmup_steps=600)"))),
    # torchtitan 0.3.0 ships the 235B-A22B flavor without a config function: start from qwen3_30b_a3b.
    TitanModel("qwen3", "235B-A22B", "", "bf16", (94, 4096, 64, 4, 12288, 151936, 128),
               bf16_base="qwen3_30b_a3b", keep=(("hf_assets_path", "'./assets/hf/Qwen3-235B-A22B'"),)),
)


def fingerprint(m: ModelSpec) -> tuple[int, int, int, int, int, int, int]:
    return (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size, m.vocab_size,
            m.num_experts)


def titan_model(m: ModelSpec) -> TitanModel:
    """The torchtitan model with ``m``'s architecture, or ``UnsupportedModelError`` saying what ships."""
    for t in SHIPPED:
        if t.dims == fingerprint(m):
            return t
    ships = ", ".join(f"{t.module} {t.flavor}" for t in SHIPPED)
    kind = " (a mixture-of-experts model)" if m.is_moe else ""
    raise UnsupportedModelError(
        f"torchtitan {TORCHTITAN_03} does not ship {m.name}{kind}: autoplan emits torchtitan configs for "
        f"the models it ships ({ships}), matched by architecture. Use another --target, or register the model with "
        "torchtitan (a model package with a config_registry) first")


def needs_config_module(plan: EmitPlan) -> bool:
    t = titan_model(plan.model)
    return not t.config_fn or t.config_precision != plan.job.precision


def _dp_degrees(plan: EmitPlan) -> tuple[int, int, str]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree, fsdp_reshard_after_forward).

    ZeRO-3 is FSDP (HSDP with ``hsdp_shard_size``); ZeRO-0 is DDP (replicate); ZeRO-1/2 have no
    torchtitan equivalent and map to FSDP without resharding after forward (gradients and optimizer
    state sharded, parameters kept gathered between forward and backward: ZeRO-2's memory)."""
    par, dp = plan.parallel, plan.dp
    if par.zero_stage == 0:
        return dp, 1, "default"
    if par.hsdp_shard_size and par.hsdp_shard_size % par.cp == 0 and par.hsdp_shard_size // par.cp < dp:
        shard = par.hsdp_shard_size // par.cp
        return dp // shard, shard, "default" if par.zero_stage == 3 else "never"
    return 1, dp, "default" if par.zero_stage == 3 else "never"


def pipeline_schedule(plan: EmitPlan) -> str:
    par = plan.parallel
    if par.vp > 1:
        return "Interleaved1F1B"
    return "1F1B"


def module_fqns_per_model_part(plan: EmitPlan) -> list[list[str]]:
    """torchtitan FQNs per pipeline chunk (``tok_embeddings`` first, ``norm`` + ``lm_head`` last),
    following ``stage_layers`` exactly (the same split Megatron gets). With ``vp`` chunks per rank,
    chunk ``c`` runs on rank ``c % pp`` (looped schedules), each with ``L / (pp * vp)`` layers."""
    par, m = plan.parallel, plan.model
    if par.vp > 1:
        per = m.num_layers // (par.pp * par.vp)
        sizes = [per] * (par.pp * par.vp)
    else:
        sizes = stage_layers(m, par)
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
    return {"parallelism": p, "training": t}


def notes(plan: EmitPlan) -> list[str]:
    par, out = plan.parallel, []
    if par.zero_stage in (1, 2) and plan.dp > 1:
        out.append(f"zero_stage={par.zero_stage} has no torchtitan equivalent: emitted FSDP with "
                   "fsdp_reshard_after_forward=never (ZeRO-2 memory)")
    if par.schedule == "zb-h1":
        out.append("schedule zb-h1: torchtitan's zero-bubble schedules need 2+ stages per rank; emitted 1F1B")
    if needs_config_module(plan):
        t = titan_model(plan.model)
        why = (f"torchtitan ships {t.module} {t.flavor} without a config function" if not t.config_fn else
               f"torchtitan's {t.config_fn} trains in {t.config_precision}, the plan in {plan.job.precision}")
        out.append(f"{why}: emitted {CONFIG_MODULE}.py (put its folder on PYTHONPATH; the launch scripts do)")
    return out


def _flag(section: str, key: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return [f"--{section}.{key}" if value else f"--{section}.no-{key.replace('_', '-')}"]
    if isinstance(value, list):
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
    if plan.parallel.pp > 1:
        args.append("--training.disable_cuda_graphs")  # CUDA graphs do not support pipeline parallelism yet
    args.append(f"activation_checkpoint:{plan.parallel.recompute}")  # subcommand: must come last
    return args


def config_module(plan: EmitPlan) -> str:
    """A torchtitan 0.3 ``config_registry``-style module: the shipped config with the plan's precision.

    bf16 from an fp8 config: start from the family's bf16 config function (building the fp8 one would
    construct its float8 converter), swap in the flavor, keep the fp8 config's other settings.
    fp8 from a bf16 config: the shipped config with a ``Float8LinearConverter`` (lm_head kept in bf16)."""
    t = titan_model(plan.model)
    fp8 = plan.job.precision == "fp8"
    base = t.config_fn if (fp8 and t.config_fn) else (t.bf16_base or t.config_fn)
    lines = [
        f'"""torchtitan config for {t.module} {t.flavor} in {plan.job.precision} (generated by autoplan).',
        "",
        (f"torchtitan's {t.config_fn} trains in {t.config_precision}; this one starts from {base}." if t.config_fn
         else f"torchtitan ships the {t.flavor} flavor without a config function; this one starts from {base}."),
        '"""',
        "",
        f"from torchtitan.models.{t.module} import model_registry",
        f"from torchtitan.models.{t.module}.config_registry import {base} as _base",
    ]
    if fp8:
        lines.append("from torchtitan.components.quantization import Float8LinearConverter")
    if any("default_adamw" in v or "LRSchedulersContainer" in v for _, v in t.keep) and not fp8:
        lines += ["from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw"]
    lines += ["", "", f"def {CONFIG_FN}():", "    config = _base()"]
    if fp8:
        lines += [
            "    compile_on = config.compile.enable and 'model' in config.compile.components",
            f"    config.model_spec = model_registry({t.flavor!r}, converters=[",
            "        Float8LinearConverter.Config(filter_fqns=['lm_head'], model_compile_enabled=compile_on)])",
        ]
    else:
        lines.append(f"    config.model_spec = model_registry({t.flavor!r})  # no float8 converter: bf16")
        lines += [f"    config.{k} = {v}  # " + (f"as in {t.config_fn}" if t.config_fn else f"for {t.flavor}")
                  for k, v in t.keep]
    lines += ["    return config", ""]
    return "\n".join(lines)


# ---- torchtitan <= 0.2.x: TOML ----------------------------------------------------------------------

V02_SCHEMA: dict[str, dict[str, Any]] = {
    "job": {"description": str},
    "model": {"name": str, "flavor": str, "converters": list},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int},
    "parallelism": {
        "data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
        "fsdp_reshard_after_forward": ("default", "always", "never"), "tensor_parallel_degree": int,
        "disable_loss_parallel": bool, "pipeline_parallel_degree": int, "pipeline_parallel_schedule": str,
        "pipeline_parallel_microbatch_size": int, "module_fqns_per_model_part": list,
        "context_parallel_degree": int, "expert_parallel_degree": int,
    },
    "activation_checkpoint": {"mode": ("selective", "full", "none"), "selective_ac_option": str},
    "float8": {"recipe_name": ("tensorwise", "rowwise", "rowwise_with_gw_hp")},
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
    doc: dict[str, dict[str, Any]] = {
        "job": {"description": f"autoplan plan for {plan.model.name}"},
        "model": {"name": t.module, "flavor": t.flavor, "converters": ["float8"] if plan.job.precision == "fp8" else []},
        "training": settings["training"],
        "parallelism": par,
        "activation_checkpoint": {"mode": plan.parallel.recompute}
        | ({"selective_ac_option": "op"} if plan.parallel.recompute == "selective" else {}),
    }
    if plan.job.precision == "fp8":
        doc["float8"] = {"recipe_name": "rowwise"}
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


def toml_v02(plan: EmitPlan) -> str:
    doc = v02_document(plan)
    check_v02(doc)
    out = [f"# torchtitan <= 0.2.x job file (generated by autoplan); run with --job.config_file <this file>"]
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
    env = {}
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
