# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The closed loop under change: the evidence moves, the plan and the served context follow.

1. ``--tags rollout`` alone on a converged lab changes nothing (it reads the
   saved fabric result and re-plans from the saved evidence) and reports the
   qualification verdict of what serves.
2. Less KV in the recipe: the rollout re-plans before staging and restarts
   with the new, smaller context, which equals the saved plan's choice; the
   inventory recipe brings the old context back.
3. A recipe the plan blocks (F3) is refused by ``--tags rollout`` alone,
   naming the catalog id, before any node is touched: the old endpoint keeps
   serving.
"""

from __future__ import annotations

import pytest

from lab.harness import (
    HEAD,
    HOSTS,
    PLAN_RESULT,
    SERVING_STATE,
    first_token,
    inventory_recipe,
    read_json,
    rollout,
    served_max_model_len,
    unit_invocations,
)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def recipe(lab_hosts) -> dict:
    return inventory_recipe()


def saved_plan() -> dict:
    return read_json(HEAD, PLAN_RESULT)["result"]


def test_rollout_alone_changes_nothing_on_a_converged_lab(recipe):
    before = unit_invocations()
    run = rollout(tags="rollout")
    assert run.rc == 0, run.tail()
    assert run.changed() == 0, run.tail()
    assert unit_invocations() == before
    # The report ends with the qualification of what serves (site.yml qualified it).
    assert "Qualification of the served recipe" in run.flat or "is not qualified yet" in run.flat, run.tail()


def test_less_kv_replans_and_restarts_with_the_smaller_context(recipe):
    served = served_max_model_len()
    smaller = {**recipe, "kv_cache_memory_bytes": recipe["kv_cache_memory_bytes"] // 2}
    try:
        run = rollout(smaller, tags="rollout")
        assert run.rc == 0, run.tail()
        plan = saved_plan()
        assert plan["max_model_len"] == served_max_model_len() == served // 2
        # A recipe nobody qualified is reported as such, never with another recipe's verdict.
        assert "is not qualified yet (the saved verdict" in run.flat, run.tail()
    finally:
        back = rollout(tags="rollout")
    assert back.rc == 0, back.tail()
    assert saved_plan()["max_model_len"] == served_max_model_len() == served


def test_a_recipe_the_plan_blocks_is_refused_by_rollout_alone(recipe):
    state = {host: read_json(host, SERVING_STATE) for host in HOSTS}
    invocations = unit_invocations()
    served = served_max_model_len()
    run = rollout({**recipe, "max_num_seqs": 1}, tags="rollout")
    assert run.rc != 0
    assert "F3" in run.flat and "max_num_seqs" in run.flat, run.tail()
    assert {host: read_json(host, SERVING_STATE) for host in HOSTS} == state
    assert unit_invocations() == invocations
    assert served_max_model_len() == served and first_token()["text"] is not None
    # The refused recipe's plan is saved (it is the evidence of the refusal);
    # the inventory recipe's plan is restored by the next rollout.
    assert rollout(tags="rollout").rc == 0
