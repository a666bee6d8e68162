"""The catalog's NVLink collectives against NCCL's, measured by NVIDIA's aiconfigurator collectors.

ai-dynamo/aiconfigurator ships nccl-tests-style tables per system
(``aic-core/src/aiconfigurator_core/systems/data/<system>/comm/nccl/<version>/nccl_perf.parquet``: op, GPUs in one
node (2/4/8; GB200/GB300 2/4), message size in fp16 elements, latency in ms). This script prints, for each GPU and op,
the measured time over ``cost_models.collectives.group_collective_time_s`` (the α-β ring: (n−1)·α per step +
bytes / bus bandwidth) at a few sizes, and a least-squares fit of a per-collective base α0 plus a per-step α1 to the
latency-bound sizes (<= 512 KiB) under the catalog's bandwidth: the catalog's form is α0 = 0, α1 = link_latency_us.
A diagnostic: nothing is fitted into the catalog from it.

    python benchmarks/aic_nccl.py --aic aiconfigurator [--version 2.29.2]   # a work tree or a bare git directory
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.aic_gemm import DATA, Tree, checkout_args  # noqa: E402

SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "b300": "b300_sxm", "gb200": "gb200",
           "gb300": "gb300"}
OPS = {"all_gather": "all_gather", "reduce_scatter": "reduce_scatter", "all_reduce": "all_reduce",
       "alltoall": "all_to_all"}
SIZES_MIB = (0.125, 2.0, 32.0, 512.0)
LATENCY_BOUND_BYTES = 512 * 1024


def read(tree: Tree, system: str, version: str):  # type: ignore[no-untyped-def]
    """The system's fp16 rows of one NCCL version's table (None where it has none)."""
    table = tree.read_optional(f"{DATA}/{system}/comm/nccl/{version}/nccl_perf.parquet")
    return None if table is None else table[table.nccl_dtype == "half"]


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    from autoplan.catalog import build_cluster
    from cost_models.collectives import group_collective_time_s, place_group

    tree, version = checkout_args(__doc__, "2.29.2", "NCCL version directory (every system has 2.29.2)", argv)
    print("measured / priced time at " + ", ".join(f"{s:g} MiB" for s in SIZES_MIB)
          + f"; alpha0 + steps x alpha1 fitted on <= {LATENCY_BOUND_BYTES // 1024} KiB (us)")
    for gpu, system in SYSTEMS.items():
        table = read(tree, system, version)
        if table is None:
            continue
        cluster = build_cluster(gpu, 8)
        for op, kind in OPS.items():
            rows, fit_a, fit_y = [], [], []
            for n, by_n in table[table.op_name == op].groupby("num_gpus"):
                n = int(n)
                if place_group(n, 1, cluster).crosses_domain:
                    continue
                x = by_n.groupby("message_size").latency.min()
                steps = (2 if kind == "all_reduce" else 1) * (n - 1)
                for elems, ms in x.items():
                    payload = 2.0 * float(elems)
                    if payload <= LATENCY_BOUND_BYTES:  # the time left after the catalog's bandwidth term
                        alpha_s = steps * cluster.gpu.link_latency_us * 1e-6
                        bw_s = group_collective_time_s(kind, payload, n, 1, cluster) - alpha_s
                        fit_a.append([1.0, steps])
                        fit_y.append(ms * 1e-3 - bw_s)
                ratios = []
                for mib in SIZES_MIB:
                    elems = int(mib * 2**20 / 2)
                    ratios.append(x.loc[elems] * 1e-3 / group_collective_time_s(kind, 2.0 * elems, n, 1, cluster)
                                  if elems in x.index else float("nan"))
                rows.append(f"n={n} " + " ".join(f"{r:5.2f}" for r in ratios))
            if not rows:
                continue
            (a0, a1), *_ = np.linalg.lstsq(np.array(fit_a), np.array(fit_y), rcond=None)
            print(f"{gpu:9s} {op:14s} {' | '.join(rows)}   alpha0 {a0 * 1e6:5.2f} alpha1 {a1 * 1e6:4.2f} "
                  f"(catalog 0, {cluster.gpu.link_latency_us:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
