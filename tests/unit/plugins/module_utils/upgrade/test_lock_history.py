# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stack lockfile on the head (module_utils/upgrade/_lock_history.py), with a stand-in module.

A missing lockfile is an empty history, an unreadable one a finding (warned, never a crash);
recording needs the gathered records; the timeouts are checked before anything is read. The
lockfile's judgement is test_stack_lock.py's case table; a whole recorded history is
tests/unit/plugins/modules/test_stack_lock.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade import _lock_history
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade import _stack_lock as lock
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit


def params(tmp_path, **given) -> dict:
    base = {"state": "read", "path": str(tmp_path / "stack.lock.json"), "nodes": None, "keep": lock.DEFAULT_KEEP,
            "timeout": 30.0, "image_timeout": 180.0}
    return {**base, **given}


def test_no_lockfile_is_an_empty_history(tmp_path):
    out = _lock_history.run(FakeModule(params(tmp_path)))
    assert out["found"] is False and out["entries"] == [] and out["entry"] is None
    assert out["findings"] == [] and out["changes"] == []


def test_an_unreadable_lockfile_is_a_finding_that_is_warned(tmp_path):
    (tmp_path / "stack.lock.json").write_bytes(b"\xff\xfe not text")
    module = FakeModule(params(tmp_path))
    out = _lock_history.run(module)
    assert out["found"] is True and out["entries"] == []
    assert [f["severity"] for f in out["findings"]] == ["error"]
    assert module.warnings == [f"stack_lock: {out['findings'][0]['message']}"]


def test_recorded_needs_the_gathered_records_and_diffed_does_not(tmp_path):
    assert _lock_history.run(FakeModule(params(tmp_path, state="diffed")))["changes"] == []
    with pytest.raises(lock.StackLockError, match="nodes is required with state=recorded"):
        _lock_history.run(FakeModule(params(tmp_path, state="recorded")))
    assert not (tmp_path / "stack.lock.json").exists()


@pytest.mark.parametrize("option", ["timeout", "image_timeout"])
def test_a_timeout_that_is_no_number_of_seconds_ends_the_module(tmp_path, option):
    with pytest.raises(ModuleExit) as caught:
        _lock_history.run(FakeModule(params(tmp_path, **{option: 0})))
    assert caught.value.result["msg"].startswith(option)
