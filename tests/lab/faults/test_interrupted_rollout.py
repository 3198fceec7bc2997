# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Rollouts cut short or refused, and the next run recovering by itself.

1. The controller is interrupted (Ctrl-C) after the old units were stopped and
   replaced by the new recipe's, before the new ones start: the endpoint is down, and the next
   rollout of the same recipe brings it up with nothing done by hand.
2. A corrupt image reference is refused while staging, naming the image;
   nothing running is touched.
"""

from __future__ import annotations

import os
import signal

import pytest

from lab.harness import (
    HEAD,
    HOSTS,
    SERVING_STATE,
    PlaybookRun,
    inventory_recipe,
    playbook_with_action,
    read_json,
    rollout,
    streams_a_token,
    unit_invocations,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

# The task after which the old units are gone and the new ones not yet started.
AFTER_RM = "Apply | rm - stop the old units; update - write the reconciled state and units"


def interrupt_after(marker: str, recipe: dict) -> PlaybookRun:
    """Run the rollout of ``recipe`` and press Ctrl-C once ``marker`` has run."""
    run, fired = playbook_with_action(
        "site.yml",
        marker,
        lambda proc: os.killpg(proc.pid, signal.SIGINT),
        tags="rollout",
        extra_vars={"vllm_recipe": recipe},
        interrupt=True,
        timeout=900,
    )
    assert fired, "the rollout never reached its rm step:\n" + run.tail()
    return run


# Three rollouts, one interrupted: 290 s in the clean-clone CI of 0cd4aaa (make test-lab-extended).
@pytest.mark.extended
def test_a_rollout_interrupted_between_rm_and_start_is_recovered_by_the_next_run():
    recipe = inventory_recipe()
    changed = {**recipe, "max_num_seqs": recipe.get("max_num_seqs", 4) + 4}
    try:
        interrupt_after(AFTER_RM, changed)
        assert not streams_a_token(timeout=10), "the old engine still serves after rm"
        again = rollout(changed, tags="rollout")
        assert again.rc == 0, again.tail()
        assert streams_a_token(timeout=60)
        hashes = {read_json(host, SERVING_STATE)["recipe_hash"] for host in HOSTS}
        assert len(hashes) == 1, f"the nodes disagree after the recovery: {hashes}"
    finally:
        back = rollout(tags="rollout")
    assert back.rc == 0, back.tail()
    assert streams_a_token(timeout=60)


def test_a_corrupt_image_reference_is_refused_while_staging():
    recipe = inventory_recipe()
    image = recipe["image"].split("@")[0] + "@sha256:" + "0" * 64
    invocations = unit_invocations()
    state = read_json(HEAD, SERVING_STATE)
    run = rollout({**recipe, "image": image}, tags="rollout")
    assert run.rc != 0
    assert image in run.flat, run.tail()
    assert unit_invocations() == invocations
    assert read_json(HEAD, SERVING_STATE) == state
    assert streams_a_token(timeout=30)
    # The refused recipe's plan was saved (the evidence of the refusal): plan the
    # inventory's recipe again, as the lab was found. Nothing restarts.
    back = rollout(tags="rollout")
    assert back.rc == 0, back.tail()
    assert unit_invocations() == invocations
