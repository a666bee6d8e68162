"""Megatron-LM (``pretrain_gpt.py``) with Megatron-Core 0.16 and Transformer Engine.

Rules cite Megatron-LM at tag core_v0.16.1 (commit 55ac7082, the release of the megatron-core 0.16.1 that CI
installs) (``MLM`` = ``megatron/training/arguments.py``, ``validate_args``
from line 293; ``TC`` = ``megatron/core/transformer/transformer_config.py``; ``MPC`` =
``megatron/core/model_parallel_config.py``). Run ``autoplan validate`` with ``MEGATRON_LM_PATH`` set to run
the real ``validate_args`` on an emitted argument list.

Run-time semantics:
- bf16 runs keep **fp32 main gradients** and all-reduce / reduce-scatter them in fp32 unless
  ``--grad-reduce-in-bf16`` (MLM:716-723); weights are bf16 (2 B), the optimizer holds fp32 master weights
  and Adam m, v (12 B). The distributed optimizer (ZeRO-1) shards the optimizer state only: the gradient
  buffer stays whole on every rank (Megatron ``docs/source/api-guide/dist_optimizer.md``: 6 + 12/d bytes per
  parameter with fp32 grads). There is no ZeRO-2.
- ZeRO-3 is torch FSDP2 (``--use-torch-fsdp2``): fp32 sharded parameters are the master copy, bf16 gathered
  for compute, gradients reduce-scattered into fp32 shards (4 + 4 + 8 B, all sharded).
- HSDP exists only for the distributed optimizer (``--num-distributed-optimizer-instances``), not for FSDP2.
- TP communication overlaps GEMMs with ``--tp-comm-overlap`` (needs sequence parallelism, MLM:916); DP
  traffic overlaps backward with ``--overlap-grad-reduce`` and forward with ``--overlap-param-gather``.
- Elementwise kernels are TE's fused kernels (fused norms, SwiGLU, cross-entropy).
"""

from __future__ import annotations

from cost_models.errors import ConfigError
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import Knob, Runtime, Software, TargetProfile, fsdp2_gathered_unit_bytes

COMMIT = "55ac7082"  # tag core_v0.16.1
MLM = f"Megatron-LM megatron/training/arguments.py@{COMMIT}"
TC = f"Megatron-LM megatron/core/transformer/transformer_config.py@{COMMIT}"
TE_CP = "TransformerEngine pytorch/attention/dot_product_attention/context_parallel.py (a2a: heads % cp)"


