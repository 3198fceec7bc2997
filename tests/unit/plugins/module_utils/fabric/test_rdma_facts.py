# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._rdma_facts import (
    RdmaParseError,
    gid_ipv4,
    gid_table,
    normalize_gid_type,
    parse_ibv_devinfo,
    parse_show_gids,
    rdma_device_name,
    roce_v2_ipv4_index,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "ibv_devinfo"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_spark_twins_active():
    devices = parse_ibv_devinfo(fixture("dgx-spark-cx7-twins-active.txt"))
    assert sorted(devices) == ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    port = devices["rocep1s0f0"]["ports"]["1"]
    assert port["state"] == "PORT_ACTIVE"
    assert port["max_mtu"] == 4096
    assert port["active_mtu"] == 4096
    assert port["link_layer"] == "Ethernet"
    assert devices["roceP2p1s0f0"]["ports"]["1"]["state"] == "PORT_ACTIVE"
    assert devices["rocep1s0f1"]["ports"]["1"]["state"] == "PORT_DOWN"
    assert devices["rocep1s0f1"]["ports"]["1"]["active_mtu"] == 1024
    assert devices["rocep1s0f0"]["vendor_part_id"] == "4129"
    assert devices["rocep1s0f0"]["fw_ver"] == "28.45.4028"
    assert devices["rocep1s0f0"]["phys_port_cnt"] == 1


def test_spark_cable_in_port_1():
    devices = parse_ibv_devinfo(fixture("dgx-spark-cx7-port0-down.txt"))
    assert devices["rocep1s0f0"]["ports"]["1"]["state"] == "PORT_DOWN"
    assert devices["roceP2p1s0f1"]["ports"]["1"]["state"] == "PORT_ACTIVE"


def test_verbose_output_with_gids():
    devices = parse_ibv_devinfo(fixture("mlx5-cx6dx-vv.txt"))
    port = devices["mlx5_bond_0"]["ports"]["1"]
    assert port["state"] == "PORT_ACTIVE"
    assert port["phys_state"] == "LINK_UP"
    assert port["active_width"] == "2X (16)"
    assert port["active_speed"] == "50.0 Gbps (64)"
    assert port["gids"]["3"] == {
        "gid": "::ffff:27.105.179.3",
        "type": "RoCE v2",
        "netdev": None,
        "ipv4": "27.105.179.3",
    }
    assert port["gids"]["0"]["type"] == "RoCE v1"
    assert roce_v2_ipv4_index(port["gids"], ["27.105.179.3"]) == 3
    # device-level capability lines are not mistaken for port fields
    assert "max_qp" not in port


def test_spark_verbose_port_excerpt_fields():
    # the four lines published from `ibv_devinfo -d rocep1s0f0 -v` on a Spark
    text = "hca_id:\trocep1s0f0\n\t\tport:\t1\n" + "".join(
        "\t\t\t" + line + "\n" for line in fixture("dgx-spark-cx7-v-port-excerpt.txt").splitlines()
    )
    port = parse_ibv_devinfo(text)["rocep1s0f0"]["ports"]["1"]
    assert port == {
        "gids": {},
        "state": "PORT_ACTIVE",
        "phys_state": "LINK_UP",
        "active_width": "2X (16)",
        "active_speed": "100.0 Gbps (128)",
    }


def test_not_ibv_devinfo():
    with pytest.raises(RdmaParseError):
        parse_ibv_devinfo("Failed to get IB devices list: Function not implemented\n")


def test_show_gids_recorded_spark_rows():
    rows = parse_show_gids(fixture("dgx-spark-show_gids-rows.txt"))
    assert rows == [
        {
            "device": "rocep1s0f0",
            "port": "1",
            "index": 1,
            "gid": "fe80:0000:0000:0000:4ebb:47ff:fee8:9f39",
            "ipv4": None,
            "type": "RoCE v2",
            "netdev": "enp1s0f0np0",
        },
        {
            "device": "rocep1s0f0",
            "port": "1",
            "index": 3,
            "gid": "0000:0000:0000:0000:0000:ffff:c0a8:640a",
            "ipv4": "192.168.100.10",
            "type": "RoCE v2",
            "netdev": "enp1s0f0np0",
        },
    ]


@pytest.mark.parametrize(
    ("gid", "ipv4"),
    [
        ("0000:0000:0000:0000:0000:ffff:c0a8:640a", "192.168.100.10"),
        ("::ffff:27.105.179.3", "27.105.179.3"),
        ("fe80:0000:0000:0000:4ebb:47ff:fee8:9f39", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_gid_ipv4(gid, ipv4):
    assert gid_ipv4(gid) == ipv4


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("RoCE v2", "RoCE v2"),
        ("v2", "RoCE v2"),
        ("IB/RoCE v1", "RoCE v1"),
        ("v1", "RoCE v1"),
        (None, None),
    ],
)
def test_gid_type(raw, normal):
    assert normalize_gid_type(raw) == normal


def _sysfs(first_ipv4_index: int, ipv4_hex: str = "c0a8:640a", netdev: str = "enp1s0f0np0"):
    link_local = "fe80:0000:0000:0000:4ebb:47ff:fee8:9f39"
    mapped = f"0000:0000:0000:0000:0000:ffff:{ipv4_hex}"
    entries = {
        "0": {"gid": link_local, "type": "IB/RoCE v1", "netdev": netdev},
        "1": {"gid": link_local, "type": "RoCE v2", "netdev": netdev},
    }
    for index in range(2, 8):
        entries[str(index)] = {
            "gid": "0000:0000:0000:0000:0000:0000:0000:0000",
            "type": None,
            "netdev": None,
        }
    entries[str(first_ipv4_index)] = {"gid": mapped, "type": "IB/RoCE v1", "netdev": netdev}
    entries[str(first_ipv4_index + 1)] = {"gid": mapped, "type": "RoCE v2", "netdev": netdev}
    return entries


# F20: the same address sits at a different index on another node
@pytest.mark.parametrize(
    ("first", "addresses", "netdev", "expected"),
    [
        (2, ["192.168.100.10"], "enp1s0f0np0", 3),
        (4, ["192.168.100.10"], "enp1s0f0np0", 5),
        (2, ["192.168.100.11"], "enp1s0f0np0", None),  # GID of another address
        (2, ["192.168.100.10"], "enP2p1s0f0np0", None),  # GID belongs to another netdev
        (2, [], "enp1s0f0np0", None),  # interface has no IPv4 yet
    ],
)
def test_roce_v2_index_from_sysfs_table(first, addresses, netdev, expected):
    table = gid_table(_sysfs(first))
    assert "6" not in table or first >= 5  # zero slots are dropped
    assert roce_v2_ipv4_index(table, addresses, netdev) == expected


@pytest.mark.parametrize("name", ["rocep1s0f0", "roceP2p1s0f0", "mlx5_0", "m" * 63])
def test_valid_rdma_device_names(name):
    assert rdma_device_name("devices[0]", name) == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "devices[0]: is empty"),
        ("..", "devices[0]: '..' is not an RDMA device name"),
        ("../../etc", "devices[0]: contains '/'"),
        ("mlx5 0", "devices[0]: contains ' '"),
        ("mlx5_0\n", "devices[0]: contains '\\n'"),
        ("m" * 64, "longer than 63 bytes"),
        (["mlx5_0"], "expected text"),
    ],
)
def test_invalid_rdma_device_names(name, message):
    with pytest.raises(ValidationError) as caught:
        rdma_device_name("devices[0]", name)
    assert message in str(caught.value)
