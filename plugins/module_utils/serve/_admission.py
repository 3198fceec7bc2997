# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Admission at start (F4): has this rank, right now, the memory the plan needs?

Preflight measures memory minutes or hours before a start; a second tenant can
take it in between (the two-Spark field report: another user's 17.56 GB on the worker) and
the rank then OOMs, or on GB10 unified memory freezes the host. This check runs
immediately before the engine starts, on every rank, as the serving unit's
``ExecStartPre``, and refuses the start when

    available = min(MemAvailable, headroom of every limited cgroup level of the unit)
    available < need (this rank's share of the plan) + reserve

A cgroup level's headroom is its limit (``memory.max``, or ``memory.high`` when
lower; v1 ``memory.limit_in_bytes``) minus its usage (``memory.current``; v1
``memory.usage_in_bytes``) less its reclaimable inactive file cache, for the
unit's own cgroup and each parent up to the mount root: the lowest wins. A
refusal names the largest processes by RSS (``/proc/*/status``), the engine's
own excluded, so the operator knows whom to ask; nothing is ever signalled.

Besides being imported by the ``localinference.vllm.memory_admission`` module, this file
is installed on the nodes as a program (``/usr/local/libexec/localinference/admission``,
built by ``common/_embed.py`` with what it imports, since the collection is not installed
there). ``main()`` exits 0 to admit and 1 to refuse (also
when the evidence cannot be read: fail closed), with one line on stderr that starts with
``REFUSAL_MARKER`` (the rollout quotes it when a start fails). ``--drop-caches`` (unified
memory: NVIDIA's advice for GB10) first writes back dirty pages and drops the clean page
cache, so the engine's own view of free memory is not crowded by cache; the measurement after
it is the same (``MemAvailable`` already counts reclaimable cache).
/proc/meminfo and /proc/<pid>/status are read by preflight's ``_memory_facts`` parsers, the
files through ``common/_files``: one parser and one reader for the preflight and the start.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._files import (
    read_kernel_text,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    ProcParseError,
    parse_meminfo,
    parse_status,
)

KIB = 1024
GIB = 1024**3
ADMIT, REFUSE, USAGE = 0, 1, 2
DOC = "docs/failure-catalog.md#f4"
# The first words of every refusal line; the serve role finds the line in the unit's journal.
REFUSAL_MARKER = "localinference admission refused the start"
DROP_CACHES = "/proc/sys/vm/drop_caches"
# cgroup v1 reports "no limit" as a page-rounded LONG_MAX.
UNLIMITED = 2**62


class AdmissionError(validate.Error):
    """Evidence that cannot be read or makes no sense; the check refuses (fails closed)."""


def mem_available(meminfo: str) -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes."""
    try:
        values = parse_meminfo(meminfo)
    except ProcParseError as exc:
        raise AdmissionError(f"/proc/meminfo: {exc}") from None
    if "MemAvailable" not in values:
        raise AdmissionError("/proc/meminfo has no MemAvailable line")
    return values["MemAvailable"] * KIB


# --- cgroups ---------------------------------------------------------------------------------


def own_cgroups(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` -> ``{"v2": path, "memory": path}`` (whichever exist)."""
    out = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            out["v2"] = path.strip()
        elif "memory" in controllers.split(","):
            out["memory"] = path.strip()
    return out


def cgroup_mounts(mountinfo: str) -> dict[str, tuple[str, str]]:
    """``/proc/self/mountinfo`` -> ``{"v2": (mount point, root), "memory": (...)}``."""
    out: dict[str, tuple[str, str]] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, point = fields[3], fields[4]
        if tail[0] == "cgroup2" and "v2" not in out:
            out["v2"] = (point, root)
        elif tail[0] == "cgroup" and "memory" in tail[2].split(",") and "memory" not in out:
            out["memory"] = (point, root)
    return out


def _levels(point: str, root: str, path: str, exists: Callable[[str], bool]) -> list[str]:
    """Directories of ``path`` and its parents inside the mount, deepest first.

    Inside a container the mount's root is the container's own cgroup, and the path
    in ``/proc/<pid>/cgroup`` may be given relative to the host or to that root: the
    reading whose directory exists deepest wins. A cgroup that does not exist (a unit
    that is not running) is judged by its nearest existing parent.
    """
    path = "/" + path.strip("/")
    root = "/" + root.strip("/")
    candidates = [path]
    if root != "/" and (path == root or path.startswith(root + "/")):
        candidates.insert(0, path[len(root) :] or "/")
    best: list[str] = []
    for candidate in candidates:
        current = os.path.normpath(os.path.join(point, candidate.strip("/")))
        levels = []
        while True:
            if levels or exists(current):
                levels.append(current)
            parent = os.path.dirname(current)
            if current == os.path.normpath(point) or parent == current:
                break
            current = parent
        if len(levels) > len(best):
            best = levels
    return best


_FILES = {
    "v2": (("memory.max", "memory.high"), "memory.current", "inactive_file"),
    "memory": (("memory.limit_in_bytes",), "memory.usage_in_bytes", "total_inactive_file"),
}


def cgroup_headroom(
    version: str, levels: Sequence[str], read: Callable[[str], str | None] = read_kernel_text
) -> list[dict[str, Any]]:
    """Each limited level: ``{path, limit_bytes, usage_bytes, headroom_bytes}``."""
    limit_files, usage_file, inactive_key = _FILES[version]
    out = []
    for level in levels:
        limits = []
        for name in limit_files:
            text = read(os.path.join(level, name))
            if text is None or text.strip() in ("", "max"):
                continue
            value = validate.counter(os.path.join(level, name), text, error=AdmissionError)
            if value < UNLIMITED:
                limits.append(value)
        if not limits:
            continue
        usage_text = read(os.path.join(level, usage_file))
        if usage_text is None:
            raise AdmissionError(f"{level} is limited but {usage_file} cannot be read")
        usage = validate.counter(os.path.join(level, usage_file), usage_text, error=AdmissionError)
        inactive = 0
        for line in (read(os.path.join(level, "memory.stat")) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = validate.counter(
                    f"{level}/memory.stat {inactive_key}", value, error=AdmissionError
                )
        used = max(usage - inactive, 0)
        out.append(
            {
                "path": level,
                "limit_bytes": min(limits),
                "usage_bytes": used,
                "headroom_bytes": max(min(limits) - used, 0),
            }
        )
    return out


# --- tenants ---------------------------------------------------------------------------------


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def _in_cgroup(cgroup_text: str | None, exclude: str | None) -> bool:
    if not exclude or cgroup_text is None:
        return False
    paths = own_cgroups(cgroup_text)
    return any(p == exclude or p.startswith(exclude.rstrip("/") + "/") for p in paths.values())


def tenants(
    proc_root: str,
    exclude_pids: Iterable[int] = (),
    exclude_cgroup: str | None = None,
    top: int = 5,
) -> list[dict[str, Any]]:
    """The largest processes by RSS, without ``exclude_pids`` and the members of
    ``exclude_cgroup`` (the serving unit's own: the engine and this check)."""
    skip = set(exclude_pids)
    found = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return []
    for entry in entries:
        if not (entry.isascii() and entry.isdigit()) or int(entry) in skip:
            continue
        try:  # one status parser: memory_facts'; a file the kernel did not write is skipped
            status = parse_status(read_kernel_text(os.path.join(proc_root, entry, "status")) or "")
        except ProcParseError:
            continue  # gone while listed, or not a status file
        if status["rss_kib"] <= 0:
            continue
        parsed = {"name": status["name"], "uid": status["uid"], "rss_bytes": status["rss_kib"] * KIB}
        if _in_cgroup(read_kernel_text(os.path.join(proc_root, entry, "cgroup")), exclude_cgroup):
            continue
        cmdline = (read_kernel_text(os.path.join(proc_root, entry, "cmdline")) or "").replace("\0", " ")
        found.append(
            parsed
            | {"pid": int(entry), "user": _user(parsed["uid"]), "cmdline": cmdline.strip()[:120]}
        )
    found.sort(key=lambda p: (-p["rss_bytes"], p["pid"]))
    return found[:top]


# --- the decision ----------------------------------------------------------------------------


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def drop_caches(path: str = DROP_CACHES, sync: Callable[[], None] = os.sync) -> str | None:
    """``sync``, then ``3`` into ``path`` (page cache, dentries and inodes); None when done.

    A failure (not root, a read-only ``/proc/sys`` in a container) is returned as a reason,
    not raised: the decision does not depend on it, and the message says it was not done.
    """
    sync()
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write("3\n")
    except OSError as exc:
        return f"page caches not dropped ({path}: {exc.strerror or exc})"
    return None


def decide(
    available_bytes: int,
    levels: Sequence[dict[str, Any]],
    need_bytes: int,
    reserve_bytes: int,
    tenant_list: Sequence[dict[str, Any]] = (),
    host: str = "",
    caches: str = "",
) -> dict[str, Any]:
    """Admit when the lowest of MemAvailable and every level's headroom covers need + reserve.

    ``caches`` says what happened to the page caches first (empty: not asked).
    """
    if need_bytes < 0 or reserve_bytes < 0:
        raise AdmissionError(
            f"need ({need_bytes}) and reserve ({reserve_bytes}) must be 0 or more bytes"
        )
    available, source = available_bytes, "MemAvailable"
    for level in levels:
        if level["headroom_bytes"] < available:
            available = level["headroom_bytes"]
            source = (
                f"cgroup {level['path']}: limit {_gib(level['limit_bytes'])},"
                f" {_gib(level['usage_bytes'])} in use"
            )
    total = need_bytes + reserve_bytes
    admitted = available >= total
    where = f" on {host}" if host else ""
    after = f"; {caches}" if caches else ""
    if admitted:
        message = (
            f"localinference admission: admitted{where}: {_gib(available)} available ({source})"
            f" covers {_gib(total)} ({_gib(need_bytes)} for this rank + {_gib(reserve_bytes)}"
            f" reserve){after}"
        )
    else:
        names = (
            "; ".join(
                f"{t['user']} pid {t['pid']} {t['name']} {_gib(t['rss_bytes'])}"
                for t in tenant_list
            )
            or "none found"
        )
        message = (
            f"{REFUSAL_MARKER}{where}: {_gib(available)} available"
            f" ({source}) is below {_gib(total)} ({_gib(need_bytes)} for this rank +"
            f" {_gib(reserve_bytes)} reserve){after}; largest processes by RSS: {names}. Free memory"
            f" on this node (those processes are not touched: ask their owners) or plan for"
            f" less, then start again ({DOC})"
        )
    return {
        "admitted": admitted,
        "available_bytes": available,
        "mem_available_bytes": available_bytes,
        "source": source,
        "cgroup_levels": list(levels),
        "need_bytes": total,
        "rank_need_bytes": need_bytes,
        "reserve_bytes": reserve_bytes,
        "tenants": list(tenant_list),
        "caches": caches,
        "message": message,
    }


def rank_need_bytes(
    weights_bytes: int, ranks: int, kv_bytes_per_rank: int, overhead_bytes: int = 0
) -> int:
    """One rank's memory: its share of the weights, its KV cache and a fixed overhead."""
    if ranks < 1:
        raise AdmissionError(f"ranks must be 1 or more, got {ranks}")
    return -(-int(weights_bytes) // int(ranks)) + int(kv_bytes_per_rank) + int(overhead_bytes)


def check(
    need_bytes: int,
    reserve_bytes: int = 0,
    proc_root: str = "/proc",
    cgroup: str | None = None,
    top: int = 5,
    exclude_pids: Iterable[int] = (),
    host: str = "",
    drop: Callable[[], str | None] | None = None,
) -> dict[str, Any]:
    """Read this node's evidence and decide. ``cgroup`` defaults to the caller's own (in
    ``ExecStartPre`` that is the serving unit's). ``drop`` (:func:`drop_caches`) runs first."""
    caches = ""
    if drop is not None:
        caches = drop() or "page caches dropped first"
    meminfo = read_kernel_text(os.path.join(proc_root, "meminfo"))
    if meminfo is None:
        raise AdmissionError(f"cannot read {proc_root}/meminfo")
    available = mem_available(meminfo)
    mine = own_cgroups(read_kernel_text(os.path.join(proc_root, "self", "cgroup")) or "")
    mounts = cgroup_mounts(read_kernel_text(os.path.join(proc_root, "self", "mountinfo")) or "")
    levels: list[dict[str, Any]] = []
    unit_path = cgroup
    for version in ("v2", "memory"):
        if version not in mounts:
            continue
        path = cgroup if cgroup is not None else mine.get(version)
        if path is None:
            continue
        unit_path = unit_path or path
        point, root = mounts[version]
        found = cgroup_headroom(version, _levels(point, root, path, os.path.isdir))
        if found:
            levels = found
            break
    leaf = (unit_path or "").rstrip("/").rsplit("/", 1)[-1]
    exclude = unit_path if leaf.endswith((".service", ".scope")) else None
    skip = {os.getpid(), *exclude_pids}
    decision = decide(available, levels, need_bytes, reserve_bytes, (), host, caches)
    if not decision["admitted"]:
        found_tenants = tenants(proc_root, skip, exclude, top)
        decision = decide(available, levels, need_bytes, reserve_bytes, found_tenants, host, caches)
    decision["cgroup"] = unit_path
    return decision


def _gib_argument(text: str) -> float:
    """``--need-gib``/``--reserve-gib``: a finite number, 0 or more (int(nan) would be a traceback)."""
    try:  # at most 1e30 GiB: a larger one is infinite bytes
        return validate.number("GiB", text, minimum=0, maximum=1e30)
    except validate.ValidationError:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a finite number of GiB, 0 or more"
        ) from None


def _bytes(args: argparse.Namespace, name: str) -> int:
    gib = getattr(args, f"{name}_gib")
    value = getattr(args, f"{name}_bytes")
    return int(gib * GIB) if gib is not None else value or 0  # argparse read --*-bytes as int


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="admission",
        description="Refuse to start a vLLM rank without the memory its plan needs (exit 1).",
    )
    need = parser.add_mutually_exclusive_group(required=True)
    need.add_argument("--need-bytes", type=int, help="this rank's memory need, in bytes")
    need.add_argument("--need-gib", type=_gib_argument, help="this rank's memory need, in GiB")
    parser.add_argument("--reserve-bytes", type=int, default=None)
    parser.add_argument("--reserve-gib", type=_gib_argument, default=None)
    parser.add_argument("--proc-root", default="/proc")
    parser.add_argument("--cgroup", default=None, help="cgroup path (default: this process's)")
    parser.add_argument("--top", type=int, default=5, help="processes named on refusal")
    parser.add_argument("--exclude-pid", type=int, action="append", default=[])
    parser.add_argument("--host", default=os.uname().nodename)
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    parser.add_argument(
        "--drop-caches",
        action="store_true",
        help=f"sync and drop the page caches ({DROP_CACHES}) before measuring (unified memory)",
    )
    args = parser.parse_args(argv)
    try:
        decision = check(
            _bytes(args, "need"),
            _bytes(args, "reserve"),
            args.proc_root,
            args.cgroup,
            args.top,
            args.exclude_pid,
            args.host,
            drop_caches if args.drop_caches else None,
        )
    except AdmissionError as exc:
        print(
            f"{REFUSAL_MARKER} on {args.host}: {exc}; the memory cannot be judged,"
            f" so nothing is started (fail closed) ({DOC})",
            file=sys.stderr,
        )
        return REFUSE
    if args.json:
        print(json.dumps(decision, sort_keys=True))
    print(decision["message"], file=sys.stderr if not decision["admitted"] else sys.stdout)
    return ADMIT if decision["admitted"] else REFUSE


if __name__ == "__main__":
    sys.exit(main())
