"""GPU catalog: the new entries, their sources, and one HBM unit rule for every GPU (issue 10 item 6)."""

from __future__ import annotations

import re

import pytest
import yaml
from importlib import resources

from autoplan.catalog.cluster import build_cluster
from autoplan.catalog.registry import efficiency_for_gpu, gpu_names, hbm_gib_from_datasheet, load_gpu

NEW = ["v100-16g", "v100-32g", "b300", "gb300", "mi325x", "mi355x", "h20"]


def _raw() -> dict:
    return yaml.safe_load(resources.files("autoplan.catalog").joinpath("gpus.yaml").read_text(encoding="utf-8"))


def test_new_gpus_are_in_the_catalog_with_datasheet_urls() -> None:
    assert set(NEW) <= set(gpu_names())
    for name in NEW:
        assert re.search(r"https://\S+", load_gpu(name).source), name
    assert load_gpu("gb300-nvl72") is load_gpu("gb300")


def test_one_hbm_unit_rule_for_every_gpu() -> None:
    """The file carries only the datasheet figure; every GPU's GiB comes out of the same function."""
    raw = _raw()["gpus"]
    for name, fields in raw.items():
        assert "hbm_gib" not in fields, f"{name}: give hbm_datasheet_gb, the loader converts"
        assert load_gpu(name).hbm_gib == hbm_gib_from_datasheet(fields["hbm_datasheet_gb"])
    # a100/h100/h800 and h200/b200/gb200/mi300x used to follow different rules (80 -> 80 but 141 -> 131)
    ratios = {load_gpu(n).hbm_gib / raw[n]["hbm_datasheet_gb"] for n in raw}
    assert len(ratios) == 1


@pytest.mark.parametrize(("gpu", "smi_mib"), [("a100-80g", 81920), ("h100-sxm", 81559), ("h200", 143771)])
def test_hbm_rule_matches_what_the_driver_reports(gpu: str, smi_mib: int) -> None:
    """nvidia-smi's memory.total is within 1 % of the catalog's GiB (a 10^9-byte reading is 7 % short)."""
    assert abs(load_gpu(gpu).hbm_gib - smi_mib / 1024) / (smi_mib / 1024) < 0.01


@pytest.mark.parametrize("name", NEW)
def test_new_gpus_build_clusters_and_have_prior_efficiencies(name: str) -> None:
    gpu = load_gpu(name)
    c = build_cluster(name, 144 if gpu.gpus_per_node == 4 else 64)
    assert c.efficiency == efficiency_for_gpu(name)  # the generation's, with the GPU's own facts (gpu_efficiency)
    assert gpu.peak_fp8_tflops >= gpu.peak_bf16_tflops and gpu.hbm_gib >= 16


def test_new_generations_are_marked_as_priors() -> None:
    """Every efficiency of a generation with no measured run is tagged [prior] in the catalog file."""
    text = resources.files("autoplan.catalog").joinpath("gpus.yaml").read_text(encoding="utf-8")
    blocks = re.split(r"\n  (?=[a-z0-9]+:)", text.split("\nefficiency:\n", 1)[1])
    by_gen = {b.split(":", 1)[0].strip(): b for b in blocks}
    for gen in ("volta", "cdna4"):
        lines = [ln for ln in by_gen[gen].splitlines()[1:]
                 if re.match(r"\s+(gemm_max|gemm_half_dim|attention|link_bus|nic_bus|dp_overlap|hbm_bus):", ln)]
        assert len(lines) == 7 and all("[prior]" in ln for ln in lines), gen


def test_volta_has_no_bf16_or_fp8_tensor_cores() -> None:
    from cost_models.errors import ConfigError
    from cost_models.estimate import estimate
    from cost_models.specs import JobSpec, ParallelConfig
    from autoplan.catalog import load_model

    c = build_cluster("v100-32g", 64)
    with pytest.raises(ConfigError, match="fp8 is impossible on v100-32g"):
        estimate(load_model("llama3-8b"), c, JobSpec(global_batch_size=64, seq_len=2048, precision="fp8"),
                 ParallelConfig(tp=8))
