# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's agent turn (module_utils/client/_opencode_turn.py) as case tables: mode, check mode and
start -> whether it runs; saved client result, config and served models -> ready or why not;
exit code, ``opencode run --format json`` transcript and stderr -> passed or the client's own error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ansible_collections.localinference.vllm.plugins.filter.opencode import FilterModule
from ansible_collections.localinference.vllm.plugins.module_utils.client import _opencode_turn as t

MODEL = "localinference/tiny-deepseek"
CLIENT = {"model": MODEL, "max_model_len": 16384, "opencode_version": "1.18.33"}
SERVED = [{"id": MODEL, "max_model_len": 16384}]
KEY = "sk-lab-0123456789abcdef"


def transcript(
    *,
    tool_status: str | None = "completed",
    text: str = "Hello from the scripted lab model.",
    error: str | None = None,
) -> str:
    events: list[dict[str, Any]] = [{"type": "step_start", "part": {"type": "step-start"}}]
    if tool_status:
        events.append(
            {"type": "tool_use", "part": {"tool": "read", "state": {"status": tool_status}}}
        )
        events.append(
            {
                "type": "step_finish",
                "part": {"reason": "tool-calls", "tokens": {"input": 9000, "output": 20}},
            }
        )
    if text:
        events.append({"type": "text", "part": {"type": "text", "text": text}})
        events.append(
            {
                "type": "step_finish",
                "part": {"reason": "stop", "tokens": {"input": 9100, "output": 12}},
            }
        )
    if error:
        events.append({"type": "error", "error": {"name": "APIError", "data": {"message": error}}})
    return "\n".join(json.dumps(event) for event in events) + "\n"


WANTED = [
    ("started-and-started", "started", False, True, ""),
    ("started-nothing", "started", False, False, "this rollout started nothing"),
    ("always-nothing-started", "always", False, False, ""),
    ("never", "never", False, True, "agent_client_rollout_turn is never"),
    ("check-mode", "always", True, True, "check mode"),
    ("unknown-mode", "sometimes", False, True, "not one of started, always, never"),
]


@pytest.mark.parametrize(
    ("mode", "check", "started", "expect"), [c[1:] for c in WANTED], ids=[c[0] for c in WANTED]
)
def test_turn_wanted(mode: str, check: bool, started: bool, expect: str) -> None:
    reason = t.turn_wanted(mode, check, started)
    assert (reason == "") if expect == "" else (expect in reason), reason


READY = [
    ("ready", CLIENT, True, SERVED, ""),
    ("endpoint-silent-still-runs", CLIENT, True, None, ""),
    ("no-client-result", None, True, SERVED, "the head holds no client result"),
    ("client-result-without-model", {"model": ""}, True, SERVED, "the head holds no client result"),
    ("config-missing-here", CLIENT, False, SERVED, "/tmp/opencode.json is missing"),
    (
        "other-model-served",
        CLIENT,
        True,
        [{"id": "other", "max_model_len": 16384}],
        f"set up for {MODEL}, the new stack serves other",
    ),
    ("nothing-served", CLIENT, True, [], "the new stack serves nothing"),
    (
        "other-context",
        CLIENT,
        True,
        [{"id": MODEL, "max_model_len": 8192}],
        "context of 16384 tokens, the new stack serves 8192",
    ),
    ("context-unknown", CLIENT, True, [{"id": MODEL}], ""),
]


@pytest.mark.parametrize(
    ("client", "exists", "models", "expect"), [c[1:] for c in READY], ids=[c[0] for c in READY]
)
def test_turn_ready(client: Any, exists: bool, models: Any, expect: str) -> None:
    reason = t.turn_ready(client, exists, "/tmp/opencode.json", models)
    assert (reason == "") if expect == "" else (expect in reason), reason


