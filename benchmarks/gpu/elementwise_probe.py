"""Device probe (runs on a GPU machine, PyTorch only): the memory-bound kernels of a decoder layer, one at a time,
forward + backward, eager and under ``torch.compile``, with the bytes an ideal fused kernel would move (each input
read once, each output written once, forward and backward), so their achieved share of HBM bandwidth is measured.

Usage: ``python benchmarks/gpu/elementwise_probe.py OUT.json``.
"""

from __future__ import annotations

import json
import sys
import time

import probe_common
import torch
import torch.nn.functional as F

DT = torch.bfloat16
TOKENS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 8192, 4096, 32, 8, 128, 14336, 128256  # llama3-8b, 8k


def timed_ms(fn) -> float:
    return probe_common.timed_ms(fn, warmup=3, reps=10)


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, 1e-5)


def swiglu(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), target)


def cases() -> list[tuple[str, object, tuple, float]]:
    """(name, fn, args, ideal fwd+bwd HBM bytes): forward reads inputs and writes outputs; backward reads the output
    gradient and what it saved (its inputs) and writes the input gradients."""
    def p(*shape, grad=True, dtype=DT):
        return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(grad)

    b = 2.0
    x, w = p(TOKENS, HIDDEN), torch.ones(HIDDEN, device="cuda", dtype=DT, requires_grad=True)
    q = p(TOKENS, HEADS, HEAD_DIM)
    ang = torch.randn(TOKENS, 1, HEAD_DIM, device="cuda")
    cos, sin = ang.cos().to(DT), ang.sin().to(DT)
    gu = p(TOKENS, 2 * FFN)
    r1, r2 = p(TOKENS, HIDDEN), p(TOKENS, HIDDEN)
    logits = p(TOKENS, VOCAB)
    target = torch.randint(0, VOCAB, (TOKENS,), device="cuda")
    n, nq = TOKENS * HIDDEN, TOKENS * HEADS * HEAD_DIM
    return [
        # norm: fwd read x, write y; bwd read dy, x, write dx (weight grad: a reduction, small)
        ("rms_norm", rms_norm, (x, w), b * (2 * n + 3 * n)),
        # rope on q: fwd read q (+cos/sin, small), write; bwd read dy, write dq
        ("rope_q", probe_common.rope, (q, cos, sin), b * (2 * nq + 2 * nq)),
        # swiglu: fwd read g,u write a; bwd read da, g, u, write dg, du
        ("swiglu", swiglu, (gu,), b * (3 * TOKENS * FFN + 5 * TOKENS * FFN)),
        # residual add: fwd read 2 write 1; bwd the gradient passes through (no kernel needed)
        ("residual_add", add, (r1, r2), b * 3 * n),
        # loss on bf16 logits: fwd read logits, bwd write dlogits (fp32 upcast inside)
        ("cross_entropy", cross_entropy, (logits, target), b * 2 * TOKENS * VOCAB),
    ]


def main(out_path: str) -> None:
    rows = []
    for name, fn, args, ideal in cases():
        out = fn(*args)
        gy = torch.randn_like(out)

        leaves = [a for a in args if a.requires_grad]

        def run(f=fn):
            probe_common.fresh_grads(*leaves)
            y = f(*args)
            y.backward(gy)

        row = {"case": name, "ideal_bytes": ideal, "eager_ms": timed_ms(run)}
        try:
            t0 = time.time()
            compiled = torch.compile(fn)
            run(compiled)
            row["compile_s"] = round(time.time() - t0, 1)
            row["compiled_ms"] = timed_ms(lambda: run(compiled))
        except Exception as exc:  # noqa: BLE001
            row["compile_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(row, flush=True)
    src = torch.empty(1 << 30, device="cuda", dtype=DT)
    dst = torch.empty_like(src)
    copy = {"case": "copy 2 GiB", "bytes": 4.0 * (1 << 30), "ms": timed_ms(lambda: dst.copy_(src))}
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "shape": {"tokens": TOKENS, "hidden": HIDDEN, "heads": HEADS, "head_dim": HEAD_DIM, "ffn": FFN,
                        "vocab": VOCAB},
              "method": "CUDA events around one forward+backward (leaf gradients dropped before each), median of 10 after 3 warm-ups",
              "ops": rows, "copy": copy}
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "elementwise_probe.json")
