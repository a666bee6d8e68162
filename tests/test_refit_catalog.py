"""benchmarks/refit_catalog.py writes fitted numbers into gpus.yaml without touching anything else."""

from __future__ import annotations

import pytest

from benchmark_modules import load_benchmark

refit = load_benchmark("refit_catalog", "refit_catalog")

YAML = """\
efficiency:
  hopper:
    dp_overlap: 0.6366    # [fit] comment kept
    tp_overlap: 0.9589
  blackwell:
    dp_overlap: 0.6366    # [transfer]
frameworks:
  torchtitan:
    dp_overlap: 0.4691    # [fit] FSDP2 prefetch
"""

SCALED = """\
frameworks:
  torchtitan:
    scale:                # ratios
      gemm_max: 0.8484259147 # [fit] 0.698 / hopper's 0.8227
      fp8_gemm_speedup: 1.2440905698 # [fit]
    gemm_max: 0.5         # an absolute field of the same name (not the ratio)
    dp_overlap: 0.4691    # [fit] FSDP2 prefetch
"""


def test_set_value_changes_only_that_number() -> None:
    out = refit.set_value(YAML, "efficiency", "blackwell", "dp_overlap", 0.61234)
    assert out.splitlines()[5] == "    dp_overlap: 0.6123    # [transfer]"
    assert [a for a, b in zip(YAML.splitlines(), out.splitlines()) if a != b] == [YAML.splitlines()[5]]
    out = refit.set_value(YAML, "frameworks", "torchtitan", "dp_overlap", 0.5)
    assert out.splitlines()[-1] == "    dp_overlap: 0.5       # [fit] FSDP2 prefetch"
    assert out.splitlines()[2] == YAML.splitlines()[2]  # the same field of another section is left alone


def test_set_value_names_what_is_missing() -> None:
    with pytest.raises(KeyError, match="efficiency.ampere"):
        refit.set_value(YAML, "efficiency", "ampere", "dp_overlap", 0.5)
    with pytest.raises(KeyError, match="frameworks.torchtitan.gemm_max"):
        refit.set_value(YAML, "frameworks", "torchtitan", "gemm_max", 0.5)


def test_set_value_keeps_microseconds_of_a_small_value() -> None:
    """The MoE host cost (seconds per expert, ~1e-4) is written to the µs, not rounded to 0.0007 by the 4 decimals the
    efficiencies get."""
    text = "frameworks:\n  megatron:\n    moe_host_s_per_expert: 0.0005 # [fit] kept\n"
    out = refit.set_value(text, "frameworks", "megatron", "moe_host_s_per_expert", 0.000690344)
    assert out.splitlines()[2] == "    moe_host_s_per_expert: 0.00069 # [fit] kept"


def test_set_value_writes_a_scale_ratio_to_ten_digits() -> None:
    """A framework's ``scale`` ratio (calibrate.FRAMEWORK_RATIO_FIELDS) is written to 10 decimals under ``scale:``
    — ratio x the generation's 4-decimal value gives the fit's value back — and the absolute field of the same name
    is left alone."""
    out = refit.set_value(SCALED, "frameworks", "torchtitan", "gemm_max", 0.7 / 0.8227, sub="scale")
    assert out.splitlines()[3] == "      gemm_max: 0.8508569345 # [fit] 0.698 / hopper's 0.8227"
    assert [a for a, b in zip(SCALED.splitlines(), out.splitlines()) if a != b] == [SCALED.splitlines()[3]]
    out = refit.set_value(SCALED, "frameworks", "torchtitan", "gemm_max", 0.6)
    assert out.splitlines()[5] == "    gemm_max: 0.6         # an absolute field of the same name (not the ratio)"
    with pytest.raises(KeyError, match="frameworks.torchtitan.scale.dp_overlap"):
        refit.set_value(SCALED, "frameworks", "torchtitan", "dp_overlap", 0.5, sub="scale")
    with pytest.raises(KeyError, match="frameworks.torchtitan.scale"):
        refit.set_value(YAML, "frameworks", "torchtitan", "gemm_max", 0.5, sub="scale")
