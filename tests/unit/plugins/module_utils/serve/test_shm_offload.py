# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The evidence behind the /dev/shm offload reclaim (module_utils/serve/_shm_offload.py), F13.

Case tables for the pure parts (pattern, maps lines, container mounts, the verdict of two
inspections) and a copied process table (``proc_root``) for what a root test cannot make the
real ``/proc`` do: a live process whose ``maps`` cannot be read or is garbage.  The real-process
tests (a child that maps a file) are in tests/unit/plugins/modules/test_shm_offload.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import Runner
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _shm_offload as shm

PATTERNS = [
    ("vllm_offload_*.mmap", None),
    ("vllm_offload_test1234_*.mmap", None),
    ("vll?", None),
    ("../vllm_offload_*.mmap", "path separator"),
    ("/dev/shm/vllm_offload_*.mmap", "path separator"),
    ("vllm..x*", "'..'"),
    ("*", "literal"),
    ("*.mmap", "literal"),
    ("vl*", "literal"),
    (".hidden*", "literal"),
    ("vllm_offload_*\n", "line break"),
    ("", "is empty"),
    (" vllm_*", "whitespace"),
    (["vllm_*"], "expected text"),
]


@pytest.mark.parametrize(("pattern", "problem"), PATTERNS, ids=[repr(p[0]) for p in PATTERNS])
def test_pattern_is_a_plain_file_name_glob_with_a_literal_prefix(pattern, problem):
    if problem is None:
        assert shm.check_pattern(pattern) == pattern
    else:
        with pytest.raises(shm.ShmOffloadError, match="pattern") as caught:
            shm.check_pattern(pattern)
        assert problem in str(caught.value)


DEV = os.makedev(0, 0x1A)
MAPS_LINES = [
    (b"7f00-7f10 rw-s 00000000 00:1a 17 /dev/shm/vllm_offload_0.mmap", ((DEV, 17), b"/dev/shm/vllm_offload_0.mmap")),
    (b"7f00-7f10 rw-s 00000000 00:1a 17 /dev/shm/vllm_offload_0.mmap (deleted)", ((DEV, 17), b"/dev/shm/vllm_offload_0.mmap")),
    (b"7f00-7f10 rw-p 00000000 00:00 0 ", (None, b"")),
    (b"7f00-7f10 rw-p 00000000 00:00 0                          [heap]", (None, b"[heap]")),
    (b"7f00-7f10 r--p 00000000 103:02 1234567 /usr/lib/with space/x.so", ((os.makedev(0x103, 2), 1234567), b"/usr/lib/with space/x.so")),
    (b"7f00-7f10 r--p 00000000 00:1a 17 /odd/\xff\xfe name", ((DEV, 17), b"/odd/\xff\xfe name")),
    (b"\xff\xfe\x00garbage", None),
    (b"7f00-7f10 rw-s 00000000 zz:1a 17 /x", None),
    (b"7f00-7f10 rw-s 00000000 001a 17 /x", None),
    (b"7f00-7f10 rw-s 00000000 00:1a -17 /x", None),
    (b"7f00-7f10 rw-s 00000000 00:1a", None),
]


@pytest.mark.parametrize(("line", "expected"), MAPS_LINES, ids=range(len(MAPS_LINES)))
def test_maps_lines_parse_or_are_refused(line, expected):
    assert shm._parse_maps_line(line) == expected


CONTAINERS = [
    ({"Mounts": [{"Source": "/dev/shm", "Destination": "/dev/shm"}]}, "mounts /dev/shm"),
    ({"Mounts": [{"Source": "/dev", "Destination": "/dev"}]}, "mounts /dev at /dev"),
    ({"Mounts": [{"Source": "/dev/shm/vllm", "Destination": "/x"}]}, "mounts /dev/shm/vllm"),
    ({"Mounts": [{"Source": "/dev/shmem", "Destination": "/x"}]}, None),
    ({"Mounts": [{"Source": "tmpfs", "Destination": "/dev/shm"}]}, None),
    ({"Mounts": [{"Source": "/var/lib/containers/storage", "Destination": "/var/lib/containers/storage"}]}, None),
    ({"Mounts": None, "HostConfig": {"IpcMode": "host"}}, "--ipc=host"),
    ({"Mounts": "junk", "HostConfig": {"IpcMode": "shareable"}}, None),
    ({"Mounts": [7, None], "HostConfig": []}, None),
]


