"""Kernel measurements on one H200 against the cost model's prices of the same work (issue #12: where the held-out
MoE misses are not).

The measurements were taken with the device probes in ``benchmarks/gpu/`` (PyTorch only, CUDA events) on one
NVIDIA H200 (driver 580.159.04, torch 2.11.0+cu130, cuDNN 9.19.0) on 2026-12-04, the MoE-layer probe twice
(``MOE_RUNS``: the second on a fresh machine), and are stored as they came back. The GEMM grid times 20 launches on
the same operands, so shapes whose operands fit the 60 MB L2 run cache-warm; the expert loops use distinct weights
per expert. Files:
``benchmarks/data/h200_moe_probe_2026_12_04.json`` (``moe_layer_probe.py``: a GEMM grid, the routed experts of
the held-out MoE layouts, an eager MoE block, SDPA attention, HBM copies) and
``benchmarks/data/h200_dense_layer_probe_2026_12_04.json`` (``dense_layer_probe.py``: a Llama decoder layer,
forward + backward, eager and compiled, beside its GEMMs and its attention alone) and
``benchmarks/data/h200_elementwise_probe_2026_12_04.json`` (``elementwise_probe.py``: the layer's memory-bound
ops one at a time, eager and compiled, against the bytes an ideal fused kernel moves), and
``benchmarks/data/h200_sustained_gemm_2026_12_04.json`` (``sustained_gemm_probe.py``: GEMMs held 30 s without
pause, per-second throughput, SM clock, power and temperature).

The prices come from the model itself (``cost_models.gemm.matmul_time_s``, ``cost_models.op_cost.layer_compute``)
on ``build_cluster("h200", 1)``: the ``hopper`` generation's efficiencies, fitted on whole training runs. H200 has
H100's SMs, clocks and 700 W board power, so its GEMM and attention kernels stand for Hopper's; its HBM is faster
(4.8 vs 3.35 TB/s), which moves only memory-bound kernels.

    python benchmarks/h200_probe.py                      # the tables
    python benchmarks/h200_probe.py --heldout-what-if    # + held-out Hopper priced with the kernels' GEMM curve
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autoplan.catalog import build_cluster, load_model  # noqa: E402
from cost_models.attention_cost import ATTN_BWD_FACTOR  # noqa: E402
from cost_models import gemm  # noqa: E402
from cost_models.gemm import matmul_time_s  # noqa: E402
from cost_models.op_cost import layer_compute, op_compute  # noqa: E402
from cost_models.opgraph import layer_graph  # noqa: E402
from cost_models.specs import ClusterSpec, JobSpec, ParallelConfig  # noqa: E402
from cost_models.targets import runtime_for  # noqa: E402
from cost_models.targets.common import Software  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
MOE_PROBE = DATA / "h200_moe_probe_2026_12_04.json"
DENSE_PROBE = DATA / "h200_dense_layer_probe_2026_12_04.json"
ELEMENTWISE_PROBE = DATA / "h200_elementwise_probe_2026_12_04.json"
SUSTAINED_PROBE = DATA / "h200_sustained_gemm_2026_12_04.json"
# The MoE-layer probe run again on another machine of the kind the same day (``_run2``): run-to-run spread
MOE_RUNS = [MOE_PROBE, MOE_PROBE.with_name(MOE_PROBE.stem + "_run2.json")]
# FlashAttention's backward does 2.5x its forward's FLOPs (Dao 2023, §3.2; cost_models.attention_cost.ATTN_BWD_FACTOR)
ATTN_FWD_BWD_FLOPS = 1.0 + ATTN_BWD_FACTOR


def probe_cluster() -> ClusterSpec:
    return build_cluster("h200", 1)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


@dataclass(frozen=True)
class GemmPoint:
    m: int
    k: int
    n: int
    measured_s: float  # mean of fprop, dgrad and wgrad: the model prices each as the forward shape
    model_s: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


def gemm_points(probe: dict, cluster: ClusterSpec) -> list[GemmPoint]:
    return [GemmPoint(r["m"], r["k"], r["n"], (r["fprop_ms"] + r["dgrad_ms"] + r["wgrad_ms"]) / 3e3,
                      matmul_time_s(r["m"], r["k"], r["n"], cluster)) for r in probe["gemm"]]


def abs_errors(pred: list[float], meas: list[float]) -> np.ndarray:
    return np.abs(np.asarray(pred) / np.asarray(meas) - 1.0)


def _fit_gemm_curve(points: list[GemmPoint], cluster: ClusterSpec,
                    efficiency: Callable[[np.ndarray, GemmPoint], float], start: list[float],
                    bounds: tuple[list[float], list[float]]) -> tuple[np.ndarray, float, float]:
    """Least squares on log time of ``F / (peak · efficiency(p, shape))`` under the HBM roofline (operands and
    result cross HBM once): (the fitted p, MAPE, worst)."""
    peak, bw = cluster.gpu.peak_bf16_tflops * 1e12, cluster.gpu.hbm_tbytes_per_s * 1e12

    def pred(p: np.ndarray, pt: GemmPoint) -> float:
        return max(pt.flops / (peak * efficiency(p, pt)), 2.0 * (pt.m * pt.k + pt.k * pt.n + pt.m * pt.n) / bw)

    sol = least_squares(lambda p: [np.log(pred(p, pt) / pt.measured_s) for pt in points], start, bounds=bounds)
    err = abs_errors([pred(sol.x, pt) for pt in points], [pt.measured_s for pt in points])
    return sol.x, float(err.mean()), float(err.max())


def fit_flop_saturation(points: list[GemmPoint], cluster: ClusterSpec) -> tuple[float, float, float, float]:
    """``t = (F + F½) / (peak · g)``, the efficiency ``g · F/(F + F½)``: a fixed ramp of ``F½`` FLOPs' worth per GEMM
    (prologue, tail wave, epilogue) and a plateau ``g``. Returns (g, F½, MAPE, worst)."""
    p, mape, worst = _fit_gemm_curve(points, cluster, lambda p, pt: p[0] * pt.flops / (pt.flops + p[1] * 1e9),
                                     [0.7, 10.0], ([0.3, 0.0], [1.0, 1e3]))
    return float(p[0]), float(p[1]) * 1e9, mape, worst


def fit_dim_product(points: list[GemmPoint], cluster: ClusterSpec) -> tuple[float, float, float, float]:
    """The catalog's own form, ``peak · gemm_max · Π x/(x + x½)``, refitted on the kernels (gemm_max bounded to 1).
    Returns (gemm_max, x½, MAPE, worst)."""
    p, mape, worst = _fit_gemm_curve(
        points, cluster, lambda p, pt: p[0] * float(np.prod([x / (x + p[1]) for x in (pt.m, pt.k, pt.n)])),
        [0.8, 300.0], ([0.3, 1.0], [1.0, 3000.0]))
    return float(p[0]), float(p[1]), mape, worst


# The layout each probe expert case stands for: (model, tp, ep, micro-batch size, sequence length), sequence parallel
# with tp > 1, bf16, Megatron. Its routed rows per local expert, tokens / tp · top-k · ep / experts, are the probe's
# rows (checked in ``expert_rows``). Two cases timed twice the rows their label's layout routes (16 x 8192 for
# Qwen3-30B ep 8 mbs 2, 2 x 8192 for Maverick ep 64 mbs 1): they stand for mbs 4 and mbs 2.
EXPERT_LAYOUTS: dict[str, tuple[str, int, int, int, int]] = {
    "gpt-oss-120b tp2 ep16 (card h100 64gpu)": ("gpt-oss-120b", 2, 16, 1, 4096),
    "gpt-oss-120b tp1 ep8 (mb26.02 h100 64gpu)": ("gpt-oss-120b", 1, 8, 1, 4096),
    "gpt-oss-20b tp2 ep4 (card h100 16gpu)": ("gpt-oss-20b", 2, 4, 1, 4096),
    "qwen3-30b-a3b tp1 ep16 mbs1 (card h100 16gpu)": ("qwen3-30b-a3b", 1, 16, 1, 4096),
    "qwen3-30b-a3b tp1 ep8 mbs2 (mb2511 h100 16gpu)": ("qwen3-30b-a3b", 1, 8, 4, 4096),
    "llama4-maverick tp1 ep64 (gb200 128gpu)": ("llama4-maverick-17b-128e", 1, 64, 2, 8192),
}


def expert_model_s(case: str, cluster: ClusterSpec, balanced: bool) -> tuple[float, float]:
    """(model seconds, routed rows per local expert) of one rank's routed experts, forward + backward, as
    ``op_cost.op_compute`` prices the layer's expert ops (GEMMs 3x forward) for the case's layout on Megatron:
    with the layout's load imbalance and router padding, or at ``balanced`` routing (capacity factor 1: rho = 1,
    as the probe routes)."""
    name, tp, ep, mbs, seq = EXPERT_LAYOUTS[case]
    model = load_model(name)
    job = JobSpec(global_batch_size=mbs * 64, seq_len=seq, precision="bf16")
    par = ParallelConfig(tp=tp, ep=ep, micro_batch_size=mbs, sequence_parallel=tp > 1)
    rt = runtime_for("megatron", job, cluster, par)
    if balanced:
        rt = replace(rt, moe_capacity_factor=1.0)
    graph = layer_graph(model, "moe", seq)
    gemm_f = sum(op_compute(op, graph, model, cluster, job, par, rt).gemm_f for op in graph.ops if op.kind == "experts")
    rows = mbs * seq / (tp if tp > 1 else 1) * model.moe_top_k * ep / model.num_experts
    return 3.0 * gemm_f, rows


def expert_rows(probe: dict, cluster: ClusterSpec) -> list[tuple[str, float, float, float, float]]:
    """(case, measured per-expert loop fwd+bwd s, measured torch._grouped_mm fwd+bwd s, model s at balanced routing,
    model s as it prices the run). Raises where a case's layout does not route the rows the probe timed."""
    out = []
    for r in probe["experts"]:
        balanced, rows = expert_model_s(r["case"], cluster, balanced=True)
        if rows != r["rows"]:
            raise ValueError(f"{r['case']}: its layout routes {rows:g} rows per expert, the probe timed {r['rows']}")
        priced, _ = expert_model_s(r["case"], cluster, balanced=False)
        out.append((r["case"], (r["loop_fwd_ms"] + r["loop_bwd_ms"]) / 1e3,
                    r.get("grouped_fwd_bwd_ms", float("nan")) / 1e3, balanced, priced))
    return out


