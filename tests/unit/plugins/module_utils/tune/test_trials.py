# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tune's trials: the next candidate, the stops, the reviewable diff and the record."""

from __future__ import annotations

import json

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.tune import _review_files, _trials
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule

HOL = {"checks": {"head_of_line": "fail"}, "figures": {"head_of_line_stall_s": 3.6}}
FIXED = {"checks": {"head_of_line": "pass"}, "figures": {"head_of_line_stall_s": 0.1}}
CAP = {"id": "head_of_line/cap_long_prefills", "finding": "head_of_line", "rule": "cap_long_prefills",
       "set": {"long_prefill_token_threshold": 1024}}
STEPS = {"id": "head_of_line/smaller_steps", "finding": "head_of_line", "rule": "smaller_steps",
         "set": {"max_num_batched_tokens": 2048}}


def _next(trials, incumbent=HOL, max_trials=3, budget_s=3600.0, elapsed_s=0.0):
    return _trials.next_trial([CAP, STEPS], trials, incumbent, max_trials=max_trials, budget_s=budget_s,
                              elapsed_s=elapsed_s)


def test_the_next_candidate_is_the_first_untried_for_an_open_finding() -> None:
    assert _next([])["candidate"] is CAP
    assert _next([{"candidate": CAP, "seconds": 300}])["candidate"] is STEPS


def test_a_promoted_fix_closes_the_finding() -> None:
    got = _next([{"candidate": CAP, "seconds": 300}], incumbent=FIXED)
    assert got["candidate"] is None and got["why"].startswith("nothing to gain")


def test_the_limits_stop_the_tune() -> None:
    assert "tune_max_trials (1) reached" in _next([{"candidate": CAP, "seconds": 1}], max_trials=1)["why"]
    over = _next([{"candidate": CAP, "seconds": 600}], budget_s=900, elapsed_s=400)
    assert over["candidate"] is None and "would be overrun" in over["why"]
    assert "was tried or dropped" in _next([{"candidate": CAP}, {"candidate": STEPS}])["why"]


def test_the_diff_shows_only_what_changed_against_the_inventory() -> None:
    serving = {"max_num_seqs": 4, "model": "m", "long_prefill_token_threshold": 1024, "cache_dir": "/c"}
    diff = _trials.recipe_diff({"max_num_seqs": 4, "model": "m"}, serving)
    assert diff.splitlines()[:2] == ["--- vllm_recipe (inventory)", "+++ vllm_recipe (tuned)"]
    assert [line for line in diff.splitlines() if line.startswith(("+ ", "- "))] == [
        "+  long_prefill_token_threshold: 1024"]
    assert _trials.recipe_diff({"a": 1}, {"a": 1}) == ""


def test_the_record_files(tmp_path) -> None:
    trial = {"trial": 1, "candidate": CAP, "outcome": "promoted", "score": 1.2, "figures": FIXED["figures"]}
    document = _trials.document(status="done", findings_found=[], candidates=[CAP], dropped=[], skipped=[],
                                trials=[trial], before=HOL, after=FIXED, weights={}, stopped="nothing to gain")
    paths = _review_files.write(str(tmp_path / "tune"), document, "diff\n")
    saved = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert saved["serving_trial"] == 1 and saved["status"] == "done"
    assert (tmp_path / "tune" / "tuned-recipe.diff").read_text() == "diff\n"
    assert paths["plot"] and (tmp_path / "tune" / "trials.png").stat().st_size > 1000
    assert _trials.before_after(HOL, FIXED)[0] == "head_of_line_stall_s: 3.6 -> 0.1"


def test_tune_record_writes_nothing_in_check_mode_and_the_files_otherwise(tmp_path) -> None:
    # tune_record's one call (_review_files.record): the same document, diff and figures either way
    params = {"dest": str(tmp_path / "tune"), "status": "running", "stopped": "", "findings": [],
              "candidates": [CAP], "dropped": [], "skipped": [], "trials": [], "before": HOL, "after": HOL,
              "inventory_recipe": {"max_model_len": 65536}, "weights": {}}
    predicted = _review_files.record(FakeModule(params, check_mode=True))
    assert predicted == {"changed": False, "tune_json": None, "diff": "", "plot": None,
                         "figures": _trials.before_after(HOL, HOL)}
    assert not (tmp_path / "tune").exists()
    written = _review_files.record(FakeModule(params))
    assert written["tune_json"] == str(tmp_path / "tune" / "tune.json") and written["plot"] is None
    assert json.loads((tmp_path / "tune" / "tune.json").read_text())["status"] == "running"


@pytest.mark.parametrize(
    ("plan", "accepted", "why"),
    [
        ({"feasible": True, "served_max_model_len": 65536, "violations": []}, True, "the plan fits"),
        ({"feasible": True, "served_max_model_len": 32768, "violations": []}, False,
         "would serve 32768 tokens of context, not the 65536"),
        ({"feasible": False, "served_max_model_len": 65536, "violations": [
            {"severity": "error", "message": "client_limits.context 131072 exceeds the server's max_model_len 65536"},
            {"severity": "warning", "message": "ignored"}]}, False, "client_limits.context 131072 exceeds"),
        ({"feasible": True, "served_max_model_len": 65536, "violations": [{"severity": "error", "message": "F27"}]},
         False, "cap: F27"),
    ],
)  # fmt: skip
def test_the_planner_verdict(plan, accepted, why) -> None:
    got = _trials.planner_verdict("cap", plan, 65536)
    assert got["accepted"] is accepted and why in got["why"] and "ignored" not in got["why"]
