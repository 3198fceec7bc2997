# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The qualification report the converge wrote (site.yml's last stage, qualify_enabled in the lab).

Read-only: the report in .lab/qualify/ on the controller and the verdict saved
on the head. Every check the scripted model can honestly pass passes; JSON of
its own is not meaningful for it. head_of_line passes since the lab's recipe
ships what `make tune` found (a cap on long prefills: a short request no longer
waits seconds behind one), so a fresh lab's verdict is promote.
"""

from __future__ import annotations

import json

import pytest

from lab.harness import HEAD, LAB_DIR, read_json

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

REPORT = LAB_DIR / "qualify" / "report.json"
EXPECTED = {
    "smoke": "pass",
    "structured_json": "not_meaningful",
    "tools": "pass",
    "tools_stream": "pass",
    "tool_continuation": "pass",
    "responses_api": "pass",
    "anthropic_messages": "pass",
    "reasoning_split": "pass",
    "reasoning_budget": "pass",
    "truncated_tool_call": "pass",
    "concurrency": "pass",
    "context_ladder": "pass",
    "shared_prefix": "pass",
    "head_of_line": "pass",
}


@pytest.fixture(scope="module")
def report() -> dict:
    assert REPORT.is_file(), f"no qualification report at {REPORT}: did the converge run the qualify stage?"
    return json.loads(REPORT.read_text())


def test_every_check_has_the_honest_outcome(report):
    outcomes = {check["name"]: check["status"] for check in report["checks"]}
    assert outcomes == EXPECTED, json.dumps(report["checks"], indent=1)[:4000]
    for check in report["checks"]:
        assert check["status"] == "pass" or check["why"], check


def test_the_verdict_is_promote_and_is_saved_on_the_head(report):
    assert report["verdict"] == "promote", report["reasons"]
    assert report["reasons"] == []
    saved = read_json(HEAD, "/etc/localinference/qualify.json")["result"]
    assert saved["verdict"] == report["verdict"]


def test_the_report_has_its_figures_and_plots(report):
    assert report["figures"]["reasoning_field"] == "reasoning"
    assert report["figures"]["concurrent_requests"] >= 2
    for plot in report["plots"]:
        assert (REPORT.parent / plot).stat().st_size > 1000, plot
    assert (REPORT.parent / "report.md").is_file()
