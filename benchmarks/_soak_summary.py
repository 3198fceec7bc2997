# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The soak's result from its requests and faults, and its verdict; pure, no lab, no I/O.

A request is ``answered``, ``deferred`` (the endpoint said 503 or 429 with a Retry-After: told
to wait, not lost) or ``failed``. Availability is answered / (answered + failed) and is ``None``,
never a number, when no request was answered or failed: a soak that measured nothing has no
availability. A fault's window runs from its injection to the later of its end as the soak's
own schedule knows it (``window_end``: the link up, the watchdog's recovery) and the clients'
recovery (the first answered request begun after the fault ended); availability outside fault
windows is the steady state the floor is about.
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


def fault_window(fault: dict[str, Any], recovered: float | None) -> tuple[float, float | None]:
    """``[injected, end)`` of a fault; open-ended (None) when the clients never recovered."""
    if recovered is None:
        return fault["injected"], None
    return fault["injected"], max(fault.get("window_end") or fault["ended"], fault["ended"], recovered)


def outside(requests: Sequence[Request], windows: Sequence[tuple[float, float | None]]) -> list[Request]:
    return [r for r in requests
            if not any(r.started >= start and (end is None or r.started < end) for start, end in windows)]


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
        "errors": dict(Counter(r.error for r in requests if r.error and not r.deferred)),
        "deferrals": dict(Counter(r.error for r in requests if r.error and r.deferred)),
        "faults": {},
    }
    previous = 0.0
    windows = []
    for index, fault in enumerate(fault_times):
        later = fault_times[index + 1]["injected"] if index + 1 < len(fault_times) else None
        back = recovered_at(requests, fault["ended"])
        windows.append(fault_window(fault, back))
        result["faults"][fault["name"]] = {
            **{k: v for k, v in fault.items() if k not in ("name",)},
            "recovered": None if back is None else round(back, 1),
            "outage_seconds": None if back is None else round(back - fault["injected"], 1),
            "window": [round(windows[-1][0], 1), None if windows[-1][1] is None else round(windows[-1][1], 1)],
            "before": window(requests, previous, fault["injected"]),
            "during": window(requests, fault["injected"], back),
            "after": None if back is None else window(requests, back, later),
        }
        previous = back if back is not None else fault["injected"]
    steady = counts(outside(requests, windows))
    result["outside_fault_windows"] = steady
    result["availability_outside_faults"] = steady["availability"]
    result["incidents"] = incident_counts(records)
    return result


def verdict(document: dict[str, Any], floor_percent: float) -> list[str]:
    """Why the soak failed, one sentence each; empty when it passed.

    It fails when nothing was measured, a planned fault was not caused or not recovered (by
    the clients, and for the wedge by the watchdog), availability outside fault windows is
    below ``floor_percent`` or unmeasured, or nothing streamed after the run."""
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
        if name == "wedge" and fault.get("watchdog_outcome") != "recovered":
            failures.append(f"the watchdog did not recover the wedge (outcome {fault.get('watchdog_outcome')})")
    steady = document.get("availability_outside_faults")
    if steady is None:
        failures.append("no request was measured outside the fault windows")
    elif steady * 100 < floor_percent:
        failures.append(f"availability outside fault windows {steady:.2%} is below the floor {floor_percent:g} %")
    after = document.get("after") or {}
    if after and not after.get("streams"):
        failures.append("nothing streams after the run")
    return failures


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
    for name, fault in document["faults"].items():
        lines.append(f"{name} at {fault['injected']:.0f} s: outage {fault['outage_seconds']} s (client side),"
                     f" window {fault['window'][0]}-{fault['window'][1]} s")
        for phase in ("before", "during", "after"):
            w = fault[phase]
            if w:
                lines.append(f"  {phase:<6} {w['requests']:>4} requests, {w['deferred']} deferred,"
                             f" availability {_percent(w['availability'])},"
                             f" TTFT p50 {w['ttft_p50_s']} s p95 {w['ttft_p95_s']} s")
    counted = document["incidents"]
    lines.append(f"watchdog: {counted['wedges_detected']} wedges detected, {counted['recoveries']} recoveries,"
                 f" {counted['recoveries_failed']} failed; verdicts {counted['by_verdict']}")
    after = document.get("after")
    if after:
        lines.append(f"after the run: streams {after['streams']}, restarted by hand {after['restarted_by_hand']},"
                     f" watchdog active {after['watchdog_active']}")
    lines += [f"note: {note}" for note in document.get("notes") or ()]
    return "\n".join(lines)
