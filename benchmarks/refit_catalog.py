"""Refit gpus.yaml's [fit] values in place: how the catalog is made from the published runs.

1. ``fidelity.fit_catalog()`` (``fit_params`` on every calibration run): each generation's CATALOG_FIT_FIELDS
   (``efficiency:`` section) and each framework's fields (``frameworks:`` section);
2. the ``blackwell`` generation, which has no Megatron-Core reference run of its own, re-made from the refitted
   ``hopper`` by ``fidelity.transfer_efficiency`` (h100-sxm → b200);
3. the MoE host cost ``frameworks.megatron.moe_host_s_per_layer`` / ``moe_host_s_per_expert``, fitted alone
   (``fidelity.fit_moe_host`` on ``fidelity.host_calibration_runs``) with every value above held as refitted.

Only the numbers change; comments and layout stay. ``gpu_efficiency`` entries are ratios to their generation and
need nothing. A framework's ``scale`` ratios (``calibrate.FRAMEWORK_RATIO_FIELDS``) are its fitted value, rounded as
written on the generation it was fitted on, over that generation's written value (10 decimals: the same price there). ``tests/test_fidelity.py::test_catalog_is_the_fit_of_the_published_runs`` checks the result.

    python benchmarks/refit_catalog.py            # refit and write; prints old → new
    python benchmarks/refit_catalog.py --dry-run  # print only
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fidelity  # noqa: E402
from autoplan.catalog import registry  # noqa: E402

CATALOG = ROOT / "autoplan" / "catalog" / "gpus.yaml"
HOST_KEY = "framework megatron"  # fidelity.fit_catalog's key of the MoE host cost (frameworks.megatron)
TRANSFERRED = ("gemm_max", "gemm_half_dim", "attention", "fp8_gemm_speedup", "dp_overlap")
_VALUE = re.compile(r"^(\s*[A-Za-z_0-9]+:\s*)(-?[0-9.]+(?:e-?[0-9]+)?)(\s*)(#.*)?$")


def set_value(text: str, section: str, block: str, name: str, value: float, sub: str | None = None) -> str:
    """``text`` with ``section: / block: / name:``'s number replaced (its comment kept, aligned as before); ``sub``:
    the number is ``section: / block: / sub: / name:`` (a ``scale:`` ratio, written to 10 decimals)."""
    head = re.search(rf"^{re.escape(section)}:", text, re.M)
    if head is None:
        raise KeyError(f"gpus.yaml has no section {section}")
    start = head.start()
    nxt = re.compile(r"^[A-Za-z_]+:", re.M).search(text, head.end())  # the next top-level key
    end = nxt.start() if nxt else len(text)
    body = text[start:end]
    b = re.search(rf"^  {re.escape(block)}:", body, re.M)
    if b is None:
        raise KeyError(f"gpus.yaml has no {section}.{block}")
    nb = re.compile(r"^  [A-Za-z_0-9-]+:", re.M).search(body, b.end())  # the next block: the search stays in this one
    body_end = nb.start() if nb else len(body)
    at, indent, where = b.end(), "    ", f"{section}.{block}"
    if sub is not None:
        s = re.search(rf"^    {re.escape(sub)}:\s*(#.*)?$", body[at:body_end], re.M)
        if s is None:
            raise KeyError(f"gpus.yaml has no {where}.{sub}")
        at, indent, where = at + s.end(), "      ", f"{where}.{sub}"
    n = re.search(rf"^{indent}{re.escape(name)}:.*$", body[at:body_end], re.M)
    if n is None:
        raise KeyError(f"gpus.yaml has no {where}.{name}")
    j, k = at + n.start(), at + n.end()
    m = _VALUE.match(body[j:k])
    if m is None:
        raise ValueError(f"gpus.yaml {where}.{name} is not a plain number: {body[j:k]!r}")
    head, old, pad, comment = m.group(1), m.group(2), m.group(3), m.group(4) or ""
    digits = 10 if sub is not None else 6 if 0 < abs(value) < 0.01 else 4  # ratios: 10 (the fit's value back); µs
    new = f"{value:.{digits}f}".rstrip("0").rstrip(".")
    line = (head + new + " " * max(1, len(old) + len(pad) - len(new)) + comment).rstrip()
    return text[:start] + body[:j] + line + body[k:] + text[end:]


def clear_caches() -> None:
    for fn in vars(registry).values():
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


def _write(text: str) -> None:
    CATALOG.write_text(text)
    clear_caches()


def refit(write: bool) -> list[tuple[str, str, float, float]]:
    """(block, field, old, new) of every value that moves; written to gpus.yaml when ``write``."""
    changes: list[tuple[str, str, float, float]] = []
    text = CATALOG.read_text()
    catalog = registry.efficiency_catalog()
    fitted = fidelity.fit_catalog()  # once: the dry run's transfer below reads its hopper values too
    for key, values in fitted.items():
        if key == HOST_KEY:
            continue  # fitted last, on the refitted catalog (below)
        framework = key.startswith("framework ")
        block = key.split()[1] if framework else key
        have = registry.framework_efficiency(block) if framework else catalog[block].model_dump()
        section = "frameworks" if framework else "efficiency"
        for name, value in values.items():
            if name == "scale":  # a framework's ratios to the generation (calibrate.FRAMEWORK_RATIO_FIELDS)
                for n, v in value.items():
                    if abs(float(have.get("scale", {}).get(n, 0.0)) - v) > 1e-9:
                        changes.append((key, f"scale.{n}", float(have.get("scale", {}).get(n, 0.0)), v))
                        text = set_value(text, section, block, n, v, sub="scale")
            elif abs(float(have[name]) - value) > 1e-9:
                changes.append((key, name, float(have[name]), value))
                text = set_value(text, section, block, name, value)
    if write:
        _write(text)
        catalog = registry.efficiency_catalog()
    else:  # the transfer from the refitted hopper, without writing it
        catalog = {**catalog, "hopper": catalog["hopper"].model_copy(update=fitted["hopper"])}
    blackwell = fidelity.transfer_efficiency(catalog["hopper"], registry.load_gpu("h100-sxm"),
                                             registry.load_gpu("b200"), catalog["blackwell"])
    for name in TRANSFERRED:
        old, new = getattr(catalog["blackwell"], name), round(float(getattr(blackwell, name)), 4)
        if abs(old - new) > 1e-4 * max(1.0, abs(new)):
            changes.append(("blackwell (transfer)", name, old, new))
            text = set_value(text, "efficiency", "blackwell", name, new)
    if write:
        _write(text)
    # 3. the MoE host cost, fitted alone with every value above held (as written; a dry run: as the catalog is)
    have = registry.framework_efficiency("megatron")
    host = fidelity.fit_moe_host([r for _, r in fidelity.host_calibration_runs()])
    for field, value in zip(fidelity.HOST_FIELDS, host):
        old, new = float(have.get(field, 0.0)), round(value, 6)
        if abs(old - new) > 1e-9:
            changes.append((HOST_KEY, field, old, new))
            text = set_value(text, "frameworks", "megatron", field, new)
    if write and any(c[0] == HOST_KEY for c in changes):
        _write(text)
    return changes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print what would move; write nothing")
    args = ap.parse_args(argv)
    changes = refit(write=not args.dry_run)
    print("| block | field | catalog | refit |\n|---|---|---:|---:|")
    for block, name, old, new in changes:
        print(f"| {block} | {name} | {old:.6g} | {new:.6g} |")
    if not changes:
        print("| (none) | the catalog is at the fit | | |")
    print("written to autoplan/catalog/gpus.yaml" if changes and not args.dry_run else "nothing written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
