# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine dies under a running endpoint; systemd, not the operator, brings it back.

F11 (seed 000 §3.6): a launcher that died with its shell left a container that
exited 0 and a proxy answering 502. The serving units say ``Restart=always``,
so an engine that exits cleanly is restarted as surely as one that is killed,
and an automatic restart is not a rollout: no observation is recorded twice.
Measured in the lab: with tensor parallel across two hosts over ``mp``, the
restarted rank 0 waits at the rendezvous for the worker's stale rank 1, so the
endpoint comes back with the next rollout, not by itself.
"""

from __future__ import annotations

import time

import pytest

from lab.harness import HEAD, HOSTS, VLLM_UNIT, exec_on, read_json, rollout, streams_a_token

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

OBSERVATIONS = "/var/lib/localinference/observations.json"
CONTAINER = "localinference-vllm"


def restarts(host: str) -> int:
    out = exec_on(host, "systemctl", "show", "-p", "NRestarts", "--value", VLLM_UNIT).stdout
    return int(out.strip() or 0)


def test_every_serving_unit_restarts_whatever_the_exit_status():
    for host in HOSTS:
        restart = exec_on(host, "systemctl", "show", "-p", "Restart", "--value", VLLM_UNIT).stdout
        assert restart.strip() == "always", f"{host}: Restart={restart.strip()} (F11 needs always)"


# 183 s in the clean-clone CI of fc0e979 (make test-lab-extended): CI ran past the hour.
@pytest.mark.extended
def test_an_engine_that_exits_0_is_restarted_and_a_rollout_recovers_the_cluster():
    """F11 on a running endpoint: the head's engine shuts down cleanly (exit 0, as seed 000's
    orphaned launcher left it). systemd restarts it (Restart=always) and records nothing; with
    tensor parallel across nodes the restarted rank 0 waits for the worker's stale rank, so the
    cluster comes back with the next rollout, whose streamed-token probe sees the dead endpoint
    and restarts every rank."""
    assert streams_a_token(timeout=30), "the lab does not serve before the fault"
    observations = len(read_json(HEAD, OBSERVATIONS))
    before = restarts(HEAD)
    exec_on(HEAD, "podman", "kill", "--signal", "SIGINT", CONTAINER)
    deadline = time.monotonic() + 120
    while restarts(HEAD) == before and time.monotonic() < deadline:
        time.sleep(2)
    assert restarts(HEAD) > before, "systemd did not restart the engine that exited"
    assert len(read_json(HEAD, OBSERVATIONS)) == observations, "a systemd restart was recorded"
    run = rollout(tags="rollout")
    assert run.rc == 0, run.tail()
    assert streams_a_token(timeout=60)
