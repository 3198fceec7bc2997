# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Rollout faults against the real lab (make lab first): vLLM CPU, TP=2 over mp, Quadlet.

1. A max_model_len larger than the KV cache (F12) is refused by the plan before
   any node is touched; with a stale plan that says it fits, vLLM refuses the
   start, the rollout rolls back to the previous recipe and quotes vLLM's
   estimated maximum model length; the endpoint keeps serving the previous
   recipe. Every node went rm -> update -> verify -> start, for the new recipe
   and again for the rollback (the task log says so, node by node). The
   refusal is evidence: its error report is appended to the head's observation
   file (source error_report) and the next plan stands on it, no hand work.
2. An edited reconciled state file (F10) is caught by verify, with the difference.
3. A stopped worker aborts the rollout before the head is touched.

Each rollout boots vLLM for real (about 1-3 minutes on two shared cores).
LOCALINFERENCE_LAB_EXTRA_ARGS adds ansible-playbook arguments (for example
``-i extra-inventory.yml``) when the lab inventory needs them (lab/harness.py).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from lab.harness import (
    HEAD,
    PLAN_RESULT,
    SERVING_STATE,
    WORKER,
    exec_on,
    first_token,
    inventory_recipe,
    module_utils,
    podman,
    read_json,
    read_text,
    rollout,
    served_max_model_len,
    unit_invocations,
    write_text,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]
OBSERVATIONS = "/var/lib/localinference/observations.json"


@pytest.fixture(scope="module")
def baseline():
    recipe = inventory_recipe()
    proc = rollout()
    assert proc.rc == 0, proc.tail()
    first_token()
    served = served_max_model_len()
    assert served, "the endpoint reports no max_model_len after a green rollout"
    return {
        "recipe": recipe,
        "hash": read_json(HEAD, SERVING_STATE)["recipe_hash"],
        "max_model_len": served,
    }


