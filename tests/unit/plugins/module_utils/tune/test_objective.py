# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tune's objective: verdict ordering first, then the weighted score; ties keep the incumbent."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.tune import _objective

W = _objective.DEFAULT_WEIGHTS
BEFORE = {
    "checks": {"head_of_line": "fail", "concurrency": "pass", "context_ladder": "not_meaningful"},
    "figures": {"head_of_line_stall_s": 3.6, "decode_tps_single": 97.1, "concurrent_requests": 4.0,
                "max_context_accepted": 33199},
}


def _trial(checks: dict[str, str] | None = None, **figures: Any) -> dict[str, Any]:
    return {"checks": {**BEFORE["checks"], **(checks or {})}, "figures": {**BEFORE["figures"], **figures}}


@pytest.mark.parametrize(
    ("trial", "keep", "why"),
    [
        # The lab's case: head_of_line fixed, decode a little slower: fewer fails wins.
        (_trial({"head_of_line": "pass"}, head_of_line_stall_s=0.2, decode_tps_single=90.0), True, "fewer checks fail (1 -> 0)"),
        # A fixed check does not excuse a broken one.
        (_trial({"head_of_line": "pass", "concurrency": "fail"}), False, "a check got worse: concurrency: pass -> fail"),
        (_trial({"context_ladder": "fail"}), False, "context_ladder: not_meaningful -> fail"),
        # Same checks: the score decides.
        (_trial(head_of_line_stall_s=2.5), True, "the score gains +0.365"),
        (_trial(decode_tps_single=98.0), False, "no gain worth a change"),
        (_trial(decode_tps_single=80.0), False, "no gain worth a change (score -0.194"),
        # A check the trial did not report counts as failed.
        ({"checks": {"head_of_line": "fail"}, "figures": BEFORE["figures"]}, False, "concurrency: pass -> fail"),
    ],
)  # fmt: skip
def test_judge(trial: dict[str, Any], keep: bool, why: str) -> None:
    got = _objective.judge(BEFORE, trial, W)
    assert got["keep"] is keep
    assert why in got["why"]


def test_one_figure_moves_the_score_by_at_most_the_cap() -> None:
    gain, terms = _objective.score({"head_of_line_stall_s": 100.0}, {"head_of_line_stall_s": 0.0001}, W)
    assert gain == _objective.TERM_CAP and len(terms) == 1


def test_weights_steer_the_score() -> None:
    slower_but_smoother = _trial(head_of_line_stall_s=1.8, decode_tps_single=60.0)
    assert _objective.judge(BEFORE, slower_but_smoother, W)["keep"] is True
    decode_first = _objective.weights_of({"decode_tps_single": 5})
    assert _objective.judge(BEFORE, slower_but_smoother, decode_first)["keep"] is False


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"decode_tps_single": "fast"}, r"tune_weights.decode_tps_single: expected a number"),
        ({"decode_tps_single": float("nan")}, r"tune_weights.decode_tps_single: nan is not a finite number"),
        ({"decode_tps_single": -1}, r"tune_weights.decode_tps_single: .* below 0"),
        ({"throughput": 1}, r"tune_weights.throughput: is not a figure of the objective"),
        ({name: 0 for name in W}, r"tune_weights: every weight is 0"),
        ([1, 2], r"tune_weights: expected a mapping"),
    ],
)  # fmt: skip
def test_bad_weights_are_refused_naming_the_option(given: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _objective.weights_of(given)
