# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Faults that strike while a rollout starts the cluster (issue 14, point 7).

1. The API port is already taken by another process: staging refuses before
   any unit is stopped, naming the process; without it the next run serves.
2. The cluster link goes down just after the worker's rank started, and comes
   back: the ranks find each other when it returns and the rollout completes.
3. The worker host reboots just after its rank started: its units come back at
   boot (WantedBy=multi-user.target) and the rollout completes.

Each rollout changes ``max_num_seqs`` so the cluster really restarts; the
inventory's recipe is rolled out again at the end.
"""

from __future__ import annotations

import threading
import time

import pytest

from lab.harness import (
    CLUSTER_ADDRESSES,
    CLUSTER_IF,
    HEAD,
    HOSTS,
    SERVING_STATE,
    VLLM_UNIT,
    WORKER,
    exec_on,
    inventory_recipe,
    lab_up,
    playbook_with_action,
    podman,
    read_json,
    rollout,
    streams_a_token,
    unit_invocations,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

WORKER_STARTED = "Start | Start this worker's units"
STRAY = "localinference-stray-port"


def changed_recipe() -> dict:
    recipe = inventory_recipe()
    return {**recipe, "max_num_seqs": recipe.get("max_num_seqs", 4) + 4}


def nodes_agree() -> set[str]:
    return {read_json(host, SERVING_STATE)["recipe_hash"] for host in HOSTS}


@pytest.fixture
def back_to_the_inventory():
    yield
    back = rollout(tags="rollout")
    assert back.rc == 0, back.tail()
    assert streams_a_token(timeout=60)


def test_a_port_taken_by_another_process_is_refused_before_anything_stops(back_to_the_inventory):
    port = str(inventory_recipe().get("port", 8000))
    for host in (HEAD, WORKER):
        exec_on(host, "systemctl", "stop", VLLM_UNIT)
    exec_on(HEAD, "systemd-run", f"--unit={STRAY}", "--collect", "python3", "-m", "http.server", port,
            "--bind", "127.0.0.1")
    try:
        deadline = time.monotonic() + 30
        while exec_on(HEAD, "ss", "-Hltn", f"sport = :{port}").stdout.strip() == "":
            assert time.monotonic() < deadline, "the stray server never listened"
            time.sleep(0.5)
        invocations = unit_invocations()
        run = rollout(changed_recipe(), tags="rollout")
        assert run.rc != 0
        assert f"port {port} on 127.0.0.1 is held by pid" in run.flat, run.tail()
        assert "http.server" in run.flat
        assert "nothing was changed" in run.flat
        assert unit_invocations() == invocations, "a unit was started or stopped on a taken port"
    finally:
        exec_on(HEAD, "systemctl", "stop", STRAY, check=False)


# Measured 4 min 41 s in the lab (two rollouts and a 25 s outage).
@pytest.mark.extended
def test_the_cluster_link_down_during_start_recovers_when_it_returns(back_to_the_inventory):
    down_for = 25.0

    def link_down(_proc) -> None:
        exec_on(WORKER, "ip", "link", "set", "dev", CLUSTER_IF, "down")
        threading.Timer(down_for, lambda: exec_on(WORKER, "ip", "link", "set", "dev", CLUSTER_IF, "up")).start()

    run, fired = playbook_with_action(
        "site.yml", WORKER_STARTED, link_down, tags="rollout", extra_vars={"vllm_recipe": changed_recipe()}
    )
    assert fired, run.tail()
    addresses = exec_on(WORKER, "ip", "-o", "addr", "show", "dev", CLUSTER_IF).stdout
    assert f" {CLUSTER_ADDRESSES[WORKER]}/" in addresses, f"the link came back without its address: {addresses}"
    assert run.rc == 0, run.tail()
    assert streams_a_token(timeout=60)
    assert len(nodes_agree()) == 1


# Measured 3 min 13 s in the lab (a host restart and two rollouts).
@pytest.mark.extended
def test_the_worker_rebooted_during_start_comes_back_and_the_rollout_completes(back_to_the_inventory):
    def reboot(_proc) -> None:
        podman("restart", "--time", "10", WORKER, timeout=180)

    try:
        run, fired = playbook_with_action(
            "site.yml", WORKER_STARTED, reboot, tags="rollout", extra_vars={"vllm_recipe": changed_recipe()}
        )
    finally:
        deadline = time.monotonic() + 120
        while not lab_up() and time.monotonic() < deadline:
            time.sleep(2)
    assert fired, run.tail()
    assert run.rc == 0, run.tail()
    assert streams_a_token(timeout=60)
    assert len(nodes_agree()) == 1
