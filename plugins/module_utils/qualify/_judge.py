# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure judges of what vLLM answered: messages, streams, tool calls, JSON, statuses.

Each judgement separates two kinds of problem:

- **server** problems: the serving stack broke its contract (an HTTP error,
  a malformed body, reasoning or tool-call markup leaking into ``content``,
  ``finish_reason: tool_calls`` with arguments that are not JSON, a stream
  without ``[DONE]``). These always fail a check.
- **model** problems: the contract held but the model did not do the task (no
  tool call, no JSON answer, no needle, an answer that never left the
  reasoning). These fail a check, unless the caller declared why the served
  model cannot be expected to do it (``model_limitation``: the lab's random
  model), in which case the check is ``not_meaningful`` with that reason.

A check never passes on missing evidence. No AnsibleModule here; no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.qualify._http import Event

PASS, FAIL, NOT_MEANINGFUL = "pass", "fail", "not_meaningful"
STATUSES = (PASS, FAIL, NOT_MEANINGFUL)
# Where vLLM puts separated reasoning (0.32: "reasoning"; older: "reasoning_content").
REASONING_KEYS = ("reasoning_content", "reasoning")
# Markup that must never reach an agent as text: reasoning tags and tool-call tokens
# (DeepSeek V3/R1, Hermes/Qwen, Mistral, Llama 3 python tag).
THINK_MARKERS = ("<think>", "</think>")
TOOL_MARKERS = (
    "<｜tool▁calls▁begin｜>",  # noqa: RUF001 (DeepSeek spells them so)
    "<｜tool▁call▁begin｜>",  # noqa: RUF001 (DeepSeek spells them so)
    "<｜tool▁sep｜>",  # noqa: RUF001 (DeepSeek spells them so)
    "<tool_call>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def status_of(server: list[str], model: list[str], limitation: str | None) -> tuple[str, str]:
    """The status and the sentence that explains it."""
    if server:
        return FAIL, "; ".join(server)
    if model:
        if limitation:
            return NOT_MEANINGFUL, f"{limitation} (what it did: {'; '.join(model)})"
        return FAIL, "; ".join(model)
    return PASS, ""


# --- responses -----------------------------------------------------------------


def message_of(doc: Any) -> dict[str, Any]:
    """A non-streamed chat completion, reduced to what the judges read."""
    out: dict[str, Any] = {
        "finish_reason": None,
        "content": "",
        "reasoning": "",
        "reasoning_key": None,
        "tool_calls": [],
        "usage": {},
        "shape_problems": [],
    }
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        out["shape_problems"].append("the response has no choices[0] (not a chat completion)")
        return out
    choice = choices[0]
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    out["finish_reason"] = choice.get("finish_reason")
    out["content"] = message.get("content") if isinstance(message.get("content"), str) else ""
    for key in REASONING_KEYS:
        if isinstance(message.get(key), str) and message[key]:
            out["reasoning"], out["reasoning_key"] = message[key], key
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            out["shape_problems"].append(f"a tool call without a function: {str(call)[:200]}")
            continue
        out["tool_calls"].append(
            {
                "id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments"),
            }
        )
    out["usage"] = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    return out


