# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests for _file_hash: whole-file sha256 with reads overlapped with hashing."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.weights import _file_hash as fh

READ = 1024

# (case, size in bytes, read_bytes, overlap): every boundary of a block, both paths
CASES = [
    ("empty file, sequential", 0, READ, False),
    ("empty file, overlapped", 0, READ, True),
    ("one byte", 1, READ, True),
    ("one block less a byte", READ - 1, READ, True),
    ("exactly one block", READ, READ, True),
    ("one block and a byte", READ + 1, READ, True),
    ("exactly two blocks", 2 * READ, READ, True),
    ("many blocks and a tail, overlapped", 37 * READ + 5, READ, True),
    ("many blocks and a tail, sequential", 37 * READ + 5, READ, False),
    ("an odd block size", 10_000, 333, True),
]


@pytest.fixture
def overlap_small(monkeypatch):
    """Let the reader thread run on files of a few blocks (production: 8 MiB and up)."""
    monkeypatch.setattr(fh, "OVERLAP_MIN_BYTES", 0)


@pytest.mark.parametrize(("case", "size", "read_bytes", "overlap"), CASES, ids=[c[0] for c in CASES])
def test_digest_is_the_whole_file_sha256(tmp_path, overlap_small, case, size, read_bytes, overlap):
    data = os.urandom(size)
    path = tmp_path / "blob"
    path.write_bytes(data)
    os.utime(path, ns=(1_000_000_000, 1_700_000_000_123_456_789))
    result = fh.file_sha256(str(path), read_bytes=read_bytes, overlap=overlap)
    assert result == fh.FileDigest(hashlib.sha256(data).hexdigest(), size, 1_700_000_000_123_456_789)


def test_reader_thread_runs_for_large_files_only(tmp_path, monkeypatch):
    started: list[str] = []
    real_thread = threading.Thread

    def spy(*args, **kwargs):
        started.append(kwargs.get("name", ""))
        return real_thread(*args, **kwargs)

    monkeypatch.setattr(fh.threading, "Thread", spy)
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_bytes(b"x" * (2 * READ - 1))
    large.write_bytes(b"y" * (2 * READ))
    monkeypatch.setattr(fh, "OVERLAP_MIN_BYTES", 2 * READ)
    fh.file_sha256(str(small), read_bytes=READ)
    assert started == []
    fh.file_sha256(str(large), read_bytes=READ)
    assert started == ["file-hash-reader"]


def test_drop_cache_releases_pages_window_by_window(tmp_path, monkeypatch, overlap_small):
    monkeypatch.setattr(fh, "DROP_WINDOW_BYTES", 4 * READ)
    calls: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def record(fd, offset, length, advice):
        if advice == os.POSIX_FADV_DONTNEED:
            calls.append((offset, length))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(fh.os, "posix_fadvise", record)
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(10 * READ + 1))
    fh.file_sha256(str(path), read_bytes=READ, drop_cache=True)
    # two full windows while reading, then the whole file once at the end
    assert calls == [(0, 4 * READ), (4 * READ, 4 * READ), (0, 0)]
    calls.clear()
    fh.file_sha256(str(path), read_bytes=READ, drop_cache=False)
    assert calls == []


@pytest.mark.parametrize("overlap", [True, False])
def test_read_error_is_raised_and_the_reader_stops(tmp_path, monkeypatch, overlap_small, overlap):
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(8 * READ))
    real = os.readv
    reads = []

    def failing(fd, buffers):
        reads.append(fd)
        if len(reads) == 3:
            raise OSError(5, "Input/output error")
        return real(fd, buffers)

    monkeypatch.setattr(fh.os, "readv", failing)
    before = threading.active_count()
    with pytest.raises(OSError, match="Input/output error"):
        fh.file_sha256(str(path), read_bytes=READ, overlap=overlap)
    assert threading.active_count() == before


def test_missing_file_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        fh.file_sha256(str(tmp_path / "absent"))


def test_directory_raises_oserror(tmp_path):
    with pytest.raises(IsADirectoryError):
        fh.file_sha256(str(tmp_path))


def test_read_size_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="read_bytes must be positive, got 0"):
        fh.file_sha256(str(tmp_path), read_bytes=0)
