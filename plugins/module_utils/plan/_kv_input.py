# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Observations and plan options checked: every error names the entry, the field and the fix.

Part of the KV model (``_kv_model``, which re-exports these names); no AnsibleModule.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

# Where an observation comes from: a boot that reported its KV cache, or the
# calibration points of a start that failed for lack of KV (vllm_log_facts).
SOURCES = ("boot", "error_report")


class KvInputError(validate.InputError):
    """Bad input; the message names the option and the fix."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def normalise_observations(raw: list[Any], name: str = "observations") -> list[dict[str, Any]]:
    """Validate observation entries; errors name the entry and field."""
    if not isinstance(raw, list):
        raise KvInputError(f"{name} must be a list of observation dicts")
    entries = []
    for index, item in enumerate(raw):
        where = f"{name}[{index}]"
        if not isinstance(item, dict):
            raise KvInputError(f"{where} must be a dict with max_model_len and kv_tokens")
        for required in ("max_model_len", "kv_tokens"):
            if item.get(required) is None:
                raise KvInputError(
                    f"{where}.{required} is missing: each observation needs max_model_len and"
                    " kv_tokens as vLLM reported them (see vllm_log_facts)"
                )
        entry = dict(item)
        for key in ("max_model_len", "kv_tokens"):
            entry[key] = validate.whole(f"{where}.{key}", item[key], minimum=1, error=KvInputError)
        for key in ("recipe_hash", "calibration"):
            value = item.get(key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise KvInputError(f"{where}.{key} must be a non-empty string, got {_shown(value)}")
        for key in ("kv_memory_gib", "available_kv_gib"):
            if item.get(key) is not None:
                entry[key] = validate.number(f"{where}.{key}", item[key], above=0, error=KvInputError)
        for key in ("constant_per_token", "memory_observed"):
            if item.get(key) is not None and not isinstance(item[key], bool):
                raise KvInputError(f"{where}.{key} must be true or false, got {_shown(item[key])}")
        if item.get("source") is not None and item["source"] not in SOURCES:
            raise KvInputError(
                f"{where}.source must be one of {', '.join(SOURCES)}, got {_shown(item['source'])}"
            )
        entries.append(entry)
    return entries


def read_observations_file(path: str | None) -> list[Any]:
    """Observations saved on the node: schema-checked, never trusted (F10-style message)."""
    if not path or not os.path.lexists(path):
        return []
    fix = "move it aside and let the next rollout record a boot again"
    limit = 64 * 1024 * 1024
    if not os.path.isfile(path) or os.path.getsize(path) > limit:
        raise KvInputError(f"observations_path {path} is not a regular observation file; {fix}")
    try:
        data = json.loads(_files.read_bytes(path, limit, whole=True).decode("utf-8"), parse_constant=_no_constant)
    except (OSError, OverflowError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise KvInputError(f"observations_path {path} is not a JSON list ({exc}); {fix}") from None
    if not isinstance(data, list):
        raise KvInputError(
            f"observations_path {path} holds a {type(data).__name__}, not a list of observations; {fix}"
        )
    return normalise_observations(data, f"observations_path {path}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")
