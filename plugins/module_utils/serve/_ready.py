# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Readiness of a vLLM endpoint: a streamed first token, not only ``/health``.

Pure helpers: parse server-sent-event lines of ``/v1/chat/completions`` (as
they arrive, in chunks of any size) and systemd ``show`` output.  The module
does the waiting and the HTTP.
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
    except (ValueError, RecursionError):
        return None
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    for choice in choices if isinstance(choices, list) else []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            continue
        for key in TEXT_KEYS:
            if isinstance(delta.get(key), str) and delta[key]:
                return {"key": key, "text": delta[key]}
        if delta.get("tool_calls"):
            return {"key": "tool_calls", "text": json.dumps(delta["tool_calls"])}
    return None


class SseError(ValueError):
    """The stream is not server-sent events."""


class SseReader:
    """Feed the bytes of an SSE stream as they arrive; ``feed`` returns the first token.

    Counts what came instead of a token (keep-alive comments, data events) so a
    deadline error can say what the server did.
    """

    MAX_LINE = 1024 * 1024

    def __init__(self) -> None:
        self.pending = b""
        self.bytes = 0
        self.comments = 0
        self.events = 0

    def feed(self, chunk: bytes) -> dict[str, Any] | None:
        self.bytes += len(chunk)
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r")
            if line.startswith(b":"):
                self.comments += 1
                continue
            if line.startswith(b"data:"):
                self.events += 1
                token = sse_token(line.decode("utf-8", "replace"))
                if token:
                    return token
        if len(self.pending) > self.MAX_LINE:
            raise SseError(f"the stream sent more than {self.MAX_LINE} bytes without a line end")
        return None

    def summary(self) -> str:
        return (
            f"{self.bytes} bytes: {self.comments} keep-alive comment(s),"
            f" {self.events} data event(s), no generated token"
        )


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
    if show.get("LoadState") in ("not-found", "bad-setting", "error", "masked"):
        return (
            f"unit cannot be watched (LoadState={show['LoadState']}): check the unit name"
            " ('systemctl list-units --all') and the unit file"
        )
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
