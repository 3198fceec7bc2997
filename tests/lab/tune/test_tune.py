# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tune against the real lab (make lab first; make test-lab-tune), with the watchdog running.

From the lab's recipe without the values the tune found (head_of_line fails: a short request
waits seconds behind a long prefill):

1. every candidate refused by the planner (an agent configured with twice the served context:
   the client budget, F8) is dropped with the planner's reason and never booted: no unit
   restarted;
2. a candidate that is no better (the step budget halved without a cap on long prefills) is
   rolled out, qualified and reverted by upgrade.yml itself; the previous stack serves again
   and the watchdog recorded no wedge;
3. the whole tune promotes the cap on long prefills (head_of_line passes, no check worse),
   which is what the lab's inventory ships (the tuned recipe's diff is empty); a second tune
   has nothing to gain and restarts nothing.

The lab's own recipe is rolled out again at the end, whatever happened.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from lab.harness import (
    HEAD,
    LAB_DIR,
    PlaybookRun,
    incidents,
    inventory_recipe,
    read_json,
    rollout,
    run_playbook,
    streams_a_token,
    unit_invocations,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

# What `make tune` found on the lab and the inventory ships (inventories/lab/group_vars/all.yml).
TUNED = ("enable_chunked_prefill", "long_prefill_token_threshold")
TUNE_DIR = LAB_DIR / "tune"
SERVING = "/etc/localinference/serving.json"


def tune(**extra_vars: Any) -> tuple[PlaybookRun, dict[str, Any]]:
    run = run_playbook("tune.yml", extra_vars=extra_vars or None, timeout=3600)
    assert run.rc == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run, json.loads((TUNE_DIR / "tune.json").read_text())


def serving_recipe() -> dict[str, Any]:
    return read_json(HEAD, SERVING)["recipe"]


def test_the_tune_tries_what_fits_reverts_what_is_no_better_and_promotes_the_fix():
    untuned = {k: v for k, v in inventory_recipe().items() if k not in TUNED}
    since = time.time()
    try:
        setup = rollout(untuned)
        assert setup.rc == 0, setup.stdout[-3000:]
        assert not set(TUNED) & set(serving_recipe())

        # 1. The planner refuses every candidate: nothing is booted.
        before = unit_invocations()
        _, doc = tune(plan_client_limits={"context": 131072, "output": 4096})
        assert doc["findings"][0]["check"] == "head_of_line", doc["findings"]
        assert doc["trials"] == [] and doc["candidates"] == []
        dropped = doc["dropped_by_planner"]
        assert [d["rule"] for d in dropped] == ["cap_long_prefills", "smaller_steps"], dropped
        assert all(not d["planner"]["accepted"] and "client_limits.context 131072 exceeds the server's max_model_len"
                   in d["planner"]["why"] for d in dropped), dropped
        assert unit_invocations() == before

        # 2. No better: reverted by the upgrade itself, the previous stack serves again.
        _, doc = tune(tune_knobs=["enable_chunked_prefill", "max_num_batched_tokens"], tune_max_trials=1)
        (trial,) = doc["trials"]
        assert trial["candidate"]["id"] == "head_of_line/smaller_steps", trial["candidate"]
        assert trial["checks"]["head_of_line"] == "fail", trial["figures"]
        assert trial["outcome"] == "reverted" and trial["verdict"] == "challenger", trial
        recipe = serving_recipe()
        assert "max_num_batched_tokens" not in recipe and not set(TUNED) & set(recipe), recipe
        assert streams_a_token(timeout=60)
        assert doc["serving_trial"] is None

        # 3. The whole tune: the cap is promoted; nothing else gets worse.
        _, doc = tune()
        (trial,) = doc["trials"]
        assert trial["candidate"]["id"] == "head_of_line/cap_long_prefills", trial["candidate"]
        assert trial["outcome"] == "promoted" and trial["judged"]["worse"] == [], trial
        assert trial["checks"]["head_of_line"] == "pass", trial["figures"]
        assert "fail" not in doc["after"]["checks"].values(), doc["after"]["checks"]
        assert doc["after"]["figures"]["head_of_line_stall_s"] < doc["before"]["figures"]["head_of_line_stall_s"]
        assert doc["serving_trial"] == 1 and (TUNE_DIR / "trials.png").stat().st_size > 1000
        assert {k: serving_recipe()[k] for k in TUNED} == {k: inventory_recipe()[k] for k in TUNED}
        # What the inventory ships is what the tune found: nothing left to review.
        assert (TUNE_DIR / "tuned-recipe.diff").read_text() == ""

        # A second tune has nothing to gain and restarts nothing.
        served = unit_invocations()
        run, doc = tune()
        assert doc["trials"] == [] and doc["stopped"].startswith("nothing to gain"), doc["stopped"]
        assert unit_invocations() == served
        assert "TUNE: 0 trial(s)" in run.stdout

        # The watchdog held through every trial: no wedge, no restart of its own.
        assert [r for r in incidents(since) if r.get("verdict") == "wedged" or r.get("action") == "restart"] == []
    finally:
        rollout()
        assert streams_a_token(timeout=120)
