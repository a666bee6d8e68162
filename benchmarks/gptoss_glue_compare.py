"""The cost model's price of GPT-OSS's Megatron-Core BF16 glue on an H200, beside the timings of
``benchmarks/gpu/gptoss_glue_probe.py`` of the same kernels (issue #12: every GPT-OSS-120B Megatron-Bridge row is
predicted 20-50% fast).

The model's side: ``op_cost.op_compute`` on GPT-OSS-120B's MoE layer, tp 1, ep 8, seq 4096, Megatron with the
alltoall dispatcher (bf16 routing probs) at balanced routing, on ``build_cluster("h200", 8)`` (the hopper
generation's efficiencies), for the ops the probe times:

- ``expert_act``'s memory-bound time (fwd + bwd): the fused activation's reads / writes plus
  ``op_traffic.MCORE_EXPERT_CLAMP_BYTES`` (the eager clamp), against the probe's ``act_mcore_ms``;
- ``expert_down_proj``'s memory-bound time: ``MCORE_EXPERT_BIAS_BYTES['bf16']`` (fc2's bias added expert by expert),
  against ``fc2_bias_bf16_ms``;
- ``rotary``: ``MCORE_UNFUSED_ROTARY_BYTES`` (YaRN's unfused RoPE on q and k), against ``rope_yarn_unfused_ms``;
- the routed-expert GEMMs (3x forward), against ``experts_gemm_ms`` (a per-expert loop; TE's GroupedLinear issues
  the same per-expert cuBLAS GEMMs in BF16), and glue in place = ``experts_full_ms - experts_gemm_ms`` against the
  activation + bias prices.

Usage: ``python benchmarks/gptoss_glue_compare.py [PROBE.json]`` (the probe's output; default the stored H200 run,
``benchmarks/data/h200_gptoss_glue_probe_2026_12_04.json``). Prints measured / model per piece, then the HBM rate the
probe's own ``torch.compile``d one-kernel references reach (``act_ideal``, ``rope_ideal`` over their ideal bytes).

What the stored run shows (one H200, torch 2.11): the glue takes 2.3-8x its price (in place, full - GEMMs: 4.3x at
1024 rows per expert, 2.6x at 4096), the expert GEMMs 0.53-0.71x theirs. Read with its limits: the probe
times each call alone (one call between two events: the host's Python / autograd / dynamo-guard time per call is
inside the measurement), and even its compiled references reach only 0.14-0.58 TB/s of the H200's 4.8 (0.58 on 3 GB
at 4096 rows, where issue time alone cannot explain it): neither the model's byte count nor a one-kernel ideal
describes what this glue costs here, and the probe does not separate issue from kernel inefficiency (a profile
would). The cost model prices the glue's bytes only (op_traffic), and the fitted MoE host cost
(ep_comm.host_bound_s) was fitted on models without it: located, not priced."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autoplan.catalog import build_cluster, load_model  # noqa: E402
from cost_models.op_cost import op_compute  # noqa: E402
from cost_models.opgraph import layer_graph  # noqa: E402
from cost_models.quant_layout import op_job  # noqa: E402
from cost_models.specs import JobSpec, ParallelConfig  # noqa: E402
from cost_models.targets import runtime_for  # noqa: E402

SEQ, EP = 4096, 8


def model_prices_ms(rows_per_expert: int, gpu: str = "h200") -> dict[str, float]:
    """The model's fwd + bwd ms of the probe's pieces for one rank of GPT-OSS-120B at tp 1, ep 8, seq 4096 whose
    balanced routing sends ``rows_per_expert`` rows to each of its 16 local experts (mbs = rows x experts / (top-k x
    ep x seq))."""
    model = load_model("gpt-oss-120b")
    mbs, rem = divmod(rows_per_expert * model.num_experts, model.moe_top_k * EP * SEQ)
    if rem or mbs < 1:
        raise ValueError(f"rows_per_expert {rows_per_expert}: not a whole micro-batch of {SEQ} tokens at ep {EP} "
                         f"(multiples of {model.moe_top_k * EP * SEQ // model.num_experts})")
    cluster = build_cluster(gpu, 8)
    job = JobSpec(global_batch_size=mbs * 64, seq_len=SEQ, precision="bf16")
    par = ParallelConfig(tp=1, ep=EP, micro_batch_size=mbs)
    rt = replace(runtime_for("megatron", job, cluster, par), moe_capacity_factor=1.0)
    if not rt.mcore_expert_glue or rt.moe_dispatcher != "alltoall":
        raise ValueError("the megatron target no longer prices Megatron-Core's eager expert glue with alltoall")
    graph = layer_graph(model, "moe", SEQ)
    out = {"act": 0.0, "fc2_bias": 0.0, "rope": 0.0, "expert_gemms": 0.0}
    for op in graph.ops:
        op_j, op_rt = op_job(op, graph, job, rt)
        c = op_compute(op, graph, model, cluster, op_j, par, op_rt)
        mem = (c.mem_f + c.mem_b) * 1e3
        if op.name == "expert_act":
            out["act"] += mem
        elif op.name == "expert_down_proj":
            out["fc2_bias"] += mem
        elif op.name == "rotary":
            out["rope"] += mem
        if op.kind == "experts":
            out["expert_gemms"] += 3e3 * c.gemm_f
    out["mbs"] = mbs
    return out


def rows(probe: dict) -> list[tuple[str, float, float]]:
    """(piece, measured ms, model ms) for every case of the probe."""
    res = []
    for r in probe["experts"]:
        m = model_prices_ms(r["rows_per_expert"])
        tag = f"{r['rows_per_expert']} rows/expert (mbs {m['mbs']})"
        res += [(f"activation, {tag}", r["act_mcore_ms"], m["act"]),
                (f"fc2 bias (bf16 probs), {tag}", r["fc2_bias_bf16_ms"], m["fc2_bias"]),
                (f"expert GEMMs, {tag}", r["experts_gemm_ms"], m["expert_gemms"]),
                (f"glue in place (full - GEMMs), {tag}", r["experts_full_ms"] - r["experts_gemm_ms"],
                 m["act"] + m["fc2_bias"])]
    for r in probe["rope"]:
        m = model_prices_ms(r["mbs"] * SEQ * 4 * EP // 128)
        res.append((f"YaRN RoPE unfused, mbs {r['mbs']}", r["rope_yarn_unfused_ms"], m["rope"]))
    return res


STORED = ROOT / "benchmarks" / "data" / "h200_gptoss_glue_probe_2026_12_04.json"


def reference_rates_tb_s(probe: dict) -> list[tuple[str, float]]:
    """(reference, TB/s) of the probe's compiled one-kernel references: their ideal bytes (each input read and
    output written once, forward and backward) over their measured time."""
    out = [(f"compiled activation, {r['rows_per_expert']} rows/expert", r["act_ideal_bytes"] / r["act_ideal_ms"] / 1e9)
           for r in probe["experts"]]
    return out + [(f"compiled RoPE, mbs {r['mbs']}", r["rope_ideal_bytes"] / r["rope_ideal_ms"] / 1e9)
                  for r in probe["rope"]]


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python benchmarks/gptoss_glue_compare.py [PROBE.json]", file=sys.stderr)
        return 2
    probe = json.loads(Path(argv[0] if argv else STORED).read_text())
    print(f"# {probe['info']['device']}, torch {probe['info']['torch']}; {probe['method']}")
    print(f"{'piece':52s} {'measured ms':>11s} {'model ms':>9s} {'ratio':>6s}")
    for name, meas, model in rows(probe):
        print(f"{name:52s} {meas:11.3f} {model:9.3f} {meas / model:6.2f}")
    print("\nthe probe's compiled one-kernel references (ideal bytes / measured time): "
          + ", ".join(f"{name} {rate:.2f} TB/s" for name, rate in reference_rates_tb_s(probe)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
