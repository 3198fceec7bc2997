# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One node's bounded reads for its lockfile record (module_utils/upgrade/_stack_gather.py).

Without the node's serving state nothing can be recorded (the refusal says to run the rollout);
every other read that fails is a warning and a null: a missing binary, a command that fails,
an unreadable sysfs file. A whole node of stand-in commands is
tests/unit/plugins/modules/test_stack_lock.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade import _stack_gather
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit

FIX = "run the rollout (it writes the node's reconciled state) before recording its stack"


def reader(tmp_path, bins=None, **given) -> _stack_gather._Gather:
    params = {"state_path": str(tmp_path / "serving.json"), "timeout": 30.0, "sys_root": str(tmp_path),
              "weights_path": "", "venv_root": str(tmp_path), "image_timeout": 180.0, **given}
    return _stack_gather._Gather(FakeModule(params, bins=bins))


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "does not exist: nothing serves here"),
        ("{not json", "serving.json"),
        ('{"recipe": {}, "recipe_hash": "00", "node": {"rank": 0}}', "the recipe does not hash to its recipe_hash"),
    ],
    ids=["no state", "not JSON", "an edited recipe"],
)
def test_no_trusted_serving_state_ends_the_module_with_the_fix(tmp_path, content, problem):
    if content is not None:
        (tmp_path / "serving.json").write_text(content)
    with pytest.raises(ModuleExit) as caught:
        reader(tmp_path).serving_state()
    message = caught.value.result["msg"]
    assert message.startswith("state_path: ") and problem in message and message.endswith(FIX)


def test_a_missing_binary_or_a_failing_command_is_a_warning_and_a_null(tmp_path):
    fails = tmp_path / "nvidia-smi"
    fails.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    fails.chmod(0o755)
    gather = reader(tmp_path, bins={"nvidia-smi": str(fails)})
    assert gather.gpu() == {}
    assert gather.warnings == [f"GPU: {fails} failed (rc=9): NVIDIA-SMI has failed"]
    assert reader(tmp_path).journal() == ""  # no systemctl, no journal: nothing to read


def test_sysfs_text_is_read_bounded_and_none_when_unreadable(tmp_path):
    (tmp_path / "fw_ver").write_text("28.45.1020\n")
    assert _stack_gather._files.read_sysfs(str(tmp_path / "fw_ver")) == "28.45.1020"
    assert _stack_gather._files.read_sysfs(str(tmp_path / "absent")) is None
