# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor against the real lab (make lab first): read-only, well under a minute.

1. The converged lab is "healthy": no error finding, nothing changed on any host.
2. A serving.json edited on the worker (seed 000 §3.6, F10) is named with the node and
   the difference, also under --check; the file is put back and the lab is healthy again.

Each doctor run reads only (~10-20 s on the lab); the fixture rolls out first only when
the lab does not serve (a rollout that changes nothing restarts nothing).
"""

from __future__ import annotations

import json

import pytest

from lab.harness import (
    SERVING_STATE,
    WORKER,
    read_text,
    rollout,
    run_playbook,
    streams_a_token,
    write_text,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

# "Well under a minute" on the lab's two shared cores.
DOCTOR_SECONDS = 60


@pytest.fixture(scope="module")
def serving():
    if not streams_a_token(timeout=60):
        proc = rollout()
        assert proc.rc == 0, proc.tail()
    assert streams_a_token(timeout=60), "the lab does not serve through the ingress"


def doctor(*args: str):
    proc = run_playbook("doctor.yml", *args, timeout=300)
    assert proc.seconds < DOCTOR_SECONDS, f"the doctor took {proc.seconds:.0f} s"
    assert proc.changed() == 0, proc.tail()
    return proc


def test_a_converged_lab_is_healthy_and_nothing_changes(serving):
    proc = doctor()
    assert proc.rc == 0, proc.tail()
    assert "DOCTOR: healthy" in proc.flat, proc.tail()


def test_an_edited_serving_json_on_the_worker_is_named_f10(serving):
    original = read_text(WORKER, SERVING_STATE)
    edited = json.loads(original)
    edited["recipe"]["max_model_len"] = 8192
    write_text(WORKER, SERVING_STATE, json.dumps(edited, indent=2))
    try:
        proc = doctor("--check")
        assert proc.rc != 0, proc.tail()
        assert "F10 (spark-worker)" in proc.flat, proc.tail()
        assert "recipe.max_model_len: node has 8192, inventory asks" in proc.flat, proc.tail()
        assert "docs/failure-catalog.md#f10" in proc.flat
    finally:
        write_text(WORKER, SERVING_STATE, original)
    again = doctor()
    assert again.rc == 0 and "DOCTOR: healthy" in again.flat, again.tail()
