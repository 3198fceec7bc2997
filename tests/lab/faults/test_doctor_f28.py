# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""F28 on the real lab (issue 25): the worker's tensor-parallel rank stopped with ``kill -STOP``,
which is what an NCCL hang looks like from outside. ``/health`` and ``/v1/models`` keep
answering 200 and the units stay active; only a streamed token tells. The doctor must name F28
(not "healthy"), and after ``kill -CONT`` be healthy again without F28.

The head's watchdog would restart the engine in the middle of the test: it is stopped for the
test (``tests/lab/faults/conftest.py`` stops it around every fault test not marked
``watchdog``) and started again afterwards.

Measured on the lab: see the test's printed timings (``pytest -s``).
"""

from __future__ import annotations

import time

import pytest

from lab.harness import (
    HEAD,
    RANK_PATTERN,
    WORKER,
    api_key,
    exec_on,
    rank_pids,
    rollout,
    run_playbook,
    streams_a_token,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

# The doctor's default deadline per probe: with the rank stopped the ingress and the engine
# each wait it out, the rest of the doctor takes ~20 s on the lab.
TOKEN_DEADLINE = 20
DOCTOR_SECONDS = 2 * TOKEN_DEADLINE + 60


@pytest.fixture
def serving() -> None:
    if not streams_a_token(timeout=60):
        proc = rollout(tags="rollout")
        assert proc.rc == 0, proc.tail()
    assert streams_a_token(timeout=60), "the lab does not serve through the ingress"


def http_status(url: str) -> str:
    done = exec_on(HEAD, "curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", url,
                   check=False)  # fmt: skip
    return done.stdout.strip()


def doctor():
    proc = run_playbook("doctor.yml", "-e", f"doctor_token_deadline={TOKEN_DEADLINE}", timeout=600)
    assert proc.seconds < DOCTOR_SECONDS, f"the doctor took {proc.seconds:.0f} s"
    assert proc.changed() == 0, proc.tail()
    key = api_key()
    assert not key or key not in proc.stdout + proc.stderr, "the ingress key was logged"
    return proc


def test_a_stopped_tensor_parallel_rank_is_named_f28_and_cleared_by_cont(serving):
    ranks = rank_pids()
    assert ranks, f"no process {RANK_PATTERN!r} on {WORKER}"
    exec_on(WORKER, "kill", "-STOP", *ranks)
    try:
        # The picture of issue 25: the API server still answers.
        assert http_status("http://127.0.0.1:8000/health") == "200"
        assert http_status("http://127.0.0.1:8000/v1/models") == "200"
        wedged = doctor()
    finally:
        exec_on(WORKER, "kill", "-CONT", *ranks, check=False)
        continued = time.monotonic()
    print(f"\ndoctor with the rank stopped: {wedged.seconds:.1f} s (rc {wedged.rc})")
    assert wedged.rc != 0, wedged.tail()
    assert "DOCTOR: healthy" not in wedged.flat, wedged.tail()
    assert "F28 (spark-head)" in wedged.flat, wedged.tail()
    assert "the engine answers /health but streams no token" in wedged.flat, wedged.tail()
    assert f"no token within {TOKEN_DEADLINE} s; /health 200" in wedged.flat, wedged.tail()
    assert "docs/failure-catalog.md#f28" in wedged.flat

    assert streams_a_token(timeout=120), "no token after kill -CONT"
    print(f"first token {time.monotonic() - continued:.1f} s after kill -CONT")
    again = doctor()
    print(f"doctor after kill -CONT: {again.seconds:.1f} s (rc {again.rc})")
    assert again.rc == 0 and "DOCTOR: healthy" in again.flat, again.tail()
    assert "F28" not in again.flat, again.tail()
    assert "TOKEN: ingress" in again.flat and "first token in" in again.flat, again.tail()
