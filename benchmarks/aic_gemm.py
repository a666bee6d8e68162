"""Blackwell GPUs' GEMM throughput against B200's, from NVIDIA's own same-harness measurements.

ai-dynamo/aiconfigurator ships measured GEMM tables per system and inference framework version
(``aic-core/src/aiconfigurator_core/systems/data/<system>/gemm/<framework>/<version>/gemm_perf.parquet``: one row per
kernel source, dtype and (m, n, k), its latency in ms). B200, GB200, B300 and GB300 were measured by the same
collectors, so each (framework, version) is one harness run on several GPUs. This script makes
``benchmarks/gpu_facts.py``'s ``AIC_GEMM_VS_B200`` from them: for each GPU, harness and dtype (bf16, per-tensor fp8),
the geometric mean over the shapes both tables hold with every dim >= ``gpu_facts.PLATEAU_DIM`` of B200's latency
over the GPU's (the fastest row per shape and kernel source). A table whose ``device`` column names another GPU is
skipped (b300_sxm's sglang 0.5.14 table is GB300's).

    git clone https://github.com/ai-dynamo/aiconfigurator && git -C aiconfigurator checkout 095f58a51c4c
    python benchmarks/aic_gemm.py --aic aiconfigurator          # a work tree, or a bare git directory (read at HEAD)
    python benchmarks/aic_gemm.py --aic aiconfigurator --vs-model   # + each GPU's measured / priced GEMM time

``--vs-model`` also holds every table (Hopper's too) against the catalog's GEMM curve (cost_models.gemm.matmul_time_s):
the median over harnesses of the geometric-mean measured / priced time per GPU and dtype (> 1: priced fast). It
compares generations, which the B200-relative table cannot: the Blackwell curve is Hopper's in-training fit carried
over, and the tables say how far each generation's training runs sit from its micro-benchmarks.

Needs pandas with a parquet engine (pyarrow); not a dependency of autoplan: only this script reads the tables.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu_facts import AIC_GEMM_VS_B200, PLATEAU_DIM, aic_gemm_ratio  # noqa: E402

DATA = "aic-core/src/aiconfigurator_core/systems/data"
SYSTEMS = {"b200": ("b200_sxm", "NVIDIA B200"), "gb200": ("gb200", "NVIDIA GB200"),
           "b300": ("b300_sxm", "NVIDIA B300 SXM6 AC"), "gb300": ("gb300", "NVIDIA GB300")}
HOPPER = {"h100-sxm": ("h100_sxm", "NVIDIA H100 80GB HBM3"), "h200": ("h200_sxm", "NVIDIA H200")}
DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}


class Tree:
    """Files of an aiconfigurator checkout: a work tree, or a bare git directory read at HEAD."""

    def __init__(self, path: Path) -> None:
        self.path, self.bare = path, not (path / "aic-core").is_dir()

    def tables(self, system: str) -> list[str]:
        """Harnesses ('framework/version') with a GEMM table for ``system``."""
        if self.bare:
            out = subprocess.run(["git", "--git-dir", str(self.path), "ls-tree", "-r", "--name-only", "HEAD",
                                  f"{DATA}/{system}/gemm"], check=True, capture_output=True, text=True).stdout
            names = [n for n in out.split() if n.endswith("/gemm_perf.parquet")]
        else:
            found = (self.path / DATA / system / "gemm").glob("*/*/gemm_perf.parquet")
            names = [str(p.relative_to(self.path)) for p in found]
        return sorted("/".join(n.split("/")[-3:-1]) for n in names)

    def read(self, system: str, harness: str) -> Any:
        """``system``'s GEMM table of one harness."""
        return self.read_file(f"{DATA}/{system}/gemm/{harness}/gemm_perf.parquet")

    def read_optional(self, rel: str) -> Any:
        """``read_file``, or None where the checkout has no such table."""
        try:
            return self.read_file(rel)
        except FileNotFoundError:
            return None

    def read_file(self, rel: str) -> Any:
        """The parquet table at ``rel`` (FileNotFoundError where the checkout has none)."""
        import pandas as pd

        if self.bare:
            found = subprocess.run(["git", "--git-dir", str(self.path), "show", f"HEAD:{rel}"], capture_output=True)
            if found.returncode:
                raise FileNotFoundError(rel)
            return pd.read_parquet(io.BytesIO(found.stdout))
        return pd.read_parquet(self.path / rel)


