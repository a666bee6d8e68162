"""Routed-expert GEMMs as the catalog prices them against NVIDIA's measured fused-MoE kernels, per GPU.

ai-dynamo/aiconfigurator's ``moe_perf.parquet`` tables time TensorRT-LLM's fused MoE layer (permute, fc1, gated
activation, fc2, unpermute) per system, dtype, token count and expert layout. For each catalog MoE model whose shape
the tables hold (hidden, expert FFN, experts, top-k) in bf16 or per-tensor fp8 (DeepSeek-V3's and GPT-OSS's are
timed in fp8_block / MXFP4 only: "-"), at balanced routing and expert-TP 1 on the smallest EP group they have, this
prints the measured time over the model's price of the same local experts' GEMMs (``cost_models.gemm.matmul_time_s``
per local expert: fc1 hidden -> 2 x FFN, fc2 FFN -> hidden, T·k/E rows each; forward only, no permute): > 1 where the
catalog prices the experts fast. An inference kernel, not Megatron's TE grouped GEMM, so the level means little; what
the GPUs' ratios say against each other (one harness on every GPU) is the diagnostic. Nothing is fitted from it.

    python benchmarks/aic_moe.py --aic aiconfigurator [--version trtllm/1.3.0rc20]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.aic_gemm import DATA, DTYPES, checkout_args  # noqa: E402

GPUS = {"h100-sxm": "h100_sxm", "b200": "b200_sxm", "gb200": "gb200", "gb300": "gb300"}
MODELS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b", "mixtral-8x7b")
TOKENS = (4096, 16384)


def priced_s(model, cluster, tokens: int, dtype: str, ep: int) -> float:  # type: ignore[no-untyped-def]
    """The catalog's time of one EP rank's expert GEMMs, its ``num_experts / ep`` experts each taking ``tokens`` x
    top-k / experts rows (balanced)."""
    from cost_models.gemm import matmul_time_s

    h, ffn = model.hidden_size, model.moe_ffn_hidden_size or model.ffn_hidden_size
    rows = tokens * model.moe_top_k / model.num_experts
    return model.num_experts // ep * (matmul_time_s(rows, h, 2 * ffn, cluster, dtype)
                                + matmul_time_s(rows, ffn, h, cluster, dtype))


def main(argv: list[str] | None = None) -> int:
    from autoplan.catalog import build_cluster, load_model

    tree, version = checkout_args(__doc__, "trtllm/1.3.0rc20", "framework/version directory of the MoE tables", argv)
    tables = {}
    for gpu, system in GPUS.items():
        t = tree.read_optional(f"{DATA}/{system}/moe/{version}/moe_perf.parquet")
        if t is None:
            continue
        tables[gpu] = t[(t.distribution == "balanced") & (t.moe_tp_size == 1)]
    print("measured fused MoE / priced expert GEMMs (balanced routing, smallest EP, forward); columns: "
          + ", ".join(f"{g} {d} T={n}" for g in tables for d in DTYPES for n in TOKENS))
    for name in MODELS:
        model = load_model(name)
        ffn = model.moe_ffn_hidden_size or model.ffn_hidden_size
        cells, eps = [], set()
        for gpu, t in tables.items():
            cluster = build_cluster(gpu, 8)
            shape = t[(t.hidden_size == model.hidden_size) & (t.inter_size == ffn)
                      & (t.num_experts == model.num_experts) & (t.topk == model.moe_top_k)]
            for dtype, label in DTYPES.items():
                for tokens in TOKENS:
                    rows = shape[(shape.moe_dtype == label) & (shape.num_tokens == tokens)]
                    if not len(rows):
                        cells.append("    -")
                        continue
                    ep = int(rows.moe_ep_size.min())
                    ms = rows[rows.moe_ep_size == ep].latency.min()
                    cells.append(f"{ms * 1e-3 / priced_s(model, cluster, tokens, dtype, ep):5.2f}")
                    eps.add(ep)
        print(f"{name:16s} " + " ".join(cells) + f"   ep {sorted(eps)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