def too_large(baseline) -> dict:
    recipe = dict(baseline["recipe"])
    env = {k: v for k, v in recipe.get("env", {}).items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    # 4 MiB of KV per rank holds 16,384 tokens of the tiny model at TP=2: too few for 32,768.
    recipe.update({"max_model_len": 32768, "kv_cache_memory_bytes": 4 * 1024 * 1024, "env": env})
    return recipe


# The rollout's steps as the task log names them (roles/serve/tasks/).
STEPS = {
    "Apply | rm - stop the old units; update - write the reconciled state and units": "rm-update",
    "Verify | the node's reconciled state equals the inventory's ask (F10, F14, F17)": "verify",
    "Start | Start this worker's units": "start",
    "Start | Start the server": "start",
}
TASK_LINE = re.compile(r"^TASK \[(?:[\w.]+ : )?(.+?)\] \**$")
RESULT_LINE = re.compile(r"^(ok|changed|fatal): \[([\w.-]+)\]")


def steps_by_node(stdout: str) -> dict[str, list[str]]:
    """``{host: ["rm-update", "verify", "start", ...]}``: the steps each node ran, in order."""
    done: dict[str, list[str]] = {}
    task, seen = None, set()
    for line in stdout.splitlines():
        match = TASK_LINE.match(line)
        if match:
            task, seen = STEPS.get(match.group(1)), set()
            continue
        match = RESULT_LINE.match(line)
        if task and match and match.group(2) not in seen:
            seen.add(match.group(2))
            done.setdefault(match.group(2), []).append(task)
    return done


def test_too_large_max_model_len_is_refused_by_the_plan_before_any_boot(baseline):
    invocations = unit_invocations()
    proc = rollout(too_large(baseline), tags="rollout")
    assert proc.rc != 0
    assert "The plan refuses vllm_recipe: F12" in proc.flat, proc.tail()
    assert "No node was changed" in proc.flat
    assert unit_invocations() == invocations
    assert read_json(HEAD, SERVING_STATE)["recipe_hash"] == baseline["hash"]


def test_a_start_the_plan_did_not_foresee_rolls_back_quoting_the_estimate(baseline):
    """A plan made from evidence that no longer holds (an explicit serve_plan that says the
    recipe fits): vLLM refuses the start, the rollout rolls back and quotes vLLM's estimate."""
    recipe = too_large(baseline)
    stale_plan = {
        "recipe_hash": module_utils("common._stage_result").inputs_hash(recipe),
        "max_model_len": 32768,
        "served_max_model_len": 32768,
        "violations": [],
        "feasible": True,
    }
    recorded = read_text(HEAD, OBSERVATIONS)
    proc = rollout(recipe, extra_vars={"serve_plan": stale_plan})
    out = proc.flat
    assert proc.rc != 0, out[-3000:]
    match = re.search(r"vLLM's estimated maximum model length is\s+(\d+)", out)
    assert match, out[-3000:]
    assert 0 < int(match.group(1)) < 32768
    assert "Rolled back: the endpoint serves the previous recipe" in out
    # Verified after the update and before the start, on both nodes, both times
    # (the last verify is the rollout's check of what now serves).
    restart = ["rm-update", "verify", "start"]
    assert steps_by_node(proc.stdout) == {
        host: restart + restart + ["verify"] for host in (HEAD, WORKER)
    }, proc.tail()
    assert read_json(HEAD, SERVING_STATE)["recipe_hash"] == baseline["hash"]
    assert read_json(WORKER, SERVING_STATE)["recipe_hash"] == baseline["hash"]
    assert served_max_model_len() == baseline["max_model_len"]
    first_token()
    # The refusal taught the plan: vLLM's estimate at the pinned 4 MiB, appended by the rollout.
    try:
        learned = [
            entry for entry in read_json(HEAD, OBSERVATIONS)[len(json.loads(recorded)):]
            if entry.get("source") == "error_report"
        ]
        assert [e["max_model_len"] for e in learned if e["error_point"] == "available"] == [
            int(match.group(1))
        ], learned
        assert all(e["calibration"] and e["kv_memory_gib"] for e in learned), learned
        plan = rollout(tags="plan")
        assert plan.rc == 0, plan.tail()
        model = read_json(HEAD, PLAN_RESULT)["result"]["model"]
        assert model["sources"].get("error_report", 0) >= 1, model
        assert model["calibration"] in ("error_report", "two_points"), model
    finally:
        # The lab's evidence as it was: later tests plan from the inventory's boots.
        write_text(HEAD, OBSERVATIONS, recorded)


def test_edited_state_file_is_caught_by_verify(baseline):
    original = read_text(WORKER, SERVING_STATE)
    edited = json.loads(original)
    edited["recipe"]["max_model_len"] = 8192
    write_text(WORKER, SERVING_STATE, json.dumps(edited, indent=2))
    try:
        proc = rollout(tags="fabric,verify")
        assert proc.rc != 0
        assert "F10" in proc.flat
        assert "recipe.max_model_len: node has 8192, inventory asks" in proc.flat
    finally:
        write_text(WORKER, SERVING_STATE, original)
    again = rollout(tags="fabric,verify")
    assert again.rc == 0, again.tail()


# 184 s in the clean-clone CI of fc0e979 (make test-lab-extended): CI ran past the hour.
@pytest.mark.extended
def test_stopped_worker_aborts_before_the_head(baseline):
    head_before = read_text(HEAD, SERVING_STATE)
    podman("stop", "--time", "20", WORKER)
    try:
        recipe = {**baseline["recipe"], "max_num_seqs": 8}
        proc = rollout(recipe)
        assert proc.rc != 0
        assert "UNREACHABLE" in proc.flat or "did not pass staging" in proc.flat
        assert "Apply | rm" not in proc.flat  # the play stopped before any rm/update
        assert read_text(HEAD, SERVING_STATE) == head_before
    finally:
        podman("start", WORKER)
        for _ in range(60):
            state = exec_on(WORKER, "systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(2)
    # The inventory's recipe again: the worker's rank is back, so the cluster restarts if needed.
    proc = rollout()
    assert proc.rc == 0, proc.tail()
    first_token()
