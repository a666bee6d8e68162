"""Runtimes autoplan prices but does not emit for: published frameworks whose runs check the cost model.

``DEEPSEEK``: DeepSeek-V3's own framework (HAI-LLM), as its technical report (arXiv 2412.19437) states it; used
to price the published 2048-H800 layout (``benchmarks/fidelity.py``).

``TORCHTITAN_2024_12`` (target ``torchtitan-2024-12``): the torchtitan that ran the published 2024-12 H100 runs
(``benchmarks/data/published_runs.json``, group ``torchtitan_h100_2024_12``). It differs from the torchtitan 0.3.0
profile in accepting the Float8 ``tensorwise`` recipe, which those runs used (with Float8 TP: the input and
output-gradient all-gathers in fp8, ``torchtitan.TP_FP8_GATHER_BYTES``); 0.3.0 refuses it (float8.py:58), and in
running the loss eagerly under compile (below). Same framework efficiency set (``efficiency_set``, gpus.yaml
``frameworks: torchtitan``).

``TORCHTITAN_2025`` (target ``torchtitan-2025``): torchtitan from bbb1b616e (2025-04-02, "refactor train_spec.loss_fn
to build_loss_fn", which compiles the loss with ``--training.compile``: components/loss.py ``build_cross_entropy_loss``)
until 83e6941 (2025-07-28), where the root FSDP unit still held the embedding and output layer; ``TORCHTITAN_2025_08``
(target ``torchtitan-2025-08``) from there, with 0.3.0's FSDP units, until ``tensorwise`` left the recipe Literal: 0.3.0's rules plus ``tensorwise`` (config_manager.py:489 at 820504e,
2025-06-13: ``recipe_name: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] | None``, None = tensorwise; the same
at 6fc499f6, 2025-08-14, config/job_config.py:561). What the held-out torchtitan runs of 2025 ran
(``benchmarks/data/more_runs_torchtitan.json``). ZeRO-0 syncs in every micro-batch there too (the inherited
``zero0_sync_every_microbatch``): at 820504e it is torch's composable ``replicate`` (DDP: models/llama3/
parallelize_llama.py:110-118, 370-386), whose ``require_backward_grad_sync`` stays on unless
``set_requires_gradient_sync(False)`` (torch distributed/_composable/replicate.py:134, 166), which train.py's
accumulation loop (:423-426) never calls.
"""

from __future__ import annotations

from dataclasses import replace

from cost_models.errors import ConfigError
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import TORCH_LOSS_BYTES_PER_LOGIT, FsdpHeadUnit, Knob, Runtime, Software
from cost_models.targets.torchtitan import TorchtitanProfile

DEEPSEEK = Runtime(
    target="deepseek",
    weight_bytes=2.0, grad_bytes=4.0,  # bf16 weights, fp32 gradient accumulation (§3.3.3)
    optimizer_bytes=8.0,  # fp32 master weights, Adam moments in bf16 ("Low-Precision Optimizer States", §3.3.3)
    loss_bytes_per_logit=6.0,
    fp8_saved_bytes=1.0,  # activations cached in fp8 for the Linear backward (§3.3.3)
    # "Recomputation of RMSNorm and MLA Up-Projection" (§3.2.3) and the MoE SwiGLU: its input cached in fp8, its
    # output recomputed (§3.3.3): what `selective` means in this runtime.
    selective="cheap",
    gathered_unit_bytes=4.0, pp_unsharded_bytes=0.0,
    notes=("DeepSeek-V3's HAI-LLM as its report states it (reference runtime; not an emit target)",),
)
REFERENCE_RUNTIMES: dict[str, Runtime] = {"deepseek": DEEPSEEK}


# torchtitan's MoE of 2025-08 (f738a03^), ((dispatch with EP, without), (combine with EP, without)): the
# ``expert_parallel`` wrapper pads and permutes at every EP degree ("3 is needed even for single-device computation",
# distributed/expert_parallel.py:298-360): dispatch = MoE.forward's ``torch.gather`` of the reordered tokens
# (models/moe.py:409), ``torch.vstack`` (a copy, expert_parallel.py:350) and ``x[permuted_indices]`` (:352); combine =
# the ``out_unpermuted[permuted_indices] =`` scatter (:357) and MoE.forward's ``scatter_add`` (models/moe.py:432);
# the score weighting (models/moe.py:421-424) apart.
TORCHTITAN_2025_MOE_PASSES = ((3, 3), (2, 2))


