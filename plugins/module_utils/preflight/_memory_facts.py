# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse the kernel's memory-pressure evidence: meminfo, PSI, limits, loadavg,
per-process status, cgroup limits, and rank other users' processes by RSS.

The two-Spark field report: the worker had ~20 GiB less free memory than the head because a
second user's processes held 17.56 GB RSS with swap at 13-14 of 15 GB.  These
functions turn that situation into numbers a guard can compare.
"""

from __future__ import annotations

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


# How a number the kernel wrote is read (``validate.counter``/``number``): garbage, a sign
# or a fraction where a counter belongs, NaN or a number of more than 19 digits (2**63 has
# 19) are a ProcParseError naming the field.
KERNEL = {"error": ProcParseError, "fix": "not the file the kernel writes"}


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` -> ``{"MemTotal": kib, ...}`` (values in KiB)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = _MEMINFO_LINE.match(line.strip())
        if match:
            key = match.group("key")
            values[key] = validate.counter(f"meminfo {key}", match.group("value"), **KERNEL)
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
            if key == "total":
                fields[key] = validate.counter(what, value, **KERNEL)
            else:
                fields[key] = validate.number(what, value, minimum=0, **KERNEL)
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
        "1m": validate.number("loadavg 1m", parts[0], minimum=0, **KERNEL),
        "5m": validate.number("loadavg 5m", parts[1], minimum=0, **KERNEL),
        "15m": validate.number("loadavg 15m", parts[2], minimum=0, **KERNEL),
        "runnable": validate.counter("loadavg runnable", running, **KERNEL),
        "tasks": validate.counter("loadavg tasks", total, **KERNEL),
    }


def parse_memlock(text: str) -> dict[str, int | None]:
    """``/proc/<pid>/limits`` -> memlock soft/hard in bytes (None = unlimited)."""
    for line in text.splitlines():
        match = _LIMIT_LINE.match(line)
        if match:
            return {
                "soft_bytes": None
                if match.group("soft") == "unlimited"
                else validate.counter("Max locked memory soft limit", match.group("soft"), **KERNEL),
                "hard_bytes": None
                if match.group("hard") == "unlimited"
                else validate.counter("Max locked memory hard limit", match.group("hard"), **KERNEL),
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
    return validate.counter(f"status {key}", parts[0], **KERNEL)


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
    uid = validate.counter("status Uid", (fields["Uid"].split() or [""])[0], **KERNEL)
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
    number = validate.counter("cgroup memory limit", value, **KERNEL)
    # cgroup v1 reports "unlimited" as a page-rounded LONG_MAX.
    if number >= 2**62:
        return None
    return number


def parse_cgroup_usage(usage: str, stat: str | None, inactive_key: str) -> int:
    """cgroup ``memory.current`` minus the reclaimable inactive file cache of ``memory.stat``."""
    used = validate.counter("cgroup memory usage", usage, **KERNEL)
    inactive = 0
    for line in (stat or "").splitlines():
        key, _, value = line.partition(" ")
        if key == inactive_key:
            inactive = validate.counter(f"cgroup memory.stat {inactive_key}", value, **KERNEL)
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
