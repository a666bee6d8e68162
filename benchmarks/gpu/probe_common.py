"""What the device probes of ``benchmarks/gpu/`` share: the CUDA-event timer and the rotary embedding they apply
(PyTorch only; the probes run as scripts there, so ``python3 benchmarks/gpu/<probe>.py`` finds this module beside them)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def timed_ms(fn: Callable[[], object], warmup: int, reps: int, inner: int = 1) -> float:
    """Median over ``reps`` of the time of ``inner`` back-to-back calls between two CUDA events, per call, after
    ``warmup`` calls: with ``inner`` > 1 the launch queue stays ahead of the GPU, so a short kernel is not timed with
    its launch gap."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / inner)
    times.sort()
    return times[len(times) // 2]


def causal_flops(b: int, h: int, s: int, d_qk: int, d_v: int) -> float:
    """Forward FLOPs of causal attention as the cost model counts them: 2·b·h·s²·(d_qk + d_v)/2."""
    return 2.0 * b * h * s * s * (d_qk + d_v) / 2


def attention_times(fwd: Callable[[], object], fwd_bwd: Callable[[], object], flops: float, warmup: int,
                    reps: int) -> dict[str, float]:
    """An attention kernel's row: median ms of its forward (under no_grad) and of forward + backward, the backward
    as their difference, and TFLOP/s on ``flops`` (forward + backward counted 3.5x the forward)."""
    with torch.no_grad():
        f_ms = timed_ms(fwd, warmup, reps)
    fb_ms = timed_ms(fwd_bwd, warmup, reps)
    return {"fwd_ms": round(f_ms, 4), "fwd_bwd_ms": round(fb_ms, 4), "bwd_ms": round(fb_ms - f_ms, 4),
            "fwd_tflops": round(flops / f_ms / 1e9, 1), "fwd_bwd_tflops": round(3.5 * flops / fb_ms / 1e9, 1)}


def fresh_grads(*tensors: torch.Tensor) -> None:
    """Drop the leaves' ``.grad`` before a timed backward, so it writes new gradients as a training step's first
    micro-batch does instead of reading and adding into the last call's (a pass per input no ideal count holds)."""
    for t in tensors:
        t.grad = None


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split (Llama's ``rotate_half``)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
