"""Device probe (runs on a GPU machine, PyTorch only; no autoplan, TE or Megatron import): the memory-bound glue of a
GPT-OSS MoE layer as Megatron-Core runs it in BF16 (Megatron-Bridge's GPT-OSS provider: ``bias_activation_fusion``,
``activation_func_clamp_value`` 7, ``glu_linear_offset`` 1, ``add_bias_linear``, YaRN RoPE), timed forward + backward
beside the cost model's price for the same ops (``op_traffic.MCORE_EXPERT_CLAMP_BYTES``, ``MCORE_EXPERT_BIAS_BYTES``,
``MCORE_UNFUSED_ROTARY_BYTES`` over the HBM efficiency: ``benchmarks/gptoss_glue_compare.py``).

The pieces, written here from what the framework's code does (not imported):
- ``act_mcore``: the expert activation under ``bias_activation_fusion`` (megatron/core/fusions/fused_bias_geglu.py
  ``weighted_bias_quick_geglu_impl`` @ core_v0.17.0 / Bridge v0.4.0's pin d7288711): the fc1 output is chunked, both
  halves clamped and concatenated in eager PyTorch, the offset built as a device tensor, then an autograd Function
  whose forward / backward are ``torch.compile``d (``jit_fuser``): quick-GeLU(gate) * (linear + 1) * prob, and the
  input and prob gradients;
- ``act_ideal``: the same math as one ``torch.compile``d function (clamp included), the lower bound;
- ``fc2_bias_bf16`` / ``fc2_bias_fp32``: ``TEGroupedMLP._apply_bias`` (experts.py): split fc2's output by expert,
  ``t + b * p`` per expert, concatenate, cast; probs bf16 (alltoall dispatcher) or fp32 (DeepEP / HybridEP);
- ``rope_yarn_unfused``: ``_apply_rotary_pos_emb_bshd`` on q (64 heads) and k (8 heads), head dim 64, with cos / sin
  scaled by YaRN's mscale each call, rotate-half by chunk / neg / cat, and the concatenation with the (empty)
  pass-through part; ``rope_ideal`` the same math compiled;
- ``experts_gemm``: the routed-expert GEMMs alone, fc1 and fc2 as one ``torch._grouped_mm`` each (one output buffer,
  as TE's GroupedLinear writes; fc1's bias, a cuBLAS epilogue in TE, left out), forward + backward, and
  ``experts_full``: fc1, the activation, fc2 and fc2's bias chained as the layer runs them — so the glue measured in
  place (launch gaps and stream order included) = full - gemm.

Cases: one rank at tp 1, ep 8 (16 local experts of GPT-OSS-120B) with 1024 routed rows per expert (mbs 1 x 4096:
the H100 rows) and 4096 (mbs 4 x 4096: the Blackwell rows), forced-balanced routing.

Usage: ``python benchmarks/gpu/gptoss_glue_probe.py OUT.json [--profile]`` (``--profile``: also each piece's kernel
time per call under torch.profiler, ``device_ms``: the device's busy time without the host's issue gaps); 119 s on an
H200 (70 s with --profile on another), most of it
``torch.compile``: every compiled function is compiled once with dynamic shapes, as ``jit_fuser`` ends up after a
second shape);
``--smoke`` runs tiny shapes on the CPU to check the script.

What it decides: if ``act_mcore`` + ``fc2_bias_*`` + ``rope_yarn_unfused`` (and ``experts_full - experts_gemm``) run
within ~25% of the model's price for them on the H200 (``gptoss_glue_compare.py``: at 4096 rows per expert about
2.7 ms activation, 1.3 ms fc2 bias, 0.96 ms rope), the GPT-OSS miss is not in Megatron's eager glue and needs a
profile of the real stack (TE GroupedLinear / cuDNN sink attention); if they run > 2x their price, the byte counts
miss launches or passes and the fix is there (a rule for any model on that code path, not a GPT-OSS factor).
"""

from __future__ import annotations

import json
import sys
import time

import probe_common
import torch

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
DT = torch.bfloat16
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = (64, 64, 4, 2, 16) if SMOKE else (2880, 2880, 64, 8, 64)
LOCAL_EXPERTS, TOP_K, SEQ = (2, 4, 32) if SMOKE else (16, 4, 4096)
ROWS = (8,) if SMOKE else (1024, 4096)
CLAMP, OFFSET, QG_ALPHA = 7.0, 1.0, 1.702
YARN_MSCALE = 1.3465735902799727  # 0.1 ln(32) + 1: YaRN's attention factor for factor 32
WARMUP, REPS = (1, 2) if SMOKE else (3, 10)


def timed_ms(fn) -> float:
    if SMOKE:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return probe_common.timed_ms(fn, warmup=WARMUP, reps=REPS)


