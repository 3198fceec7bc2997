# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.modules import ethtool_facts
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

FIXTURES = Path(__file__).resolve().parents[3] / "unit" / "fixtures" / "ethtool"


@pytest.fixture
def veth_host(tmp_path: Path) -> tuple[Path, Path]:
    """A sysfs tree with the lab's cluster interface and an ethtool printing the recorded veth."""
    net = tmp_path / "sys" / "class" / "net" / "enp1s0f0np0"
    net.mkdir(parents=True)
    (net / "mtu").write_text("9000\n")
    (net / "operstate").write_text("up\n")
    (net / "address").write_text("5e:3c:11:a0:42:07\n")
    script = tmp_path / "ethtool"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in\n'
        f'  "enp1s0f0np0") sed "s/^Settings for .*/Settings for enp1s0f0np0:/" {FIXTURES}/veth-mtu9000.txt ;;\n'
        f'  "-i enp1s0f0np0") cat {FIXTURES}/veth-mtu9000-i.txt ;;\n'
        '  *) echo "unexpected argv: $*" >&2; exit 9 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return tmp_path / "sys", script


def test_recorded_veth(veth_host):
    sys_root, script = veth_host
    result = run_module(
        ethtool_facts,
        {"interfaces": ["enp1s0f0np0"], "sys_root": str(sys_root), "ethtool": str(script)},
    )
    assert not result.failed, result.result
    entry = result.result["ansible_facts"]["ethtool"]["enp1s0f0np0"]
    assert entry == {
        "link_detected": True,
        "speed_mbps": 10000,
        "speed_raw": "10000Mb/s",
        "duplex": "full",
        "port": "Twisted Pair",
        "autoneg": False,
        "driver": "veth",
        "driver_version": "1.0",
        "firmware_version": None,
        "bus_info": None,
        "mtu": 9000,
        "operstate": "up",
        "mac_address": "5e:3c:11:a0:42:07",
    }


def test_unknown_interface_is_named(veth_host):
    sys_root, script = veth_host
    result = run_module(
        ethtool_facts,
        {
            "interfaces": ["enp1s0f0np0", "enp9s9"],
            "sys_root": str(sys_root),
            "ethtool": str(script),
        },
    )
    assert result.failed
    assert "enp9s9" in result.result["msg"]
    assert "present: enp1s0f0np0" in result.result["msg"]


@pytest.mark.skipif(shutil.which("ethtool") is None, reason="ethtool not installed")
def test_real_ethtool_on_loopback():
    result = run_module(ethtool_facts, {"interfaces": ["lo"]}, check_mode=True)
    assert not result.failed, result.result
    assert result.result["ansible_facts"]["ethtool"]["lo"]["link_detected"] is True
    assert result.result["ansible_facts"]["ethtool"]["lo"]["mtu"] == 65536
