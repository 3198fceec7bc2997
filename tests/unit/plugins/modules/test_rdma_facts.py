# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""rdma_facts end to end with the lab stand-ins: the recorded DGX Spark
ibv_devinfo and a sysfs GID tree written by make-rdma-sysfs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import _rdma_gather
from ansible_collections.localinference.vllm.plugins.modules import rdma_facts
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

STANDINS = Path(__file__).resolve().parents[4] / "lab" / "standins" / "bin"


def make_tree(root: Path, first_index: int = 2) -> Path:
    subprocess.run(
        [
            str(STANDINS / "make-rdma-sysfs"),
            "--root",
            str(root),
            "--ipv4-first-index",
            str(first_index),
            "--port",
            "rocep1s0f0=enp1s0f0np0=10.77.0.12",
            "--port",
            "roceP2p1s0f0=enP2p1s0f0np0=10.77.1.12",
        ],
        check=True,
    )
    return root


@pytest.fixture
def addresses(monkeypatch):
    """The one thing the controller lacks: the lab interfaces and their addresses."""
    table = {"enp1s0f0np0": ["10.77.0.12"], "enP2p1s0f0np0": ["10.77.1.12"]}
    monkeypatch.setattr(
        _rdma_gather, "_ipv4_addresses", lambda module, runner, netdev: table.get(netdev, [])
    )


@pytest.mark.parametrize(("first_index", "gid_index"), [(2, 3), (6, 7)])
def test_spark_twins_with_gid_index(tmp_path, addresses, first_index, gid_index):
    root = make_tree(tmp_path / "sys", first_index)
    result = run_module(
        rdma_facts,
        {"ibv_devinfo": str(STANDINS / "ibv_devinfo"), "sys_root": str(root)},
        check_mode=True,
    )
    assert not result.failed, result.result
    rdma = result.result["ansible_facts"]["rdma"]
    assert rdma["present"] is True
    assert rdma["netdev_to_hca"] == {
        "enp1s0f0np0": {"hca": "rocep1s0f0", "port": "1"},
        "enP2p1s0f0np0": {"hca": "roceP2p1s0f0", "port": "1"},
    }
    port = rdma["devices"]["rocep1s0f0"]["ports"]["1"]
    assert (port["state"], port["active_mtu"], port["max_mtu"], port["link_layer"]) == (
        "PORT_ACTIVE",
        4096,
        4096,
        "Ethernet",
    )
    assert port["gid_source"] == "sysfs"
    assert port["roce_v2_gid_index"] == gid_index
    assert port["roce_v2_gid"] == "0000:0000:0000:0000:0000:ffff:0a4d:000c"
    assert rdma["devices"]["roceP2p1s0f0"]["ports"]["1"]["roce_v2_gid_index"] == gid_index
    # the cabled-elsewhere twins have no GID tree and no netdev here
    assert rdma["devices"]["rocep1s0f1"]["ports"]["1"]["state"] == "PORT_DOWN"
    assert rdma["devices"]["rocep1s0f1"]["ports"]["1"]["roce_v2_gid_index"] is None


def test_device_filter_and_unknown_device(tmp_path, addresses):
    root = make_tree(tmp_path / "sys")
    args = {"ibv_devinfo": str(STANDINS / "ibv_devinfo"), "sys_root": str(root)}
    result = run_module(rdma_facts, args | {"devices": ["rocep1s0f0"]})
    assert list(result.result["ansible_facts"]["rdma"]["devices"]) == ["rocep1s0f0"]
    result = run_module(rdma_facts, args | {"devices": ["mlx5_0"]})
    assert result.failed
    assert "mlx5_0" in result.result["msg"]


def test_no_rdma_stack(tmp_path):
    result = run_module(rdma_facts, {"ibv_devinfo": str(tmp_path / "missing")})
    assert not result.failed
    assert result.result["ansible_facts"]["rdma"]["present"] is False
    result = run_module(rdma_facts, {"ibv_devinfo": str(tmp_path / "missing"), "required": True})
    assert result.failed
