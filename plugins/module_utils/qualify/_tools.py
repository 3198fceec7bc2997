# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tool-calling qualification checks: ``tools``, ``tools_stream``, ``tool_continuation``,
``truncated_tool_call``.

The tool offered is ``params.tool`` (an OpenAI tool definition); by default
opencode's own ``read``, the first tool a coding agent offers (and the one the
lab's scripted model calls). No AnsibleModule here.
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.qualify import _judge as J
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._checks import (
    QualifyInputError,
    Target,
    chat,
    chat_stream,
    judged,
    message_evidence,
    result,
    short,
    status_problems,
    stream_problems,
)

# opencode's own file tool (what a coding agent offers first; the lab's scripted model calls it).
DEFAULT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "read",
        "description": "Read a file or list a directory of the project.",
        "parameters": {
            "type": "object",
            "properties": {
                "filePath": {"type": "string", "description": "The path to read."},
                "offset": {"type": "integer", "description": "The line to start at."},
                "limit": {"type": "integer", "description": "How many lines to read."},
            },
            "required": ["filePath"],
        },
    },
}


def tool_and_arguments(target: Target) -> tuple[dict[str, Any], dict[str, Any]]:
    tool = target.param("tool", DEFAULT_TOOL, dict)
    function = tool.get("function") if isinstance(tool.get("function"), dict) else None
    if tool.get("type") != "function" or not function or not isinstance(function.get("name"), str):
        raise QualifyInputError(
            "params.tool must be an OpenAI tool: {type: function, function: {name, description,"
            f" parameters}}, got {short(tool, 200)}"
        )
    arguments = target.param(
        "tool_arguments", example_arguments(function.get("parameters") or {}), dict
    )
    return tool, arguments


def example_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments that fit a tool's schema (its required properties), for a synthetic earlier turn."""
    samples = {
        "string": "README.md",
        "integer": 1,
        "number": 1,
        "boolean": True,
        "array": [],
        "object": {},
    }
    properties = schema.get("properties") or {}
    out = {}
    for key in schema.get("required") or []:
        sub = properties.get(key) or {}
        if sub.get("enum"):
            out[key] = sub["enum"][0]
        else:
            kind = sub.get("type") if isinstance(sub.get("type"), str) else "string"
            out[key] = samples.get(kind, "README.md")
    return out


def tool_prompt(tool: dict[str, Any]) -> list[dict[str, Any]]:
    function = tool["function"]
    return [
        {
            "role": "user",
            "content": f"Use the {function['name']} tool now ({function.get('description', '')})."
            " Call it; do not answer in text.",
        }
    ]


def check_tools(target: Target) -> dict[str, Any]:
    tool, _ = tool_and_arguments(target)
    max_tokens = target.param("max_tokens", 512, int)
    response, message = chat(
        target, tool_prompt(tool), tools=[tool], tool_choice="auto", max_tokens=max_tokens
    )
    server = status_problems("POST /chat/completions with tools", response)
    model: list[str] = []
    evidence: dict[str, Any] = {"tool": tool["function"]["name"]}
    if message is not None:
        more_server, model, calls = J.judge_tool_calls(message, [tool])
        server += more_server
        evidence.update(message_evidence(message), calls=calls)
    return judged("tools", target, server, model, {"completion_s": response.seconds}, evidence)


def check_tools_stream(target: Target) -> dict[str, Any]:
    """The streamed tool call, compared with the same request unstreamed (temperature 0).

    A call the unstreamed answer carries but the stream loses (or whose
    arguments differ) is the streaming tool parser's fault, not the model's.
    """
    tool, _ = tool_and_arguments(target)
    max_tokens = target.param("max_tokens", 512, int)
    request = {"tools": [tool], "tool_choice": "auto", "max_tokens": max_tokens}
    plain, plain_message = chat(target, tool_prompt(tool), **request)
    stream, message = chat_stream(target, tool_prompt(tool), **request)
    server = stream_problems(stream, message)
    model: list[str] = []
    evidence: dict[str, Any] = {"tool": tool["function"]["name"]}
    timings: dict[str, Any] = {"unstreamed_s": plain.seconds, "stream_s": stream.seconds}
    if message is not None:
        more_server, model, calls = J.judge_tool_calls(message, [tool])
        server += [p for p in more_server if p not in server]
        evidence.update(message_evidence(message), calls=calls, key_counts=message["key_counts"])
        timings["ttft_s"] = message["first_token_t"]
        if plain_message is not None:
            _, _, plain_calls = J.judge_tool_calls(plain_message, [tool])
            expected = [
                (c["name"], c["arguments"]) for c in plain_calls if c["arguments"] is not None
            ]
            got = [(c["name"], c["arguments"]) for c in calls]
            evidence["unstreamed_calls"] = plain_calls
            if expected and got != expected:
                server.append(
                    f"the stream lost or changed the tool call the same request returns unstreamed"
                    f" (streamed {got or 'no call'}, finish_reason {message['finish_reason']!r};"
                    f" unstreamed {expected}): the streaming tool parser drops it"
                )
                model = []
    return judged("tools_stream", target, server, model, timings, evidence)


