# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The first token of an SSE stream (module_utils/engine/_sse.py), in any chunking."""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.engine._sse import (
    SseError,
    SseReader,
    sse_token,
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