def attention_rows(probe: dict) -> list[tuple[str, int, float, float]]:
    """(case, head dim, cuDNN fwd+bwd TFLOP/s on causal FLOPs, flash fwd+bwd TFLOP/s)."""
    out = []
    for r in probe["attention"]:
        work = ATTN_FWD_BWD_FLOPS * r["causal_fwd_flops"]
        out.append((r["case"], r["head_dim"], work / r["cudnn_fwd_bwd_ms"] / 1e9, work / r["flash_fwd_bwd_ms"] / 1e9))
    return out


def head_dim_ratio(probe: dict) -> float:
    """cuDNN fwd+bwd rate at head dim 64 over head dim 128 at equal causal FLOPs and sequence (the gpt-oss d64 tp1
    and qwen3-30b d128 cases: 64 x 64 and 32 x 128 heads, 4096 tokens)."""
    rates = {(r[1], c): r[2] for c, r in ((r[0], r) for r in attention_rows(probe))}
    return rates[(64, "gpt-oss d64 tp1")] / rates[(128, "qwen3-30b d128 tp1")]


@dataclass(frozen=True)
class LayerSplit:
    gemm_s: float
    attention_s: float
    other_s: float  # memory-bound kernels (model) / the rest of the measured layer

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.other_s


def dense_measured(row: dict, compiled: bool) -> LayerSplit:
    total = row["compiled_fwd_bwd_ms" if compiled else "eager_fwd_bwd_ms"] / 1e3
    gemm, attn = row["gemms_fwd_bwd_ms"] / 1e3, row["attention_fwd_bwd_ms"] / 1e3
    return LayerSplit(gemm, attn, total - gemm - attn)


