"""Target profiles: the ONE place where each framework's rules live (issue 10).

A *target* is a framework that runs a plan: ``megatron`` (Megatron-LM + Megatron-Core), ``torchtitan`` (0.3.0)
or ``fsdp2`` (plain PyTorch FSDP2 + DTensor, the module ``autoplan emit --target fsdp2`` writes). Its profile
says what the framework accepts (legality), what it does at run time (semantics the cost model prices) and
which knobs it offers. The search space, the cost model, the emitters and ``autoplan validate`` all read it,
so what is priced is what is emitted. Each rule cites the framework file and line it comes from.

API (everything here is importable from ``cost_models.targets``)::

    from cost_models.targets import get_profile, Software

    prof = get_profile("megatron")                      # TargetProfile; get_profile("any") -> None
    sw = Software(grad_reduce_dtype="bf16")             # knobs the user set (None = target default)
    rt = prof.resolve(sw, job, cluster, par)            # Runtime: every knob resolved + priced semantics
    prof.check(model, cluster, job, par, rt)            # ConfigError naming the rule (file:line) + a neighbour
    prof.legal(model, cluster, job, par, rt)            # None, or that message
    run_par, note = prof.runs_as(par, cluster.num_gpus) # the layout the framework really runs (torchtitan
                                                        # runs ZeRO-0 with cp > 1 as FSDP over cp)
    prep = prof.prepare(model, cluster, job, par, sw)  # all of it for a user's layout: defaults, checks,
                                                        # runtime, runs_as (autoplan estimate, calibrate)
    prof = profile_for("torchtitan-2024-12")            # a framework's or a reference profile; None: no rules
    rt = runtime_for("torchtitan", job, cluster, par, sw)  # what estimate/Scorer price with ("any": Megatron's)

Profile tables (class attributes): ``schedules`` and ``zero_stages`` (search order) the target runs,
``cp_comm_types``, ``allow_kv_replication`` (tp a multiple of num_kv_heads), ``knobs`` (name -> ``Knob``:
allowed values, default, source), ``hsdp_choices(cluster, dp_cp, cp)`` (HSDP shard groups worth searching).

``Runtime`` fields the cost model reads (memory, DP traffic, knob effects; the search Scorer the same):

- ``weight_bytes``, ``grad_bytes``, ``optimizer_bytes``: bytes per parameter before ZeRO sharding
  (Megatron bf16: 2 + 4 (fp32 main grads) + 12, or 2 + 2 + 12 with ``grad_reduce_dtype=bf16``; optimizer 6 with
  ``adam_moments_dtype=bf16`` (precision-aware optimizer), weights 1-2 with ``fp8_param_gather``;
  torchtitan / the fsdp2 target (torch FSDP2 with fp32 parameters): 4 + 4 + 8, the fp32 shards are the master copy;
  Megatron --use-torch-fsdp2: 2 + 2 + 12, bf16 shards, an fp32 master in the optimizer);
- ``reduce_bytes`` (gradient dtype on the DP wire) and ``gather_bytes`` (bf16 parameter all-gathers; fp8: 1);
- ``cpu_offload_layers`` (Megatron: activations of the first N layers in host memory, off the peak);
- ``tp_overlapped`` (Megatron ``--tp-comm-overlap`` or torchtitan async TP), ``overlap_grad_reduce``,
  ``overlap_param_gather``, ``zero0_sync_every_microbatch`` (ZeRO-0's all-reduce in every micro-batch without PP:
  torchtitan), ``cp_comm_type``, ``reshard_after_forward`` (bool or a group size),
  ``fused_elementwise`` (TE / Inductor fused norms, SwiGLU, loss vs eager op by op), ``compile``,
  ``fp8_recipe``;
- ``cross_entropy_fusion`` (Megatron: ``te`` = Transformer Engine's fused loss, its bytes ``op_traffic.TE_LOSS_BYTES``);
- memory facts (``cost_models.memory`` reads them; the profile is their only home): ``loss_bytes_per_logit``,
  ``fp8_saved_bytes``, ``selective`` (what selective recompute keeps), ``gathered_unit_bytes`` (ZeRO-3 units),
  ``pp_unsharded_bytes`` (FSDP2 under pipelining), ``fsdp_head_unit`` (FSDP2: the output layer and embedding in
  their own units or in the root, ``memory.zero3_head_unit_bytes``), ``fsdp_mtp_unit`` (FSDP2: an MTP module's
  projection and norms with its block or in the root, ``mtp.mtp_stage_params``), ``fsdp_root_kinds`` (FSDP2: the
  decoder layer kinds left in the root unit, ``memory.stage_params``), ``state_bytes()``,
  ``adam_bytes_per_param``;
- ``runtime_for(target, job, cluster, par, software)``: the resolved runtime ``estimate`` and the search Scorer
  price with (``None``/``any``: Megatron's; ``deepseek``: DeepSeek-V3's HAI-LLM as its report states it,
  ``cost_models.targets.reference``, priced but never emitted); knob effects on time: ``cost_models.knob_effects``;
- ``env`` (launch environment the framework requires, e.g. Megatron's ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with
  TP/CP and no FSDP before Blackwell) and ``knobs()`` (every knob assumed: plans and predictions report it).

Emitters (issue 11) write the layout/knob flags from ``Runtime`` (``autoplan.emit``); item 4 (uneven
interleaved pipelines) adds its pipeline-split rules to ``MegatronProfile``.
"""

