# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tune's trials: which candidate goes next, and what the tune leaves for review.

- :func:`next_trial`: the next candidate whose finding the incumbent (the stack serving now)
  still has, within ``tune_max_trials`` and ``tune_budget_minutes`` (a trial is not started
  when the longest one so far would overrun the budget).
- :func:`recipe_diff`: the tuned recipe (the inventory's, with the tune's knobs as the stack
  serving now has them) as a unified diff against the inventory's ``vllm_recipe`` (YAML,
  sorted), for review; never written into the inventory.
- :func:`planner_verdict`: whether the plan of a candidate lets it be tried.
- :func:`document`: ``tune.json``. No I/O here.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.tune._objective import FIGURES
from ansible_collections.localinference.vllm.plugins.module_utils.tune._rules import KNOBS, findings

SCHEMA = 1


def next_trial(
    candidates: list[dict[str, Any]], trials: list[dict[str, Any]], incumbent: dict[str, Any], *,
    max_trials: int, budget_s: float, elapsed_s: float,
) -> dict[str, Any]:
    """``{candidate, why}``: the candidate to try now, or None and why the tune stops."""
    if len(trials) >= max_trials:
        return {"candidate": None, "why": f"tune_max_trials ({max_trials}) reached"}
    longest = max((float(t.get("seconds") or 0) for t in trials), default=0.0)
    if trials and elapsed_s + longest > budget_s:
        return {
            "candidate": None,
            "why": f"tune_budget_minutes ({budget_s / 60:g}) would be overrun: {elapsed_s / 60:.1f} min spent,"
            f" the longest trial took {longest / 60:.1f} min",
        }
    open_checks = {f["check"] for f in findings(incumbent.get("checks") or {}, incumbent.get("figures") or {})}
    if not open_checks:
        return {"candidate": None, "why": "nothing to gain: no check the rules answer fails or passes weakly"}
    tried = {t["candidate"]["id"] for t in trials}
    for candidate in candidates:
        if candidate["id"] not in tried and candidate["finding"] in open_checks:
            return {"candidate": candidate, "why": f"{candidate['finding']} is still open"}
    return {"candidate": None, "why": "every candidate for " + ", ".join(sorted(open_checks)) + " was tried or dropped"}


def planner_verdict(candidate_id: str, plan: dict[str, Any], served: int) -> dict[str, Any]:
    """The plan role's judgement of a candidate (``plan_budget``): accepted only when it is feasible,
    has no error, and serves the ``served`` context the agents were configured with."""
    errors = [v.get("message", "") for v in plan.get("violations") or [] if v.get("severity") == "error"]
    feasible = bool(plan.get("feasible")) and not errors
    length = int(plan.get("served_max_model_len") or 0)
    if not feasible:
        why = "; ".join(errors) or "the plan is not feasible"
    elif length != served:
        why = f"it would serve {length} tokens of context, not the {served} the agents were configured with"
    else:
        why = f"the plan fits, with the same {served} tokens of context"
    return {
        "accepted": feasible and length == served,
        "feasible": bool(plan.get("feasible")),
        "served_max_model_len": length,
        "concurrency": plan.get("concurrency") or {},
        "why": f"{candidate_id}: {why}",
    }


def _yaml(recipe: dict[str, Any]) -> list[str]:
    """The recipe as YAML, one key per line, sorted; each value in JSON's flow form (valid YAML)."""
    lines = ["vllm_recipe:\n"]
    lines += [f"  {key}: {json.dumps(recipe[key], sort_keys=True)}\n" for key in sorted(recipe)]
    return lines


def tuned_recipe(inventory: dict[str, Any], serving: dict[str, Any]) -> dict[str, Any]:
    """The inventory's recipe with the tune's knobs as the stack serving now has them."""
    tuned = dict(inventory)
    for knob in KNOBS:
        if serving.get(knob) is not None and serving[knob] != inventory.get(knob):
            tuned[knob] = serving[knob]
    return tuned


def recipe_diff(inventory: dict[str, Any], serving: dict[str, Any]) -> str:
    """:func:`tuned_recipe` against the inventory's, as a unified diff ('' when they are the same)."""
    return "".join(difflib.unified_diff(
        _yaml(inventory), _yaml(tuned_recipe(inventory, serving)), "vllm_recipe (inventory)", "vllm_recipe (tuned)",
    ))


def before_after(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The objective's figures before the tune and on the stack serving after it, one line each."""
    old, new = before.get("figures") or {}, after.get("figures") or {}
    return [f"{name}: {old.get(name, '-')} -> {new.get(name, '-')}" for name in FIGURES]


def document(
    *, status: str, findings_found: list[dict[str, Any]], candidates: list[dict[str, Any]],
    dropped: list[dict[str, Any]], skipped: list[dict[str, Any]], trials: list[dict[str, Any]],
    before: dict[str, Any], after: dict[str, Any], weights: dict[str, float], stopped: str,
) -> dict[str, Any]:
    """``tune.json``: every candidate, what the planner said, every trial and the figures before/after."""
    serving = next((t["trial"] for t in reversed(trials) if t.get("outcome") == "promoted"), None)
    return {
        "schema": SCHEMA,
        "status": status,
        "stopped": stopped,
        "weights": weights,
        "findings": findings_found,
        "candidates": candidates,
        "dropped_by_planner": dropped,
        "skipped": skipped,
        "trials": trials,
        "serving_trial": serving,
        "before": before,
        "after": after,
    }
