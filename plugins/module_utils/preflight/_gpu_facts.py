# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse ``nvidia-smi`` output (table, CSV query, ``-q -x``) into GPU facts.

Unified-memory parts (GB10 in the DGX Spark) report no framebuffer memory:
``Not Supported`` in the table, ``[N/A]`` in CSV, ``N/A`` in XML.  For those
the memory comes from ``/proc/meminfo`` (MemTotal / MemAvailable), which is
the truth on a unified-memory node.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "memory.used",
    "memory.free",
    "pci.bus_id",
    "driver_version",
)

_MISSING = {"", "n/a", "[n/a]", "not supported", "[not supported]", "[unknown error]", "unknown"}
_HEADER_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")
_MEMORY = re.compile(r"^\s*(\d{1,12}(?:\.\d{1,6})?)\s*(MiB|GiB|KiB)?\s*$", re.IGNORECASE)
_TABLE_VERSIONS = re.compile(
    r"Driver Version:\s*(?P<driver>\S+)(?:\s+CUDA Version:\s*(?P<cuda>\S+))?"
)
_TABLE_GPU_ROW = re.compile(
    r"^\|\s+(?P<index>\d+)\s+(?P<name>.+?)\s+(?:On|Off)\s+\|\s+(?P<bus>[0-9A-Fa-f:.]+)\s"
)
_TABLE_MEMORY = re.compile(r"\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|")


class NvidiaSmiParseError(validate.InputError):
    """The text is not the nvidia-smi output we asked for."""


# No GPU index or MiB count needs more digits; a longer number is garbage.
MAX_DIGITS = 12
SMI_NUMBER = {"max_digits": MAX_DIGITS, "error": NvidiaSmiParseError, "fix": "not the nvidia-smi output asked for"}


def _missing(value: str | None) -> bool:
    return value is None or value.strip().lower() in _MISSING


def memory_mib(value: str | None) -> int | None:
    """``"143771 MiB"``/``"143771"`` -> 143771; ``[N/A]``/``Not Supported`` -> None."""
    if _missing(value):
        return None
    match = _MEMORY.match(value or "")
    if not match:
        raise NvidiaSmiParseError(f"unexpected memory value {value!r}")
    number = float(match.group(1))
    unit = (match.group(2) or "MiB").lower()
    factor = {"kib": 1 / 1024, "mib": 1, "gib": 1024}[unit]
    return int(number * factor)


def _text(value: str | None) -> str | None:
    return None if _missing(value) else (value or "").strip()


def _gpu_record(raw: dict[str, str | None]) -> dict[str, Any]:
    index = raw.get("index")
    return {
        "index": validate.counter("GPU index", index, **SMI_NUMBER) if index is not None and not _missing(index) else None,
        "name": _text(raw.get("name")),
        "uuid": _text(raw.get("uuid")),
        "pci_bus_id": _text(raw.get("pci.bus_id")),
        "driver_version": _text(raw.get("driver_version")),
        "memory_total_mib": memory_mib(raw.get("memory.total")),
        "memory_used_mib": memory_mib(raw.get("memory.used")),
        "memory_free_mib": memory_mib(raw.get("memory.free")),
    }


