# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve._ready import (
    SseError,
    SseReader,
    parse_show,
    sse_token,
    unit_failed,
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('data: {"choices":[{"delta":{"role":"assistant","content":""}}]}', None),
        ('data: {"choices":[{"delta":{"reasoning":"We"}}]}', {"key": "reasoning", "text": "We"}),
        (
            'data: {"choices":[{"delta":{"reasoning_content":"x"}}]}',
            {"key": "reasoning_content", "text": "x"},
        ),
        ('data: {"choices":[{"delta":{"content":"OK"}}]}\n', {"key": "content", "text": "OK"}),
        (
            'data: {"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}',
            {"key": "tool_calls", "text": '[{"index": 0}]'},
        ),
        ("data: [DONE]", None),
        ("", None),
        (": keep-alive", None),
        ("data: {broken", None),
        ("data: 1", None),
        ("data: []", None),
        ('data: {"choices": 3}', None),
        ('data: {"choices": [1, null, "x"]}', None),
        ('data: {"choices": [{"delta": [1]}]}', None),
        ('data: {"choices": [{"delta": {"content": 7}}]}', None),
        ("data: " + "[" * 100000, None),
    ],
)
def test_sse_token(line, expected):
    assert sse_token(line) == expected


@pytest.mark.parametrize(
    ("show", "before", "reason"),
    [
        ("ActiveState=active\nSubState=running\nNRestarts=0\nLoadState=loaded", 0, None),
        ("ActiveState=activating\nSubState=start\nNRestarts=0\nLoadState=loaded", 0, None),
        (
            "ActiveState=activating\nSubState=auto-restart\nNRestarts=1\nLoadState=loaded",
            0,
            "restarting",
        ),
        ("ActiveState=failed\nSubState=failed\nResult=exit-code\nLoadState=loaded", 0, "exit-code"),
        (
            "ActiveState=active\nSubState=running\nNRestarts=3\nLoadState=loaded",
            2,
            "restarted 1 time",
        ),
        ("ActiveState=active\nSubState=running\nNRestarts=3\nLoadState=loaded", 3, None),
        ("ActiveState=inactive\nSubState=dead\nNRestarts=0\nLoadState=loaded", 0, "inactive"),
        ("ActiveState=inactive\nSubState=dead\nLoadState=not-found", 0, "LoadState=not-found"),
        ("ActiveState=inactive\nSubState=dead\nLoadState=masked", 0, "LoadState=masked"),
        ("ActiveState=active\nNRestarts=garbage\nLoadState=loaded", 0, None),
    ],
)
def test_unit_failed(show, before, reason):
    why = unit_failed(parse_show(show), before)
    assert (why is None) if reason is None else (reason in why)


def test_sse_reader_in_any_chunking():
    stream = (
        b": keep-alive\r\n\r\n"
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"delta":{"reasoning":" cat"}}]}\n\n'
    )
    for size in (1, 2, 7, 64, len(stream)):
        reader = SseReader()
        tokens = [reader.feed(stream[i : i + size]) for i in range(0, len(stream), size)]
        assert [t for t in tokens if t] == [{"key": "reasoning", "text": " cat"}]
        assert reader.comments == 1


def test_sse_reader_counts_keep_alives_and_refuses_endless_lines():
    reader = SseReader()
    for _ in range(5):
        assert reader.feed(b": keep-alive\n\n") is None
    assert "5 keep-alive comment(s), 0 data event(s), no generated token" in reader.summary()
    with pytest.raises(SseError, match="without a line end"):
        for _ in range(20):
            reader.feed(b"x" * 65536)
