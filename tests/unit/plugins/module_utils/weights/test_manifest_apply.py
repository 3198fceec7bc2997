# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A snapshot's manifest recorded and verified (module_utils/weights/_manifest_apply.py).

mode=create records the snapshot (check mode writes nothing) and a second run changes
nothing; mode=verify against it passes, then names a file whose content changed; the options
that make no sense for a mode are refused before anything is hashed. Hashing and the manifest
document are test_manifest*.py's; the module is tests/unit/plugins/modules/test_model_manifest.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.weights._manifest_apply import run
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit


def params(snapshot, **given) -> dict:
    base = {"path": str(snapshot), "mode": "create", "manifest": str(snapshot.parent / "manifest.json"),
            "manifest_content": None, "full": False, "paths": None, "workers": 1, "drop_cache": False,
            "model": "localinference/tiny-deepseek", "revision": "r"}
    return {**base, **given}


@pytest.fixture
def snapshot(tmp_path):
    folder = tmp_path / "snapshot"
    folder.mkdir()
    (folder / "config.json").write_text("{}\n")
    (folder / "tokenizer.model").write_bytes(b"\0" * 4096)
    return folder


def test_create_records_once_and_verify_names_a_changed_file(snapshot):
    assert run(FakeModule(params(snapshot), check_mode=True))["changed"] is True
    assert not (snapshot.parent / "manifest.json").exists()
    created = run(FakeModule(params(snapshot)))
    assert created["changed"] is True and created["ok"] is True
    assert (created["files"], created["total_bytes"], created["missing_bytes"]) == (2, 4099, 0)
    assert run(FakeModule(params(snapshot)))["changed"] is False
    assert run(FakeModule(params(snapshot, mode="verify", full=True)))["ok"] is True
    (snapshot / "config.json").write_text("{\"x\":1}\n")
    verified = run(FakeModule(params(snapshot, mode="verify", full=True)))
    assert verified["ok"] is False and verified["msg"].startswith("1 file(s) do not match: config.json")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"manifest_content": {}}, "manifest_content is only for mode=verify"),
        ({"paths": ["config.json"]}, "paths is only for mode=verify"),
        ({"workers": 257}, "workers must be 0 (one per CPU) to 256, got 257"),
        ({"path": "/nonexistent/snapshot"}, "path /nonexistent/snapshot is not a directory"),
        ({"mode": "verify"}, "run mode=create on the source node first or pass manifest_content"),
    ],
    ids=["content when creating", "paths when creating", "workers", "no snapshot", "no manifest to verify"],
)
def test_a_request_that_makes_no_sense_is_refused(snapshot, given, message):
    with pytest.raises(ModuleExit) as caught:
        run(FakeModule(params(snapshot, **given)))
    assert message in caught.value.result["msg"]