from __future__ import annotations

from cost_models.errors import ConfigError
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import (TARGET_NAMES, Knob, Prepared, Runtime, Software, TargetName, TargetProfile)
from cost_models.targets.fsdp2 import PROFILE as FSDP2
from cost_models.targets.megatron import PROFILE as MEGATRON
from cost_models.targets.reference import DEEPSEEK, REFERENCE_PROFILES, REFERENCE_RUNTIMES
from cost_models.targets.torchtitan import PROFILE as TORCHTITAN

PROFILES: dict[str, TargetProfile] = {"megatron": MEGATRON, "torchtitan": TORCHTITAN, "fsdp2": FSDP2}
DEFAULT_TARGET: TargetName = "megatron"


def get_profile(name: str) -> TargetProfile | None:
    """The profile of ``name``; None for ``any`` (the search's union of targets)."""
    if name == "any":
        return None
    prof = PROFILES.get(name)
    if prof is None:
        raise ConfigError(f"unknown target {name!r}", valid=[*TARGET_NAMES, "any"])
    return prof


def profile_for(target: str | None) -> TargetProfile | None:
    """The profile whose rules ``target`` runs under: a framework's (``PROFILES``) or a reference one's
    (``REFERENCE_PROFILES``, e.g. ``torchtitan-2024-12``); None for ``any``, no target, a reference runtime without a
    profile (``deepseek``) or an unknown name (``get_profile`` is the strict look-up)."""
    return REFERENCE_PROFILES.get(target or "") or PROFILES.get(target or "")


def target_model_notes(target: str | None, model: ModelSpec, job: JobSpec | None = None) -> list[str]:
    """What a prediction on ``target`` says about ``model`` itself (``TargetProfile.model_notes``) and, given the
    ``job``, about the model at its seq_len (``TargetProfile.job_notes``); [] without a profile."""
    prof = profile_for(target)
    if prof is None:
        return []
    notes = prof.model_notes(model)
    if notes:  # where the model can be emitted instead: the targets whose emit takes the model (one rule each)
        others = [t for t, p in PROFILES.items()
                  if t != prof.name and p.model_error(model) is None and not p.emit_model_errors(model)]
        where = f"emit it for --target {' or '.join(others)}" if others else "no target emits this model as it is"
        notes = [f"{n}; {where}" for n in notes]
    return [*notes, *(prof.job_notes(model, job) if job is not None else [])]


def runtime_for(target: str | None, job: JobSpec, cluster: ClusterSpec, par: ParallelConfig | None = None,
                software: Software | None = None) -> Runtime:
    """The resolved ``Runtime`` of ``target`` for this job and layout (``None`` or ``any``: Megatron's; a reference
    runtime such as ``deepseek`` as it is). What ``estimate`` and the search Scorer price memory and time with."""
    ref = REFERENCE_RUNTIMES.get(target or "")
    if ref is not None:
        return ref
    prof = REFERENCE_PROFILES.get(target or "") or get_profile(target or DEFAULT_TARGET) or PROFILES[DEFAULT_TARGET]
    return prof.resolve(software, job, cluster, par)


def framework_of(target: str | None) -> str | None:
    """The framework efficiency set (gpus.yaml ``frameworks``) ``target`` runs with, as its profile names it
    (``TargetProfile.efficiency_set``; ``torchtitan-2024-12``: torchtitan's). None for ``any``, no target or a
    reference runtime without a profile (``deepseek``): the GPU generation's own efficiency (Megatron-Core's,
    the reference the generation figures are fitted on)."""
    prof = profile_for(target)
    return prof.efficiency_set if prof is not None else None


def sdpa_cudnn_first(target: str | None) -> tuple[str, ...]:
    """The GPU generations on which ``target``'s attention runs cuDNN fused attention ahead of SDPA's
    FlashAttention-2 (``TargetProfile.sdpa_cudnn_first``); () for ``any``, no target or a reference runtime."""
    prof = profile_for(target)
    return tuple(prof.sdpa_cudnn_first) if prof is not None else ()


__all__ = ["DEEPSEEK", "framework_of", "profile_for", "target_model_notes", "Prepared", "sdpa_cudnn_first", "REFERENCE_PROFILES", "DEFAULT_TARGET", "FSDP2", "REFERENCE_RUNTIMES", "runtime_for", "MEGATRON", "PROFILES", "TARGET_NAMES", "TORCHTITAN", "Knob", "Runtime",
           "Software", "TargetName", "TargetProfile", "get_profile"]