class Torchtitan2025Profile(TorchtitanProfile):
    """torchtitan of 2025-04 .. 2025-07-27: 0.3.0's rules plus the ``tensorwise`` Float8 recipe (torchao dynamic
    tensorwise scaling, the recipe torchtitan applies when ``--float8.recipe_name`` is unset), the loss compiled with
    the model as in 0.3.0, and the FSDP units of before 83e6941 (2025-07-28, "Improve reshard_after_forward logic"):
    ``apply_fsdp`` shards each block and then ``fully_shard(model)``, whose root unit holds the embedding, final norm
    and output layer (models/llama3/infra/parallelize.py @ 820504e; ``memory.zero3_head_unit_bytes`` "root")."""

    version = "torchtitan 2025-04..07 (held-out runs of 2025; reference profile, not an emit target)"

    # debug.moe_force_load_balance came with 99fee810b (2025-10-03, #1670): not a knob of these releases
    knobs = {**{n: k for n, k in TorchtitanProfile.knobs.items() if n != "moe_force_balance"},
             "fp8_recipe": Knob("fp8_recipe", ("tensorwise", *TorchtitanProfile.knobs["fp8_recipe"].values), "rowwise",
                                "torchtitan 820504e config_manager.py:489 / 6fc499f6 config/job_config.py:561 "
                                "(tensorwise, rowwise, rowwise_with_gw_hp); 0.3.0: components/quantization/float8.py:58, "
                                "mx.py:70")}
    fsdp_head_unit: FsdpHeadUnit = "root"
    # 3b85aa31f (2025-05-14, "Use cudnn backend on B200", #1196): models/attention.py ScaledDotProductAttention puts
    # CUDNN_ATTENTION first under ``sdpa_kernel(..., set_priority=True)`` where ``has_cuda_capability(10, 0)``
    # (sm100+: B200/GB200/B300/GB300), flash first elsewhere (models/attention.py:204-211 @ 6fc499f6, 2025-08-14;
    # the same at 2c8b5947). The window's H100 runs are FlashAttention-2; a B200 run before 2025-05-14 would be too.
    sdpa_cudnn_first = ("blackwell",)

    # Where this release's ZeRO-0 (dp_replicate alone) goes to DDP and raises on a mesh of more than one dimension
    ddp_source = "models/llama3/parallelize_llama.py:110-112 @ 820504e"

    def model_notes(self, model: ModelSpec) -> list[str]:
        return []  # never emitted: 0.3.0's shipped flavors say nothing about these releases' runs

    def job_notes(self, model: ModelSpec, job: JobSpec) -> list[str]:
        return []  # never emitted

    def layout_error(self, model: ModelSpec, *, tp: int, pp: int, cp: int, ep: int, zero: int, hsdp: int | None,
                     dp_cp: int, schedule: str) -> ConfigError | None:
        """0.3.0's rules, and ZeRO-0 on a mesh of one dimension: these releases replicate with DDP (``apply_ddp``,
        torch's composable ``replicate``) where dp_replicate > 1 and neither dp_shard nor cp is, and raise
        "DDP has not supported > 1D parallelism" on a tp or pp dimension (``ddp_source``); 0.3.0 runs it as FSDP2
        with one-rank shards on any mesh. An MoE model with ep > 1 takes the FSDP branch whenever EP is on
        (deepseek_v3/infra/parallelize.py:100 @ 6fc499f6, :97 @ 2c8b5947: ``fsdp_enabled or ep_enabled``): HSDP
        with one-rank shards, as priced."""
        err = super().layout_error(model, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, hsdp=hsdp, dp_cp=dp_cp,
                                   schedule=schedule)
        if err is not None or zero != 0 or cp > 1 or dp_cp == 1 or (model.is_moe and ep > 1):
            return err  # (ZeRO-0 with cp > 1 is FSDP over cp: runs_as)
        other = {k: v for k, v in (("tp", tp), ("pp", pp)) if v > 1}
        if not other:
            return None
        shape = ", ".join(f"{k}={v}" for k, v in other.items())
        return ConfigError(f"zero_stage=0 with {shape}: {self.version} replicates with DDP, which refuses a device "
                           f"mesh of more than one dimension (torchtitan {self.ddp_source}: 'DDP has not supported "
                           "> 1D parallelism')", valid=["zero_stage=3", " ".join(f"{k}=1" for k in other)])

    def resolve(self, software: Software | None, job: JobSpec, cluster: ClusterSpec,
                par: ParallelConfig | None = None) -> Runtime:
        # per-op SAC saved no all-to-all output before c4e2291 (2025-09-06): deepseek_v3/infra/parallelize.py
        # ``_save_list`` @ f738a03^ holds mm, the SDPA kernels, reduce_scatter_tensor and max only; and of the SDPA
        # kernels only flash and efficient (models/llama3/infra/parallelize.py:234-243 @ 6fc499f6: no
        # ``_scaled_dot_product_cudnn_attention`` until b39377f9f, 2025-12-01): where this release puts cuDNN first
        # (``sdpa_cudnn_first``) the policy recomputes the attention core (``Runtime.sac_saves_attention``).
        # Off those generations the SDPA backend list is [FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH] (models/
        # attention.py:207-213, used under ``sdpa_kernel(backends, set_priority=True)`` :223 @ 8a749c6, the parent of
        # f738a03bf whose H100 DeepSeek-V3 16B SDPA log is tt_dsv3_16b_h100_8gpu_sdpa; the same list at 6fc499f6,
        # :205-211), and in 2024-12's torch order (aten/src/ATen/Context.h ``sdp_priority_order``: flash, efficient,
        # math, cudnn): flash refuses MLA's v head dim 128 != q/k 192, the memory-efficient kernel runs (f738a03bf's
        # message: "the only available backend for SDPA for DeepSeekV3 is efficient attention kernel";
        # Runtime.sdpa_unequal_v_efficient)
        flash_first = cluster.gpu.generation not in self.sdpa_cudnn_first
        return replace(super().resolve(software, job, cluster, par), fsdp_head_unit=self.fsdp_head_unit,
                       sac_saves_a2a=False, moe_passes=TORCHTITAN_2025_MOE_PASSES,
                       sac_saves_attention=flash_first, sdpa_unequal_v_efficient=flash_first,
                       titan_attention=False,  # 2024-12 / 2025 torchtitan ran its models' attention on SDPA
                       zero0_fsdp2=False)  # ZeRO-0 was DDP (replicate) before 00b7f5693 (2026-04-09)


