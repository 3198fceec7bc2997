# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel lines as the watchdog classifies them: every published form a case
(``tests/unit/fixtures/watchdog/kernel-lines.yaml``), and runs of real records
(``kmsg-published.txt``) folded into one event per kill and per burst."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._kernel import (
    MAX_EVENTS,
    RESTART_FIXES,
    XIDS,
    classify_kernel,
    parse_kmsg,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "watchdog"
CASES = yaml.safe_load((FIXTURES / "kernel-lines.yaml").read_text())["cases"]
KMSG = [line.encode() for line in (FIXTURES / "kmsg-published.txt").read_text().splitlines()]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}:{c['line'][:48]}" for i, c in enumerate(CASES)])
def test_every_published_line_is_classified(case: dict[str, Any]) -> None:
    assert case["source"].startswith("https://")
    found = classify_kernel(case["line"])
    if case["expect"] is None:
        assert found is None
        return
    assert found is not None
    assert {key: found.get(key) for key in case["expect"]} == case["expect"]


def test_every_xid_carries_its_catalog_meaning() -> None:
    for case in CASES:
        found = classify_kernel(case["line"]) or {}
        if found.get("kind") == "xid" and found["xid"] in XIDS:
            assert found["meaning"] == XIDS[found["xid"]][1] and found["catalog_action"]


@pytest.mark.parametrize(("xid", "page"), [(13, False), (31, False), (43, False), (45, False), (48, True),
                                           (61, True), (62, True), (63, False), (64, True), (74, True),
                                           (79, True), (92, False), (94, False), (95, True), (109, True),
                                           (119, True), (120, True)])
def test_a_restart_fixes_only_what_the_catalog_says_an_application_restart_fixes(xid: int, page: bool) -> None:
    assert (XIDS[xid][2] not in RESTART_FIXES) is page


def test_xid_154_pages_unless_the_recovery_is_none() -> None:
    published = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    assert classify_kernel(published)["page"] is True
    # The same form back to "None" (no such line was found published; the field's values are
    # NVML's nvmlDeviceGpuRecoveryAction_t): nothing left to do.
    assert classify_kernel(published.replace("from 0x0 (None) to 0x1 (GPU Reset Required)",
                                             "from 0x1 (GPU Reset Required) to 0x0 (None)"))["page"] is False


def test_published_runs_fold_into_one_event_per_kill_and_per_burst() -> None:
    events, last = parse_kmsg(KMSG, 2000)
    assert last == 2304
    seen = [(e["seq"], e["kind"], e.get("xid"), e.get("pid"), e.get("process"), e.get("invoked_by"),
             e.get("count"), e.get("page")) for e in events]
    assert seen == [
        (2001, "aer", None, None, None, None, None, False),
        (2002, "aer", None, None, None, None, None, False),
        (2003, "aer", None, None, None, None, None, True),
        (2004, "aer", None, None, None, None, None, True),
        (2008, "aer", None, None, None, None, None, True),
        (2011, "xid", 79, None, None, None, None, True),
        (2101, "gpu_memory", None, None, None, None, 4, False),
        (2106, "oom", None, None, None, "TIMER", None, None),
        (2201, "oom", None, 16014, "cicc", None, None, None),
        (2203, "oom", None, None, None, "VLLM::EngineCor", None, None),
        (2301, "gpu_memory", None, None, None, None, 1, False),
        (2302, "oom", None, None, None, "VLLM::Worker_TP", None, None),
    ]
    assert all("part" not in e for e in events)
    assert events[8]["line"].startswith("Out of memory: Killed process 16014 (cicc)")


def test_a_kill_with_all_its_lines_keeps_the_victim_and_who_invoked_it() -> None:
    # The three lines of one kill as the kernel prints them (invoking task, constraint, kill),
    # taken from the published lines of vllm-project/vllm#54237 (the first, printed just before
    # its companions here, is that report's next kill's line). Runs further apart than FOLD_US
    # stay apart: the fixture's TIMER kill is not the cicc one.
    records = [b"4,1,2448628900,-;VLLM::EngineCor invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), "
               b"order=0, oom_score_adj=0", KMSG[18], KMSG[19]]
    events, _ = parse_kmsg(records, 0)
    assert [(e["invoked_by"], e["pid"], e["process"]) for e in events] == [("VLLM::EngineCor", 16014, "cicc")]


def test_a_second_victim_is_a_second_kill() -> None:
    events, _ = parse_kmsg([KMSG[18], KMSG[19], KMSG[18], KMSG[19]], 0)
    assert [e["pid"] for e in events] == [16014, 16014]


def test_a_flood_is_capped() -> None:
    flood = [f"4,{n},1,-;NVRM: Xid (PCI:0000:01:00): 31, Ch 0000000{n % 10}".encode() for n in range(1, 60)]
    events, last = parse_kmsg(flood, 0)
    assert len(events) == MAX_EVENTS and last == 59
