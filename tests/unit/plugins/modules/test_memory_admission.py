# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""memory_admission on the recorded lab tree of test_admission.py: admitted, refused (the
task fails with the one-line verdict), report-only, and bad options named."""

from __future__ import annotations

from ansible_collections.localinference.vllm.plugins.module_utils.serve._admission import GIB
from ansible_collections.localinference.vllm.plugins.modules import memory_admission

from ...module_helper import run_module
from ..module_utils.serve.test_admission import UNIT, lab_tree


def test_admitted_refused_and_report_only(tmp_path):
    proc = str(lab_tree(tmp_path, 10737418240, 9 * GIB, 0))
    admitted = run_module(
        memory_admission, {"need_bytes": GIB // 2, "proc_root": proc}, check_mode=True
    )
    assert not admitted.failed
    result = admitted.result
    assert (result["admitted"], result["changed"], result["available_bytes"]) == (True, False, GIB)
    refused = run_module(
        memory_admission,
        {"need_bytes": 2 * GIB, "reserve_bytes": GIB, "proc_root": proc, "cgroup": UNIT},
    )
    assert refused.failed
    assert refused.result["msg"].startswith("localinference admission refused the start")
    assert [t["pid"] for t in refused.result["tenants"]] == [4242, 901]
    assert refused.result["need_bytes"] == 3 * GIB
    report = run_module(
        memory_admission, {"need_bytes": 2 * GIB, "proc_root": proc, "fail_when_refused": False}
    )
    assert not report.failed and report.result["admitted"] is False
    assert report.result["tenants"][0]["name"] == "alice-hog"


def test_bad_options_are_named(tmp_path):
    proc = str(lab_tree(tmp_path, 10737418240, 0, 0))
    bad = run_module(memory_admission, {"need_bytes": -1, "proc_root": proc})
    assert bad.failed and bad.result["msg"] == "need_bytes must be 0 or more, got -1"
    both = run_module(memory_admission, {"need_bytes": 1, "cgroup": "/x", "unit": "y.service"})
    assert both.failed and "mutually exclusive" in both.result["msg"]
    nowhere = run_module(memory_admission, {"need_bytes": 1, "proc_root": str(tmp_path / "none")})
    assert nowhere.failed and "is proc_root=" in nowhere.result["msg"]