@pytest.mark.parametrize(("doc", "why"), CONTAINERS, ids=range(len(CONTAINERS)))
def test_containers_that_may_own_dev_shm(doc, why):
    reason = shm._container_reason(doc, "/dev/shm")
    assert (reason is None) if why is None else (why in reason)


def entry(name: str, **change) -> shm.Entry:
    values = {
        "name": name,
        "path": f"/dev/shm/{name}",
        "kind": "file",
        "uid": 0,
        "dev": DEV,
        "ino": 100 + int(name[-6]),
        "size": 4096,
        "allocated": 4096,
        "mtime_ns": 1,
    }
    values.update(change)
    return shm.Entry(**values)


def inspection(*entries: shm.Entry, holders=None, refusals=(), owners=()) -> shm.Inspection:
    scan = shm.ProcScan(refusals=list(refusals), processes=10)
    for key, pid, how in holders or []:
        scan.hold(key, pid, how)
    return shm.Inspection({e.name: e for e in entries}, [], scan, list(owners), None)


A, B = "vllm_offload_1.mmap", "vllm_offload_2.mmap"
VERDICTS = [
    ("unchanged and unheld: orphan", [entry(A)], [entry(A)], {}, {"orphans": [A]}),
    ("mapped in the first inspection only: live", [entry(A)], [entry(A)], {"first": [((DEV, 101), 7, "mapped")]}, {"live": {A: [7]}}),
    ("open in the second: live", [entry(A)], [entry(A)], {"second": [((DEV, 101), 8, "open")]}, {"live": {A: [8]}}),
    ("grew between inspections", [entry(A)], [entry(A, size=8192)], {}, {"skipped": {A: "changed"}}),
    ("touched between inspections", [entry(A)], [entry(A, mtime_ns=2)], {}, {"skipped": {A: "changed"}}),
    ("replaced by a new inode", [entry(A)], [entry(A, ino=999)], {}, {"skipped": {A: "changed"}}),
    ("appeared late", [], [entry(A)], {}, {"skipped": {A: "appeared"}}),
    ("vanished", [entry(A)], [], {}, {}),
    ("other owner", [entry(A, uid=1000)], [entry(A, uid=1000)], {}, {"skipped": {A: "uid 1000"}}),
    ("symlink", [entry(A, kind="symlink")], [entry(A, kind="symlink")], {}, {"skipped": {A: "symbolic link"}}),
    ("directory", [entry(A, kind="directory")], [entry(A, kind="directory")], {}, {"skipped": {A: "directory"}}),
    ("fifo", [entry(A, kind="other")], [entry(A, kind="other")], {}, {"skipped": {A: "not a regular file"}}),
    ("one live, one orphan", [entry(A), entry(B)], [entry(A), entry(B)], {"second": [((DEV, 102), 9, "mapped")]}, {"orphans": [A], "live": {B: [9]}}),
    ("unreadable evidence", [entry(A)], [entry(A)], {"refusals": ["cannot read /proc/9/maps"]}, {"orphans": [A], "refusals": ["cannot read /proc/9/maps"]}),
    (
        "running owner container",
        [entry(A)],
        [entry(A)],
        {"owners": [{"id": "abc", "name": "vllm", "why": "mounts /dev/shm at /dev/shm"}]},
        {"orphans": [A], "refusals": ["vllm (mounts /dev/shm"]},
    ),
]