def dense_model(cluster: ClusterSpec, compiled: bool) -> LayerSplit:
    """llama3-8b's decoder layer, 8192 tokens, one rank, as ``layer_compute`` prices it for torchtitan (eager or
    ``compile``): GEMMs 3× forward, the attention core forward + backward, the memory-bound kernels."""
    model = load_model("llama3-8b")
    job = JobSpec(global_batch_size=1, seq_len=8192, precision="bf16")
    par = ParallelConfig(tp=1, micro_batch_size=1, zero_stage=3)
    rt = runtime_for("torchtitan", job, cluster, par, Software(compile=compiled))
    oc = layer_compute(layer_graph(model, "dense", job.seq_len), model, cluster, job, par, rt)
    return LayerSplit(3.0 * oc.gemm_f, oc.attn_f + oc.attn_b, oc.mem_f + oc.mem_b)


def elementwise_rows(probe: dict, cluster: ClusterSpec) -> list[tuple[str, float, float, float]]:
    """(op, ideal GB, eager share, compiled share): the ideal fused kernel's bytes over the measured time, as a share
    of the datasheet HBM bandwidth (one forward + backward through autograd, launch gaps included)."""
    bw = cluster.gpu.hbm_tbytes_per_s * 1e12
    return [(r["case"], r["ideal_bytes"] / 1e9, r["ideal_bytes"] / (r["eager_ms"] / 1e3) / bw,
             r["ideal_bytes"] / (r["compiled_ms"] / 1e3) / bw if "compiled_ms" in r else float("nan"))
            for r in probe["ops"]]


