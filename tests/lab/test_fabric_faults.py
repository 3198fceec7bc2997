# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fabric stage against the real lab: NetworkManager, veth at MTU 9000, real
jumbo pings; RDMA from the stand-ins (lab/standins).

1. A clean run passes and a second run changes nothing (community.general.nmcli
   MTU idempotence).
2. F19: the worker's cluster MTU is set to 1500 behind the collection's back
   (``ip link set``); the fabric run fails with "1472 passes while 8972 fails".
   Afterwards the profile is re-activated and a run passes again.
3. F20: the worker's RoCE v2 GID for its address moves from index 3 to 7; the
   run passes and publishes NCCL_IB_GID_INDEX 7 for the worker, 3 for the head.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "fabric.yml"
INVENTORY = ROOT / "inventories" / "lab" / "hosts.yml"
HEAD, WORKER = "spark-head", "spark-worker"
IFNAME = "enp1s0f0np0"
PROFILE = f"localinference-{IFNAME}"
STANDINS = "/opt/localinference-standins"
F19 = "1472 passes while 8972 fails"
LAB_DEFAULTS = {
    "cluster_network_expected_speed_mbps": 10000,
    "cluster_network_rdma_sys_root": f"{STANDINS}/sys",
}


def _lab_running() -> bool:
    if shutil.which("podman") is None:
        return False
    out = subprocess.run(
        ["podman", "ps", "--format", "{{.Names}}"], capture_output=True, text=True, check=False
    )
    return HEAD in out.stdout.split() and WORKER in out.stdout.split()


pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(not _lab_running(), reason="needs the lab hosts (make lab-up / make lab)"),
]


def podman_exec(host: str, *argv: str) -> str:
    return subprocess.run(
        ["podman", "exec", host, *argv], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def fabric(*extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    # The inventory carries cluster_network_expected_speed_mbps and the stand-in sysfs
    # root; the -e defaults below only apply if it does not (older lab inventories).
    argv = [
        str(ROOT / ".venv" / "bin" / "ansible-playbook"),
        "-i",
        str(INVENTORY),
        str(PLAYBOOK),
        *extra,
    ]
    inventory_text = "".join(path.read_text() for path in INVENTORY.parent.rglob("*.yml"))
    for name, value in LAB_DEFAULTS.items():
        if name not in inventory_text:
            argv += ["-e", f"{name}={value}"]
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600, check=False
    )


def recap(output: str) -> dict[str, dict[str, int]]:
    hosts = {}
    for line in output.splitlines():
        if line.startswith((HEAD, WORKER)) and "ok=" in line:
            name, _, counters = line.partition(":")
            hosts[name.strip()] = {
                k: int(v) for k, v in (item.split("=") for item in counters.split())
            }
    return hosts


def worker_mtu() -> int:
    return json.loads(podman_exec(WORKER, "ip", "-j", "link", "show", "dev", IFNAME))[0]["mtu"]


def test_clean_run_is_idempotent():
    first = fabric()
    assert first.returncode == 0, first.stdout[-3000:]
    second = fabric()
    assert second.returncode == 0, second.stdout[-3000:]
    counts = recap(second.stdout)
    assert counts[HEAD]["changed"] == 0 and counts[WORKER]["changed"] == 0, second.stdout[-3000:]
    # seen from outside: NetworkManager owns the link at MTU 9000 on both ends
    for host in (HEAD, WORKER):
        assert (
            podman_exec(
                host, "nmcli", "-g", "802-3-ethernet.mtu", "connection", "show", PROFILE
            ).strip()
            == "9000"
        )
        assert (
            podman_exec(
                host, "nmcli", "-g", "ipv4.never-default", "connection", "show", PROFILE
            ).strip()
            == "yes"
        )
        assert (
            json.loads(podman_exec(host, "ip", "-j", "link", "show", "dev", IFNAME))[0]["mtu"]
            == 9000
        )


def test_f19_mtu_changed_behind_the_collections_back():
    podman_exec(WORKER, "ip", "link", "set", "dev", IFNAME, "mtu", "1500")
    try:
        result = fabric()
        assert result.returncode != 0
        assert F19 in result.stdout, result.stdout[-3000:]
        assert "running MTU 1500, expected 9000" in result.stdout
        # the role reported the drift and did not hide it by re-applying
        assert worker_mtu() == 1500
    finally:
        podman_exec(WORKER, "nmcli", "connection", "up", PROFILE)
    assert worker_mtu() == 9000
    again = fabric()
    assert again.returncode == 0, again.stdout[-3000:]


def test_f20_gid_index_differs_per_node():
    address = "10.77.0.12"
    tree = [
        f"{STANDINS}/bin/make-rdma-sysfs",
        "--root",
        f"{STANDINS}/sys",
        "--port",
        f"rocep1s0f0={IFNAME}={address}",
        "--port",
        "roceP2p1s0f0=enP2p1s0f0np0",
    ]
    podman_exec(WORKER, *tree, "--ipv4-first-index", "6")
    try:
        result = fabric()
        assert result.returncode == 0, result.stdout[-3000:]
        assert "spark-worker: {'VLLM_HOST_IP': '10.77.0.12'" in result.stdout.replace(
            "''", "'"
        ).replace("\n        ", " ")
        env_lines = result.stdout.replace("''", "'").replace("\n        ", " ")
        assert "'NCCL_IB_GID_INDEX': '7'" in env_lines.split("spark-worker: {")[1].split("}")[0]
        assert "'NCCL_IB_GID_INDEX': '3'" in env_lines.split("spark-head: {")[1].split("}")[0]
    finally:
        podman_exec(WORKER, *tree)
