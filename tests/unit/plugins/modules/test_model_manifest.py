# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""model_manifest run in-process against real files (no mocks beyond exit_json)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _manifest_file as mf
from ansible_collections.localinference.vllm.plugins.modules import model_manifest
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

REV = "5eed0c0ffee0000000000000000000000000000a"


def safetensors_bytes(shape: list[int]) -> bytes:
    count = 1
    for dim in shape:
        count *= dim
    header = json.dumps(
        {"w": {"dtype": "BF16", "shape": shape, "data_offsets": [0, 2 * count]}}
    ).encode()
    return struct.pack("<Q", len(header)) + header + os.urandom(2 * count)


@pytest.fixture
def snap(tmp_path):
    root = tmp_path / "hub" / "models--org--name" / "snapshots" / REV
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}\n')
    (root / "model.safetensors").write_bytes(safetensors_bytes([32, 32]))
    (root / "tokenizer.json").write_text("{}\n")
    return root


def manifest_path(snap) -> str:
    return str(snap.parent.parent / "localinference-manifests" / f"{REV}.json")


def create(snap, check_mode=False, **extra):
    return run_module(
        model_manifest,
        {"path": str(snap), "mode": "create", "model": "org/name", "revision": REV, **extra},
        check_mode=check_mode,
    )


def test_create_writes_manifest_then_is_idempotent(snap):
    first = create(snap)
    assert not first.failed
    r = first.result
    assert r["changed"] and r["ok"] and r["hashed"] == 3 and r["files"] == 3
    assert r["manifest"] == manifest_path(snap)
    on_disk = mf.load_manifest(manifest_path(snap))
    assert on_disk == r["manifest_content"]
    assert on_disk["model"] == "org/name" and on_disk["revision"] == REV
    second = create(snap).result
    assert not second["changed"] and second["hashed"] == 0 and second["hashed_bytes"] == 0


def test_create_check_mode_writes_nothing_and_diffs(snap):
    result = run_module(
        model_manifest,
        {"path": str(snap), "mode": "create", "_ansible_diff": True},
        check_mode=True,
    ).result
    assert result["changed"]
    assert not os.path.exists(manifest_path(snap))
    assert result["diff"]["before"] == ""
    assert "model.safetensors" in result["diff"]["after"]


def test_create_refuses_damaged_head(snap):
    create(snap)
    before = Path(manifest_path(snap)).read_text()
    os.remove(snap / "tokenizer.json")
    result = create(snap).result
    assert not result["ok"] and not result["changed"]
    assert result["mismatched"][0]["path"] == "tokenizer.json"
    assert Path(manifest_path(snap)).read_text() == before


def verify_args(snap, **extra):
    return {"path": str(snap), "mode": "verify", **extra}


FAULTS = [
    # (id, damage, options, expected ok, expected reason prefix, expected hashed)
    ("unchanged", None, {}, True, None, 0),
    ("unchanged-full", None, {"full": True}, True, None, 3),
    ("deleted", "delete", {}, False, "missing", 0),
    ("truncated", "truncate", {}, False, "size", 0),
    ("flipped-fast", "flip", {}, True, None, 0),
    ("flipped-full", "flip", {"full": True}, False, "sha256", 3),
]


@pytest.mark.parametrize(
    ("damage", "options", "ok", "reason", "hashed"),
    [f[1:] for f in FAULTS],
    ids=[f[0] for f in FAULTS],
)
def test_verify_case_table(snap, damage, options, ok, reason, hashed):
    content = create(snap).result["manifest_content"]
    target = snap / "model.safetensors"
    stat = os.stat(target)
    if damage == "delete":
        target.unlink()
    elif damage == "truncate":
        os.truncate(target, stat.st_size - 1)
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[-7] ^= 0x01
        target.write_bytes(bytes(data))
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    # from the file, and from content passed in (as the role passes the head's manifest)
    for args in (
        verify_args(snap, **options),
        verify_args(snap, manifest_content=content, **options),
    ):
        result = run_module(model_manifest, args).result
        assert result["ok"] is ok
        assert result["hashed"] == hashed
        assert not result["changed"]
        if reason:
            assert result["mismatched"][0]["path"] == "model.safetensors"
            assert result["mismatched"][0]["reason"].startswith(reason)
            assert result["missing_bytes"] == stat.st_size
        else:
            assert result["mismatched"] == [] and result["missing_bytes"] == 0


def test_verify_restores_mtime_unless_check_mode(snap):
    create(snap)
    target = snap / "config.json"
    recorded = os.stat(target).st_mtime_ns
    os.utime(target, ns=(1, 1_600_000_000_000_000_001))
    checked = run_module(
        model_manifest, verify_args(snap, _ansible_diff=True), check_mode=True
    ).result
    assert checked["changed"] and checked["ok"] and checked["hashed"] == 1
    assert "config.json" in checked["diff"]["after"]
    assert os.stat(target).st_mtime_ns == 1_600_000_000_000_000_001
    applied = run_module(model_manifest, verify_args(snap)).result
    assert applied["changed"] and os.stat(target).st_mtime_ns == recorded
    assert run_module(model_manifest, verify_args(snap)).result["hashed"] == 0


def test_verify_paths_subset(snap):
    create(snap)
    result = run_module(model_manifest, verify_args(snap, full=True, paths=["config.json"])).result
    assert result["ok"] and result["hashed"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"mode": "verify"}, "does not exist"),
        ({"mode": "create", "manifest_content": {"files": []}}, "only for mode=verify"),
        ({"mode": "create", "paths": ["a"]}, "only for mode=verify"),
        ({"mode": "create", "workers": -1}, "workers must be"),
        ({"mode": "verify", "manifest_content": {"format": "x"}}, "is not a"),
    ],
)
def test_usage_errors_are_explained(snap, args, message):
    outcome = run_module(model_manifest, {"path": str(snap), **args})
    assert outcome.failed
    assert message in outcome.result["msg"]


def test_create_on_missing_directory_names_the_fix(tmp_path):
    outcome = run_module(model_manifest, {"path": str(tmp_path / "nope"), "mode": "create"})
    assert outcome.failed and "stage the snapshot there first" in outcome.result["msg"]


@pytest.mark.parametrize("mode", ["create", "verify"])
def test_a_file_name_that_is_not_utf8_is_refused_before_anything_is_written(snap, mode):
    if mode == "verify":
        assert not create(snap).failed
    before = sorted(os.listdir(snap.parent.parent))
    (snap / os.fsdecode(b"sub\xff")).mkdir()
    (snap / os.fsdecode(b"sub\xff") / "shard.bin").write_bytes(b"x")
    outcome = run_module(
        model_manifest,
        {"path": str(snap), "mode": mode}
        | ({"manifest": manifest_path(snap)} if mode == "verify" else {}),
    )
    assert outcome.failed, outcome.result
    assert "not UTF-8" in outcome.result["msg"] and "sub\\xff" in outcome.result["msg"]
    json.dumps(outcome.result).encode("utf-8")  # the result can be returned
    assert sorted(os.listdir(snap.parent.parent)) == before
