# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils._ready import (
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
    ],
)
def test_unit_failed(show, before, reason):
    why = unit_failed(parse_show(show), before)
    assert (why is None) if reason is None else (reason in why)
