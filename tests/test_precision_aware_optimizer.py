"""Megatron's precision-aware optimizer (knob ``adam_moments_dtype``): the optimizer bytes autoplan prices are
recomputed from megatron-core 0.16.1's own ``OptimizerConfig`` (who holds the master weight, whether it is stored as
the int16 remainder) and the dtypes it is given; the emitted flags parse; illegal layouts are refused."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from click.testing import CliRunner

from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, Software

from cli_emit import emitted_megatron_args

# megatron-core (the validate extra) is the truth these tests read; imported before any test puts a TE stand-in in
# sys.modules, so the stand-in never leaks into megatron-core's import-time checks.
oc = pytest.importorskip("megatron.core.optimizer.optimizer_config")
OptimizerConfig = pytest.importorskip("megatron.core.optimizer").OptimizerConfig

H100 = build_cluster("h100-sxm", 64)


@pytest.fixture()
def te_fused_adam(monkeypatch: pytest.MonkeyPatch) -> None:
    """OptimizerConfig.__post_init__ checks Transformer Engine's FusedAdam signature and version (TE is not a CI
    dependency): a stand-in with the four arguments it asks for, and TE >= 2.1 (store_param_remainders kept)."""
    def fused_adam(params, *, master_weight_dtype=None, exp_avg_dtype=None, exp_avg_sq_dtype=None,  # noqa: ANN001
                   use_decoupled_grad=False) -> None:
        """Signature only."""

    opt = types.ModuleType("transformer_engine.pytorch.optimizers")
    opt.FusedAdam = fused_adam  # type: ignore[attr-defined]
    for name in ("transformer_engine", "transformer_engine.pytorch"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.optimizers", opt)
    monkeypatch.setattr(oc, "is_te_min_version", lambda *a, **k: True)


def megatron_core_optimizer_bytes(fp8_recipe: str | None, moments: torch.dtype) -> float:
    """Bytes per parameter of optimizer state as megatron-core builds it: with ``use_precision_aware_optimizer_no_fp8
    _or_ds_fp8`` TE's FusedAdam owns the master (``master_weights=True``, optimizer/__init__.py:377-387) and stores the
    int16 remainder when ``store_param_remainders``; otherwise Megatron keeps the fp32 main copy
    (distrib_optimizer.py:378-404)."""
    cfg = OptimizerConfig(optimizer="adam", bf16=True, use_distributed_optimizer=True,
                          use_precision_aware_optimizer=True, fp8_recipe=fp8_recipe,
                          exp_avg_dtype=moments, exp_avg_sq_dtype=moments)
    te_master = cfg.use_precision_aware_optimizer_no_fp8_or_ds_fp8
    master = torch.int16 if te_master and cfg.store_param_remainders else cfg.main_params_dtype
    return float(master.itemsize + cfg.exp_avg_dtype.itemsize + cfg.exp_avg_sq_dtype.itemsize)


@pytest.mark.parametrize("precision,recipe", [("bf16", None), ("fp8", "delayed"), ("fp8", "tensorwise"),
                                              ("fp8", "blockwise")])
def test_optimizer_bytes_follow_megatron_core(te_fused_adam: None, precision: str, recipe: str | None) -> None:
    par = ParallelConfig(tp=8, pp=1, zero_stage=1)
    sw = Software(adam_moments_dtype="bf16", **({"fp8_recipe": recipe} if recipe else {}))
    rt = MEGATRON.resolve(sw, JobSpec(precision=precision), H100, par)
    assert rt.optimizer_bytes == megatron_core_optimizer_bytes(recipe, torch.bfloat16)
    assert rt.optimizer_bytes == (6.0 if recipe in (None, "delayed") else 8.0)
    default = MEGATRON.resolve(Software(**({"fp8_recipe": recipe} if recipe else {})), JobSpec(precision=precision),
                               H100, par)
    assert default.optimizer_bytes == 12.0 and default.adam_moments_dtype == "fp32"


def test_store_param_remainders_is_megatron_cores_default() -> None:
    fields = OptimizerConfig.__dataclass_fields__
    assert fields["store_param_remainders"].default is True
    assert fields["exp_avg_dtype"].default is torch.float32 and fields["use_precision_aware_optimizer"].default is False


def test_memory_drops_by_the_sharded_moment_bytes() -> None:
    from cost_models.estimate import estimate

    model = load_model("llama3-8b")
    par = ParallelConfig(tp=1, pp=1, zero_stage=1, micro_batch_size=1)
    job = JobSpec(global_batch_size=64, seq_len=4096)
    cluster = build_cluster("h100-sxm", 8)
    base = estimate(model, cluster, job, par, target="megatron", check=False)
    bf16 = estimate(model, cluster, job, par, target="megatron", software=Software(adam_moments_dtype="bf16"),
                    check=False)
    assert base.memory_gib["optimizer"] / bf16.memory_gib["optimizer"] == pytest.approx(12.0 / 6.0)
    assert base.memory_gib["weights"] == bf16.memory_gib["weights"]
    assert base.memory_gib["grads"] == bf16.memory_gib["grads"]


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_needs_the_distributed_optimizer(zero: int) -> None:
    par = ParallelConfig(tp=1, pp=1, zero_stage=zero)
    rt = MEGATRON.resolve(Software(adam_moments_dtype="bf16"), JobSpec(), H100, par)
    with pytest.raises(ConfigError, match="distributed optimizer"):
        MEGATRON.check_runtime(load_model("llama3-8b"), H100, JobSpec(), par, rt)


def test_emitted_flags_parse_and_cli_refuses_fsdp2(tmp_path) -> None:  # noqa: ANN001
    from autoplan.cli import cli

    base = ["--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "1", "--target", "megatron"]
    ns = emitted_megatron_args([*base, "--adam-moments-dtype", "bf16"], tmp_path)
    assert ns.use_distributed_optimizer and ns.use_precision_aware_optimizer
    assert ns.exp_avg_dtype == ns.exp_avg_sq_dtype == "bf16"
    bad = CliRunner().invoke(cli, ["estimate", *base, "--zero", "3", "--adam-moments-dtype", "bf16"])
    assert bad.exit_code == 2 and "distributed optimizer" in bad.output and "Traceback" not in bad.output
