# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the tune (roles/tune) and the upgrade's objective gate; the logic lives in module_utils/tune.

- ``tune_propose``: the candidate recipe changes for the serving recipe's qualification (one table).
- ``tune_weights``: ``tune_weights`` over the objective's defaults, checked.
- ``tune_judge``: whether a trial's qualification beats the incumbent's (verdict ordering, then score).
- ``tune_next``: the next trial, or none and why the tune stops.
- ``tune_planner_verdict``: whether the plan role's judgement of a candidate lets it be tried.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.tune import (
    _objective,
    _rules,
    _trials,
)


def _checked(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except ValidationError as exc:
        raise AnsibleFilterError(str(exc)) from None


def _measured(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("checks", {}), dict):
        raise AnsibleFilterError(f"{name} must be a qualification result with checks and figures, got {str(value)[:100]!r}")
    return value


def tune_propose(
    recipe: Any, qualification: Any, knobs: Any = None, bounds: Any = None, engine: Any = None
) -> dict[str, Any]:
    if not isinstance(recipe, dict):
        raise AnsibleFilterError(f"tune_propose: vllm_recipe must be a mapping, got {type(recipe).__name__}")
    if knobs is not None and not isinstance(knobs, list):
        raise AnsibleFilterError(f"tune_knobs must be a list of knobs, got {str(knobs)[:100]!r}")
    measured = _measured("the qualification", qualification)
    return _checked(_rules.propose, recipe, measured.get("checks") or {}, measured.get("figures") or {},
                    knobs or None, bounds if bounds is not None else {}, engine if isinstance(engine, dict) else {})


def tune_weights(given: Any) -> dict[str, float]:
    return _checked(_objective.weights_of, given)


def tune_judge(trial: Any, incumbent: Any, weights: Any) -> dict[str, Any]:
    return _objective.judge(_measured("the incumbent", incumbent), _measured("the trial", trial),
                            tune_weights(weights))


def tune_next(candidates: Any, trials: Any, incumbent: Any, max_trials: Any, budget_minutes: Any,
              elapsed_s: Any) -> dict[str, Any]:
    if not isinstance(candidates, list) or not isinstance(trials, list):
        raise AnsibleFilterError("tune_next: candidates and trials must be lists")
    return _trials.next_trial(
        candidates, trials, _measured("the incumbent", incumbent), max_trials=int(max_trials),
        budget_s=float(budget_minutes) * 60, elapsed_s=float(elapsed_s),
    )


def tune_planner_verdict(plan: Any, candidate_id: Any, served: Any) -> dict[str, Any]:
    if not isinstance(plan, dict):
        raise AnsibleFilterError(f"tune_planner_verdict: plan_budget must be a mapping, got {str(plan)[:100]!r}")
    return _trials.planner_verdict(str(candidate_id), plan, int(served))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "tune_propose": tune_propose,
            "tune_weights": tune_weights,
            "tune_judge": tune_judge,
            "tune_next": tune_next,
            "tune_planner_verdict": tune_planner_verdict,
        }
