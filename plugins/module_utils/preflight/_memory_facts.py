# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse the kernel's memory-pressure evidence: meminfo, PSI, limits, loadavg,
per-process status, cgroup limits, and rank other users' processes by RSS.

The two-Spark field report: the worker had ~20 GiB less free memory than the head because a
second user's processes held 17.56 GB RSS with swap at 13-14 of 15 GB.  These
functions turn that situation into numbers a guard can compare.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

KIB = 1024

_MEMINFO_LINE = re.compile(r"^(?P<key>[A-Za-z0-9_()]+):\s+(?P<value>\d+)(?:\s+kB)?\s*$")
_PSI_LINE = re.compile(r"^(?P<kind>some|full)\s+(?P<fields>.*)$")
_LIMIT_LINE = re.compile(r"^Max locked memory\s+(?P<soft>\S+)\s+(?P<hard>\S+)\s+(?P<unit>\S+)")


class ProcParseError(validate.InputError):
    """The text is not the /proc file it should be."""


# 2**63 has 19 digits: a longer number is no kernel counter, only garbage.
MAX_DIGITS = 19


def _int(text: str, what: str) -> int:
    """A kernel counter; garbage or an absurdly long number is a ProcParseError."""
    value = text.strip()
    if not value.isascii() or not value.isdigit():
        raise ProcParseError(f"{what}: {value[:40]!r} is not a number")
    if len(value) > MAX_DIGITS:
        raise ProcParseError(f"{what}: {value[:40]}... has {len(value)} digits, no kernel counter")
    return int(value)