class Torchtitan202508Profile(Torchtitan2025Profile):
    """torchtitan from 83e6941 (2025-07-28) until ``tensorwise`` left the recipe Literal: the 2025 rules with 0.3.0's
    FSDP units (``fully_shard(tok_embeddings)``, each block, ``fully_shard([norm, output])`` not resharded after
    forward by default, then the root: models/llama3/infra/parallelize.py @ 83e6941 / 6fc499f6)."""

    version = "torchtitan 2025-07-28..08 (held-out runs of 2025-08; reference profile, not an emit target)"
    fsdp_head_unit: FsdpHeadUnit = "own"
    ddp_source = "models/llama3/infra/parallelize.py:126-128 @ 6fc499f6 (the same at 2c8b5947)"


class Torchtitan2024Profile(Torchtitan2025Profile):
    """torchtitan as of the published 2024-12 H100 runs: 0.3.0's rules plus the ``tensorwise`` Float8 recipe
    (torchao dynamic tensorwise scaling, the only Float8 scaling torchtitan ran then: the runs' ``fp8_recipe``), the
    loss run eagerly, and the root FSDP unit holding embedding, norm and output (parallelisms/parallelize_llama.py
    @ 9dec370 ``apply_fsdp``: each block, then ``fully_shard(model)``)."""

    version = "torchtitan 2024-12 (published H100 runs; reference profile, not an emit target)"
    ddp_source = "parallelisms/parallelize_llama.py:106-108 @ 9dec370"
    # models/llama/model.py:209 @ 9dec370 calls F.scaled_dot_product_attention in torch's own order: flash first, cuDNN
    # last since torch 2.5.1 (pytorch#138522): FlashAttention-2 (the framework set's attention_fa2)
    sdpa_cudnn_first = ()
    knobs = {**Torchtitan2025Profile.knobs,
             "fp8_recipe": Knob("fp8_recipe", Torchtitan2025Profile.knobs["fp8_recipe"].values, "rowwise",
                                "torchtitan 2024-12 torchtitan/float8.py: torchao tensorwise dynamic scaling; "
                                "0.3.0: components/quantization/float8.py:58, mx.py:70")}

    def resolve(self, software: Software | None, job: JobSpec, cluster: ClusterSpec,
                par: ParallelConfig | None = None) -> Runtime:
        # compile wraps each TransformerBlock only (parallelize_llama.py ``apply_compile``); the loss was not
        # compiled (train.py, e8977b0 "turning off compile on loss function", 2024-12-18, before the runs' 9dec370;
        # back on from bbb1b616e, 2025-04-02): the final norm and cross_entropy on fp32 logits run eagerly with or
        # without compile.
        return replace(super().resolve(software, job, cluster, par), fused_loss=False,
                       loss_bytes_per_logit=TORCH_LOSS_BYTES_PER_LOGIT["eager"])


TORCHTITAN_2024_12 = Torchtitan2024Profile()
TORCHTITAN_2025 = Torchtitan2025Profile()
TORCHTITAN_2025_08 = Torchtitan202508Profile()
# Reference profiles autoplan prices (and checks) but never emits for; their efficiency set is their profile's
# (``efficiency_set``, inherited: torchtitan's).
REFERENCE_PROFILES: dict[str, TorchtitanProfile] = {"torchtitan-2024-12": TORCHTITAN_2024_12,
                                                    "torchtitan-2025": TORCHTITAN_2025,
                                                    "torchtitan-2025-08": TORCHTITAN_2025_08}

__all__ = ["DEEPSEEK", "REFERENCE_PROFILES", "REFERENCE_RUNTIMES", "TORCHTITAN_2024_12", "TORCHTITAN_2025", "TORCHTITAN_2025_08",
           "Torchtitan2024Profile", "Torchtitan2025Profile", "Torchtitan202508Profile"]