# --- the activation, as Megatron-Core splits it: eager clamp, then a Function with compiled forward / backward -------
@torch.compile(dynamic=True)
def _qgeglu_w(y: torch.Tensor, w: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
    g, lin = y.chunk(2, -1)
    return (g * torch.sigmoid(QG_ALPHA * g) * (lin + off) * w).to(y.dtype)


@torch.compile(dynamic=True)
def _qgeglu_w_back(dy: torch.Tensor, y: torch.Tensor, w: torch.Tensor, off: torch.Tensor):
    g, lin = y.chunk(2, -1)
    s = torch.sigmoid(QG_ALPHA * g)
    dw_in = dy * w
    dg = dw_in * s * (1 + QG_ALPHA * g * (1 - s)) * (lin + off)
    dlin = dw_in * g * s
    dprob = torch.sum(g * s * (lin + off) * dy.to(w.dtype), dim=-1, keepdim=True)
    return torch.cat((dg, dlin), -1).to(y.dtype), dprob.to(w.dtype)


class _WeightedQGeGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, w, off):  # type: ignore[override]
        ctx.save_for_backward(y, w, off)
        return _qgeglu_w(y, w, off)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        y, w, off = ctx.saved_tensors
        dx, dw = _qgeglu_w_back(dy, y, w, off)
        return dx, dw, None