def sustained_rows(probe: dict) -> list[tuple[tuple[int, int, int], float, float, float, str, str]]:
    """(shape, first-window TFLOP/s, last-window TFLOP/s, min/max over windows, first smi, last smi)."""
    out = []
    for sh in probe["shapes"]:
        tf = [w["tflops"] for w in sh["windows"]]
        out.append(((sh["m"], sh["k"], sh["n"]), tf[0], tf[-1], min(tf) / max(tf), sh["windows"][0]["smi"],
                    sh["windows"][-1]["smi"]))
    return out


@contextmanager
def kernel_gemm_curve(plateau: float, half_flops: float) -> Iterator[None]:
    """Diagnostic only, never the catalog: within the block, the ``hopper`` generation's GEMMs take the kernels'
    work-saturation curve ``plateau · F/(F + half_flops)`` in place of the fitted per-dim curve
    (``cost_models.gemm.gemm_efficiency``); other generations and every other price stay as they are."""
    fitted = gemm.gemm_efficiency

    def kernel(m: float, k: float, n: float, cluster: ClusterSpec) -> float:
        if cluster.gpu.generation != "hopper":
            return fitted(m, k, n, cluster)
        work = 2.0 * m * k * n
        return plateau * work / (work + half_flops)

    gemm.gemm_efficiency = kernel  # type: ignore[assignment]
    try:
        yield
    finally:
        gemm.gemm_efficiency = fitted  # type: ignore[assignment]


