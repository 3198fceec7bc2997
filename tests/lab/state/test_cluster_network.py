# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The converged lab's cluster network, checked from outside the hosts (molecule verify).

Runs against the two Podman hosts directly (testinfra's podman backend), so it
sees what an operator would see with `podman exec`, not what Ansible reported.
Read-only.
"""

from __future__ import annotations

import pytest
import testinfra

from lab.harness import CLUSTER_ADDRESSES, CLUSTER_IF, CLUSTER_PREFIX, HEAD, HOSTS, WORKER

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]


@pytest.fixture(params=sorted(HOSTS), scope="module")
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
    assert settings == ["9000", "manual", f"{CLUSTER_ADDRESSES[name]}/{CLUSTER_PREFIX}", "yes"]


def test_cluster_interface_runs_jumbo_frames(node):
    name, host = node
    assert host.interface(CLUSTER_IF).exists
    mtu = host.check_output(f"cat /sys/class/net/{CLUSTER_IF}/mtu")
    assert mtu == "9000", f"{name}: {CLUSTER_IF} MTU is {mtu}"
    assert CLUSTER_ADDRESSES[name] in host.interface(CLUSTER_IF).addresses


def test_management_interface_is_left_alone(node):
    _, host = node
    assert host.check_output("nmcli -g GENERAL.STATE device show eth0").startswith("10 ")


def test_jumbo_frames_cross_the_link_unfragmented():
    head = testinfra.get_host(f"podman://{HEAD}")
    result = head.run(f"ping -c 2 -W 2 -M do -s 8972 {CLUSTER_ADDRESSES[WORKER]}")
    assert result.rc == 0, result.stdout + result.stderr
