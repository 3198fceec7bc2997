# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The soak's pure summary (benchmarks/_soak_summary.py): percentiles, availability, the windows
around each fault and the counts of the watchdog's incidents; the watchdog part's reading of
the watchdog's Prometheus text and journal (benchmarks/_faults.py, watchdog_recovery.py). No lab."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks._faults import parse_metrics, watchdog_verdict
from benchmarks._soak_client import check_address
from benchmarks._soak_summary import (
    Request,
    goal_lines,
    goals,
    in_a_window,
    incident_counts,
    percentile,
    summarise,
    summary_lines,
    verdict,
)
from benchmarks.watchdog_recovery import boot_milestones, restart_steps
from lab.harness import LabError


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([4.0], 95, 4.0),
        ([3.0, 1.0, 2.0], 50, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([float(v) for v in range(1, 21)], 95, 19.05),
        ([float(v) for v in range(1, 21)], 100, 20.0),
        ([float(v) for v in range(1, 21)], 0, 1.0),
    ],
)
def test_percentile_interpolates_between_closest_ranks(values, q, expected):
    got = percentile(values, q)
    assert got is None if expected is None else got == pytest.approx(expected)


def req(started: float, ok: bool = True, ttft: float | None = 0.5, **extra) -> Request:
    return Request(session=1, conversation=1, turn=1, started=started, seconds=1.0, ok=ok,
                   ttft=ttft if ok else None, kind="answer" if ok else "",
                   error=None if ok else "no answer within the 30 s deadline", **extra)


def test_no_requests_is_no_availability():
    result = summarise([], [], [])
    assert (result["requests"], result["availability"], result["ttft_p50_s"]) == (0, None, None)


def test_windows_around_a_wedge_and_a_flap():
    requests = (
        [req(t, ttft=0.2) for t in range(0, 10)]            # before the wedge (10 s)
        + [req(t, ok=False) for t in (10, 12, 14)]          # hung on the stopped rank
        + [req(t, ttft=1.0) for t in range(16, 30)]         # recovered at 16, until the flap
        + [req(30, ok=False), req(31, ok=False)]            # the link down 30-35
        + [req(36, ttft=3.0), req(37, ttft=0.4)]            # back at 36
    )
    faults = [{"name": "wedge", "injected": 10.0, "ended": 10.0},
              {"name": "link_flap", "injected": 30.0, "ended": 35.0}]
    result = summarise(requests, faults, [])
    assert result["requests"] == 31
    assert (result["answered"], result["failed"]) == (26, 5)
    assert result["availability"] == round(26 / 31, 4)
    wedge, flap = result["faults"]["wedge"], result["faults"]["link_flap"]
    assert (wedge["recovered"], wedge["outage_seconds"]) == (16, 6)
    assert wedge["before"]["requests"] == 10 and wedge["before"]["ttft_p50_s"] == 0.2
    assert wedge["during"] == {"from_s": 10, "to_s": 16, "requests": 3, "answered": 0, "deferred": 0,
                               "failed": 3, "availability": 0.0, "ttft_p50_s": None, "ttft_p95_s": None}
    assert wedge["after"]["requests"] == 14 and wedge["after"]["to_s"] == 30
    # The flap's "before" is the wedge's "after": from the wedge's recovery to the flap.
    assert flap["before"] == wedge["after"]
    assert (flap["recovered"], flap["outage_seconds"]) == (36, 6)
    assert flap["after"]["requests"] == 2 and flap["after"]["to_s"] is None
    assert flap["after"]["ttft_p50_s"] == pytest.approx(1.7)
    assert flap["after"]["ttft_p95_s"] == pytest.approx(2.87)
    assert result["errors"] == {"no answer within the 30 s deadline": 5}
    # Outside [10, 16) and [30, 36): every request answered.
    assert wedge["window"] == [10, 16] and flap["window"] == [30, 36]
    assert result["outside_fault_windows"] == {"requests": 26, "answered": 26, "deferred": 0, "failed": 0,
                                               "availability": 1.0}


def test_a_fault_never_recovered_has_no_after_window():
    result = summarise([req(0), req(5, ok=False)], [{"name": "wedge", "injected": 4.0, "ended": 4.0}], [])
    wedge = result["faults"]["wedge"]
    assert (wedge["recovered"], wedge["outage_seconds"], wedge["after"]) == (None, None, None)
    assert wedge["during"]["to_s"] is None and wedge["during"]["requests"] == 1


