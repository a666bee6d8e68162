"""Logical meshes: Megatron rank strides, which link each axis crosses, α-β per axis."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster
from cost_models.collectives import RankStrides, group_collective_time_s
from cost_models.errors import ConfigError
from search.mesh import AXIS_ORDER, LogicalMesh, MeshAxis


@pytest.fixture(scope="module")
def hgx():
    return build_cluster("h100-sxm", 1024)


@pytest.fixture(scope="module")
def nvl72():
    return build_cluster("gb200", 144)


def test_megatron_strides_tp_fastest_then_cp_ep_dp(hgx) -> None:
    mesh = LogicalMesh.from_degrees(hgx, dp=32, ep=4, cp=2, tp=4)
    assert mesh.axes == (MeshAxis.DP, MeshAxis.EP, MeshAxis.CP, MeshAxis.TP)
    assert mesh.sizes == (8, 4, 2, 4)  # ep folds inside dp: the dp axis keeps dp/ep ranks
    # dp at tp·cp, ep contiguous (Megatron's expert RankGenerator with expert-TP 1), cp at tp, tp at 1
    assert [mesh.stride(a) for a in AXIS_ORDER] == [4 * 2, 1, 4, 1]
    assert mesh.strides == RankStrides.megatron(4, 2, 32, 4)
    assert mesh.num_devices == 32 * 2 * 4
    assert mesh.label == "dp8×ep4×cp2×tp4"


def test_size_one_axes_dropped(hgx) -> None:
    mesh = LogicalMesh.from_degrees(hgx, dp=16, tp=8)
    assert mesh.axes == (MeshAxis.DP, MeshAxis.TP) and mesh.size(MeshAxis.CP) == 1
    assert mesh.data_axes == (MeshAxis.DP,)
    assert LogicalMesh.from_degrees(hgx, dp=1).axes == (MeshAxis.DP,)


def test_links_on_hgx(hgx) -> None:
    mesh = LogicalMesh.from_degrees(hgx, dp=16, tp=8)
    tp, dp = mesh.link(MeshAxis.TP), mesh.link(MeshAxis.DP)
    assert (tp.link, tp.n_inner, tp.n_outer) == ("nvlink", 8, 1)
    assert (dp.link, dp.n_inner, dp.n_outer) == ("nic", 1, 16)
    # α/β from the catalog: NVLink 450 GB/s × link_bus, NIC 400 Gb/s × nic_bus.
    assert tp.beta_inner_s_per_byte == pytest.approx(1 / (450e9 * hgx.efficiency.link_bus))
    assert dp.beta_outer_s_per_byte == pytest.approx(1 / (50e9 * hgx.efficiency.nic_bus))
    assert tp.alpha_inner_s == pytest.approx(hgx.gpu.link_latency_us * 1e-6)
    wide = LogicalMesh.from_degrees(hgx, dp=8, tp=16).link(MeshAxis.TP)
    assert (wide.link, wide.n_inner, wide.n_outer) == ("nvlink+nic", 8, 2) and wide.crosses_domain


def test_cp_inside_and_outside_the_domain(hgx, nvl72) -> None:
    assert LogicalMesh.from_degrees(hgx, dp=8, cp=2, tp=4).link(MeshAxis.CP).link == "nvlink"
    assert LogicalMesh.from_degrees(hgx, dp=8, cp=4, tp=8).link(MeshAxis.CP).link == "nic"
    assert LogicalMesh.from_degrees(nvl72, dp=4, tp=18).link(MeshAxis.TP).link == "nvlink"
    # 16 does not divide 72: the tp group at ranks 64–79 straddles two racks, so the axis crosses domains.
    assert LogicalMesh.from_degrees(nvl72, dp=4, tp=16).link(MeshAxis.TP).crosses_domain


def test_collective_time_is_the_cost_model_on_the_axis_group(hgx) -> None:
    mesh = LogicalMesh.from_degrees(hgx, dp=16, tp=8)
    payload = 128 * 2**20
    for axis in mesh.axes:
        assert mesh.collective_time_s("all_reduce", payload, axis) == pytest.approx(
            group_collective_time_s("all_reduce", payload, mesh.size(axis), mesh.stride(axis), hgx))
    # dp·tp together is one 128-rank group at stride 1 (hierarchical), cheaper than dp alone per byte.
    both = mesh.collective_time_multi_s("all_reduce", payload, (MeshAxis.DP, MeshAxis.TP))
    assert both == pytest.approx(group_collective_time_s("all_reduce", payload, 128, 1, hgx))
    assert both < mesh.collective_time_s("all_reduce", payload, MeshAxis.DP)
    assert mesh.collective_time_multi_s("all_reduce", payload, ()) == 0.0


def test_bad_degrees(hgx) -> None:
    with pytest.raises(ConfigError, match="ep=3 must divide dp=16"):
        LogicalMesh.from_degrees(hgx, dp=16, ep=3, tp=8)
    with pytest.raises(ConfigError, match="exceeds num_gpus=1024"):
        LogicalMesh.from_degrees(hgx, dp=256, tp=8)
