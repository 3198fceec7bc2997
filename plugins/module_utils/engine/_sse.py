# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The first generated token of vLLM's server-sent-event stream, read as it arrives.

Pure helpers: parse the SSE lines of ``/v1/chat/completions`` (in chunks of any
size) and say what came instead of a token. Shared by everything that waits for
a streamed token (the rollout's ``serving_ready``, the token probe of the
watchdog and the doctor, the lab's harness and the benchmarks), so it lives
with the engine, not in one stage.
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

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


class SseError(validate.InputError):
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
