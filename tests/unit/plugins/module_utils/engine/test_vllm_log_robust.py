# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM log parser on garbage: never a bare exception, linear on large journals."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_log import (
    LogEmptyError,
    LogInputError,
    _unwrap,
    check_log_text,
    decode_log,
    parse_log,
    recognised,
)

FIXTURES = Path(__file__).resolve().parents[4] / "unit" / "fixtures" / "vllm-logs"
SEED002 = FIXTURES / "seed002-rtx-pro-6000.log"


def _quadratic_unwrap(text: str) -> list[str]:
    """The old unwrapper, kept as the reference for what joining means."""
    joined: list[str] = []
    for line in text.splitlines():
        if joined and joined[-1].strip() and "a" <= line[:1] <= "z":
            joined[-1] = f"{joined[-1].rstrip()} {line.strip()}"
        else:
            joined.append(line)
    return joined


@pytest.mark.parametrize(
    "text",
    [
        "",
        "A\nb\nc",
        "A  \n  \nb\nC\nd   \ne",
        "\nb\nA\n\nb",
        "ERROR x\nwrapped tail\nINFO next\n",
        "a\nb\nc",
        SEED002.read_text(),
    ],
)
def test_linear_unwrap_joins_as_before(text):
    assert _unwrap(text) == _quadratic_unwrap(text)


def test_200000_line_journal_parses():
    """A large journal (every line a hard-wrapped continuation) parses in linear time."""
    lines = ["Aug 04 02:44:21 host vllm[1]: INFO GPU KV cache size: 47,930 tokens"]
    lines += [f"continuation {i} of a wrapped message" for i in range(200_000)]
    started = time.monotonic()
    parsed = parse_log("\n".join(lines))
    print(f"200,000 wrapped lines parsed in {time.monotonic() - started:.2f} s")
    assert parsed["kv_cache_tokens"] == 47930
    assert parsed["errors"] == []


GARBAGE_LINES = [
    "GPU KV cache size: " + "9" * 5000 + " tokens",
    "Maximum concurrency for 4096 tokens per request: ...x",
    "Maximum concurrency for 4096 tokens per request: 1" + "0" * 400 + ".0x",
    "Available KV cache memory: 1.2.3 GiB",
    "reserved 9" + "9" * 400 + " GiB memory for KV Cache as specified by kv_cache_memory_bytes",
    "non-default args: {'max_model_len': 1.2.3, 'kv_cache_memory_bytes': " + "9" * 5000 + "}",
    "vllm:kv_offload_store_bytes=-e+ vllm:kv_offload_load_time=1e999",
    "Per-position acceptance rate: .., ...",
    "Avg prompt throughput: 1.2.3 tokens/s, Running: " + "9" * 5000 + " reqs",
    "OOM on device 0 while trying to allocate " + "9" * 5000 + " bytes",
    "out of memory. Tried to allocate 1" + "0" * 400 + " GiB",
    "rank=[" + "9" * 5000 + "] died unexpectedly",
    "maximum context length is " + "9" * 5000 + " tokens. However, you requested 1 output tokens"
    " and your prompt contains at least 1 input tokens",
    "\x00\x01\x02 binary \ufffd\ufffd",
    "ValueError: " + "x" * 200_000,
    "a" * 200_000 + "Error: x",
]


@pytest.mark.parametrize("line", GARBAGE_LINES, ids=range(len(GARBAGE_LINES)))
def test_garbage_never_raises(line):
    parsed = parse_log("INFO start\n" + line + "\nINFO end")
    assert isinstance(parsed["unparsed_lines"]["count"], int)
    assert parsed["kv_transfer"] == {} or all(
        v < float("inf") for v in parsed["kv_transfer"].values()
    )


def test_numbers_vllm_never_prints_are_counted_not_guessed():
    parsed = parse_log("GPU KV cache size: 1,234 tokens\nAvailable KV cache memory: 1.2.3 GiB\n")
    assert parsed["kv_cache_tokens"] == 1234
    assert parsed["unparsed_lines"]["count"] == 1
    assert "1.2.3" in parsed["unparsed_lines"]["samples"][0]


def test_a_19_digit_count_is_not_read_as_its_first_18_digits():
    parsed = parse_log("GPU KV cache size: 1234567890123456789 tokens")
    assert parsed["kv_cache_tokens"] is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x7fELF\x02\x01\x01\x00\x00", "is not text: NUL byte at offset 7"),
        (bytes(range(128, 256)) * 8, "is not text: 1024 of 1024 bytes are not UTF-8"),
    ],
)
def test_binary_logs_are_not_text(data, message):
    with pytest.raises(LogInputError, match="path /x.log " + message):
        decode_log(data, "path /x.log")


def test_text_with_a_few_bad_bytes_is_still_a_log():
    text = decode_log(b"INFO a line of a log\n" * 100 + b"tqdm \xff\n" * 10, "path /x.log")
    assert text.count("\ufffd") == 10


@pytest.mark.parametrize("text", ["", " \n\t\n", "-- No entries --\n"])
def test_empty_logs(text):
    with pytest.raises(LogEmptyError, match="the log is empty: unit u has no lines"):
        check_log_text(text, "unit u")


def test_recognised():
    assert not recognised(parse_log("hello\nworld"))
    assert recognised(parse_log(SEED002.read_text()))
