# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""opencode's config file on the node (module_utils/client/_opencode_apply.py), with a stand-in module.

A new config is written 0600 (it may sit among the user's secrets) and a second run changes
nothing; check mode writes nothing; what is not a config file (a directory, a huge file) is
refused by name, as is checking a config that is not there. The merge and the judgement are
tests/unit/plugins/modules/test_opencode_config.py's case tables.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode import (
    OpencodeConfigError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode_apply import (
    MAX_BYTES,
    run,
)
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule


def params(path, **given) -> dict:
    base = {"path": str(path), "state": "present", "provider": "lab", "model": "m", "max_model_len": 65536,
            "prompt_floor": 12000, "reasoning_key": "reasoning", "base_url": "http://127.0.0.1:18000/v1",
            "api_key_env": "LOCALINFERENCE_API_KEY", "output_tokens": None, "reserved_tokens": None,
            "client_version": "1.18.33", "client_reads": None, "provider_name": None, "model_name": None,
            "settings": {}}
    return {**base, **given}


def test_a_new_config_is_written_private_and_a_second_run_changes_nothing(tmp_path):
    path = tmp_path / "home" / ".config" / "opencode" / "opencode.json"
    out = run(FakeModule(params(path), diff=True))
    assert out["changed"] is True and out["diff"]["before"] == ""
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.loads(path.read_text())["provider"]["lab"]["options"]["baseURL"] == "http://127.0.0.1:18000/v1"
    assert run(FakeModule(params(path)))["changed"] is False


def test_check_mode_writes_nothing(tmp_path):
    path = tmp_path / "opencode.json"
    assert run(FakeModule(params(path), check_mode=True))["changed"] is True
    assert not path.exists()


@pytest.mark.parametrize(
    ("make", "given", "message"),
    [
        ("directory", {}, "is not a regular file"),
        ("huge", {}, f"is larger than {MAX_BYTES} bytes: not an opencode config"),
        ("nothing", {"state": "checked"}, "does not exist: nothing to check; write it with state=present"),
    ],
    ids=["a directory", "a huge file", "checking nothing"],
)
def test_what_is_not_a_config_file_is_refused_by_name(tmp_path, make, given, message):
    path = tmp_path / "opencode.json"
    if make == "directory":
        path.mkdir()
    elif make == "huge":
        with open(path, "wb") as handle:
            handle.truncate(MAX_BYTES + 1)
    with pytest.raises(OpencodeConfigError) as caught:
        run(FakeModule(params(path, **given)))
    assert str(caught.value) == f"{path} {message}"
