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

import re

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

# Longer numbers are no count vLLM prints; they are garbage, and int() of thousands
# of digits raises ValueError (or hangs), float() of them gives inf.
MAX_DIGITS = 18
# Lines longer than this are parsed only up to here: vLLM's longest lines (the
# non-default args, a traceback's last frame) are a few KiB.
MAX_LINE = 65536


class NotAVllmNumber(validate.InputError):
    """A line matched a pattern but its number is no number vLLM prints."""


class LogInputError(validate.InputError):
    """The log cannot be read as text, or is empty; the message names the source."""


class LogEmptyError(LogInputError):
    """The log has no line at all."""


def count(text: str) -> int:
    """A count as vLLM prints it (``1,234``): ``validate.counter`` of at most MAX_DIGITS digits."""
    return validate.counter(
        "vLLM count", text.replace(",", ""), max_digits=MAX_DIGITS, error=NotAVllmNumber
    )


def number(text: str) -> float:
    """A number as vLLM prints it: ``validate.number`` (NaN and infinity are none)."""
    return validate.number("vLLM number", text.strip(), error=NotAVllmNumber)


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


# What people paste around a log: terminal colours (also with the ESC byte lost or
# spelt out), HTML colour spans, quote gutters, code fences and backticks, and the
# prefixes docker compose or SLURM put before each line.
_ANSI = re.compile(r"(?:\x1b|\ufffd|\^\[|ESC)\[[0-9;?]{0,16}[A-Za-z]|\x1b\][^\x07]{0,200}\x07")
_HTML_TAG = re.compile(
    r"</?(?:span|font|code|pre|samp|kbd|b|i|em|strong|div|p|br)\b[^<>]{0,300}>", re.IGNORECASE
)
_ENTITIES = {"&lt;": "<", "&gt;": ">", "&quot;": '"', "&#39;": "'", "&#x27;": "'", "&nbsp;": " "}
_ENTITY = re.compile("|".join(map(re.escape, [*_ENTITIES, "&amp;"])))
_GUTTER = re.compile(r"^(?:[ \t]{0,3}(?:>|\u258e|\u2502|\u2503|\|)(?:[ \t]|$))+")
_FENCE = re.compile(r"^\s*(?:```|~~~)[\w+-]*\s*$")
_COMPOSE = re.compile(r"^[A-Za-z0-9][\w.-]{0,80}[ \t]+\|[ \t]?")
_SLURM = re.compile(r"^\d{1,5}: (?=\S)")
# A terminal (or the page it was pasted from) broke a line inside a word: these
# words, printed by vLLM in the lines this collection reads, are joined without a space.
VLLM_WORDS = frozenset(
    [
        "available",
        "blocks",
        "cache",
        "concurrency",
        "configuration",
        "decreasing",
        "engine",
        "estimated",
        "gpu_memory_utilization",
        "increasing",
        "initializing",
        "kv_cache_memory_bytes",
        "kv_cache_size",
        "larger",
        "length",
        "maximum",
        "max_model_len",
        "max_num_batched_tokens",
        "max_num_seqs",
        "max_seq_len",
        "memory",
        "model",
        "needed",
        "observabilityconfig",
        "decodingconfig",
        "structuredoutputsconfig",
        "compilationconfig",
        "profiling",
        "request",
        "reserved",
        "serve",
        "served_model_name",
        "skipped",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "tokens",
        "utilization",
    ]
)
_WORD_END = re.compile(r"[A-Za-z0-9_]+$")
_WORD_START = re.compile(r"^[A-Za-z0-9_]+")
_SPLIT_KEY = re.compile(r"^[a-z0-9_]*_[a-z0-9_]*(?:=|':|\":)")
# a wrapped line's continuation indented this much further than the text (a hand wrap)
_HANGING_INDENT = 8


def clean_line(line: str) -> str:
    """One pasted line without colours, HTML, quote gutter, fence, backticks or prefixes."""
    if "\x1b" in line or "[" in line:
        line = _ANSI.sub("", line)
    if "<" in line:
        line = _HTML_TAG.sub("", line)
    if "&" in line:
        line = _ENTITY.sub(lambda m: _ENTITIES.get(m.group(0), "&"), line)
    line = _GUTTER.sub("", line)
    if _FENCE.match(line):
        return ""
    body = line.lstrip()
    if body.startswith("`") or line.rstrip().endswith("`"):
        indent = line[: len(line) - len(body)]
        stripped = body.strip().strip("`").strip()
        # an inline-code paste; a line with backticks inside keeps them
        line = indent + stripped if stripped else ""
    body = line.lstrip()
    indent = line[: len(line) - len(body)]
    body = _SLURM.sub("", _COMPOSE.sub("", body, count=1), count=1)
    return indent + body


def _joiner(previous: str, raw_previous: str, piece: str) -> str:
    """How a continuation joins its line: "" inside a word vLLM prints, else a space."""
    if raw_previous != raw_previous.rstrip() or not previous:
        return " "
    tail = _WORD_END.search(previous)
    head = _WORD_START.match(piece)
    if not tail or not head:
        return " "
    if tail.group(0).endswith("_") or head.group(0).startswith("_"):
        return ""
    if (tail.group(0) + head.group(0)).lower() in VLLM_WORDS or _SPLIT_KEY.match(piece):
        return ""
    return " "


def unwrap(text: str) -> list[str]:
    """Lines as vLLM printed them, from text as people paste it.

    Each line is cleaned (:func:`clean_line`), the indentation common to the
    text is removed, and a line a terminal or an editor wrapped is joined to
    its line: a continuation starts lower-case or with ``_``, or is indented
    at least eight columns deeper (a hand wrap). Inside a word vLLM prints
    (``served_model`` + ``_name``, ``ObservabilityConf`` + ``ig``) the pieces
    join without a space.

    Linear in the text: the pieces of a line are joined once, and a line
    stops growing at ``MAX_LINE`` (a log of only lower-case lines would
    otherwise become one line rebuilt at every step).
    """
    raw = text.splitlines()
    cleaned = [clean_line(line) for line in raw]
    indents = [len(c) - len(c.lstrip()) for c in cleaned if c.strip()]
    common = min(indents) if indents else 0
    joined: list[str] = []
    pieces: list[str] = []
    last_raw = ""
    size = 0
    for original, line in zip(raw, cleaned, strict=True):
        if common:
            line = line[common:] if line[:common].isspace() else line.lstrip()
        hanging = len(line) - len(line.lstrip()) >= _HANGING_INDENT
        head = line[:1]
        if (
            pieces
            and size < MAX_LINE
            and line.strip()
            and ("a" <= head <= "z" or head == "_" or hanging)
        ):
            piece = line.strip()
            pieces[-1] = pieces[-1].rstrip()
            joiner = " " if hanging else _joiner(pieces[-1], last_raw, piece)
            pieces.append(joiner + piece)
            size += len(piece) + 1
            last_raw = original
            continue
        if pieces:
            joined.append("".join(pieces))
        # only a non-blank line can be continued
        pieces = [line] if line.strip() else []
        size = len(line)
        last_raw = original
        if not pieces:
            joined.append(line)
    if pieces:
        joined.append("".join(pieces))
    return joined
