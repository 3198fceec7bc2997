# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests for _manifest: real files in tmp dirs, hand-written safetensors."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _manifest_file as mf
from ansible_collections.localinference.vllm.plugins.module_utils.weights import _manifest as m

REV = "5eed0c0ffee0000000000000000000000000000a"


def safetensors_bytes(
    tensors: dict[str, tuple[str, list[int]]], metadata: dict | None = None
) -> bytes:
    """Write a valid safetensors file by hand: u64 LE header length, JSON header, data."""
    header: dict = {}
    data = b""
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        nbytes = int(count * m.SAFETENSORS_DTYPE_BYTES[dtype])
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(data), len(data) + nbytes],
        }
        data += bytes((len(data) + i) % 251 for i in range(nbytes))
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def make_snapshot(root, files: dict[str, bytes]) -> str:
    snap = root / "models--org--name" / "snapshots" / REV
    for rel, content in files.items():
        target = snap / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return str(snap)


@pytest.fixture
def snapshot(tmp_path):
    return make_snapshot(
        tmp_path,
        {
            "config.json": b'{"model_type": "llama"}\n',
            "model-00001-of-00002.safetensors": safetensors_bytes(
                {"a.weight": ("BF16", [16, 8]), "b.bias": ("F32", [8])}, {"format": "pt"}
            ),
            "model-00002-of-00002.safetensors": safetensors_bytes(
                {"c.weight": ("F8_E4M3", [32, 4])}
            ),
            "original/tokenizer.model": os.urandom(3000),
        },
    )


# --- safetensors header ------------------------------------------------------


def test_valid_safetensors_summary(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors_bytes({"w": ("BF16", [4, 4]), "v": ("F4", [6])}))
    assert m.read_safetensors_summary(str(path))["tensors"] == 2


def _header(body: dict) -> bytes:
    raw = json.dumps(body).encode()
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\x01\x02", "too short"),
        (struct.pack("<Q", 10**9) + b"{}", "exceeds"),
        (struct.pack("<Q", 64) + b"{}", "runs past the end"),
        (_header({"w": {"dtype": "BF16", "shape": [2]}}).replace(b"{", b"[", 1), "not valid JSON"),
        (
            _header({"w": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 4]}}) + b"\0" * 4,
            "unknown dtype",
        ),
        (
            _header({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 3]}}) + b"\0" * 3,
            "expected 4",
        ),
        (
            _header({"w": {"dtype": "BF16", "shape": ["2"], "data_offsets": [0, 4]}}) + b"\0" * 4,
            "bad shape",
        ),
        (
            _header(
                {
                    "w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                    "v": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]},
                }
            )
            + b"\0" * 5,
            "hole or overlap",
        ),
        (
            _header({"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}) + b"\0" * 5,
            "truncated",
        ),
        (
            _header({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}) + b"\0" * 9,
            "cover 2",
        ),
    ],
)
def test_bad_safetensors_is_explained(tmp_path, content, reason):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=reason):
        m.read_safetensors_summary(str(path))


def test_truncated_safetensors_file(tmp_path):
    full = safetensors_bytes({"w": ("BF16", [64, 64])})
    path = tmp_path / "t.safetensors"
    path.write_bytes(full[:-100])
    with pytest.raises(ValueError, match="truncated"):
        m.read_safetensors_summary(str(path))


# --- hashing -----------------------------------------------------------------


def test_hash_file_matches_hashlib_across_chunks(tmp_path):
    data = os.urandom(3 * 1024 + 17)
    path = tmp_path / "blob"
    path.write_bytes(data)
    result = m.hash_file(str(path), chunk_bytes=1024, drop_cache=True)
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    assert result.size == len(data)
    assert result.safetensors is None


def test_hash_many_runs_files_in_parallel(tmp_path):
    for i in range(4):
        (tmp_path / f"f{i}").write_bytes(os.urandom(100 + i))
    barrier = threading.Barrier(4, timeout=5)

    def hasher(path, drop_cache=False):
        barrier.wait()  # only passes when four files are being hashed at the same time
        return m.hash_file(path, drop_cache=drop_cache)

    results = m.hash_many(str(tmp_path), [f"f{i}" for i in range(4)], workers=4, hasher=hasher)
    assert sorted(results) == ["f0", "f1", "f2", "f3"]
    assert all(isinstance(r, m.HashResult) for r in results.values())


