# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one bounded file reader (``common/_files.py``): a case table over real files."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._files import (
    read_bytes,
    read_text,
    read_text_or_none,
)

# (case, file content, limit) -> read_bytes, read_bytes(whole=True) (None: OverflowError)
BYTES = [
    ("shorter-than-the-limit", b"1500\n", 16, b"1500\n", b"1500\n"),
    ("exactly-the-limit", b"abcd", 4, b"abcd", b"abcd"),
    ("longer-is-cut-or-refused", b"abcdef", 4, b"abcd", None),
    ("empty", b"", 4, b"", b""),
]  # fmt: skip


@pytest.mark.parametrize(("content", "limit", "cut", "whole"), [c[1:] for c in BYTES],
                         ids=[c[0] for c in BYTES])  # fmt: skip
def test_read_bytes(tmp_path: Path, content: bytes, limit: int, cut: bytes, whole: bytes | None) -> None:
    path = tmp_path / "f"
    path.write_bytes(content)
    assert read_bytes(str(path), limit) == cut
    if whole is None:
        with pytest.raises(OverflowError, match=f"larger than {limit} bytes"):
            read_bytes(str(path), limit, whole=True)
    else:
        assert read_bytes(str(path), limit, whole=True) == whole


def test_read_text_is_bounded_and_strict_unless_told(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"RoCE v2\nmore")
    assert read_text(str(path), 7) == "RoCE v2"
    path.write_bytes(b"\xff\xfe1")
    with pytest.raises(UnicodeDecodeError):
        read_text(str(path), 64)
    assert read_text(str(path), 64, errors="replace") == "\ufffd\ufffd1"


def test_read_text_or_none_answers_none_for_what_cannot_be_read(tmp_path: Path) -> None:
    assert read_text_or_none(str(tmp_path / "missing"), 64) is None
    assert read_text_or_none(str(tmp_path), 64) is None  # a directory
    (tmp_path / "bad").write_bytes(b"\xff")
    assert read_text_or_none(str(tmp_path / "bad"), 64) is None
    (tmp_path / "ok").write_text("0x1234\n")
    assert read_text_or_none(str(tmp_path / "ok"), 64) == "0x1234\n"
