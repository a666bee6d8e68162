"""torchtitan 0.3.0 (``torchtitan/config/configs.py``, ``torchtitan/distributed/parallel_dims.py``,
``torchtitan/models/llama3/parallelize.py``; ``TT`` below = ``torchtitan/`` of the 0.3.0 wheel).

Run-time semantics:
- Data parallelism is always torch FSDP2 ``fully_shard`` over the ``[dp_replicate, fsdp]`` mesh, where
  ``fsdp = dp_shard × cp`` (TT/models/llama3/parallelize.py:68-88, TT/distributed/parallel_dims.py ``build_mesh``
  docstring: "when cp is used, FSDP is also applied"). So ZeRO-3 is FSDP (HSDP with a shard group), and
  "ZeRO-0" is ``dp_replicate = dp`` with the parameters still sharded over ``cp``: with cp > 1 it runs as FSDP
  over cp (``runs_as``). There is no ZeRO-1/2.
- Gradient accumulation (no PP): ``train_step`` runs ``forward_backward_step`` (``loss.backward()``) once per
  micro-batch (TT/trainer.py:885-929, 806-828) and never turns FSDP2's gradient sync off (no
  ``set_requires_gradient_sync(False)`` outside the chunked loss's output layer, TT/components/loss.py:731-771), so
  every backward reduces: ZeRO-0 = ``fully_shard`` over (dp_replicate, fsdp = 1) (TT/models/llama3/parallelize.py:69-90;
  the default ``spmd_types`` backend names the same axes, TT/distributed/full_dtensor.py ``resolve_fsdp_mesh``) is
  HSDP with one-rank shards, whose ``foreach_reduce`` all-reduces the fp32 gradient over dp_replicate in each
  micro-batch (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_collectives.py:634-660, ``all_reduce_grads`` True by
  default, _fsdp_param_group.py:216-220): ``Runtime.zero0_sync_every_microbatch``
  (tests/test_torchtitan_grad_sync.py counts them on torch's real modules).
- Parameters are fp32 (``training.dtype``), gathered in bf16 (``mixed_precision_param``); gradients are
  reduced in fp32 (``mixed_precision_reduce``, a Literal["float32"]: TT/config/configs.py:93); Adam m, v fp32:
  4 + 4 + 8 bytes per parameter, all sharded over the FSDP group.
- Eager PyTorch runs norms, SwiGLU and the loss op by op; ``compile`` (Inductor) fuses them
  (TT/config/configs.py:291-309). Async TP (``compile.enable_async_tensor_parallel``) overlaps TP collectives
  with the GEMMs and needs compile (configs.py:304).
- The launcher sets ``PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"`` (run_llama_train.sh:22 at 9dec370, the
  commit of the published 2024-12 runs; run_train.sh:43 ``PYTORCH_ALLOC_CONF`` today): knob ``expandable_segments``,
  on by default, exported by the emitted launch scripts (``Runtime.env``); ``cost_models.memory`` prices its
  allocator reserve as releasable.
- Float8 (torchao): ``rowwise`` / ``rowwise_with_gw_hp`` only (TT/components/quantization/float8.py:58,
  ``Float8LinearConverter.Config.recipe_name: Literal["rowwise", "rowwise_with_gw_hp"]``: 0.3.0 has no
  ``tensorwise``; the published 2024-12 runs' torchtitan did: ``reference.TORCHTITAN_2024_12``); MXFP8
  (``MXFP8LinearConverter``) needs sm_100 (TT/components/quantization/mx.py:70).
"""

from __future__ import annotations

from typing import Any

from cost_models.errors import ConfigError
from cost_models.pipeline_layout import parse_chunks
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.torchtitan_models import TORCHTITAN_03, qwen3_5_refusal, shipped_model_error
from cost_models.targets.common import (EXPANDABLE_SEGMENTS_ENV, Knob, Runtime, Software, TargetProfile,
                                        reshard_options, torch_memory_facts)

