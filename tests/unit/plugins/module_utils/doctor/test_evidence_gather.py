# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's reads on the node (module_utils/doctor/_evidence_gather.py), without the module.

The module's behaviour (every option, the token probes against a stand-in ingress) is tested
through ``doctor_facts`` in tests/unit/plugins/modules/test_doctor_facts.py; here the reads
that need no AnsibleModule: the ingress key masked as soon as it is read, a watchdog log that
is not a regular file never opened, an option that is not an absolute path or URL refused by
name.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor import _evidence_gather

KEY = "doctor-test-key-0123456789abcdef"


def test_the_key_read_is_masked_in_everything_ansible_logs(tmp_path):
    path = tmp_path / "api-key.env"
    path.write_text(f"LOCALINFERENCE_INGRESS_API_KEY={KEY}\n")
    module = SimpleNamespace(no_log_values=set())
    assert _evidence_gather.read_key(module, str(path)) == KEY
    assert module.no_log_values == {KEY}


def test_a_missing_key_file_says_which_stage_writes_it(tmp_path):
    module = SimpleNamespace(no_log_values=set())
    with pytest.raises(ValueError, match="does not exist: run the ingress stage"):
        _evidence_gather.read_key(module, str(tmp_path / "absent.env"))
    assert module.no_log_values == set()


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        ("absent", {"exists": False, "incidents": [], "problems": []}),
        ("fifo", {"exists": True, "incidents": [], "problems": ["is not a regular file"]}),
        ("directory", {"exists": True, "incidents": [], "problems": ["is not a regular file"]}),
    ],
    ids=["absent", "a FIFO is never opened", "a directory"],
)
def test_an_incident_log_that_is_no_file_is_named_not_read(tmp_path, make, expected):
    path = tmp_path / "incidents.jsonl"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "directory":
        path.mkdir()
    found = _evidence_gather._incident_log(str(path), 5)
    assert found["exists"] is expected["exists"] and found["incidents"] == []
    assert [p.split(" ", 1)[1] for p in found["problems"]] == expected["problems"]


@pytest.mark.parametrize(
    ("check", "value", "words"),
    [
        (_evidence_gather._checked_path, "relative/path", "files.x: 'relative/path' is not an absolute path"),
        (_evidence_gather._checked_path, "/bad\nline", "is not an absolute path"),
        (_evidence_gather._checked_url, "ftp://host/", "x: 'ftp://host/' is not an http(s) URL"),
        (_evidence_gather._checked_url, "http://a b/", "is not an http(s) URL"),
    ],
    ids=["relative path", "newline in a path", "not http", "space in a URL"],
)
def test_an_option_that_is_not_a_path_or_url_is_refused_by_name(check, value, words):
    with pytest.raises(ValidationError) as caught:
        check("x", value)
    assert words in str(caught.value)
