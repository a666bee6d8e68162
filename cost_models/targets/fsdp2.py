"""Plain PyTorch FSDP2 + DTensor (the ``autoplan_parallelize.py`` module ``autoplan emit --target fsdp2`` writes),
torch 2.13 (``torch/distributed/fsdp/_fully_shard/_fully_shard.py``: ``fully_shard``).

Run-time semantics: ``fully_shard`` over the data-parallel mesh (1-D, or 2-D ``dp_replicate × dp_shard`` for
HSDP) with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: fp32 sharded parameters, bf16
all-gathers, fp32 reduce-scatters, Adam m, v fp32 (4 + 4 + 8 bytes, all sharded). ``reshard_after_forward``:
True (ZeRO-3), False (parameters stay gathered until backward: no backward all-gather), or an int ``r``
(re-shard to groups of ``r`` ranks after forward, so the backward all-gather stays inside them: ``fully_shard``
docstring, "int: ... reshard to a smaller world size"). With pipeline stages the emitted module keeps the
parameters gathered (False) as torch.distributed.pipelining micro-batches reuse them. The emitted module has no
context or expert parallelism and no eager-fusion (elementwise ops run op by op).
"""

from __future__ import annotations

from typing import Any

from cost_models.errors import ConfigError
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import (EXPANDABLE_SEGMENTS_ENV, Knob, Runtime, Software, TargetProfile,
                                        reshard_options, targets_that, torch_memory_facts, use_instead,
                                        use_instead_at)

FULLY_SHARD = "torch 2.13 torch/distributed/fsdp/_fully_shard/_fully_shard.py (fully_shard)"