def checkout_args(doc: str, version: str, version_help: str, argv: list[str] | None) -> tuple[Tree, str]:
    """The aiconfigurator checkout (``--aic``, required) and table version (``--version``) the table scripts take."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--aic", type=Path, required=True, help="an ai-dynamo/aiconfigurator checkout")
    ap.add_argument("--version", default=version, help=version_help)
    args = ap.parse_args(argv)
    return Tree(args.aic), args.version


def plateau(table: Any, dtype: str) -> Any:
    """Fastest latency per (kernel source, m, n, k) of ``dtype`` with every dim >= PLATEAU_DIM."""
    t = table[(table.gemm_dtype == DTYPES[dtype]) & (table.m >= PLATEAU_DIM) & (table.n >= PLATEAU_DIM)
              & (table.k >= PLATEAU_DIM)]
    return t.groupby(["kernel_source", "m", "n", "k"]).latency.min()


def own_tables(tree: Tree, systems: dict[str, tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """(GPU, harness) -> its GEMM table, the tables whose rows were measured on that GPU."""
    own = {}
    for gpu, (system, device) in systems.items():
        for harness in tree.tables(system):
            table = tree.read(system, harness)
            if set(table.device.unique()) == {device}:
                own[(gpu, harness)] = table
    return own


def measure(tree: Tree, own: dict[tuple[str, str], Any] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """``AIC_GEMM_VS_B200`` recomputed: GPU -> dtype -> harness -> B200 latency / the GPU's (geometric mean)."""
    import numpy as np

    own = own if own is not None else own_tables(tree, SYSTEMS)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for gpu in ("gb200", "b300", "gb300"):
        for dtype in DTYPES:
            for (g, harness), table in sorted(own.items()):
                if g != gpu or ("b200", harness) not in own:
                    continue
                x, ref = plateau(table, dtype), plateau(own[("b200", harness)], dtype)
                shared = x.index.intersection(ref.index)
                if len(shared):
                    ratio = float(np.exp(np.mean(np.log(ref.loc[shared].to_numpy() / x.loc[shared].to_numpy()))))
                    out.setdefault(gpu, {}).setdefault(dtype, {})[harness] = round(ratio, 3)
    return out


def versus_model(own: dict[tuple[str, str], Any]) -> dict[tuple[str, str], float]:
    """(GPU, dtype) -> the median over harnesses of the geometric-mean measured / priced plateau GEMM time."""
    from statistics import median

    import numpy as np

    from autoplan.catalog import build_cluster
    from cost_models.gemm import matmul_time_s

    per: dict[tuple[str, str], list[float]] = {}
    for (gpu, _), table in sorted(own.items()):
        cluster = build_cluster(gpu, 8)
        for dtype in DTYPES:
            x = plateau(table, dtype).groupby(["m", "n", "k"]).min()
            if len(x):
                priced = np.array([matmul_time_s(m, k, n, cluster, dtype) * 1e3 for m, n, k in x.index])
                per.setdefault((gpu, dtype), []).append(float(np.exp(np.mean(np.log(x.to_numpy() / priced)))))
    return {key: float(median(v)) for key, v in per.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aic", type=Path, help="an ai-dynamo/aiconfigurator checkout (work tree or bare git dir)")
    ap.add_argument("--vs-model", action="store_true", help="also each GPU's measured / priced GEMM time (--aic)")
    args = ap.parse_args(argv)
    tree = Tree(args.aic) if args.aic else None
    own = own_tables(tree, SYSTEMS) if tree else None
    table = measure(tree, own) if tree else AIC_GEMM_VS_B200
    if args.aic:
        print("AIC_GEMM_VS_B200 =", table)
        print("matches gpu_facts.AIC_GEMM_VS_B200:", table == AIC_GEMM_VS_B200)
    for gpu, by_dtype in table.items():
        for dtype, by_harness in by_dtype.items():
            print(f"{gpu:6s} / b200 {dtype:4s}: " + "  ".join(f"{h} {r:.3f}" for h, r in by_harness.items()))
        print(f"{gpu:6s} / b200 pooled (geometric mean of the two dtypes' medians): {aic_gemm_ratio(gpu):.4f}")
    if tree is not None and args.vs_model:
        assert own is not None
        print("measured / priced plateau GEMM time (median over harnesses; > 1: the catalog prices it fast):")
        for (gpu, dtype), r in versus_model({**own, **own_tables(tree, HOPPER)}).items():
            print(f"  {gpu:9s} {dtype:4s} {r:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
