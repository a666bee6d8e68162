"""Requests as users write them (CLI flags, JSON, Python) and their resolution into specs.

The same shapes serve ``estimate``, ``search``, ``emit`` and batch lines; omitted fields take the
documented defaults (``JobSpec``: 1024 sequences of 8192 tokens, bf16; cluster: h100-sxm, catalog node
size and NIC)."""

from __future__ import annotations

import math
import os
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator

from autoplan.catalog import build_cluster, load_model
from autoplan.errors import ConfigError
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec


MAX_NUM_GPUS = 1 << 20  # bounds every GPU count (divisor enumeration, mesh building)
MAX_GBPS = 1e6  # Gbit/s per GPU: 1000x today's NICs

# A memory headroom as text (``--memory-headroom``, or a string in a request): ``6``/``6GiB`` GiB, ``0.1``/``10%`` a
# fraction of HBM; ASCII digits only (float() also reads other scripts' digits, "inf" and "1_0"). Unambiguous (each
# character has one place to go, so a failed match is linear in the text) and bounded in length: a request's text
# reaches it unchecked.
_HEADROOM_TEXT = r"^\s*([-+]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?(?:[ \t]*(%|[gG][iI][bB]))?\s*$"
HEADROOM_TEXT_MAX = 64  # characters; the longest sensible form ("12.5 GiB") is far below


def parse_headroom(value: object) -> object:
    """A request's ``memory_headroom``: text as :func:`headroom_from_text` reads it, anything else as given (a number,
    validated by the field)."""
    return headroom_from_text(value) if isinstance(value, str) else value


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 40 else repr(value[:37] + "...")


def headroom_from_text(value: str) -> float:
    """A memory headroom as ``--memory-headroom`` and requests write it: ``6``, ``6GiB`` → 6 (GiB), ``0.1`` → 0.1 and
    ``10%`` → 0.1 (a fraction of HBM: ``ClusterSpec.memory_headroom`` reads a value below 1 as one). ValueError naming
    the value when the text is neither form, or is GiB below 1 (which would read as a fraction)."""
    shown = _shown(value)
    if len(value) > HEADROOM_TEXT_MAX:
        raise ValueError(f"{shown} is longer than {HEADROOM_TEXT_MAX} characters; give GiB (6, 6GiB) or a fraction "
                         "(0.1, 10%)")
    core = value.strip().lower().removesuffix("%").removesuffix("gib").strip()
    if core.lstrip("+-") in ("inf", "infinity", "nan"):
        raise ValueError(f"{shown} is not a finite amount; give GiB (6, 6GiB) or a fraction (0.1, 10%)")
    m = re.match(_HEADROOM_TEXT, value)
    if m is None:
        raise ValueError(f"{shown} is neither GiB (6, 6GiB) nor a fraction of HBM (0.1, 10%)")
    number = float(m.group(2) + (m.group(3) or ""))
    if not math.isfinite(number):
        raise ValueError(f"{shown} is not a finite amount; give GiB (6, 6GiB) or a fraction (0.1, 10%)")
    unit = (m.group(4) or "").lower()
    if m.group(1) == "-" and number > 0:
        raise ValueError(f"{shown} must be at least 0" + ("% and below 100% of HBM" if unit == "%" else ""))
    if unit == "%":
        if number >= 100:
            raise ValueError(f"{shown} must be at least 0% and below 100% of HBM")
        return number / 100
    if unit == "gib" and 0 < number < 1:  # 0.5 would read as 50% of HBM (a number below 1 is a fraction)
        raise ValueError(f"{shown} is below 1 GiB, which autoplan reads as a fraction of HBM; give 1GiB or "
                         "more, or the fraction itself (e.g. 0.01 or 1%)")
    return number


# The field type of ``memory_headroom`` in every request (cluster, scale's cluster shape): text parsed as above, and
# the JSON schema says both forms
MemoryHeadroom = Annotated[
    float, Field(ge=0, le=MAX_GBPS), BeforeValidator(parse_headroom),
    WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0, "maximum": MAX_GBPS},
                              {"type": "string", "pattern": _HEADROOM_TEXT, "maxLength": HEADROOM_TEXT_MAX,
                               "examples": ["6GiB", "10%"]}]},
                   mode="validation")]