def test_hash_many_reports_unreadable_file(tmp_path):
    results = m.hash_many(str(tmp_path), ["absent"], workers=1)
    assert isinstance(results["absent"], OSError)


# --- create ------------------------------------------------------------------


def test_create_hashes_everything_first_then_nothing(snapshot):
    first = m.create(snapshot, None)
    assert first.ok and first.hashed == 4
    doc = m.manifest_document(first.records, "org/name", REV)
    assert [e["path"] for e in doc["files"]] == sorted(
        [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "original/tokenizer.model",
        ]
    )
    by_path = {e["path"]: e for e in doc["files"]}
    with open(os.path.join(snapshot, "config.json"), "rb") as fh:
        assert by_path["config.json"]["sha256"] == hashlib.sha256(fh.read()).hexdigest()
    assert by_path["model-00001-of-00002.safetensors"]["safetensors"]["tensors"] == 2
    again = m.create(snapshot, doc)
    assert again.ok and again.hashed == 0
    assert m.manifest_document(again.records, "org/name", REV) == doc


def test_create_skips_hidden_files(snapshot):
    with open(os.path.join(snapshot, ".config.json.Ab12Cd"), "wb") as fh:
        fh.write(b"rsync temp")
    assert ".config.json.Ab12Cd" not in {r.path for r in m.create(snapshot, None).records}


def test_create_rehashes_changed_file_and_adds_new(snapshot):
    doc = m.manifest_document(m.create(snapshot, None).records, None, None)
    path = os.path.join(snapshot, "config.json")
    with open(path, "ab") as fh:
        fh.write(b"more\n")
    with open(os.path.join(snapshot, "generation_config.json"), "w") as fh:
        fh.write("{}")
    out = m.create(snapshot, doc)
    assert out.ok and out.hashed == 2
    assert len(out.records) == 5


def test_create_refuses_to_bless_missing_file(snapshot):
    doc = m.manifest_document(m.create(snapshot, None).records, None, None)
    os.remove(os.path.join(snapshot, "config.json"))
    out = m.create(snapshot, doc)
    assert not out.ok
    assert out.mismatched == [
        {"path": "config.json", "reason": "missing (listed in the existing manifest)"}
    ]


def flip_byte_keep_stat(path: str, offset: int = -1) -> None:
    stat = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(offset, os.SEEK_END if offset < 0 else os.SEEK_SET)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_create_full_catches_corruption_in_place(snapshot):
    doc = m.manifest_document(m.create(snapshot, None).records, None, None)
    flip_byte_keep_stat(os.path.join(snapshot, "original/tokenizer.model"))
    assert m.create(snapshot, doc).ok  # the fast path cannot see it
    out = m.create(snapshot, doc, full=True)
    assert out.hashed == 4
    assert [x["path"] for x in out.mismatched] == ["original/tokenizer.model"]
    assert "corrupted in place" in out.mismatched[0]["reason"]


def test_create_checks_hub_blob_digest(tmp_path):
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / REV
    snap.mkdir(parents=True)
    good = b"good weights"
    good_digest = hashlib.sha256(good).hexdigest()
    (repo / "blobs" / good_digest).write_bytes(good)
    (snap / "good.bin").symlink_to(f"../../blobs/{good_digest}")
    bad_digest = hashlib.sha256(b"what the hub sent").hexdigest()
    (repo / "blobs" / bad_digest).write_bytes(b"what the disk holds")
    (snap / "bad.bin").symlink_to(f"../../blobs/{bad_digest}")
    out = m.create(str(snap), None)
    assert [r.path for r in out.records] == ["good.bin"]
    assert out.mismatched[0]["path"] == "bad.bin"
    assert "cache blob name" in out.mismatched[0]["reason"]


def test_create_reports_malformed_safetensors(snapshot):
    with open(os.path.join(snapshot, "broken.safetensors"), "wb") as fh:
        fh.write(struct.pack("<Q", 4) + b"nope")
    out = m.create(snapshot, None)
    assert [x["path"] for x in out.mismatched] == ["broken.safetensors"]
    assert "not valid JSON" in out.mismatched[0]["reason"]


# --- verify ------------------------------------------------------------------


