"""Runtimes autoplan prices but does not emit for: published frameworks whose runs check the cost model.

``DEEPSEEK``: DeepSeek-V3's own framework (HAI-LLM), as its technical report (arXiv 2412.19437) states it; used
to price the published 2048-H800 layout (``benchmarks/fidelity.py``).
"""

from __future__ import annotations

from cost_models.targets.common import Runtime

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

__all__ = ["DEEPSEEK", "REFERENCE_RUNTIMES"]
