# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stage fingerprint: role inputs (less the secrets), the collection's code, extra values."""

from __future__ import annotations

import os

import pytest
from ansible.errors import AnsibleLookupError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.localinference.vllm.plugins.lookup import stage_fingerprint
from ansible_collections.localinference.vllm.plugins.lookup.stage_fingerprint import (
    LookupModule,
    code_digest,
    role_inputs,
)

SPEC = """\
argument_specs:
  main:
    options:
      demo_port: {type: int}
      demo_key: {type: str, no_log: true}
      demo_path: {type: path}
"""


@pytest.fixture
def collection(tmp_path):
    (tmp_path / "roles" / "demo" / "meta").mkdir(parents=True)
    (tmp_path / "roles" / "demo" / "meta" / "argument_specs.yml").write_text(SPEC)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "a.py").write_text("A = 1\n")
    role_inputs.cache_clear()
    code_digest.cache_clear()
    yield tmp_path
    role_inputs.cache_clear()
    code_digest.cache_clear()


def test_the_role_inputs_are_its_argument_specs_less_the_no_log_ones(collection):
    assert role_inputs("demo", "main", collection) == ("demo_path", "demo_port")


def test_a_missing_role_or_entry_point_is_named(collection):
    with pytest.raises(AnsibleLookupError, match="'nothere'"):
        role_inputs("nothere", "main", collection)
    with pytest.raises(AnsibleLookupError, match="'other'"):
        role_inputs("demo", "other", collection)


def test_the_code_digest_follows_every_file_and_ignores_caches(collection):
    before = code_digest(collection)
    (collection / "plugins" / "__pycache__").mkdir()
    (collection / "plugins" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    code_digest.cache_clear()
    assert code_digest(collection) == before
    (collection / "plugins" / "a.py").write_text("A = 2\n")
    code_digest.cache_clear()
    assert code_digest(collection) != before


def lookup(variables, **kwargs):
    module = LookupModule(loader=DataLoader(), templar=Templar(loader=DataLoader(), variables=variables))
    return module.run(["ingress"], variables, **kwargs)[0]


def test_a_changed_input_or_extra_changes_the_fingerprint_and_the_key_does_not():
    base = {"ingress_port": 8080, "ingress_api_key": "one", "other_var": 1}
    first = lookup(base)
    assert lookup({**base, "other_var": 2}) == first
    assert lookup({**base, "ingress_api_key": "two"}) == first
    assert lookup({**base, "ingress_port": 8081}) != first
    assert lookup(base, extra="x") != first
    assert len(first) == 64


def test_an_excluded_option_is_an_action_not_an_input():
    base = {"ingress_port": 8080, "ingress_rotate_key": False}
    first = lookup(base, exclude=["ingress_rotate_key"])
    assert lookup({**base, "ingress_rotate_key": True}, exclude=["ingress_rotate_key"]) == first
    assert lookup({**base, "ingress_rotate_key": True}) != lookup(base)
    with pytest.raises(AnsibleLookupError, match="exclude must be a list"):
        lookup(base, exclude="ingress_rotate_key")


def test_templated_inputs_are_hashed_as_this_run_sees_them():
    # Role defaults and inventory values are trusted templates (ansible-core 2.19).
    assert lookup({"ingress_port": trust_as_template("{{ 8000 + 80 }}")}) == lookup({"ingress_port": 8080})


def test_the_lookup_takes_one_role_name():
    module = LookupModule(loader=DataLoader(), templar=Templar(loader=DataLoader(), variables={}))
    with pytest.raises(AnsibleLookupError, match="one role name"):
        module.run(["ingress", "serve"], {})
    with pytest.raises(AnsibleLookupError, match="one role name"):
        module.run(["../etc"], {})


def test_the_real_roles_have_inputs():
    assert "ingress_port" in role_inputs("ingress")
    assert "ingress_api_key" not in role_inputs("ingress")
    assert stage_fingerprint.COLLECTION.joinpath("galaxy.yml").is_file()


def test_an_unknown_option_is_named():
    with pytest.raises(AnsibleLookupError, match="unknown option extras"):
        lookup({}, extras=1)


def test_controller_files_count_by_identity_not_content(tmp_path, monkeypatch):
    key = tmp_path / "key"
    key.write_text("one\n")
    first = lookup({}, files=[str(key)])
    assert lookup({}, files=[str(key)]) == first
    os.utime(key, ns=(1, 1))
    assert lookup({}, files=[str(key)]) != first
    missing = lookup({}, files=[str(tmp_path / "absent")])
    assert missing != first and stage_fingerprint.file_identity(str(tmp_path / "absent")) is None


def test_a_command_name_is_found_in_path(tmp_path, monkeypatch):
    program = tmp_path / "opencode"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert stage_fingerprint.file_identity("opencode")["path"] == str(program)


@pytest.mark.parametrize("files", ["one", [""], ["a\nb"], [1]])
def test_bad_files_are_refused(files):
    with pytest.raises(AnsibleLookupError, match="files must be a list of paths"):
        lookup({}, files=files)
