"""HBM bytes per element that eager PyTorch moves for the element-wise pieces of a torchtitan Llama block, counted
from the ops autograd really dispatches (a ``TorchDispatchMode`` records every ATen kernel of the forward and the
backward with the bytes of its tensor inputs and outputs), next to the byte tables the cost model prices
(``cost_models/op_traffic.py`` ``EAGER_*``, ``TORCH_LOSS_BYTES``; fused: ``NORM_BYTES``, ``ROTARY_BYTES``, ...).

    python benchmarks/eager_traffic.py

The code traced: torchtitan 0.3.0's ``ComplexRoPE.apply_rotary_emb`` and SwiGLU expression (installed; the same ops
as the 2024-12 ``apply_rotary_emb`` / ``FeedForward.forward``), the 2024-12 ``RMSNorm`` (torchtitan/models/norms.py
at 9dec370, not installable: its three lines restated in ``rmsnorm_2024_12``), torch's ``cross_entropy`` on fp32
logits (torchtitan's loss). Views and aliases move no bytes; an index op (nll_loss) touches only what it indexes:
its full-size input read is not counted, nor its full-size output's read (a zero-fill write).
Kernel launches are not priced: a Llama 8B block at 16k tokens runs ~150 eager kernels of 10-1000 µs each, launched
asynchronously ahead of the GPU, so launch latency (a few µs each) hides behind them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_INDEX_OPS = {"nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward"}


def _nbytes(t: torch.Tensor) -> int:
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())  # an expanded view reads its storage


class _Traffic(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if any(r.alias_info is not None for r in func._schema.returns) or name in ("detach", "new_empty_strided"):
            return out  # a view / alias / allocation: no HBM traffic
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [a for a in tree_flatten(out)[0] if isinstance(a, torch.Tensor)]
        read = 0 if name in _INDEX_OPS else sum(map(_nbytes, ins))
        self.ops.append((name, read + sum(map(_nbytes, outs))))
        return out


def eager_bytes(fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]], inputs: Sequence[torch.Tensor],
                elements: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes per element of ``elements`` of ``fn``'s eager kernels and its autograd."""
    mode = _Traffic()
    with mode:
        out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.randn_like(o) if o.is_floating_point() else None for o in outs]
    fwd = sum(b for _, b in mode.ops)
    mode.ops.clear()
    with mode:
        torch.autograd.backward([o for o in outs if o.requires_grad], [g for g, o in zip(grads, outs) if o.requires_grad])
    return fwd / elements, sum(b for _, b in mode.ops) / elements


