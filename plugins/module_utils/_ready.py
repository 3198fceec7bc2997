# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Readiness of a vLLM endpoint: a streamed first token, not only ``/health``.

Pure helpers: parse server-sent-event lines of ``/v1/chat/completions`` and
systemd ``show`` output.  The module does the waiting and the HTTP.
"""

from __future__ import annotations

import json
from typing import Any

# Delta keys that carry generated text: vLLM 0.32 sends ``reasoning``; older
# builds and other servers ``reasoning_content`` (F7).
TEXT_KEYS = ("content", "reasoning", "reasoning_content")


def sse_token(line: str) -> dict[str, Any] | None:
    """``{"key": ..., "text": ...}`` when an SSE line carries generated output, else None."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    payload = line[len("data:") :].strip()
    if not payload or payload == "[DONE]":
        return None
    try:
        chunk = json.loads(payload)
    except ValueError:
        return None
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        for key in TEXT_KEYS:
            if delta.get(key):
                return {"key": key, "text": delta[key]}
        if delta.get("tool_calls"):
            return {"key": "tool_calls", "text": json.dumps(delta["tool_calls"])}
    return None


def parse_show(output: str) -> dict[str, str]:
    """``systemctl show -p A -p B UNIT`` output as a dict."""
    values = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def unit_failed(show: dict[str, str], restarts_before: int = 0) -> str | None:
    """Why a unit counts as a failed start, or None while it may still come up."""
    if show.get("ActiveState") == "failed":
        return f"unit failed ({show.get('Result', 'unknown result')})"
    if show.get("SubState") == "auto-restart":
        return "unit exited and systemd is restarting it (Restart=on-failure)"
    try:
        restarts = int(show.get("NRestarts", "0") or 0)
    except ValueError:
        restarts = 0
    if restarts > restarts_before:
        return f"unit restarted {restarts - restarts_before} time(s) since the start"
    if show.get("ActiveState") == "inactive" and show.get("LoadState") == "loaded":
        return "unit is inactive (stopped or exited)"
    return None