def test_incident_counts_count_episodes_not_records():
    records = [
        {"verdict": "wedged", "action": "restart", "outcome": "detected"},
        {"verdict": "wedged", "action": "restart", "outcome": "recovered"},
        {"verdict": "degraded", "action": "hold", "outcome": "detected"},
        {"verdict": "healthy", "action": "none", "outcome": "cleared"},
        {"verdict": "wedged", "action": "restart", "outcome": "detected"},
        {"verdict": "wedged", "action": "restart", "outcome": "failed"},
    ]
    counts = incident_counts(records)
    assert (counts["wedges_detected"], counts["recoveries"], counts["recoveries_failed"]) == (2, 1, 1)
    assert counts["by_verdict"] == {"wedged": 4, "degraded": 1, "healthy": 1}


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:18080/localinference/tiny-deepseek/v1/chat/completions", True),
        ("http://localhost:18080/v1/chat/completions", True),
        ("http://[::1]:18080/v1/chat/completions", True),
        ("http://10.77.0.11:8000/v1/chat/completions", True),
        ("http://10.77.0.99:8000/v1/chat/completions", False),
        ("https://api.example.com/v1/chat/completions", False),
    ],
)
def test_only_loopback_and_lab_addresses(url, allowed):
    if allowed:
        check_address(url)
    else:
        with pytest.raises(LabError):
            check_address(url)


def test_the_watchdogs_prometheus_text():
    samples = parse_metrics(
        "# HELP localinference_watchdog_up 1 while the loop runs\n"
        "localinference_watchdog_up 1\n"
        'localinference_watchdog_verdict{verdict="healthy"} 0\n'
        'localinference_watchdog_verdict{verdict="wedged"} 1\n'
        "localinference_watchdog_first_token_seconds NaN\n"
    )
    assert samples["localinference_watchdog_up"] == 1
    assert watchdog_verdict(samples) == "wedged"


# Recorded on the lab (journalctl -u localinference-watchdog -o short-unix), shortened.
JOURNAL = """\
1796301505.657534 spark-head watchdog[9745]: look: wedged (restart): no token within 5.0 s while /health answers 200 (2 looks)
1796301516.211425 spark-head watchdog[9745]: restart: spark-head: stop: {"node": "spark-head", "ok": true}
1796301520.053090 spark-head watchdog[9745]: restart: spark-worker: stop: {"node": "spark-worker", "ok": true}
1796301520.217847 spark-head watchdog[9745]: restart: spark-head: verify: {"node": "spark-head", "ok": true}
1796301521.917382 spark-head watchdog[9745]: restart: spark-worker: start localinference-vllm.service: {"ok": true}
1796301522.928139 spark-head watchdog[9745]: restart: spark-head: start localinference-vllm.service: {"ok": true}
1796301574.538432 spark-head systemd[1]: Stopping localinference-watchdog.service - localinference watchdog
"""


def test_the_watchdogs_restart_steps_from_its_journal():
    steps = restart_steps(JOURNAL, 1796301505.657)
    assert [(s["node"], s["step"]) for s in steps] == [
        ("spark-head", "stop"), ("spark-worker", "stop"), ("spark-head", "verify"),
        ("spark-worker", "start"), ("spark-head", "start")]
    assert (steps[0]["seconds"], steps[-1]["seconds"]) == (10.55, 17.27)
    assert restart_steps(JOURNAL, 1796301521.0) == [
        {"node": "spark-worker", "step": "start", "seconds": 0.92},
        {"node": "spark-head", "step": "start", "seconds": 1.93}]


BOOT = (Path(__file__).parent / "fixtures" / "vllm-logs" / "lab-boot-journal.txt").read_text()


def test_where_a_boot_went_from_the_servers_journal():
    # the lab's real boot (vLLM 0.32 CPU, TP=2 over two nodes), seconds after the unit's Starting
    assert boot_milestones(BOOT, 1796511819.103) == {
        "unit_started": 0.34, "python_up": 8.23, "engine_process": 20.39, "ranks_joined": 28.58,
        "weights_loaded": 28.75, "engine_ready": 29.38, "api_up": 30.45, "first_token": 60.0}
    # a boot that never got its engine up says so by the keys it lacks
    cut = "\n".join(line for line in BOOT.splitlines() if float(line.split()[0]) < 1796511785)
    assert list(boot_milestones(cut)) == ["unit_started", "python_up", "engine_process"]
    assert boot_milestones("no unit start here") == {}


