# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel object names: what may become a sysfs path or a command argument."""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils._names import (
    InvalidName,
    interface_name,
    rdma_device_name,
)


@pytest.mark.parametrize("name", ["lo", "enp1s0f0np0", "enP2p1s0f0np0", "a" * 15, "veth-lab.10"])
def test_valid_interface_names(name):
    assert interface_name(name) == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "name is empty"),
        ("..", "directory reference"),
        (".", "directory reference"),
        ("../../etc", "contains '/'"),
        ("eth0/..", "contains '/'"),
        ("a" * 16, "at most 15"),
        ("eth 0", "contains ' '"),
        ("eth0\n", "contains '\\n'"),
        ("eth0:1", "contains ':'"),
        (None, "must be a string"),
    ],
)
def test_invalid_interface_names(name, message):
    with pytest.raises(InvalidName, match="interfaces\\[2\\]") as caught:
        interface_name(name, "interfaces[2]")
    assert message in str(caught.value)


def test_rdma_device_names_are_longer_but_as_strict():
    assert rdma_device_name("mlx5_" + "a" * 58) == "mlx5_" + "a" * 58
    with pytest.raises(InvalidName, match="at most 63"):
        rdma_device_name("a" * 64)
    with pytest.raises(InvalidName, match=r"devices: .*contains '/'"):
        rdma_device_name("../rocep1s0f0")
