# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The head's watchdog against a wedged engine, against a plain cluster restart, in one run.

W: ``kill -STOP`` of the worker's tensor-parallel rank (``VLLM::Worker_TP1``: every request
   hangs while ``/health`` answers), then the watchdog alone. Detection: from the kill to the
   epoch of the first incident record with verdict ``wedged`` (``incidents.jsonl`` on the head,
   polled). Recovery: from that verdict to the next token streamed through the ingress with the
   lab's key, measured from the controller. The rank gets ``kill -CONT`` whatever happens.
P: a plain cluster restart with the watchdog stopped: ``systemctl stop`` of the server unit on
   the head then the worker, ``systemctl start`` on the worker then the head, to the first
   token streamed through the ingress. The watchdog is started again whatever happens.
Prints detection against 2 x ``watchdog_interval_s`` and the ratio W/P against 1.3. Needs
`make lab` with the watchdog running healthy and one restart left in its budget.

    .venv/bin/python benchmarks/watchdog_recovery.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._faults import (
    ENDED,
    RANK,
    WATCHDOG,
    cont_rank,
    first_incident,
    interval,
    next_token,
    plain_restart,
    stop_rank,
    wait_watched_and_serving,
    watchdog_active,
)
from benchmarks._measured import exit_code
from lab.harness import HEAD, VLLM_UNIT, WORKER, LabError, exec_on, lab_up

