# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host stack's reads for the preflight (module_utils/preflight/_host_stack_gather.py).

The weights already on disk are counted by the manifest when there is one (an entry of the
wrong size is not there yet) and by every file once otherwise (links followed, hard links
counted once); free space is measured where the snapshot will be, at its nearest existing
parent. A command that is missing or fails is a note, never a failure. The judgement is
test_host_stack.py's; the module is tests/unit/plugins/modules/test_host_stack_facts.py's.
"""

from __future__ import annotations

import os

from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import Runner
from ansible_collections.localinference.vllm.plugins.module_utils.preflight import (
    _host_stack_gather as gather,
)
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule


def test_present_bytes_follow_the_manifest_when_there_is_one(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "config.json").write_bytes(b"{}")
    manifest = {"files": [{"path": "model.safetensors", "size": 100}, {"path": "config.json", "size": 5},
                          {"path": "missing.bin", "size": 7}]}
    assert gather._present_bytes(str(tmp_path), manifest) == 100


def test_without_a_manifest_every_file_counts_once(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 10)
    os.link(tmp_path / "a", tmp_path / "b")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c").write_bytes(b"y" * 5)
    assert gather._present_bytes(str(tmp_path), None) == 15


def test_free_space_is_measured_at_the_nearest_existing_parent(tmp_path):
    assert gather._nearest_existing(str(tmp_path / "models" / "hub" / "snapshot")) == str(tmp_path)
    module = FakeModule({"weights_path": str(tmp_path / "models"), "weights_manifest": None})
    notes: list[str] = []
    disk = gather._disk(module, notes)
    assert disk["measured_at"] == str(tmp_path) and disk["free_bytes"] > 0
    assert disk["present_bytes"] == 0 and disk["manifest"] is None and notes == []


def test_a_missing_or_failing_command_is_a_note(tmp_path):
    fails = tmp_path / "chronyc"
    fails.write_text("#!/bin/sh\necho '506 Cannot talk to daemon' >&2\nexit 1\n")
    fails.chmod(0o755)
    reader = gather.Gatherer(FakeModule({}, bins={"chronyc": str(fails)}), Runner(10))
    assert reader.run(["timedatectl", "show"]) is None
    assert reader.run(["chronyc", "-n", "tracking"]) is None
    assert reader.notes == ["timedatectl not found", "chronyc -n tracking exited 1: 506 Cannot talk to daemon"]