def deferred(started: float) -> Request:
    return Request(session=1, conversation=1, turn=1, started=started, seconds=0.01, ok=False,
                   error="HTTP 503: the engine is restarting", deferred=True, retry_after=5.0)


def test_told_to_wait_is_deferred_not_failed():
    result = summarise([req(0), deferred(1), deferred(2), req(3, ok=False), req(4)], [], [])
    assert (result["answered"], result["deferred"], result["failed"]) == (2, 2, 1)
    assert result["availability"] == round(2 / 3, 4)
    assert result["deferrals"] == {"HTTP 503: the engine is restarting": 2}
    assert result["errors"] == {"no answer within the 30 s deadline": 1}


def test_only_deferred_requests_measure_no_availability():
    result = summarise([deferred(1), deferred(2)], [], [])
    assert (result["availability"], result["availability_outside_faults"]) == (None, None)


def test_the_window_runs_to_the_watchdogs_recovery_when_a_client_was_answered_earlier():
    # Answered at 10.5 (in flight as the rank stopped), then failures until the watchdog's
    # recovery at 40: those failures belong to the wedge, not to the steady state.
    requests = [req(5), req(10.5), req(12, ok=False), req(30, ok=False), req(41), req(50)]
    fault = {"name": "wedge", "injected": 10.0, "ended": 10.0, "window_end": 40.0}
    result = summarise(requests, [fault], [])
    assert result["faults"]["wedge"]["window"] == [10, 40]
    assert result["outside_fault_windows"]["requests"] == 3
    assert result["availability_outside_faults"] == 1.0


def test_a_fault_never_recovered_keeps_its_window_open_to_the_end():
    result = summarise([req(0), req(5, ok=False), req(9, ok=False)],
                       [{"name": "wedge", "injected": 4.0, "ended": 4.0}], [])
    assert result["faults"]["wedge"]["window"] == [4, None]
    assert result["outside_fault_windows"]["requests"] == 1


def document(**changes):
    base = summarise([req(t) for t in range(0, 40)] + [req(11, ok=False)],
                     [{"name": "wedge", "injected": 10.0, "ended": 10.0, "window_end": 12.0,
                       "watchdog_outcome": "recovered"}], [])
    base.update(planned_faults=["wedge"], after={"streams": True, "restarted_by_hand": False,
                                                 "watchdog_active": True},
                minutes=1, sessions=2, deadline_s=30, notes=[])
    base.update(changes)
    return base


@pytest.mark.parametrize(
    ("changes", "floor", "failures"),
    [
        ({}, 99.0, []),
        ({"planned_faults": ["wedge", "link_flap"]}, 99.0, ["the link_flap was planned and never caused"]),
        ({"availability_outside_faults": 0.985}, 99.0,
         ["availability outside fault windows 98.50% is below the floor 99 %"]),
        ({"availability_outside_faults": 0.985}, 98.0, []),
        ({"availability_outside_faults": None}, 99.0, ["no request was measured outside the fault windows"]),
        ({"after": {"streams": False}}, 99.0, ["nothing streams after the run"]),
    ],
)
def test_verdict(changes, floor, failures):
    assert verdict(document(**changes), floor) == failures


def test_verdict_fails_a_wedge_not_recovered_and_a_run_that_measured_nothing():
    wedge = {"name": "wedge", "injected": 4.0, "ended": 4.0, "watchdog_outcome": None,
             "watchdog_expected": True}
    never = summarise([req(0), req(5, ok=False)], [wedge], [])
    assert verdict({**never, "planned_faults": ["wedge"]}, 99.0) == [
        "the wedge at 4 s was not recovered before the end (no request answered after it)",
        "the watchdog did not recover the wedge (outcome None)",
    ]
    empty = summarise([], [], [])
    assert verdict({**empty, "planned_faults": ["wedge"]}, 99.0) == [
        "no request was answered or failed: nothing was measured",
        "the wedge was planned and never caused",
        "no request was measured outside the fault windows",
    ]


