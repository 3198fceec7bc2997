# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the agent_client role measures, from what the server and the client print.

- The prompt floor: vLLM's ``usage.prompt_tokens`` of the first request of one
  real ``opencode run`` (opencode prints it per step with ``--format json``),
  confirmed by the growth of vLLM's ``vllm:prompt_tokens_total`` counter
  around the run; the counter delta alone when opencode got no usage.
- The reasoning field: which delta keys of a streamed chat completion carry text.
- The answer of an ``opencode run --format json``: text, steps, errors, compaction.

Pure functions over text; they never raise on garbage, they say what they saw.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

PROMPT_COUNTER = "vllm:prompt_tokens_total"
REQUEST_COUNTER = "vllm:request_prompt_tokens_count"
DELTA_KEYS = ("content", "reasoning", "reasoning_content")
_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class MeasureError(validate.InputError):
    """A measurement that cannot be trusted; the message says what was seen and what to do."""


def metric_total(text: str, name: str, model: str | None = None) -> float | None:
    """Sum of the samples of ``name`` (all engines), for ``model_name=model`` when given.

    None when the metric is absent: an absent counter is not a zero.
    """
    total, seen = 0.0, False
    for line in str(text or "").splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or match.group("name") != name:
            continue
        labels = dict(_LABEL.findall(match.group("labels") or ""))
        if model is not None and "model_name" in labels and labels["model_name"] != model:
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        if math.isfinite(value):
            total += value
            seen = True
    return total if seen else None


def run_events(stdout: str) -> dict[str, Any]:
    """An ``opencode run --format json`` transcript: answer text, steps with server usage, errors."""
    text: list[str] = []
    reasoning: list[str] = []
    steps: list[dict[str, Any]] = []
    errors: list[str] = []
    tools: list[str] = []
    tool_calls: list[dict[str, str]] = []
    compactions = 0
    unparsed = 0
    for line in str(stdout or "").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            unparsed += 1
            continue
        if not isinstance(event, dict):
            unparsed += 1
            continue
        part = event.get("part") if isinstance(event.get("part"), dict) else {}
        kind = event.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif kind == "reasoning" and isinstance(part.get("text"), str):
            reasoning.append(part["text"])
        elif kind == "step_finish":
            tokens = part.get("tokens") if isinstance(part.get("tokens"), dict) else {}
            steps.append(
                {
                    "input": _count(tokens.get("input")),
                    "output": _count(tokens.get("output")),
                    "reason": part.get("reason"),
                }
            )
        elif kind == "tool_use":
            tools.append(str(part.get("tool", "")))
            state = part.get("state") if isinstance(part.get("state"), dict) else {}
            tool_calls.append({"tool": str(part.get("tool", "")), "status": str(state.get("status", ""))})
        elif kind == "error":
            errors.append(_error_text(event.get("error")))
        if part.get("type") == "compaction" or "compaction" in str(kind or ""):
            compactions += 1
    return {
        "text": "".join(text),
        "reasoning": "".join(reasoning),
        "steps": steps,
        "errors": errors,
        "tools": tools,
        "tool_calls": tool_calls,
        "compactions": compactions,
        "unparsed_lines": unparsed,
    }


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        data = error.get("data") if isinstance(error.get("data"), dict) else {}
        message = data.get("message") or error.get("message") or ""
        return f"{error.get('name', 'error')}: {message}".strip()
    return str(error)


def prompt_floor(before: str, after: str, stdout: str, model: str | None = None) -> dict[str, Any]:
    """The first request of one ``opencode run`` in tokens, as the server counted it.

    The first step's ``tokens.input`` is vLLM's ``usage.prompt_tokens`` for
    exactly that request (opencode asks for usage in the stream); the growth of
    ``vllm:prompt_tokens_total`` around the run proves the server saw it, and
    may be larger when other requests ran in the window (a streamed-first-token
    check aborts and adds prompt tokens without a finished request). Without
    usage from the client the counter delta is the floor only when the server
    finished exactly one request in the window.
    """
    prompt_before = metric_total(before, PROMPT_COUNTER, model)
    prompt_after = metric_total(after, PROMPT_COUNTER, model)
    if prompt_before is None or prompt_after is None:
        raise MeasureError(
            f"the server's /metrics has no {PROMPT_COUNTER}"
            + (f" for model {model!r}" if model else "")
            + ": point agent_client_metrics_url at vLLM's own /metrics (not the ingress)"
        )
    requests_before = metric_total(before, REQUEST_COUNTER, model)
    requests_after = metric_total(after, REQUEST_COUNTER, model)
    requests = (
        int(requests_after - requests_before)
        if requests_before is not None and requests_after is not None
        else None
    )
    delta = int(prompt_after - prompt_before)
    run = run_events(stdout)
    first = run["steps"][0]["input"] if run["steps"] else None
    result: dict[str, Any] = {
        "metrics_prompt_tokens": delta,
        "metrics_requests": requests,
        "client_first_request_tokens": first,
        "steps": len(run["steps"]),
        "errors": run["errors"],
    }
    if delta <= 0:
        raise MeasureError(
            f"{PROMPT_COUNTER} did not grow during the opencode run (delta {delta}); the client"
            " reached another server or failed before sending:"
            f" {'; '.join(run['errors']) or 'no error printed'}"
        )
    if first is not None and 0 < first <= delta:
        return {**result, "prompt_floor": first, "source": "usage"}
    if first is not None and first > delta:
        raise MeasureError(
            f"opencode reported {first} input tokens but the server counted only {delta} in the"
            " window: opencode reached another server; check agent_client_base_url and"
            " agent_client_metrics_url name the same vLLM"
        )
    if requests == 1:
        return {**result, "prompt_floor": delta, "source": "metrics"}
    raise MeasureError(
        f"cannot isolate opencode's first request: the server counted {delta} prompt tokens in"
        f" {requests if requests is not None else 'an unknown number of'} finished requests and"
        " opencode reported no usage (is includeUsage false in its provider options?); run the"
        " measurement again while nothing else uses the server"
    )


def stream_fields(sse: str) -> dict[str, Any]:
    """Which delta keys carried text in a streamed chat completion, and the reasoning key."""
    counts = {key: 0 for key in DELTA_KEYS}
    other: set[str] = set()
    events = 0
    for line in str(sse or "").splitlines():
        line = line.strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if not payload or payload == "[DONE]":
            continue
        try:
            chunk = json.loads(payload)
        except (ValueError, RecursionError):
            continue
        events += 1
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        for choice in choices if isinstance(choices, list) else []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            for key, value in delta.items():
                if not isinstance(value, str) or not value:
                    continue
                if key in counts:
                    counts[key] += 1
                elif key != "role":
                    other.add(key)
    seen = [key for key in ("reasoning", "reasoning_content") if counts[key]]
    if len(seen) == 2:
        key = (
            "reasoning"
            if counts["reasoning"] >= counts["reasoning_content"]
            else "reasoning_content"
        )
    else:
        key = seen[0] if seen else "none"
    return {"events": events, "counts": counts, "other_keys": sorted(other), "reasoning_key": key}
