"""Device probe (runs on a GPU machine, PyTorch only): PyTorch SDPA's backends, forward and forward + backward,
causal bf16, at the attention shapes of two held-out torchtitan runs, each backend forced with
``torch.nn.attention.sdpa_kernel([backend])``:

- ``llama3_8b``: Llama 3 8B at seq 8192, local batch 1 (the torchao e2e tables' runs: torchtitan expands the 8 KV
  heads to 32 before SDPA, models/llama3/model/model.py ``repeat_kv``): FLASH (FlashAttention-2, what torchtitan's
  Hopper runs use), CUDNN (its B200 runs, torchtitan >= 3b85aa31f), EFFICIENT. Decides how far FlashAttention-2 sits
  below cuDNN on Hopper at this shape (the catalog prices FA2 at ``FA2_VS_CUDNN`` = 0.62 of the generation's cuDNN
  figure, FA3 paper Fig. 5).
- ``dsv3_16b``: torchtitan's DeepSeek-V3 16B (MLA: q/k head dim 192 = 128 nope + 64 rope, v head dim 128, 16 heads)
  at seq 4096, local batch 8 (tt_dsv3_16b_h100_8gpu_sdpa). FlashAttention-2 refuses v != q/k head dims
  (sdp_utils.cpp ``check_head_dim_size_flash``), so SDPA ran the memory-efficient (CUTLASS) kernel
  (pytorch/torchtitan f738a03bf's message); autoplan priced it as FlashAttention-2 until this probe's H200 run (now:
  gpus.yaml hopper ``attention_efficient_fwd`` / ``_bwd``, op_cost.efficient_sdpa). EFFICIENT as run; CUDNN if it
  accepts the shapes; FLASH with v zero-padded to 192 (the FA2 rate at this shape, for the ratio). Decides whether
  the efficient kernel's cost explains that row's -23%: the ratio efficient / flash(padded) fwd+bwd times the
  attention share of the priced step (r = the flash(padded) rate over the efficient rate, each on its own
  causal FLOPs: ``ratios.dsv3_16b_r_...``). At edef029 the row prices its attention (FA2 rate) at 27 layers x
  (3.4 + 8.6) ms = 0.324 s of 3.752 s (measured 4.887 s): a time ratio r adds 0.324 (r - 1) s, so r >= 3.0
  brings the row within 10%, r = 4.5 matches it, r < 2 leaves it beyond -15% (the kernel is then not the main
  cause). The ratio is taken to carry from the H200 to the 500 W H100 96GB the run used (both Hopper SMs, both
  kernels compute-bound).

Per backend: median ms (``probe_common.timed_ms``) of the forward and of forward + backward (fresh leaf grads),
and TFLOP/s on causal FLOPs (forward 2·b·h·s²·(d_qk + d_v)/2, backward 2.5x forward, as the cost model
counts). A backend that refuses the inputs is recorded with its error. About a minute on an H100/H200.

Usage: ``python benchmarks/gpu/sdpa_backend_probe.py OUT.json``.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from probe_common import attention_times, causal_flops, fresh_grads

SHAPES = {
    "llama3_8b": {"b": 1, "h": 32, "s": 8192, "d_qk": 128, "d_v": 128},
    "dsv3_16b": {"b": 8, "h": 16, "s": 4096, "d_qk": 192, "d_v": 128},
}
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
WARMUP, REPS = 3, 10


def measure(shape: dict, backend: str, pad_v: bool) -> dict:
    b, h, s, d_qk, d_v = (shape[k] for k in ("b", "h", "s", "d_qk", "d_v"))
    dv_run = d_qk if pad_v else d_v
    q = torch.randn(b, h, s, d_qk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, h, s, d_qk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, h, s, dv_run, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(b, h, s, dv_run, device="cuda", dtype=torch.bfloat16)
    scale = d_qk ** -0.5

    def fwd():
        with sdpa_kernel([BACKENDS[backend]]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    def fwd_bwd():
        fresh_grads(q, k, v)
        fwd().backward(grad)

    row = {"shape": shape, "backend": backend, "v_padded_to_qk": pad_v}
    try:
        fwd()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a backend refusing the inputs is a result
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        return row
    fl = causal_flops(b, h, s, d_qk, dv_run)
    row.update(attention_times(fwd, fwd_bwd, fl, WARMUP, REPS))
    return row


def main(out_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(),
              "method": "F.scaled_dot_product_attention(is_causal=True) under sdpa_kernel([backend]); median of "
                        f"{REPS} after {WARMUP} warm-up calls (CUDA events); fwd_bwd = forward + backward with fresh "
                        "leaf grads; TFLOP/s on causal FLOPs, fwd_bwd counted 3.5x forward",
              "rows": []}
    for name, shape in SHAPES.items():
        for backend in BACKENDS:
            row = measure(shape, backend, pad_v=False)
            row["case"] = name
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
        if shape["d_qk"] != shape["d_v"]:
            row = measure(shape, "flash", pad_v=True)
            row["case"] = name
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    by = {(r["case"], r["backend"], r["v_padded_to_qk"]): r for r in result["rows"] if "error" not in r}
    ratios = {}
    ll_f, ll_c = by.get(("llama3_8b", "flash", False)), by.get(("llama3_8b", "cudnn", False))
    if ll_f and ll_c:
        ratios["llama3_8b_flash_over_cudnn_rate_fwd_bwd"] = round(ll_c["fwd_bwd_ms"] / ll_f["fwd_bwd_ms"], 3)
    ds_e, ds_p = by.get(("dsv3_16b", "efficient", False)), by.get(("dsv3_16b", "flash", True))
    if ds_e and ds_p:
        ratios["dsv3_16b_efficient_over_flash_padded_time_fwd_bwd"] = round(ds_e["fwd_bwd_ms"] / ds_p["fwd_bwd_ms"], 3)
        # r of the docstring: each kernel's rate on its own causal FLOPs (the padded flash does 384/320 the work)
        ratios["dsv3_16b_r_flash_padded_over_efficient_rate_fwd_bwd"] = round(
            ds_p["fwd_bwd_tflops"] / ds_e["fwd_bwd_tflops"], 3)
    result["ratios"] = ratios
    print(json.dumps(ratios))
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
