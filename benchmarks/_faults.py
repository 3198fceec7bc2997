# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's faults and the head's watchdog, as the watchdog benchmark and the soak use them.

The faults are caused as tests/lab/faults/test_watchdog_faults.py causes them: ``kill -STOP``
of the worker's tensor-parallel rank (an NCCL hang as seen from outside) and the worker's
cluster link set down. The watchdog is read where it publishes: its incident log on the head
and its Prometheus text on the head's loopback. Everything goes through lab/harness.py.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.harness import (
    CLUSTER_IF,
    HEAD,
    RANK_PATTERN,
    VLLM_UNIT,
    WATCHDOG_UNIT,
    WORKER,
    LabError,
    exec_on,
    incidents,
    inventory_var,
    rank_pids,
    streams_a_token,
    watchdog_active,
)

WATCHDOG = WATCHDOG_UNIT
METRICS_URL = "http://127.0.0.1:9109/metrics"
RANK = RANK_PATTERN
# Outcomes that end a restart the watchdog made (or refused to make).
ENDED = ("recovered", "failed", "budget-spent", "paged")
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


def interval() -> float:
    """``watchdog_interval_s`` as the lab inventory gives it to the head."""
    return float(inventory_var("watchdog_interval_s"))


def first_incident(since: float, **match: Any) -> dict[str, Any] | None:
    """The first record since ``since`` whose fields equal ``match``; a tuple value means one of."""
    for record in incidents(since):
        if all(
            record.get(k) in v if isinstance(v, tuple) else record.get(k) == v
            for k, v in match.items()
        ):
            return record
    return None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as ``{'name{labels}': value}`` (labels as written; comments skipped)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if not match or line.startswith("#"):
            continue
        key = match["name"] + (f"{{{match['labels']}}}" if match["labels"] else "")
        try:
            samples[key] = float(match["value"])
        except ValueError:
            continue
    return samples


def watchdog_metrics() -> dict[str, float]:
    done = exec_on(HEAD, "curl", "-s", "-m", "5", METRICS_URL, check=False)
    return parse_metrics(done.stdout)


def watchdog_verdict(samples: dict[str, float]) -> str | None:
    for key, value in samples.items():
        if key.startswith("localinference_watchdog_verdict{") and value == 1:
            return key.split('verdict="', 1)[1].split('"', 1)[0]
    return None


def budget_left(samples: dict[str, float]) -> int | None:
    """Restarts the watchdog may still make in its window, or None when it publishes no budget."""
    budget = samples.get("localinference_watchdog_restart_budget")
    used = samples.get("localinference_watchdog_restarts_in_window")
    return None if budget is None or used is None else int(budget - used)


def wait_watched_and_serving(timeout: float = 600, every: float = 5) -> dict[str, Any]:
    """Block until the watchdog runs, its last look is healthy and the endpoint streams a token.

    Returns the watchdog's state then; raises :class:`LabError` naming what was missing.
    """
    deadline = time.monotonic() + timeout
    missing = "nothing looked at yet"
    while time.monotonic() < deadline:
        if not watchdog_active():
            missing = f"{WATCHDOG} is not active on {HEAD}"
        else:
            samples = watchdog_metrics()
            verdict = watchdog_verdict(samples)
            if verdict != "healthy":
                missing = f"the watchdog's last look is {verdict or 'not published'}, not healthy"
            elif not streams_a_token(timeout=20):
                missing = "the endpoint streams no token through the ingress"
            else:
                return {"verdict": verdict, "budget_left": budget_left(samples)}
        time.sleep(every)
    raise LabError(f"the lab is not watched and serving after {timeout:g} s: {missing}")


def stop_rank() -> tuple[list[str], float]:
    """``kill -STOP`` of the worker's TP rank; returns its pids and the epoch just before the kill."""
    pids = rank_pids()
    if not pids:
        raise LabError(f"no process {RANK!r} on {WORKER}: is the lab serving?")
    at = time.time()
    exec_on(WORKER, "kill", "-STOP", *pids)
    return pids, at


def cont_rank(pids: list[str]) -> None:
    """``kill -CONT``; pids that are gone (the watchdog restarted the rank) are no error."""
    if pids:
        exec_on(WORKER, "kill", "-CONT", *pids, check=False)


def link(state: str) -> None:
    """The worker's cluster link ``up`` or ``down``."""
    exec_on(WORKER, "ip", "link", "set", "dev", CLUSTER_IF, state)


def next_token(timeout: float, give_up: Callable[[], str | None] = lambda: None) -> float:
    """Epoch of the next token streamed through the ingress (polled every 0.25 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if streams_a_token(timeout=5):
            return time.time()
        reason = give_up()
        if reason:
            raise LabError(reason)
        time.sleep(0.25)
    raise LabError(f"no token streamed through the ingress within {timeout:g} s")


def plain_restart(token_timeout: float = 900) -> dict[str, float]:
    """A plain cluster restart with the watchdog paused: the server unit stopped on the head
    then the worker, started on the worker then the head, to the next streamed token.

    Returns the epochs it started and streamed at and the seconds systemctl took; the watchdog
    is started again whatever happens.
    """
    exec_on(HEAD, "systemctl", "stop", WATCHDOG)
    try:
        started, started_at = time.monotonic(), time.time()
        for host in (HEAD, WORKER):
            exec_on(host, "systemctl", "stop", VLLM_UNIT, timeout=180)
        for host in (WORKER, HEAD):
            exec_on(host, "systemctl", "start", VLLM_UNIT, timeout=300)
        units = time.monotonic() - started
        token_at = next_token(token_timeout)
    finally:
        exec_on(HEAD, "systemctl", "start", WATCHDOG)
    return {"started_at": started_at, "token_at": token_at, "systemctl_seconds": units}
