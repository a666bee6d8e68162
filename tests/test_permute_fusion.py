"""The Megatron launch runs the MoE permutation autoplan prices: TE's fused permute / unpermute / sort-by-expert
(``--moe-permute-fusion``), as every Megatron-Bridge MoE recipe does (so the rows the MoE host cost is fitted on);
Megatron-LM's default is off (transformer_config.py:708 @ core_v0.16.1)."""

from __future__ import annotations

import warnings

import pytest

from cost_models.moe import MEGATRON_PERMUTE_PASSES

BASE = ["--gpu", "h100-sxm", "--gpus", "64", "--tp", "1", "--global-batch-size", "1024", "--seq-len", "4096",
        "--target", "megatron", "--precision", "fp8", "--allow-over-memory"]


def test_moe_launches_fuse_the_permutation_and_megatron_core_takes_it(tmp_path) -> None:  # noqa: ANN001
    pytest.importorskip("megatron.core.transformer")
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    import megatron.core.transformer.moe.moe_utils as moe_utils

    from autoplan.validate.megatron_checks import _check_config, transformer_config_kwargs
    from autoplan.validate.megatron_lm import FUSED_PERMUTE_KERNELS, stand_in_te_version
    from cli_emit import emitted_megatron_args

    # the passes priced per dispatch / combine are the fused kernels' (one gather or scatter of each routed copy)
    assert MEGATRON_PERMUTE_PASSES == {"alltoall": 1, "deepep": 1, "hybridep": 1}
    for model, dispatcher in (("qwen3-235b-a22b", []), ("deepseek-v3", ["--moe-dispatcher", "deepep"])):
        ns = emitted_megatron_args(["--model", model, "--pp", "8", "--ep", "8", *BASE, *dispatcher],
                                   tmp_path / model)
        assert ns.moe_permute_fusion and ns.moe_grouped_gemm
        stand_in_te_version()  # what the validate path does first: no Transformer Engine on this CPU machine
        if not moe_utils.HAVE_TE:  # TE's kernels stood in, only looked up by TransformerConfig here
            assert all(callable(getattr(moe_utils, k)) for k in FUSED_PERMUTE_KERNELS)
        assert "TransformerConfig(" in _check_config(ns)  # the validate path's check passes
        mla, kw = transformer_config_kwargs(ns)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert (MLATransformerConfig if mla else TransformerConfig)(**kw).moe_permute_fusion
    dense = emitted_megatron_args(["--model", "llama3-8b", "--pp", "1", *BASE], tmp_path / "dense")
    assert not dense.moe_permute_fusion