DETECT_GOAL_INTERVALS = 2.0
RECOVER_GOAL = 1.3
# The watchdog's log of each restart step (``journalctl -o short-unix``).
RESTART_STEP = re.compile(
    r"^(?P<at>\d+\.\d+) \S+ watchdog\[\d+\]: restart: (?P<node>[\w.-]+): (?P<step>stop|verify|start)\b"
)
# Where an engine boot's seconds go, read off the head's server unit journal (vLLM 0.32's own
# lines, as `make lab` logs them; tests/unit/fixtures/vllm-logs/lab-boot-journal.txt): each
# milestone's first line after the unit's "Starting", in the order they come.
BOOT_MILESTONES = (
    ("unit_started", re.compile(r"systemd\[1\]: Started localinference-vllm")),
    ("python_up", re.compile(r"\(APIServer pid=\d+\) .*non-default args:")),
    ("engine_process", re.compile(r"Initializing a V1 LLM engine")),
    ("ranks_joined", re.compile(r"rank 0 in world size \d+ is assigned as")),
    ("weights_loaded", re.compile(r"Loading weights took")),
    ("engine_ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("api_up", re.compile(r"Application startup complete")),
)
_UNIT_STARTING = re.compile(r"^(?P<at>\d+\.\d+) \S+ systemd\[1\]: Starting localinference-vllm")
_AT = re.compile(r"^(?P<at>\d+\.\d+) ")
# Bounds only: the lab's watchdog waits up to watchdog_ready_timeout_s (300 s) for a token.
RECOVER_TIMEOUT = 600
BOOT_TIMEOUT = 900


def wait_for(what: str, predicate: Callable[[], Any], timeout: float, every: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise LabError(f"{what} did not happen within {timeout:g} s")


def restart_steps(journal: str, since: float) -> list[dict[str, Any]]:
    """Each restart step the watchdog logged (node, step, seconds after ``since``), in order."""
    steps = []
    for line in journal.splitlines():
        match = RESTART_STEP.match(line)
        if match and float(match["at"]) >= since:
            steps.append({"node": match["node"], "step": match["step"],
                          "seconds": round(float(match["at"]) - since, 2)})
    return steps


def boot_milestones(journal: str, token_at: float | None = None) -> dict[str, float]:
    """Seconds from the last "Starting" of the head's server unit to each milestone (and the token).

    ``journal`` is ``journalctl -o short-unix`` of the unit; a milestone the boot never logged
    is left out, so a missing key says the engine did not get there.
    """
    lines = journal.splitlines()
    starts = [i for i, line in enumerate(lines) if _UNIT_STARTING.match(line)]
    if not starts:
        return {}
    zero = float(_UNIT_STARTING.match(lines[starts[-1]])["at"])
    found: dict[str, float] = {}
    for line in lines[starts[-1]:]:
        at = _AT.match(line)
        for name, pattern in BOOT_MILESTONES:
            if at and name not in found and pattern.search(line):
                found[name] = round(float(at["at"]) - zero, 2)
    if token_at is not None:
        found["first_token"] = round(token_at - zero, 2)
    return found


def server_journal(since: float, until: float) -> str:
    return exec_on(HEAD, "journalctl", "-u", VLLM_UNIT, "--since", f"@{since:.0f}", "--until",
                   f"@{until + 1:.0f}", "-o", "short-unix", "--no-pager", check=False).stdout


def journal_since(since: float, until: float) -> str:
    return exec_on(HEAD, "journalctl", "-u", WATCHDOG, "--since", f"@{since:.0f}", "--until",
                   f"@{until + 1:.0f}", "-o", "short-unix", "--no-pager", check=False).stdout


def wedge(every: float) -> dict[str, Any]:
    """W: the stopped rank, the watchdog's verdict, its restart, the next streamed token."""
    pids, killed_at = stop_rank()
    try:
        verdict = wait_for(
            "the wedge verdict",
            lambda: first_incident(killed_at, verdict="wedged"),
            6 * every + 60,
            0.5,
        )
        if verdict["action"] != "restart":
            raise LabError(
                f"the watchdog judged the wedge but did not restart (action {verdict['action']},"
                f" outcome {verdict['outcome']}): {verdict['evidence']}"
            )

        def failed() -> str | None:
            end = first_incident(killed_at, verdict="wedged", outcome=("failed", "budget-spent"))
            return f"the watchdog's restart failed: {end['evidence']}" if end else None

        token_at = next_token(RECOVER_TIMEOUT, failed)
        ended = wait_for(
            "the watchdog's recovered record",
            lambda: first_incident(killed_at, verdict="wedged", outcome=ENDED),
            RECOVER_TIMEOUT,
            1.0,
        )
    finally:
        cont_rank(pids)
    steps = restart_steps(journal_since(verdict["epoch"] - 1, token_at), verdict["epoch"])
    starts = [s["seconds"] for s in steps if s["step"] == "start"]
    return {
        "killed_at": round(killed_at, 3),
        "verdict_at": verdict["epoch"],
        "token_at": round(token_at, 3),
        "detect_seconds": round(verdict["epoch"] - killed_at, 2),
        "recover_seconds": round(token_at - verdict["epoch"], 2),
        "watchdog_detect_seconds": verdict.get("detect_seconds"),
        "watchdog_recover_seconds": ended.get("recover_seconds"),
        "outcome": ended["outcome"],
        "evidence": verdict["evidence"],
        "findings": [f.get("id") for f in verdict.get("findings") or []],
        "restart_steps": steps,
        # From the head's server start (the last start step) to the streamed token.
        "engine_boot_seconds": round(token_at - verdict["epoch"] - starts[-1], 2) if starts else None,
        "boot_milestones": boot_milestones(server_journal(verdict["epoch"], token_at), token_at),
    }


def plain() -> dict[str, Any]:
    """P: the units stopped head first and started worker first, the watchdog paused meanwhile."""
    load = os.getloadavg()[0]
    done = plain_restart(BOOT_TIMEOUT)
    return {
        "seconds": round(done["token_at"] - done["started_at"], 2),
        "systemctl_seconds": round(done["systemctl_seconds"], 2),
        "engine_boot_seconds": round(
            done["token_at"] - done["started_at"] - done["systemctl_seconds"], 2
        ),
        "load_at_start": round(load, 2),
        "boot_milestones": boot_milestones(server_journal(done["started_at"], done["token_at"]),
                                           done["token_at"]),
    }


def measure() -> dict[str, Any]:
    every = interval()
    ready = wait_watched_and_serving()
    if ready["budget_left"] is not None and ready["budget_left"] < 1:
        raise LabError(
            "the watchdog's restart budget is spent (localinference_watchdog_restarts_in_window):"
            " it would only page; wait for its window to pass"
        )
    result: dict[str, Any] = {"interval_s": every, "load_at_start": round(os.getloadavg()[0], 2)}
    w = wedge(every)
    # The watchdog's restart has just proved a token; the plain restart starts from the same state.
    p = plain()
    result.update(
        {
            "wedge": w,
            "plain_restart": p,
            "watchdog_detect_seconds": w["detect_seconds"],
            "watchdog_detect_goal_seconds": DETECT_GOAL_INTERVALS * every,
            "watchdog_recover_seconds": w["recover_seconds"],
            "plain_restart_seconds": p["seconds"],
            "watchdog_recover_ratio": round(w["recover_seconds"] / p["seconds"], 2),
            "watchdog_active_after": watchdog_active(),
        }
    )
    return result


def report(result: dict[str, Any]) -> str:
    w, p = result["wedge"], result["plain_restart"]
    goal = result["watchdog_detect_goal_seconds"]
    steps = ", ".join(f"{s['node']} {s['step']} {s['seconds']:.1f}" for s in w["restart_steps"])
    detect, ratio = result["watchdog_detect_seconds"], result["watchdog_recover_ratio"]
    return "\n".join(
        [
            f"W kill -STOP of {WORKER}'s {RANK} -> the watchdog's wedge verdict (it looks every"
            f" {result['interval_s']:g} s): {detect:.1f} s (the record's own detect_seconds:"
            f" {w['watchdog_detect_seconds']}; findings {', '.join(w['findings']) or 'none'})",
            f"  the wedge verdict -> the next token streamed through the ingress (from the controller):"
            f" {w['recover_seconds']:.1f} s (the watchdog's own recover_seconds:"
            f" {w['watchdog_recover_seconds']}, outcome {w['outcome']})",
            f"  its restart, each step done at (s after the verdict): {steps}; then {w['engine_boot_seconds']} s"
            " from the head's server start to the token",
            f"P plain restart (server unit stopped on {HEAD} then {WORKER}, started {WORKER} first,"
            f" watchdog paused) -> first streamed token: {p['seconds']:.1f} s (systemctl"
            f" {p['systemctl_seconds']:.1f} s, then {p['engine_boot_seconds']:.1f} s to the token;"
            f" load {p['load_at_start']:.1f})",
            "where the head's boot went (s after its unit's Starting; W | P): " + ", ".join(
                f"{name} {w['boot_milestones'].get(name, '-')} | {p['boot_milestones'].get(name, '-')}"
                for name in [*(m for m, _ in BOOT_MILESTONES), "first_token"]
            ),
            f"DETECT {detect:.1f} s   (goal <= 2 x interval = {goal:g} s: {'met' if detect <= goal else 'NOT met'})",
            f"RATIO recovery/plain restart: {ratio:.2f}   (goal <= {RECOVER_GOAL}:"
            f" {'met' if ratio <= RECOVER_GOAL else 'NOT met'})",
            f"the watchdog is {'running' if result['watchdog_active_after'] else 'NOT running'} after the part",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()
    if not lab_up():
        print("needs the lab hosts spark-head and spark-worker running (make lab)", file=sys.stderr)
        return 2
    try:
        result = measure()
    except LabError as err:
        print(err, file=sys.stderr)
        return 1
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return exit_code("watchdog", result)


if __name__ == "__main__":
    sys.exit(main())
