# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One bounded file reader: nothing on a node is read without a size limit.

A /proc or sysfs file, a unit, a key or a state file may be larger than expected
(a loop, a wrong path, someone else's file); reading at most ``limit`` keeps the
memory of a facts module or a node program bounded whatever the file holds.
"""

from __future__ import annotations


def read_bytes(path: str, limit: int, *, whole: bool = False) -> bytes:
    """At most ``limit`` bytes of ``path``.

    With ``whole``, a file holding more raises OverflowError instead of being cut:
    for parsers that must not judge half a file. OSError passes through.
    """
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        if whole:
            raise OverflowError(f"{path} is larger than {limit} bytes")
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
    except (OSError, UnicodeDecodeError):
        return None
