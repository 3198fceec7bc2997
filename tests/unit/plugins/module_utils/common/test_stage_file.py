# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A stage's saved result on the node (module_utils/common/_stage_file.py), with a stand-in module.

state=present writes it once (check mode writes nothing), state=read returns it or refuses by
name, state=converged says why a stage must run again; what the result watches is refused
when it is not a path, a unit or a command. The document's own checks are
test_stage_result*.py's under tests/unit/plugins/modules/.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _stage_file
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    StageResultError,
)
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule


def params(tmp_path, **given) -> dict:
    base = {"stage": "plan", "state": "present", "path": str(tmp_path / "plan.json"), "inputs": {"a": 1},
            "result": {"max_model_len": 4096}, "required": False, "required_keys": [], "fingerprint": None,
            "watch_files": [], "watch_units": [], "watch_commands": [], "watch_secrets": [],
            "watch_recorded": False, "prove_commands": [], "timeout": 30.0}
    return {**base, **given}


def test_present_writes_once_and_read_returns_it(tmp_path):
    first = _stage_file.run(FakeModule(params(tmp_path), diff=True))
    assert first["changed"] is True and first["diff"]["before"] == ""
    assert _stage_file.run(FakeModule(params(tmp_path)))["changed"] is False
    read = _stage_file.run(FakeModule(params(tmp_path, state="read", required=True)))
    assert read["found"] is True and read["result"] == {"max_model_len": 4096}
    assert read["inputs_hash"] == first["inputs_hash"]


def test_check_mode_writes_nothing(tmp_path):
    out = _stage_file.run(FakeModule(params(tmp_path), check_mode=True))
    assert out["changed"] is True and not (tmp_path / "plan.json").exists()


def test_converged_names_why_the_stage_must_run(tmp_path):
    watched = tmp_path / "recipe.yml"
    watched.write_text("max_model_len: 4096\n")
    given = {"watch_files": [str(watched)]}
    never = _stage_file.run(FakeModule(params(tmp_path, state="converged", **given)))
    assert (never["converged"], never["reason"]) == (False, "no saved result")
    _stage_file.run(FakeModule(params(tmp_path, **given)))
    same = _stage_file.run(FakeModule(params(tmp_path, state="converged", **given)))
    assert same["converged"] is True and same["reason"] is None
    other = _stage_file.run(FakeModule(params(tmp_path, state="converged", **{**given, "inputs": {"a": 2}})))
    assert other["reason"].startswith("its inputs changed")
    watched.write_text("max_model_len: 8192\n")
    edited = _stage_file.run(FakeModule(params(tmp_path, state="converged", **given)))
    assert edited["converged"] is False and str(watched) in edited["reason"]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"state": "read", "required": True}, "no saved plan result at "),
        ({"result": None}, "result is required with state=present"),
        ({"timeout": 0}, "timeout"),
        ({"watch_files": ["relative"]}, "watch_files: 'relative' is not an absolute path on one line"),
        ({"watch_units": ["caddy"]}, "watch_units: 'caddy' is not a systemd unit name"),
        ({"watch_commands": [["ok", "two\nlines"]]}, "watch_commands: ['ok', 'two\\nlines'] is not a command"),
        ({"state": "converged", "prove_commands": [[]]}, "prove_commands: [] is not a command"),
    ],
    ids=["read a missing required result", "present without a result", "timeout", "a relative watched file",
         "a unit without a type", "a two-line command", "an empty prove command"],
)
def test_a_bad_request_is_refused_by_name(tmp_path, given, message):
    with pytest.raises(StageResultError) as caught:
        _stage_file.run(FakeModule(params(tmp_path, **given)))
    assert message in str(caught.value)


def test_a_saved_result_that_is_not_a_regular_file_is_refused(tmp_path):
    (tmp_path / "plan.json").mkdir()
    with pytest.raises(StageResultError, match="is not a regular file; remove it and re-run the stage"):
        _stage_file.run(FakeModule(params(tmp_path, state="read")))


def test_a_secret_differs_when_its_file_does_or_is_missing(tmp_path):
    held = tmp_path / "key.env"
    held.write_text("KEY=1\n")
    secrets = [{"path": str(held), "content": "KEY=1"}, {"path": str(tmp_path / "gone"), "content": "x"}]
    assert _stage_file._secrets_differ(secrets) == [str(tmp_path / "gone")]
    held.write_text("KEY=2\n")
    assert _stage_file._secrets_differ(secrets[:1]) == [str(held)]