def _float(text: str, what: str) -> float:
    value = text.strip()
    if len(value) > 40:
        raise ProcParseError(f"{what}: {value[:40]!r}... is not a number")
    try:
        number = float(value)
    except ValueError:
        raise ProcParseError(f"{what}: {value!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise ProcParseError(f"{what}: {value!r} is not a finite, non-negative number")
    return number


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` -> ``{"MemTotal": kib, ...}`` (values in KiB)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = _MEMINFO_LINE.match(line.strip())
        if match:
            key = match.group("key")
            values[key] = _int(match.group("value"), f"meminfo {key}")
    if "MemTotal" not in values:
        raise ProcParseError("no MemTotal line: not /proc/meminfo")
    return values


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    """``/proc/pressure/memory`` -> ``{"some": {"avg10": .., "total": ..}, "full": {..}}``."""
    result: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _PSI_LINE.match(line.strip())
        if not match:
            continue
        fields = {}
        for item in match.group("fields").split():
            key, _, value = item.partition("=")
            what = f"PSI {match.group('kind')} {key}"
            fields[key] = _float(value, what) if key != "total" else _int(value, what)
        result[match.group("kind")] = fields
    if "some" not in result:
        raise ProcParseError("no 'some' line: not a PSI file")
    return result


def parse_loadavg(text: str) -> dict[str, Any]:
    """``/proc/loadavg`` -> load averages and runnable/total tasks."""
    parts = text.split()
    if len(parts) < 4 or "/" not in parts[3]:
        raise ProcParseError(f"unexpected /proc/loadavg content {text[:80]!r}")
    running, _, total = parts[3].partition("/")
    return {
        "1m": _float(parts[0], "loadavg 1m"),
        "5m": _float(parts[1], "loadavg 5m"),
        "15m": _float(parts[2], "loadavg 15m"),
        "runnable": _int(running, "loadavg runnable"),
        "tasks": _int(total, "loadavg tasks"),
    }


def parse_memlock(text: str) -> dict[str, int | None]:
    """``/proc/<pid>/limits`` -> memlock soft/hard in bytes (None = unlimited)."""
    for line in text.splitlines():
        match = _LIMIT_LINE.match(line)
        if match:
            return {
                "soft_bytes": None
                if match.group("soft") == "unlimited"
                else _int(match.group("soft"), "Max locked memory soft limit"),
                "hard_bytes": None
                if match.group("hard") == "unlimited"
                else _int(match.group("hard"), "Max locked memory hard limit"),
            }
    raise ProcParseError("no 'Max locked memory' line: not a limits file")


# Lines every kernel writes in /proc/<pid>/status, kernel threads and zombies included.
STATUS_LINES = ("Name", "State", "Pid", "Uid")


def _status_kib(fields: dict[str, str], key: str) -> int:
    """A ``VmRSS:``-style line, ``<digits> kB``; absent is 0 (no address space)."""
    if key not in fields:
        return 0
    parts = fields[key].split()
    if len(parts) != 2 or parts[1] != "kB":
        raise ProcParseError(f"status {key}: {fields[key][:40]!r} is not '<number> kB'")
    return _int(parts[0], f"status {key}")


def parse_status(text: str) -> dict[str, Any]:
    """``/proc/<pid>/status`` -> name, real uid, RSS in KiB (0 for kernel threads).

    Kernel threads and zombies have no ``Vm*`` lines (no address space): their RSS is 0.
    A file with some ``Vm*`` lines but no ``VmRSS``, a value that is not ``<number> kB``,
    a NUL byte or a missing ``Name``/``State``/``Pid``/``Uid`` line is no status file the
    kernel wrote: a ProcParseError. (Bytes that are not UTF-8 are not: ``Name`` is a process's
    own choice, printed as it is.)
    """
    if "\x00" in text:
        raise ProcParseError("a NUL byte (binary content): not a status file")
    fields: dict[str, str] = {}
    # Lines end in "\n" only: the kernel escapes it in Name, not the other characters
    # str.splitlines() would break a line at, so a name cannot add a field of its own.
    for line in text.split("\n"):
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    if "Uid" not in fields:
        raise ProcParseError("no Uid line: not a status file")
    uid = _int((fields["Uid"].split() or [""])[0], "status Uid")
    missing = [key for key in STATUS_LINES if key not in fields]
    if missing:
        raise ProcParseError(f"no {', '.join(missing)} line: not a status file")
    if "VmRSS" not in fields and any(key.startswith("Vm") for key in fields):
        raise ProcParseError("Vm* lines without a VmRSS line: not a status file")
    return {
        "name": fields["Name"],
        "uid": uid,
        "rss_kib": _status_kib(fields, "VmRSS"),
        "swap_kib": _status_kib(fields, "VmSwap"),
    }


def parse_cgroup_limit(value: str | None) -> int | None:
    """cgroup ``memory.max`` / ``memory.limit_in_bytes`` -> bytes, None when unlimited."""
    if value is None:
        return None
    value = value.strip()
    if not value or value == "max":
        return None
    number = _int(value, "cgroup memory limit")
    # cgroup v1 reports "unlimited" as a page-rounded LONG_MAX.
    if number >= 2**62:
        return None
    return number


def parse_cgroup_usage(usage: str, stat: str | None, inactive_key: str) -> int:
    """cgroup ``memory.current`` minus the reclaimable inactive file cache of ``memory.stat``."""
    used = _int(usage, "cgroup memory usage")
    inactive = 0
    for line in (stat or "").splitlines():
        key, _, value = line.partition(" ")
        if key == inactive_key:
            inactive = _int(value, f"cgroup memory.stat {inactive_key}")
    return max(used - inactive, 0)


def memory_summary(
    meminfo_kib: dict[str, int],
    cgroup_limit_bytes: int | None = None,
    cgroup_usage_bytes: int | None = None,
) -> dict[str, Any]:
    """Totals in bytes; ``effective_available_bytes`` honours a cgroup limit."""
    total = meminfo_kib["MemTotal"] * KIB
    available = meminfo_kib.get("MemAvailable", meminfo_kib.get("MemFree", 0)) * KIB
    swap_total = meminfo_kib.get("SwapTotal", 0) * KIB
    swap_free = meminfo_kib.get("SwapFree", 0) * KIB
    swap_used = swap_total - swap_free
    effective = available
    if cgroup_limit_bytes is not None and cgroup_usage_bytes is not None:
        effective = min(available, max(cgroup_limit_bytes - cgroup_usage_bytes, 0))
    return {
        "mem_total_bytes": total,
        "mem_available_bytes": available,
        "swap_total_bytes": swap_total,
        "swap_free_bytes": swap_free,
        "swap_used_bytes": swap_used,
        "swap_used_percent": round(100.0 * swap_used / swap_total, 1) if swap_total else 0.0,
        "shmem_bytes": meminfo_kib.get("Shmem", 0) * KIB,
        "cgroup_limit_bytes": cgroup_limit_bytes,
        "cgroup_usage_bytes": cgroup_usage_bytes,
        "effective_available_bytes": effective,
    }


def shm_summary(path: str, block_size: int, blocks: int, blocks_available: int) -> dict[str, Any]:
    """statvfs numbers of ``/dev/shm`` -> size/free/used in bytes."""
    size = block_size * blocks
    free = block_size * blocks_available
    return {"path": path, "size_bytes": size, "free_bytes": free, "used_bytes": size - free}


def other_users_processes(
    processes: list[dict[str, Any]],
    own_uids: set[int],
    min_uid: int,
    top: int,
) -> dict[str, Any]:
    """Rank processes of *other* users by RSS and sum them per user.

    ``processes`` items carry ``pid``, ``uid``, ``user``, ``name``, ``rss_kib``
    (and optionally ``cmdline``).  System accounts (uid < ``min_uid``) and
    ``own_uids`` are not "other users".  Nothing here signals a process: the
    memory is reported, never reclaimed (the two-Spark field report).
    """
    others = [
        proc
        for proc in processes
        if proc["uid"] >= min_uid and proc["uid"] not in own_uids and proc["rss_kib"] > 0
    ]
    others.sort(key=lambda proc: (-proc["rss_kib"], proc["pid"]))
    by_user: dict[str, dict[str, Any]] = {}
    for proc in others:
        entry = by_user.setdefault(
            proc["user"], {"user": proc["user"], "uid": proc["uid"], "processes": 0, "rss_bytes": 0}
        )
        entry["processes"] += 1
        entry["rss_bytes"] += proc["rss_kib"] * KIB
    users = sorted(by_user.values(), key=lambda entry: -entry["rss_bytes"])
    return {
        "total_rss_bytes": sum(entry["rss_bytes"] for entry in users),
        "process_count": len(others),
        "by_user": users,
        "top_processes": [
            {
                "pid": proc["pid"],
                "user": proc["user"],
                "uid": proc["uid"],
                "name": proc["name"],
                "cmdline": proc.get("cmdline", ""),
                "rss_bytes": proc["rss_kib"] * KIB,
            }
            for proc in others[:top]
        ],
    }
