"""The converged lab, checked from outside the hosts (molecule verify).

Runs against the two Podman hosts directly (testinfra's podman backend), so it
sees what an operator would see with `podman exec`, not what Ansible reported.
"""

from __future__ import annotations

import pytest
import testinfra

pytestmark = pytest.mark.lab

CLUSTER_IF = "enp1s0f0np0"
ADDRESSES = {"spark-head": "10.77.0.11/24", "spark-worker": "10.77.0.12/24"}


@pytest.fixture(params=sorted(ADDRESSES), scope="module")
def node(request):
    return request.param, testinfra.get_host(f"podman://{request.param}")


def test_cluster_interface_is_owned_by_networkmanager(node):
    name, host = node
    profile = host.check_output(f"nmcli -g GENERAL.CONNECTION device show {CLUSTER_IF}")
    assert profile, f"{name}: no NetworkManager profile is active on {CLUSTER_IF}"
    settings = host.check_output(
        f"nmcli -g 802-3-ethernet.mtu,ipv4.method,ipv4.addresses,ipv4.never-default "
        f"connection show '{profile}'"
    ).splitlines()
    assert settings == ["9000", "manual", ADDRESSES[name], "yes"]


def test_cluster_interface_runs_jumbo_frames(node):
    name, host = node
    assert host.interface(CLUSTER_IF).exists
    mtu = host.check_output(f"cat /sys/class/net/{CLUSTER_IF}/mtu")
    assert mtu == "9000", f"{name}: {CLUSTER_IF} MTU is {mtu}"
    assert ADDRESSES[name].split("/")[0] in host.interface(CLUSTER_IF).addresses


def test_management_interface_is_left_alone(node):
    _, host = node
    assert host.check_output("nmcli -g GENERAL.STATE device show eth0").startswith("10 ")


def test_jumbo_frames_cross_the_link_unfragmented():
    head = testinfra.get_host("podman://spark-head")
    worker_ip = ADDRESSES["spark-worker"].split("/")[0]
    result = head.run(f"ping -c 2 -W 2 -M do -s 8972 {worker_ip}")
    assert result.rc == 0, result.stdout + result.stderr
