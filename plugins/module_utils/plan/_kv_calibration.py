# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which observations calibrate together: one calibration per model and split.

Part of the KV model (``_kv_model``, which re-exports these names); no AnsibleModule.
"""

from __future__ import annotations

from typing import Any

# What decides the KV bytes one token costs per rank: the model and how it is
# split and stored. Not max_model_len, not the KV size (the plan's variables),
# not the ports or parsers. The vLLM version is in each observation.
CALIBRATION_KEYS = (
    ("model", None),
    ("tensor_parallel_size", 1),
    ("pipeline_parallel_size", 1),
    ("kv_cache_dtype", "auto"),
    ("dtype", "auto"),
    ("quantization", "none"),
)


def calibration_key(recipe: dict[str, Any] | None) -> str | None:
    """The calibration a recipe's boots belong to (readable, so an inventory can state it)."""
    if not isinstance(recipe, dict) or not recipe.get("model"):
        return None
    return " ".join(
        f"{key}={recipe.get(key) if recipe.get(key) is not None else default}"
        for key, default in CALIBRATION_KEYS
    )


def _label(key: str) -> str:
    """A calibration key as written; a recipe hash shortened."""
    return key if " " in key else key[:12]


def _calibration_of(entry: dict[str, Any]) -> str | None:
    return entry.get("calibration") or entry.get("recipe_hash")


def calibrations(
    entries: list[dict[str, Any]], recipe_hash: str | None = None
) -> tuple[list[tuple[str | None, list[dict[str, Any]]]], list[str]]:
    """Split observations into calibrations (one per ``calibration``, else per ``recipe_hash``).

    Boots of recipes that differ only in what the plan varies (max_model_len,
    the KV size) share a calibration key (:func:`calibration_key`), so they
    calibrate a + b*L together; older entries without one group by recipe hash.

    With ``recipe_hash``: that recipe's observations when there are any (the
    others are left out); none yet, every recipe (the caller plans against the
    worst). Without: every recipe, each on its own.
    """
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for entry in entries:
        groups.setdefault(_calibration_of(entry), []).append(entry)
    notes: list[str] = []
    named = ", ".join(_label(key) for key in groups if key is not None) or "none"
    if recipe_hash is not None and recipe_hash in groups:
        others = sum(len(group) for key, group in groups.items() if key != recipe_hash)
        if others:
            notes.append(
                f"planned on the {len(groups[recipe_hash])} observation(s) of recipe"
                f" {_label(recipe_hash)}; {others} observation(s) of other recipes were left out"
                " (a recipe is its own calibration)"
            )
        return [(recipe_hash, groups[recipe_hash])], notes
    if recipe_hash is not None and groups:
        notes.append(
            f"no observation of recipe {_label(recipe_hash)} yet: planned against the worst of the"
            f" recorded recipes ({named}); the next boot calibrates this recipe"
        )
    elif len(groups) > 1:
        notes.append(
            f"observations of {len(groups)} recipes ({named}"
            f"{', and entries without recipe_hash' if None in groups else ''}): each is its own"
            " calibration, never averaged; planned against the worst"
        )
    return list(groups.items()), notes