def test_the_report_never_prints_an_availability_it_did_not_measure():
    text = summary_lines({**summarise([deferred(1)], [], []), "minutes": 3, "sessions": 2,
                          "deadline_s": 30, "notes": []})
    assert "availability not measured, outside fault windows not measured" in text
    assert "%" not in text
    measured = summary_lines(document())
    assert "availability 97.56%, outside fault windows 100.00%" in measured


def hour_log() -> tuple[list[Request], list[dict]]:
    """A synthetic run of three faults: a wedge (one spell), a key rotation nobody noticed, an
    upgrade with two boots (two spells, deferred while the rollout held the engine)."""
    requests = (
        [req(t, ttft=0.2) for t in range(0, 20)]                       # before: 20 answered
        + [req(t, ok=False) for t in (20, 25, 30)]                     # the wedge at 20
        + [req(t, ttft=2.0) for t in range(40, 60)]                    # back at 40
        + [req(t, ttft=0.3) for t in range(60, 70)]                    # the rotation at 60: unnoticed
        + [req(t, ttft=0.2) for t in range(70, 100)]                   # quiet
        + [deferred(100), deferred(105), req(110, ttft=4.0)]           # the upgrade at 100: first boot
        + [req(t, ttft=0.5) for t in range(111, 130)]                  # qualified meanwhile
        + [req(130, ok=False), deferred(135), req(142, ttft=3.0)]      # second boot (the revert)
        + [req(t, ttft=0.2) for t in range(150, 170)]                  # after
    )
    faults = [
        {"name": "wedge", "injected": 20.0, "ended": 38.0, "window_end": 38.0, "restarts": 1,
         "watchdog_expected": True, "watchdog_outcome": "recovered"},
        {"name": "key_rotation", "injected": 60.0, "ended": 60.0, "restarts": 0},
        {"name": "upgrade_regress", "injected": 100.0, "ended": 141.0, "restarts": 2},
    ]
    return requests, faults


def test_each_faults_outage_is_its_unanswered_spells():
    requests, faults = hour_log()
    result = summarise(requests, faults, [])
    wedge, rotation, upgrade = (result["faults"][n] for n in ("wedge", "key_rotation", "upgrade_regress"))
    assert (wedge["outage_seconds"], wedge["spells"], wedge["failed"], wedge["deferred"]) == (20, [[20, 40]], 3, 0)
    assert (wedge["recovered"], wedge["recovery_seconds"], wedge["window"]) == (40, 20, [20, 40])
    assert (rotation["outage_seconds"], rotation["spells"], rotation["failed"]) == (0, [], 0)
    assert rotation["window"] == [60, 60] and rotation["recovery_seconds"] == 0
    # Two boots: 100-110 and 130-142; the qualification in between was served.
    assert upgrade["spells"] == [[100, 110], [130, 142]] and upgrade["outage_seconds"] == 22
    assert (upgrade["failed"], upgrade["deferred"], upgrade["window"]) == (1, 3, [100, 142])
    assert upgrade["during"]["ttft_p50_s"] == 0.5


def test_ttft_before_the_first_fault_in_the_windows_and_after_the_last():
    requests, faults = hour_log()
    phases = summarise(requests, faults, [])["phases"]
    assert phases["before"]["requests"] == 20 and phases["before"]["ttft_p95_s"] == 0.2
    during = phases["during"]
    assert (during["requests"], during["answered"], during["failed"], during["deferred"]) == (27, 20, 4, 3)
    assert during["ttft_p50_s"] == 0.5 and during["ttft_p95_s"] == pytest.approx(0.675)
    after = phases["after"]
    assert (after["from_s"], after["requests"], after["ttft_p50_s"]) == (142, 21, 0.2)


def test_no_fault_is_all_before_and_an_open_window_has_no_after():
    assert summarise([req(0), req(1)], [], [])["phases"]["during"] is None
    result = summarise([req(0), req(5, ok=False)], [{"name": "wedge", "injected": 4.0, "ended": 4.0}], [])
    assert result["phases"]["after"] is None
    assert (result["faults"]["wedge"]["outage_seconds"], result["faults"]["wedge"]["spells"]) == (None, [[4, None]])


BENCH = {"watchdog_detect_seconds": 20.0, "plain_restart_seconds": 50.0, "watchdog_recover_ratio": 1.6}