def stream_of(events: list[Event]) -> dict[str, Any]:
    """A streamed chat completion, accumulated: text per key, tool calls by index, first-token time."""
    out = message_of({"choices": [{"message": {}}]})
    out.update(
        {"first_token_t": None, "last_token_t": None, "key_counts": {}, "chunks": len(events)}
    )
    calls: dict[int, dict[str, Any]] = {}
    content: list[str] = []
    reasoning: list[str] = []
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if isinstance(data.get("usage"), dict):
            out["usage"] = data["usage"]
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                out["finish_reason"] = choice["finish_reason"]
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            produced = False
            for key in ("content", *REASONING_KEYS):
                piece = delta.get(key)
                if isinstance(piece, str) and piece:
                    out["key_counts"][key] = out["key_counts"].get(key, 0) + 1
                    (content if key == "content" else reasoning).append(piece)
                    if key != "content":
                        out["reasoning_key"] = key
                    produced = True
            for call in delta.get("tool_calls") or []:
                if not isinstance(call, dict):
                    continue
                index = call.get("index", 0) if isinstance(call.get("index", 0), int) else 0
                slot = calls.setdefault(index, {"id": None, "name": None, "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") if isinstance(call.get("function"), dict) else {}
                slot["name"] = function.get("name") or slot["name"]
                if isinstance(function.get("arguments"), str):
                    slot["arguments"] += function["arguments"]
                out["key_counts"]["tool_calls"] = out["key_counts"].get("tool_calls", 0) + 1
                produced = True
            if produced:
                if out["first_token_t"] is None:
                    out["first_token_t"] = event.t
                out["last_token_t"] = event.t
    out["content"] = "".join(content)
    out["reasoning"] = "".join(reasoning)
    out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out


def leaks(message: dict[str, Any]) -> list[str]:
    """Reasoning left in the answer because nothing separated it (F6: no reasoning parser).

    A reasoning tag in ``content`` is the server's fault only when no reasoning
    arrived in its own field: with a reasoning parser at work, a stray tag after
    the reasoning is the model's own text.
    """
    content = message.get("content") or ""
    if message.get("reasoning"):
        return []
    for marker in THINK_MARKERS:
        if marker in content:
            return [
                f"content carries the reasoning tag {marker!r} and no reasoning field came: the"
                " reasoning leaks into the answer (F6: set vllm_recipe.reasoning_parser)"
            ]
    return []


def markup(message: dict[str, Any]) -> list[str]:
    """Tool-call markup left as text: a call that was not parsed (no tool_call_parser, or a
    malformed call). The model's problem as far as a check can tell; either way an agent
    sees text instead of a call."""
    for where in ("content", "reasoning"):
        text = message.get(where) or ""
        for marker in TOOL_MARKERS:
            if marker in text:
                return [
                    f"{where} carries the tool-call markup {marker!r}: a call was not parsed"
                    " (check vllm_recipe.tool_call_parser and enable_auto_tool_choice)"
                ]
    return []


def length_cut(message: dict[str, Any]) -> bool:
    """The answer ended at max_tokens without any visible text or tool call (reasoning ate the budget)."""
    return (
        message.get("finish_reason") == "length"
        and not (message.get("content") or "").strip()
        and not message.get("tool_calls")
    )


def what_it_did(message: dict[str, Any]) -> str:
    parts = [f"finish_reason {message.get('finish_reason')!r}"]
    if message.get("reasoning"):
        parts.append(f"{len(message['reasoning'])} characters of reasoning")
    content = (message.get("content") or "").strip()
    parts.append(f"content {content[:80]!r}" if content else "no content")
    if message.get("tool_calls"):
        parts.append(f"{len(message['tool_calls'])} tool call(s)")
    return ", ".join(parts)


# --- tool calls and JSON ---------------------------------------------------------


def schema_problems(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """A small JSON-schema subset: type, required, properties, enum, items (what tools declare)."""
    problems: list[str] = []
    expected = schema.get("type")
    types = [expected] if isinstance(expected, str) else expected or []
    allowed = tuple(t for name in types for t in _JSON_TYPES.get(name, ()))
    if allowed and (
        not isinstance(value, allowed)
        or (isinstance(value, bool) and bool not in allowed and "boolean" not in types)
    ):
        return [f"{where or 'the value'} is {type(value).__name__}, the schema says {expected}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where or 'the value'} {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        for key in schema.get("required") or []:
            if key not in value:
                problems.append(f"{where + '.' if where else ''}{key} is required but missing")
        properties = schema.get("properties") or {}
        for key, sub in properties.items():
            if key in value and isinstance(sub, dict):
                problems += schema_problems(value[key], sub, f"{where + '.' if where else ''}{key}")
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(properties))
            if extra:
                problems.append(
                    f"{where or 'the object'} has properties the schema forbids: {extra}"
                )
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            problems += schema_problems(item, schema["items"], f"{where}[{index}]")
    return problems


def parse_json_object(text: Any) -> tuple[Any, str | None]:
    if not isinstance(text, str):
        return None, f"is {type(text).__name__}, not a JSON string"
    try:
        value = json.loads(text)
    except ValueError as err:
        return None, f"is not JSON ({err}): {text[:120]!r}"
    return value, None


def judge_tool_calls(
    message: dict[str, Any], tools: list[dict[str, Any]]
) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """(server problems, model problems, the calls with parsed arguments)."""
    server = list(message.get("shape_problems") or []) + leaks(message)
    model: list[str] = markup(message)
    schemas = {
        tool["function"]["name"]: tool["function"].get("parameters") or {}
        for tool in tools
        if isinstance(tool.get("function"), dict)
    }
    calls = message.get("tool_calls") or []
    finish = message.get("finish_reason")
    parsed_calls = []
    for call in calls:
        arguments, error = parse_json_object(call.get("arguments"))
        parsed_calls.append(
            {"name": call.get("name"), "arguments": arguments, "id": call.get("id")}
        )
        if error:
            if finish == "length":
                model.append(f"the call to {call.get('name')!r} was cut at max_tokens")
            else:
                server.append(
                    f"finish_reason {finish!r} with arguments of {call.get('name')!r} that {error}:"
                    " the next turn would fail with 400"
                )
            continue
        if call.get("name") not in schemas:
            model.append(f"called {call.get('name')!r}, which was not offered ({sorted(schemas)})")
            continue
        model += [f"{call['name']}: {p}" for p in schema_problems(arguments, schemas[call["name"]])]
    if finish == "tool_calls" and not calls:
        server.append("finish_reason 'tool_calls' but the message has no tool_calls")
    if not calls:
        model.append(f"no tool call ({what_it_did(message)})")
    return server, model, parsed_calls


def judge_json_answer(
    message: dict[str, Any], schema: dict[str, Any]
) -> tuple[list[str], list[str], Any]:
    server = list(message.get("shape_problems") or []) + leaks(message)
    model: list[str] = []
    content = (message.get("content") or "").strip()
    if not content:
        model.append(f"no JSON answer ({what_it_did(message)})")
        return server, model, None
    value, error = parse_json_object(content)
    if error:
        if message.get("finish_reason") == "length":
            model.append(f"the JSON answer was cut at max_tokens: content {error}")
        else:
            server.append(
                f"response_format json_schema was not enforced: content {error}"
                " (is structured output disabled in this vLLM?)"
            )
        return server, model, None
    found = schema_problems(value, schema)
    if found:
        server.append("the answer breaks the enforced schema: " + "; ".join(found))
    return server, model, value


# --- HTTP statuses ------------------------------------------------------------------


def http_problem(status: int, message: str, what: str) -> str:
    fix = {
        401: "the ingress refused the key: pass api_key (qualify_api_key_file)",
        404: "no such route: base_url must be the model's route (<public url>/<served name>/v1)",
        502: "the ingress answers but vLLM does not: look at the serving unit on the head",
        503: "the ingress answers but vLLM is down or restarting: look at the serving unit on the head",
    }.get(status, "")
    return f"{what} answered HTTP {status}: {message[:300]}" + (f" ({fix})" if fix else "")
