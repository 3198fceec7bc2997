# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A bounded soak of the lab's endpoint with agent-shaped traffic through a run of faults.

``SOAK_SESSIONS`` (2-4, default 3) sessions talk to the lab's ingress for ``SOAK_MINUTES``
(default 20) as a coding agent does: TLS verified against the ingress's CA, the key, the
collection's own connection helper (benchmarks/_soak_client.py), OpenAI chat completions,
streamed, with opencode's tools offered; a tool call is answered with a tool result and the
conversation goes on, each turn adding a part of a file, until its prompt nears the served
``max_model_len``, then a new conversation starts. Every request has a deadline
(``SOAK_DEADLINE_S``, default 30 s); a 503 (or 429) with Retry-After is a deferral: the session
waits as told (at most 30 s) and asks again, and it is counted apart from failures.

Before any fault the endpoint must stream a token within ``SOAK_READY_S`` (default 120 s);
otherwise the soak stops at once with the error and exit 1, and writes no availability. The
faults (benchmarks/_soak_schedule.py: a wedged TP rank, the head's server killed, the cluster
link down ``SOAK_FLAP_S``, a key rotation, an upgrade that regresses and one that qualifies,
Caddy stopped) are spaced evenly over the run, one at a time: as many as fit ``SOAK_MINUTES``
(3: the wedge alone, 60: all seven), or those ``SOAK_FAULTS`` names (a comma list, or
``none``). Each is caused as its lab test causes it and put back whatever happens
(benchmarks/_soak_faults.py); the next waits until the clients were answered again. No fault
is caused unless a request was answered before it. A session refused with 401 reads the key
again (``SOAK_KEY_FILE`` or the lab's key file) and asks once more: a rotation changed it.

Writes ``.lab/soak.json`` (availability overall and outside fault windows; per fault its
window, outage, failed and deferred requests and what put it back; time to first token p50/p95
before the first fault, in fault windows and after the last, and around each fault; the
watchdog's incidents of the run; the goals judged) and every request to
``.lab/soak-requests.jsonl``. Exits 1 when nothing was measured, a fault was not caused, went
wrong or was not recovered, availability outside fault windows is below
``SOAK_MIN_AVAILABILITY`` (percent, default 99.0) or nothing streams after the run. The goals
(>= 99.5 % answered outside fault windows; each outage <= the watchdog's detection + 1.3 x a
plain restart, from ``make bench``'s watchdog part in .lab/bench.json) are printed as verdicts.
Stops by itself; talks only to loopback and lab addresses (``SOAK_ENDPOINT``, ``SOAK_CA_FILE``,
``SOAK_KEY_FILE`` point it elsewhere on them).

    SOAK_MINUTES=60 .venv/bin/python benchmarks/soak.py [--output .lab/soak.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _faults as faults
from benchmarks import _soak_schedule as schedule
from benchmarks._soak_client import (
    RETRY_AFTER_MAX,
    NeverAnswered,
    Refused,
    Target,
    first_answer,
    served_max_model_len,
    stream_chat,
    target_from_env,
    with_fresh_key,
)
from benchmarks._soak_faults import Options, make
from benchmarks._soak_summary import Request, goals, summarise, summary_lines, verdict
from lab.harness import LAB_DIR, MODEL, ROOT, UPGRADE_TIMEOUT, LabError, lab_up

# Quiet time, at least, between a fault's recovery and the next one.
MIN_QUIET = 60
# After the run: how long the watchdog has to bring a token back (the lab's
# watchdog_ready_timeout_s) before the soak restarts the units itself.
PUT_BACK_WAIT = 300
# A conversation starts again once its prompt passes this share of max_model_len.
CONTEXT_SHARE = 0.75
MAX_TOKENS = 64
FILE_PART_CHARS = 1200
SYSTEM = (
    "You are opencode, an interactive CLI agent that helps with software engineering tasks."
    " Use the tools available to you to read the project before you answer; keep answers"
    " short; never guess file contents you have not read."
)
TASKS = (
    "Why does the rollout stop the worker's rank before the head's server?",
    "Find where the watchdog records its incidents and summarise the schema.",
    "What does make bench measure, and what does it write?",
    "Read the lab harness and tell me how a playbook run is bounded.",
)


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_PATH = {"type": "string", "description": "The absolute or project-relative path."}
# What opencode offers (its file, search and shell tools), in its shape.
TOOLS = [
    _tool("read", "Read a file or list a directory of the project.",
          {"filePath": _PATH, "offset": {"type": "integer"}, "limit": {"type": "integer"}}, ["filePath"]),
    _tool("glob", "Find files by a glob pattern.", {"pattern": {"type": "string"}, "path": _PATH}, ["pattern"]),
    _tool("grep", "Search file contents with a regular expression.",
          {"pattern": {"type": "string"}, "path": _PATH, "include": {"type": "string"}}, ["pattern"]),
    _tool("bash", "Run a shell command in the project and return its output.",
          {"command": {"type": "string"}, "timeout": {"type": "integer"},
           "description": {"type": "string"}}, ["command", "description"]),
    _tool("edit", "Replace a string in a file.",
          {"filePath": _PATH, "oldString": {"type": "string"}, "newString": {"type": "string"}},
          ["filePath", "oldString", "newString"]),
]


def tool_result(call: dict[str, Any]) -> str:
    """What the agent's tool would return: the checkout's own listing for ``read`` of a directory."""
    if call["name"] == "read":
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in ROOT.iterdir()
                       if not p.name.startswith("."))
        return "\n".join(names[:50])
    return f"{call['name']}: done"


class Session(threading.Thread):
    """One agent: conversations of tool turns and growing context until the run's end."""

    def __init__(self, number: int, run: Soak) -> None:
        super().__init__(name=f"soak-session-{number}", daemon=True)
        self.number, self.run_ = number, run
        self.random = random.Random(number)
        self.document = (ROOT / "README.md").read_text(encoding="utf-8")

    def run(self) -> None:
        soak = self.run_
        # Bounded: at most one conversation per second of the run, per session.
        for conversation in range(1, int(soak.seconds) + 2):
            if soak.over() or not self.conversation(conversation):
                return

    def conversation(self, number: int) -> bool:
        """One conversation; False when the run is over."""
        soak = self.run_
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": self.random.choice(TASKS)},
        ]
        offset = self.random.randrange(0, max(1, len(self.document) - FILE_PART_CHARS))
        for turn in range(1, 64):
            if soak.over():
                return False
            reply, record = soak.send(self.number, number, turn, messages)
            if record.error and record.error.startswith("HTTP 400"):  # refused (too long): a new conversation
                return True
            if record.deferred:  # told to wait: as long as it says (bounded), then the same turn
                soak.pause(record.retry_after or 1.0)
                continue
            if reply is None:  # failed: the agent retries the same turn
                soak.pause(2.0)
                continue
            if reply["tool_calls"]:
                calls = [{"id": c["id"] or f"call_{self.number}_{number}_{turn}_{i}", **c}
                         for i, c in enumerate(reply["tool_calls"])]
                messages.append({"role": "assistant", "content": "", "tool_calls": [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]})
                messages += [{"role": "tool", "tool_call_id": c["id"], "content": tool_result(c)}
                             for c in calls]
                continue
            if (reply["prompt_tokens"] or 0) > CONTEXT_SHARE * soak.max_model_len:
                return True
            messages.append({"role": "assistant", "content": reply["content"]})
            part = self.document[offset:offset + FILE_PART_CHARS]
            offset = (offset + FILE_PART_CHARS) % max(1, len(self.document) - FILE_PART_CHARS)
            messages.append({"role": "user", "content": f"Here is the next part of the file:\n{part}"})
            soak.pause(self.random.uniform(0.5, 2.0))
        return True


class Soak:
    def __init__(self, target: Target, minutes: float, sessions: int, deadline: float,
                 plan: list[schedule.Planned], options: Options | None = None) -> None:
        self.target, self.seconds, self.sessions, self.deadline = target, minutes * 60, sessions, deadline
        self.plan, self.options = plan, options or Options()
        self.planned = [p.name for p in plan]
        self.key_reloads = 0
        self.max_model_len = served_max_model_len(target) or 4096
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.requests: list[Request] = []
        self.faults: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.never_answered: str | None = None
        self.start = self.start_epoch = 0.0
        # While set, the run may last up to grace seconds past its minutes (Soak.end).
        self.fault_open = threading.Event()
        self.grace = env_number("SOAK_RECOVERY_GRACE_S", 300)

    def now(self) -> float:
        return time.monotonic() - self.start

    def end(self) -> float:
        """The run's end: SOAK_MINUTES, or up to RECOVERY_GRACE later while a fault is not over
        (a wedge caused near the end is judged on its recovery, not cut off by the clock)."""
        return self.seconds + (self.grace if self.fault_open.is_set() else 0.0)

    def over(self) -> bool:
        return self.stop.is_set() or self.now() >= self.end()

    def pause(self, seconds: float) -> None:
        self.stop.wait(max(0.0, min(seconds, self.end() - self.now())))

    def send(
        self, session: int, conversation: int, turn: int, messages: list[dict[str, Any]]
    ) -> tuple[dict[str, Any] | None, Request]:
        body = {"model": MODEL, "messages": messages, "tools": TOOLS, "tool_choice": "auto",
                "max_tokens": MAX_TOKENS, "stream": True, "stream_options": {"include_usage": True}}
        started = self.now()
        reply, error, deferred, wait = None, None, False, None
        for attempt in (1, 2):
            try:
                reply = stream_chat(self.target, body, self.deadline)
            except TimeoutError:
                error = f"no answer within the {self.deadline:g} s deadline"
            except Refused as err:
                error, deferred, wait = str(err), err.deferred, err.retry_after
                if err.status == 401 and attempt == 1 and self.fresh_key():
                    error, deferred, wait = None, False, None
                    continue
            except RuntimeError as err:
                error = str(err)
            break
        kind = "" if reply is None else "tool_call" if reply["tool_calls"] else "answer"
        record = Request(session, conversation, turn, round(started, 3), round(self.now() - started, 3),
                         reply is not None, None if reply is None or reply["ttft"] is None
                         else round(reply["ttft"], 3), kind,
                         None if reply is None else reply["prompt_tokens"], error, deferred,
                         None if wait is None else min(wait, RETRY_AFTER_MAX))
        with self.lock:
            self.requests.append(record)
        return reply, record

    def fresh_key(self) -> bool:
        """After a 401: the key read again (a rotation rewrote it); False when it is the same."""
        with self.lock:
            fresh = with_fresh_key(self.target)
            if fresh is None:
                return False
            self.target = fresh
            self.key_reloads += 1
            return True

    # --- the faults --------------------------------------------------------
    def answered_yet(self) -> bool:
        """A request was answered: no fault is caused on an endpoint that never served."""
        with self.lock:
            if any(r.ok for r in self.requests):
                return True
            errors = [r.error for r in self.requests if r.error]
        self.never_answered = (f"{len(errors)} request(s), none answered; the last: {errors[-1]}"
                               if errors else "no request finished")
        self.stop.set()
        return False

    def waiting(self, seconds: float) -> bool:
        """Wait (the run's clock allowing); False once the run is over."""
        self.pause(seconds)
        return not self.over()

    def faults_run(self) -> None:
        """The faults one at a time, each at its time or MIN_QUIET after the last one's recovery."""
        ready_at = 0.0
        for index, planned in enumerate(self.plan):
            self.pause(max(planned.at, ready_at) - self.now())
            fits = self.now() + planned.spec.needs_minutes * 60 <= self.seconds
            if self.over() or not fits:
                left = ", ".join(p.name for p in self.plan[index:])
                self.notes.append(f"{left}: did not fit before the end of the run")
                return
            if not self.answered_yet():
                return
            self.cause(planned)
            ready_at = self.now() + MIN_QUIET

    def cause(self, planned: schedule.Planned) -> None:
        """One fault: caused, settled, put back (always), then the clients answered again."""
        fault = make(planned.spec, self.options)
        injected, injected_epoch = self.now(), time.time()
        settled: dict[str, Any] = {}
        errors, note = [], None
        self.fault_open.set()
        try:
            try:
                fault.cause()
                settled = fault.settle(self.waiting)
            except LabError as err:
                errors.append(f"{'caused, then' if fault.caused else 'could not be caused:'} {err}")
            finally:
                try:
                    note = fault.put_back(settled)
                except LabError as err:
                    errors.append(f"putting it back failed: {err}")
            ended = self.now()
            self.wait_for_an_answer(ended)
        finally:
            self.fault_open.clear()
        if not fault.caused:
            self.notes.append(f"the {planned.name} could not be caused: {'; '.join(errors)}")
            return
        window_end = settled.get("window_end_epoch")
        self.faults.append({
            "name": planned.name, "caused_by": planned.spec.caused, "planned": planned.at,
            "injected": round(injected, 1), "ended": round(ended, 1),
            "window_end": round(max(injected, float(window_end) - self.start_epoch), 1) if window_end else None,
            "injected_epoch": round(injected_epoch, 3), "restarts": planned.spec.restarts,
            "watchdog_expected": planned.spec.watchdog is not None,
            **{k: v for k, v in settled.items() if k != "window_end_epoch"},
            "put_back": note, "error": "; ".join(filter(None, [fault.error, *errors])) or None,
        })

    def wait_for_an_answer(self, since: float) -> None:
        """Keep the run going (within the grace) until a request started after ``since`` is answered."""
        while not self.over():
            with self.lock:
                if any(r.ok and r.started > since for r in self.requests):
                    return
            self.pause(1.0)

    def run(self) -> dict[str, Any]:
        self.start, self.start_epoch = time.monotonic(), time.time()
        fault_thread = threading.Thread(target=self.faults_run, name="soak-faults")
        sessions = [Session(n, self) for n in range(1, self.sessions + 1)]
        fault_thread.start()
        for session in sessions:
            session.start()
        try:
            for session in sessions:
                session.join(timeout=max(1.0, self.seconds + self.grace - self.now()) + self.deadline + 30)
        finally:
            self.stop.set()  # also on Ctrl-C: the fault thread puts the lab back
            # Every lab command it runs is bounded (an upgrade's playbook by UPGRADE_TIMEOUT).
            fault_thread.join(timeout=2 * UPGRADE_TIMEOUT)
        if self.never_answered:
            raise NeverAnswered(self.never_answered)
        time.sleep(2)  # the watchdog's last record of the run
        records = faults.incidents(self.start_epoch)
        result = summarise(self.requests, self.faults, records)
        result["planned_faults"] = self.planned
        result["incident_records"] = [
            {k: r.get(k) for k in ("time", "verdict", "action", "outcome", "detect_seconds",
                                   "recover_seconds", "evidence")} for r in records]
        result["notes"] = self.notes
        result["key_reloads"] = self.key_reloads
        return result


def put_back(target: Target) -> dict[str, Any]:
    """The lab serving after the run: left to the watchdog first; a plain restart of the units
    only when nothing streams within ``PUT_BACK_WAIT`` (its budget spent, or its restart failed)."""
    try:
        first_answer(target, within=PUT_BACK_WAIT, deadline=20, every=5)
        return {"streams": True, "restarted_by_hand": False}
    except NeverAnswered:
        pass
    try:
        faults.plain_restart()
    except LabError as err:
        return {"streams": False, "restarted_by_hand": True, "error": str(err)}
    return {"streams": True, "restarted_by_hand": True}


def bench_watchdog(path: Path) -> dict[str, Any] | None:
    """make bench's watchdog part (its detection and plain restart), or None when it has not run."""
    try:
        part = json.loads(path.read_text()).get("parts", {}).get("watchdog")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(part, dict) or "plain_restart_seconds" not in part:
        return None
    return {k: part.get(k) for k in ("watchdog_detect_seconds", "plain_restart_seconds",
                                     "watchdog_recover_ratio")}


def requests_log(output: Path) -> Path:
    """Every request of the run, beside its result: soak.json -> soak-requests.jsonl."""
    return output.with_name(f"{output.stem}-requests.jsonl")


def env_number(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        return float(value) if value else default
    except ValueError:
        raise SystemExit(f"{name}={value!r} is not a number") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=env_number("SOAK_MINUTES", 20))
    parser.add_argument("--sessions", type=int, default=int(env_number("SOAK_SESSIONS", 3)))
    parser.add_argument("--deadline", type=float, default=env_number("SOAK_DEADLINE_S", 30))
    parser.add_argument("--flap-seconds", type=float, default=env_number("SOAK_FLAP_S", 20),
                        help="the link flap's length; 0: no link flap")
    parser.add_argument("--faults", default=os.environ.get("SOAK_FAULTS", ""),
                        help=f"comma list of {', '.join(s.name for s in schedule.FAULTS)}, or none;"
                             " default: as many as fit the minutes")
    parser.add_argument("--caddy-seconds", type=float, default=env_number("SOAK_CADDY_S", 120),
                        help="how long Caddy may stay stopped before the soak starts it itself")
    parser.add_argument("--ready-seconds", type=float, default=env_number("SOAK_READY_S", 120),
                        help="how long the endpoint has to stream a first token before any fault")
    parser.add_argument("--min-availability", type=float, default=env_number("SOAK_MIN_AVAILABILITY", 99.0),
                        help="the floor (percent) of availability outside fault windows")
    parser.add_argument("--output", type=Path, default=LAB_DIR / "soak.json")
    parser.add_argument("--lock", default=os.environ.get("LOCALINFERENCE_LAB_LOCK") or None,
                        help="hold flock on this file while the soak runs (the shared lab's lock)")
    args = parser.parse_args()
    if not 2 <= args.sessions <= 4:
        parser.error("--sessions (SOAK_SESSIONS) must be 2-4")
    if not 2 <= args.minutes <= 240:
        parser.error("--minutes (SOAK_MINUTES) must be 2-240")
    if not 5 <= args.deadline <= 300 or not (args.flap_seconds == 0 or 1 <= args.flap_seconds <= 120):
        parser.error("--deadline must be 5-300 s and --flap-seconds 0 (none) or 1-120 s")
    if not 1 <= args.ready_seconds <= 900 or not 0 <= args.min_availability <= 100:
        parser.error("--ready-seconds (SOAK_READY_S) must be 1-900 s, --min-availability 0-100 %")
    if not 10 <= args.caddy_seconds <= 600:
        parser.error("--caddy-seconds (SOAK_CADDY_S) must be 10-600 s")
    try:
        args.plan = schedule.schedule(schedule.select(args.faults, args.minutes, args.flap_seconds),
                                      args.minutes)
    except ValueError as err:
        parser.error(str(err))
    try:
        target = target_from_env()
        # As a client, before anything touches the lab: a soak of an endpoint that never
        # answers would only measure its own misconfiguration.
        ready = first_answer(target, within=args.ready_seconds, deadline=min(args.deadline, args.ready_seconds))
    except NeverAnswered as err:
        print(f"soak: the endpoint never answered before any fault: {err}", file=sys.stderr)
        return 1
    except LabError as err:
        print(f"soak: {err}", file=sys.stderr)
        return 2
    print(f"soak: {target.chat_url} answered (first token in {ready['ttft_s']} s, {ready['attempts']}"
          f" attempt(s)); the soak starts; its faults:\n{schedule.describe(args.plan)}", flush=True)
    if not lab_up():
        print("needs the lab hosts spark-head and spark-worker running (make lab)", file=sys.stderr)
        return 2
    # Imported here: bench imports every part, which the unit tests of the summary need not.
    from benchmarks.bench import lab_lock

    try:
        with lab_lock(args.lock):
            document = soak_run(args, target)
    except NeverAnswered as err:
        print(f"soak: the endpoint never answered before any fault: {err}", file=sys.stderr)
        return 1
    except LabError as err:
        print(f"soak: {err}", file=sys.stderr)
        return 1
    print(summary_lines(document))
    print(f"written: {args.output} (every request: {requests_log(args.output)})")
    failures = verdict(document, args.min_availability)
    for failure in failures:
        print(f"soak failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


def soak_run(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """The soak once the lab is watched and serving; writes soak.json and the request log."""
    from benchmarks.bench import LoadSampler, git_commit, machine

    ready = faults.wait_watched_and_serving()
    needed = schedule.watchdog_restarts([p.spec for p in args.plan])
    if ready["budget_left"] is not None and ready["budget_left"] < needed:
        raise LabError(f"the watchdog may restart {ready['budget_left']} more time(s) in its window and"
                       f" the faults need {needed}: it would only page; wait for its window"
                       " (watchdog_restart_window_s) to pass, or pick fewer with SOAK_FAULTS")
    options = Options(args.flap_seconds, args.caddy_seconds, args.output.parent / "soak-upgrades")
    soak = Soak(target, args.minutes, args.sessions, args.deadline, args.plan, options)
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with LoadSampler() as load:
        result = soak.run()
    document = {
        "started_at": started_at,
        "minutes": args.minutes, "sessions": args.sessions, "deadline_s": args.deadline,
        "flap_seconds": args.flap_seconds, "caddy_seconds": args.caddy_seconds,
        "schedule": [{"name": p.name, "at_s": p.at, "caused_by": p.spec.caused} for p in args.plan],
        "min_availability_percent": args.min_availability,
        "endpoint": target.chat_url, "ca_file": target.ca_file, "max_model_len": soak.max_model_len,
        "machine": machine(), "load_during": load.summary(), "git": git_commit(),
        **result,
    }
    # With the key a rotation left in the key file.
    after = with_fresh_key(soak.target) or soak.target
    document["after"] = {**put_back(after), "watchdog_active": faults.watchdog_active()}
    if document["after"]["restarted_by_hand"]:
        document["notes"].append("nothing streamed after the run: the units were restarted by hand")
    document["failures"] = verdict(document, args.min_availability)
    document["bench_watchdog"] = bench_watchdog(args.output.parent / "bench.json")
    document["goals"] = goals(document, document["bench_watchdog"])
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    log = requests_log(args.output)
    log.write_text("".join(json.dumps(asdict(r)) + "\n" for r in soak.requests))
    return document


if __name__ == "__main__":
    sys.exit(main())
