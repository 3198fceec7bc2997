# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight stage against the real lab hosts.

1. A clean run passes and names the weakest rank.
2. F4: the worker's /dev/shm is filled past preflight_min_shm_free_gib; the run
   fails with the weakest-rank table marking the worker FAIL. Cleaned up after.
3. F5 saturated: the worker is frozen (``podman pause``: its kernel still
   answers ping over the cluster link, no process runs), as a node at load 278
   behaves; the run classifies it SATURATED, not down.
4. F5 unreachable: the worker's cluster link is taken down and the worker is
   frozen; nothing answers, the run classifies it UNREACHABLE.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "preflight.yml"
INVENTORY = ROOT / "inventories" / "lab" / "hosts.yml"
HEAD, WORKER = "spark-head", "spark-worker"
FILLER = "/dev/shm/localinference-preflight-fault"
# Lab values the inventory should carry; applied only when it does not.
LAB_DEFAULTS = {
    "preflight_min_free_memory_gib": 1,
    "preflight_max_load_per_cpu": 1000,
    "preflight_patient_timeout": 15,
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


def podman(*argv: str, check: bool = True) -> str:
    return subprocess.run(
        ["podman", *argv], capture_output=True, text=True, check=check, timeout=120
    ).stdout


def preflight() -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(INVENTORY), str(PLAYBOOK)]
    inventory_text = "".join(path.read_text() for path in INVENTORY.parent.rglob("*.yml"))
    for name, value in LAB_DEFAULTS.items():
        if name not in inventory_text:
            argv += ["-e", f"{name}={value}"]
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900, check=False
    )


def row(output: str, host: str) -> str:
    rows = [
        line
        for line in output.splitlines()
        if line[4:].startswith(host + " ") and "GiB" not in line
    ]
    assert rows, output[-3000:]
    return rows[-1]


def test_clean_run_names_the_weakest_rank():
    result = preflight()
    assert result.returncode == 0, result.stdout[-3000:]
    assert "Preflight passed." in result.stdout
    assert "Weakest rank: spark-" in result.stdout


def test_f4_shm_filled_on_the_worker():
    podman("exec", WORKER, "fallocate", "-l", "1536M", FILLER)
    try:
        result = preflight()
    finally:
        podman("exec", WORKER, "rm", "-f", FILLER)
    assert result.returncode != 0
    assert "Preflight failed on spark-worker." in result.stdout, result.stdout[-3000:]
    assert "Weakest rank:" in result.stdout
    assert row(result.stdout, WORKER).rstrip().endswith("FAIL")
    assert row(result.stdout, HEAD).rstrip().endswith("ok")
    assert (
        "spark-worker: /dev/shm has 0.5 GiB free of 2.0 GiB, below preflight_min_shm_free_gib="
        in result.stdout
    )
    assert podman("exec", WORKER, "ls", "/dev/shm").split().count(FILLER.rsplit("/", 1)[1]) == 0


def test_f5_frozen_worker_is_saturated_not_down():
    podman("pause", WORKER)
    try:
        result = preflight()
    finally:
        podman("unpause", WORKER, check=False)
    assert result.returncode != 0
    assert "spark-worker did not answer and is SATURATED, not down" in result.stdout, result.stdout[
        -3000:
    ]
    assert "ICMP from spark-head over the cluster link: reply" in result.stdout
    assert "Do not reboot" in result.stdout


def test_f5_cut_off_worker_is_unreachable():
    """Both links down and frozen: nothing answers, whatever address is probed."""
    routes = json.loads(podman("exec", WORKER, "ip", "-j", "route", "show", "default"))
    for link in ("enp1s0f0np0", "eth0"):
        podman("exec", WORKER, "ip", "link", "set", "dev", link, "down")
    podman("pause", WORKER)
    try:
        result = preflight()
    finally:
        podman("unpause", WORKER, check=False)
        for link in ("eth0", "enp1s0f0np0"):
            podman("exec", WORKER, "ip", "link", "set", "dev", link, "up")
        for route in routes:
            metric = ["metric", str(route["metric"])] if "metric" in route else []
            argv = [
                "ip",
                "route",
                "replace",
                "default",
                "via",
                route["gateway"],
                "dev",
                route["dev"],
                *metric,
            ]
            podman("exec", WORKER, *argv)
        podman(
            "exec", WORKER, "nmcli", "connection", "up", "localinference-enp1s0f0np0", check=False
        )
    assert result.returncode != 0
    assert "spark-worker did not answer and is UNREACHABLE" in result.stdout, result.stdout[-3000:]
    assert "ICMP from spark-head over the cluster link: no reply" in result.stdout
    assert "ICMP from the controller: no reply" in result.stdout