class MegatronProfile(TargetProfile):
    name = "megatron"
    efficiency_set = "megatron"
    version = "Megatron-LM core_v0.16.1 (55ac7082) / megatron-core 0.16.1"
    schedules = ("1f1b", "interleaved")
    zero_stages = (1, 0, 3)
    cp_comm_types = ("p2p", "a2a", "allgather", "a2a+p2p")
    # Megatron-Core 0.16.1: TransformerConfig accepts num_query_groups a multiple or a divisor of tp
    # (transformer_config.py:939-946); with fewer groups than tp ranks linear_qkv is split evenly, its output
    # all-gathered and each rank keeps one group (attention.py:289-300, 1398-1416): "gather".
    kv_modes = ("shard", "gather")
    kv_source = f"{TC}:939-946; megatron/core/transformer/attention.py:289-300, 1398-1416 @{COMMIT}"
    loss_modes = ("F",)  # vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py)
    knobs = {
        "grad_reduce_dtype": Knob("grad_reduce_dtype", ("fp32", "bf16"), "fp32",
                                  f"{MLM}:716-723 (--grad-reduce-in-bf16, line 2178)"),
        "tp_comm_overlap": Knob("tp_comm_overlap", (True, False), True,
                                f"{MLM}:916 (needs --sequence-parallel)"),
        "fp8_recipe": Knob("fp8_recipe", ("delayed", "tensorwise", "blockwise", "mxfp8"), "delayed",
                           f"{TC}:436-441 (mxfp8: Blackwell only)"),
        "cp_comm_type": Knob("cp_comm_type", ("p2p", "a2a", "allgather", "a2a+p2p"), "p2p",
                             f"{TC}:732-743 (--cp-comm-type, {MLM}:2341)"),
        "overlap_grad_reduce": Knob("overlap_grad_reduce", (True, False), True, f"{MLM}:2243"),
        "overlap_param_gather": Knob("overlap_param_gather", (True, False), True,
                                     f"{MLM}:598-601 (distributed optimizer + overlap_grad_reduce)"),
    }

    def zero_reason(self, zero_stage: int) -> str:
        return ("Megatron-LM has no ZeRO-2: --use-distributed-optimizer shards the optimizer state only (the "
                "gradient buffer stays whole), which is zero_stage=1")

    def hsdp_error(self, zero: int, hsdp: int, cp: int, dp_cp: int) -> ConfigError | None:
        if zero != 1:
            return ConfigError(
                f"hsdp_shard_size={hsdp} with zero_stage={zero}: Megatron-LM shards in groups only with the "
                f"distributed optimizer (--num-distributed-optimizer-instances, {MLM}:2333); --use-torch-fsdp2 "
                "always shards over the whole dp*cp group", valid=["zero_stage=1", "hsdp_shard_size unset"])
        return None

    def target_layout_error(self, model: ModelSpec, *, tp: int, pp: int, cp: int, ep: int,
                            zero: int) -> ConfigError | None:
        if zero != 3:
            return None
        if pp > 1:
            return ConfigError(f"zero_stage=3 with pp={pp}: --use-torch-fsdp2 is not supported with pipeline "
                               f"parallelism ({MLM}:609)", valid=["zero_stage=1", "pp=1"])
        if ep > 1:
            return ConfigError(f"zero_stage=3 with ep={ep}: --use-torch-fsdp2 is not supported with expert "
                               f"parallelism ({MLM}:611)", valid=["zero_stage=1", "ep=1"])
        if model.tied_embeddings:
            return ConfigError(f"zero_stage=3: --use-torch-fsdp2 requires --untie-embeddings-and-output-weights "
                               f"({MLM}:619); {model.name} ties them", valid=["zero_stage=1"])
        return None

    def check_runtime(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                      rt: Runtime) -> None:
        if rt.tp_comm_overlap and not (par.tp > 1 and par.sequence_parallel):
            raise ConfigError(f"tp_comm_overlap needs tp > 1 with sequence parallelism ({MLM}:916)",
                              valid=["tp_comm_overlap=false"])
        if rt.overlap_param_gather and par.zero_stage != 1:
            raise ConfigError(f"overlap_param_gather needs the distributed optimizer, zero_stage=1 ({MLM}:598)",
                              valid=["overlap_param_gather=false"])
        if rt.overlap_param_gather and not rt.overlap_grad_reduce:
            raise ConfigError(f"overlap_param_gather needs overlap_grad_reduce ({MLM}:601)",
                              valid=["overlap_grad_reduce=true"])
        if par.cp > 1:
            check_cp_comm(model, par, rt.cp_comm_type, cluster)
        if rt.fp8_recipe == "mxfp8" and cluster.gpu.generation != "blackwell":
            raise ConfigError(f"fp8_recipe=mxfp8 runs on Blackwell only ({TC}:441); {cluster.gpu.name} is "
                              f"{cluster.gpu.generation}", valid=["delayed", "tensorwise", "blockwise"])

    def resolve(self, software: Software | None, job: JobSpec, cluster: ClusterSpec,
                par: ParallelConfig | None = None) -> Runtime:
        k = self._knob_values(software, job, cluster)
        if "fp8_recipe" in k and job.precision != "fp8":
            raise ConfigError(f"fp8_recipe={k['fp8_recipe']} needs precision fp8 (the job is {job.precision})")
        tp_sp = par is None or (par.tp > 1 and par.sequence_parallel)
        zero = par.zero_stage if par is not None else 1
        grad = k.get("grad_reduce_dtype", "fp32")
        fsdp = zero == 3
        env: tuple[tuple[str, str], ...] = ()
        if (par is None or par.tp > 1 or par.cp > 1) and not fsdp and cluster.gpu.generation != "blackwell":
            env = (("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)  # MLM:925-953 (TP/CP before Blackwell, no FSDP)
        return Runtime(
            target="megatron",
            tp_comm_overlap=k.get("tp_comm_overlap", tp_sp and (par is None or par.tp > 1)),
            fp8_recipe=k.get("fp8_recipe", "delayed") if job.precision == "fp8" else None,
            grad_reduce_dtype=grad,
            cp_comm_type=k.get("cp_comm_type", "p2p"),
            overlap_grad_reduce=k.get("overlap_grad_reduce", True),
            overlap_param_gather=k.get("overlap_param_gather", zero == 1),
            # FSDP2: fp32 sharded params are the master copy (4 B), fp32 grads (4 B), Adam m, v (8 B).
            weight_bytes=4.0 if fsdp else 2.0,
            grad_bytes=4.0 if fsdp or grad == "fp32" else 2.0,
            optimizer_bytes=8.0 if fsdp else 12.0,
            # --use-torch-fsdp2 runs torch fully_shard (its gathered units); the loss, fp8 saves and selective
            # recompute are Megatron-Core / Transformer Engine's (Runtime defaults).
            gathered_unit_bytes=fsdp2_gathered_unit_bytes(grad) if fsdp else 4.0,
            env=env,
        )


def check_cp_comm(model: ModelSpec, par: ParallelConfig, kind: str, cluster: ClusterSpec) -> None:
    """Context-parallel communication types and what they need (TC:732-743, MLM:408)."""
    if kind == "a2a+p2p":
        raise ConfigError(f"cp_comm_type=a2a+p2p needs --hierarchical-context-parallel-sizes ({MLM}:408), which "
                          "autoplan does not choose yet", valid=["p2p", "a2a", "allgather"])
    if kind == "a2a":
        heads = model.num_attention_heads // par.tp
        kv = max(1, model.num_kv_heads // par.tp)
        if heads % par.cp or kv % par.cp:
            raise ConfigError(f"cp_comm_type=a2a with cp={par.cp}: Ulysses splits heads over CP, and after tp="
                              f"{par.tp} a rank has {heads} query / {kv} KV heads ({TE_CP})",
                              valid=["p2p", "allgather"])


PROFILE = MegatronProfile()
