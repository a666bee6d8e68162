"""Device probe (runs on a GPU machine, PyTorch only; no autoplan import): times the kernels one MoE decoder layer
of the held-out misses is made of, so ``benchmarks/moe_probe_compare.py`` can set them beside the cost model's
``matmul_time_s`` / ``attention_time_s`` / ``hbm_time_s`` on the same GPU.

What it times (bf16, CUDA events, median of ``REPS`` after ``WARMUP`` launches):
- dense GEMMs, forward (x·Wᵀ, Transformer Engine's TN fprop), dgrad (dy·W) and wgrad (dyᵀ·x), on a grid of shapes;
- routed experts as one rank runs them at the published layouts (``EXPERT_CASES``: local experts × rows each):
  a loop of per-expert GEMMs with distinct weights (what TE's GroupedLinear / Megatron's SequentialMLP issue on
  Hopper) and ``torch._grouped_mm`` (torchtitan's grouped experts), forward and forward+backward;
- the attention core through SDPA's cuDNN and flash backends at head dim 64 and 128, causal, fwd and fwd+bwd;
- memory-bound: a device copy and the token permutation (an ``index_select`` of the routed rows).

Usage: ``python benchmarks/gpu/moe_layer_probe.py OUT.json``.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time

import probe_common
import torch
import torch.nn.functional as F

WARMUP, REPS = 5, 20
DT = torch.bfloat16

# (m, k, n): rows, reduction, output width
GEMM_GRID = [(m, k, n) for m in (256, 512, 1024, 2048, 4096, 8192)
             for (k, n) in ((4096, 4096), (8192, 8192), (2880, 5760), (2880, 2880), (2048, 1536), (768, 2048),
                            (5120, 16384), (8192, 28672))]

# (name, local experts, rows per expert, hidden, expert ffn, gated): one rank's routed experts at the published layout
EXPERT_CASES = [
    ("gpt-oss-120b tp2 ep16 (card h100 64gpu)", 8, 1024, 2880, 2880, True),
    ("gpt-oss-120b tp1 ep8 (mb26.02 h100 64gpu)", 16, 1024, 2880, 2880, True),
    ("gpt-oss-20b tp2 ep4 (card h100 16gpu)", 8, 1024, 2880, 2880, True),
    ("qwen3-30b-a3b tp1 ep16 mbs1 (card h100 16gpu)", 8, 4096, 2048, 768, True),
    # these two time twice the rows their label's layout routes (4096 per expert): they stand for mbs 4 and mbs 2
    # (benchmarks/h200_probe.py EXPERT_LAYOUTS); the labels are kept as the stored data carries them
    ("qwen3-30b-a3b tp1 ep8 mbs2 (mb2511 h100 16gpu)", 16, 8192, 2048, 768, True),
    ("llama4-maverick tp1 ep64 (gb200 128gpu)", 2, 8192, 5120, 8192, True),
]

# (name, batch, q heads, kv heads, seq, head dim)
ATTN_CASES = [
    ("gpt-oss d64 tp2", 1, 32, 4, 4096, 64),
    ("gpt-oss d64 tp1", 1, 64, 8, 4096, 64),
    ("qwen3-30b d128 tp1", 1, 32, 4, 4096, 128),
    ("llama d128 8k", 1, 32, 8, 8192, 128),
]


def timed_ms(fn, warmup: int = WARMUP, reps: int = REPS, inner: int = 1) -> float:
    return probe_common.timed_ms(fn, warmup, reps, inner)


GEMM_INNER = 20  # back-to-back launches per timed sample on the GEMM grid (the training loop's regime)


def gemm_rows() -> list[dict]:
    rows = []
    for m, k, n in GEMM_GRID:
        x = torch.randn(m, k, device="cuda", dtype=DT)
        w = torch.randn(n, k, device="cuda", dtype=DT)
        dy = torch.randn(m, n, device="cuda", dtype=DT)
        rows.append({"m": m, "k": k, "n": n,
                     "fprop_ms": timed_ms(lambda: x @ w.t(), inner=GEMM_INNER),
                     "dgrad_ms": timed_ms(lambda: dy @ w, inner=GEMM_INNER),
                     "wgrad_ms": timed_ms(lambda: dy.t() @ x, inner=GEMM_INNER),
                     "fprop_single_launch_ms": timed_ms(lambda: x @ w.t())})
        try:  # per-tensor-scaled fp8 fprop (Transformer Engine's delayed / current scaling GEMM on Hopper)
            x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
            one = torch.ones((), device="cuda", dtype=torch.float32)
            rows[-1]["fp8_fprop_ms"] = timed_ms(lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                                          out_dtype=DT), inner=GEMM_INNER)
            del x8, w8
        except Exception as exc:  # noqa: BLE001
            rows[-1]["fp8_error"] = f"{type(exc).__name__}: {exc}"[:300]
        del x, w, dy
    return rows


def expert_rows() -> list[dict]:
    rows = []
    for name, e, t, h, f, gated in EXPERT_CASES:
        fc1_out = 2 * f if gated else f
        w1 = [torch.randn(fc1_out, h, device="cuda", dtype=DT) * 0.02 for _ in range(e)]
        w2 = [torch.randn(h, f, device="cuda", dtype=DT) * 0.02 for _ in range(e)]
        xs = [torch.randn(t, h, device="cuda", dtype=DT) for _ in range(e)]
        dy1 = [torch.randn(t, fc1_out, device="cuda", dtype=DT) for _ in range(e)]
        dy2 = [torch.randn(t, h, device="cuda", dtype=DT) for _ in range(e)]
        a2 = [torch.randn(t, f, device="cuda", dtype=DT) for _ in range(e)]

        def loop_fwd():
            for i in range(e):
                xs[i] @ w1[i].t()
                a2[i] @ w2[i].t()

        def loop_bwd():
            for i in range(e):
                dy2[i] @ w2[i]
                dy2[i].t() @ a2[i]
                dy1[i] @ w1[i]
                dy1[i].t() @ xs[i]

        row = {"case": name, "experts": e, "rows": t, "hidden": h, "ffn": f, "gated": gated,
               "loop_fwd_ms": timed_ms(loop_fwd), "loop_bwd_ms": timed_ms(loop_bwd)}
        # torch._grouped_mm (torchtitan's GroupedExperts): 2-D activations x 3-D weights, offsets per expert
        try:
            xcat = torch.cat(xs).requires_grad_(True)
            acat = torch.cat(a2).requires_grad_(True)
            W1 = torch.stack([w.t() for w in w1]).contiguous().requires_grad_(True)  # (e, h, fc1_out)
            W2 = torch.stack([w.t() for w in w2]).contiguous().requires_grad_(True)  # (e, f, h)
            offs = torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * t
            g1 = torch.cat(dy1)
            g2 = torch.cat(dy2)

            def grouped_fwd():
                with torch.no_grad():
                    torch._grouped_mm(xcat, W1, offs=offs)
                    torch._grouped_mm(acat, W2, offs=offs)

            def grouped_fwd_bwd():
                y1 = torch._grouped_mm(xcat, W1, offs=offs)
                y2 = torch._grouped_mm(acat, W2, offs=offs)
                torch.autograd.backward([y1, y2], [g1, g2])

            row["grouped_fwd_ms"] = timed_ms(grouped_fwd)
            row["grouped_fwd_bwd_ms"] = timed_ms(grouped_fwd_bwd)
        except Exception as exc:  # noqa: BLE001 - record why the grouped kernel is missing, keep the loop numbers
            row["grouped_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        del w1, w2, xs, dy1, dy2, a2
        torch.cuda.empty_cache()
    return rows


# (name, tokens on the rank, hidden, experts in the model, top-k, local experts, expert ffn): one rank's MoE block
# without its all-to-alls (the rows it receives are drawn uniformly over its local experts)
BLOCK_CASES = [
    ("qwen3-30b-a3b tp1 ep16 mbs1", 4096, 2048, 128, 8, 8, 768),
    ("gpt-oss-120b tp2 ep16 (SP: 2048 tokens)", 2048, 2880, 128, 4, 8, 2880),
]


def moe_block_rows() -> list[dict]:
    """Eager MoE block, forward + backward, timed end to end on the stream (launch gaps included): router GEMM,
    softmax, top-k; sort of the received rows by local expert, gather, grouped fc1, SwiGLU, grouped fc2, probability
    scale, scatter back. ``gemm_only_ms`` is the same block's grouped GEMMs alone: the difference is the block's
    non-GEMM work as eager PyTorch runs it."""
    rows = []
    for name, tokens, h, n_exp, k, e, f in BLOCK_CASES:
        recv = tokens * k  # balanced EP: each rank receives tokens·k rows (ep·(tokens·k/ep))
        router_w = (torch.randn(n_exp, h, device="cuda", dtype=DT) * 0.02).requires_grad_(True)
        x_tok = torch.randn(tokens, h, device="cuda", dtype=DT, requires_grad=True)
        x_recv = torch.randn(recv, h, device="cuda", dtype=DT, requires_grad=True)
        probs_recv = torch.rand(recv, 1, device="cuda", dtype=torch.float32)
        expert_of_row = torch.randint(0, e, (recv,), device="cuda")
        W1 = (torch.randn(e, h, 2 * f, device="cuda", dtype=DT) * 0.02).requires_grad_(True)
        W2 = (torch.randn(e, f, h, device="cuda", dtype=DT) * 0.02).requires_grad_(True)

        def block(gemm_only: bool = False):
            if gemm_only:
                counts = torch.full((e,), recv // e, device="cuda", dtype=torch.int32)
                offs = torch.cumsum(counts, 0, dtype=torch.int32)
                y1 = torch._grouped_mm(x_recv, W1, offs=offs)
                a = y1[:, :f] * y1[:, f:]
                y = torch._grouped_mm(a, W2, offs=offs)
                y.backward(torch.ones_like(y))
                return
            logits = x_tok @ router_w.t()
            scores = torch.softmax(logits.float(), dim=-1)
            top_p, top_i = torch.topk(scores, k, dim=-1)
            order = torch.argsort(expert_of_row, stable=True)
            counts = torch.bincount(expert_of_row, minlength=e)
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            xs = x_recv.index_select(0, order)
            y1 = torch._grouped_mm(xs, W1, offs=offs)
            gate, up = y1[:, :f], y1[:, f:]
            a = F.silu(gate) * up
            y = torch._grouped_mm(a, W2, offs=offs)
            y = (y.float() * probs_recv.index_select(0, order)).to(DT)
            out = torch.empty_like(y).index_copy_(0, order, y)
            loss = out.float().sum() + (top_p.sum() * 0.0)
            loss.backward()

        try:
            rows.append({"case": name, "tokens": tokens, "received_rows": recv, "hidden": h, "experts": n_exp,
                         "top_k": k, "local_experts": e, "ffn": f,
                         "block_fwd_bwd_ms": timed_ms(block), "gemm_only_ms": timed_ms(lambda: block(True))})
        except Exception as exc:  # noqa: BLE001
            rows.append({"case": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        del router_w, x_tok, x_recv, W1, W2
        torch.cuda.empty_cache()
    return rows


def attention_rows() -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for name, b, hq, hkv, s, d in ATTN_CASES:
        q = torch.randn(b, hq, s, d, device="cuda", dtype=DT, requires_grad=True)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=DT, requires_grad=True)
        v = torch.randn(b, hkv, s, d, device="cuda", dtype=DT, requires_grad=True)
        do = torch.randn(b, hq, s, d, device="cuda", dtype=DT)
        # causal FLOPs: QKᵀ and PV, 4·b·hq·d per (query, key) pair, s(s+1)/2 pairs
        row = {"case": name, "batch": b, "q_heads": hq, "kv_heads": hkv, "seq": s, "head_dim": d,
               "causal_fwd_flops": 4.0 * b * hq * d * s * (s + 1) / 2}
        for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([backend]):
                    def fwd():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

                    def fwd_bwd():
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                        out.backward(do)

                    row[f"{label}_fwd_ms"] = timed_ms(fwd)
                    row[f"{label}_fwd_bwd_ms"] = timed_ms(fwd_bwd)
            except Exception as exc:  # noqa: BLE001
                row[f"{label}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        del q, k, v, do
    return rows


def memory_rows() -> list[dict]:
    rows = []
    n = 1 << 30  # 2 GiB of bf16
    src = torch.empty(n, device="cuda", dtype=DT)
    dst = torch.empty_like(src)
    rows.append({"case": "copy 2 GiB", "bytes": 2.0 * 2 * n, "ms": timed_ms(lambda: dst.copy_(src))})
    del src, dst
    for name, tokens, topk, h in (("permute gpt-oss tp2 (2048 tok x4, h2880)", 2048, 4, 2880),
                                  ("permute qwen3-30b mbs1 (4096 tok x8, h2048)", 4096, 8, 2048)):
        x = torch.randn(tokens, h, device="cuda", dtype=DT)
        idx = torch.randint(0, tokens, (tokens * topk,), device="cuda")
        rows.append({"case": name, "bytes": 2.0 * (tokens * topk * h * 2),
                     "ms": timed_ms(lambda: x.index_select(0, idx))})
    return rows


def smi(query: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: {exc}"


def main(out_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
            "smi_before": smi("name,driver_version,power.limit,clocks.max.sm,clocks.sm,temperature.gpu")}
    result = {"info": info, "method": f"CUDA events, median of {REPS} samples after {WARMUP} warm-up calls, bf16; "
                                       f"GEMM grid: {GEMM_INNER} back-to-back launches per sample"}
    for key, fn in (("gemm", gemm_rows), ("experts", expert_rows), ("moe_block", moe_block_rows),
                    ("attention", attention_rows),
                    ("memory", memory_rows)):
        s = time.time()
        result[key] = fn()
        print(f"{key}: {time.time() - s:.1f} s", flush=True)
    info["smi_after"] = smi("clocks.sm,temperature.gpu,power.draw")
    info["wall_s"] = round(time.time() - t0, 1)
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result)[:3000])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe.json")