def check_tool_continuation(target: Target) -> dict[str, Any]:
    tool, arguments = tool_and_arguments(target)
    name = tool["function"]["name"]
    result_text = target.param(
        "tool_result", "The file says: the project builds with make and tests with make test.", str
    )
    messages = [
        *tool_prompt(tool),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_qualify_1",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_qualify_1", "content": result_text},
    ]
    response, message = chat(
        target,
        messages,
        tools=[tool],
        tool_choice="auto",
        max_tokens=target.param("max_tokens", 512, int),
    )
    server = status_problems("the turn carrying the tool result", response)
    if response.status == 400:
        server[-1] += " (the chat template or the server refuses a tool-result turn)"
    model: list[str] = []
    evidence: dict[str, Any] = {"tool": name, "arguments_sent": arguments}
    if message is not None:
        server += message["shape_problems"] + J.leaks(message)
        evidence.update(message_evidence(message))
        if not (message["content"] or "").strip() and not message["tool_calls"]:
            model.append(f"no answer after the tool result ({J.what_it_did(message)})")
    return judged(
        "tool_continuation", target, server, model, {"completion_s": response.seconds}, evidence
    )


def check_truncated_tool_call(target: Target) -> dict[str, Any]:
    """Cut a complete tool call short by 1, 2, 3 ... tokens: each cut must say ``length``."""
    tool, _ = tool_and_arguments(target)
    cuts = target.param("cut_tokens", [1, 2, 3, 5], list)
    if not cuts or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in cuts):
        raise QualifyInputError(f"params.cut_tokens must be positive integers, got {cuts!r}")
    max_tokens = target.param("max_tokens", 512, int)
    messages = tool_prompt(tool)
    full, message = chat(target, messages, tools=[tool], tool_choice="auto", max_tokens=max_tokens)
    timings: dict[str, Any] = {"uncut_s": full.seconds}
    server = status_problems("the uncut tool request", full)
    if server or message is None:
        return judged("truncated_tool_call", target, server, [], timings, {})
    evidence: dict[str, Any] = {"uncut": message_evidence(message), "cuts": []}
    tokens = (message["usage"] or {}).get("completion_tokens")
    complete = [
        c for c in message["tool_calls"] if J.parse_json_object(c.get("arguments"))[1] is None
    ]
    if not complete or not isinstance(tokens, int) or tokens <= min(cuts):
        return result(
            "truncated_tool_call",
            J.NOT_MEANINGFUL,
            f"there is no complete tool call to cut ({J.what_it_did(message)})",
            timings,
            evidence,
        )
    for cut in sorted({c for c in cuts if c < tokens}):
        limit = tokens - cut
        response, cut_message = chat(
            target, messages, tools=[tool], tool_choice="auto", max_tokens=limit
        )
        timings[f"cut_{cut}_s"] = response.seconds
        server += status_problems(f"the request cut at {limit} tokens", response)
        if cut_message is None:
            continue
        finish = cut_message["finish_reason"]
        broken = [
            c.get("name")
            for c in cut_message["tool_calls"]
            if J.parse_json_object(c.get("arguments"))[1] is not None
        ]
        evidence["cuts"].append({"max_tokens": limit, **message_evidence(cut_message)})
        if finish == "tool_calls" and broken:
            server.append(
                f"cut at {limit} of {tokens} tokens, the call to {broken} was reported as"
                " finish_reason 'tool_calls' with arguments that are not JSON: an agent would"
                " send them back and get 400"
            )
        elif finish == "tool_calls" and not cut_message["tool_calls"]:
            server.append(f"cut at {limit} of {tokens} tokens: 'tool_calls' without a call")
        elif finish not in ("length", "tool_calls"):
            # 'tool_calls' with whole JSON is honest: the cut fell after the arguments
            server.append(
                f"cut at {limit} of {tokens} tokens, finish_reason is {finish!r}, not 'length'"
            )
    return judged("truncated_tool_call", target, server, [], timings, evidence)
