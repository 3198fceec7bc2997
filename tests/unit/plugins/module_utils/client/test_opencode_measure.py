# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent_client role's measurements (module_utils/client/_opencode_measure.py) as case tables:
vLLM /metrics text and opencode ``run --format json`` output -> prompt floor or the error;
SSE text -> the reasoning field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.opencode import FilterModule
from ansible_collections.localinference.vllm.plugins.module_utils.client import (
    _opencode_measure as m,
)

MODEL = "localinference/tiny-deepseek"


def metrics(prompt: float, requests: float | None, model: str = MODEL) -> str:
    lines = [
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f'vllm:prompt_tokens_total{{engine="0",model_name="{model}"}} {prompt}',
        'vllm:prompt_tokens_total{engine="0",model_name="other"} 99999.0',
    ]
    if requests is not None:
        lines.append(
            f'vllm:request_prompt_tokens_count{{engine="0",model_name="{model}"}} {requests}'
        )
    return "\n".join(lines) + "\n"


def events(*steps: int, error: str | None = None, text: str = "hi") -> str:
    out = [{"type": "step_start", "part": {"type": "step-start"}}]
    for tokens in steps:
        out.append({"type": "text", "part": {"type": "text", "text": text}})
        out.append(
            {
                "type": "step_finish",
                "part": {
                    "type": "step-finish",
                    "reason": "stop",
                    "tokens": {"input": tokens, "output": 12},
                },
            }
        )
    if error:
        out.append({"type": "error", "error": {"name": "APIError", "data": {"message": error}}})
    return "\n".join(json.dumps(e) for e in out) + "\nnot json\n"


FLOOR_CASES: list[dict[str, Any]] = [
    {
        "name": "one request: the server's usage, equal to the counter delta",
        "before": metrics(10, 0),
        "after": metrics(11022, 1),
        "stdout": events(11012),
        "floor": 11012,
        "source": "usage",
    },
    {
        "name": "an aborted first-token check in the window: usage, not the 20-token larger delta",
        "before": metrics(10, 0),
        "after": metrics(11042, 1),
        "stdout": events(11012),
        "floor": 11012,
        "source": "usage",
    },
    {
        "name": "no usage from the client (includeUsage false) and one request: the counter delta",
        "before": metrics(10, 0),
        "after": metrics(11022, 1),
        "stdout": events(0).replace('"input": 0', '"input": null'),
        "floor": 11012,
        "source": "metrics",
    },
    {
        "name": "usage larger than what this server counted: another server answered",
        "before": metrics(10, 0),
        "after": metrics(110, 1),
        "stdout": events(11012),
        "error": "reached another server",
    },
    {
        "name": "rejected prompt (400): the counter does not grow",
        "before": metrics(10, 0),
        "after": metrics(10, 0),
        "stdout": events(error="This model's maximum context length is 4096 tokens"),
        "error": "did not grow",
    },
    {
        "name": "other traffic and no client usage: cannot isolate",
        "before": metrics(10, 0),
        "after": metrics(30000, 3),
        "stdout": events(0).replace('"input": 0', '"input": null'),
        "error": "cannot isolate",
    },
    {
        "name": "no vLLM metrics (the ingress answered instead)",
        "before": "<html>404</html>",
        "after": "<html>404</html>",
        "stdout": events(11012),
        "error": "no vllm:prompt_tokens_total",
    },
]


@pytest.mark.parametrize("case", FLOOR_CASES, ids=[c["name"] for c in FLOOR_CASES])
def test_prompt_floor(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(m.MeasureError, match=case["error"]):
            m.prompt_floor(case["before"], case["after"], case["stdout"], MODEL)
        with pytest.raises(AnsibleFilterError, match=case["error"]):
            FilterModule().filters()["opencode_prompt_floor"](
                case["before"], case["after"], case["stdout"], MODEL
            )
        return
    got = m.prompt_floor(case["before"], case["after"], case["stdout"], MODEL)
    assert (got["prompt_floor"], got["source"]) == (case["floor"], case["source"])


def sse(*deltas: dict[str, Any]) -> str:
    chunks = [{"choices": [{"index": 0, "delta": d}]} for d in deltas]
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + ": keep-alive\ndata: [DONE]\n\n"


STREAM_CASES = [
    (
        "vLLM 0.32 with a reasoning parser",
        sse({"role": "assistant", "content": ""}, {"reasoning": "x"}, {"content": "4"}),
        "reasoning",
    ),
    (
        "older servers",
        sse({"reasoning_content": "x"}, {"reasoning_content": "y"}, {"content": "4"}),
        "reasoning_content",
    ),
    ("no reasoning parser", sse({"content": "<think>x</think>4"}), "none"),
    ("garbage", "data: {oops\n\n<html>", "none"),
]


@pytest.mark.parametrize(("name", "text", "key"), STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_stream_fields(name: str, text: str, key: str) -> None:
    assert m.stream_fields(text)["reasoning_key"] == key


def test_run_events_collects_text_steps_errors() -> None:
    run = m.run_events(events(100, 200, error="boom", text="ab"))
    assert run["text"] == "abab" and [s["input"] for s in run["steps"]] == [100, 200]
    assert run["errors"] == ["APIError: boom"] and run["unparsed_lines"] == 1


def test_metric_total_sums_engines_and_ignores_other_models() -> None:
    text = metrics(5, 1) + f'vllm:prompt_tokens_total{{engine="1",model_name="{MODEL}"}} 7\n'
    assert m.metric_total(text, m.PROMPT_COUNTER, MODEL) == 12
    assert m.metric_total(text, "vllm:absent", MODEL) is None
