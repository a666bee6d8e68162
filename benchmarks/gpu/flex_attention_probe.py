"""Device probe (runs on a GPU machine, PyTorch only): the attention kernels torchtitan 0.3.0 runs its language
models on, against cuDNN SDPA, forward and forward + backward, bf16, one document per sequence (causal).

torchtitan 0.3.0 builds no SDPA attention for a language model: ``models/common/config_utils.py``
``get_attention_config`` maps ``flex`` to ``FlexAttention``, ``varlen`` to ``VarlenAttention`` and refuses ``sdpa``
("sdpa is no longer supported for language models"); every model's ``model_registry`` defaults to ``flex`` (llama3,
qwen3, deepseek_v3, kimi_k2_7) or ``varlen`` (gpt_oss). Both mask per document (block-causal).

- ``flex``: ``flex_attention`` compiled as ``FlexAttention._compiled_flex_attn`` compiles it
  (``max_autotune`` + ``coordinate_descent_tuning``, models/common/attention.py), with the causal ``BlockMask``
  (block size 128) and ``enable_gqa`` for GQA (``GQAttention``: no KV repeat); also compiled with default
  options (``flex_default``), for reference.
- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2's varlen kernel) with one sequence.
- ``cudnn``: ``F.scaled_dot_product_attention(is_causal=True)`` under ``sdpa_kernel([CUDNN_ATTENTION])`` (KV heads
  expanded): what autoplan priced torchtitan 0.3.0's attention at (``TorchtitanProfile.sdpa_cudnn_first``).

Shapes: ``llama3_8b`` (32 heads, 8 KV heads, head dim 128, seq 8192, batch 1), ``dsv3_16b`` (MLA: q/k head dim
192, v 128, 16 heads, seq 4096, batch 8; cuDNN takes the unequal v head dim) and ``gpt_oss_20b`` (64 heads, 8 KV heads,
head dim 64, seq 8192: its full-attention layers, without the sinks).

Per kernel: median ms (``probe_common.timed_ms``) of the forward and of forward + backward (fresh leaf grads), and
TFLOP/s on causal FLOPs (forward 2·b·h·s²·(d_qk + d_v)/2, forward + backward 3.5x that). A kernel that refuses the
inputs is recorded with its error. Rows are written to OUT as they finish (the compile of the autotuned kernel
takes minutes).

Usage: ``python benchmarks/gpu/flex_attention_probe.py OUT.json [KERNELS [CASES]]`` (comma-separated subsets).
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from probe_common import attention_times, causal_flops, fresh_grads

SHAPES = {
    "llama3_8b": {"b": 1, "h": 32, "kv": 8, "s": 8192, "d_qk": 128, "d_v": 128},
    "dsv3_16b": {"b": 8, "h": 16, "kv": 16, "s": 4096, "d_qk": 192, "d_v": 128},
    "gpt_oss_20b": {"b": 1, "h": 64, "kv": 8, "s": 8192, "d_qk": 64, "d_v": 64},  # full layers; no sinks here
}
TORCHTITAN_FLEX_OPTIONS = {"max_autotune": True, "coordinate_descent_tuning": True, "triton.cudagraphs": False}
WARMUP, REPS = 3, 10


def _causal(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - a FlexAttention mask_mod
    return q_idx >= kv_idx


def kernels(shape: dict) -> dict:
    b, h, kv, s, d_qk, d_v = (shape[k] for k in ("b", "h", "kv", "s", "d_qk", "d_v"))
    mask = create_block_mask(_causal, B=None, H=None, Q_LEN=s, KV_LEN=s, device="cuda")
    flex_tt = torch.compile(flex_attention, options=TORCHTITAN_FLEX_OPTIONS)
    flex_default = torch.compile(flex_attention)
    scale = d_qk ** -0.5
    cu = torch.arange(0, (b + 1) * s, s, device="cuda", dtype=torch.int32)

    def flex(fn):  # noqa: ANN001, ANN202
        return lambda q, k, v: fn(q, k, v, block_mask=mask, scale=scale, enable_gqa=h != kv)

    def cudnn(q, k, v):  # noqa: ANN001, ANN202
        if h != kv:
            k, v = (t.repeat_interleave(h // kv, dim=1) for t in (k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    def varlen(q, k, v):  # noqa: ANN001, ANN202 - (b, h, s, d) -> (b*s, h, d), one sequence per batch row
        import inspect

        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters  # the keywords differ between torch releases
        if h != kv and "enable_gqa" not in params:
            k, v = (t.repeat_interleave(h // kv, dim=1) for t in (k, v))
        qt, kt, vt = (t.transpose(1, 2).reshape(b * s, t.shape[1], t.shape[-1]) for t in (q, k, v))
        kw: dict = {"scale": scale} if "scale" in params else {}
        kw.update({"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True})
        if h != kv and "enable_gqa" in params:
            kw["enable_gqa"] = True
        out = varlen_attn(qt, kt, vt, cu, cu, s, s, **kw)
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(b, s, h, d_v).transpose(1, 2)

    return {"cudnn": cudnn, "varlen": varlen, "flex_default": flex(flex_default), "flex": flex(flex_tt)}


def measure(shape: dict, name: str, fn) -> dict:  # noqa: ANN001
    b, h, kv, s, d_qk, d_v = (shape[k] for k in ("b", "h", "kv", "s", "d_qk", "d_v"))
    q = torch.randn(b, h, s, d_qk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, kv, s, d_qk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, kv, s, d_v, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(b, h, s, d_v, device="cuda", dtype=torch.bfloat16)

    def fwd_bwd() -> None:
        fresh_grads(q, k, v)
        fn(q, k, v).backward(grad)

    row: dict = {"shape": shape, "kernel": name}
    t0 = time.time()
    try:
        fwd_bwd()  # compiles forward and backward
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a kernel refusing the inputs is a result
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        return row
    row["first_call_s"] = round(time.time() - t0, 1)
    fl = causal_flops(b, h, s, d_qk, d_v)
    row.update(attention_times(lambda: fn(q, k, v), fwd_bwd, fl, WARMUP, REPS))
    return row


def ratios(rows: list[dict]) -> dict:
    """Each kernel's time over cuDNN's, per case: forward, backward, forward + backward."""
    by = {(r["case"], r["kernel"]): r for r in rows if "error" not in r}
    out = {}
    for (case, name), r in sorted(by.items()):
        ref = by.get((case, "cudnn"))
        if ref is None or name == "cudnn":
            continue
        for part in ("fwd_ms", "bwd_ms", "fwd_bwd_ms"):
            out[f"{case}.{name}_over_cudnn_time.{part[:-3]}"] = round(r[part] / ref[part], 3)
    return out


def main(out_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(),
              "method": "median of %d after %d warm-up calls (CUDA events, probe_common.timed_ms); fwd_bwd = forward + "
                        "backward with fresh leaf grads; TFLOP/s on causal FLOPs, fwd_bwd counted 3.5x forward; "
                        "flex compiled with torchtitan 0.3.0's FlexAttention inductor options %s" %
                        (REPS, WARMUP, TORCHTITAN_FLEX_OPTIONS),
              "rows": []}
    only_kernels = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None
    only_cases = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    for case, shape in SHAPES.items():
        if only_cases and case not in only_cases:
            continue
        for name, fn in kernels(shape).items():
            if only_kernels and name not in only_kernels:
                continue
            row = measure(shape, name, fn)
            row["case"] = case
            result["rows"].append(row)
            result["ratios"] = ratios(result["rows"])
            print(json.dumps(row), flush=True)
            with open(out_path, "w") as f:
                json.dump(result, f, indent=1)
            torch.cuda.empty_cache()
    print(json.dumps(result["ratios"], indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