# Float8 tensorwise TP: torchtitan's apply_tp swaps in torchao's Float8ColwiseParallel / Float8RowwiseParallel when
# the recipe is tensorwise ("float8 all-gather with TP is only supported for tensorwise float8 scaling recipes. For
# rowwise recipes, we use regular TP and all-gather happens in high precision": torchtitan's llama
# parallelize_llama.py ``apply_tp(enable_float8_tensorwise_tp)``, the versions with tensorwise, as the published
# 2024-12 runs; 0.3.0 has neither the recipe, float8.py:58, nor Float8 TP). Those cast the input to fp8 before the
# sequence-parallel all-gather, and the output gradient to fp8 before the backward all-gather
# (torchao/float8/float8_tensor_parallel.py ``_prepare_input_fn`` / ``NoopFwToFloat8BwDynamic``): 1 byte per
# element; the reduce-scatters carry bf16 partial sums (2).
TP_FP8_GATHER_BYTES = 1.0

TT = "torchtitan 0.3.0 torchtitan/"

# The gathers / scatters torchtitan 0.3.0's AllToAllTokenDispatcher makes over the routed token copies
# (models/common/token_dispatcher.py), ((dispatch with EP, without), (combine with EP, without)): dispatch
# ``_local_reorder``'s gather ``x_TD[token_indices]`` (:100), with EP ``_permute``'s rank-major -> expert-major
# gather (:550); combine with EP ``_unpermute``'s scatter (:558), then ``deterministic_scatter_add`` back to the
# tokens (:623, LocalTokenDispatcher :164). The fp32 score weighting between them (:616-619, :158-161) is
# ``moe.TORCH_SCORE_WEIGHT_PASSES``.
TORCHTITAN_MOE_PASSES = ((2, 1), (2, 1))


