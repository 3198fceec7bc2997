# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The qualification judges on recorded vLLM 0.32 answers (tests/unit/fixtures/vllm-api).

Case table: a response (recorded, or a recorded one with one field changed to
the defect the seeds and public reports describe) -> the server and model
problems the judge must name.
"""

from __future__ import annotations

import copy
import json

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.qualify import _judge as J
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._http import Event
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._tools import (
    DEFAULT_TOOL,
)

from .fake_vllm import recorded

TOOLS = json.loads(recorded("chat-tools.json"))


def events(name: str) -> list[Event]:
    out = []
    for index, part in enumerate(recorded(name).decode().split("\n\n")):
        line = part.strip()
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            out.append(Event(index * 0.01, json.loads(line[5:])))
    return out


def changed(path: list, value) -> dict:
    """The recorded tool answer with one field set to ``value``."""
    doc = copy.deepcopy(TOOLS)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


MESSAGE = ["choices", 0, "message"]
CALL = [*MESSAGE, "tool_calls", 0, "function"]

# (id, response, expected server problems (substrings), expected model problems (substrings))
TOOL_CASES = [
    ("recorded-call", TOOLS, [], []),
    (
        "seeds-broken-json-reported-as-tool_calls",
        changed([*CALL, "arguments"], '{"filePath": "."'),
        ["finish_reason 'tool_calls' with arguments of 'read' that is not JSON", "400"],
        [],
    ),
    (
        "cut-call-with-length-is-the-models",
        changed(["choices", 0, "finish_reason"], "length"),
        [],
        [],
    ),
    (
        "unknown-tool",
        changed([*CALL, "name"], "write"),
        [],
        ["called 'write', which was not offered"],
    ),
    (
        "arguments-miss-a-required-key",
        changed([*CALL, "arguments"], '{"limit": 50}'),
        [],
        ["read: filePath is required but missing"],
    ),
    (
        "argument-of-the-wrong-type",
        changed([*CALL, "arguments"], '{"filePath": ".", "limit": "50"}'),
        [],
        ["read: limit is str, the schema says integer"],
    ),
    (
        "tool_calls-without-a-call",
        changed([*MESSAGE, "tool_calls"], []),
        ["finish_reason 'tool_calls' but the message has no tool_calls"],
        ["no tool call"],
    ),
    (
        "unparsed-call-left-in-content",
        changed(
            [*MESSAGE],
            {
                "role": "assistant",
                "content": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read",  # noqa: RUF001
                "tool_calls": [],
                "reasoning": "x",
            },
        ),
        ["finish_reason 'tool_calls' but the message has no tool_calls"],
        ["content carries the tool-call markup", "no tool call"],
    ),
]


@pytest.mark.parametrize(
    ("response", "server", "model"),
    [case[1:] for case in TOOL_CASES],
    ids=[c[0] for c in TOOL_CASES],
)
def test_tool_call_judge(response, server, model):
    """Every expected phrase is named; no problem is named where none is expected."""
    got_server, got_model, _ = J.judge_tool_calls(J.message_of(response), [DEFAULT_TOOL])
    assert bool(got_server) == bool(server), got_server
    assert bool(got_model) == bool(model), got_model
    for want in server:
        assert want in " ".join(got_server), got_server
    for want in model:
        assert want in " ".join(got_model), got_model


def test_cut_call_with_length_is_not_the_seeds_defect():
    doc = changed(["choices", 0, "finish_reason"], "length")
    doc["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"filePath": "'
    server, model, _ = J.judge_tool_calls(J.message_of(doc), [DEFAULT_TOOL])
    assert server == []
    assert model == ["the call to 'read' was cut at max_tokens"]


def test_recorded_streams_accumulate_like_the_unstreamed_answer():
    good = J.stream_of(events("chat-tools-stream.sse"))
    assert good["finish_reason"] == "tool_calls"
    assert good["tool_calls"][0]["name"] == "read"
    assert json.loads(good["tool_calls"][0]["arguments"]) == {"filePath": ".", "limit": 50}
    assert good["reasoning_key"] == "reasoning"
    assert good["usage"]["completion_tokens"] == 12


def test_the_recorded_stream_that_lost_its_arguments():
    """vLLM 0.32's streamed deepseek_v3 parser: the name came, the arguments never did."""
    lost = J.stream_of(events("chat-tools-stream-lost-call.sse"))
    server, _model, _ = J.judge_tool_calls(lost, [DEFAULT_TOOL])
    assert lost["tool_calls"] == [
        {"id": "chatcmpl-tool-839db925d52cd2e2", "name": "read", "arguments": ""}
    ]
    assert "with arguments of 'read' that is not JSON" in server[0]


