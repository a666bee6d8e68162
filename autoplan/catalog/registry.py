"""The shipped catalogs (``models.yaml``, ``gpus.yaml``): read once per process, looked up by name.

Names are case-insensitive; ``aliases`` resolve to their target entry (and take its name). Unknown
names raise :class:`UserInputError` with close matches from :func:`difflib.get_close_matches`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Generic, TypeVar

import yaml

from autoplan.catalog.spec_file import validate
from autoplan.errors import UserInputError
from cost_models.specs import Efficiency, GPUSpec, ModelSpec

T = TypeVar("T")


@dataclass(frozen=True)
class Catalog(Generic[T]):
    """Entries keyed by lower-case name, plus lower-case alias → entry name."""

    entries: dict[str, T]
    aliases: dict[str, str]

    def resolve(self, name: str) -> str | None:
        key = name.strip().lower()
        key = self.aliases.get(key, key)
        return key if key in self.entries else None

    def suggestions(self, name: str, n: int = 3) -> list[str]:
        """Names starting with ``name`` first, then :func:`difflib.get_close_matches`."""
        key = name.strip().lower()
        candidates = sorted([*self.entries, *self.aliases])
        prefixed = [c for c in candidates if key and c.startswith(key)]
        close = difflib.get_close_matches(key, candidates, n=n)
        return list(dict.fromkeys(prefixed + close))[:n]


@lru_cache(maxsize=2)
def _read(filename: str) -> dict[str, Any]:
    """Parse a shipped catalog file once (callers only read the result)."""
    text = resources.files("autoplan.catalog").joinpath(filename).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"{filename} must hold a mapping"
    return data


def _aliases(raw: dict[str, str] | None, entries: Mapping[str, object], filename: str) -> dict[str, str]:
    aliases = {str(k).lower(): str(v).lower() for k, v in (raw or {}).items()}
    dangling = sorted(a for a, target in aliases.items() if target not in entries)
    assert not dangling, f"{filename}: aliases point to unknown entries: {dangling}"
    return aliases


@lru_cache(maxsize=1)
def model_catalog() -> Catalog[ModelSpec]:
    """``models.yaml`` as validated ModelSpecs (the entry's key is its name)."""
    data = _read("models.yaml")
    entries = {
        str(name).lower(): validate(ModelSpec, {"name": str(name).lower(), **fields}, f"catalog model '{name}'")
        for name, fields in data["models"].items()
    }
    return Catalog(entries, _aliases(data.get("aliases"), entries, "models.yaml"))


def hbm_gib_from_datasheet(gb: float) -> float:
    """GiB of HBM from the datasheet's "GB" figure, one rule for every GPU. HBM stacks are DRAM dies of 2^k
    bits, so the printed capacity is binary (80 GB = 80 GiB); nvidia-smi's totals (81920 MiB on A100-80GB,
    81559 MiB on H100-80GB, 143771 MiB on H200-141GB) agree with it, not with a 10^9-byte reading."""
    return float(gb)


def _gpu_fields(name: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    out = {"name": name, **fields}
    if "hbm_datasheet_gb" in out:
        out["hbm_gib"] = hbm_gib_from_datasheet(out.pop("hbm_datasheet_gb"))
    return out


@lru_cache(maxsize=1)
def gpu_catalog() -> Catalog[GPUSpec]:
    """``gpus.yaml``'s ``gpus`` as validated GPUSpecs (HBM converted by ``hbm_gib_from_datasheet``)."""
    data = _read("gpus.yaml")
    entries = {
        str(name).lower(): validate(GPUSpec, _gpu_fields(str(name).lower(), fields), f"catalog GPU '{name}'")
        for name, fields in data["gpus"].items()
    }
    return Catalog(entries, _aliases(data.get("aliases"), entries, "gpus.yaml"))


@lru_cache(maxsize=1)
def efficiency_catalog() -> dict[str, Efficiency]:
    """``gpus.yaml``'s ``efficiency`` section, keyed by GPU generation."""
    data = _read("gpus.yaml")
    return {
        str(gen): validate(Efficiency, fields, f"catalog efficiency '{gen}'")
        for gen, fields in data["efficiency"].items()
    }


def framework_efficiency(framework: str | None) -> dict[str, Any]:
    """``gpus.yaml``'s ``frameworks`` entry of a training framework, as written: the Efficiency fields it sets over
    its GPU's (fitted on that framework's published runs; Megatron-Core is the reference) — under ``scale`` ratios to
    the GPU's own value (the same stack's kernels relative to Megatron-Core/TE's on that GPU), the other fields
    absolute facts of the stack. ``resolve_over`` applies it to a GPU's efficiency."""
    table = _read("gpus.yaml").get("frameworks") or {}
    return dict(table.get(framework or "megatron") or {})


def gpu_efficiency(gpu: str) -> dict[str, Any]:
    """``gpus.yaml``'s ``gpu_efficiency`` entry of one GPU, as written: the Efficiency fields it sets over its
    generation's — absolute values, and under ``scale`` ratios to the generation's value — facts of that GPU measured
    against a sibling of its generation (e.g. Blackwell Ultra's sustained tensor throughput and attention kernel
    against GB200's); empty for most GPUs. ``efficiency_for_gpu`` resolves them."""
    table = _read("gpus.yaml").get("gpu_efficiency") or {}
    return dict(table.get(gpu.strip().lower()) or {})


def resolve_over(base: Efficiency, own: dict[str, Any]) -> dict[str, Any]:
    """The Efficiency fields a ``gpu_efficiency`` or ``frameworks`` entry sets over ``base``: its ``scale`` ratios
    times ``base``'s values, then its absolute values. An fp8 ratio never takes a GPU below no speed-up (1: a GPU
    without fp8 tensor cores stays at 1; cost_models/gemm.py caps the speed-up at the peak ratio as well)."""
    scaled = {name: getattr(base, name) * float(ratio) for name, ratio in (own.get("scale") or {}).items()}
    if "fp8_gemm_speedup" in scaled:
        scaled["fp8_gemm_speedup"] = max(1.0, scaled["fp8_gemm_speedup"])
    return {**scaled, **{k: v for k, v in own.items() if k != "scale"}}


def unknown_name_error(kind: str, name: str, catalog: Catalog[Any], see: str) -> UserInputError:
    """``unknown model 'x'; did you mean: a, b? (see 'autoplan models')``; ``.valid`` lists every name."""
    close = catalog.suggestions(name)
    hint = f"; did you mean: {', '.join(close)}?" if close else ""
    err = UserInputError(f"unknown {kind} '{name}'{hint} (see '{see}')")
    err.valid = sorted(catalog.entries)
    return err


def catalog_model(name: str) -> ModelSpec | None:
    """The catalog entry for ``name`` or an alias of it, ``None`` if there is none."""
    catalog = model_catalog()
    key = catalog.resolve(name)
    return catalog.entries[key] if key is not None else None


def load_gpu(name: str) -> GPUSpec:
    """A GPU from the catalog by (case-insensitive) name."""
    catalog = gpu_catalog()
    key = catalog.resolve(name)
    if key is None:
        raise unknown_name_error("GPU", name, catalog, "autoplan hardware")
    return catalog.entries[key]


def efficiency_for(generation: str) -> Efficiency:
    """The catalog's efficiency parameters for a GPU generation (``hopper``, ``ampere``, ...)."""
    table = efficiency_catalog()
    try:
        return table[generation.strip().lower()]
    except KeyError:
        raise UserInputError(f"no efficiency parameters for GPU generation '{generation}'", valid=sorted(table)) from None


@lru_cache(maxsize=64)
def efficiency_for_gpu(gpu: str) -> Efficiency:
    """A catalog GPU's efficiency parameters: its generation's (``efficiency_for``) with the GPU's own facts
    (``gpu_efficiency``) over them."""
    spec = load_gpu(gpu)
    base = efficiency_for(spec.generation)
    own = gpu_efficiency(spec.name)
    if not own:
        return base
    return validate(Efficiency, {**base.model_dump(), **resolve_over(base, own)},
                    f"catalog gpu_efficiency '{spec.name}'")


def efficiency_is_prior(gpu: GPUSpec) -> bool:
    """Whether the catalog's efficiencies for ``gpu`` are priors (``efficiency_priors`` in gpus.yaml)."""
    priors = _read("gpus.yaml").get("efficiency_priors") or {}
    return gpu.generation in priors.get("generations", ()) or gpu.name in priors.get("gpus", ())


def model_names() -> list[str]:
    """Catalog model names, sorted (aliases resolve but are not listed)."""
    return sorted(model_catalog().entries)


def model_aliases() -> dict[str, str]:
    """Alias → catalog model name, sorted by alias."""
    return dict(sorted(model_catalog().aliases.items()))


def gpu_names() -> list[str]:
    """Catalog GPU names, sorted."""
    return sorted(gpu_catalog().entries)
