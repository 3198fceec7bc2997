# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sha256 of one whole file, read in large page-aligned blocks while it is hashed.

A reader thread fills a small ring of page-aligned buffers with large
``read()`` calls while the calling thread digests the buffers already read:
reading (the kernel's copy, or a disk's latency) and hashing overlap, and
``hashlib`` releases the GIL while it digests a large buffer, so the two run on
two cores.  The digest stays the sha256 of the whole file, the digest the hub
names its blobs by; a file is still hashed by one core at a time (sha256 is
sequential), so parallelism across a snapshot comes from hashing several files
at once (``_manifest.hash_many``).

Measured on a 2-core VM (sha_ni, 1.4-1.8 GiB/s of sha256 per core), cold, with
the disk throttled to 1 and 3 GiB/s as well: the kernel's readahead (asked for
with ``POSIX_FADV_SEQUENTIAL``) already overlaps the disk with hashing for
buffered reads, so the reader thread measured within the noise (about 10 %) of
reading and hashing in turn; one core's sha256 bounds each file either way.
The thread keeps a large read in flight where readahead does not (network and
FUSE filesystems, a readahead window tuned small).

With ``drop_cache`` the pages already read are released every
``DROP_WINDOW_BYTES`` while reading, so verifying a checkpoint larger than
memory never fills the page cache (on GB10 it competes with CUDA allocations).

No AnsibleModule here: this file is unit-tested on its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import queue
import threading
from dataclasses import dataclass

MIB = 1024 * 1024
# One read() call: eight times cat's 128 KiB. Measured on a 2-core VM (sha_ni),
# 1 GiB file, cold: 1 MiB reads hashed as fast as 4 and 16 MiB or faster
# (a block still in L2 when it is hashed).
READ_BYTES = MIB
# Buffers in flight: one being hashed, one being read, one ready.
RING_DEPTH = 3
# Below this a thread costs more than it saves: read and hash in turn.
OVERLAP_MIN_BYTES = 8 * MIB
DROP_WINDOW_BYTES = 64 * MIB


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size: int
    mtime_ns: int


def advise(fd: int, advice_name: str, offset: int = 0, length: int = 0) -> None:
    """``posix_fadvise`` where the platform has it; a refusal only costs speed."""
    advice = getattr(os, advice_name, None)
    if advice is not None and hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, advice)


class _Dropper:
    """Releases the pages read so far, one window at a time."""

    def __init__(self, fd: int, enabled: bool) -> None:
        self.fd = fd
        self.enabled = enabled
        self.read = 0
        self.dropped = 0

    def advance(self, count: int) -> None:
        self.read += count
        if self.enabled and self.read - self.dropped >= DROP_WINDOW_BYTES:
            advise(self.fd, "POSIX_FADV_DONTNEED", self.dropped, self.read - self.dropped)
            self.dropped = self.read

    def finish(self) -> None:
        if self.enabled:
            advise(self.fd, "POSIX_FADV_DONTNEED")


def _sequential(fd: int, digest: hashlib._Hash, read_bytes: int, dropper: _Dropper) -> None:
    buf = mmap.mmap(-1, read_bytes)
    view = memoryview(buf)
    try:
        while True:
            count = os.readv(fd, [buf])
            if not count:
                return
            digest.update(view[:count])
            dropper.advance(count)
    finally:
        view.release()
        buf.close()


def _overlapped(
    fd: int, digest: hashlib._Hash, read_bytes: int, depth: int, dropper: _Dropper
) -> None:
    """Hash in this thread what a reader thread reads into a ring of ``depth`` buffers."""
    buffers = [mmap.mmap(-1, read_bytes) for _ in range(max(2, depth))]
    free: queue.Queue[mmap.mmap | None] = queue.Queue()
    filled: queue.Queue[tuple[mmap.mmap | None, int | BaseException]] = queue.Queue()
    for buf in buffers:
        free.put(buf)

    def reader() -> None:
        try:
            while True:
                buf = free.get()
                if buf is None:  # the hashing side gave up
                    return
                count = os.readv(fd, [buf])
                filled.put((buf, count))
                if not count:
                    return
                dropper.advance(count)
        except BaseException as exc:  # handed to the hashing side, raised there
            filled.put((None, exc))

    thread = threading.Thread(target=reader, name="file-hash-reader", daemon=True)
    thread.start()
    try:
        while True:
            buf, count = filled.get()
            if isinstance(count, BaseException):
                raise count
            if not count or buf is None:
                return
            with memoryview(buf) as view:
                digest.update(view[:count])
            free.put(buf)
    finally:
        free.put(None)
        thread.join()
        for buf in buffers:
            buf.close()


def file_sha256(
    path: str,
    read_bytes: int = READ_BYTES,
    drop_cache: bool = False,
    overlap: bool = True,
    depth: int = RING_DEPTH,
) -> FileDigest:
    """The sha256 of ``path`` with its size and mtime as they were when it was opened.

    ``overlap=False`` reads and hashes in turn in this thread (small files do
    so anyway). Raises ``OSError`` when the file cannot be opened or read.
    """
    if read_bytes <= 0:
        raise ValueError(f"read_bytes must be positive, got {read_bytes}")
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        stat = os.fstat(fd)
        advise(fd, "POSIX_FADV_SEQUENTIAL")
        dropper = _Dropper(fd, drop_cache)
        if overlap and stat.st_size >= max(OVERLAP_MIN_BYTES, 2 * read_bytes):
            _overlapped(fd, digest, read_bytes, depth, dropper)
        else:
            _sequential(fd, digest, read_bytes, dropper)
        dropper.finish()
    finally:
        os.close(fd)
    return FileDigest(digest.hexdigest(), stat.st_size, stat.st_mtime_ns)
