# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tune's declared objective: is a trial better than the stack it would replace?

1. **Verdict ordering.** No check may get worse (pass > not meaningful > fail); a trial with
   fewer failed checks than the incumbent is better whatever its figures.
2. **Score.** Otherwise the weighted sum of the log-ratios of the figures that matter to a
   coding agent (:data:`FIGURES`), each signed so that better is positive. A trial must gain
   more than :data:`TIE` to be kept: a tie keeps the incumbent, the simpler recipe.

Both sides are ``{checks: {name: status}, figures: {...}}`` as the qualification publishes
them (``qualify_result``). No I/O here.
"""

from __future__ import annotations

import math
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)

STATUS_RANK = {"fail": 0, "not_meaningful": 1, "pass": 2}
# figure -> (which way is better, what it means to an agent, the smallest value compared)
FIGURES: dict[str, tuple[str, str, float]] = {
    "head_of_line_stall_s": ("lower", "time to first token behind a long prefill", 0.05),
    "decode_tps_single": ("higher", "single-stream decode tok/s", 0.1),
    "concurrent_requests": ("higher", "concurrent streams held", 0.1),
    "max_context_accepted": ("higher", "accepted context", 1.0),
}
DEFAULT_WEIGHTS = {
    "head_of_line_stall_s": 1.0,
    "decode_tps_single": 1.0,
    "concurrent_requests": 0.5,
    "max_context_accepted": 0.5,
}
# A gain of at most this (about 2 % on one weight-1 figure) is a tie: the incumbent stays.
TIE = 0.02
# One figure moves the score by at most this (a stall from 3 s to 0.01 s is not worth 6).
TERM_CAP = 2.0


def weights_of(given: Any) -> dict[str, float]:
    """``tune_weights`` over the defaults; every weight a finite number >= 0, names known."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ValidationError("tune_weights", f"expected a mapping, got {validate.shown(given)}",
                              f"map some of {', '.join(FIGURES)} to a number")
    weights = dict(DEFAULT_WEIGHTS)
    for name, value in given.items():
        if name not in FIGURES:
            raise ValidationError(f"tune_weights.{name}", "is not a figure of the objective",
                                  f"weigh some of {', '.join(FIGURES)}")
        weights[name] = validate.number(f"tune_weights.{name}", value, minimum=0, maximum=100)
    if not any(weights.values()):
        raise ValidationError("tune_weights", "every weight is 0", "give at least one figure a weight above 0")
    return weights


def worse_checks(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Checks whose status is worse after than before (a check missing after counts as failed)."""
    worse = []
    for name, status in sorted(before.items()):
        new = after.get(name, "fail")
        if STATUS_RANK.get(new, 0) < STATUS_RANK.get(status, 0):
            worse.append(f"{name}: {status} -> {new}")
    return worse


def score(before: dict[str, Any], after: dict[str, Any], weights: dict[str, float]) -> tuple[float, list[str]]:
    """The weighted, capped log-ratio gain of ``after`` over ``before``, and each term said."""
    total, terms = 0.0, []
    for name, (better, meaning, floor) in FIGURES.items():
        old, new = validate.finite(before.get(name)), validate.finite(after.get(name))
        if old is None or new is None or not weights.get(name):
            continue
        ratio = math.log(max(new, floor) / max(old, floor))
        gain = max(-TERM_CAP, min(TERM_CAP, ratio if better == "higher" else -ratio))
        total += weights[name] * gain
        terms.append(f"{meaning} {old:g} -> {new:g} ({weights[name] * gain:+.3f})")
    return round(total, 4), terms


def judge(incumbent: dict[str, Any], trial: dict[str, Any], weights: dict[str, float]) -> dict[str, Any]:
    """``{keep, why, score, terms, worse}``: whether ``trial`` replaces ``incumbent``."""
    before_checks, after_checks = incumbent.get("checks") or {}, trial.get("checks") or {}
    gain, terms = score(incumbent.get("figures") or {}, trial.get("figures") or {}, weights)
    worse = worse_checks(before_checks, after_checks)
    fails = [sum(1 for s in c.values() if s == "fail") for c in (before_checks, after_checks)]
    if worse:
        keep, why = False, "a check got worse: " + "; ".join(worse)
    elif fails[1] < fails[0]:
        keep, why = True, f"fewer checks fail ({fails[0]} -> {fails[1]}), none got worse"
    elif gain > TIE:
        keep, why = True, f"no check worse and the score gains {gain:+.3f} (> {TIE})"
    else:
        keep, why = False, f"no gain worth a change (score {gain:+.3f} <= {TIE}): the simpler, serving recipe stays"
    return {"keep": keep, "why": why, "score": gain, "terms": terms, "worse": worse}
