# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Qualification: does the served recipe do the agent's work? One check per call.

Each check sends real requests through the endpoint an agent uses (the
ingress), measures them, and judges the answers with ``_judge``:

======================  ===============================================================
``smoke``               ``/models`` lists the model; a completion and a stream generate
``structured_json``     ``response_format`` json_schema: the answer is JSON of the schema
``tools``               ``tool_choice: auto``: a tool call whose arguments fit the schema
``tools_stream``        the same, streamed (calls accumulated from deltas)
``tool_continuation``   a second turn carrying a tool result is accepted and answered
``responses_api``       ``/v1/responses`` answers a response object
``anthropic_messages``  ``/v1/messages`` where this vLLM offers it (else not meaningful)
``reasoning_split``     reasoning arrives in its own field (recorded), never in content
``concurrency``         N streams at once: all 200, all running together (client and
                        ``vllm:num_requests_running`` evidence)
``context_ladder``      prompts at fractions of the served context: accepted or refused
                        as the plan predicts; TTFT and prefill tok/s per rung; a needle
``shared_prefix``       a batch sharing a long prefix: prefix-cache hits rise in /metrics
``reasoning_budget``    with the client's output budget the answer is not empty
``truncated_tool_call`` a tool call cut by max_tokens says ``length``, not ``tool_calls``
``head_of_line``        TTFT of a short request while a long prefill runs
======================  ===============================================================