@pytest.fixture
def copied(snapshot, tmp_path):
    """The head's snapshot and a faithful copy (content and mtimes), as rsync -a leaves it."""
    doc = m.manifest_document(m.create(snapshot, None).records, "org/name", REV)
    copy = tmp_path / "worker"
    for entry in doc["files"]:
        target = copy / entry["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(os.path.join(snapshot, entry["path"]), "rb") as fh:
            target.write_bytes(fh.read())
        os.utime(target, ns=(entry["mtime_ns"], entry["mtime_ns"]))
    return str(copy), doc


def test_verify_faithful_copy_hashes_nothing(copied):
    root, doc = copied
    out = m.verify(root, doc)
    assert out.ok and out.hashed == 0 and out.extra == []


def test_verify_full_hashes_everything(copied):
    root, doc = copied
    out = m.verify(root, doc, full=True)
    assert out.ok and out.hashed == 4


TRUNC = "model-00001-of-00002.safetensors"


@pytest.mark.parametrize(
    ("fault", "full", "reason"),
    [
        ("delete", False, "missing"),
        ("truncate", False, "size"),
        ("flip", False, None),  # invisible to the fast path by design
        ("flip", True, "sha256"),
    ],
)
def test_verify_faults(copied, fault, full, reason):
    root, doc = copied
    path = os.path.join(root, TRUNC)
    size = os.path.getsize(path)
    if fault == "delete":
        os.remove(path)
    elif fault == "truncate":
        os.truncate(path, size // 2)
    else:
        flip_byte_keep_stat(path, offset=size // 2)
    out = m.verify(root, doc, full=full)
    if reason is None:
        assert out.ok and out.hashed == 0
        return
    assert not out.ok
    assert [x["path"] for x in out.mismatched] == [TRUNC]
    assert out.mismatched[0]["reason"].startswith(reason)
    assert out.mismatched[0]["size"] == size


def test_verify_same_content_new_mtime_is_hashed_and_touched(copied):
    root, doc = copied
    path = os.path.join(root, "config.json")
    os.utime(path, ns=(1, 1_700_000_000_123_456_789))
    out = m.verify(root, doc)
    assert out.ok and out.hashed == 1
    assert list(out.touch) == ["config.json"]
    m.restore_mtimes(root, out.touch)
    assert m.verify(root, doc).hashed == 0


def test_verify_paths_restricts_and_reports_unknown(copied):
    root, doc = copied
    out = m.verify(root, doc, full=True, paths=["config.json", "nope.bin"])
    assert out.hashed == 1
    assert out.mismatched == [{"path": "nope.bin", "reason": "not in the manifest", "size": 0}]


def test_verify_reports_extra_files(copied):
    root, doc = copied
    with open(os.path.join(root, "stray.txt"), "w") as fh:
        fh.write("x")
    assert m.verify(root, doc).extra == ["stray.txt"]


def test_verify_missing_directory_lists_every_file(tmp_path, copied):
    _, doc = copied
    out = m.verify(str(tmp_path / "absent"), doc)
    assert {x["reason"] for x in out.mismatched} == {"missing"}
    assert sum(x["size"] for x in out.mismatched) == doc["total_bytes"]


# --- manifest files ----------------------------------------------------------


def test_manifest_round_trip(tmp_path, snapshot):
    doc = m.manifest_document(m.create(snapshot, None).records, "org/name", REV)
    path = str(tmp_path / "sub" / "m.json")
    m.write_manifest(path, doc)
    assert mf.load_manifest(path) == doc
    assert not [p for p in os.listdir(tmp_path / "sub") if ".tmp." in p]


@pytest.mark.parametrize(
    ("recorded", "actual", "same"),
    [
        (1_700_000_000_123_456_789, 1_700_000_000_123_456_789, True),
        (
            1_700_000_000_123_456_789,
            1_700_000_000_000_000_000,
            True,
        ),  # filesystem without sub-seconds
        (1_700_000_000_123_456_789, 1_700_000_000_123_456_000, False),
        (1_700_000_000_000_000_000, 1_700_000_001_000_000_000, False),
    ],
)
def test_same_mtime(recorded, actual, same):
    assert m.same_mtime(recorded, actual) is same


def test_disk_free_bytes_of_not_yet_existing_path(tmp_path):
    assert m.disk_free_bytes(str(tmp_path / "a" / "b")) > 0
