# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A bounded soak of the lab's endpoint with agent-shaped traffic, one wedge and one link flap.

``SOAK_SESSIONS`` (2-4, default 3) sessions talk to the lab's ingress with its key for
``SOAK_MINUTES`` (default 20) as a coding agent does: OpenAI chat completions, streamed, with
opencode's tools offered; a tool call is answered with a tool result and the conversation goes
on, each turn adding a part of a file, until its prompt nears the served ``max_model_len``,
then a new conversation starts. Every request has a deadline (``SOAK_DEADLINE_S``, default 30 s).
At fixed fractions of the run one wedge is caused (``kill -STOP`` of the worker's TP rank,
left to the head's watchdog; ``kill -CONT`` only when it did not recover it) and one link flap
(the worker's cluster link down for ``SOAK_FLAP_S``, default 20 s, then up, always).

Writes ``.lab/soak.json`` (availability, failed requests, time to first token p50/p95 before,
during and after each fault, the watchdog's incidents of the run) and every request to
``.lab/soak-requests.jsonl``. Stops by itself; talks only to loopback and lab addresses.

    SOAK_MINUTES=6 .venv/bin/python benchmarks/soak.py [--output .lab/soak.json]
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import ipaddress
import json
import os
import random
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _faults as faults
from lab.harness import (
    CLUSTER_ADDRESSES,
    LAB_DIR,
    MODEL,
    ROOT,
    LabError,
    auth_headers,
    endpoint,
    lab_up,
    module_utils,
    served_max_model_len,
    streams_a_token,
)

WEDGE_AT, FLAP_AT = 0.2, 0.65
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


@dataclass
class Request:
    """One request of the soak; times in seconds from the run's start."""

    session: int
    conversation: int
    turn: int
    started: float
    seconds: float
    ok: bool
    ttft: float | None = None
    kind: str = ""  # tool_call | answer
    prompt_tokens: int | None = None
    error: str | None = None


# --- the summary (pure) --------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def window(requests: Sequence[Request], start: float, end: float | None) -> dict[str, Any]:
    """Requests started in ``[start, end)``: how many, the share answered, TTFT p50/p95."""
    inside = [r for r in requests if r.started >= start and (end is None or r.started < end)]
    ttfts = [r.ttft for r in inside if r.ttft is not None]
    answered = sum(r.ok for r in inside)

    def shown(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "from_s": round(start, 1),
        "to_s": None if end is None else round(end, 1),
        "requests": len(inside),
        "answered": answered,
        "availability": round(answered / len(inside), 4) if inside else None,
        "ttft_p50_s": shown(percentile(ttfts, 50)),
        "ttft_p95_s": shown(percentile(ttfts, 95)),
    }


def recovered_at(requests: Sequence[Request], ended: float) -> float | None:
    """The start of the first answered request begun at or after the fault ended."""
    starts = [r.started for r in requests if r.ok and r.started >= ended]
    return min(starts) if starts else None


def incident_counts(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The watchdog's incidents of the run: wedges judged, recoveries made and failed."""
    return {
        "wedges_detected": sum(
            r.get("verdict") == "wedged" and r.get("outcome") not in ("recovered", "failed")
            for r in records
        ),
        "recoveries": sum(r.get("outcome") == "recovered" for r in records),
        "recoveries_failed": sum(r.get("outcome") == "failed" for r in records),
        "by_verdict": dict(Counter(str(r.get("verdict")) for r in records)),
        "actions": dict(Counter(str(r.get("action")) for r in records)),
    }


def summarise(
    requests: Sequence[Request],
    fault_times: Sequence[dict[str, Any]],
    records: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    """The soak's result from its requests, its faults (``name``, ``injected``, ``ended`` in
    seconds from the start, in order) and the watchdog's incident records of the run.

    Around each fault: ``before`` from the previous fault's recovery (or the start) to the
    injection, ``during`` from the injection to the recovery (the first answered request begun
    after the fault ended), ``after`` from the recovery to the next injection (or the end).
    """
    answered = sum(r.ok for r in requests)
    ttfts = [r.ttft for r in requests if r.ttft is not None]
    result: dict[str, Any] = {
        "requests": len(requests),
        "answered": answered,
        "failed": len(requests) - answered,
        "availability": round(answered / len(requests), 4) if requests else None,
        "tool_calls": sum(r.kind == "tool_call" for r in requests),
        "conversations": len({(r.session, r.conversation) for r in requests}),
        "ttft_p50_s": None if not ttfts else round(percentile(ttfts, 50) or 0, 3),
        "ttft_p95_s": None if not ttfts else round(percentile(ttfts, 95) or 0, 3),
        "errors": dict(Counter(r.error for r in requests if r.error)),
        "faults": {},
    }
    previous = 0.0
    for index, fault in enumerate(fault_times):
        later = fault_times[index + 1]["injected"] if index + 1 < len(fault_times) else None
        back = recovered_at(requests, fault["ended"])
        result["faults"][fault["name"]] = {
            **{k: v for k, v in fault.items() if k not in ("name",)},
            "recovered": None if back is None else round(back, 1),
            "outage_seconds": None if back is None else round(back - fault["injected"], 1),
            "before": window(requests, previous, fault["injected"]),
            "during": window(requests, fault["injected"], back),
            "after": None if back is None else window(requests, back, later),
        }
        previous = back if back is not None else fault["injected"]
    result["incidents"] = incident_counts(records)
    return result


# --- the traffic ---------------------------------------------------------------


def check_address(url: str) -> None:
    """Only loopback and the lab's own addresses: the soak never sends traffic elsewhere."""
    host = urllib.parse.urlsplit(url).hostname or ""
    lab = set(CLUSTER_ADDRESSES.values())
    try:
        allowed = ipaddress.ip_address(host).is_loopback or host in lab
    except ValueError:
        allowed = host == "localhost"
    if not allowed:
        raise LabError(f"the soak talks only to loopback and the lab's addresses, not {host!r} ({url})")


def stream_chat(url: str, body: dict[str, Any], headers: dict[str, str], deadline: float) -> dict[str, Any]:
    """POST a streamed chat completion; the whole exchange ends by ``deadline`` seconds.

    Returns ``{ttft, message: {content, tool_calls}, finish_reason, prompt_tokens}``;
    raises ``TimeoutError`` past the deadline, ``RuntimeError`` on any other failure.
    """
    sse_token = module_utils("serve._ready").sse_token
    parts = urllib.parse.urlsplit(url)
    started = time.monotonic()
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=deadline)
    try:
        conn.connect()
        sock = conn.sock
        assert sock is not None
        conn.request("POST", parts.path, body=json.dumps(body),
                     headers={"Content-Type": "application/json", **headers})
        sock.settimeout(max(0.1, deadline - (time.monotonic() - started)))
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        ttft, content, calls, finish, usage = None, [], {}, None, None
        while True:
            left = deadline - (time.monotonic() - started)
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            raw = response.readline(1 << 20)
            if not raw:
                break
            line = raw.decode("utf-8", "replace").strip()
            if ttft is None and sse_token(line):
                ttft = time.monotonic() - started
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    entry = calls.setdefault(call.get("index", 0), {"id": "", "name": "", "arguments": ""})
                    function = call.get("function") or {}
                    entry["id"] = call.get("id") or entry["id"]
                    entry["name"] += function.get("name") or ""
                    entry["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        if finish is None:
            raise RuntimeError("the stream ended without a finish_reason")
        return {
            "ttft": ttft,
            "content": "".join(content),
            "tool_calls": [calls[i] for i in sorted(calls)],
            "finish_reason": finish,
            "prompt_tokens": (usage or {}).get("prompt_tokens"),
        }
    except TimeoutError:
        raise
    except (OSError, ValueError, http.client.HTTPException) as err:
        raise RuntimeError(type(err).__name__) from None
    finally:
        conn.close()


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
            reply, error = soak.send(self.number, number, turn, messages)
            if error and error.startswith("HTTP 400"):  # refused (too long): a new conversation
                return True
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
    def __init__(self, minutes: float, sessions: int, deadline: float, flap_seconds: float) -> None:
        self.seconds, self.sessions, self.deadline = minutes * 60, sessions, deadline
        self.flap_seconds = flap_seconds
        self.url = f"{endpoint()}/chat/completions"
        check_address(self.url)
        self.headers = auth_headers()
        self.max_model_len = served_max_model_len() or 4096
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.requests: list[Request] = []
        self.faults: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.start = self.start_epoch = 0.0

    def now(self) -> float:
        return time.monotonic() - self.start

    def over(self) -> bool:
        return self.stop.is_set() or self.now() >= self.seconds

    def pause(self, seconds: float) -> None:
        self.stop.wait(max(0.0, min(seconds, self.seconds - self.now())))

    def send(
        self, session: int, conversation: int, turn: int, messages: list[dict[str, Any]]
    ) -> tuple[dict[str, Any] | None, str | None]:
        body = {"model": MODEL, "messages": messages, "tools": TOOLS, "tool_choice": "auto",
                "max_tokens": MAX_TOKENS, "stream": True, "stream_options": {"include_usage": True}}
        started = self.now()
        reply, error = None, None
        try:
            reply = stream_chat(self.url, body, self.headers, self.deadline)
        except TimeoutError:
            error = f"no answer within the {self.deadline:g} s deadline"
        except RuntimeError as err:
            error = str(err)
        kind = "" if reply is None else "tool_call" if reply["tool_calls"] else "answer"
        record = Request(session, conversation, turn, round(started, 3), round(self.now() - started, 3),
                         reply is not None, None if reply is None or reply["ttft"] is None
                         else round(reply["ttft"], 3), kind,
                         None if reply is None else reply["prompt_tokens"], error)
        with self.lock:
            self.requests.append(record)
        return reply, error

    # --- the faults --------------------------------------------------------
    def faults_run(self) -> None:
        try:
            self.pause(WEDGE_AT * self.seconds - self.now())
            if not self.over():
                self.wedge()
            # Not before the watchdog has ended the wedge: one fault at a time.
            self.pause(FLAP_AT * self.seconds - self.now())
            if self.now() + self.flap_seconds < self.seconds and not self.over():
                self.flap()
            else:
                self.notes.append("the link flap did not fit before the end of the run")
        except LabError as err:
            self.notes.append(f"a fault could not be caused: {err}")

    def wedge(self) -> None:
        pids, _ = faults.stop_rank()
        injected, injected_epoch = self.now(), time.time()
        recovered = None
        try:
            while not self.over() and recovered is None:
                recovered = faults.first_incident(injected_epoch - 1, verdict="wedged", outcome=faults.ENDED)
                if recovered is None:
                    self.pause(2.0)
        finally:
            if recovered is None or recovered["outcome"] != "recovered":
                faults.cont_rank(pids)
                self.notes.append("the watchdog did not recover the wedge: the rank got kill -CONT")
        self.faults.append({"name": "wedge", "planned": round(WEDGE_AT * self.seconds, 1),
                            "injected": round(injected, 1), "ended": round(injected, 1),
                            "injected_epoch": round(injected_epoch, 3),
                            "watchdog_outcome": None if recovered is None else recovered["outcome"]})

    def flap(self) -> None:
        faults.link("down")
        injected, injected_epoch = self.now(), time.time()
        try:
            self.stop.wait(self.flap_seconds)
        finally:
            faults.link("up")
        self.faults.append({"name": "link_flap", "planned": round(FLAP_AT * self.seconds, 1),
                            "injected": round(injected, 1), "ended": round(self.now(), 1),
                            "injected_epoch": round(injected_epoch, 3)})

    def run(self) -> dict[str, Any]:
        self.start, self.start_epoch = time.monotonic(), time.time()
        fault_thread = threading.Thread(target=self.faults_run, name="soak-faults")
        sessions = [Session(n, self) for n in range(1, self.sessions + 1)]
        fault_thread.start()
        for session in sessions:
            session.start()
        try:
            for session in sessions:
                session.join(timeout=max(1.0, self.seconds - self.now()) + self.deadline + 30)
        finally:
            self.stop.set()  # also on Ctrl-C: the fault thread puts the lab back
            fault_thread.join(timeout=120)
        time.sleep(2)  # the watchdog's last record of the run
        records = faults.incidents(self.start_epoch)
        result = summarise(self.requests, self.faults, records)
        result["incident_records"] = [
            {k: r.get(k) for k in ("time", "verdict", "action", "outcome", "detect_seconds",
                                   "recover_seconds", "evidence")} for r in records]
        result["notes"] = self.notes
        return result


def put_back() -> dict[str, Any]:
    """The lab serving after the run: left to the watchdog first; a plain restart of the units
    only when nothing streams within ``PUT_BACK_WAIT`` (its budget spent, or its restart failed)."""
    deadline = time.monotonic() + PUT_BACK_WAIT
    while time.monotonic() < deadline:
        if streams_a_token(timeout=20):
            return {"streams": True, "restarted_by_hand": False}
        time.sleep(5)
    try:
        faults.plain_restart()
    except LabError as err:
        return {"streams": False, "restarted_by_hand": True, "error": str(err)}
    return {"streams": True, "restarted_by_hand": True}


def summary_lines(document: dict[str, Any]) -> str:
    lines = [
        f"soak: {document['minutes']:g} min, {document['sessions']} sessions, deadline"
        f" {document['deadline_s']:g} s: {document['requests']} requests, {document['failed']} failed,"
        f" availability {document['availability']:.2%}, TTFT p50 {document['ttft_p50_s']} s"
        f" p95 {document['ttft_p95_s']} s, {document['tool_calls']} tool calls in"
        f" {document['conversations']} conversations",
    ]
    for name, fault in document["faults"].items():
        lines.append(f"{name} at {fault['injected']:.0f} s: outage {fault['outage_seconds']} s (client side)")
        for phase in ("before", "during", "after"):
            w = fault[phase]
            if w:
                lines.append(f"  {phase:<6} {w['requests']:>4} requests, availability {w['availability']},"
                             f" TTFT p50 {w['ttft_p50_s']} s p95 {w['ttft_p95_s']} s")
    counts = document["incidents"]
    lines.append(f"watchdog: {counts['wedges_detected']} wedges detected, {counts['recoveries']} recoveries,"
                 f" {counts['recoveries_failed']} failed; verdicts {counts['by_verdict']}")
    after = document["after"]
    lines.append(f"after the run: streams {after['streams']}, restarted by hand {after['restarted_by_hand']},"
                 f" watchdog active {after['watchdog_active']}")
    lines += [f"note: {note}" for note in document["notes"]]
    return "\n".join(lines)


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
    parser.add_argument("--flap-seconds", type=float, default=env_number("SOAK_FLAP_S", 20))
    parser.add_argument("--output", type=Path, default=LAB_DIR / "soak.json")
    parser.add_argument("--lock", default=os.environ.get("LOCALINFERENCE_LAB_LOCK") or None,
                        help="hold flock on this file while the soak runs (the shared lab's lock)")
    args = parser.parse_args()
    if not 2 <= args.sessions <= 4:
        parser.error("--sessions (SOAK_SESSIONS) must be 2-4")
    if not 2 <= args.minutes <= 240:
        parser.error("--minutes (SOAK_MINUTES) must be 2-240")
    if not 5 <= args.deadline <= 300 or not 1 <= args.flap_seconds <= 120:
        parser.error("--deadline must be 5-300 s and --flap-seconds 1-120 s")
    if not lab_up():
        print("needs the lab hosts spark-head and spark-worker running (make lab)", file=sys.stderr)
        return 2
    # Imported here: bench imports every part, which the unit tests of the summary need not.
    from benchmarks.bench import lab_lock

    try:
        with lab_lock(args.lock):
            document = soak_run(args)
    except LabError as err:
        print(err, file=sys.stderr)
        return 1
    print(summary_lines(document))
    print(f"written: {args.output} (every request: {args.output.with_name('soak-requests.jsonl')})")
    return 0 if document["after"]["streams"] else 1


def soak_run(args: argparse.Namespace) -> dict[str, Any]:
    """The soak once the lab is watched and serving; writes soak.json and the request log."""
    from benchmarks.bench import LoadSampler, git_commit, machine

    ready = faults.wait_watched_and_serving()
    if ready["budget_left"] is not None and ready["budget_left"] < 1:
        raise LabError("the watchdog's restart budget is spent: the wedge would only page")
    soak = Soak(args.minutes, args.sessions, args.deadline, args.flap_seconds)
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with LoadSampler() as load:
        result = soak.run()
    document = {
        "started_at": started_at,
        "minutes": args.minutes, "sessions": args.sessions, "deadline_s": args.deadline,
        "flap_seconds": args.flap_seconds, "endpoint": soak.url, "max_model_len": soak.max_model_len,
        "machine": machine(), "load_during": load.summary(), "git": git_commit(),
        **result,
    }
    document["after"] = {**put_back(), "watchdog_active": faults.watchdog_active()}
    if document["after"]["restarted_by_hand"]:
        document["notes"].append("nothing streamed after the run: the units were restarted by hand")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    log = args.output.with_name("soak-requests.jsonl")
    log.write_text("".join(json.dumps(asdict(r)) + "\n" for r in soak.requests))
    return document


if __name__ == "__main__":
    sys.exit(main())
