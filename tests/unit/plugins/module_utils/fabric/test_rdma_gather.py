# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The RDMA devices read from ibv_devinfo and sysfs (module_utils/fabric/_rdma_gather.py).

Names read from the node become sysfs paths: a netdev or HCA name that breaks the kernel's
naming rule is dropped, never used; a device's netdev comes from sysfs only when it has
exactly one; the IPv4 addresses come from ``ip -j``, and output that is not what ip prints is
no address. The recorded DGX Spark trees are test_judge.py's and
tests/unit/plugins/modules/test_rdma_facts.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import Runner
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import Absent
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import _rdma_gather
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule


@pytest.mark.parametrize(
    ("name", "kept"),
    [("enp1s0f0np0", True), ("../../etc", False), ("", False), (None, False)],
    ids=["a netdev", "a path", "empty", "none"],
)
def test_a_netdev_name_from_sysfs_is_kept_only_when_valid(name, kept):
    assert _rdma_gather._valid_netdev(name) == (name if kept else None)


@pytest.mark.parametrize(
    ("name", "kept"),
    [("rocep1s0f0", True), ("mlx5_0", True), ("../x", False), ("a b", False)],
    ids=["RoCE", "mlx5", "a path", "a space"],
)
def test_an_hca_name_from_ibv_devinfo_is_kept_only_when_valid(name, kept):
    assert _rdma_gather._valid_hca(name) == (name if kept else None)


def test_a_device_has_a_sysfs_netdev_only_when_it_has_exactly_one(tmp_path):
    net = tmp_path / "class" / "infiniband" / "rocep1s0f0" / "device" / "net"
    net.mkdir(parents=True)
    assert _rdma_gather._sysfs_netdev(str(tmp_path), "rocep1s0f0") is None
    (net / "enp1s0f0np0").mkdir()
    assert _rdma_gather._sysfs_netdev(str(tmp_path), "rocep1s0f0") == "enp1s0f0np0"
    (net / "enp1s0f1np1").mkdir()
    assert _rdma_gather._sysfs_netdev(str(tmp_path), "rocep1s0f0") is None


@pytest.mark.parametrize(
    ("output", "addresses"),
    [
        ('[{"addr_info": [{"family": "inet", "local": "10.77.0.12"}, {"family": "inet6", "local": "fe80::1"}]}]',
         ["10.77.0.12"]),
        ("not json", []),
        ('{"addr_info": []}', []),
    ],
    ids=["ip -j output", "not JSON", "not a list"],
)
def test_ipv4_addresses_come_from_ip_json(tmp_path, output, addresses):
    ip = tmp_path / "ip"
    ip.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    ip.chmod(0o755)
    module = FakeModule({}, bins={"ip": str(ip)})
    assert _rdma_gather._ipv4_addresses(module, Runner(10), "enp1s0f0np0") == addresses
    assert _rdma_gather._ipv4_addresses(FakeModule({}), Runner(10), "enp1s0f0np0") == []  # no ip


def test_no_ibv_devinfo_is_absent(tmp_path):
    params = {"ibv_devinfo": str(tmp_path / "ibv_devinfo"), "sys_root": str(tmp_path), "devices": []}
    with pytest.raises(Absent, match="not found in PATH"):
        _rdma_gather.facts(FakeModule(params), Runner(10))
