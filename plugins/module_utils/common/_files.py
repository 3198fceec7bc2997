# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One bounded file reader: nothing on a node is read without a size limit.

A /proc or sysfs file, a unit, a key or a state file may be larger than expected
(a loop, a wrong path, someone else's file); reading at most ``limit`` keeps the
memory of a facts module or a node program bounded whatever the file holds.

Every read of a node's file in plugins/ goes through this file (tests/unit/test_one_validator.py
holds the few stream readers that cannot: a hash with read-ahead hints, a safetensors header,
/dev/kmsg).  The helpers below are the policies the callers share: :func:`read_kernel_text`
(a /proc or cgroup file, None when gone), :func:`read_sysfs` (one sysfs attribute),
:func:`read_regular` (a file the collection wrote: regular, within its limit, or a
:class:`FileError` naming it), :func:`read_tail` and :func:`hash_into`.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

# A /proc or cgroup text file is a few KiB; a larger one is not what it claims to be.
MAX_KERNEL_TEXT = 1024 * 1024
# A sysfs attribute (mtu, operstate, a GID) is one short line.
MAX_SYSFS = 4096
# Files are hashed in blocks of this size.
HASH_BLOCK = 1024 * 1024


class FileError(validate.InputError):
    """A file that is not what it should be: not a regular file, too large, unreadable.

    The message names the file and what is wrong; the caller adds the fix it knows.
    """


class FileTooLarge(validate.Error, OverflowError):
    """A file holding more than its limit, for a parser that must not judge half a file."""


def read_bytes(path: str, limit: int, *, whole: bool = False) -> bytes:
    """At most ``limit`` bytes of ``path``.

    With ``whole``, a file holding more raises :class:`FileTooLarge` (an OverflowError)
    instead of being cut: for parsers that must not judge half a file. OSError passes through.
    """
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        if whole:
            raise FileTooLarge(f"{path} is larger than {limit} bytes")
        data = data[:limit]
    return data


def read_text(path: str, limit: int, *, errors: str = "strict") -> str:
    """At most ``limit`` characters of ``path`` as UTF-8 text.

    OSError passes through, and UnicodeDecodeError when ``errors`` is ``strict``.
    """
    with open(path, encoding="utf-8", errors=errors) as handle:
        return handle.read(limit)


def read_text_or_none(path: str, limit: int, *, errors: str = "strict") -> str | None:
    """``read_text``, or None when the file is missing, unreadable or not UTF-8.

    An unused sysfs slot answers EINVAL on a real kernel: that is "no value", not a failure.
    """
    try:
        return read_text(path, limit, errors=errors)
    except (OSError, ValueError):  # UnicodeDecodeError, or a NUL byte in the path
        return None


def read_kernel_text(path: str, limit: int = MAX_KERNEL_TEXT) -> str | None:
    """A /proc or cgroup file as text (bytes that are not UTF-8 replaced); None when unreadable.

    A process's files vanish when it exits while they are listed: that is "no value".
    """
    return read_text_or_none(path, limit, errors="replace")


def read_sysfs(path: str, limit: int = MAX_SYSFS) -> str | None:
    """A sysfs attribute's text, stripped; None when unreadable or not text (NUL bytes, not ASCII)."""
    try:
        data = read_bytes(path, limit)
    except (OSError, ValueError):
        return None
    if b"\x00" in data:
        return None
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        return None


def read_regular(path: str, limit: int) -> bytes | None:
    """The bytes of a regular file of at most ``limit`` bytes; None when it does not exist.

    A directory, a device or FIFO (never opened: a FIFO would block), a larger file and an
    unreadable one raise :class:`FileError` naming the file.  Links are followed.
    """
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise FileError(f"{path} cannot be read ({exc.strerror})") from None
    if stat.S_ISDIR(info.st_mode):
        raise FileError(f"{path} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise FileError(f"{path} is not a regular file")
    if info.st_size > limit:
        raise FileError(f"{path} is {info.st_size} bytes, more than {limit}: not the file it should be")
    try:
        return read_bytes(path, limit, whole=True)
    except OSError as exc:
        raise FileError(f"{path} cannot be read ({exc.strerror})") from None
    except OverflowError:
        raise FileError(f"{path} grew past {limit} bytes while read: not the file it should be") from None


def read_tail(path: str, limit: int) -> tuple[bytes, int]:
    """The last ``limit`` bytes of a regular file, and its size (a FIFO would block: OSError).

    The first line of a cut tail may be partial; the caller drops it when the size is larger.
    """
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise FileError(f"{path}: not a regular file")
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - limit))
        return handle.read(limit), size


def hash_into(path: str, *hashes: Any) -> None:
    """Feed the whole of ``path``, read once in blocks, to each of ``hashes`` (hashlib objects).

    A file of any size, in constant memory; OSError passes through.
    """
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(HASH_BLOCK), b""):
            for item in hashes:
                item.update(block)
