# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The soak's result from its requests and faults, and its verdict; pure, no lab, no I/O.

A request is ``answered``, ``deferred`` (the endpoint said 503 or 429 with a Retry-After: told
to wait, not lost) or ``failed``. Availability is answered / (answered + failed) and is ``None``,
never a number, when no request was answered or failed: a soak that measured nothing has no
availability. A fault's window runs from its injection to the later of its end as the soak's
own schedule knows it (``window_end``: the link up, the watchdog's recovery) and the clients'
recovery (the first answered request begun after the fault ended), and holds the requests
still in flight when it was caused; availability outside fault windows is the steady state the
floor is about.

A fault's outage is the time its clients went unanswered: each spell from a request not
answered (failed or deferred; from the injection when nothing was answered since) to the start
of the next answered one, summed over the spells that begin in its window. An upgrade has one
spell per boot; a link flap whose requests waited and were answered has none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


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
    deferred: bool = False
    retry_after: float | None = None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _shown(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def counts(requests: Sequence[Request]) -> dict[str, Any]:
    """How many requests, answered, deferred and failed, and the availability (None if none measured)."""
    answered = sum(r.ok for r in requests)
    deferred = sum(r.deferred and not r.ok for r in requests)
    failed = len(requests) - answered - deferred
    measured = answered + failed
    return {"requests": len(requests), "answered": answered, "deferred": deferred, "failed": failed,
            "availability": round(answered / measured, 4) if measured else None}


def window(requests: Sequence[Request], start: float, end: float | None) -> dict[str, Any]:
    """Requests started in ``[start, end)``: the counts and TTFT p50/p95."""
    inside = [r for r in requests if r.started >= start and (end is None or r.started < end)]
    ttfts = [r.ttft for r in inside if r.ttft is not None]
    return {
        "from_s": round(start, 1),
        "to_s": None if end is None else round(end, 1),
        **counts(inside),
        "ttft_p50_s": _shown(percentile(ttfts, 50)),
        "ttft_p95_s": _shown(percentile(ttfts, 95)),
    }


def recovered_at(requests: Sequence[Request], ended: float) -> float | None:
    """The start of the first answered request begun at or after the fault ended."""
    starts = [r.started for r in requests if r.ok and r.started >= ended]
    return min(starts) if starts else None


def unanswered_spells(requests: Sequence[Request], injected: float,
                      end: float | None) -> list[tuple[float, float | None]]:
    """The spells without an answer that begin in ``[injected, end)``: ``(start, answered again)``,
    the last one open (None) when no answer came after it."""
    spells: list[tuple[float, float | None]] = []
    start, answered = None, False
    for r in sorted((r for r in requests if r.started >= injected), key=lambda r: r.started):
        if r.ok:
            if start is not None:
                spells.append((start, r.started))
                start = None
            answered = True
        elif start is None:
            if end is not None and r.started >= end:
                break
            start = r.started if answered else injected
    if start is not None:
        spells.append((start, None))
    return spells


def outage(spells: Sequence[tuple[float, float | None]]) -> float | None:
    """The seconds of the spells; None while one is still open."""
    if any(end is None for _, end in spells):
        return None
    return round(sum(end - start for start, end in spells if end is not None), 1)


def fault_window(fault: dict[str, Any], recovered: float | None) -> tuple[float, float | None]:
    """``[injected, end)`` of a fault; open-ended (None) when the clients never recovered."""
    if recovered is None:
        return fault["injected"], None
    return fault["injected"], max(fault.get("window_end") or fault["ended"], fault["ended"], recovered)


def in_a_window(request: Request, windows: Sequence[tuple[float, float | None]]) -> bool:
    """Begun in a window, or still in flight when its fault was caused: a stream the fault cut
    is the fault's, not the steady state's (the hour's 3 failures "outside" were such streams)."""
    return any(
        (request.started >= start or request.started + request.seconds > start)
        and (end is None or request.started < end)
        for start, end in windows
    )


def outside(requests: Sequence[Request], windows: Sequence[tuple[float, float | None]]) -> list[Request]:
    return [r for r in requests if not in_a_window(r, windows)]


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


def phases(requests: Sequence[Request], windows: Sequence[tuple[float, float | None]]) -> dict[str, Any]:
    """The whole run in three: before the first fault, inside any fault window, after the last
    window (None when there was no fault, or the last window never closed)."""
    if not windows:
        return {"before": window(requests, 0.0, None), "during": None, "after": None}
    inside = [r for r in requests if in_a_window(r, windows)]
    ttfts = [r.ttft for r in inside if r.ttft is not None]
    last = windows[-1][1]
    return {
        "before": window(requests, 0.0, windows[0][0]),
        "during": {**counts(inside), "ttft_p50_s": _shown(percentile(ttfts, 50)),
                   "ttft_p95_s": _shown(percentile(ttfts, 95))},
        "after": None if last is None else window(requests, last, None),
    }


def summarise(
    requests: Sequence[Request],
    fault_times: Sequence[dict[str, Any]],
    records: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    """The soak's result from its requests, its faults (``name``, ``injected``, ``ended``, optional
    ``window_end``, in seconds from the start, in order) and the watchdog's incident records.

    Around each fault: ``before`` from the previous fault's recovery (or the start) to the
    injection, ``during`` from the injection to the recovery (the first answered request begun
    after the fault ended), ``after`` from the recovery to the next injection (or the end).
    """
    ttfts = [r.ttft for r in requests if r.ttft is not None]
    result: dict[str, Any] = {
        **counts(requests),
        "tool_calls": sum(r.kind == "tool_call" for r in requests),
        "conversations": len({(r.session, r.conversation) for r in requests}),
        "ttft_p50_s": _shown(percentile(ttfts, 50)),
        "ttft_p95_s": _shown(percentile(ttfts, 95)),
        # by kind: what a stream began with stays in soak-requests.jsonl
        "errors": dict(Counter(r.error.split(" (it began:")[0] for r in requests if r.error and not r.deferred)),
        "deferrals": dict(Counter(r.error for r in requests if r.error and r.deferred)),
        "faults": {},
    }
    previous = 0.0
    windows = []
    for index, fault in enumerate(fault_times):
        later = fault_times[index + 1]["injected"] if index + 1 < len(fault_times) else None
        back = recovered_at(requests, fault["ended"])
        windows.append(fault_window(fault, back))
        spells = unanswered_spells(requests, fault["injected"], windows[-1][1])
        in_window = window(requests, *windows[-1])
        result["faults"][fault["name"]] = {
            **{k: v for k, v in fault.items() if k not in ("name",)},
            "recovered": None if back is None else round(back, 1),
            "recovery_seconds": None if back is None else round(back - fault["injected"], 1),
            "outage_seconds": None if back is None else outage(spells),
            "spells": [[round(a, 1), None if b is None else round(b, 1)] for a, b in spells],
            "failed": in_window["failed"], "deferred": in_window["deferred"],
            "window": [round(windows[-1][0], 1), None if windows[-1][1] is None else round(windows[-1][1], 1)],
            "before": window(requests, previous, fault["injected"]),
            "during": window(requests, fault["injected"], back),
            "after": None if back is None else window(requests, back, later),
        }
        previous = back if back is not None else fault["injected"]
    result["phases"] = phases(requests, windows)
    steady = counts(outside(requests, windows))
    result["outside_fault_windows"] = steady
    result["availability_outside_faults"] = steady["availability"]
    result["incidents"] = incident_counts(records)
    return result


def verdict(document: dict[str, Any], floor_percent: float) -> list[str]:
    """Why the soak failed, one sentence each; empty when it passed.

    It fails when nothing was measured, a planned fault was not caused, went wrong (``error``:
    it could not be caused, or the product did not answer it as it must) or was not recovered
    (by the clients, and by the watchdog where it is expected to end it), availability outside
    fault windows is below ``floor_percent`` or unmeasured, or nothing streams after the run."""
    failures = []
    if document.get("availability") is None:
        failures.append("no request was answered or failed: nothing was measured")
    caused = document.get("faults") or {}
    for name in document.get("planned_faults") or ():
        if name not in caused:
            failures.append(f"the {name} was planned and never caused")
    for name, fault in caused.items():
        if fault.get("recovered") is None:
            failures.append(f"the {name} at {fault['injected']:g} s was not recovered before the end"
                            " (no request answered after it)")
        if fault.get("watchdog_expected") and fault.get("watchdog_outcome") != "recovered":
            failures.append(f"the watchdog did not recover the {name} (outcome {fault.get('watchdog_outcome')})")
        if fault.get("error"):
            failures.append(f"the {name} went wrong: {fault['error']}")
    steady = document.get("availability_outside_faults")
    if steady is None:
        failures.append("no request was measured outside the fault windows")
    elif steady * 100 < floor_percent:
        failures.append(f"availability outside fault windows {steady:.2%} is below the floor {floor_percent:g} %")
    after = document.get("after") or {}
    if after and not after.get("streams"):
        failures.append("nothing streams after the run")
    return failures


AVAILABILITY_GOAL_PERCENT = 99.5
RESTART_FACTOR = 1.3


def outage_budget(bench_watchdog: dict[str, Any] | None, restarts: int) -> dict[str, Any] | None:
    """The watchdog's detection + 1.3 x a plain restart (one for each engine restart the fault
    costs by design, at least one), from make bench's watchdog part; None when it has none."""
    part = bench_watchdog or {}
    detect, plain = part.get("watchdog_detect_seconds"), part.get("plain_restart_seconds")
    if not all(isinstance(v, (int, float)) and 0 <= v < float("inf") for v in (detect, plain)):
        return None
    count = max(1, restarts)
    return {"seconds": round(detect + RESTART_FACTOR * plain * count, 1),
            "how": f"{detect:g} s detection + {RESTART_FACTOR:g} x {plain:g} s plain restart"
                   + (f" x {count}" if count > 1 else "")}


def goals(document: dict[str, Any], bench_watchdog: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's goals, each ``{goal, value, met}``; ``met`` None when it cannot be judged."""
    steady = document.get("availability_outside_faults")
    rows = [{"goal": f"answered outside fault windows >= {AVAILABILITY_GOAL_PERCENT:g} %",
             "value": None if steady is None else round(steady * 100, 2),
             "met": None if steady is None else steady * 100 >= AVAILABILITY_GOAL_PERCENT}]
    for name, fault in (document.get("faults") or {}).items():
        budget = outage_budget(bench_watchdog, int(fault.get("restarts") or 0))
        seconds = fault.get("outage_seconds")
        rows.append({
            "goal": f"{name} outage <= " + (f"{budget['seconds']:g} s ({budget['how']})" if budget else
                                            "the watchdog's detection + 1.3 x a plain restart"),
            "fault": name, "value": seconds, "budget": None if budget is None else budget["seconds"],
            "met": None if budget is None else seconds is not None and seconds <= budget["seconds"]})
    return rows


def goal_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        value = "not measured" if row["value"] is None else f"{row['value']:g}"
        if row["met"] is None:
            why = ("not judged (no watchdog part in .lab/bench.json: make bench)" if "fault" in row
                   else "not judged (nothing measured)")
        else:
            why = "met" if row["met"] else "NOT met"
        lines.append(f"GOAL {row['goal']}: {value}: {why}")
    return lines


def _percent(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.2%}"


def summary_lines(document: dict[str, Any]) -> str:
    """The soak's report; an availability appears only where requests were measured."""
    lines = [
        f"soak: {document['minutes']:g} min, {document['sessions']} sessions, deadline"
        f" {document['deadline_s']:g} s: {document['requests']} requests, {document['answered']} answered,"
        f" {document['failed']} failed, {document['deferred']} deferred (told to wait),"
        f" availability {_percent(document['availability'])}, outside fault windows"
        f" {_percent(document['availability_outside_faults'])}; TTFT p50 {document['ttft_p50_s']} s"
        f" p95 {document['ttft_p95_s']} s, {document['tool_calls']} tool calls in"
        f" {document['conversations']} conversations",
    ]
    for phase, title in (("before", "before the first fault"), ("during", "in fault windows"),
                         ("after", "after the last fault")):
        w = (document.get("phases") or {}).get(phase)
        if w:
            lines.append(f"{title}: {w['requests']} requests, {w['failed']} failed, {w['deferred']} deferred,"
                         f" availability {_percent(w['availability'])}, TTFT p50 {w['ttft_p50_s']} s"
                         f" p95 {w['ttft_p95_s']} s")
    for name, fault in document["faults"].items():
        lines.append(f"{name} at {fault['injected']:.0f} s: outage {fault['outage_seconds']} s unanswered,"
                     f" {fault['failed']} failed, {fault['deferred']} deferred; clients recovered after"
                     f" {fault['recovery_seconds']} s, window {fault['window'][0]}-{fault['window'][1]} s")
        if fault.get("put_back"):
            lines.append(f"  put back: {fault['put_back']}")
        for phase in ("before", "during", "after"):
            w = fault[phase]
            if w:
                lines.append(f"  {phase:<6} {w['requests']:>4} requests, {w['deferred']} deferred,"
                             f" availability {_percent(w['availability'])},"
                             f" TTFT p50 {w['ttft_p50_s']} s p95 {w['ttft_p95_s']} s")
    counted = document["incidents"]
    lines.append(f"watchdog: {counted['wedges_detected']} wedges detected, {counted['recoveries']} recoveries,"
                 f" {counted['recoveries_failed']} failed; verdicts {counted['by_verdict']}")
    for record in document.get("incident_records") or ():
        lines.append(f"  incident {record.get('time')}: {record.get('verdict')} ({record.get('action')},"
                     f" {record.get('outcome')}): {str(record.get('evidence') or '')[:160]}")
    after = document.get("after")
    if after:
        lines.append(f"after the run: streams {after['streams']}, restarted by hand {after['restarted_by_hand']},"
                     f" watchdog active {after['watchdog_active']}")
    lines += [f"note: {note}" for note in document.get("notes") or ()]
    lines += goal_lines(document.get("goals") or ())
    return "\n".join(lines)
