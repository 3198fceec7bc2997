# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fail-closed reclaim of orphaned vLLM native KV-offload mmaps (failure F13).

A killed vLLM leaves ``/dev/shm/vllm_offload_*.mmap`` behind; the next start
fails with ``OSError: [Errno 14] Bad address`` once they fill the tmpfs.  Seed
004 prescribes the only safe cleanup, and this file implements it:

1. scan only the exact file-name glob in one directory, never following links;
2. prove that no live process maps (or holds open) the file: every
   ``/proc/PID/maps`` (matched by device and inode, and by path) and every
   ``/proc/PID/fd``; and that no running Podman container has the directory
   mounted (a possible owner whose processes we cannot reason about);
3. fail closed: when any of those sources cannot be read, nothing is deleted
   and the reason is said (a process that exited between listing and reading
   is not a missing source: it maps nothing any more);
4. delete only files that two inspections a moment apart agree on (same inode,
   size, mtime, owner, still unmapped), through a directory descriptor opened
   without following links, re-checking the identity just before unlinking;
5. verify afterwards that the deleted inodes are gone.

Every read is bounded (size per file, entries per directory, a deadline per
inspection, a timeout per command).  No AnsibleModule here.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import os
import pwd
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import _validate
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._files import read_bytes

DEFAULT_PATTERN = "vllm_offload_*.mmap"
MAX_DIR_ENTRIES = 100_000
MAX_PROCESSES = 1_000_000
MAX_FDS = 1_000_000
# /proc/PID/maps of a process with 65,530 mappings (vm.max_map_count) is about 8 MiB.
MAX_MAPS_BYTES = 64 * 1024 * 1024
MAX_PODMAN_OUTPUT = 16 * 1024 * 1024
MIN_LITERAL_PREFIX = 3
_WILDCARDS = "*?["
_VANISHED = (errno.ENOENT, errno.ESRCH)
CATALOG = "docs/failure-catalog.md#f13"

Key = tuple[int, int]  # (st_dev, st_ino)


class ShmOffloadError(_validate.Error):
    """Bad input or an unusable directory; the message names the option and the fix."""


# --- input -----------------------------------------------------------------------------


def check_pattern(pattern: Any) -> str:
    """A plain file-name glob with a literal prefix; raises :class:`ShmOffloadError`."""
    try:
        pattern = _validate.text("pattern", pattern, max_length=255, strip_ok=False)
    except _validate.ValidationError as exc:
        raise ShmOffloadError(str(exc)) from None
    if "/" in pattern or "\\" in pattern:
        raise ShmOffloadError(
            f"pattern: {pattern!r} contains a path separator; give a file-name glob such as"
            f" {DEFAULT_PATTERN} and the folder in the directory option"
        )
    if ".." in pattern:
        raise ShmOffloadError(f"pattern: {pattern!r} contains '..'; give a plain file-name glob")
    prefix = len(pattern)
    for char in _WILDCARDS:
        if char in pattern:
            prefix = min(prefix, pattern.index(char))
    if prefix < MIN_LITERAL_PREFIX or pattern.startswith("."):
        raise ShmOffloadError(
            f"pattern: {pattern!r} must start with at least {MIN_LITERAL_PREFIX} literal"
            f" characters (not '.') before any wildcard, so that it can only match offload files;"
            f" the default is {DEFAULT_PATTERN}"
        )
    return pattern


