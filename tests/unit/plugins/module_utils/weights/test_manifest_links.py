# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Manifests fail closed on incomplete snapshots: real trees with dangling links and loops."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _manifest_file as mf
from ansible_collections.localinference.vllm.plugins.module_utils.weights import _manifest as m
from ansible_collections.localinference.vllm.plugins.modules import model_manifest
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

REV = "5eed0c0ffee0000000000000000000000000000a"


def hf_tree(tmp_path: Path) -> Path:
    """A Hugging Face cache layout: snapshot entries link into blobs named by sha256."""
    repo = tmp_path / "hub" / "models--org--name"
    blobs = repo / "blobs"
    snap = repo / "snapshots" / REV
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for name, content in (("config.json", b'{"a": 1}\n'), ("model-00001.bin", b"x" * 4096)):
        digest = hashlib.sha256(content).hexdigest()
        (blobs / digest).write_bytes(content)
        (snap / name).symlink_to(f"../../blobs/{digest}")
    return snap


def test_dangling_shard_makes_create_fail_naming_the_file(tmp_path):
    snap = hf_tree(tmp_path)
    (snap / "model-00002.bin").symlink_to("../../blobs/" + "0" * 64)  # never downloaded
    outcome = m.create(str(snap), None)
    assert not outcome.ok
    (entry,) = outcome.mismatched
    assert entry["path"] == "model-00002.bin"
    assert entry["reason"].startswith("dangling symlink to ../../blobs/000")
    assert "never downloaded" in entry["reason"]

    result = run_module(model_manifest, {"path": str(snap), "mode": "create"})
    assert result.result["ok"] is False and result.result["changed"] is False
    assert "model-00002.bin (dangling symlink" in result.result["msg"]
    assert not os.path.exists(mf.default_manifest_path(str(snap))), (
        "an incomplete snapshot was blessed"
    )


def test_dangling_shard_makes_verify_fail_naming_the_file(tmp_path):
    snap = hf_tree(tmp_path)
    document = m.manifest_document(m.create(str(snap), None).records, "org/name", REV)
    blob = (snap / "config.json").resolve()
    blob.unlink()  # the blob is gone: the snapshot entry now dangles
    outcome = m.verify(str(snap), document)
    assert [(x["path"], x["reason"][:16]) for x in outcome.mismatched] == [
        ("config.json", "dangling symlink")
    ]
    result = run_module(
        model_manifest, {"path": str(snap), "mode": "verify", "manifest_content": document}
    )
    assert result.result["ok"] is False
    assert "config.json (dangling symlink" in result.result["msg"]


def test_dangling_link_the_manifest_does_not_list_fails_verify(tmp_path):
    snap = hf_tree(tmp_path)
    document = m.manifest_document(m.create(str(snap), None).records, "org/name", REV)
    (snap / "model-00003.bin").symlink_to("../../blobs/missing")
    outcome = m.verify(str(snap), document)
    (entry,) = outcome.mismatched
    assert (
        entry["path"] == "model-00003.bin" and "not in the manifest: delete it" in entry["reason"]
    )


@pytest.mark.parametrize(
    ("make", "path", "reason"),
    [
        (lambda s: (s / "self.bin").symlink_to("self.bin"), "self.bin", "symlink loop"),
        (
            lambda s: ((s / "a.bin").symlink_to("b.bin"), (s / "b.bin").symlink_to("a.bin")),
            "a.bin",
            "symlink loop",
        ),
        (lambda s: (s / "loop").symlink_to("."), "loop", "leads back to the snapshot root"),
        (
            lambda s: ((s / "sub").mkdir(), (s / "sub" / "up").symlink_to("..")),
            "sub/up",
            "leads back to the snapshot root",
        ),
        (
            lambda s: ((s / "sub").mkdir(), (s / "sub" / "again").symlink_to(".")),
            "sub/again",
            "leads back to sub",
        ),
    ],
    ids=["self", "pair", "dir-to-root", "dir-to-parent", "dir-to-itself"],
)
def test_loops_are_reported_once_and_never_list_a_file_twice(tmp_path, make, path, reason):
    snap = hf_tree(tmp_path)
    make(snap)
    listing = m.scan(str(snap))
    assert sorted(listing.files) == ["config.json", "model-00001.bin"]
    assert path in listing.broken and reason in listing.broken[path]
    outcome = m.create(str(snap), None)
    paths = [x["path"] for x in outcome.mismatched]
    assert path in paths and len(paths) == len(set(paths)) <= 2
    assert not outcome.ok


def test_a_link_to_a_sibling_directory_is_no_loop(tmp_path):
    snap = hf_tree(tmp_path)
    (snap / "real").mkdir()
    (snap / "real" / "weights.bin").write_bytes(b"w")
    (snap / "alias").symlink_to("real")
    listing = m.scan(str(snap))
    assert listing.broken == {}
    assert {"real/weights.bin", "alias/weights.bin"} <= set(listing.files)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ([{"path": "a", "size": True, "mtime_ns": 1, "sha256": "0" * 64}], "malformed file entry"),
        ([{"path": "a", "size": -1, "mtime_ns": 1, "sha256": "0" * 64}], "files[0]"),
        ([{"path": "a", "size": 1, "mtime_ns": 1, "sha256": ["0" * 64]}], "malformed"),
        ([{"path": "./a", "size": 1, "mtime_ns": 1, "sha256": "0" * 64}], "unsafe path"),
        ([{"path": "a//b", "size": 1, "mtime_ns": 1, "sha256": "0" * 64}], "unsafe path"),
        ([{"path": "a\x00b", "size": 1, "mtime_ns": 1, "sha256": "0" * 64}], "unsafe path"),
        ([{"path": "", "size": 1, "mtime_ns": 1, "sha256": "0" * 64}], "unsafe path"),
        ([{"path": "../etc/passwd", "size": 1, "mtime_ns": 1, "sha256": "0" * 64}], "unsafe path"),
        ([{"path": "a", "size": 1, "mtime_ns": 1, "sha256": "0" * 64}] * 2, "lists 'a' twice"),
    ],
)
def test_manifests_are_schema_checked(files, message):
    document = {"format": mf.MANIFEST_FORMAT, "files": files}
    with pytest.raises(mf.ManifestError, match="manifest_content") as caught:
        mf.validate_manifest(document, "manifest_content")
    assert message in str(caught.value)


def test_a_deeply_nested_manifest_file_is_a_clear_error(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(mf.ManifestError, match="cannot be read"):
        mf.load_manifest(str(path))


@pytest.mark.parametrize(
    "header",
    [
        b'{"w": {"dtype": ["BF16"], "shape": [1], "data_offsets": [0, 2]}}',
        b'{"w": {"dtype": "BF16", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 2]}}',
        b"[" * 100_000,
    ],
    ids=["unhashable-dtype", "huge-shape", "deep-json"],
)
def test_garbage_safetensors_headers_are_reasons_not_tracebacks(header):
    import struct

    prefix = struct.pack("<Q", len(header))
    with pytest.raises(ValueError, match="safetensors"):
        m.safetensors_header_check(prefix, header, 8 + len(header) + 2)
