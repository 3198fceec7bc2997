# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json
import os

import pytest
from ansible_collections.localinference.vllm.plugins.filter.stage import (
    findings_table,
    stage_hash,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    StageResultError,
    check_document,
    inputs_hash,
)
from ansible_collections.localinference.vllm.plugins.modules import stage_result

from tests.unit.module_helper import run_module

RESULT = {"env": {"VLLM_HOST_IP": "10.0.0.1"}, "findings": []}


def save(path, **extra):
    args = {"stage": "fabric", "path": str(path), "inputs": {"a": 1}, "result": RESULT, **extra}
    return run_module(stage_result, args)


def test_save_then_read_round_trip_and_second_save_is_no_change(tmp_path):
    path = tmp_path / "sub" / "fabric.json"
    first = save(path)
    assert first.result["changed"] and path.exists()
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert not save(path).result["changed"]
    read = run_module(stage_result, {"stage": "fabric", "state": "read", "path": str(path)})
    assert read.result["found"] and read.result["result"] == RESULT
    assert read.result["inputs_hash"] == inputs_hash({"a": 1}) == first.result["inputs_hash"]


def test_new_inputs_change_the_hash_and_the_file(tmp_path):
    path = tmp_path / "fabric.json"
    save(path)
    again = save(path, inputs={"a": 2})
    assert again.result["changed"]
    assert json.loads(path.read_text())["inputs_hash"] == inputs_hash({"a": 2})


def test_check_mode_writes_nothing_and_diff_shows_the_document(tmp_path):
    path = tmp_path / "fabric.json"
    args = {"stage": "fabric", "path": str(path), "inputs": {}, "result": RESULT, "_ansible_diff": True}
    out = run_module(stage_result, args, check_mode=True)
    assert out.result["changed"] and not path.exists()
    assert '"VLLM_HOST_IP"' in out.result["diff"]["after"]


def test_missing_document_is_not_found_or_names_the_stage_when_required(tmp_path):
    path = tmp_path / "plan.json"
    out = run_module(stage_result, {"stage": "plan", "state": "read", "path": str(path)})
    assert not out.failed and out.result["found"] is False and out.result["result"] == {}
    out = run_module(
        stage_result, {"stage": "plan", "state": "read", "path": str(path), "required": True}
    )
    assert out.failed and "--tags plan" in out.result["msg"]


BAD_DOCUMENTS = [
    ("not json", b"{oops", "not valid JSON"),
    ("binary", b"\xff\xfe\x00", "not UTF-8"),
    ("a list", b"[1, 2]", "holds a list"),
    ("another stage", json.dumps({"schema": 1, "stage": "plan", "inputs_hash": "0" * 64, "result": {}}).encode(), "stage is 'plan'"),
    ("no hash", json.dumps({"schema": 1, "stage": "fabric", "result": {}}).encode(), "inputs_hash"),
    ("result not a dict", json.dumps({"schema": 1, "stage": "fabric", "inputs_hash": "0" * 64, "result": []}).encode(), "result is not a mapping"),
    ("NaN", b'{"schema": 1, "stage": "fabric", "inputs_hash": "' + b"0" * 64 + b'", "result": {"x": NaN}}', "not valid JSON"),
    ("old schema", json.dumps({"schema": 0, "stage": "fabric", "inputs_hash": "0" * 64, "result": {}}).encode(), "schema is 0"),
]


@pytest.mark.parametrize(("name", "content", "expected"), BAD_DOCUMENTS, ids=[b[0] for b in BAD_DOCUMENTS])
def test_a_document_from_the_node_is_schema_checked(tmp_path, name, content, expected):
    path = tmp_path / "fabric.json"
    path.write_bytes(content)
    out = run_module(stage_result, {"stage": "fabric", "state": "read", "path": str(path)})
    assert out.failed
    assert str(path) in out.result["msg"] and expected in out.result["msg"]
    assert "--tags fabric" in out.result["msg"]


def test_a_directory_or_symlink_in_place_of_the_document_is_refused(tmp_path):
    directory = tmp_path / "fabric.json"
    directory.mkdir()
    out = run_module(stage_result, {"stage": "fabric", "state": "read", "path": str(directory)})
    assert out.failed and "not a regular file" in out.result["msg"]
    link = tmp_path / "link.json"
    os.symlink("/etc/passwd", link)
    out = run_module(stage_result, {"stage": "fabric", "state": "read", "path": str(link)})
    assert out.failed and "not a regular file" in out.result["msg"]


def test_required_keys_missing_names_them(tmp_path):
    path = tmp_path / "fabric.json"
    save(path)
    out = run_module(
        stage_result,
        {"stage": "fabric", "state": "read", "path": str(path), "required_keys": ["env", "gid_index"]},
    )
    assert out.failed and "gid_index" in out.result["msg"]


def test_an_infinite_number_is_never_saved(tmp_path):
    out = save(tmp_path / "fabric.json", result={"x": float("inf")})
    assert out.failed and "result.x" in out.result["msg"]


def test_hash_is_canonical_and_filters_agree():
    assert stage_hash({"b": 1, "a": [1, 2]}) == inputs_hash({"a": [1, 2], "b": 1})
    with pytest.raises(StageResultError):
        check_document("[]", "plan", "x")


def test_findings_table_lines_up_columns():
    lines = findings_table(
        [finding("F19", "error", "jumbo dropped", "set MTU 9000", host="spark-worker")],
        ["host", "id", "message"],
    )
    assert lines[0].split() == ["HOST", "ID", "MESSAGE"]
    assert lines[1].startswith("spark-worker  F19")