class FSDP2Profile(TargetProfile):
    name = "fsdp2"
    hybrid_refusal = "its module is a transformer decoder (autoplan/emit/fsdp2.py), with no Mamba-2 mixer"
    gdn_refusal = "its module is a softmax-attention transformer decoder (autoplan/emit/fsdp2.py), with no Gated DeltaNet"
    optimizer_refusal = ("the fsdp2 target prices torch FSDP2's fp32 sharded parameters with Adam (8 B of moments); "
                         "its launch leaves the optimizer to the user's loop and autoplan prices no Muon there")
    efficiency_set = "fsdp2"
    # The model's own F.scaled_dot_product_attention in torch's default order: cuDNN first on sm90 / sm100 / sm103
    # when the runtime cuDNN is newer than 9.15.0 (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
    # ``check_prefer_cudnn_attention``: ``cudnn_version > 91500 && (major == 9 || major == 10)``, minor 0 or 3 on CUDA
    # 12 builds; pytorch#162073 2025-09, gated to cuDNN 9.15.1 by #171627 2026-01), which the cu128 / cu13 wheels ship
    # since pytorch#172680 / #171189. A100 keeps flash (FlashAttention-2) first.
    sdpa_cudnn_first = ("hopper", "blackwell")
    version = "torch 2.13 FSDP2 + DTensor (autoplan_parallelize.py)"
    schedules = ("1f1b", "interleaved")
    zero_stages = (3,)
    cp_comm_types = ()
    # The emitted autoplan_parallelize.py applies the plan's per-op shardings: SequenceParallel norms with the
    # plan's sequence_parallel flag, the output head ColwiseParallel(output_layouts=Replicate()) (loss on gathered
    # logits: "R"), wk/wv ColwiseParallel ("shard") or, where the ILP chose it, the ReplicatedKV style (K/V
    # weights replicated on the TP mesh: "replicate"; the only choice when tp > num_kv_heads).
    sequence_parallel = "flag"
    loss_modes = ("R",)
    kv_modes = ("shard", "replicate")
    kv_source = "the emitted autoplan_parallelize.py (ReplicatedKV: K/V weights Replicate on the TP mesh)"
    knobs = {
        "reshard_after_forward": Knob("reshard_after_forward", (True, False), True,
                                      f"{FULLY_SHARD}: bool or int (a divisor of the shard group)",
                                      int_values=True),
        "compile": Knob("compile", (False,), False, "the emitted module does not call torch.compile"),
        "grad_reduce_dtype": Knob("grad_reduce_dtype", ("fp32", "bf16"), "fp32",
                                  "MixedPrecisionPolicy.reduce_dtype in the emitted apply_fsdp"),
        "expandable_segments": Knob("expandable_segments", (True, False), False,
                                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True exported by the emitted "
                                    "launch script (PyTorch's default allocator otherwise)"),
    }

    def layout_knob_options(self, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                            given: dict[str, Any]) -> list[dict[str, Any]]:
        """reshard_after_forward True (default), False, or a node / NVLink-domain group (``fully_shard``'s int)."""
        return reshard_options(cluster, par, given, int_groups=True)

    def zero_reason(self, zero_stage: int) -> str:
        return ("the fsdp2 target always runs fully_shard (zero_stage=3); keep parameters gathered between "
                "forward and backward with reshard_after_forward=false instead")

    whole_group_source = f"a 1-D mesh of the dp ranks, no dp_replicate dimension: {FULLY_SHARD}"

    def hsdp_error(self, zero: int, hsdp: int, cp: int, dp_cp: int) -> ConfigError | None:
        return None  # dp_replicate x dp_shard mesh, written by the emitter

    # the user's own module computes the loss (the emitted file parallelizes it): nothing autoplan emits trains an
    # auxiliary load-balancing loss
    trains_moe_aux_loss = False

    def target_layout_error(self, model: ModelSpec, *, tp: int, pp: int, cp: int, ep: int,
                            zero: int) -> ConfigError | None:
        """No context parallelism (the emitted module has none). The refusal names the targets whose model and layout
        rules take the layout asked for (its tp, pp, cp, ep and ZeRO stage; Megatron's torch FSDP2 refuses pp > 1,
        torchtitan builds no MTP with CP); where none runs it at this ZeRO-3, the targets that run it at another stage
        of theirs, with that stage named (``use_instead_at``, as the EP refusal)."""
        if cp > 1:
            def runs(p: TargetProfile, z: int) -> bool:
                return p.model_error(model) is None and p.target_layout_error(
                    model, tp=tp, pp=pp, cp=cp, ep=ep, zero=z) is None

            return ConfigError(f"cp={cp}: the fsdp2 target does not emit context parallelism; "
                               f"{use_instead_at(runs, zero, self.name)}", valid=["cp=1"])
        return None

    def expert_layout_error(self, model: ModelSpec, *, tp: int, pp: int, cp: int, dp_cp: int, ep: int, zero: int,
                            hsdp: int | None) -> ConfigError | None:
        """No expert parallelism (the emitted module has none). An MoE model's refusal names the targets whose
        model, layout and expert rules take the layout asked for (its tp, pp, cp, ep, HSDP group and ZeRO stage; pp
        matters: torchtitan builds no MTP under PP). Where none runs it at this ZeRO-3, the targets that run it at
        another stage of theirs, with that stage named (``use_instead_at``; Megatron-LM's torch FSDP2 has no EP; its
        distributed optimizer has)."""
        if ep == 1 or not model.is_moe:
            return super().expert_layout_error(model, tp=tp, pp=pp, cp=cp, dp_cp=dp_cp, ep=ep, zero=zero, hsdp=hsdp)

        def runs(p: TargetProfile, z: int) -> bool:
            return (p.model_error(model) is None
                    and p.target_layout_error(model, tp=tp, pp=pp, cp=cp, ep=ep, zero=z) is None
                    and p.expert_layout_error(model, tp=tp, pp=pp, cp=cp, dp_cp=dp_cp, ep=ep, zero=z, hsdp=hsdp) is None)

        return ConfigError(f"ep={ep}: the fsdp2 target does not emit expert parallelism; "
                           f"{use_instead_at(runs, zero, self.name)}", valid=[1])

    def check_runtime(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                      rt: Runtime) -> None:
        r = rt.reshard_after_forward
        if isinstance(r, int) and not isinstance(r, bool):
            group = par.hsdp_shard_size or par.dp(cluster.num_gpus)
            if not 1 < r < group or group % r:
                raise ConfigError(f"reshard_after_forward={r} must be a divisor of the shard group ({group}) between "
                                  f"1 and it ({FULLY_SHARD})",
                                  valid=[d for d in range(2, group) if group % d == 0][:8] or [True, False])

    def job_notes(self, model: ModelSpec, job: JobSpec) -> list[str]:
        """Chunked attention beyond one chunk (``ArchSpec.attention_chunk``, Llama 4) is priced by its mask
        (``opgraph.keys_per_query``): the user's own attention must skip the masked blocks to run that fast."""
        chunk = model.arch.attention_chunk
        if chunk is None or job.seq_len <= chunk:
            return super().job_notes(model, job)
        return [*super().job_notes(model, job),
                f"chunked attention (attention_chunk={chunk}) at seq_len {job.seq_len} is priced for a kernel that "
                "computes each chunk's causal block alone (each chunk run as its own sequence, or a block-sparse "
                "mask such as FlexAttention's); transformers' Llama4 under SDPA passes the chunks as a dense mask and "
                "computes every key (its flash attention refuses more than one chunk: masking_utils."
                "create_chunked_causal_mask @ 5.24.0)"]

    def resolve(self, software: Software | None, job: JobSpec, cluster: ClusterSpec,
                par: ParallelConfig | None = None) -> Runtime:
        k = self._knob_values(software, job, cluster)
        if job.precision in ("fp8", "nvfp4"):
            others = targets_that(lambda p: _runs_precision(p, job, cluster, par), self.name)
            raise ConfigError(f"precision {job.precision}: the fsdp2 target's module has no "
                              f"{'fp8' if job.precision == 'fp8' else 'fp4'} linears; {use_instead(others)}",
                              valid=["bf16"])
        default_reshard = par is None or par.pp == 1
        grad = k.get("grad_reduce_dtype", "fp32")
        return Runtime(
            target="fsdp2", grad_reduce_dtype=grad,
            reshard_after_forward=k.get("reshard_after_forward", default_reshard),
            weight_bytes=4.0, grad_bytes=4.0, optimizer_bytes=8.0, gather_bytes=2.0, fused_elementwise=False,
            # the emitted apply_fsdp shards each block and then the root, which holds embedding, norm and head
            # (autoplan/emit/fsdp2.py ``apply_fsdp``; memory.zero3_head_unit_bytes)
            fsdp_head_unit="root",
            fused_loss=False,
            env=(EXPANDABLE_SEGMENTS_ENV,) if k.get("expandable_segments", False) else (),
            **torch_memory_facts(grad),
        )


def _runs_precision(prof: TargetProfile, job: JobSpec, cluster: ClusterSpec, par: ParallelConfig | None) -> bool:
    """Whether ``prof`` runs the job's precision (its ``resolve``, with its default knobs, refuses one it lacks)."""
    try:
        prof.resolve(None, job, cluster, par)
    except ConfigError:
        return False
    return True


PROFILE = FSDP2Profile()
