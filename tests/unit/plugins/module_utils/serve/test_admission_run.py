# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A unit's cgroup for the memory admission (module_utils/serve/_admission_run.py), with a stand-in systemctl.

A running unit is its ControlGroup; one that is not running is its slice under the root
systemd manages (PID 1's cgroup less init.scope); systemctl failing ends the module naming the
unit. The admission itself is test_admission*.py's; the module is
tests/unit/plugins/modules/test_memory_admission.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _admission_run
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit


def module(tmp_path, show: str, rc: int = 0, **given) -> FakeModule:
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f"#!/bin/sh\ncat <<'EOF'\n{show}\nEOF\nexit {rc}\n")
    systemctl.chmod(0o755)
    (tmp_path / "1").mkdir(exist_ok=True)
    (tmp_path / "1" / "cgroup").write_text("0::/init.scope\n")
    params = {"timeout": 10.0, "proc_root": str(tmp_path), **given}
    return FakeModule(params, bins={"systemctl": str(systemctl)})


@pytest.mark.parametrize(
    ("show", "cgroup"),
    [
        ("ControlGroup=/localinference.slice/localinference-vllm.service\nSlice=localinference.slice",
         "/localinference.slice/localinference-vllm.service"),
        ("ControlGroup=\nSlice=localinference.slice", "/localinference.slice"),
        ("ControlGroup=\nSlice=", "/system.slice"),
    ],
    ids=["running", "stopped: its slice", "stopped, no slice: system.slice"],
)
def test_a_units_cgroup(tmp_path, show, cgroup):
    assert _admission_run._unit_cgroup(module(tmp_path, show), "localinference-vllm.service") == cgroup


def test_systemctl_failing_names_the_unit(tmp_path):
    with pytest.raises(ModuleExit) as caught:
        _admission_run._unit_cgroup(module(tmp_path, "", rc=1), "x.service")
    assert caught.value.result["msg"].startswith("unit=x.service: systemctl show exited 1")


@pytest.mark.parametrize(
    ("given", "message"),
    [({"need_bytes": -1}, "need_bytes must be 0 or more, got -1"), ({"timeout": 0}, "timeout")],
    ids=["a negative need", "timeout"],
)
def test_options_are_refused_before_anything_is_read(tmp_path, given, message):
    params = {"need_bytes": 1, "reserve_bytes": 0, "top_tenants": 5, "cgroup": None, "unit": None,
              "exclude_pids": [], "fail_when_refused": True, **given}
    with pytest.raises(ModuleExit) as caught:
        _admission_run.run(module(tmp_path, "", **params))
    assert caught.value.result["msg"].startswith(message)
