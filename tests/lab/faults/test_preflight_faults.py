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

import pytest

from lab.harness import (
    CLUSTER_IF,
    CLUSTER_PROFILE,
    HEAD,
    WORKER,
    PlaybookRun,
    exec_on,
    podman,
    run_playbook,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

FILLER = "/dev/shm/localinference-preflight-fault"


def preflight() -> PlaybookRun:
    return run_playbook("preflight.yml", timeout=900)


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
    assert result.rc == 0, result.tail()
    assert "Preflight passed." in result.stdout
    assert "Weakest rank: spark-" in result.stdout


def test_f4_shm_filled_on_the_worker():
    exec_on(WORKER, "fallocate", "-l", "1536M", FILLER)
    try:
        result = preflight()
    finally:
        exec_on(WORKER, "rm", "-f", FILLER)
    assert result.rc != 0
    assert "Preflight failed on spark-worker." in result.stdout, result.tail()
    assert "Weakest rank:" in result.stdout
    assert row(result.stdout, WORKER).rstrip().endswith("FAIL")
    assert row(result.stdout, HEAD).rstrip().endswith("ok")
    assert (
        "spark-worker: /dev/shm has 0.5 GiB free of 2.0 GiB, below preflight_min_shm_free_gib="
        in result.stdout
    )
    shm = exec_on(WORKER, "ls", "/dev/shm").stdout.split()
    assert shm.count(FILLER.rsplit("/", 1)[1]) == 0


def test_f5_frozen_worker_is_saturated_not_down():
    podman("pause", WORKER)
    try:
        result = preflight()
    finally:
        podman("unpause", WORKER, check=False)
    assert result.rc != 0
    assert "spark-worker did not answer and is SATURATED, not down" in result.stdout, result.tail()
    assert "ICMP from spark-head over the cluster link: reply" in result.stdout
    assert "Do not reboot" in result.stdout


def test_f5_cut_off_worker_is_unreachable():
    """Both links down and frozen: nothing answers, whatever address is probed."""
    routes = json.loads(exec_on(WORKER, "ip", "-j", "route", "show", "default").stdout)
    for link in (CLUSTER_IF, "eth0"):
        exec_on(WORKER, "ip", "link", "set", "dev", link, "down")
    podman("pause", WORKER)
    try:
        result = preflight()
    finally:
        podman("unpause", WORKER, check=False)
        for link in ("eth0", CLUSTER_IF):
            exec_on(WORKER, "ip", "link", "set", "dev", link, "up")
        for route in routes:
            metric = ["metric", str(route["metric"])] if "metric" in route else []
            argv = ["ip", "route", "replace", "default", "via", route["gateway"]]
            exec_on(WORKER, *argv, "dev", route["dev"], *metric)
        exec_on(WORKER, "nmcli", "connection", "up", CLUSTER_PROFILE, check=False)
    assert result.rc != 0
    assert "spark-worker did not answer and is UNREACHABLE" in result.stdout, result.tail()
    assert "ICMP from spark-head over the cluster link: no reply" in result.stdout
    assert "ICMP from the controller: no reply" in result.stdout