The result is ``{name, status, why, timings, evidence}``; ``status`` is
``pass``, ``fail`` or ``not_meaningful`` (with why). The load checks live in
``_load``. No AnsibleModule here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._metrics import (
    MetricsError,
    summarise,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify import _judge as J
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._http import (
    Client,
    HttpError,
)

CHECKS = (
    "smoke",
    "structured_json",
    "tools",
    "tools_stream",
    "tool_continuation",
    "responses_api",
    "anthropic_messages",
    "reasoning_split",
    "concurrency",
    "context_ladder",
    "shared_prefix",
    "reasoning_budget",
    "truncated_tool_call",
    "head_of_line",
)

DEFAULT_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


class QualifyInputError(validate.InputError):
    """A check or a parameter that cannot be used; the message names it and the fix."""


@dataclass
class Target:
    """What a check talks to, and what the caller declared about it."""

    client: Client
    model: str
    max_model_len: int | None = None
    metrics_url: str | None = None
    limitation: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def param(self, name: str, default: Any, kind: type | tuple[type, ...] | None = None) -> Any:
        value = self.params.get(name, default)
        expected = kind or type(default)
        if value is None or (expected is not type(None) and not isinstance(value, expected)):
            raise QualifyInputError(
                f"params.{name} must be {getattr(expected, '__name__', expected)}, got {value!r}"
            )
        if isinstance(value, bool) and expected in (int, float):
            raise QualifyInputError(f"params.{name} must be a number, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise QualifyInputError(f"params.{name} must be a finite number, got {value!r}")
        return value

    def metrics(self) -> tuple[dict[str, Any] | None, str | None]:
        """One summary of the server's /metrics, or why there is none."""
        if not self.metrics_url:
            return None, "no metrics_url"
        try:
            response = self.client.request("GET", self.metrics_url)
        except HttpError as err:
            return None, str(err)
        if response.status != 200:
            return None, J.http_problem(
                response.status, response.error_message(), f"GET {response.url}"
            )
        try:
            return summarise(response.text, self.model), None
        except MetricsError as err:
            return None, f"{response.url}: {err}"


def result(
    name: str, status: str, why: str, timings: dict[str, Any], evidence: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "why": why,
        "timings": {k: round(v, 4) if isinstance(v, float) else v for k, v in timings.items()},
        "evidence": evidence,
    }


def judged(
    name: str,
    target: Target,
    server: list[str],
    model: list[str],
    timings: dict[str, Any],
    evidence: dict[str, Any],
) -> dict[str, Any]:
    status, why = J.status_of(server, model, target.limitation)
    return result(name, status, why, timings, evidence)


def short(text: Any, size: int = 160) -> str:
    text = text if isinstance(text, str) else json.dumps(text)
    return text if len(text) <= size else text[:size] + "…"


def message_evidence(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "finish_reason": message.get("finish_reason"),
        "content": short(message.get("content") or ""),
        "reasoning_key": message.get("reasoning_key"),
        "reasoning_chars": len(message.get("reasoning") or ""),
        "tool_calls": [
            {"name": c.get("name"), "arguments": short(c.get("arguments") or "")}
            for c in message.get("tool_calls") or []
        ],
        "usage": message.get("usage") or {},
    }


# --- requests ------------------------------------------------------------------------


def chat(target: Target, messages: list[dict[str, Any]], **extra: Any):
    payload = {"model": target.model, "messages": messages, "temperature": 0, **extra}
    response = target.client.request("POST", "chat/completions", payload)
    doc = response.json() if response.status == 200 else None
    return response, J.message_of(doc) if doc is not None else None


def chat_stream(target: Target, messages: list[dict[str, Any]], **extra: Any):
    payload = {
        "model": target.model,
        "messages": messages,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    stream = target.client.stream("chat/completions", payload)
    return stream, J.stream_of(stream.events) if stream.status == 200 else None


def status_problems(what: str, response) -> list[str]:
    if response.status == 200:
        return []
    return [J.http_problem(response.status, response.error_message(), what)]


def stream_problems(stream, message: dict[str, Any] | None) -> list[str]:
    problems = status_problems("the stream", stream)
    if problems:
        return problems
    if not stream.done:
        problems.append(
            f"the server closed the stream after {len(stream.events)} event(s) without its closing"
            " 'data: [DONE]' (the request was aborted or the engine went away)"
        )
    if stream.unparsed:
        problems.append(f"{stream.unparsed} stream event(s) were not JSON")
    return problems + J.leaks(message or {})


def tokens_per_second(message: dict[str, Any]) -> float | None:
    tokens = (message.get("usage") or {}).get("completion_tokens")
    first, last = message.get("first_token_t"), message.get("last_token_t")
    # A few tokens arriving in one burst say nothing about the decode speed.
    if (
        not isinstance(tokens, int)
        or tokens < 8
        or first is None
        or last is None
        or last - first < 0.05
    ):
        return None
    return (tokens - 1) / (last - first)


# --- the checks ------------------------------------------------------------------------


def check_smoke(target: Target) -> dict[str, Any]:
    max_tokens = target.param("max_tokens", 16, int)
    server: list[str] = []
    evidence: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    models = target.client.request("GET", "models")
    timings["models_s"] = models.seconds
    server += status_problems("GET /models", models)
    if models.status == 200:
        data = (models.json() or {}).get("data") or []
        served = [m for m in data if isinstance(m, dict) and m.get("id") == target.model]
        evidence["models"] = [m.get("id") for m in data if isinstance(m, dict)]
        if not served:
            server.append(f"GET /models does not list {target.model!r} ({evidence['models']})")
        else:
            evidence["served_max_model_len"] = served[0].get("max_model_len")
    messages = [{"role": "user", "content": "Say hello in one short sentence."}]
    response, message = chat(target, messages, max_tokens=max_tokens)
    timings["completion_s"] = response.seconds
    server += status_problems("POST /chat/completions", response)
    if message is not None:
        server += message["shape_problems"] + J.leaks(message)
        evidence["completion"] = message_evidence(message)
        if not (message["usage"] or {}).get("completion_tokens") and not (
            message["content"] or message["reasoning"] or message["tool_calls"]
        ):
            server.append("the completion generated nothing")
    stream, streamed = chat_stream(target, messages, max_tokens=max_tokens)
    timings["stream_s"] = stream.seconds
    server += stream_problems(stream, streamed)
    if streamed is not None:
        timings["ttft_s"] = streamed["first_token_t"]
        timings["decode_tps"] = tokens_per_second(streamed)
        evidence["stream"] = message_evidence(streamed)
        evidence["stream"]["key_counts"] = streamed["key_counts"]
        if streamed["first_token_t"] is None:
            server.append("the stream carried no generated token")
        # Reported, never passed over: an agent would see an empty answer.
        evidence["answer_empty_at_length"] = J.length_cut(streamed)
    return judged("smoke", target, server, [], timings, evidence)


def check_structured_json(target: Target) -> dict[str, Any]:
    schema = target.param("schema", DEFAULT_JSON_SCHEMA, dict)
    max_tokens = target.param("max_tokens", 512, int)
    prompt = target.param(
        "prompt", "What is the capital of France and its population? Answer as JSON.", str
    )
    response, message = chat(
        target,
        [{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    )
    server = status_problems("POST /chat/completions with response_format", response)
    model: list[str] = []
    evidence: dict[str, Any] = {"schema": schema}
    if message is not None:
        more_server, model, value = J.judge_json_answer(message, schema)
        server += more_server
        evidence.update(message_evidence(message), answer=value)
    return judged(
        "structured_json", target, server, model, {"completion_s": response.seconds}, evidence
    )


def check_responses_api(target: Target) -> dict[str, Any]:
    response = target.client.request(
        "POST",
        "responses",
        {
            "model": target.model,
            "input": "Say hello in one short sentence.",
            "max_output_tokens": target.param("max_tokens", 64, int),
        },
    )
    server = status_problems("POST /responses", response)
    evidence: dict[str, Any] = {}
    if response.status == 200:
        doc = response.json() or {}
        output = doc.get("output")
        if doc.get("object") != "response" or not isinstance(output, list):
            server.append(f"POST /responses did not answer a response object: {short(doc, 300)}")
        else:
            kinds = [item.get("type") for item in output if isinstance(item, dict)]
            evidence = {
                "status": doc.get("status"),
                "incomplete_details": doc.get("incomplete_details"),
                "output_types": kinds,
                "usage": doc.get("usage"),
            }
            if doc.get("status") not in ("completed", "incomplete"):
                server.append(f"the response's status is {doc.get('status')!r}")
            if not output:
                server.append("the response has no output item")
    return judged("responses_api", target, server, [], {"completion_s": response.seconds}, evidence)


def check_anthropic_messages(target: Target) -> dict[str, Any]:
    response = target.client.request(
        "POST",
        "messages",
        {
            "model": target.model,
            "max_tokens": target.param("max_tokens", 64, int),
            "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
        },
        headers={"anthropic-version": "2023-06-01"},
    )
    timings = {"completion_s": response.seconds}
    if response.status in (404, 405):
        return result(
            "anthropic_messages",
            J.NOT_MEANINGFUL,
            f"this vLLM does not offer /v1/messages (HTTP {response.status}: {short(response.error_message())})",
            timings,
            {},
        )
    server = status_problems("POST /messages", response)
    evidence: dict[str, Any] = {}
    if response.status == 200:
        doc = response.json() or {}
        content = doc.get("content")
        if doc.get("type") != "message" or not isinstance(content, list):
            server.append(f"POST /messages did not answer an Anthropic message: {short(doc, 300)}")
        else:
            evidence = {
                "stop_reason": doc.get("stop_reason"),
                "content_types": [c.get("type") for c in content if isinstance(c, dict)],
                "usage": doc.get("usage"),
            }
            if not content:
                server.append("the message has no content block")
            text = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            if any(marker in text for marker in J.THINK_MARKERS):
                server.append(
                    "a text block carries reasoning tags: the reasoning leaks into the answer"
                )
    return judged("anthropic_messages", target, server, [], timings, evidence)


def check_reasoning_split(target: Target) -> dict[str, Any]:
    stream, message = chat_stream(
        target,
        [{"role": "user", "content": "Think briefly, then say which is larger: 9.11 or 9.9?"}],
        max_tokens=target.param("max_tokens", 256, int),
    )
    server = stream_problems(stream, message)
    timings = {"stream_s": stream.seconds}
    evidence: dict[str, Any] = {}
    if message is not None:
        timings["ttft_s"] = message["first_token_t"]
        evidence = {
            "reasoning_key": message["reasoning_key"],
            "key_counts": message["key_counts"],
            **message_evidence(message),
        }
        if not server and not message["reasoning"]:
            return result(
                "reasoning_split",
                J.NOT_MEANINGFUL,
                "no reasoning was sent in any field: the model does not reason here (or its"
                " reasoning is switched off), so there is nothing to separate",
                timings,
                evidence,
            )
    return judged("reasoning_split", target, server, [], timings, evidence)


def check_reasoning_budget(target: Target) -> dict[str, Any]:
    max_tokens = target.param("max_tokens", 1024, int)
    response, message = chat(
        target,
        [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}],
        max_tokens=max_tokens,
    )
    server = status_problems("POST /chat/completions", response)
    model: list[str] = []
    evidence: dict[str, Any] = {"max_tokens": max_tokens}
    if message is not None:
        server += message["shape_problems"] + J.leaks(message)
        evidence.update(message_evidence(message))
        if J.length_cut(message):
            model.append(
                f"the reasoning used all {max_tokens} tokens and the answer is empty"
                " (finish_reason length): raise the client's output limit or bound the reasoning"
            )
    return judged(
        "reasoning_budget", target, server, model, {"completion_s": response.seconds}, evidence
    )
