# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the pinned agent clients wait out an engine restart behind the ingress, and what a run of
each says about it: the one home of the numbers tests/lab/clients/test_clients_across_wedge.py
asserts and docs/agent_client.md ("A turn across a wedge") states.

A turn started during a wedge meets the outage in this order: its request hangs (the stopped rank;
vLLM's API server still answers 200 with SSE headers), the watchdog stops the head's server and the
request ends (vLLM's error event for a dead engine, or the connection closed), then every retry gets
the ingress's ``503`` with ``Retry-After`` (``ingress_retry_after``, 1-60 s) until the engine serves
again. The client finishes the turn when one of its retries comes after that. Read from the pinned
builds (lab/agent-clients.txt; both are compiled Bun bundles, the JavaScript readable in the binary)
and recorded against lab/wedge_standin.py (tests/unit/fixtures/clients-across-wedge/):

- **opencode 1.18.33** retries a failed stream five times (``RETRY_MAX_RETRIES = 5`` in its
  session/retry.ts, the cap of anomalyco/opencode PR #41939; the AI SDK's own retries are off,
  ``maxRetries: 0``). The error of the ended stream carries no headers: it waits 2 s plus up to 25 %
  (``RETRY_INITIAL_DELAY``, ``RETRY_JITTER_FACTOR``); after a 503 it waits the ``Retry-After``
  exactly (``retry-after-ms`` first, no upper bound). No config key or variable changes the count.
- **Claude Code 2.1.328** retries at once (a stream that failed before any event: without
  streaming; a lost connection: after its first 0.5 s backoff), then nine more times
  (``CLAUDE_CODE_MAX_RETRIES``, default 10, that first one counted), each wait the larger of
  ``Retry-After`` and its backoff (0.5 s doubling to a 32 s cap), each plus up to 25 %; a
  ``Retry-After`` above 60 s makes it give up at once.

Pure: no I/O; ``lab/harness.py`` and the lab test do the talking.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

OPENCODE = "opencode"
CLAUDE_CODE = "claude_code"
CLIENTS = (OPENCODE, CLAUDE_CODE)

OPENCODE_RETRIES = 5
OPENCODE_FIRST_WAIT_S = 2.0
CLAUDE_CODE_RETRIES = 9
# Its first retry, before the nine: at once, or after the first backoff plus jitter.
CLAUDE_CODE_FIRST_RETRY_MAX_S = 0.625
CLAUDE_CODE_BACKOFF_S = 0.5
CLAUDE_CODE_BACKOFF_CAP_S = 32.0
CLAUDE_CODE_RETRY_AFTER_MAX_S = 60
# Both clients add up to 25 % to a wait they compute (opencode: only to its own backoff).
JITTER = 0.25
# One retry's own round trip and scheduling on the lab's loaded 2-core machine: the stand-in saw
# up to 0.9 s more than the wait between two of opencode's requests at load 36.
PER_TRY_S = 1.0
# What the ingress's 503 tells a client (roles/ingress: ingress_retry_after, 1-60 s).
RETRY_AFTER_RANGE = (1, 60)

FINISH, GIVE_UP, EITHER = "finish", "give up", "either"


def retry_window(client: str, retry_after: float) -> tuple[float, float]:
    """The earliest and the latest a client's last retry comes, in seconds after the engine
    dropped its request, when every retry meets a 503 with ``retry_after``.

    The client finishes its turn when the engine serves again before that last retry.
    """
    low, high = RETRY_AFTER_RANGE
    if not low <= retry_after <= high:
        raise ValueError(f"retry_after: {retry_after!r} is outside the ingress's range {low}-{high} s")
    if client == OPENCODE:
        waits = OPENCODE_RETRIES - 1
        earliest = OPENCODE_FIRST_WAIT_S + waits * retry_after
        latest = OPENCODE_FIRST_WAIT_S * (1 + JITTER) + waits * retry_after + OPENCODE_RETRIES * PER_TRY_S
        return earliest, latest
    if client == CLAUDE_CODE:
        backoff = [min(CLAUDE_CODE_BACKOFF_S * 2**k, CLAUDE_CODE_BACKOFF_CAP_S) for k in range(CLAUDE_CODE_RETRIES)]
        earliest = sum(max(retry_after, wait) for wait in backoff)
        latest = CLAUDE_CODE_FIRST_RETRY_MAX_S + earliest * (1 + JITTER) + (CLAUDE_CODE_RETRIES + 1) * PER_TRY_S
        return earliest, latest
    raise ValueError(f"client: {client!r} is none of {', '.join(CLIENTS)}")


def expected(client: str, outage_s: float, retry_after: float, slack_s: float = 2.0) -> str:
    """``finish`` when the engine was away (drop to serving again) short enough for the client's
    earliest last retry, ``give up`` when longer than its latest, ``either`` in between.

    ``slack_s`` is how far the measured outage may be off (the poll's interval).
    """
    earliest, latest = retry_window(client, retry_after)
    if outage_s + slack_s <= earliest:
        return FINISH
    if outage_s - slack_s >= latest:
        return GIVE_UP
    return EITHER


def engine_away(samples: Iterable[tuple[float, int | None]]) -> tuple[float, float | None] | None:
    """From ``(epoch, HTTP status or None)`` polls of the ingress in time order: when the engine
    was first seen away (a 503) and when it answered 200 after that (None if it never did);
    None when no 503 was seen.
    """
    away = None
    for epoch, status in samples:
        if away is None and status == 503:
            away = epoch
        elif away is not None and status == 200:
            return away, epoch
    return None if away is None else (away, None)


def _json_lines(text: str) -> list[dict[str, Any]]:
    events = []
    for line in str(text or "").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def claude_code_run(stdout: str) -> dict[str, Any]:
    """``claude -p ... --output-format stream-json --verbose``: whether the turn finished, its
    answer (or the error it ended with) and each retry it announced (``api_retry`` events)."""
    events = _json_lines(stdout)
    results = [e for e in events if e.get("type") == "result"]
    result = results[-1] if results else {}
    retries = [
        {"attempt": e.get("attempt"), "delay_ms": e.get("retry_delay_ms"), "status": e.get("error_status")}
        for e in events
        if e.get("type") == "system" and e.get("subtype") == "api_retry"
    ]
    return {
        "finished": result.get("is_error") is False and result.get("subtype") == "success",
        "text": str(result.get("result") or ""),
        "api_error_status": result.get("api_error_status"),
        "retries": retries,
    }


def opencode_requests(stderr: str) -> int:
    """How many model requests opencode started, from ``opencode run --print-logs``: one
    ``message=stream`` line each, the first and every retry (a request that fails with an error
    from the server adds a ``stream error`` line too; one whose connection was closed does not)."""
    return sum(" message=stream " in line for line in str(stderr or "").splitlines())


def retry_after_of(headers: Sequence[tuple[str, str]]) -> float | None:
    """The seconds of a ``Retry-After`` header given in seconds, else None."""
    for name, value in headers:
        if name.lower() == "retry-after":
            try:
                return float(value)
            except ValueError:
                return None
    return None
