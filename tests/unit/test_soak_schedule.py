# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which faults a soak causes and when (benchmarks/_soak_schedule.py): the 3-minute smoke is the
wedge alone, the hour all seven spaced evenly; SOAK_FAULTS picks and is refused with the reason.
No lab."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks._soak_schedule import FAULTS, describe, schedule, select, watchdog_restarts

ROOT = Path(__file__).resolve().parents[2]
ALL = ["wedge", "head_kill", "link_flap", "key_rotation", "upgrade_regress", "upgrade_promote", "caddy_stop"]


def names(specs) -> list[str]:
    return [spec.name for spec in specs]


def minutes_at(minutes: float, faults: str = "") -> list[tuple[str, float]]:
    return [(p.name, round(p.at / 60, 2)) for p in schedule(select(faults, minutes), minutes)]


@pytest.mark.parametrize(
    ("minutes", "flap", "expected"),
    [
        (2, 20, ["wedge"]),
        (3, 20, ["wedge"]),  # make soak-smoke
        (3, 0, ["wedge"]),
        (10, 20, ["wedge", "head_kill", "link_flap"]),
        (10, 0, ["wedge", "head_kill", "caddy_stop"]),
        (20, 20, ["wedge", "head_kill", "link_flap", "key_rotation", "caddy_stop"]),
        (45, 20, ALL),
        (60, 20, ALL),  # the hour
    ],
)
def test_the_faults_that_fit_the_minutes(minutes, flap, expected):
    assert names(select("", minutes, flap)) == expected


def test_the_smoke_is_one_wedge_after_its_quiet_time():
    assert minutes_at(3) == [("wedge", 0.75)]


def test_the_hour_spaces_all_seven_with_the_same_quiet_time_between():
    plan = schedule(select("", 60), 60)
    assert minutes_at(60) == [("wedge", 4.44), ("head_kill", 10.38), ("link_flap", 17.31),
                              ("key_rotation", 23.25), ("upgrade_regress", 29.19),
                              ("upgrade_promote", 41.62), ("caddy_stop", 54.06)]
    quiet = [plan[0].at, *(later.at - (earlier.at + earlier.spec.needs_minutes * 60)
                           for earlier, later in itertools.pairwise(plan)),
             3600 - (plan[-1].at + plan[-1].spec.needs_minutes * 60)]
    assert max(quiet) - min(quiet) < 0.5  # rounding only
    assert min(quiet) > 4 * 60
    assert watchdog_restarts([p.spec for p in plan]) == 3  # wedge, head_kill, caddy_stop


def test_soak_faults_picks_in_the_hours_order():
    assert names(select("caddy_stop, wedge", 10)) == ["wedge", "caddy_stop"]
    assert minutes_at(10, "caddy_stop,wedge") == [("wedge", 2.33), ("caddy_stop", 6.17)]
    assert select("none", 60) == []
    assert select(" NONE ", 60) == []
    assert schedule([], 60) == []


@pytest.mark.parametrize(
    ("faults", "minutes", "flap", "message"),
    [
        ("wedge,oom", 60, 20, "SOAK_FAULTS names 'oom': the faults are wedge, head_kill, link_flap,"
                              " key_rotation, upgrade_regress, upgrade_promote, caddy_stop (or none)"),
        ("wedge,wedge", 60, 20, "SOAK_FAULTS names wedge more than once"),
        ("link_flap", 60, 0, "SOAK_FAULTS names link_flap but SOAK_FLAP_S is 0 (no flap)"),
        ("upgrade_regress,upgrade_promote", 10, 20,
         "SOAK_FAULTS needs 16 min (upgrade_regress, upgrade_promote); SOAK_MINUTES is 10"),
    ],
)
def test_soak_faults_is_refused_with_the_reason(faults, minutes, flap, message):
    with pytest.raises(ValueError) as refused:
        select(faults, minutes, flap)
    assert str(refused.value) == message


def test_every_fault_says_how_it_is_caused_and_the_schedule_reads():
    assert names(FAULTS) == ALL
    text = describe(schedule(select("", 3), 3))
    assert text.split()[:3] == ["0.8", "min", "wedge"] and "kill -STOP" in text
    assert describe([]) == "no fault: steady traffic only"


def test_the_soak_refuses_an_unknown_fault_before_it_touches_anything(tmp_path):
    env = {**os.environ, "SOAK_FAULTS": "wedge,power_cut", "LOCALINFERENCE_LAB_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "SOAK_FAULTS names 'power_cut': the faults are wedge," in done.stderr


class FakeFault:
    """A fault whose settle fails: the soak must still put it back and record the error."""

    def __init__(self, spec, options) -> None:
        self.spec, self.caused, self.error, self.put = spec, False, None, []

    def cause(self) -> None:
        self.caused = True

    def settle(self, wait):
        from lab.harness import LabError

        raise LabError("podman exec spark-head failed")

    def put_back(self, settled):
        self.put.append(settled)
        return "put back by the test"


def test_a_fault_that_fails_midway_is_put_back_and_fails_the_run(monkeypatch):
    from benchmarks import soak as soak_module
    from benchmarks._soak_client import Target
    from benchmarks._soak_summary import summarise, verdict

    made: list[FakeFault] = []
    monkeypatch.setattr(soak_module, "make", lambda spec, options: made.append(FakeFault(spec, options)) or made[-1])
    monkeypatch.setenv("SOAK_RECOVERY_GRACE_S", "0")
    plan = schedule(select("caddy_stop", 3), 3)
    run = soak_module.Soak(Target("http://127.0.0.1:9/v1", None, None), minutes=0.01, sessions=2,
                           deadline=5, plan=plan)
    run.start = time.monotonic()
    run.cause(plan[0])
    assert made[0].put == [{}]
    [fault] = run.faults
    assert (fault["name"], fault["put_back"], fault["watchdog_expected"]) == ("caddy_stop", "put back by the test", True)
    assert fault["error"] == "caused, then podman exec spark-head failed"
    document = {**summarise(run.requests, run.faults, []), "planned_faults": run.planned}
    assert "the caddy_stop went wrong: caused, then podman exec spark-head failed" in verdict(document, 99.0)