def test_reasoning_stream_keys_and_first_token():
    message = J.stream_of(events("chat-stream-reasoning.sse"))
    assert message["reasoning_key"] == "reasoning"
    assert message["key_counts"] == {"reasoning": 1, "content": 1}
    assert message["content"] == "Hello from the scripted lab model."
    assert message["first_token_t"] is not None
    assert J.leaks(message) == []


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"content": "2</think>The answer is 4", "reasoning": ""}, ["F6"]),
        ({"content": "<think>hmm</think>4", "reasoning": None}, ["F6"]),
        # a reasoning parser at work: a stray tag after the reasoning is the model's text
        ({"content": "4 </think>", "reasoning": "hmm"}, []),
        ({"content": "4", "reasoning": ""}, []),
    ],
    ids=["no-parser-closing-tag", "no-parser-both-tags", "stray-tag-with-parser", "clean"],
)
def test_reasoning_leaks(message, expected):
    got = J.leaks(message)
    assert len(got) == len(expected)
    for want, problem in zip(expected, got, strict=True):
        assert want in problem


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("content", "finish", "server", "model"),
    [
        ('{"city": "Paris", "population": 2100000}', "stop", 0, 0),
        ('{"city": "Paris"', "length", 0, 1),  # cut: the model's (budget)
        ("Paris, about two million", "stop", 1, 0),  # grammar not enforced: the server's
        ('{"city": "Paris", "population": "many"}', "stop", 1, 0),
        ('{"city": "Paris", "population": 1, "mayor": "x"}', "stop", 1, 0),
        ("", "length", 0, 1),  # reasoning ate the budget
    ],
    ids=["valid", "cut", "free-text", "wrong-type", "extra-key", "empty"],
)
def test_json_answer_judge(content, finish, server, model):
    message = {"content": content, "finish_reason": finish, "reasoning": "r", "tool_calls": []}
    got_server, got_model, _ = J.judge_json_answer(message, SCHEMA)
    assert (len(got_server), len(got_model)) == (server, model), (got_server, got_model)


@pytest.mark.parametrize(
    ("server", "model", "limitation", "status"),
    [
        ([], [], None, J.PASS),
        (
            ["HTTP 500"],
            [],
            "random model",
            J.FAIL,
        ),  # a declared limitation never hides the server's fault
        ([], ["no tool call"], None, J.FAIL),
        ([], ["no tool call"], "the lab's model calls no tool", J.NOT_MEANINGFUL),
    ],
)
def test_status(server, model, limitation, status):
    got, why = J.status_of(server, model, limitation)
    assert got == status
    if limitation and status == J.NOT_MEANINGFUL:
        assert why.startswith(limitation) and "no tool call" in why


def test_length_cut_is_reported_not_passed():
    assert J.length_cut({"finish_reason": "length", "content": "", "tool_calls": []})
    assert not J.length_cut({"finish_reason": "length", "content": "4", "tool_calls": []})
    assert not J.length_cut({"finish_reason": "stop", "content": "", "tool_calls": []})


@pytest.mark.parametrize(
    ("status", "fix"),
    [(401, "qualify_api_key_file"), (404, "<served name>/v1"), (502, "serving unit")],
)
def test_http_problems_name_the_fix(status, fix):
    assert fix in J.http_problem(status, "x", "POST /chat/completions")
