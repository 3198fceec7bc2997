# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's agent turn: whether it runs, and what one real ``opencode run`` proved.

Every rollout that started something ends with one real opencode turn (a tool
round trip) through the new stack, with the config the client stage wrote on
the controller (roles/agent_client, entry point ``turn``):

- :func:`turn_wanted` - the mode (``started``, ``always``, ``never``), check
  mode and whether the rollout started the server: the reason it does not run,
  or ``""``. Decided before anything is read, so a skipped turn costs nothing.
- :func:`turn_ready` - the client stage's saved result on the head, its
  config on this controller, and what the new stack serves: the reason the
  turn cannot be meaningful (opencode not set up here, or set up for another
  model or context), or ``""``. An endpoint that does not answer is no reason
  to skip: the turn runs and opencode says what it sees.
- :func:`turn_verdict` - exit code, ``--format json`` transcript and stderr of
  the run: passed (exit 0, no error event, a tool call completed, an answer
  after it) or the client's own error, bounded, with the secrets blanked.

Pure functions; they never raise on garbage, they say what they saw.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode_measure import (
    run_events,
)

MODES = ("started", "always", "never")
# timeout(1): 124 when the deadline stopped the command, 137 when --kill-after had to kill it.
DEADLINE_CODES = (124, 137)
NOT_FOUND_CODES = (126, 127)
STDERR_LINES = 12
STDERR_CHARS = 1200
ERROR_CHARS = 400
ERRORS_SHOWN = 3
BLANK = "********"
_BEARER = re.compile(r"(?i)\b(bearer\s+|api[_-]?key[\"'=: ]+)[A-Za-z0-9._~+/=-]{4,}")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def turn_wanted(mode: str, check_mode: bool, started: bool) -> str:
    """Why this rollout does not run its agent turn; ``""`` when it does."""
    if mode not in MODES:
        return f"agent_client_rollout_turn is {mode!r}, not one of {', '.join(MODES)}"
    if mode == "never":
        return "agent_client_rollout_turn is never"
    if check_mode:
        return "check mode sends no request"
    if mode == "started" and not started:
        return "this rollout started nothing (agent_client_rollout_turn: always runs it anyway)"
    return ""


def _served(models: Any) -> dict[str, int | None] | None:
    """``{id: max_model_len}`` from a /v1/models answer's ``data``; None when it is not one."""
    if not isinstance(models, list):
        return None
    served: dict[str, int | None] = {}
    for entry in models:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            length = entry.get("max_model_len")
            served[entry["id"]] = (
                length if isinstance(length, int) and not isinstance(length, bool) else None
            )
    return served


def turn_ready(client: Any, config_exists: bool, config_path: str, models: Any = None) -> str:
    """Why the turn cannot run against this stack; ``""`` when it can.

    ``client`` is the client stage's saved result (``None`` when the head holds
    none), ``models`` the new stack's ``/v1/models`` ``data`` (``None`` when it
    did not answer: the turn runs and opencode reports the error).
    """
    if not isinstance(client, dict) or not client.get("model"):
        return "opencode is not set up (the head holds no client result: run the client stage, --tags client)"
    if not config_exists:
        return (
            f"opencode is not set up on this controller ({config_path} is missing: the client stage ran"
            " elsewhere, or run it here, --tags client)"
        )
    served = _served(models)
    if served is None:
        return ""
    model = str(client["model"])
    if model not in served:
        return (
            f"opencode is set up for {model}, the new stack serves {', '.join(sorted(served)) or 'nothing'}"
            " (the client stage, --tags client, sets it up for it)"
        )
    length, known = served[model], client.get("max_model_len")
    if isinstance(known, int) and isinstance(length, int) and known != length:
        return (
            f"opencode is set up for a context of {known} tokens, the new stack serves {length}"
            " (the client stage, --tags client, measures and writes its limits again)"
        )
    return ""


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret and every bearer token or api key value blanked."""
    out = str(text or "")
    for secret in secrets or ():
        if isinstance(secret, str) and len(secret) >= 4:
            out = out.replace(secret, BLANK)
    return _BEARER.sub(lambda m: m.group(1) + BLANK, out)


def _last_lines(text: str, lines: int = STDERR_LINES, chars: int = STDERR_CHARS) -> str:
    kept = [line.rstrip() for line in _ANSI.sub("", str(text or "")).splitlines() if line.strip()]
    tail = " | ".join(kept[-lines:])
    return tail if len(tail) <= chars else "..." + tail[-chars:]


def turn_verdict(
    rc: Any, stdout: str, stderr: str, timeout: int, secrets: Iterable[str] = ()
) -> dict[str, Any]:
    """What one ``opencode run --format json`` of the turn proved.

    ``ok`` when opencode exited 0, printed no error event, completed at least
    one tool call and answered after it. ``message`` is one bounded line:
    what passed, or what failed with the client's own errors and the last
    lines of its stderr, secrets blanked.
    """
    run = run_events(stdout)
    completed = [call["tool"] for call in run["tool_calls"] if call["status"] == "completed"]
    problems: list[str] = []
    code = rc if isinstance(rc, int) and not isinstance(rc, bool) else None
    if code in DEADLINE_CODES:
        problems.append(f"it was stopped at its deadline ({timeout} s, agent_client_turn_timeout)")
    elif code in NOT_FOUND_CODES:
        problems.append(
            f"it could not be run (exit {code}: is agent_client_opencode installed here?)"
        )
    elif code != 0:
        problems.append(f"it exited {code if code is not None else 'without an exit code'}")
    if run["errors"]:
        shown = [error[:ERROR_CHARS] for error in run["errors"][:ERRORS_SHOWN]]
        more = len(run["errors"]) - len(shown)
        problems.append(
            "its errors: " + "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")
        )
    if not completed:
        seen = ", ".join(f"{call['tool']} {call['status']}" for call in run["tool_calls"]) or "none"
        problems.append(f"no tool call completed (tool calls: {seen})")
    elif not run["text"].strip():
        problems.append("no answer after the tool result")
    steps = len(run["steps"])
    if problems:
        tail = _last_lines(stderr)
        message = (
            "opencode's turn through the new stack failed: "
            + "; ".join(problems)
            + (f"; last lines of its stderr: {tail}" if tail else "; its stderr is empty")
        )
    else:
        answer = " ".join(run["text"].split())
        message = (
            f"opencode completed a turn with a tool round trip ({', '.join(completed)}) in {steps} steps;"
            f" it answered: {answer[:200]}"
        )
    return {
        "ok": not problems,
        "message": redact(message, secrets),
        "tools": completed,
        "steps": steps,
        "errors": len(run["errors"]),
        "rc": code,
    }