class ClusterRequest(BaseModel):
    """The cluster as a request names it. Strict: integers are integers (not ``true`` or ``8.9``),
    bandwidths finite, sizes bounded by ``MAX_NUM_GPUS``."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    gpu: str = Field(default="h100-sxm", max_length=64, description="GPU catalog name (see `autoplan hardware`)")
    num_gpus: int = Field(gt=0, le=MAX_NUM_GPUS)
    gpus_per_node: int | None = Field(default=None, gt=0, le=MAX_NUM_GPUS, description="None: the GPU catalog's")
    inter_node_gbps: float | None = Field(default=None, gt=0, le=MAX_GBPS,
                                          description="per GPU, Gbit/s; None: catalog NIC")
    nvlink_domain_size: int | None = Field(default=None, gt=0, le=MAX_NUM_GPUS,
                                           description="None: the GPU catalog's")
    profile: str | None = Field(default=None, max_length=1024,
                                description="cluster profile YAML from `autoplan calibrate`")
    memory_headroom: MemoryHeadroom | None = Field(
        default=None, description="HBM every plan keeps free: a number (a fraction of HBM when < 1, "
        "GiB when >= 1) or text as --memory-headroom takes it ('6GiB', '10%'); None: the default (5% of HBM)")

    efficiency: dict[str, Any] | None = Field(
        default=None, max_length=64, description="Efficiency fields over the catalog's, as a cluster profile's "
        "`efficiency` (over the profile's, with `profile`); plan files keep the ones they were priced with")

    @field_validator("profile", mode="before")
    @classmethod
    def _profile_path(cls, v: object) -> object:
        """A ``pathlib.Path`` names the file as its text does (the API takes either)."""
        return os.fspath(v) if isinstance(v, os.PathLike) and isinstance(os.fspath(v), str) else v

    def resolve(self, target: str | None = None) -> ClusterSpec:
        """The cluster as ``target`` runs on it (``build_cluster``: the efficiency set its profile names)."""
        return build_cluster(self.gpu, self.num_gpus, gpus_per_node=self.gpus_per_node,
                             inter_node_gbps=self.inter_node_gbps, nvlink_domain_size=self.nvlink_domain_size,
                             profile=self.profile, memory_headroom=self.memory_headroom, target=target,
                             efficiency_fields=self.efficiency)

    def efficiency_fields(self) -> dict[str, Any] | None:
        """The Efficiency fields this cluster sets over the catalog's: its profile's, then its own ``efficiency``
        (``build_cluster``'s order); None without either ({} for a profile that sets none). What responses record, so
        that a plan file reloads on the cluster it was priced on (the profile file itself may be gone or changed)."""
        from autoplan.catalog import load_profile

        if self.profile is None and self.efficiency is None:
            return None
        return {**(load_profile(self.profile).efficiency if self.profile is not None else {}), **(self.efficiency or {})}


def model_record(model: ModelSpec) -> dict[str, Any]:
    return {"name": model.name, "spec": model.model_dump(exclude_none=True)}


def cluster_record(cluster: ClusterSpec) -> dict[str, Any]:
    return {"gpu": cluster.gpu.name, "num_gpus": cluster.num_gpus, "gpus_per_node": cluster.gpus_per_node,
            "inter_node_gbps": cluster.inter_node_gbps, "nvlink_domain_size": cluster.nvlink_domain_size}


def with_mtp_layers(model: ModelSpec, mtp_layers: int | None) -> ModelSpec:
    """``model`` trained with ``mtp_layers`` multi-token-prediction modules instead of its own (Megatron
    ``--mtp-num-layers``; 0 trains without MTP, as Megatron-Bridge's "(w/o MTP)" DeepSeek-V3 runs); None: as is."""
    if mtp_layers is None or mtp_layers == model.arch.mtp_layers:
        return model
    data = model.model_dump()
    data["arch"]["mtp_layers"] = mtp_layers
    if not mtp_layers:  # without MTP: no block (a hybrid stack's mtp_pattern) and no repeated module either
        data["arch"] |= {"mtp_pattern": None, "mtp_repeated": False}
    try:  # validated: ModelSpec's own rules (a hybrid stack's MTP needs its block) speak, not a later copy
        return ModelSpec.model_validate(data)
    except ValidationError as err:
        why = str(err.errors()[0]["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"mtp_layers={mtp_layers} on {model.name}: {why}", valid=[model.arch.mtp_layers]) from None


def resolve(model: str | dict[str, Any], cluster: ClusterRequest, job: JobSpec,
            target: str | None = None) -> tuple[ModelSpec, ClusterSpec, JobSpec]:
    """The specs a request names, the cluster as ``target`` runs on it."""
    return load_model(model), cluster.resolve(target), job
