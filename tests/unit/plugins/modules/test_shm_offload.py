# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""shm_offload with real processes and real tmpfs files (F13), on this machine.

Each test makes its own files in /dev/shm under a unique prefix
(``vllm_offload_test<uuid>_*.mmap``) and scans the real /proc: a child Python process
that maps (or only opens) one of the files must keep it; unmapped orphans go.  Every
file and child is removed in ``finally`` blocks.  Podman is a stand-in script printing
no container, so the lab's containers do not decide these tests (the container check
itself is tested in tests/unit/plugins/module_utils/serve/test_shm_offload.py).

An unreadable /proc entry: as root every ``/proc/PID/maps`` is readable, so one test
runs the inspection as ``nobody`` against the real /proc (root's processes are then
really unreadable: EACCES) and another points the module's ``proc_root`` option at a
copied table in which one live process's ``maps`` cannot be read.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.modules import shm_offload

from tests.unit.module_helper import run_module

SHM = Path("/dev/shm")
ROOT = Path(__file__).resolve().parents[4]
COLLECTIONS = ROOT / ".lab" / "collections"
NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not SHM.is_dir(),
    reason="needs root (to read every /proc/PID/maps and chown) and a /dev/shm tmpfs",
)

HOLDER = r"""
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
if sys.argv[2] == "map":
    view = mmap.mmap(fd, 0)
    os.close(fd)
print("ready", flush=True)
sys.stdin.read()
"""


class Files:
    """Offload-like files under one unique prefix; everything matching is removed at the end."""

    def __init__(self) -> None:
        self.prefix = f"vllm_offload_test{uuid.uuid4().hex}_"
        self.pattern = f"{self.prefix}*.mmap"

    def make(self, index: int | str, size: int = 8192) -> Path:
        path = SHM / f"{self.prefix}{index}.mmap"
        path.write_bytes(os.urandom(size))
        return path

    def present(self) -> list[str]:
        return sorted(p.name for p in SHM.glob(self.pattern))

    def cleanup(self) -> None:
        for path in SHM.glob(f"{self.prefix}*"):
            with contextlib.suppress(OSError):
                path.unlink()


@pytest.fixture
def files() -> Iterator[Files]:
    made = Files()
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def no_podman(tmp_path: Path) -> str:
    script = tmp_path / "podman"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    return str(script)


