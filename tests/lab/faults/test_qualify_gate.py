# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The promotion gate on the real lab (issue 12, point 4): a planted regression.

The lab's recipe is qualified and promoted (a saved verdict of its own, so the
lab's report and qualify.json stay as they were); then the same recipe with
half the sequences is served and qualified again: the verdict is challenger,
and the reason names the regression (measured: "concurrency failed: while all
4 requests were in flight vLLM ran at most 2 of them ... (F3)"). About 4 min
(two rollouts): make test-lab-extended.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.harness import HEAD, exec_on, inventory_recipe, rollout, run_playbook, streams_a_token

pytestmark = [pytest.mark.lab, pytest.mark.extended, pytest.mark.usefixtures("lab_hosts")]

SAVED = "/etc/localinference/qualify-gate-test.json"
CHECKS = ["smoke", "tools", "reasoning_split", "concurrency"]


def qualify(report_dir: Path) -> dict:
    run = run_playbook(
        "qualify.yml",
        extra_vars={"qualify_checks": CHECKS, "qualify_saved_path": SAVED, "qualify_report_dir": str(report_dir)},
        timeout=900,
    )
    assert run.rc == 0, run.tail()
    return json.loads((report_dir / "report.json").read_text())


def test_half_the_sequences_turns_promote_into_challenger_with_the_reason(tmp_path):
    recipe = inventory_recipe()
    try:
        first = qualify(tmp_path / "first")
        assert first["verdict"] == "promote", first["reasons"]
        half = {**recipe, "max_num_seqs": max(1, recipe.get("max_num_seqs", 4) // 2)}
        run = rollout(half, tags="rollout")
        assert run.rc == 0, run.tail()
        second = qualify(tmp_path / "second")
        assert second["verdict"] == "challenger", second["reasons"]
        # Named either way the gate sees it: the check itself (vLLM ran 2 of the
        # requests at once) or the figure against the promoted report.
        assert any(
            "regressed" in reason or ("concurrency" in reason and "at most 2" in reason)
            for reason in second["reasons"]
        ), second["reasons"]
    finally:
        exec_on(HEAD, "rm", "-f", SAVED, check=False)
        back = rollout(tags="rollout")
    assert back.rc == 0, back.tail()
    assert streams_a_token(timeout=60)
