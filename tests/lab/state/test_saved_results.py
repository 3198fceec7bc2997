# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The closed loop, read-only: vLLM's recorded boots -> the saved plan -> the served context.

The lab recipe says ``max_model_len: plan`` and pins 64 MiB of KV per rank;
the tiny model's own maximum is 131,072, so the plan's choice binds.
"""

from __future__ import annotations

import pytest

from lab.harness import HEAD, HOSTS, PLAN_RESULT, read_json, served_max_model_len

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def plan(lab_hosts) -> dict:
    doc = read_json(HEAD, PLAN_RESULT)
    assert doc["stage"] == "plan" and len(doc["inputs_hash"]) == 64
    return doc["result"]


def test_the_served_context_is_the_saved_plans_choice(plan):
    assert plan["feasible"], plan["violations"]
    assert plan["max_model_len"] == served_max_model_len()
    # The model allows 131,072: the plan, not the model, is the binding limit.
    assert 0 < plan["max_model_len"] < 131072


def test_the_plan_was_made_from_recorded_boots_and_the_weakest_rank(plan):
    assert plan["calibrated"] and len(plan["boots"]) >= 2
    assert plan["memory_source"] == "recipe.kv_cache_memory_bytes"
    # The weakest rank was checked; its name is saved only when the pinned KV does not fit.
    assert plan["weakest_rank"] == {"fits": True}


def test_every_node_saved_its_fabric_and_preflight_results(lab_hosts):
    for host in HOSTS:
        fabric = read_json(host, "/etc/localinference/fabric.json")
        assert fabric["stage"] == "fabric" and fabric["result"]["env"]["VLLM_HOST_IP"]
        preflight = read_json(host, "/etc/localinference/preflight.json")
        assert preflight["stage"] == "preflight"
        assert preflight["result"]["weakest_rank"]["host"] in HOSTS
