# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What each benchmark must have measured before it may exit 0: one table for bench.py and
each part's own ``main``, so that no benchmark reports success over figures it never made."""

from __future__ import annotations

import math
from typing import Any

# part -> the figures its result must hold as finite numbers ("a.b" reads a nested key).
MEASURES: dict[str, tuple[str, ...]] = {
    "verify": ("verify_ratio", "reverify_ms_per_100_files"),
    "rollout": ("rollout_seconds", "rollout_first_token_ratio"),
    "watchdog": ("watchdog_detect_seconds", "watchdog_recover_seconds", "watchdog_recover_ratio"),
    "noop": ("noop_seconds", "noop_ratio"),
    "kv": ("calibration_relative_error", "error_calibration_relative_error"),
    "growth": ("growth_per_added_node.noop_seconds", "growth_per_added_node.before_engine_seconds"),
}


def unmeasured(result: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """The ``keys`` whose value in ``result`` is missing or not a finite number."""
    missing = []
    for key in keys:
        value: Any = result
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            missing.append(key)
    return missing


def exit_code(part: str, result: dict[str, Any], ok: bool = True) -> int:
    """0 when ``ok`` and every figure of ``part`` was measured; else 1, naming what was not."""
    missing = unmeasured(result, MEASURES[part])
    if missing:
        print(f"{part}: measured nothing for {', '.join(missing)}", flush=True)
    return 0 if ok and not missing else 1