VERDICTS = [
    (
        "passed",
        0,
        transcript(),
        "",
        True,
        [
            "opencode completed a turn with a tool round trip (read) in 2 steps",
            "Hello from the scripted lab model.",
        ],
    ),
    (
        "no-tool-call",
        0,
        transcript(tool_status=None),
        "",
        False,
        ["no tool call completed (tool calls: none)"],
    ),
    ("tool-error", 0, transcript(tool_status="error"), "", False, ["tool calls: read error"]),
    ("no-answer", 0, transcript(text=""), "", False, ["no answer after the tool result"]),
    (
        "api-error",
        1,
        transcript(tool_status=None, text="", error="Not Found"),
        "Error: Not Found\n",
        False,
        [
            "it exited 1",
            "its errors: APIError: Not Found",
            "last lines of its stderr: Error: Not Found",
        ],
    ),
    (
        "deadline",
        124,
        "",
        "",
        False,
        ["stopped at its deadline (300 s, agent_client_turn_timeout)", "its stderr is empty"],
    ),
    ("killed-at-deadline", 137, "", "", False, ["stopped at its deadline"]),
    (
        "not-installed",
        127,
        "",
        "timeout: failed to run command 'opencode': No such file or directory",
        False,
        ["could not be run (exit 127", "No such file or directory"],
    ),
    ("no-exit-code", None, "", "", False, ["exited without an exit code"]),
    ("garbage", 0, "not json\n[1]\n", "", False, ["no tool call completed"]),
]


@pytest.mark.parametrize(
    ("rc", "stdout", "stderr", "ok", "expect"),
    [c[1:] for c in VERDICTS],
    ids=[c[0] for c in VERDICTS],
)
def test_turn_verdict(rc: Any, stdout: str, stderr: str, ok: bool, expect: list[str]) -> None:
    verdict = t.turn_verdict(rc, stdout, stderr, 300)
    assert verdict["ok"] is ok, verdict
    for text in expect:
        assert text in verdict["message"], verdict["message"]


def test_secrets_never_printed() -> None:
    stderr = f"request failed: Authorization: Bearer {KEY}\napiKey={KEY}\nkey {KEY} refused\n"
    verdict = t.turn_verdict(
        1,
        transcript(tool_status=None, text="", error=f"Unauthorized for {KEY}"),
        stderr,
        300,
        [KEY],
    )
    assert KEY not in verdict["message"], verdict["message"]
    assert (
        "Bearer ********" in verdict["message"]
        and "Unauthorized for ********" in verdict["message"]
    )
    # Without the key given, bearer tokens and api key values are still blanked.
    bare = t.turn_verdict(1, "", f"Authorization: Bearer {KEY}\napi_key: {KEY}\n", 300)
    assert KEY not in bare["message"], bare["message"]


def test_output_is_bounded() -> None:
    errors = "\n".join(
        json.dumps(
            {"type": "error", "error": {"name": "APIError", "data": {"message": "x" * 5000}}}
        )
        for _ in range(10)
    )
    stderr = "\n".join(f"line {i} " + "y" * 300 for i in range(200))
    verdict = t.turn_verdict(1, errors, stderr, 300)
    assert not verdict["ok"]
    assert "(and 7 more)" in verdict["message"] and "line 199" in verdict["message"]
    assert "line 100 " not in verdict["message"]
    assert len(verdict["message"]) < 3 * t.ERROR_CHARS + t.STDERR_CHARS + 600, len(
        verdict["message"]
    )


def test_filters() -> None:
    filters = FilterModule().filters()
    assert filters["opencode_turn_wanted"]("started", False, False).startswith(
        "this rollout started nothing"
    )
    assert filters["opencode_turn_ready"](CLIENT, True, "/x", SERVED) == ""
    verdict = filters["opencode_turn_verdict"](
        {"rc": 0, "stdout": transcript(), "stderr": ""}, 300, [KEY]
    )
    assert verdict["ok"] and verdict["tools"] == ["read"]
    quiet = filters["opencode_turn_verdict"](
        {"rc": 1, "stdout": "", "stderr": "", "msg": "non-zero return code"}, 300
    )
    assert (
        "its stderr is empty" in quiet["message"] and "non-zero return code" not in quiet["message"]
    )
    missing = filters["opencode_turn_verdict"](
        {"rc": 2, "msg": f"[Errno 2] No such file {KEY}"}, 300, [KEY]
    )
    assert (
        not missing["ok"] and KEY not in missing["message"] and "No such file" in missing["message"]
    )
