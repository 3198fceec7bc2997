# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Log text read defensively: bytes that must be text, lines that may be wrapped,
numbers that must be numbers vLLM could print.

A journal or log file can be empty (a misspelled unit), binary (a journal file
read directly), gigantic, or carry lines that match a vLLM pattern with a
number no vLLM prints.  These helpers turn each case into a clear error or a
counted oddity, never a bare ``ValueError``, ``UnicodeDecodeError`` or
``OverflowError``, and keep the work linear in the size of the log.

No AnsibleModule here: this file is unit-tested on its own (through ``_vllm_log``).
"""

from __future__ import annotations

import math

# Longer numbers are no count vLLM prints; they are garbage, and int() of thousands
# of digits raises ValueError (or hangs), float() of them gives inf.
MAX_DIGITS = 18
# Lines longer than this are parsed only up to here: vLLM's longest lines (the
# non-default args, a traceback's last frame) are a few KiB.
MAX_LINE = 65536


class NotAVllmNumber(ValueError):
    """A line matched a pattern but its number is no number vLLM prints."""


class LogInputError(ValueError):
    """The log cannot be read as text, or is empty; the message names the source."""


class LogEmptyError(LogInputError):
    """The log has no line at all."""


def count(text: str) -> int:
    digits = text.strip().replace(",", "")
    if not digits.isascii() or not digits.isdigit() or len(digits) > MAX_DIGITS:
        raise NotAVllmNumber(text[:40])
    return int(digits)


def number(text: str) -> float:
    value = text.strip()
    if len(value) > 40:
        raise NotAVllmNumber(value[:40])
    try:
        number = float(value)
    except ValueError:
        raise NotAVllmNumber(value) from None
    if not math.isfinite(number):
        raise NotAVllmNumber(value)
    return number


def decode_log(data: bytes, origin: str) -> str:
    """The bytes of a log as text; raises LogInputError when they are not text."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise LogInputError(
            f"{origin} is not text: NUL byte at offset {nul} (a binary file, or a"
            " journal file read directly: read it with unit and source=journal)"
        )
    text = data.decode("utf-8", errors="replace")
    undecodable = text.count("\ufffd")
    if undecodable > max(16, len(text) // 100):
        raise LogInputError(
            f"{origin} is not text: {undecodable} of {len(data)} bytes are not UTF-8"
        )
    return text


def check_log_text(text: str, origin: str) -> None:
    """Raise LogInputError when ``text`` is empty or not text."""
    if "\x00" in text:
        raise LogInputError(f"{origin} is not text: it contains NUL characters")
    stripped = text.strip()
    if not stripped or stripped == "-- No entries --":
        raise LogEmptyError(f"the log is empty: {origin} has no lines")


def unwrap(text: str) -> list[str]:
    """Lines; a hard-wrapped continuation (starts lower-case) joins its line.

    Linear in the text: the pieces of a line are joined once, and a line
    stops growing at ``MAX_LINE`` (a log of only lower-case lines would
    otherwise become one line rebuilt at every step).
    """
    joined: list[str] = []
    pieces: list[str] = []
    size = 0
    for line in text.splitlines():
        if pieces and size < MAX_LINE and "a" <= line[:1] <= "z":
            pieces[-1] = pieces[-1].rstrip()
            piece = " " + line.strip()
            pieces.append(piece)
            size += len(piece)
            continue
        if pieces:
            joined.append("".join(pieces))
        # only a non-blank line can be continued
        pieces = [line] if line.strip() else []
        size = len(line)
        if not pieces:
            joined.append(line)
    if pieces:
        joined.append("".join(pieces))
    return joined
