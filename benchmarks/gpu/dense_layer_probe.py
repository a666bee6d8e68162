"""Device probe (runs on a GPU machine, PyTorch only): one dense Llama decoder layer, forward + backward, eager and
under ``torch.compile``, beside its GEMMs alone and its attention core alone, so the layer's non-GEMM,
non-attention time (norms, RoPE, SwiGLU, residuals, layout copies, launch gaps) is measured, not inferred.

Usage: ``python benchmarks/gpu/dense_layer_probe.py OUT.json``.
"""

from __future__ import annotations

import json
import sys
import time

import probe_common
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DT = torch.bfloat16
# (name, seq, hidden, q heads, kv heads, head dim, ffn): one rank's layer (a TP split divides heads and ffn)
LAYERS = [
    ("llama3-8b s8192", 8192, 4096, 32, 8, 128, 14336),
    ("llama3-70b tp8 s8192", 8192, 8192, 8, 1, 128, 3584),
]


def timed_ms(fn) -> float:
    return probe_common.timed_ms(fn, warmup=3, reps=10)


def make_layer(s: int, h: int, hq: int, hkv: int, d: int, f: int):
    def p(*shape):
        return (torch.randn(*shape, device="cuda", dtype=DT) * 0.02).requires_grad_(True)

    w = {"norm1": torch.ones(h, device="cuda", dtype=DT, requires_grad=True),
         "norm2": torch.ones(h, device="cuda", dtype=DT, requires_grad=True),
         "qkv": p((hq + 2 * hkv) * d, h), "o": p(h, hq * d), "w13": p(2 * f, h), "w2": p(h, f)}
    pos = torch.arange(s, device="cuda", dtype=torch.float32)[:, None]
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
    ang = torch.cat((pos * inv, pos * inv), dim=-1)
    cos, sin = ang.cos().to(DT)[:, None, :], ang.sin().to(DT)[:, None, :]

    def layer(x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x, (h,), w["norm1"], 1e-5)
        qkv = y @ w["qkv"].t()
        q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
        q = probe_common.rope(q.view(s, hq, d), cos, sin).transpose(0, 1).unsqueeze(0)
        k = probe_common.rope(k.view(s, hkv, d), cos, sin).transpose(0, 1).unsqueeze(0)
        v = v.view(s, hkv, d).transpose(0, 1).unsqueeze(0)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + a.squeeze(0).transpose(0, 1).reshape(s, hq * d) @ w["o"].t()
        y = F.rms_norm(x, (h,), w["norm2"], 1e-5)
        g, u = (y @ w["w13"].t()).chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ w["w2"].t()

    return layer, w


def probe(name: str, s: int, h: int, hq: int, hkv: int, d: int, f: int) -> dict:
    layer, w = make_layer(s, h, hq, hkv, d, f)
    x = torch.randn(s, h, device="cuda", dtype=DT, requires_grad=True)
    dy = torch.randn(s, h, device="cuda", dtype=DT)

    leaves = [x, *w.values()]

    def eager():
        probe_common.fresh_grads(*leaves)
        layer(x).backward(dy)

    # the same four GEMMs (forward, dgrad, wgrad through autograd) on stand-in inputs, output gradients made once
    xin = torch.randn(s, h, device="cuda", dtype=DT, requires_grad=True)
    ain = torch.randn(s, hq * d, device="cuda", dtype=DT, requires_grad=True)
    xin2 = torch.randn(s, h, device="cuda", dtype=DT, requires_grad=True)
    fin = torch.randn(s, f, device="cuda", dtype=DT, requires_grad=True)
    gouts = [torch.randn(s, n, device="cuda", dtype=DT) for n in ((hq + 2 * hkv) * d, h, 2 * f, h)]

    def gemms():
        probe_common.fresh_grads(xin, ain, xin2, fin, *w.values())
        outs = [xin @ w["qkv"].t(), ain @ w["o"].t(), xin2 @ w["w13"].t(), fin @ w["w2"].t()]
        torch.autograd.backward(outs, gouts)

    q = torch.randn(1, hq, s, d, device="cuda", dtype=DT, requires_grad=True)
    k = torch.randn(1, hkv, s, d, device="cuda", dtype=DT, requires_grad=True)
    v = torch.randn(1, hkv, s, d, device="cuda", dtype=DT, requires_grad=True)
    do = torch.randn(1, hq, s, d, device="cuda", dtype=DT)

    def attn():
        probe_common.fresh_grads(q, k, v)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(do)

    row = {"case": name, "seq": s, "hidden": h, "q_heads": hq, "kv_heads": hkv, "head_dim": d, "ffn": f,
           "eager_fwd_bwd_ms": timed_ms(eager), "gemms_fwd_bwd_ms": timed_ms(gemms),
           "attention_fwd_bwd_ms": timed_ms(attn)}
    try:
        t0 = time.time()
        compiled = torch.compile(layer)

        def comp():
            probe_common.fresh_grads(*leaves)
            compiled(x).backward(dy)

        comp()
        row["compile_s"] = round(time.time() - t0, 1)
        row["compiled_fwd_bwd_ms"] = timed_ms(comp)
    except Exception as exc:  # noqa: BLE001
        row["compile_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def main(out_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
              "method": "CUDA events around one forward+backward (leaf gradients dropped before each), median of 10 after 3 warm-ups", "layers": []}
    for case in LAYERS:
        s = time.time()
        result["layers"].append(probe(*case))
        print(case[0], f"{time.time() - s:.1f} s", result["layers"][-1], flush=True)
        torch.cuda.empty_cache()
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dense_probe.json")