@contextlib.contextmanager
def holder(path: Path, how: str = "map") -> Iterator[subprocess.Popen]:
    """A real child process that maps (or only holds open) ``path`` until released."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield child
    finally:
        with contextlib.suppress(OSError):
            child.stdin.close()
        child.kill()
        child.wait(timeout=30)


def unreadable_pids() -> list[int]:
    """Live processes whose maps or fd root cannot read (PID 1 of this test VM is one)."""
    found = []
    for item in os.scandir("/proc"):
        if not item.name.isdigit():
            continue
        try:
            with open(f"/proc/{item.name}/maps", "rb") as handle:
                handle.read(1)
            os.listdir(f"/proc/{item.name}/fd")
        except FileNotFoundError:
            continue
        except OSError:
            found.append(int(item.name))
    return sorted(found)


def process_table(where: Path) -> str:
    """/proc when root can read all of it; else links to every /proc/PID root can read.

    On the VM these tests were written on, PID 1 (the VM's agent) refuses /proc/1/maps even
    to root, so the real /proc makes every reclaim refuse (as it must:
    test_the_real_proc_with_a_process_root_cannot_read_refuses).  The other tests then scan
    every other real process through links, made after their child processes started.
    """
    hidden = unreadable_pids()
    if not hidden:
        return "/proc"
    where.mkdir()
    for item in os.scandir("/proc"):
        if item.name.isdigit() and int(item.name) not in hidden:
            (where / item.name).symlink_to(f"/proc/{item.name}")
    return str(where)


def shm_args(files: Files, podman: str, **extra) -> dict:
    proc = extra.pop("proc_root", None) or process_table(Path(podman).parent / uuid.uuid4().hex)
    return {"pattern": files.pattern, "settle": 0.05, "podman": podman, "proc_root": proc, **extra}


def test_status_lists_the_mapped_file_as_live_with_the_child_pid_and_deletes_nothing(files, no_podman):
    mapped, orphan = files.make("mapped"), files.make("orphan")
    with holder(mapped) as child:
        out = run_module(shm_offload, shm_args(files, no_podman))
    assert not out.failed and out.result["changed"] is False and out.result["proven"] is True
    # Python's mmap keeps a duplicate of the descriptor: the child both maps and holds it open.
    assert [(x["path"], x["pids"], x["how"]) for x in out.result["live"]] == [
        (str(mapped), [child.pid], ["mapped", "open"])
    ]
    assert [x["path"] for x in out.result["orphans"]] == [str(orphan)]
    assert out.result["reclaimed"] == [] and out.result["bytes_freed"] == 0
    assert files.present() == sorted([mapped.name, orphan.name])


def test_reclaim_keeps_mapped_and_open_files_and_frees_the_orphans(files, no_podman):
    mapped, held = files.make("mapped"), files.make("held")
    orphans = [files.make(i, size) for i, size in ((0, 8192), (1, 12288), (2, 1))]
    allocated = sum(p.stat().st_blocks * 512 for p in orphans)
    with holder(mapped) as mapper, holder(held, "open") as opener:
        out = run_module(shm_offload, shm_args(files, no_podman, state="reclaimed", confirm=True))
        assert files.present() == sorted([mapped.name, held.name])
    assert not out.failed and out.result["changed"] is True
    live = {x["path"]: (x["pids"], x["how"]) for x in out.result["live"]}
    assert live == {
        str(mapped): ([mapper.pid], ["mapped", "open"]),
        str(held): ([opener.pid], ["open"]),
    }
    assert sorted(x["path"] for x in out.result["reclaimed"]) == sorted(map(str, orphans))
    assert out.result["bytes_freed"] == allocated == 8192 + 12288 + 4096


def test_a_file_mapped_by_two_processes_names_both(files, no_podman):
    mapped = files.make("shared")
    with holder(mapped) as one, holder(mapped) as two:
        out = run_module(shm_offload, shm_args(files, no_podman, state="reclaimed", confirm=True))
    assert out.result["live"][0]["pids"] == sorted([one.pid, two.pid])
    assert out.result["reclaimed"] == [] and files.present() == [mapped.name]


def test_once_the_mapping_process_is_gone_its_file_is_an_orphan(files, no_podman):
    mapped = files.make("was-mapped")
    with holder(mapped):
        pass
    out = run_module(shm_offload, shm_args(files, no_podman, state="reclaimed", confirm=True))
    assert [x["path"] for x in out.result["reclaimed"]] == [str(mapped)]
    assert files.present() == []


def test_other_owners_files_links_and_folders_are_never_deleted(files, no_podman, tmp_path):
    foreign = files.make("foreign")
    os.chown(foreign, NOBODY, NOBODY)
    outside = tmp_path / "outside.mmap"
    outside.write_bytes(b"keep me")
    link = SHM / f"{files.prefix}link.mmap"
    link.symlink_to(outside)
    folder = SHM / f"{files.prefix}dir.mmap"
    folder.mkdir()
    try:
        out = run_module(shm_offload, shm_args(files, no_podman, state="reclaimed", confirm=True))
        reasons = {Path(x["path"]).name: x["reason"] for x in out.result["skipped"]}
        assert not out.failed and out.result["changed"] is False and out.result["reclaimed"] == []
        assert "owned by uid 65534, not root" in reasons[foreign.name]
        assert "symbolic link" in reasons[link.name] and "directory" in reasons[folder.name]
        assert foreign.exists() and link.is_symlink() and folder.is_dir()
        assert outside.read_bytes() == b"keep me"
        as_nobody = run_module(
            shm_offload,
            shm_args(files, no_podman, state="reclaimed", confirm=True, owner="nobody"),
        )
        assert [x["path"] for x in as_nobody.result["reclaimed"]] == [str(foreign)]
    finally:
        with contextlib.suppress(OSError):
            folder.rmdir()


def test_without_confirm_nothing_is_deleted_and_the_option_is_named(files, no_podman):
    orphan = files.make("orphan")
    for check_mode in (False, True):
        out = run_module(shm_offload, shm_args(files, no_podman, state="reclaimed"), check_mode=check_mode)
        assert out.failed and "confirm: true" in out.result["msg"]
    assert files.present() == [orphan.name]


def test_check_mode_reports_what_would_be_reclaimed(files, no_podman):
    orphan = files.make("orphan", 4096)
    args = shm_args(files, no_podman, state="reclaimed", confirm=True, _ansible_diff=True)
    out = run_module(shm_offload, args, check_mode=True)
    assert out.result["changed"] and [x["path"] for x in out.result["reclaimed"]] == [str(orphan)]
    assert out.result["bytes_freed"] == 4096
    assert out.result["diff"]["before"] == f"{orphan}\n" and out.result["diff"]["after"] == ""
    assert files.present() == [orphan.name]


def test_a_copied_process_table_with_one_unreadable_maps_refuses_and_deletes_nothing(
    files, no_podman, tmp_path
):
    orphan = files.make("orphan")
    for pid, maps in ((100, b"7f00-7f10 r--p 00000000 00:00 0 [heap]\n"), (101, None)):
        (tmp_path / str(pid) / "fd").mkdir(parents=True)
        if maps is None:
            (tmp_path / str(pid) / "maps").mkdir()  # a read fails, as EACCES would for non-root
        else:
            (tmp_path / str(pid) / "maps").write_bytes(maps)
    args = shm_args(files, no_podman, proc_root=str(tmp_path))
    status = run_module(shm_offload, args)
    assert not status.failed and status.result["proven"] is False
    assert status.result["orphans"] == [] and [x["path"] for x in status.result["unproven"]] == [str(orphan)]
    assert "PID 101" in status.result["refusals"][0]
    out = run_module(shm_offload, {**args, "state": "reclaimed", "confirm": True})
    assert out.failed and "nothing reclaimed" in out.result["msg"] and "PID 101" in out.result["msg"]
    assert "docs/failure-catalog.md#f13" in out.result["msg"]
    assert files.present() == [orphan.name]


def test_the_real_proc_with_a_process_root_cannot_read_refuses(files, no_podman):
    hidden = unreadable_pids()
    if not hidden:
        pytest.skip("root reads every /proc entry here; the nobody test below covers EACCES")
    orphan = files.make("orphan")
    args = {"pattern": files.pattern, "settle": 0.05, "podman": no_podman}
    out = run_module(shm_offload, {**args, "state": "reclaimed", "confirm": True})
    assert out.failed and f"cannot read /proc/{hidden[0]}/maps (PID {hidden[0]} is alive)" in out.result["msg"]
    assert out.result["reclaimed"] == [] and files.present() == [orphan.name]


NOBODY_SURVEY = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _shm_offload as shm
verdict = shm.survey("/dev/shm", sys.argv[2], 65534, "nobody", settle=0.05)
print(json.dumps({"refusals": verdict.refusals, "orphans": [e.path for e in verdict.orphans]}))
"""


def test_as_a_user_who_cannot_read_roots_proc_entries_it_refuses(files):
    python = "/usr/bin/python3"  # the venv's lives under /root, which nobody cannot enter
    if not os.access(python, os.X_OK):
        pytest.skip(f"no {python} for the unprivileged run")
    orphan = files.make("orphan")
    os.chown(orphan, NOBODY, NOBODY)
    with holder(files.make("unrelated"), "open"):  # one root process that surely exists
        done = subprocess.run(
            [python, "-c", NOBODY_SURVEY, str(COLLECTIONS), files.pattern],
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["refusals"] and all("Permission denied" in r for r in verdict["refusals"])
    assert orphan.exists()


BAD_INPUT = [
    ({"pattern": "../etc/*"}, "pattern: '../etc/*' contains a path separator"),
    ({"pattern": "*"}, "literal characters"),
    ({"directory": "/nonexistent-shm"}, "directory: cannot inspect /nonexistent-shm"),
    ({"owner": "no-such-user"}, "owner: no user 'no-such-user'"),
    ({"settle": -1}, "settle: -1.0 is outside"),
    ({"timeout": 0}, "timeout: 0.0 is outside"),
    ({"podman": "/nonexistent/podman"}, "podman: '/nonexistent/podman' is not an executable"),
]


@pytest.mark.parametrize(("args", "msg"), BAD_INPUT, ids=[str(b[0]) for b in BAD_INPUT])
def test_bad_input_names_the_option(no_podman, args, msg):
    out = run_module(shm_offload, {"podman": no_podman, **args})
    assert out.failed and msg in out.result["msg"]
    assert "Traceback" not in out.result["msg"]