class TorchtitanProfile(TargetProfile):
    name = "torchtitan"
    rope_framework = "torchtitan's RoPE.Config"  # scaling 'none', 'llama' or 'yarn' (models/common/rope.py:98)
    efficiency_set = "torchtitan"
    # models/common/attention.py ScaledDotProductAttention: ``sdpa_backends = [CUDNN_ATTENTION, FLASH_ATTENTION,
    # MATH]`` under ``sdpa_kernel(..., set_priority=True)`` on every GPU (since 6a3a9da95, 2025-10-09, "Refactor
    # attention": models/attention.py:89-93 there; unchanged through the mirror's head b5bcd76c6, 2026-08-21,
    # models/common/attention.py:388-393). Volta runs the unfused path (cuDNN SDPA needs sm80); ROCm has no cuDNN.
    # 0.3.0's language models do not call it (Runtime.titan_attention: FlexAttention or varlen); the cuDNN figure
    # this sets is the one their measured FlexAttention rates are relative to (op_cost.titan_attention_rates).
    sdpa_cudnn_first = ("ampere", "hopper", "blackwell")
    # torchtitan 0.3.0's torchtitan/models: llama3, qwen3, qwen3_5, deepseek_v3, gpt_oss, kimi_k2_7, flux, muse_glimmer
    hybrid_refusal = "torchtitan 0.3.0 ships no Mamba / Nemotron-H model (torchtitan/models has none)"
    # models/qwen3_5 builds Qwen3.5's vision tower and reads multimodal batches: torchtitan_models.QWEN3_5_TEXT_BLOCKERS
    gdn_refusal = qwen3_5_refusal()
    optimizer_refusal = ("torchtitan 0.3.0's Muon is DistMuon (torchtitan/distributed/flex_shard/dist_muon.py, factory "
                         "'DistMuon' in components/optimizer/optimizer.py:146) over FlexShard compute layouts that only its "
                         "kimi_k2_7 model configures (models/kimi_k2_7/config_registry.py:208); autoplan emits and prices "
                         "default_adamw")
    version = "torchtitan 0.3.0"
    schedules = ("1f1b", "interleaved")
    zero_stages = (3, 0)
    cp_comm_types = ("allgather",)
    # TP plan of models/llama3/infra/parallelize.py: wq/wk/wv ColwiseParallel (KV heads split: n_kv_heads % tp == 0),
    # SequenceParallel norms whenever tp > 1, loss parallel unless --parallelism.disable_loss_parallel.
    sequence_parallel = "forced"
    # torchtitan runs MoE under TP without SP (parallelism.enable_sequence_parallel, config/configs.py:160; its
    # deepseek_v3 configs turn it off), splitting the MoE's tokens over the TP axis whenever EP is on
    # (models/common/moe_sharding.py:89-111 @ 0.3.0); autoplan prices that split only with SP on
    moe_sp_source = ("autoplan prices torchtitan's MoE under TP only with SP on: with EP on torchtitan 0.3.0 splits "
                     "the MoE's tokens over the tp axis whether or not SP is (models/common/moe_sharding.py:89-111), "
                     "with EP off it shards the experts' weights over tp")
    loss_modes = ("F", "R")
    kv_modes = ("shard",)
    kv_source = f"{TT}models/llama3/infra/parallelize.py (wk/wv ColwiseParallel)"
    knobs = {
        "compile": Knob("compile", (True, False), False, f"{TT}config/configs.py:292 (compile.enable)"),
        # what compile covers (configs.py:298, default ["model", "loss"]): Runtime.model_compiled / fused_elementwise
        # = the model compiled, fused_loss = the loss compiled (Runtime.compile = compile.enable)
        "compile_components": Knob("compile_components", ("model+loss", "model", "loss"), "model+loss",
                                   f"{TT}config/configs.py:298 (compile.components)"),
        "async_tp": Knob("async_tp", (True, False), False,
                         f"{TT}config/configs.py:295-309 (needs compile.enable)"),
        "fp8_recipe": Knob("fp8_recipe", ("rowwise", "rowwise_with_gw_hp", "mxfp8"), "rowwise",
                           f"{TT}components/quantization/float8.py:58 (Float8LinearConverter.Config.recipe_name: "
                           "Literal['rowwise', 'rowwise_with_gw_hp']), mx.py:50 (MXFP8LinearConverter; sm_100)"),
        "grad_reduce_dtype": Knob("grad_reduce_dtype", ("fp32",), "fp32",
                                  f"{TT}config/configs.py:93 (mixed_precision_reduce: Literal['float32'])"),
        "cp_comm_type": Knob("cp_comm_type", ("allgather",), "allgather",
                             f"{TT}distributed/context_parallel/api.py:46-73 (FlexAttention, its language models' "
                             "kernel: K/V all-gathered over cp by flex_cp_allgather; SDPA through torch's CP "
                             "dispatcher defaults to all-gather too; torchtitan 0.3.0 has no knob for it)"),
        "reshard_after_forward": Knob("reshard_after_forward", (True, False), True,
                                      f"{TT}config/configs.py:136 (fsdp_reshard_after_forward: default, always, "
                                      "never; no group size)"),
        # round-robin routing (token i's j-th choice is expert (i*top_k + j) mod num_experts): every expert gets the
        # same count, ρ = 1 (cost_models.moe.moe_load_imbalance)
        "moe_force_balance": Knob("moe_force_balance", (True, False), False,
                                  f"{TT}config/configs.py:365 (debug.moe_force_load_balance), "
                                  "models/common/moe.py:225-240 (_debug_force_load_balance_routing)"),
        "expandable_segments": Knob("expandable_segments", (True, False), True,
                                    "torchtitan run_llama_train.sh:22 @ 9dec370 / run_train.sh:43 "
                                    "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"),
    }

    searched_knobs = ("compile", "async_tp")

    # An explicit pipeline split in Megatron's layout notation (``cost_models.pipeline_layout``), which torchtitan runs
    # as ``parallelism.module_fqns_per_model_part`` (TT/config/configs.py:181; TT/distributed/pipeline_parallel.py:88-97
    # takes the list as given, ``_pipeline_module_split`` builds each part from its FQNs): the emitter writes one FQN
    # list per chunk from ``pipeline_split`` (``autoplan.emit.torchtitan.module_fqns_per_model_part``).
    megatron_fields = ("pipeline_layout",)
    # torchtitan 0.3.0's MoE has no auxiliary loss, only aux-loss-free expert-bias balancing (MoE.Config.
    # load_balance_coeff: torchtitan/models/common/moe.py; autoplan.emit.torchtitan.balancing_warnings)
    trains_moe_aux_loss = False

    emit_label = f"torchtitan {TORCHTITAN_03}"
    refused_model_pricing = "priced with torchtitan's rules as for a model registered with torchtitan by hand"

    def emit_model_errors(self, model: ModelSpec) -> list[ConfigError]:
        """torchtitan 0.3.0 builds only the flavors it ships (``torchtitan_models.SHIPPED``): a model it ships none
        of, or whose flavor fixes in code a fact that differs from it (``shipped_model_error``)."""
        err = shipped_model_error(model)
        return [] if err is None else [err]

    def check_layout(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig) -> None:
        """The shared rules, and a ``pipeline_layout`` torchtitan's FQN parts can hold: every chunk builds something
        (autoplan emits no part without modules) and none an MTP layer (torchtitan's pipeline split has none)."""
        super().check_layout(model, cluster, job, par)
        if par.pipeline_layout is None:
            return
        chunks = parse_chunks(par.pipeline_layout)
        if any("m" in c for c in chunks):  # (target_layout_error refuses MTP with pp > 1 first)
            raise ConfigError(f"pipeline_layout {par.pipeline_layout!r} places MTP layers ('m'): torchtitan builds "
                              f"MTP only without pipeline parallelism ({TT}models/deepseek_v3/mtp.py:200-204)",
                              valid=["a layout of E, t and L only", "mtp_layers=0"])
        if empty := [i for i, c in enumerate(chunks) if not c]:
            raise ConfigError(f"pipeline_layout {par.pipeline_layout!r}: stage {empty[0]} builds nothing; torchtitan "
                              "runs the layout as module_fqns_per_model_part, one list of modules per stage, and "
                              "autoplan emits no empty one", valid=["a layout whose every stage holds E, t or L"])

    def target_layout_error(self, model: ModelSpec, *, tp: int, pp: int, cp: int, ep: int,
                            zero: int) -> ConfigError | None:
        """Multi-token prediction with pipeline or context parallelism: torchtitan 0.3.0's MTP raises
        NotImplementedError for either (TT/models/deepseek_v3/mtp.py:200-208)."""
        if model.arch.mtp_layers and (pp > 1 or cp > 1):
            shape = ", ".join(f"{k}={v}" for k, v in (("pp", pp), ("cp", cp)) if v > 1)
            return ConfigError(f"{model.name} trains {model.arch.mtp_layers} MTP layer(s), which torchtitan does not "
                               f"build with {shape} ({TT}models/deepseek_v3/mtp.py:200-208: 'MTP does not "
                               "support pipeline / context parallelism yet')", valid=["mtp_layers=0", "pp=1 cp=1"])
        return None

    def knob_options(self, name: str, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                     given: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        """compile off (torchtitan's default) and on; async TP off and on where tp > 1 (on needs compile:
        ``resolve`` refuses it without, so ``knob_candidates`` drops that pair)."""
        if name == "compile":
            return ({"compile": False}, {"compile": True})
        if name == "async_tp" and par.tp > 1:
            return ({"async_tp": False}, {"async_tp": True})
        return ()

    def layout_knob_options(self, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                            given: dict[str, Any]) -> list[dict[str, Any]]:
        """fsdp_reshard_after_forward default (True without PP) or never (configs.py:136 has no group size)."""
        return reshard_options(cluster, par, given, int_groups=False)

    def knob_floor(self) -> tuple[dict[str, Any], bool] | None:
        """compile and async TP on: fused element-wise kernels move fewer bytes than eager ones and overlapped TP
        traffic shows less than exposed (``knob_effects``); no knob setting is cheaper."""
        return {"compile": True, "async_tp": True}, False

    def sp_split_error(self, seq_len: int, tp: int, cp: int) -> str | None:
        """The trainer refuses a seq_len that (tp with parallelism.enable_sequence_parallel) x (2*cp with CP) does
        not divide, before building the model (trainer.py:306-315 of the 0.3.0 wheel)."""
        div = tp * (2 * cp if cp > 1 else 1)
        if seq_len % div == 0:
            return None
        return (f"sequence_parallel with tp={tp} needs seq_len={seq_len} divisible by "
                + (f"tp*2*cp = {tp}*2*{cp} = {div}" if cp > 1 else f"tp = {tp}")
                + f" ({TT}trainer.py:306-315, parallelism.enable_sequence_parallel)")

    def zero_reason(self, zero_stage: int) -> str:
        return ("torchtitan shards with FSDP2 (zero_stage=3, or 0 = replicate) and has no ZeRO-1/2 "
                f"({TT}models/llama3/parallelize.py:68-88)")

    def hsdp_error(self, zero: int, hsdp: int, cp: int, dp_cp: int) -> ConfigError | None:
        if zero != 3:
            return ConfigError(f"hsdp_shard_size={hsdp} needs zero_stage=3 (torchtitan's dp_replicate x dp_shard)",
                               valid=["zero_stage=3"])
        if hsdp % cp:
            return ConfigError(f"hsdp_shard_size={hsdp} must be a multiple of cp={cp}: torchtitan shards over "
                               f"dp_shard x cp ({TT}distributed/parallel_dims.py build_mesh)",
                               valid=[s for s in range(cp, dp_cp, cp) if dp_cp % s == 0][:8])
        return None

    # Experts are cut from the FSDP ranks: the sparse mesh pp x dp_replicate x efsdp x ep (ep innermost: consecutive
    # ranks) must cover the world, with efsdp = dp_shard*cp*tp // ep (parallel_dims.py:277-279, 336-339). dp_shard*cp
    # is the FSDP group: dp*cp (ZeRO-3), the HSDP shard group, or cp alone when ZeRO-0 replicates over dp.
    expert_tensor_parallel = 1
    expert_rule = f"{TT}distributed/parallel_dims.py:277-279, 336-339: efsdp = dp_shard*cp*tp // ep"
    expert_count_rule = f"{TT}models/common/token_dispatcher.py:857: num_local_experts = num_experts // ep"

    def expert_ranks(self, *, tp: int, cp: int, dp_cp: int, zero: int, hsdp: int | None) -> tuple[int, str] | None:
        fsdp = (hsdp or dp_cp) if zero == 3 else cp
        return fsdp * tp, f"dp_shard*cp*tp = {fsdp}*{tp}"

    def runs_as(self, par: ParallelConfig, num_gpus: int) -> tuple[ParallelConfig, str | None]:
        if par.zero_stage == 0 and par.cp > 1:
            dp = par.dp(num_gpus)
            shard = par.cp if dp > 1 else None
            note = (f"torchtitan runs zero_stage=0 with cp={par.cp} as FSDP over dp_shard x cp = {par.cp} "
                    f"(replicated over dp_replicate = {dp})")
            return par.model_copy(update={"zero_stage": 3, "hsdp_shard_size": shard}), note
        return self.whole_group_as_plain(par, num_gpus)

    whole_group_source = (f"dp_replicate=1, dp_shard*cp = the group: HSDP only where dp_replicate > 1, "
                          f"{TT}distributed/parallel_dims.py:676-677, models/llama3/parallelize.py:75")

    def runs_as_written(self, zero: int, cp: int) -> bool:
        return not (zero == 0 and cp > 1)

    def hsdp_choices(self, cluster: ClusterSpec, dp_cp: int, cp: int) -> list[int]:
        """A node / NVLink domain, and cp itself (what ZeRO-0 with CP runs as: FSDP over cp, replicated over dp)."""
        extra = [cp] if 1 < cp < dp_cp else []
        return sorted({s for s in super().hsdp_choices(cluster, dp_cp, cp) if s % cp == 0} | set(extra))

    def check_runtime(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                      rt: Runtime) -> None:
        if rt.moe_force_balance and not model.is_moe:
            raise ConfigError(f"moe_force_balance: an MoE setting on {model.name}, a dense model "
                              f"({TT}config/configs.py:365 debug.moe_force_load_balance routes MoE tokens)",
                              valid=["moe_force_balance unset"])
        if rt.fp8_recipe == "mxfp8" and cluster.gpu.generation != "blackwell":
            raise ConfigError(f"fp8_recipe=mxfp8 needs sm_100 (Blackwell) ({TT}components/quantization/mx.py:70); "
                              f"{cluster.gpu.name} is {cluster.gpu.generation}",
                              valid=[r for r in self.knobs["fp8_recipe"].values if r != "mxfp8"])

    def resolve(self, software: Software | None, job: JobSpec, cluster: ClusterSpec,
                par: ParallelConfig | None = None) -> Runtime:
        k = self._knob_values(software, job, cluster)
        comps = k.get("compile_components", "model+loss")
        if "compile_components" in k and not k.get("compile", False):
            raise ConfigError(f"compile_components={comps} needs compile ({TT}config/configs.py:292-298: the "
                              "components are what compile.enable compiles)",
                              valid=["--compile --compile-components ...", "compile_components unset"])
        model_compiled = k.get("compile", False) and "model" in comps
        loss_compiled = k.get("compile", False) and "loss" in comps
        if k.get("async_tp") and not model_compiled:
            raise ConfigError(f"async_tp needs compile, with the model compiled ({TT}config/configs.py:304-309: 'Async TP requires "
                              "'model' in --compile.components and --compile.enable')",
                              valid=["--compile --async-tp", "--no-async-tp"])
        if job.precision == "nvfp4":
            raise ConfigError(f"precision nvfp4 with the torchtitan target: torchtitan runs NVFP4 through torchao's "
                              f"prototype nvfp4_training Triton kernels ({TT}components/quantization/nvfp4.py "
                              "NVFP4LinearConverter), which autoplan does not price (no public measurement of them); "
                              "Transformer Engine's NVFP4 is priced with --target megatron",
                              valid=["bf16", "fp8", "--target megatron"])
        if "fp8_recipe" in k and job.precision != "fp8":
            raise ConfigError(f"fp8_recipe={k['fp8_recipe']} needs precision fp8 (the job is {job.precision})",
                              valid=["precision fp8 (--precision fp8)", "fp8_recipe unset"])
        tp = par.tp if par is not None else 2
        recipe = k.get("fp8_recipe", "rowwise") if job.precision == "fp8" else None
        return Runtime(
            target="torchtitan",
            titan_attention=True,  # FlexAttention / varlen, never SDPA (Runtime.titan_attention)
            compile=bool(k.get("compile", False)),
            compile_components=comps,
            async_tp=bool(k.get("async_tp", False)) and tp > 1,
            tp_comm_overlap=False,
            fp8_recipe=recipe,
            fp8_impl="torchao",  # Float8LinearConverter swaps nn.Linear for torchao's Float8Linear
            grad_reduce_dtype="fp32",
            cp_comm_type=k.get("cp_comm_type", "allgather"),
            overlap_grad_reduce=True,
            overlap_param_gather=True,
            zero0_sync_every_microbatch=True,  # the module docstring: FSDP2 HSDP, no sync toggled off
            zero0_fsdp2=True,
            # "default": reshard after forward unless pipelining (torchtitan apply_fsdp: not pp_enabled)
            reshard_after_forward=k.get("reshard_after_forward", par is None or par.pp == 1),
            weight_bytes=4.0, grad_bytes=4.0, optimizer_bytes=8.0, gather_bytes=2.0,
            tp_gather_bytes=TP_FP8_GATHER_BYTES if recipe == "tensorwise" else 2.0,
            fused_elementwise=model_compiled,
            # compile.components defaults to ["model", "loss"] (TT/config/configs.py:298): the loss compiled with
            # the model (TT/components/loss.py ``_maybe_compile``)
            fused_loss=loss_compiled,
            env=(EXPANDABLE_SEGMENTS_ENV,) if k.get("expandable_segments", True) else (),
            moe_force_balance=bool(k.get("moe_force_balance", False)),
            moe_passes=TORCHTITAN_MOE_PASSES,
            # the compiled loss keeps the bf16 logits alone; with TP it is vocab-parallel (priced as eager)
            **torch_memory_facts("fp32", compiled_loss=loss_compiled and par is not None and par.tp == 1),
        )


PROFILE = TorchtitanProfile()