def act_mcore(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    g, lin = y.chunk(2, -1)
    y = torch.cat((g.clamp(max=CLAMP), lin.clamp(min=-CLAMP, max=CLAMP)), -1)
    off = torch.tensor(OFFSET, dtype=y.dtype, device=y.device)
    return _WeightedQGeGLU.apply(y, w, off)


@torch.compile(dynamic=True)
def act_ideal(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    g, lin = y.chunk(2, -1)
    g, lin = g.clamp(max=CLAMP), lin.clamp(min=-CLAMP, max=CLAMP)
    return (g * torch.sigmoid(QG_ALPHA * g) * (lin + OFFSET) * w).to(y.dtype)


# --- fc2's bias, expert by expert ----------------------------------------------------------------------------------
def fc2_bias(out: torch.Tensor, biases: list[torch.Tensor], probs: torch.Tensor, counts: list[int]) -> torch.Tensor:
    parts = [t + b * p for t, b, p in zip(out.split(counts), biases, probs.split(counts))]
    return torch.cat(parts).to(out.dtype)


# --- YaRN RoPE, unfused (bshd / sbhd: [s, b, heads, d]) -------------------------------------------------------------
def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope_unfused(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    d = freqs.shape[-1]
    rot, passthrough = t[..., :d], t[..., d:]
    cos = (torch.cos(freqs) * YARN_MSCALE).to(t.dtype)
    sin = (torch.sin(freqs) * YARN_MSCALE).to(t.dtype)
    rot = rot * cos + _rotate_half(rot) * sin
    return torch.cat((rot, passthrough), dim=-1)


rope_ideal = torch.compile(rope_unfused, dynamic=True)


def device_ms(fn, calls: int = 5) -> float:
    """Kernel time per call: the sum of every kernel's (and device copy's / memset's) device time over ``calls``
    calls under torch.profiler (CUPTI), after one warm-up call — the device's busy time, whatever the host's issue
    time between kernels (``--profile``; None on the CPU smoke run)."""
    if SMOKE:
        return float("nan")
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    try:  # CUDA activity only: the events are the kernels / copies themselves, no CPU op holding them twice
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        return sum(e.self_device_time_total for e in prof.key_averages()) / 1e3 / calls
    except Exception as e:  # a profiler the build lacks must not lose the timings
        print(f"device_ms: {e!r}", file=sys.stderr)
        return float("nan")


def leaf(*shape: int, dtype: torch.dtype = DT) -> torch.Tensor:
    return torch.randn(*shape, device=DEV, dtype=dtype).requires_grad_(True)


PROFILE = "--profile" in sys.argv
DEVICE_MS: dict[str, float] = {}  # piece -> kernel ms per call (``--profile``)


def fwd_bwd(fn, inputs: list[torch.Tensor], *args, name: str = "") -> float:
    def run() -> None:
        probe_common.fresh_grads(*inputs)
        out = fn(*inputs, *args)
        out.backward(torch.ones_like(out))
    if PROFILE and name:
        DEVICE_MS[name] = device_ms(run)
    return timed_ms(run)


def _grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """One grouped GEMM over the local experts into one buffer, as TE's GroupedLinear writes it: ``torch._grouped_mm``
    where the build has it (sm_90+), else a per-expert loop and a concatenation (the CPU smoke run)."""
    if not SMOKE:
        return torch._grouped_mm(x, w, offs=offs)
    return torch.cat([xe @ we for xe, we in zip(x.split(counts), w.unbind(0))])


def expert_rows(rows: int) -> dict:
    n, counts = LOCAL_EXPERTS * rows, [rows] * LOCAL_EXPERTS
    offs = torch.arange(1, LOCAL_EXPERTS + 1, device=DEV, dtype=torch.int32) * rows
    y, w_bf16, w_fp32 = leaf(n, 2 * FFN), leaf(n, 1), leaf(n, 1, dtype=torch.float32)
    out = leaf(n, HIDDEN)
    biases = [leaf(HIDDEN) for _ in range(LOCAL_EXPERTS)]
    x, a = leaf(n, HIDDEN), leaf(n, FFN)
    w1 = (torch.randn(LOCAL_EXPERTS, HIDDEN, 2 * FFN, device=DEV, dtype=DT) * 0.02).requires_grad_(True)
    w2 = (torch.randn(LOCAL_EXPERTS, FFN, HIDDEN, device=DEV, dtype=DT) * 0.02).requires_grad_(True)

    def gemms() -> None:  # fc1 and fc2 on independent inputs, forward + backward: the GEMMs alone
        probe_common.fresh_grads(x, a, w1, w2)
        h, o = _grouped(x, w1, offs, counts), _grouped(a, w2, offs, counts)
        torch.autograd.backward([h, o], [torch.ones_like(h), torch.ones_like(o)])

    def full() -> None:  # fc1 -> Megatron's activation -> fc2 -> fc2's bias, forward + backward
        probe_common.fresh_grads(x, w1, w2, w_bf16, *biases)
        o = fc2_bias(_grouped(act_mcore(_grouped(x, w1, offs, counts), w_bf16), w2, offs, counts),
                     biases, w_bf16, counts)
        o.backward(torch.ones_like(o))

    r = {"rows_per_expert": rows, "local_experts": LOCAL_EXPERTS,
         "gemm": "torch._grouped_mm" if not SMOKE else "per-expert loop"}
    t0 = time.perf_counter()
    r["act_mcore_ms"] = fwd_bwd(act_mcore, [y, w_bf16], name="act_mcore")
    r["act_ideal_ms"] = fwd_bwd(act_ideal, [y, w_bf16], name="act_ideal")
    r["compile_s"] = round(time.perf_counter() - t0, 1)
    r["fc2_bias_bf16_ms"] = fwd_bwd(lambda o, p: fc2_bias(o, biases, p, counts), [out, w_bf16], name="fc2_bias_bf16")
    r["fc2_bias_fp32_ms"] = fwd_bwd(lambda o, p: fc2_bias(o, biases, p, counts), [out, w_fp32], name="fc2_bias_fp32")
    r["experts_gemm_ms"] = timed_ms(gemms)
    r["experts_full_ms"] = timed_ms(full)
    if PROFILE:
        DEVICE_MS["experts_gemm"], DEVICE_MS["experts_full"] = device_ms(gemms), device_ms(full)
        r["device_ms"] = dict(DEVICE_MS)
        DEVICE_MS.clear()
    # ideal bytes: each input read and output written once, forward and backward (the gradients of what it saved)
    e = 2.0
    r["act_ideal_bytes"] = e * (n * 2 * FFN + n * FFN) + e * (n * FFN + 2 * n * 2 * FFN)
    r["fc2_bias_ideal_bytes"] = e * 2 * n * HIDDEN + e * 2 * n * HIDDEN
    del y, out, x, a, w1, w2
    if not SMOKE:
        torch.cuda.empty_cache()
    return r


def rope_rows(mbs: int) -> dict:
    q, k = leaf(SEQ, mbs, HEADS, HEAD_DIM), leaf(SEQ, mbs, KV_HEADS, HEAD_DIM)
    freqs = torch.randn(SEQ, 1, 1, HEAD_DIM, device=DEV)

    def q_and_k(fn, name: str):
        def run() -> None:
            probe_common.fresh_grads(q, k)
            oq, ok = fn(q, freqs), fn(k, freqs)
            torch.autograd.backward((oq, ok), (torch.ones_like(oq), torch.ones_like(ok)))
        if PROFILE:
            DEVICE_MS[name] = device_ms(run)
        return timed_ms(run)

    elems = SEQ * mbs * (HEADS + KV_HEADS) * HEAD_DIM
    r = {"mbs": mbs, "tokens": SEQ * mbs, "qk_elements": elems,
         "rope_yarn_unfused_ms": q_and_k(rope_unfused, "rope_yarn_unfused"),
         "rope_ideal_ms": q_and_k(rope_ideal, "rope_ideal"),
         "rope_ideal_bytes": 2.0 * 2 * elems * 2}
    if PROFILE:
        r["device_ms"] = {"rope_yarn_unfused": DEVICE_MS.pop("rope_yarn_unfused"),
                          "rope_ideal": DEVICE_MS.pop("rope_ideal")}
    return r


def main(out_path: str) -> None:
    t0 = time.perf_counter()
    info = {"device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__}
    res = {"info": info, "method": "fwd + bwd through autograd, leaf grads dropped first; CUDA events, median of "
           f"{REPS} after {WARMUP} warm-ups", "shape": {"hidden": HIDDEN, "ffn": FFN, "local_experts": LOCAL_EXPERTS,
                                                         "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM}}
    res["experts"] = [expert_rows(r) for r in ROWS]
    res["rope"] = [rope_rows(m) for m in ((1,) if SMOKE else (1, 4))]
    info["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("--")][0])