def check_directory(option: str, value: Any) -> str:
    """An absolute, normalised, existing directory reached without symbolic links."""
    try:
        directory = _validate.path(option, value)
    except _validate.ValidationError as exc:
        raise ShmOffloadError(str(exc)) from None
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise ShmOffloadError(
            f"{option}: cannot inspect {directory}: {exc.strerror}; give an existing directory"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise ShmOffloadError(f"{option}: {directory} is not a directory (or is a symbolic link)")
    if os.path.realpath(directory) != directory:
        raise ShmOffloadError(
            f"{option}: {directory} goes through a symbolic link (it is"
            f" {os.path.realpath(directory)}); give the real path"
        )
    return directory


def owner_uid(owner: Any) -> int:
    """The uid of ``owner`` (a user name or a numeric uid)."""
    if isinstance(owner, int) and not isinstance(owner, bool) and owner >= 0:
        return owner
    if isinstance(owner, str) and owner.isdigit() and len(owner) < 11:
        return _validate.counter("owner", owner, max_digits=10, error=ShmOffloadError)
    try:
        name = _validate.text("owner", owner, max_length=64, strip_ok=False)
        return pwd.getpwnam(name).pw_uid
    except _validate.ValidationError as exc:
        raise ShmOffloadError(str(exc)) from None
    except KeyError:
        raise ShmOffloadError(
            f"owner: no user {owner!r} on this node; give the user the serving units run as"
        ) from None


# --- one inspection ----------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One directory entry that matches the pattern, as lstat saw it."""

    name: str
    path: str
    kind: str  # file, symlink, directory, other
    uid: int
    dev: int
    ino: int
    size: int
    allocated: int
    mtime_ns: int

    @property
    def key(self) -> Key:
        return (self.dev, self.ino)

    def identity(self) -> tuple[Any, ...]:
        return (self.kind, self.uid, self.dev, self.ino, self.size, self.mtime_ns)

    def public(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "allocated": self.allocated,
            "uid": self.uid,
            "inode": self.ino,
        }


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    return "other"


def _entry(directory: str, name: str, st: os.stat_result) -> Entry:
    return Entry(
        name=name,
        path=os.path.join(directory, name),
        kind=_kind(st.st_mode),
        uid=st.st_uid,
        dev=st.st_dev,
        ino=st.st_ino,
        size=st.st_size,
        allocated=st.st_blocks * 512,
        mtime_ns=st.st_mtime_ns,
    )


def list_matching(directory: str, pattern: str) -> tuple[list[Entry], list[dict[str, Any]]]:
    """The entries of ``directory`` whose name matches ``pattern`` (lstat, links not followed).

    Returns (entries, odd): names that are not UTF-8 are never touched and come back in odd.
    Raises :class:`ShmOffloadError` when the directory cannot be listed in full.
    """
    entries: list[Entry] = []
    odd: list[dict[str, Any]] = []
    try:
        with os.scandir(directory) as listing:
            for count, item in enumerate(listing, start=1):
                if count > MAX_DIR_ENTRIES:
                    raise ShmOffloadError(
                        f"{directory} has more than {MAX_DIR_ENTRIES} entries; not scanned, nothing"
                        " reclaimed (inspect it by hand)"
                    )
                if not fnmatch.fnmatchcase(item.name, pattern):
                    continue
                try:
                    item.name.encode("utf-8")
                except UnicodeEncodeError:
                    shown = os.fsencode(item.name).decode("utf-8", "backslashreplace")
                    odd.append(
                        {"path": os.path.join(directory, shown), "reason": "name is not UTF-8"}
                    )
                    continue
                try:
                    st = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed while listing: nothing to reclaim
                entries.append(_entry(directory, item.name, st))
    except ShmOffloadError:
        raise
    except OSError as exc:
        raise ShmOffloadError(f"cannot list {directory}: {exc.strerror or exc}") from None
    return sorted(entries, key=lambda e: e.name), odd


@dataclass
class ProcScan:
    """Who holds the target files: key -> {pid: {'mapped', 'open'}}; refusals say what was unreadable."""

    holders: dict[Key, dict[int, set[str]]] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    processes: int = 0

    def hold(self, key: Key, pid: int, how: str) -> None:
        self.holders.setdefault(key, {}).setdefault(pid, set()).add(how)


def _parse_maps_line(line: bytes) -> tuple[Key | None, bytes] | None:
    """(dev/inode key or None for anonymous, path) of one maps line; None when unparseable."""
    parts = line.split(None, 5)
    if len(parts) < 5:
        return None
    dev, inode = parts[3], parts[4]
    major, sep, minor = dev.partition(b":")
    try:
        if not sep or not (major.isalnum() and minor.isalnum()) or not inode.isdigit():
            return None
        number = int(inode)
        key = (os.makedev(int(major, 16), int(minor, 16)), number) if number else None
    except (ValueError, OverflowError):
        return None
    path = parts[5].strip() if len(parts) == 6 else b""
    if path.endswith(b" (deleted)"):
        path = path[: -len(b" (deleted)")]
    return key, path


def _gone(proc_root: str, pid: int) -> bool:
    # exists(), not lexists(): a process table of links to /proc/PID (the tests') follows them.
    return not os.path.exists(os.path.join(proc_root, str(pid)))


def _scan_one(
    proc_root: str, pid: int, keys: set[Key], paths: dict[bytes, Key], scan: ProcScan
) -> None:
    base = os.path.join(proc_root, str(pid))
    maps = os.path.join(base, "maps")
    try:
        data = read_bytes(maps, MAX_MAPS_BYTES, whole=True)
    except OSError as exc:
        if exc.errno in _VANISHED and _gone(proc_root, pid):
            return  # exited between listing and reading: it maps nothing any more
        scan.refusals.append(
            f"cannot read {maps} (PID {pid} is alive): {exc.strerror or exc}; without it no file"
            " can be proven unmapped"
        )
        return
    except OverflowError as exc:
        scan.refusals.append(f"{exc}; PID {pid}'s mappings were not checked")
        return
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        parsed = _parse_maps_line(line)
        if parsed is None:
            scan.refusals.append(
                f"line {number} of {maps} is not a maps line ({line[:60]!r}); cannot prove what"
                f" PID {pid} maps"
            )
            return
        key, path = parsed
        if key in keys:
            scan.hold(key, pid, "mapped")
        elif path in paths:
            scan.hold(paths[path], pid, "mapped")
    fd_dir = os.path.join(base, "fd")
    try:
        with os.scandir(fd_dir) as fds:
            for count, item in enumerate(fds, start=1):
                if count > MAX_FDS:
                    scan.refusals.append(f"{fd_dir} has more than {MAX_FDS} entries; not checked")
                    return
                try:
                    target = os.fsencode(os.readlink(item.path))
                except OSError as exc:
                    if exc.errno in _VANISHED:
                        continue  # closed meanwhile
                    raise
                if target.endswith(b" (deleted)"):
                    target = target[: -len(b" (deleted)")]
                if target in paths:
                    scan.hold(paths[target], pid, "open")
    except OSError as exc:
        if exc.errno in _VANISHED and _gone(proc_root, pid):
            return
        scan.refusals.append(
            f"cannot read {fd_dir} (PID {pid} is alive): {exc.strerror or exc}; cannot prove the"
            " process does not hold an offload file open"
        )


def hidden_processes(proc_root: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """Why processes of other users may be invisible under ``proc_root`` (hidepid), or None."""
    if os.geteuid() == 0:
        return None
    try:
        text = read_bytes(mountinfo, MAX_MAPS_BYTES, whole=True).decode("utf-8", "replace")
    except (OSError, OverflowError) as exc:
        return f"cannot read {mountinfo} to check for hidepid: {exc}"
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 10 or fields[4] != proc_root or " - proc " not in line:
            continue
        options = line.rsplit(" ", 1)[-1].split(",")
        for option in options:
            if option.startswith("hidepid=") and option not in ("hidepid=0", "hidepid=off"):
                return (
                    f"{proc_root} is mounted with {option}: processes of other users are hidden"
                    " from this non-root user; run the reclaim as root"
                )
    return None


def scan_processes(
    proc_root: str, targets: list[Entry], deadline: float, self_pid: int | None = None
) -> ProcScan:
    """Every live process's mappings and open files that are one of ``targets``."""
    scan = ProcScan()
    keys = {e.key for e in targets if e.kind == "file"}
    paths = {os.fsencode(e.path): e.key for e in targets if e.kind == "file"}
    hidden = hidden_processes(proc_root)
    if hidden:
        scan.refusals.append(hidden)
        return scan
    try:
        with os.scandir(proc_root) as listing:
            pids = [int(item.name) for item in listing if item.name.isdigit()]
    except OSError as exc:
        scan.refusals.append(f"cannot list {proc_root}: {exc.strerror or exc}")
        return scan
    if not pids:
        scan.refusals.append(f"{proc_root} lists no process; it is not a process table")
        return scan
    if len(pids) > MAX_PROCESSES:
        scan.refusals.append(f"{proc_root} lists more than {MAX_PROCESSES} processes; not scanned")
        return scan
    for pid in sorted(pids):
        if time.monotonic() > deadline:
            scan.refusals.append(
                f"the scan of {proc_root} did not finish in time ({scan.processes} of {len(pids)}"
                " processes checked); raise timeout"
            )
            return scan
        if pid == self_pid:
            continue
        scan.processes += 1
        if keys:
            _scan_one(proc_root, pid, keys, paths, scan)
    return scan


# --- Podman ---------------------------------------------------------------------------------


def _overlaps(path: str, directory: str) -> bool:
    return _validate.is_under(path, [directory]) or _validate.is_under(directory, [path])


def container_owners(
    runner: Runner, podman: str, directory: str
) -> tuple[list[dict[str, Any]], int, str | None]:
    """Running containers that have ``directory`` mounted: (owners, running, refusal)."""
    argv = [podman, "ps", "--quiet", "--no-trunc", "--filter", "status=running"]
    try:
        rc, out, err = runner.run(argv)
        if rc != 0:
            return [], 0, f"{' '.join(argv)} failed (rc {rc}): {err.strip()[:300]}"
        ids = [line.strip() for line in out.splitlines() if line.strip()]
        if not ids:
            return [], 0, None
        inspect = [podman, "container", "inspect", *ids]
        rc, out, err = runner.run(inspect)
    except CommandError as exc:
        return [], 0, f"cannot ask Podman for the running containers: {exc}"
    if rc != 0:
        return (
            [],
            len(ids),
            (
                f"podman container inspect failed (rc {rc}): {err.strip()[:300]} (a container that"
                " stopped meanwhile also causes this: run again)"
            ),
        )
    if len(out) > MAX_PODMAN_OUTPUT:
        return [], len(ids), f"podman container inspect printed more than {MAX_PODMAN_OUTPUT} bytes"
    try:
        documents = json.loads(out)
    except ValueError:
        return [], len(ids), "podman container inspect did not print JSON"
    if not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents):
        return [], len(ids), "podman container inspect did not print a list of containers"
    owners = []
    for doc in documents:
        why = _container_reason(doc, directory)
        if why:
            name = str(doc.get("Name") or "").lstrip("/")
            owners.append({"id": str(doc.get("Id") or "")[:12], "name": name, "why": why})
    return owners, len(ids), None


def _container_reason(doc: dict[str, Any], directory: str) -> str | None:
    mounts = doc.get("Mounts")
    for mount in mounts if isinstance(mounts, list) else []:
        source = mount.get("Source") if isinstance(mount, dict) else None
        if isinstance(source, str) and source.startswith("/") and _overlaps(source, directory):
            return f"mounts {source} at {mount.get('Destination')}"
    host_config = doc.get("HostConfig")
    ipc = host_config.get("IpcMode") if isinstance(host_config, dict) else None
    if ipc == "host" and _overlaps("/dev/shm", directory):
        return "runs with --ipc=host (shares the host's /dev/shm)"
    return None


# --- two inspections and the verdict --------------------------------------------------------


@dataclass
class Inspection:
    entries: dict[str, Entry]
    odd: list[dict[str, Any]]
    scan: ProcScan
    owners: list[dict[str, Any]]
    running: int | None  # None: Podman not checked


def inspect(
    directory: str,
    pattern: str,
    proc_root: str,
    timeout: float,
    podman: str | None,
    runner: Runner | None,
) -> Inspection:
    entries, odd = list_matching(directory, pattern)
    scan = scan_processes(proc_root, entries, time.monotonic() + timeout, self_pid=os.getpid())
    owners: list[dict[str, Any]] = []
    running: int | None = None
    if podman and runner is not None:
        owners, running, refusal = container_owners(runner, podman, directory)
        if refusal:
            scan.refusals.append(refusal)
    return Inspection({e.name: e for e in entries}, odd, scan, owners, running)


@dataclass
class Verdict:
    live: list[dict[str, Any]]
    orphans: list[Entry]
    skipped: list[dict[str, Any]]
    refusals: list[str]
    containers: list[dict[str, Any]]
    processes: int
    running_containers: int | None

    @property
    def proven(self) -> bool:
        return not self.refusals


def judge(first: Inspection, second: Inspection, uid: int, owner: str) -> Verdict:
    """Orphans are files both inspections saw identical, of ``uid``, held by no process."""
    live: list[dict[str, Any]] = []
    orphans: list[Entry] = []
    skipped: list[dict[str, Any]] = list(second.odd)
    for name in sorted(set(first.entries) | set(second.entries)):
        before, after = first.entries.get(name), second.entries.get(name)
        if after is None:
            continue  # gone by the second inspection: nothing to reclaim
        public = after.public()
        if before is None:
            skipped.append({**public, "reason": "appeared between the two inspections"})
            continue
        if after.kind != "file":
            reason = {
                "symlink": "is a symbolic link (never followed or deleted)",
                "directory": "is a directory",
            }.get(after.kind, "is not a regular file")
            skipped.append({**public, "reason": reason})
            continue
        holders: dict[int, set[str]] = {}
        for inspection, entry in ((first, before), (second, after)):
            for pid, how in inspection.scan.holders.get(entry.key, {}).items():
                holders.setdefault(pid, set()).update(how)
        if holders:
            how = sorted({h for hs in holders.values() for h in hs})
            live.append({**public, "pids": sorted(holders), "how": how})
            continue
        if after.uid != uid:
            skipped.append(
                {**public, "reason": f"owned by uid {after.uid}, not {owner} (uid {uid})"}
            )
            continue
        if before.identity() != after.identity():
            skipped.append(
                {**public, "reason": "changed between the two inspections (inode, size or mtime)"}
            )
            continue
        orphans.append(after)
    refusals = list(dict.fromkeys(first.scan.refusals + second.scan.refusals))
    containers = {c["id"]: c for c in first.owners + second.owners}
    if containers:
        names = ", ".join(f"{c['name'] or c['id']} ({c['why']})" for c in containers.values())
        refusals.append(
            f"running container(s) may own the offload files: {names}; stop them first, or"
            " reclaim from the serving unit's ExecStopPost"
        )
    return Verdict(
        live=live,
        orphans=orphans,
        skipped=skipped,
        refusals=refusals,
        containers=list(containers.values()),
        processes=min(first.scan.processes, second.scan.processes),
        running_containers=second.running,
    )


def survey(
    directory: str,
    pattern: str,
    uid: int,
    owner: str,
    proc_root: str = "/proc",
    settle: float = 1.0,
    timeout: float = 60.0,
    podman: str | None = None,
    runner: Runner | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Verdict:
    """Two inspections ``settle`` seconds apart and their verdict."""
    first = inspect(directory, pattern, proc_root, timeout, podman, runner)
    sleep(settle)
    second = inspect(directory, pattern, proc_root, timeout, podman, runner)
    return judge(first, second, uid, owner)


# --- deletion ---------------------------------------------------------------------------------


def reclaim(directory: str, orphans: list[Entry]) -> tuple[list[Entry], list[str], list[str]]:
    """Unlink each orphan still identical to its inspection; verify it is gone.

    Returns (reclaimed, problems, notes): problems are failures (a file that could not be
    deleted or is still there), notes are files deliberately left alone.  Works through a
    descriptor of ``directory`` opened with O_NOFOLLOW, so a directory swapped for a link
    is not followed.
    """
    reclaimed: list[Entry] = []
    problems: list[str] = []
    notes: list[str] = []
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        dir_fd = os.open(directory, flags)
    except OSError as exc:
        return [], [f"cannot open {directory}: {exc.strerror or exc}; nothing deleted"], []
    try:
        for entry in orphans:
            try:
                st = os.stat(entry.name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # someone else removed it
            except OSError as exc:
                problems.append(f"cannot inspect {entry.path} again: {exc.strerror}; left in place")
                continue
            if _entry(directory, entry.name, st).identity() != entry.identity():
                notes.append(f"{entry.path} changed just before deletion; left in place")
                continue
            try:
                os.unlink(entry.name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                problems.append(f"cannot delete {entry.path}: {exc.strerror}")
                continue
            reclaimed.append(entry)
        for entry in reclaimed:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(entry.name, dir_fd=dir_fd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == entry.key:
                    problems.append(f"{entry.path} is still present after deletion")
                else:
                    notes.append(
                        f"{entry.path} was deleted, but a new file of that name (inode"
                        f" {st.st_ino}) appeared at once; it was not touched"
                    )
    finally:
        os.close(dir_fd)
    return reclaimed, problems, notes
