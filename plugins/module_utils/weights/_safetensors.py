# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""safetensors header sanity: a truncated or malformed shard is caught by its header.

The format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte span, then the data; the spans must cover the
data section exactly.  Reading the header is cheap, so every manifest run
checks it.

No AnsibleModule here: this file is unit-tested on its own (and through
``_manifest``, which re-exports these names).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

# safetensors' own reader refuses headers above 100 MB.
MAX_SAFETENSORS_HEADER = 100_000_000
# Bytes per element for every dtype the safetensors format defines.
SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
    "F4": 0.5,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
}


def safetensors_header_check(
    header_prefix: bytes, header: bytes | None, file_size: int
) -> dict[str, int]:
    """Check a safetensors header against the file size; return a short summary.

    ``header_prefix`` is the file's first 8 bytes, ``header`` the JSON header
    that follows (``None`` when the caller could not read it all).  Raises
    ``ValueError`` with a one-line reason when the file cannot be a complete,
    well-formed safetensors file: the data section must be covered exactly, as
    the format requires, so a truncated copy always fails here.
    """
    if len(header_prefix) < 8 or file_size < 8:
        raise ValueError(
            f"safetensors file too short for its 8-byte header length ({file_size} bytes)"
        )
    (header_len,) = struct.unpack("<Q", header_prefix[:8])
    if header_len > MAX_SAFETENSORS_HEADER:
        raise ValueError(f"safetensors header length {header_len} exceeds {MAX_SAFETENSORS_HEADER}")
    if 8 + header_len > file_size:
        raise ValueError(
            f"safetensors header length {header_len} runs past the end of the file ({file_size} bytes)"
        )
    if header is None or len(header) != header_len:
        raise ValueError("safetensors header could not be read in full")
    try:
        parsed = json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"safetensors header is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(parsed, dict):
        raise ValueError("safetensors header is not a JSON object")
    data_len = file_size - 8 - header_len
    spans = sorted(
        _tensor_span(name, info, file_size) for name, info in parsed.items() if name != "__metadata__"
    )
    _check_coverage(spans, data_len)
    return {"tensors": len(spans), "header_bytes": header_len}


def _tensor_span(name: str, info: Any, file_size: int) -> tuple[int, int, str]:
    """``(begin, end, name)`` of one tensor, its bytes matching its dtype and shape."""
    if not isinstance(info, dict):
        raise ValueError(f"safetensors tensor {name!r}: entry is not an object")
    dtype = info.get("dtype")
    shape = info.get("shape")
    offsets = info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_BYTES:
        raise ValueError(f"safetensors tensor {name!r}: unknown dtype {dtype!r:.80}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValueError(f"safetensors tensor {name!r}: bad shape {shape!r:.80}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise ValueError(f"safetensors tensor {name!r}: bad data_offsets {offsets!r}")
    elements = 1
    for dim in shape:
        elements *= dim
        if elements > file_size * 8:  # more elements than bits: no such file
            raise ValueError(
                f"safetensors tensor {name!r}: shape {shape!r} is larger than the file"
            )
    expected = elements * SAFETENSORS_DTYPE_BYTES[dtype]
    if offsets[1] - offsets[0] != expected:
        raise ValueError(
            f"safetensors tensor {name!r}: {offsets[1] - offsets[0]} bytes for "
            f"{dtype}{shape} (expected {expected:g})"
        )
    return offsets[0], offsets[1], name


def _check_coverage(spans: list[tuple[int, int, str]], data_len: int) -> None:
    """The tensors, in order, cover the data section exactly: no hole, no overlap, no tail."""
    cursor = 0
    for begin, end, name in spans:
        if begin != cursor:
            raise ValueError(
                f"safetensors tensor {name!r} starts at {begin}, expected {cursor} (hole or overlap)"
            )
        cursor = end
    if cursor != data_len:
        raise ValueError(
            f"safetensors data section is {data_len} bytes but the tensors cover {cursor}"
            + (" (file truncated?)" if data_len < cursor else "")
        )


def read_safetensors_summary(path: str) -> dict[str, int]:
    """Read a safetensors file's header only and check it (raises ValueError)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        prefix = handle.read(8)
        header = None
        if len(prefix) == 8:
            (header_len,) = struct.unpack("<Q", prefix)
            if 8 + header_len <= size and header_len <= MAX_SAFETENSORS_HEADER:
                header = handle.read(header_len)
    return safetensors_header_check(prefix, header, size)