def parse_query_csv(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> list[dict[str, Any]]:
    """Parse ``--query-gpu=... --format=csv`` (with or without header/units).

    With a header the columns are taken from it (units such as ``[MiB]`` are
    dropped); without one, ``fields`` gives the order that was asked for.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    first = [cell.strip() for cell in lines[0].split(",")]
    header_names = [_HEADER_UNIT.sub("", cell) for cell in first]
    if header_names and header_names[0] in (*QUERY_FIELDS, "name", "index"):
        columns = header_names
        rows = lines[1:]
    else:
        columns = list(fields)
        rows = lines
    gpus = []
    for position, row in enumerate(rows):
        cells = [cell.strip() for cell in row.split(",")]
        if len(cells) != len(columns):
            raise NvidiaSmiParseError(
                f"row {position + 1} has {len(cells)} values for {len(columns)} columns: {row!r}"
            )
        record = _gpu_record(dict(zip(columns, cells, strict=True)))
        if record["index"] is None:
            record["index"] = position
        gpus.append(record)
    return gpus


def parse_table(text: str) -> dict[str, Any]:
    """Parse the default ``nvidia-smi`` table: versions and one row per GPU."""
    versions = _TABLE_VERSIONS.search(text)
    if not versions:
        raise NvidiaSmiParseError("no 'Driver Version:' header in nvidia-smi output")
    gpus: list[dict[str, Any]] = []
    lines = text.splitlines()
    for number, line in enumerate(lines):
        row = _TABLE_GPU_ROW.match(line)
        if not row or number + 1 >= len(lines):
            continue
        detail = lines[number + 1]
        memory = _TABLE_MEMORY.search(detail)
        gpus.append(
            {
                "index": validate.counter("GPU index", row.group("index"), **SMI_NUMBER),
                "name": row.group("name").strip(),
                "uuid": None,
                "pci_bus_id": row.group("bus"),
                "driver_version": versions.group("driver"),
                "memory_total_mib": validate.counter("memory", memory.group("total"), **SMI_NUMBER) if memory else None,
                "memory_used_mib": validate.counter("memory", memory.group("used"), **SMI_NUMBER) if memory else None,
                "memory_free_mib": None,
            }
        )
    return {
        "driver_version": versions.group("driver"),
        "cuda_version": versions.group("cuda"),
        "gpus": gpus,
    }


def parse_xml(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi -q -x``."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise NvidiaSmiParseError(f"nvidia-smi -q -x output is not XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiParseError(f"unexpected XML root {root.tag!r}")
    driver = _text(root.findtext("driver_version"))
    gpus = []
    for position, gpu in enumerate(root.findall("gpu")):
        fb = gpu.find("fb_memory_usage")
        minor = gpu.findtext("minor_number")
        raw = {
            "index": minor
            if minor and minor.strip().isascii() and minor.strip().isdigit()
            else str(position),
            "name": gpu.findtext("product_name"),
            "uuid": gpu.findtext("uuid"),
            "pci.bus_id": gpu.get("id") or gpu.findtext("pci/pci_bus_id"),
            "driver_version": driver,
            "memory.total": fb.findtext("total") if fb is not None else None,
            "memory.used": fb.findtext("used") if fb is not None else None,
            "memory.free": fb.findtext("free") if fb is not None else None,
        }
        gpus.append(_gpu_record(raw))
    return {
        "driver_version": driver,
        "cuda_version": _text(root.findtext("cuda_version")),
        "gpus": gpus,
    }


def merge_table(gpus: list[dict[str, Any]], table: dict[str, Any]) -> list[dict[str, Any]]:
    """Fill what CSV left empty (bus id, name) from the table rows, by index."""
    by_index = {gpu["index"]: gpu for gpu in table.get("gpus", [])}
    merged = []
    for gpu in gpus:
        row = by_index.get(gpu["index"], {})
        merged.append(
            {key: value if value is not None else row.get(key) for key, value in gpu.items()}
        )
    return merged


def build_facts(
    gpus: list[dict[str, Any]],
    driver_version: str | None,
    cuda_version: str | None,
    meminfo_kib: dict[str, int] | None,
) -> dict[str, Any]:
    """Assemble ``ansible_facts.gpu``; unified-memory GPUs take /proc/meminfo."""
    total_kib = (meminfo_kib or {}).get("MemTotal")
    available_kib = (meminfo_kib or {}).get("MemAvailable")
    result = []
    for gpu in gpus:
        record = dict(gpu)
        unified = record["memory_total_mib"] is None
        record["unified_memory"] = unified
        if unified:
            record["memory_source"] = "/proc/meminfo" if total_kib is not None else None
            record["memory_total_mib"] = total_kib // 1024 if total_kib is not None else None
            record["memory_free_mib"] = available_kib // 1024 if available_kib is not None else None
            record["memory_used_mib"] = (
                (total_kib - available_kib) // 1024
                if total_kib is not None and available_kib is not None
                else None
            )
        else:
            record["memory_source"] = "nvidia-smi"
            if record["memory_free_mib"] is None and record["memory_used_mib"] is not None:
                record["memory_free_mib"] = record["memory_total_mib"] - record["memory_used_mib"]
        if record.get("driver_version") is None:
            record["driver_version"] = driver_version
        result.append(record)
    free = [gpu["memory_free_mib"] for gpu in result if gpu["memory_free_mib"] is not None]
    unified_any = any(gpu["unified_memory"] for gpu in result)
    return {
        "present": bool(result),
        "count": len(result),
        "driver_version": driver_version,
        "cuda_version": cuda_version,
        "unified_memory": unified_any,
        # On unified memory every GPU sees the same pool: do not add it up twice.
        "total_memory_mib": (
            result[0]["memory_total_mib"]
            if unified_any and result
            else sum(gpu["memory_total_mib"] or 0 for gpu in result)
        ),
        "min_free_memory_mib": min(free) if free else None,
        "gpus": result,
    }