@pytest.mark.parametrize(("name", "first", "second", "evidence", "expected"), VERDICTS, ids=[v[0] for v in VERDICTS])
def test_two_inspections_decide(name, first, second, evidence, expected):
    one = inspection(*first, holders=evidence.get("first"), refusals=evidence.get("refusals", ()), owners=evidence.get("owners", ()))
    two = inspection(*second, holders=evidence.get("second"))
    verdict = shm.judge(one, two, 0, "root")
    assert [e.name for e in verdict.orphans] == expected.get("orphans", [])
    assert {os.path.basename(x["path"]): x["pids"] for x in verdict.live} == expected.get("live", {})
    skipped = {os.path.basename(x["path"]): x["reason"] for x in verdict.skipped}
    assert set(skipped) == set(expected.get("skipped", {}))
    for file, reason in expected.get("skipped", {}).items():
        assert reason in skipped[file]
    assert len(verdict.refusals) == len(expected.get("refusals", []))
    for got, want in zip(verdict.refusals, expected.get("refusals", []), strict=True):
        assert want in got
    assert verdict.proven is not expected.get("refusals")


# --- a copied process table --------------------------------------------------------------


@pytest.fixture
def target():
    """One offload-like file in /dev/shm (real tmpfs), removed afterwards."""
    path = Path("/dev/shm") / f"vllm_offload_test{uuid.uuid4().hex}_0.mmap"
    path.write_bytes(b"\0" * 4096)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def fake_proc(root: Path, processes: dict[int, bytes | None]) -> Path:
    """A process table: pid -> maps content (None: maps is a folder, which cannot be read)."""
    for pid, maps in processes.items():
        (root / str(pid) / "fd").mkdir(parents=True)
        if maps is None:
            (root / str(pid) / "maps").mkdir()
        else:
            (root / str(pid) / "maps").write_bytes(maps)
    return root


def maps_line(path: Path) -> bytes:
    st = path.stat()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    return f"7f00-7f10 rw-s 00000000 {dev} {st.st_ino} {path}\n".encode()


def scan(proc: Path, target: Path) -> shm.ProcScan:
    entries, _ = shm.list_matching(str(target.parent), target.name)
    return shm.scan_processes(str(proc), entries, deadline=float("inf"))


def test_copied_table_finds_the_mapping_by_inode_and_by_path(tmp_path, target):
    other = b"7f00-7f10 r--p 00000000 00:00 0 [heap]\n"
    line = maps_line(target)
    by_path = line.replace(f" {target.stat().st_ino} ".encode(), b" 1 ")
    proc = fake_proc(tmp_path, {10: other, 11: line, 12: by_path})
    result = scan(proc, target)
    key = (target.stat().st_dev, target.stat().st_ino)
    assert result.refusals == []
    assert result.holders == {key: {11: {"mapped"}, 12: {"mapped"}}}
    assert result.processes == 3


UNPROVABLE = [
    ("maps is unreadable", None, "cannot read"),
    ("binary garbage", b"\x00\xff\xfe garbage\n", "not a maps line"),
    ("truncated line", b"7f00-7f10 rw-s 00000000\n", "not a maps line"),
]


@pytest.mark.parametrize(("name", "maps", "said"), UNPROVABLE, ids=[u[0] for u in UNPROVABLE])
def test_a_live_process_without_readable_maps_is_a_refusal(tmp_path, target, name, maps, said):
    proc = fake_proc(tmp_path, {10: b"", 11: maps})
    result = scan(proc, target)
    assert len(result.refusals) == 1 and said in result.refusals[0]
    assert "PID 11" in result.refusals[0]


def test_a_live_process_whose_fd_folder_is_missing_is_a_refusal(tmp_path, target):
    proc = fake_proc(tmp_path, {10: b""})
    (proc / "10" / "fd").rmdir()
    (proc / "10" / "fd").write_text("not a folder")
    assert "cannot read" in scan(proc, target).refusals[0]


def test_an_empty_or_missing_process_table_is_a_refusal(tmp_path, target):
    assert "lists no process" in scan(tmp_path, target).refusals[0]
    assert "cannot list" in scan(tmp_path / "absent", target).refusals[0]


def test_a_process_that_exited_before_its_maps_was_read_is_not_missing_evidence(target):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    result = shm.ProcScan()
    key = (target.stat().st_dev, target.stat().st_ino)
    shm._scan_one("/proc", child.pid, {key}, {str(target).encode(): key}, result)
    assert result.refusals == [] and result.holders == {}


