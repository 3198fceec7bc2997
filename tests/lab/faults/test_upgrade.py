# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/upgrade.yml on the real lab (issue 26 item 3): a new stack is rolled out,
qualified, and then promoted or reverted to the last good stack by itself.

- Half the sequences qualifies as challenger (vLLM runs at most 2 of the 4 requests the
  gate sends at once): the upgrade reverts through the same rollout, the old recipe
  serves again on both nodes, the run ends failed naming the concurrency failure.
- A change that costs nothing (vLLM's ``seed``) qualifies: promoted, the lockfile's
  newest stack is the new one, the saved verdict is promote.
Both measure against a saved verdict of their own (the lab's qualify.json stays as it
was). Four rollouts with boots and three qualifications: about 12 min in the lab, so
``extended`` (make test-lab-extended).
"""

from __future__ import annotations

import json

import pytest

from lab.harness import (
    HEAD,
    exec_on,
    inventory_recipe,
    qualify,
    read_json,
    rollout,
    serving_hashes,
    streams_a_token,
    upgrade,
)

pytestmark = [pytest.mark.lab, pytest.mark.extended, pytest.mark.usefixtures("lab_hosts")]

SAVED = "/etc/localinference/qualify-upgrade-test.json"
LOCK = "/etc/localinference/stack.lock.json"


def test_an_upgrade_that_regresses_reverts_and_one_that_qualifies_is_promoted(tmp_path):
    recipe = inventory_recipe()
    streams = recipe.get("max_num_seqs", 4)
    before = serving_hashes()
    assert len(before) == 1, before
    try:
        # The baseline: the serving stack qualified under this test's saved verdict.
        base = qualify(SAVED, tmp_path / "base")
        assert base.rc == 0, base.tail()

        reverted = upgrade({"max_num_seqs": max(1, streams // 2)}, SAVED, tmp_path / "half")
        assert reverted.rc != 0, "a reverted upgrade must end the run failed"
        assert (
            "UPGRADE: reverted: the last good stack serves again (verdict challenger)"
            in reverted.flat
        ), reverted.tail()
        assert (
            "concurrency" in reverted.flat
            and f"max_num_seqs: {streams} -> {max(1, streams // 2)}" in reverted.flat
        ), reverted.tail()
        assert serving_hashes() == before
        assert streams_a_token(timeout=60)

        promoted = upgrade({"seed": 1234}, SAVED, tmp_path / "seed")
        assert promoted.rc == 0, promoted.tail()
        assert (
            "UPGRADE: promoted: the new stack serves and is the last good one (verdict promote)"
            in promoted.flat
        ), promoted.tail()
        newest = json.loads(exec_on(HEAD, "cat", LOCK).stdout)["entries"][0]
        assert newest["nodes"][HEAD]["recipe"].get("seed") == 1234
        assert read_json(HEAD, SAVED)["result"]["verdict"] == "promote"
        assert serving_hashes() != before
    finally:
        exec_on(HEAD, "rm", "-f", SAVED, check=False)
        if serving_hashes() != before:
            back = rollout(tags="rollout")
            assert back.rc == 0, back.tail()
    assert streams_a_token(timeout=60)
