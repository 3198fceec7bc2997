# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The qualification report written into ``dest`` (module_utils/qualify/_report_write.py).

Check mode builds the verdict and writes nothing; a real run writes report.json and report.md
(plots only when asked) and removes the plots an earlier run left; the gate's numbers are
refused before anything is built when they would hold nothing (NaN). The verdict is
test_report.py's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._report_write import run
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit

RUN = json.loads((Path(__file__).resolve().parents[3] / "fixtures" / "qualify" / "checks-scripted-cpu.json").read_text())


def params(dest: Path, **given) -> dict:
    base = {"checks": RUN["checks"], "dest": str(dest), "model": RUN["model"], "endpoint": "http://x/v1",
            "recipe_hash": None, "expected": {}, "metrics_before": None, "metrics_after": None, "log_text": None,
            "nodes": {}, "reserve_gib": 0, "promoted": None, "tolerance": 0.1, "plan": None, "plots": False}
    return {**base, **given}


def test_check_mode_judges_and_writes_nothing(tmp_path):
    out = run(FakeModule(params(tmp_path / "report"), check_mode=True))
    assert out["changed"] is False and out["files"] == [] and out["verdict"] == "promote"
    assert not (tmp_path / "report").exists()


def test_a_run_writes_the_report_and_drops_an_earlier_runs_plots(tmp_path):
    dest = tmp_path / "report"
    dest.mkdir()
    (dest / "ttft.png").write_bytes(b"old")
    out = run(FakeModule(params(dest)))
    assert out["changed"] is True
    assert out["files"] == [str(dest / "report.json"), str(dest / "report.md")]
    assert json.loads((dest / "report.json").read_text())["verdict"] == out["verdict"]
    assert sorted(p.name for p in dest.iterdir()) == ["report.json", "report.md"]


@pytest.mark.parametrize(
    ("given", "message"),
    [({"reserve_gib": math.nan}, "reserve_gib"), ({"tolerance": 1.0}, "tolerance must be in [0, 1), got 1.0")],
    ids=["NaN reserve", "tolerance of 1"],
)
def test_a_gate_that_would_hold_nothing_is_refused(tmp_path, given, message):
    with pytest.raises(ModuleExit) as caught:
        run(FakeModule(params(tmp_path, **given)))
    assert message in caught.value.result["msg"]
