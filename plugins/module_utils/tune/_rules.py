# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""From the qualification's findings to candidate recipe changes: one table of rules.

A finding is a check of the serving stack's qualification that failed, or passed weakly
(its figure on the wrong side of the rule's own line). Each rule of :data:`RULES` names the
finding it answers, the knobs it turns, the direction, and where the rule comes from (vLLM's
documentation or a publisher's report). :func:`propose` turns every applicable rule into a
candidate: the keys to set over the serving recipe (``upgrade_set``), each within the knob's
bounds (:data:`KNOBS`, narrowed by the operator's ``tune_bounds``). A rule that has nothing
to change (the knob is already at its bound, or set as the rule would set it) is said in
``skipped`` with the reason, never proposed.

What the rules never touch: the model, its revision and quantization, the image, the served
context (``max_model_len``) the agents were configured with. The planner checks every
candidate before any boot (roles/tune); this module only proposes. No I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)

FAIL, PASS = "fail", "pass"
VLLM_DOCS = "vLLM docs, Optimization and Tuning (https://docs.vllm.ai/en/stable/configuration/optimization/)"
VLLM_HELP = "vLLM 0.32.0 `vllm serve --help=all`, SchedulerConfig (../shared/fixtures/vllm-0.32.0)"
MIAAI = "MiaAI DSpark scheduler hotfixes: at most two long prefills in flight, decode fairness (BRIEF, field reports)"
# vLLM's own token budget when a recipe leaves max_num_batched_tokens unset and chunked
# prefill is on (the V1 engine's default for the API server; the engine log says which).
DEFAULT_BATCHED = 2048


@dataclass(frozen=True)
class Knob:
    """A recipe key the rules may turn, with the widest bounds the planner accepts."""

    kind: str  # "int", "float" or "bool"
    minimum: float = 0
    maximum: float = 0


# Every knob the rules turn; tune_knobs and tune_bounds may only name these.
KNOBS: dict[str, Knob] = {
    "enable_chunked_prefill": Knob("bool"),
    "long_prefill_token_threshold": Knob("int", 64, 1 << 20),
    "max_num_batched_tokens": Knob("int", 256, 1 << 20),
    "max_num_seqs": Knob("int", 1, 1024),
    "gpu_memory_utilization": Knob("float", 0.5, 0.95),
    "enable_prefix_caching": Knob("bool"),
}


@dataclass(frozen=True)
class Rule:
    """Finding -> knobs, direction and source; ``change`` computes the keys to set."""

    name: str
    check: str
    knobs: tuple[str, ...]
    direction: str
    source: str
    change: Callable[[dict[str, Any], dict[str, Any], dict[str, tuple[float, float]]], dict[str, Any]]
    # A passed check is still a finding when this says so (its figures): None for fail only.
    weak: Callable[[dict[str, Any]], str | None] | None = None


def _budget(recipe: dict[str, Any]) -> int:
    return validate.whole("max_num_batched_tokens", recipe.get("max_num_batched_tokens") or DEFAULT_BATCHED)


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return max(bounds[0], min(bounds[1], value))


def _cap_long_prefills(recipe: dict[str, Any], figures: dict[str, Any], bounds: dict) -> dict[str, Any]:
    """A long prompt takes at most a quarter of the step's tokens while others wait."""
    cap = int(_clamp(_budget(recipe) // 4, bounds["long_prefill_token_threshold"]))
    return {"enable_chunked_prefill": True, "long_prefill_token_threshold": cap}


def _smaller_steps(recipe: dict[str, Any], figures: dict[str, Any], bounds: dict) -> dict[str, Any]:
    """Half the step's token budget: a waiting request is scheduled sooner, a prefill in more steps."""
    budget = int(_clamp(_budget(recipe) // 2, bounds["max_num_batched_tokens"]))
    return {"enable_chunked_prefill": True, "max_num_batched_tokens": budget}


def _more_sequences(recipe: dict[str, Any], figures: dict[str, Any], bounds: dict) -> dict[str, Any]:
    current = int(recipe.get("max_num_seqs") or 1)
    return {"max_num_seqs": int(_clamp(current * 2, bounds["max_num_seqs"]))}


def _more_kv_memory(recipe: dict[str, Any], figures: dict[str, Any], bounds: dict) -> dict[str, Any]:
    if recipe.get("kv_cache_memory_bytes") is not None:
        return {}  # the KV size is pinned in bytes: gpu_memory_utilization does not size it
    current = float(recipe.get("gpu_memory_utilization") or 0.9)
    return {"gpu_memory_utilization": round(_clamp(current + 0.05, bounds["gpu_memory_utilization"]), 2)}


def _prefix_caching(recipe: dict[str, Any], figures: dict[str, Any], bounds: dict) -> dict[str, Any]:
    return {"enable_prefix_caching": True}


# A short request may wait this long behind a long prefill and the check still pass (its
# own line is 2 s and half the prefill): a stall above this is a weak pass worth a trial.
WEAK_STALL_S = 1.0


def _stall_weak(figures: dict[str, Any]) -> str | None:
    stall = figures.get("head_of_line_stall_s")
    if isinstance(stall, (int, float)) and not isinstance(stall, bool) and stall >= WEAK_STALL_S:
        return f"passed, but a short request still waited {stall:g} s behind a long prefill (>= {WEAK_STALL_S:g} s)"
    return None


# The table: the order is the order of the trials (cheapest to the throughput first).
RULES: tuple[Rule, ...] = (
    Rule(
        "cap_long_prefills",
        "head_of_line",
        ("enable_chunked_prefill", "long_prefill_token_threshold"),
        "long_prefill_token_threshold down from unlimited",
        f"{VLLM_HELP}: --long-prefill-token-threshold; {MIAAI}",
        _cap_long_prefills,
        weak=_stall_weak,
    ),
    Rule(
        "smaller_steps",
        "head_of_line",
        ("enable_chunked_prefill", "max_num_batched_tokens"),
        "max_num_batched_tokens down (half)",
        f"{VLLM_DOCS}, Chunked Prefill: smaller max_num_batched_tokens, better inter-token latency",
        _smaller_steps,
    ),
    Rule(
        "more_sequences",
        "concurrency",
        ("max_num_seqs",),
        "max_num_seqs up (double)",
        f"{VLLM_DOCS}: max_num_seqs bounds the requests batched together",
        _more_sequences,
    ),
    Rule(
        "more_kv_memory",
        "context_ladder",
        ("gpu_memory_utilization",),
        "gpu_memory_utilization up (+0.05)",
        f"{VLLM_DOCS}, Preemption: increase gpu_memory_utilization for more KV cache",
        _more_kv_memory,
    ),
    Rule(
        "prefix_caching",
        "shared_prefix",
        ("enable_prefix_caching",),
        "enable_prefix_caching on",
        f"{VLLM_DOCS}: automatic prefix caching reuses the KV of a shared prefix",
        _prefix_caching,
    ),
)


def bounds_of(knobs: list[str] | None, overrides: Any) -> tuple[list[str], dict[str, tuple[float, float]]]:
    """The knobs the operator lets the tune turn, and each one's bounds (tune_knobs, tune_bounds)."""
    allowed = list(KNOBS) if not knobs else []
    for index, knob in enumerate(knobs or []):
        if knob not in KNOBS:
            raise ValidationError(
                f"tune_knobs[{index}]", f"{validate.shown(knob)} is not a knob the tune turns",
                f"use some of {', '.join(KNOBS)}, or leave tune_knobs empty for all",
            )
        allowed.append(knob)
    if not isinstance(overrides, dict):
        raise ValidationError("tune_bounds", f"expected a mapping, got {validate.shown(overrides)}",
                              "map a knob to {min: N, max: N}")
    bounds = {name: (knob.minimum, knob.maximum) for name, knob in KNOBS.items()}
    for name, given in overrides.items():
        knob = KNOBS.get(name)
        if knob is None or knob.kind == "bool":
            raise ValidationError(
                f"tune_bounds.{name}", "is not a numeric knob the tune turns",
                f"bound one of {', '.join(k for k, v in KNOBS.items() if v.kind != 'bool')}",
            )
        if not isinstance(given, dict) or set(given) - {"min", "max"}:
            raise ValidationError(f"tune_bounds.{name}", f"expected {{min, max}}, got {validate.shown(given)}",
                                  "write {min: N, max: N} (either may be left out)")
        low, high = bounds[name]
        pick = validate.integer if knob.kind == "int" else validate.number
        low = pick(f"tune_bounds.{name}.min", given.get("min", low), minimum=knob.minimum, maximum=knob.maximum)
        high = pick(f"tune_bounds.{name}.max", given.get("max", high), minimum=knob.minimum, maximum=knob.maximum)
        if low > high:
            raise ValidationError(f"tune_bounds.{name}", f"min {low:g} is above max {high:g}", "swap them")
        bounds[name] = (low, high)
    return allowed, bounds


def findings(checks: dict[str, str], figures: dict[str, Any]) -> list[dict[str, str]]:
    """Every check a rule answers that failed, or passed weakly (by the rule's own line)."""
    found, seen = [], set()
    for rule in RULES:
        if rule.check in seen:
            continue
        status = checks.get(rule.check)
        why = "failed" if status == FAIL else (rule.weak(figures) if rule.weak and status == PASS else None)
        if why:
            seen.add(rule.check)
            found.append({"check": rule.check, "status": status, "why": why})
    return found


def _same(recipe: dict[str, Any], key: str, value: Any) -> bool:
    current = recipe.get(key)
    if isinstance(value, float) and isinstance(current, (int, float)):
        return math.isclose(float(current), value)
    return current == value


def _effective(recipe: dict[str, Any], engine: dict[str, Any] | None) -> dict[str, Any]:
    """The recipe with what the engine reported it settled on where the recipe is silent."""
    effective = dict(recipe)
    reported = (engine or {}).get("max_num_batched_tokens")
    if effective.get("max_num_batched_tokens") is None and isinstance(reported, int) and reported > 0:
        effective["max_num_batched_tokens"] = reported
    return effective


def _was(recipe: dict[str, Any], effective: dict[str, Any], key: str) -> str:
    if key in recipe and recipe[key] is not None:
        return repr(recipe[key])
    return f"unset (the engine's {effective[key]!r})" if effective.get(key) is not None else "unset"


def propose(
    recipe: dict[str, Any], checks: dict[str, str], figures: dict[str, Any],
    knobs: list[str] | None = None, bounds: Any = None, engine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``{findings, candidates, skipped}`` for the serving ``recipe`` and its qualification.

    ``engine`` is what the serving engine's log said it settled on (``max_num_batched_tokens``
    when the recipe leaves it to vLLM): the rules start from it, not from a guess.
    """
    allowed, limits = bounds_of(knobs, bounds if bounds is not None else {})
    effective = _effective(recipe, engine)
    found = findings(checks, figures)
    open_checks = {f["check"] for f in found}
    candidates: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for rule in RULES:
        if rule.check not in open_checks:
            continue
        if not set(rule.knobs) & set(allowed):
            skipped.append({"rule": rule.name, "why": f"{rule.name}: tune_knobs leaves out {', '.join(rule.knobs)}"})
            continue
        wanted = {k: v for k, v in rule.change(effective, figures, limits).items() if k in allowed}
        changes = {k: v for k, v in wanted.items() if not _same(recipe, k, v)}
        if not changes or not any(k in changes for k in rule.knobs[-1:]):
            now = ", ".join(f"{k} is {_was(recipe, effective, k)}" for k in rule.knobs)
            skipped.append({
                "rule": rule.name,
                "why": f"{rule.name}: nothing to change: {now} (at its bound or already set so)",
            })
            continue
        candidates.append({
            "id": f"{rule.check}/{rule.name}",
            "rule": rule.name,
            "finding": rule.check,
            "set": changes,
            "changes": [f"{k}: {_was(recipe, effective, k)} -> {v!r}" for k, v in changes.items()],
            "direction": rule.direction,
            "source": rule.source,
        })
    return {"findings": found, "candidates": candidates, "skipped": skipped}
