"""Megatron fp8 primary weights (knob ``fp8_param_gather``, ``--fp8-param-gather``): weight bytes follow Transformer
Engine's Float8Tensor rule (the transpose is kept only where FP8 GEMMs run TN-only), the distributed optimizer's
all-gather moves 1 byte per parameter, the precision-aware optimizer keeps a full fp32 master beside fp8 weights, and
what autoplan does not price is refused in one line."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, Software

from cli_emit import emitted_megatron_args

# Compute capability of the catalog GPUs used here (NVIDIA CUDA GPU list: H100 9.0, B200 / GB200 10.0).
CAPABILITY = {"h100-sxm": (9, 0), "b200": (10, 0), "gb200": (10, 0)}


def te_non_tn_fp8_gemm_supported(cc: tuple[int, int]) -> bool:
    """transformer_engine/pytorch/utils.py ``is_non_tn_fp8_gemm_supported``."""
    return (10, 0) <= cc < (12, 0) or cc >= (13, 0)


def te_float8_weight_bytes(cc: tuple[int, int]) -> float:
    """Bytes per element of a tensor-scaled Float8Tensor weight used forward and backward (rowwise and columnwise
    usage): ``Float8Tensor.update_usage`` keeps the data (1 B) and, unless non-TN FP8 GEMMs exist, a transpose (1 B)."""
    return 1.0 + (0.0 if te_non_tn_fp8_gemm_supported(cc) else 1.0)


@pytest.mark.parametrize("gpu", sorted(CAPABILITY))
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_weight_and_gather_bytes_follow_transformer_engine(gpu: str, recipe: str) -> None:
    cluster = build_cluster(gpu, 64)
    par = ParallelConfig(tp=8, pp=1, zero_stage=1)
    job = JobSpec(precision="fp8")
    rt = MEGATRON.resolve(Software(fp8_param_gather=True, fp8_recipe=recipe), job, cluster, par)
    assert rt.weight_bytes == te_float8_weight_bytes(CAPABILITY[gpu])
    assert rt.gather_bytes == 1.0 and rt.optimizer_bytes == 12.0  # Megatron keeps its fp32 main shard
    base = MEGATRON.resolve(Software(fp8_recipe=recipe), job, cluster, par)
    assert base.weight_bytes == 2.0 and base.gather_bytes == 2.0


def test_precision_aware_master_is_full_fp32_beside_fp8_weights() -> None:
    """TE FusedAdam stores the int16 remainder only for bf16 parameters (``_initialize_state``:
    ``store_param_remainders and ... param.dtype == torch.bfloat16``): fp8 weights keep a 4-byte master."""
    cluster, par, job = build_cluster("gb200", 64), ParallelConfig(tp=8, pp=1, zero_stage=1), JobSpec(precision="fp8")
    rt = MEGATRON.resolve(Software(fp8_param_gather=True, adam_moments_dtype="bf16"), job, cluster, par)
    assert rt.optimizer_bytes == 4.0 + 2.0 + 2.0
    bf16_weights = MEGATRON.resolve(Software(adam_moments_dtype="bf16"), job, cluster, par)
    assert bf16_weights.optimizer_bytes == 2.0 + 2.0 + 2.0


def test_memory_and_dp_traffic_on_blackwell() -> None:
    model, cluster = load_model("llama3-70b"), build_cluster("gb200", 64)
    job = JobSpec(global_batch_size=64, seq_len=4096, precision="fp8")
    par = ParallelConfig(tp=4, pp=2, zero_stage=1, micro_batch_size=1)
    sw = {"grad_reduce_dtype": "bf16", "fp8_recipe": "tensorwise"}
    base = estimate(model, cluster, job, par, target="megatron", software=Software(**sw), check=False)
    fp8 = estimate(model, cluster, job, par, target="megatron", software=Software(fp8_param_gather=True, **sw),
                   check=False)
    assert fp8.memory_gib["weights"] == pytest.approx(base.memory_gib["weights"] / 2, rel=1e-12)
    # bf16 reduce-scatter (2 B) + weight all-gather (2 B -> 1 B): the DP bytes fall to 3/4
    assert fp8.comm_volume_gib["dp"] == pytest.approx(0.75 * base.comm_volume_gib["dp"], rel=1e-9)


@pytest.mark.parametrize("gpu,zero,precision,recipe,match", [
    ("gb200", 3, "fp8", "tensorwise", "distributed optimizer only"),
    ("gb200", 2, "fp8", "tensorwise", "distributed optimizer only"),
    ("gb200", 1, "fp8", "mxfp8", "tensor scaling only"),
    ("h100-sxm", 1, "bf16", None, "tensor scaling only"),
])
def test_refusals(gpu: str, zero: int, precision: str, recipe: str | None, match: str) -> None:
    cluster, model = build_cluster(gpu, 64), load_model("llama3-8b")
    par = ParallelConfig(tp=1, pp=1, zero_stage=zero)
    sw = Software(fp8_param_gather=True, **({"fp8_recipe": recipe} if recipe else {}))
    with pytest.raises(ConfigError, match=match):
        rt = MEGATRON.resolve(sw, JobSpec(precision=precision), cluster, par)
        MEGATRON.check_runtime(model, cluster, JobSpec(precision=precision), par, rt)


def test_emitted_flag_parses(tmp_path) -> None:  # noqa: ANN001
    ns = emitted_megatron_args(["--model", "llama3-8b", "--gpu", "gb200", "--gpus", "8", "--tp", "1", "--pp", "1",
                                "--precision", "fp8", "--target", "megatron", "--fp8-param-gather"], tmp_path)
    assert ns.fp8_param_gather and ns.use_distributed_optimizer
