# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine dies under a running endpoint; systemd, not the operator, brings it back.

F11 (seed 000 §3.6): a launcher that died with its shell left a container that
exited 0 and a proxy answering 502. The serving units say ``Restart=always``,
so an engine that exits cleanly comes back as surely as one that is killed,
and an automatic restart is not a rollout: no observation is recorded twice.
"""

from __future__ import annotations

import time

import pytest

from lab.harness import HEAD, HOSTS, VLLM_UNIT, exec_on, read_json, streams_a_token

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

OBSERVATIONS = "/var/lib/localinference/observations.json"
CONTAINER = "localinference-vllm"


def restarts(host: str) -> int:
    out = exec_on(host, "systemctl", "show", "-p", "NRestarts", "--value", VLLM_UNIT).stdout
    return int(out.strip() or 0)


def wait_for_token(deadline: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < deadline:
        if streams_a_token(timeout=20):
            return time.monotonic() - started
        time.sleep(3)
    pytest.fail(f"no streamed token within {deadline:.0f} s after the engine died")


def test_every_serving_unit_restarts_whatever_the_exit_status():
    for host in HOSTS:
        restart = exec_on(host, "systemctl", "show", "-p", "Restart", "--value", VLLM_UNIT).stdout
        assert restart.strip() == "always", f"{host}: Restart={restart.strip()} (F11 needs always)"


@pytest.mark.parametrize(
    ("signal", "why"),
    [
        ("SIGINT", "a clean shutdown: vLLM exits 0, as seed 000's orphaned launcher left it"),
        ("SIGKILL", "a crash: the engine is killed outright"),
    ],
)
def test_a_dead_engine_comes_back_and_is_not_recorded_twice(signal, why):
    assert streams_a_token(timeout=30), "the lab does not serve before the fault"
    observations = len(read_json(HEAD, OBSERVATIONS))
    before = restarts(HEAD)
    exec_on(HEAD, "podman", "kill", "--signal", signal, CONTAINER)
    seconds = wait_for_token(deadline=300)
    print(f"{signal} ({why}): a token streamed again {seconds:.0f} s later")
    assert restarts(HEAD) > before, "systemd did not restart the unit: something else did"
    assert len(read_json(HEAD, OBSERVATIONS)) == observations