def test_goals_judge_each_outage_against_detection_plus_1_3_plain_restarts():
    requests, faults = hour_log()
    document = summarise(requests, faults, [])
    rows = goals(document, BENCH)
    assert [(r["goal"].split(" <= ")[0], r["value"], r["budget"] if "fault" in r else None, r["met"])
            for r in rows] == [
        ("answered outside fault windows >= 99.5 %", 100.0, None, True),
        ("wedge outage", 20.0, 85.0, True),
        ("key_rotation outage", 0.0, 85.0, True),
        ("upgrade_regress outage", 22.0, 150.0, True),  # two boots by design: 20 + 1.3 x 50 x 2
    ]
    assert rows[3]["goal"] == ("upgrade_regress outage <= 150 s (20 s detection + 1.3 x 50 s plain restart x 2)")
    slow = goals({**document, "faults": {"wedge": {**document["faults"]["wedge"], "outage_seconds": 90.0}}}, BENCH)
    assert slow[1]["met"] is False
    assert goal_lines(slow)[1] == "GOAL wedge outage <= 85 s (20 s detection + 1.3 x 50 s plain restart): 90: NOT met"


def test_goals_not_judged_without_make_bench_and_availability_below_the_goal():
    requests, faults = hour_log()
    document = {**summarise(requests, faults, []), "availability_outside_faults": 0.994}
    rows = goals(document, None)
    assert rows[0]["met"] is False and all(r["met"] is None for r in rows[1:])
    lines = goal_lines(rows)
    assert lines[0] == "GOAL answered outside fault windows >= 99.5 %: 99.4: NOT met"
    assert lines[1] == ("GOAL wedge outage <= the watchdog's detection + 1.3 x a plain restart: 20:"
                        " not judged (no watchdog part in .lab/bench.json: make bench)")
    assert goals(document, {"plain_restart_seconds": float("nan"), "watchdog_detect_seconds": 20})[1]["met"] is None


def test_verdict_fails_a_fault_that_went_wrong_or_the_watchdog_did_not_end():
    requests, faults = hour_log()
    faults[1]["error"] = "ingress.yml -e ingress_rotate_key=true failed (rc 2)"
    faults[0]["watchdog_outcome"] = "budget-spent"
    document = {**summarise(requests, faults, []), "planned_faults": [f["name"] for f in faults]}
    assert verdict(document, 99.0) == [
        "the watchdog did not recover the wedge (outcome budget-spent)",
        "the key_rotation went wrong: ingress.yml -e ingress_rotate_key=true failed (rc 2)",
    ]


def test_the_report_shows_each_fault_the_phases_the_incidents_and_the_goals():
    requests, faults = hour_log()
    document = {**summarise(requests, faults, []), "minutes": 60, "sessions": 3, "deadline_s": 30,
                "notes": [], "incident_records": [{"time": "12:00:01", "verdict": "wedged", "action": "restart",
                                                   "outcome": "recovered", "evidence": "no token"}]}
    document["faults"]["upgrade_regress"]["put_back"] = "the inventory's recipe was rolled out again"
    document["goals"] = goals(document, BENCH)
    text = summary_lines(document)
    assert "upgrade_regress at 100 s: outage 22.0 s unanswered, 1 failed, 3 deferred;" in text
    assert "  put back: the inventory's recipe was rolled out again" in text
    assert "before the first fault: 20 requests, 0 failed, 0 deferred, availability 100.00%" in text
    assert "  incident 12:00:01: wedged (restart, recovered): no token" in text
    assert "GOAL wedge outage <= 85 s" in text


@pytest.mark.parametrize(
    ("started", "seconds", "inside"),
    [
        (618.6, 5.1, True),   # begun 4 s before the kill, cut by it (the hour's three "outside" failures)
        (615.0, 2.0, False),  # done before the fault: the steady state
        (622.5, 1.0, True),   # begun at the cause
        (758.7, 1.0, False),  # begun when the window closed
    ],
)
def test_a_stream_in_flight_when_its_fault_was_caused_is_the_faults(started, seconds, inside):
    request = Request(session=1, conversation=1, turn=1, started=started, seconds=seconds, ok=False,
                      error="the stream ended without a finish_reason")
    assert in_a_window(request, [(622.5, 758.7)]) is inside