def heldout_hopper_mape(plateaus: list[float], half_flops: float) -> list[tuple[str, int, float, float]]:
    """(label, n, MAPE, mean signed) of the held-out Hopper rows (``benchmarks/heldout.py``) with the fitted curve,
    then with the kernel curve at each plateau (``kernel_gemm_curve``), nothing refitted."""
    import heldout  # benchmarks/ is this script's sys.path[0]; heldout imports fidelity by name the same way

    def hopper(rows: list) -> tuple[int, float, float]:
        row = next(r for r in heldout.summarize(rows, "generation") if r[0] == "hopper")
        return row[1], row[2], row[3]

    out = [("fitted curve (catalog)", *hopper(heldout.evaluate()[0]))]
    for g in plateaus:
        with kernel_gemm_curve(g, half_flops):
            out.append((f"kernel curve, plateau {g:.3f}", *hopper(heldout.evaluate()[0])))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heldout-what-if", action="store_true",
                    help="also price the held-out runs with the kernels' GEMM curve on Hopper (diagnostic, ~1 min)")
    args = ap.parse_args(argv)
    cluster = probe_cluster()
    moe, dense = load(MOE_PROBE), load(DENSE_PROBE)
    info = moe["info"]
    print(f"# {info['device']}, torch {info['torch']}, cuDNN {info['cudnn']}; {moe['method']}")
    print(f"model: build_cluster('h200', 1), hopper efficiencies: gemm_max {cluster.efficiency.gemm_max}, "
          f"gemm_half_dim {cluster.efficiency.gemm_half_dim}, attention {cluster.efficiency.attention}\n")

    points = gemm_points(moe, cluster)
    print("## GEMMs (bf16; measured = mean of fprop, dgrad, wgrad; 20 back-to-back launches per sample)\n")
    print("| m | k | n | measured TFLOP/s | model TFLOP/s | model / measured time |")
    print("|---:|---:|---:|---:|---:|---:|")
    for p in points:
        print(f"| {p.m} | {p.k} | {p.n} | {p.flops / p.measured_s / 1e12:.0f} | {p.flops / p.model_s / 1e12:.0f} "
              f"| {p.model_s / p.measured_s:.2f} |")
    err = abs_errors([p.model_s for p in points], [p.measured_s for p in points])
    signed = np.mean([p.model_s / p.measured_s - 1 for p in points])
    g, fh, f_mape, f_worst = fit_flop_saturation(points, cluster)
    gm, xh, d_mape, d_worst = fit_dim_product(points, cluster)
    print(f"\ncatalog curve vs the {len(points)} kernels: MAPE {err.mean():.1%}, mean signed {signed:+.1%}, "
          f"worst {err.max():.1%}")
    print(f"the same per-dim form refitted on them: gemm_max {gm:.3f}, half-dim {xh:.0f}: MAPE {d_mape:.1%}, "
          f"worst {d_worst:.1%}")
    print(f"work saturation t = (F + F½)/(peak·g): g {g:.3f} ({g * cluster.gpu.peak_bf16_tflops:.0f} TFLOP/s), "
          f"F½ {fh / 1e9:.2f} GFLOP ({fh / (g * cluster.gpu.peak_bf16_tflops * 1e12) * 1e6:.1f} µs per GEMM): "
          f"MAPE {f_mape:.1%}, worst {f_worst:.1%}\n")

    print("## Routed experts of the held-out layouts (one rank, bf16, forward + backward)\n")
    print("model: op_cost.op_compute on the layer's expert ops (gate, up, down) at the layout, balanced (rho = 1, as the "
          "probe routes) and as priced for the run (its load imbalance and router padding)\n")
    print("| case (the probe's label) | layout priced | measured loop ms | measured grouped_mm ms | model ms, balanced | "
          "model / loop | model ms, as priced |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for case, loop, grouped, balanced, priced in expert_rows(moe, cluster):
        _, tp, ep, mbs, seq = EXPERT_LAYOUTS[case]
        print(f"| {case} | tp{tp} ep{ep} mbs{mbs} s{seq} | {loop * 1e3:.2f} | {grouped * 1e3:.2f} | "
              f"{balanced * 1e3:.2f} | {balanced / loop:.2f} | {priced * 1e3:.2f} |")

    print("\n## Eager MoE block without its all-to-alls (router, top-k, sort, gather, grouped GEMMs, SwiGLU, "
          "scale, scatter; fwd+bwd)\n")
    print("| case | block ms | its grouped GEMMs ms | rest / GEMMs |")
    print("|---|---:|---:|---:|")
    for r in moe["moe_block"]:
        rest = r["block_fwd_bwd_ms"] - r["gemm_only_ms"]
        print(f"| {r['case']} | {r['block_fwd_bwd_ms']:.2f} | {r['gemm_only_ms']:.2f} | {rest / r['gemm_only_ms']:.2f} |")

    print("\n## Attention core (SDPA, causal, GQA; fwd+bwd TFLOP/s on causal FLOPs, backward 2.5x forward)\n")
    print("| case | head dim | cuDNN | flash (FA2) |")
    print("|---|---:|---:|---:|")
    for case, d, cudnn, flash in attention_rows(moe):
        print(f"| {case} | {d} | {cudnn:.0f} | {flash:.0f} |")
    print(f"\ncuDNN head dim 64 / 128 at equal FLOPs: {head_dim_ratio(moe):.3f} (catalog hopper attention_d64 "
          f"{cluster.efficiency.attention_d64}); catalog hopper `attention` {cluster.efficiency.attention} = "
          f"{cluster.efficiency.attention * cluster.gpu.peak_bf16_tflops:.0f} TFLOP/s\n")

    print("## llama3-8b decoder layer, 8192 tokens, one H200 (forward + backward, ms)\n")
    print("| | GEMMs | attention | the rest | layer |")
    print("|---|---:|---:|---:|---:|")
    for compiled in (False, True):
        label = "compiled" if compiled else "eager"
        meas = dense_measured(dense["layers"][0], compiled)
        mod = dense_model(cluster, compiled)
        print(f"| measured, {label} | {meas.gemm_s * 1e3:.2f} | {meas.attention_s * 1e3:.2f} | "
              f"{meas.other_s * 1e3:.2f} | {meas.total_s * 1e3:.2f} |")
        print(f"| model, torchtitan {label} | {mod.gemm_s * 1e3:.2f} | {mod.attention_s * 1e3:.2f} | "
              f"{mod.other_s * 1e3:.2f} | {mod.total_s * 1e3:.2f} |")
    print("\n## Memory-bound ops, llama3-8b shapes, 8192 tokens (fwd+bwd; ideal fused bytes / time, share of "
          f"{cluster.gpu.hbm_tbytes_per_s} TB/s)\n")
    print("| op | ideal GB | eager | compiled |")
    print("|---|---:|---:|---:|")
    for op, gb, eager, comp in elementwise_rows(load(ELEMENTWISE_PROBE), cluster):
        print(f"| {op} | {gb:.3f} | {eager:.3f} | {comp:.3f} |")
    print("\n## Run to run (the same probes on a second machine, the same day)\n")
    print("| run | catalog GEMM MAPE | work fit g / F½ GFLOP / MAPE | experts model / loop | d64 / d128 |")
    print("|---|---:|---:|---|---:|")
    for i, mp in enumerate(MOE_RUNS, 1):
        run = load(mp)
        pts = gemm_points(run, cluster)
        cat = abs_errors([p.model_s for p in pts], [p.measured_s for p in pts]).mean()
        g_i, fh_i, m_i, _ = fit_flop_saturation(pts, cluster)
        ratios = ", ".join(f"{m / loop:.2f}" for _, loop, _, m, _ in expert_rows(run, cluster))
        print(f"| {i} | {cat:.1%} | {g_i:.3f} / {fh_i / 1e9:.2f} / {m_i:.1%} | {ratios} | {head_dim_ratio(run):.3f} |")
    print("\n## Sustained GEMMs (30 s without pause; nvidia-smi SM MHz, W, C after the first and last window)\n")
    print("| m, k, n | first TFLOP/s | last TFLOP/s | min / max | first | last |")
    print("|---|---:|---:|---:|---|---|")
    for shape, first, last, spread, s0, s1 in sustained_rows(load(SUSTAINED_PROBE)):
        print(f"| {shape} | {first:.0f} | {last:.0f} | {spread:.3f} | {s0} | {s1} |")
    r70 = dense["layers"][1]
    print(f"\n{r70['case']}: eager {r70['eager_fwd_bwd_ms']:.2f} ms, compiled {r70['compiled_fwd_bwd_ms']:.2f}, "
          f"GEMMs {r70['gemms_fwd_bwd_ms']:.2f}, attention {r70['attention_fwd_bwd_ms']:.2f}")
    copy = next(r for r in moe["memory"] if r["case"].startswith("copy"))
    print(f"HBM copy: {copy['bytes'] / copy['ms'] / 1e9:.2f} TB/s = "
          f"{copy['bytes'] / copy['ms'] / 1e9 / cluster.gpu.hbm_tbytes_per_s:.3f} of the datasheet "
          f"(catalog hbm_bus {cluster.efficiency.hbm_bus})")
    if args.heldout_what_if:
        print(f"\n## What-if (diagnostic, not the catalog): held-out Hopper rows with the kernels' GEMM curve, F½ "
              f"{fh / 1e9:.2f} GFLOP (run 1), nothing refitted\n")
        print("| GEMM curve | Hopper rows | MAPE | mean signed |")
        print("|---|---:|---:|---:|")
        for label, n, mape, signed in heldout_hopper_mape([0.56, 0.60, 0.64, round(g, 3)], fh):
            print(f"| {label} | {n} | {mape:.1%} | {signed:+.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
