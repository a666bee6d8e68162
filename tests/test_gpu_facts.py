"""Per-GPU efficiency facts (gpus.yaml ``gpu_efficiency``; benchmarks/gpu_facts.py): each value is recomputed from
the public benchmark numbers it cites, reaches the cluster every path builds, and changes a prediction."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autoplan.catalog import build_cluster, load_model
from autoplan.catalog.registry import efficiency_catalog, efficiency_for, efficiency_for_gpu, gpu_efficiency, load_gpu
from cost_models.estimate import estimate
from cost_models.gemm import attention_time_s, matmul_time_s
from cost_models.specs import JobSpec, ParallelConfig
from benchmark_modules import load_benchmark

facts = load_benchmark("gpu_facts", "gpu_facts")


def test_catalog_gpu_efficiency_is_recomputed_from_the_benchmarks() -> None:
    """gb300 / b300 entries == the derivation from the cited numbers: ratios to the generation's values, so a refit
    or re-transfer of ``blackwell`` carries them (resolved: generation value × ratio)."""
    want = facts.blackwell_ultra_efficiency()
    assert set(want) == {"gb300", "b300"}
    for gpu, fields in want.items():
        have = gpu_efficiency(gpu)
        assert set(have) == set(fields), gpu
        assert have["scale"] == pytest.approx(fields["scale"], abs=1e-4), gpu
        assert have["attention_half_keys"] == fields["attention_half_keys"], gpu
        assert have["attention_d64"] == pytest.approx(fields["attention_d64"], abs=1e-3), gpu
        blackwell, resolved = efficiency_catalog()["blackwell"], efficiency_for_gpu(gpu)
        for name, ratio in have["scale"].items():
            assert getattr(resolved, name) == pytest.approx(getattr(blackwell, name) * ratio), (gpu, name)


def test_same_harness_blackwell_gemm_ratios_cross_check_the_catalog() -> None:
    """aiconfigurator's GEMM tables (one collector, 6-8 inference-framework versions per GPU): each GPU's throughput
    over B200's is the geometric mean of the bf16 and fp8 medians over the harnesses: GB200 1.08x (the catalog's
    datasheet ratio: 1.11x), B300 1.06x (catalog: 1.0), GB300 1.22x (catalog: 1.27x through Azure's GB300 / GB200).
    Every harness puts B300 and GB300 ahead of B200, GB200 too but for one bf16 table; the tables' fp8 GB300 / GB200
    agrees with Azure's sustained ratio within 4%; the catalog is within 7% of each measured ratio."""
    from statistics import median

    table = facts.AIC_GEMM_VS_B200
    assert table["gb200"]["bf16"]["trtllm/1.3.0rc20"] == 1.055 and table["b300"]["fp8"]["sglang/0.5.9"] == 1.077
    for gpu, want in (("gb200", 1.0812), ("b300", 1.0637), ("gb300", 1.2249)):
        bf16, fp8 = median(table[gpu]["bf16"].values()), median(table[gpu]["fp8"].values())
        assert facts.aic_gemm_ratio(gpu) == pytest.approx((bf16 * fp8) ** 0.5) == pytest.approx(want, abs=1e-4)
    for gpu in ("b300", "gb300"):
        assert min(r for d in table[gpu].values() for r in d.values()) > 1.03, gpu
    assert sorted(r for d in table["gb200"].values() for r in d.values())[1] > 1.04  # the lowest: vllm 0.24.0, 0.847
    ratio = facts.median_ratio("gb300", "fp8") / facts.median_ratio("gb200", "fp8")
    assert ratio == pytest.approx(facts.sustained_gemm_ratio(), rel=0.04)
    priced = {"gb200": 2500 / 2250, "b300": 1.0, "gb300": 2500 / 2250 * facts.sustained_gemm_ratio()}
    for gpu, measured, catalog in facts.aic_crosscheck():
        assert catalog == pytest.approx(priced[gpu], rel=1e-3), gpu
        assert catalog == pytest.approx(measured, rel=0.07), gpu


def test_the_ratios_come_from_the_cited_tables() -> None:
    """Sustained FP8 GEMM GB300/GB200 (Azure cuBLASLt, 8192^3: 3286.3 vs 2876.6 TFLOP/s) and the cuDNN 9.17 SDPA
    share at 8k (GB300 fwd 1899 / bwd 1292; GB200 1584 / 1211 TFLOP/s; backward counted as 2.5x the forward)."""
    assert facts.SUSTAINED_FP8_GEMM[(8192, 8192, 8192)] == (2876.6, 3286.3)
    plateau = [(4096,) * 3, (8192,) * 3, (16384,) * 3, (32768,) * 3, (6144, 12288, 12288)]
    mean = sum(facts.SUSTAINED_FP8_GEMM[s][1] / facts.SUSTAINED_FP8_GEMM[s][0] for s in plateau) / len(plateau)
    assert facts.sustained_gemm_ratio() == pytest.approx(mean)
    assert 1.13 < facts.sustained_gemm_ratio() < 1.16  # every plateau shape: 1.133-1.158
    share = lambda f, b: 3.5 / (1 / f + 2.5 / b) / 2500  # noqa: E731
    assert facts.attention_share_ratio() == pytest.approx(share(1899, 1292) / share(1584, 1211))
    assert facts.GB300_ATTENTION_SWEEP[1][8192] == (1899.0, 1292.0)


def test_gb300_attention_half_keys_is_its_own_sweeps_fit() -> None:
    """GB300's (and B300's prior) ``attention_half_keys``: the x/(x + h) fit to its own cuDNN 9.19.1 d-128 causal sweep,
    2k-32k (ATTENTION_SWEEP_919), within 3% of every point; the sweep's 2k row is ATTENTION_HEAD_DIM_BENCH's."""
    fidelity = load_benchmark("fidelity", "fidelity")
    sweep = facts.ATTENTION_SWEEP_919["gb300"]
    a, h = fidelity.attention_half_keys_fit(sweep, 2500.0)
    assert gpu_efficiency("gb300")["attention_half_keys"] == pytest.approx(h, abs=1.0)
    assert gpu_efficiency("b300")["attention_half_keys"] == gpu_efficiency("gb300")["attention_half_keys"]
    for tokens, (fwd, bwd) in sweep.items():
        assert a * (tokens / 2) / (tokens / 2 + h) == pytest.approx(fidelity.kernel_share(fwd, bwd, 2500.0), rel=0.03)
    for gpu, (_, (tokens, fwd, bwd)) in facts.ATTENTION_HEAD_DIM_BENCH.items():
        assert facts.ATTENTION_SWEEP_919[gpu][tokens] == (fwd, bwd), gpu


def test_every_path_gets_the_gpu_facts_and_framework_and_profile_still_go_over(tmp_path) -> None:  # type: ignore[no-untyped-def]
    gb300 = build_cluster("gb300", 72).efficiency
    assert gb300 == efficiency_for_gpu("gb300") != efficiency_for("blackwell")
    assert gb300.gemm_max == efficiency_for("blackwell").gemm_max * gpu_efficiency("gb300")["scale"]["gemm_max"]
    assert build_cluster("gb200", 72).efficiency == efficiency_for("blackwell")  # no facts of its own
    assert build_cluster("gb300-nvl72", 72).efficiency == gb300  # an alias takes its entry's facts
    prof = tmp_path / "p.yaml"
    prof.write_text("gpu: gb300\nefficiency: {gemm_max: 0.5}\n")
    assert build_cluster("gb300", 72, profile=str(prof)).efficiency.gemm_max == 0.5
    assert build_cluster("gb300", 72, profile=str(prof)).efficiency.attention == gb300.attention


def _cluster_without(gpu: str, field: str, n: int = 64):  # type: ignore[no-untyped-def]
    c = build_cluster(gpu, n)
    return c.model_copy(update={"efficiency": c.efficiency.model_copy(
        update={field: getattr(efficiency_for(c.gpu.generation), field)})})


def test_each_fact_changes_the_prediction() -> None:
    """Remove one fact and the kernel it describes (and the step) slows by its measured ratio."""
    gb300 = build_cluster("gb300", 64)
    assert (matmul_time_s(8192, 8192, 8192, _cluster_without("gb300", "gemm_max"), "fp8")
            / matmul_time_s(8192, 8192, 8192, gb300, "fp8")) == pytest.approx(facts.sustained_gemm_ratio(), rel=1e-3)
    for gpu in ("gb300", "b300"):
        assert (attention_time_s(1e15, _cluster_without(gpu, "attention"))
                / attention_time_s(1e15, build_cluster(gpu, 64))) == pytest.approx(facts.attention_share_ratio(),
                                                                                 rel=1e-3)
    model = load_model("llama3-8b")
    par = ParallelConfig(tp=1, pp=1, cp=4)
    job = JobSpec(global_batch_size=64, seq_len=131072, precision="fp8")
    base = estimate(model, gb300, job, par, check=False).step_time_s
    for field in ("gemm_max", "attention"):
        assert estimate(model, _cluster_without("gb300", field), job, par, check=False).step_time_s > base * 1.01, field
    b300 = estimate(model, build_cluster("b300", 64), job, par, check=False).step_time_s
    assert estimate(model, _cluster_without("b300", "attention"), job, par, check=False).step_time_s > b300 * 1.01
    # the saturation: GB300's h (777, cuDNN 9.19.1) is below GB200's (837), so its 16k-key ring steps gain less over
    # the 8k reference: with GB200's value the step is faster (by ~0.7% here)
    for gpu, step in (("gb300", base), ("b300", b300)):
        without = estimate(model, _cluster_without(gpu, "attention_half_keys"), job, par, check=False).step_time_s
        assert without < step * 0.995, gpu


def test_gb300_is_predicted_faster_than_gb200_on_the_same_job() -> None:
    """Equal datasheet peaks, HBM and NVLink: what separates the two is the measured facts (GEMMs 1.14x, attention
    1.10x at 8k), so an fp8 70B step on GB300 is faster, by less than the GEMM ratio (communication is unchanged)."""
    model = load_model("llama3-70b")
    job = JobSpec(global_batch_size=128, seq_len=8192, precision="fp8")
    par = ParallelConfig(tp=4, pp=2)
    t200 = estimate(model, build_cluster("gb200", 64), job, par, check=False).step_time_s
    t300 = estimate(model, build_cluster("gb300", 64), job, par, check=False).step_time_s
    assert 1.05 < t200 / t300 < facts.sustained_gemm_ratio() * 1.001


def test_nvlink5_bus_efficiencies_are_the_cited_nccl_tests() -> None:
    """Blackwell's ring / NVLS all-reduce busbw over NVLink 5's 900 GB/s: 8x B300, NVLS off 695, on 845 GB/s
    (nccl#2140). The same report's 8x H100 pair (370 / 480) is hopper's catalog values: one yardstick for both."""
    cat = efficiency_catalog()
    link, nvls = facts.nvlink_bus_efficiency("b300")
    assert (link, nvls) == pytest.approx((695 / 900, 845 / 900))
    assert cat["blackwell"].link_bus == pytest.approx(link, abs=1e-4)
    assert cat["blackwell"].nvls_bus == pytest.approx(nvls, abs=1e-4)
    assert (cat["hopper"].link_bus, cat["hopper"].nvls_bus) == pytest.approx(facts.nvlink_bus_efficiency("h100-sxm"),
                                                                             abs=3e-3)  # 0.82 rounds 370/450
    # Azure's ring all-reduce on 4 GPUs of one GB200 / GB300 tray agrees within 3%
    for busbw in facts.NCCL_RING_ALLREDUCE_CROSSCHECK.values():
        assert busbw / 900 == pytest.approx(link, rel=0.03)


def test_nvlink5_bus_efficiencies_change_the_prediction() -> None:
    """A TP all-reduce (no sequence parallelism) inside one NVLink domain prices NVLS; an SP all-gather the ring."""
    from cost_models.collectives import group_collective_time_s

    c = build_cluster("b200", 8)
    for kind, field in (("all_reduce", "nvls_bus"), ("all_gather", "link_bus")):
        now = group_collective_time_s(kind, 2**30, 8, 1, c)
        prior = c.model_copy(update={"efficiency": c.efficiency.model_copy(
            update={"nvls_bus": 0.0, "link_bus": 0.82})})  # the generation's values before (hopper's ring, no NVLS)
        assert group_collective_time_s(kind, 2**30, 8, 1, prior) != pytest.approx(now, rel=0.02), (kind, field)
    model = load_model("llama3-70b")
    job = JobSpec(global_batch_size=64, seq_len=8192, precision="fp8")
    par = ParallelConfig(tp=8, pp=1, sequence_parallel=False)
    base = estimate(model, c.model_copy(update={"num_gpus": 64}), job, par, check=False).step_time_s
    no_nvls = c.model_copy(update={"num_gpus": 64, "efficiency": c.efficiency.model_copy(update={"nvls_bus": 0.0})})
    assert estimate(model, no_nvls, job, par, check=False).step_time_s > base * 1.005


def test_blackwell_gemm_curve_agrees_with_the_sustained_micro_benchmarks() -> None:
    """The generation's GEMM curve (hopper's fit, saturation dim by the ridge point; GB300's measured gemm_max) against
    GEMM micro-benchmarks it was not made from, at training-size shapes: Azure's GB200/GB300 cuBLASLt FP8 at
    8192^3-16384^3 and 6144x12288x12288, TE's B300 BF16 QKV / MLP GEMMs (M = 15872): within 10%. Off the plateau the
    curve is no micro-benchmark: 4096^3 is priced 22% slow, the skinny 802816x192x768 3x slow (documented, not fitted)."""
    rows = {(g, s): (meas, model) for g, s, meas, model in facts.gemm_crosscheck()}
    for gpu in ("gb200", "gb300"):
        for shape in ("8192x8192x8192", "16384x16384x16384", "6144x12288x12288"):
            meas, model = rows[(gpu, f"fp8 {shape}")]
            assert model == pytest.approx(meas, rel=0.10), (gpu, shape)
        meas, model = rows[(gpu, "fp8 802816x192x768")]
        assert model < 0.4 * meas
    for shape in ("15872x4096x12288", "15872x4096x16384", "15872x16384x4096"):
        meas, model = rows[("b300", f"bf16 {shape}")]
        assert model == pytest.approx(meas, rel=0.05), shape


def test_gpu_efficiency_entries_name_catalog_gpus_and_valid_fields() -> None:
    """A typo in a GPU name would silently drop its facts: every entry names a catalog GPU (not an alias) and
    validates as Efficiency fields over its generation's."""
    import yaml
    from importlib import resources

    from autoplan.catalog.registry import gpu_names, load_gpu

    raw = yaml.safe_load(resources.files("autoplan.catalog").joinpath("gpus.yaml").read_text(encoding="utf-8"))
    assert set(raw["gpu_efficiency"]) <= set(gpu_names())
    for gpu, fields in raw["gpu_efficiency"].items():
        eff, base = efficiency_for_gpu(gpu), efficiency_for(load_gpu(gpu).generation)
        scale = fields.pop("scale", {})
        assert set(scale) <= set(type(eff).model_fields), gpu
        assert {f: getattr(eff, f) for f in scale} == {f: getattr(base, f) * r for f, r in scale.items()}
        assert {f: getattr(eff, f) for f in fields} == fields


# ---- CDNA 3: AMD's Max-Achievable FLOPs (gpu_facts.AMD_MAF) ---------------------------------------------------------
def test_cdna3_gemm_figures_are_recomputed_from_amds_maf() -> None:
    """cdna3 gemm_max == gpu_facts.cdna3_gemm_efficiency at the catalog's half-dim (the table's MI300X figures: BF16
    708, FP8 1273 TFLOP/s at Appendix B's shapes), and mi325x's scale == its MAF over MI300X's. fp8_gemm_speedup is
    fitted on the MI325X training runs (more_runs_amd.json), below the MAF plateau's FP8/BF16 ratio (as Hopper's fit
    is below its cuBLAS one)."""
    assert facts.AMD_MAF["bf16"] == ((4096, 4864, 32896), 708.0, 843.0)
    assert facts.AMD_MAF["fp8"] == ((4096, 3648, 32896), 1273.0, 1519.0)
    cdna3 = efficiency_for("cdna3")
    want = facts.cdna3_gemm_efficiency(cdna3.gemm_half_dim)
    assert cdna3.gemm_max == pytest.approx(want["gemm_max"], abs=1e-4)
    assert 1.0 < cdna3.fp8_gemm_speedup < want["fp8_gemm_speedup"]
    assert gpu_efficiency("mi325x") == facts.mi325x_efficiency()
    assert facts.mi325x_efficiency()["scale"]["gemm_max"] == pytest.approx((843 / 708 + 1519 / 1273) / 2, abs=1e-4)


@pytest.mark.parametrize(("gpu", "col"), [("mi300x", 1), ("mi325x", 2)])
def test_the_gemm_model_runs_amds_maf_shapes_at_the_measured_throughput(gpu: str, col: int) -> None:
    """cost_models.gemm.matmul_time_s on the cluster every path builds runs AMD's BF16 MAF GEMM at the published
    TFLOP/s: exactly on MI300X (what the generation's gemm_max is made from), within the BF16/FP8 spread of the mean
    ratio on MI325X. Its FP8 GEMM runs at the fitted in-training fp8 speed-up over that curve: below the MAF plateau."""
    c = build_cluster(gpu, 8)
    (m, n, k), *bf16 = facts.AMD_MAF["bf16"]
    model = 2 * m * n * k / matmul_time_s(m, k, n, c, "bf16") / 1e12
    assert model == pytest.approx(bf16[col - 1], rel=1e-3 if gpu == "mi300x" else 3e-3), gpu
    (m, n, k), *fp8 = facts.AMD_MAF["fp8"]
    model = 2 * m * n * k / matmul_time_s(m, k, n, c, "fp8") / 1e12
    at_bf16 = 2 * m * n * k / matmul_time_s(m, k, n, c, "bf16") / 1e12
    assert model == pytest.approx(at_bf16 * c.efficiency.fp8_gemm_speedup, rel=1e-9) and model < fp8[col - 1], gpu


def test_alltoall_bus_efficiencies_are_the_cited_nccl_tests() -> None:
    """``link_bus · a2a_link_ratio`` of hopper / blackwell == the mean busbw / nominal NVLink of their cited
    alltoall_perf rows (OCI GB200 / GB300 NVL72 and B300 pages; nccl#2169 4x H100), recomputed here from the rows, and
    the ratio == ``alltoall_ring_ratio``; both sit below the ring all-reduce's ``link_bus`` on the same NVLink, and a
    64-rank NVL72 all-to-all is not the ~half of it a what-if on the GPT-OSS rows suggested (issue #12): 0.69 / 0.74
    of 900 GB/s vs the ring's 0.77."""
    cat = efficiency_catalog()
    share = {gen: cat[gen].link_bus * cat[gen].a2a_link_ratio for gen in ("hopper", "blackwell")}
    rows = facts.NCCL_ALLTOALL_NVLINK
    blackwell = [busbw / 900 for gpu, _, _, busbw, _, _ in rows if gpu in ("gb200", "gb300", "b300")]
    assert len(blackwell) == 7 and share["blackwell"] == pytest.approx(sum(blackwell) / 7, abs=1e-4)
    assert share["hopper"] == pytest.approx(334.90 / 450, abs=1e-4)
    for gen in ("hopper", "blackwell"):
        assert share[gen] == pytest.approx(facts.alltoall_link_efficiency(gen), abs=1e-4)
        assert cat[gen].a2a_link_ratio == pytest.approx(facts.alltoall_ring_ratio(gen), abs=1e-4)
        assert cat[gen].a2a_link_ratio < 1
    nvl72_64 = [busbw / 900 for gpu, n, _, busbw, _, _ in rows if n == 64]
    assert len(nvl72_64) == 2 and min(nvl72_64) > 0.85 * cat["blackwell"].link_bus
    with pytest.raises(ValueError, match="no all-to-all row"):
        facts.alltoall_link_efficiency("cdna3")


def test_alltoall_rate_follows_link_bus(tmp_path: Path) -> None:
    """The all-to-all's NVLink rate is a ratio to the ring's: at the catalog's values it is the measured share of
    nominal it was before the ratio (hopper 0.7442, blackwell 0.7231 of the link, to 1e-9), and a cluster profile or
    a calibration that lowers ``link_bus`` lowers it in proportion (it stayed at the catalog's rate when it was an
    absolute ``a2a_link_bus``)."""
    from autoplan.calibrate import PHYSICAL_BOUNDS
    from cost_models.collectives import link_all_to_all_bandwidth, link_bandwidth

    for gpu, measured in (("h100-sxm", 0.7442), ("gb200", 0.7231)):
        c = build_cluster(gpu, 8)
        assert link_all_to_all_bandwidth(c) == pytest.approx(c.gpu.link_gbytes_per_s * 1e9 * measured, rel=1e-9)
        lowered = 0.6
        assert PHYSICAL_BOUNDS["link_bus"][0] <= lowered  # a value calibrate may fit
        prof = tmp_path / f"{gpu}.yaml"
        prof.write_text(yaml.safe_dump({"gpu": gpu, "efficiency": {"link_bus": lowered}}))
        profiled = build_cluster(gpu, 8, profile=str(prof))
        fitted = c.model_copy(update={"efficiency": c.efficiency.model_copy(update={"link_bus": lowered})})
        for other in (profiled, fitted):  # calibrate's fit sets link_bus by model_copy (calibrate._with)
            assert link_bandwidth(other) / link_bandwidth(c) == pytest.approx(lowered / c.efficiency.link_bus)
            assert link_all_to_all_bandwidth(other) / link_all_to_all_bandwidth(c) == pytest.approx(
                lowered / c.efficiency.link_bus, rel=1e-12), gpu


def test_alltoall_across_domains_runs_near_nic_bus() -> None:
    """The NIC side is not given an all-to-all figure of its own: OCI's two-domain all-to-alls on InfiniBand / RoCE
    reach 0.96 (8x B300, 800 Gb/s per GPU: so NCCL's alltoall does drive a CX-8 at its 800 Gb/s) and 0.90 (GB200, 2
    racks) of line rate, within 5% of the catalog's nic_bus; 3 racks 0.84; GB300's 2-rack RoCE run 0.24 (its
    all-reduce across the same racks reached 738 GB/s busbw): too spread to set a value."""
    nic = efficiency_for("blackwell").nic_bus
    got = {(g, d): r for g, _, d, r in facts.alltoall_nic_crosscheck()}
    assert got[("b300", 2)] == pytest.approx(193.04 / 2 / 100)
    for key in (("b300", 2), ("gb200", 2)):
        assert got[key] == pytest.approx(nic, rel=0.05), key
    assert got[("gb200", 3)] < got[("gb200", 2)] and got[("gb300", 2)] < 0.5


def test_alltoall_bus_efficiency_prices_nccl_all_to_alls_only() -> None:
    """The alltoall dispatcher's NVLink all-to-all and a Ulysses / Mamba all_to_all inside one domain run at
    ``link_bus · a2a_link_ratio``; DeepEP / HybridEP (their own NVLink kernels) and the ring collectives keep
    ``link_bus``."""
    from cost_models.collectives import group_collective_time_s
    from cost_models.ep_comm import moe_all_to_all_parts

    c = build_cluster("gb200", 64)
    ring = c.model_copy(update={"efficiency": c.efficiency.model_copy(update={"a2a_link_ratio": None})})
    model, job = load_model("gpt-oss-120b"), JobSpec(global_batch_size=64, seq_len=8192)
    lat = 63 * c.gpu.link_latency_us * 1e-6
    for dispatcher, ratio in (("alltoall", 1 / c.efficiency.a2a_link_ratio), ("hybridep", 1.0)):
        now = moe_all_to_all_parts(model, c, job, 16384, 64, dispatcher=dispatcher)[0][0]
        before = moe_all_to_all_parts(model, ring, job, 16384, 64, dispatcher=dispatcher)[0][0]
        assert (now - lat) / (before - lat) == pytest.approx(ratio), dispatcher
    assert group_collective_time_s("all_to_all", 2**30, 8, 1, c) > group_collective_time_s("all_to_all", 2**30, 8, 1,
                                                                                         ring) * 1.05
    assert group_collective_time_s("all_gather", 2**30, 8, 1, c) == group_collective_time_s("all_gather", 2**30, 8, 1,
                                                                                          ring)


def test_b200_hbm_bandwidth_is_its_reported_memory_bus() -> None:
    """The catalog's B200 HBM rate is the driver-reported bus x clock (7.672 TB/s), not the datasheet's 8: every
    memory-bound kernel and the Blackwell generation's GEMM saturation dim (its ridge point) read it."""
    for gpu, width, clock, _ in facts.MEMORY_BUS:
        assert load_gpu(gpu).hbm_tbytes_per_s == pytest.approx(facts.hbm_tbytes_per_s(width, clock), rel=1e-4)