def test_the_scan_stops_at_its_deadline(tmp_path, target):
    proc = fake_proc(tmp_path, {10: b"", 11: b""})
    entries, _ = shm.list_matching(str(target.parent), target.name)
    result = shm.scan_processes(str(proc), entries, deadline=0.0)
    assert "did not finish in time" in result.refusals[0]


def test_non_utf8_names_are_listed_but_never_candidates(tmp_path):
    name = os.fsdecode(b"vllm_offload_\xff.mmap")
    (tmp_path / name).write_bytes(b"x")
    entries, odd = shm.list_matching(str(tmp_path), "vllm_offload_*.mmap")
    assert entries == [] and odd[0]["reason"] == "name is not UTF-8"


DIRECTORIES = [
    ("relative", "dev/shm", "absolute"),
    ("dotdot", "/dev/shm/../shm", "normalised"),
    ("missing", "/nonexistent-shm", "cannot inspect"),
    ("a file", "/etc/hostname", "not a directory"),
]


@pytest.mark.parametrize(("name", "value", "said"), DIRECTORIES, ids=[d[0] for d in DIRECTORIES])
def test_directory_must_be_a_real_existing_folder(name, value, said):
    with pytest.raises(shm.ShmOffloadError, match="directory") as caught:
        shm.check_directory("directory", value)
    assert said in str(caught.value)


def test_directory_through_a_symbolic_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(shm.ShmOffloadError, match="symbolic link"):
        shm.check_directory("directory", str(tmp_path / "link"))
    with pytest.raises(shm.ShmOffloadError, match="symbolic link"):
        shm.check_directory("directory", str(tmp_path / "link" / "."))


def test_owner_by_name_or_uid_and_unknown_owner_named():
    assert shm.owner_uid("root") == 0 and shm.owner_uid("65534") == 65534
    with pytest.raises(shm.ShmOffloadError, match="owner: no user 'no-such-user'"):
        shm.owner_uid("no-such-user")


def fake_podman(tmp_path: Path, ps: str, inspect: str, rc: int = 0) -> str:
    script = tmp_path / "podman"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in ps) printf "%s" \'{ps}\' ;; container) printf "%s" \'{inspect}\'; exit {rc} ;; esac\n'
    )
    script.chmod(0o755)
    return str(script)


PODMAN = [
    ("no running container", "", "", 0, ([], None)),
    (
        "an owner",
        "abc\n",
        '[{"Id": "abcdef0123456789", "Name": "vllm-head",'
        ' "Mounts": [{"Source": "/dev/shm", "Destination": "/dev/shm"}]}]',
        0,
        (["vllm-head"], None),
    ),
    ("not an owner", "abc\n", '[{"Id": "abc", "Name": "caddy", "Mounts": []}]', 0, ([], None)),
    ("inspect fails", "abc\n", "", 125, ([], "rc 125")),
    ("not JSON", "abc\n", "<html>", 0, ([], "did not print JSON")),
    ("not a list", "abc\n", '{"Id": "abc"}', 0, ([], "not print a list")),
]


@pytest.mark.parametrize(("name", "ps", "inspect", "rc", "expected"), PODMAN, ids=[p[0] for p in PODMAN])
def test_podman_owners_and_refusals(tmp_path, name, ps, inspect, rc, expected):
    podman = fake_podman(tmp_path, ps, inspect, rc)
    owners, _, refusal = shm.container_owners(Runner(timeout=10), podman, "/dev/shm")
    assert [o["name"] for o in owners] == expected[0]
    assert (refusal is None) if expected[1] is None else (expected[1] in refusal)


def test_podman_that_does_not_answer_is_a_refusal(tmp_path):
    script = tmp_path / "podman"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    owners, _, refusal = shm.container_owners(Runner(timeout=0.5), str(script), "/dev/shm")
    assert owners == [] and "did not answer within 0.5 s" in refusal