def rmsnorm_2024_12(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """torchtitan 9dec370 torchtitan/models/norms.py ``RMSNorm.forward`` / ``_norm`` (rmsnorm, the default)."""
    a = x.float()
    return (a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def counted() -> dict[str, tuple[float, float]]:
    """Bytes per element of each piece (per q/k element for rotary, per FFN element for SwiGLU, per logit)."""
    from torchtitan.models.common.rope import ComplexRoPE

    bf16 = dict(dtype=torch.bfloat16, requires_grad=True)
    tokens, width = 1024, 512
    x, w = torch.randn(tokens, width, **bf16), torch.ones(width, **bf16)
    b, s, heads, kv, hd = 2, 256, 8, 2, 64
    q, k = torch.randn(b, s, heads, hd, **bf16), torch.randn(b, s, kv, hd, **bf16)
    cache = torch.polar(torch.ones(s, hd // 2), torch.rand(s, hd // 2)).view(1, s, 1, hd // 2)
    g, u = torch.randn(tokens, width, **bf16), torch.randn(tokens, width, **bf16)
    logits, labels = torch.randn(tokens, 4 * width, **bf16), torch.randint(0, 4 * width, (tokens,))
    return {
        "norm": eager_bytes(rmsnorm_2024_12, (x, w), x.numel()),
        "rotary": eager_bytes(lambda a, c: ComplexRoPE.apply_rotary_emb(a, c, cache), (q, k), q.numel() + k.numel()),
        "swiglu": eager_bytes(lambda a, c: F.silu(a) * c, (g, u), g.numel()),
        "loss": eager_bytes(lambda z: F.cross_entropy(z.float(), labels), (logits,), logits.numel()),
    }


def priced() -> dict[str, tuple[float, float]]:
    """The same pieces as cost_models/op_traffic.py prices them eager (SwiGLU: the fused act + the eager extra)."""
    from cost_models import op_traffic as L

    fused_act = (2.0 * (2 + 1), 2.0 * (2 * 2 + 1))  # op_traffic_bytes' activation: 2 inputs, 1 output, bf16
    return {"norm": L.EAGER_NORM_BYTES, "rotary": L.EAGER_ROTARY_BYTES,
            "swiglu": (fused_act[0] + L.EAGER_GATED_ACT_EXTRA[0], fused_act[1] + L.EAGER_GATED_ACT_EXTRA[1]),
            "loss": L.TORCH_LOSS_BYTES}


def _megatron_expert_pieces() -> dict[str, tuple[float, float]]:
    """Megatron-Core 0.16.1's eager glue around a bias-carrying, clamped grouped-expert MLP (TEGroupedMLP, the
    installed code): the clamp ahead of the fused quick-GeGLU (``weighted_bias_quick_geglu_impl``, per fc1-output
    element; the fused kernel itself is stubbed: ``op_traffic_bytes`` prices it) and fc2's bias added outside the
    GEMM (``TEGroupedMLP._apply_bias``, per fc2-output element, probs bf16 / fp32). Tokens per expert large enough
    that the bias vectors' own bytes round away."""
    import megatron.core.fusions.fused_bias_geglu as geglu
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    class _Stub(torch.autograd.Function):  # stands for the fused (compiled) activation: no bytes of its own
        @staticmethod
        def forward(ctx, inp, weights, fp8_store, offset):  # type: ignore[no-untyped-def]
            ctx.shape = inp.shape
            with torch.utils._python_dispatch._disable_current_modes():
                return inp.new_empty((inp.shape[0], inp.shape[1] // 2))

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            with torch.utils._python_dispatch._disable_current_modes():
                return grad.new_empty(ctx.shape), None, None, None

    bf16 = dict(dtype=torch.bfloat16, requires_grad=True)
    real, geglu.WeightedQuickGeGLUFunction = geglu.WeightedQuickGeGLUFunction, _Stub
    try:
        tokens, ffn = 1024, 256
        fc1 = torch.randn(tokens, 2 * ffn, **bf16)
        probs = torch.rand(tokens, 1, dtype=torch.bfloat16)
        clamp = eager_bytes(lambda a: geglu.weighted_bias_quick_geglu_impl(a, None, probs, False, 1.0, 7.0), (fc1,),
                            fc1.numel())
    finally:
        geglu.WeightedQuickGeGLUFunction = real
    experts, per_expert, hidden = 4, 2048, 64
    out = torch.randn(experts * per_expert, hidden, **bf16)
    biases = [torch.randn(hidden, **bf16) for _ in range(experts)]

    def bias(dtype: torch.dtype) -> tuple[float, float]:
        p = torch.rand(experts * per_expert, 1, dtype=dtype, requires_grad=True)
        return eager_bytes(lambda o, q, *b: TEGroupedMLP._apply_bias(o, list(b), [per_expert] * experts, q),
                           (out, p, *biases), out.numel())

    return {"mcore_expert_clamp": clamp, "mcore_expert_bias": bias(torch.bfloat16),
            "mcore_expert_bias_fp32_probs": bias(torch.float32)}


def _megatron_yarn_rope() -> dict[str, tuple[float, float]]:
    """Megatron-Core 0.16.1's RoPE where YaRN's concentration factor is not 1 (GPT-OSS: 0.1 ln 32 + 1): TE's fused
    RoPE is dropped for ``_apply_rotary_pos_emb_bshd`` (the installed code), per q/k element; the cos/sin of the
    [s, 1, 1, d] frequencies round away at a real batch x heads."""
    from megatron.core.models.common.embeddings import rope_utils

    bf16 = dict(dtype=torch.bfloat16, requires_grad=True)
    s, b, heads, kv, hd = 128, 8, 64, 8, 64  # GPT-OSS's heads; the frequencies' share is 0.2%
    q, k = torch.randn(s, b, heads, hd, **bf16), torch.randn(s, b, kv, hd, **bf16)
    freqs, factor = torch.rand(s, 1, 1, hd), 0.1 * math.log(32.0) + 1.0

    def rope(a: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (rope_utils._apply_rotary_pos_emb_bshd(a, freqs, mscale=factor),
                rope_utils._apply_rotary_pos_emb_bshd(c, freqs, mscale=factor))

    return {"mcore_yarn_rotary": eager_bytes(rope, (q, k), q.numel() + k.numel())}


def counted_megatron() -> dict[str, tuple[float, float]]:
    """``_megatron_expert_pieces`` (bytes per element of the fc1 output / fc2 output) and ``_megatron_yarn_rope``
    (per q/k element)."""
    return {**_megatron_expert_pieces(), **_megatron_yarn_rope()}


def priced_megatron() -> dict[str, tuple[float, float]]:
    from cost_models import op_traffic as L

    return {"mcore_expert_clamp": L.MCORE_EXPERT_CLAMP_BYTES, "mcore_expert_bias": L.MCORE_EXPERT_BIAS_BYTES["bf16"],
            "mcore_expert_bias_fp32_probs": L.MCORE_EXPERT_BIAS_BYTES["fp32"],
            "mcore_yarn_rotary": L.MCORE_UNFUSED_ROTARY_BYTES}


def main() -> int:
    c, p = {**counted(), **counted_megatron()}, {**priced(), **priced_megatron()}
    print("| piece (bytes per element) | counted fwd | priced fwd | counted bwd | priced bwd |")
    print("|---|---:|---:|---:|---:|")
    for name in c:
        print(f"| {name} | {c[name][0]:.1f} | {p[name][0]:.1f} | {c[name][1]:.1f} | {p[name][1]:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
