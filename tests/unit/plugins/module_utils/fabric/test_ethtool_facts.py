# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._ethtool_facts import (
    EthtoolParseError,
    parse_driver,
    parse_settings,
    speed_mbps,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "ethtool"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10000Mb/s", 10000),
        ("100000Mb/s", 100000),
        ("200Gb/s", 200000),
        ("Unknown!", None),
        (None, None),
    ],
)
def test_speed(value, expected):
    assert speed_mbps(value) == expected


@pytest.mark.parametrize(
    ("name", "link", "speed", "duplex"),
    [
        ("veth-mtu9000.txt", True, 10000, "full"),
        ("veth-peer-down.txt", False, 10000, "full"),  # veth keeps its nominal speed
        ("virtio-speed-unknown.txt", True, None, None),
    ],
)
def test_settings_recorded(name, link, speed, duplex):
    settings = parse_settings(fixture(name))
    assert settings["link_detected"] is link
    assert settings["speed_mbps"] == speed
    assert settings["duplex"] == duplex


@pytest.mark.parametrize(
    ("name", "driver", "bus"),
    [
        ("veth-mtu9000-i.txt", "veth", None),
        ("virtio-speed-unknown-i.txt", "virtio_net", "0000:00:03.0"),
    ],
)
def test_driver_recorded(name, driver, bus):
    info = parse_driver(fixture(name))
    assert info["driver"] == driver
    assert info["bus_info"] == bus
    assert info["firmware_version"] is None


def test_not_ethtool_output():
    with pytest.raises(EthtoolParseError):
        parse_settings("netlink error: no device matches name (offset 24)\n")
    with pytest.raises(EthtoolParseError):
        parse_driver("")
