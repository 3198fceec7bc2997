# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The twin endpoints of one cable, recognised on a real DGX Spark's ``ibv_devinfo``.

``dgx-spark-cx7-twins-active.txt`` (tests/unit/fixtures/README.md has its source) is a
Spark with the cable in port 0: ``rocep1s0f0`` and ``roceP2p1s0f0`` PORT_ACTIVE, the
port-1 pair down. An HCA list with one of the active pair is a warning with the
measured consequence; both, or the down pair, are not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import _judge
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._rdma_facts import (
    parse_ibv_devinfo,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._twins import (
    half_cable_findings,
    twin_pairs,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "ibv_devinfo"


def _rdma(name: str) -> dict:
    return {"devices": parse_ibv_devinfo((FIXTURES / name).read_text())}


def test_the_two_endpoints_of_each_port_are_twins():
    assert twin_pairs(_rdma("dgx-spark-cx7-twins-active.txt")) == [
        ["rocep1s0f0", "roceP2p1s0f0"],
        ["rocep1s0f1", "roceP2p1s0f1"],
    ]


def test_the_peer_spark_has_the_same_twins():
    assert twin_pairs(_rdma("dgx-spark-cx7-port0-down.txt")) == [
        ["rocep1s0f0", "roceP2p1s0f0"],
        ["rocep1s0f1", "roceP2p1s0f1"],
    ]


def test_other_adapters_have_no_twins():
    assert twin_pairs(_rdma("mlx5-cx6dx-vv.txt")) == []
    assert twin_pairs({}) == []


@pytest.mark.parametrize(
    ("hcas", "warned"),
    [
        (["rocep1s0f0"], ["roceP2p1s0f0"]),
        (["roceP2p1s0f0"], ["rocep1s0f0"]),
        (["rocep1s0f0", "roceP2p1s0f0"], []),
        (["rocep1s0f1"], []),  # its twin is down: nothing more to list
        ([], []),
    ],
)
def test_one_of_two_is_a_warning_with_the_measured_consequence(hcas, warned):
    found = half_cable_findings(_rdma("dgx-spark-cx7-twins-active.txt"), hcas, "spark-a", "NCCL_IB_HCA")
    assert [f["severity"] for f in found] == ["warning"] * len(warned)
    for f, missing in zip(found, warned, strict=True):
        assert f["id"] == "twin"
        assert f"but not {missing}" in f["message"]
        assert "13.6 GB/s" in f["message"] and "23.7" in f["message"]
        assert "cluster_network_interfaces" in f["fix"]


def test_the_fabric_stage_warns_when_the_inventory_names_one_endpoint():
    rdma = _rdma("dgx-spark-cx7-twins-active.txt")
    rdma["netdev_to_hca"] = {"enp1s0f0np0": {"hca": "rocep1s0f0", "port": "1"}}
    cfg = _judge.config(
        {
            "interfaces": [{"ifname": "enp1s0f0np0", "address": "192.168.100.10/24"}],
            "mtu": 9000,
            "expected_speed_mbps": 100000,
            "rdma_required": True,
            "rdma_active_mtu": 4096,
        }
    )
    twins = [f for f in _judge.findings(cfg, "spark-a", {}, rdma) if f["id"] == "twin"]
    assert len(twins) == 1
    assert twins[0]["message"].startswith(
        "NCCL_IB_HCA (the HCAs behind cluster_network_interfaces) names rocep1s0f0 but not roceP2p1s0f0"
    )
    result = _judge.publish(cfg, {}, rdma, twins)["result"]
    assert result["twins"] == [["rocep1s0f0", "roceP2p1s0f0"], ["rocep1s0f1", "roceP2p1s0f1"]]
