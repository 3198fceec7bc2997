# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``shm-offload reclaim --confirm`` as the serving units run it (F13), on real tmpfs files.

Exit 0 with one stdout line when nothing is left to reclaim (no file, files in use, orphans
deleted); 1 with one stderr line starting with the refusal marker when orphans cannot be
proven unused or the input is wrong. Each test makes its own files in /dev/shm under a unique
prefix and removes them; Podman is a stand-in that lists no container (the container check is
tested in test_shm_offload.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve._shm_offload_cli import (
    REFUSAL_MARKER,
    main,
)

from tests.unit.plugins.module_utils.serve.test_shm_offload import fake_proc, maps_line
from tests.unit.plugins.modules.test_shm_offload import SHM, Files, holder, process_table

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not SHM.is_dir(),
    reason="needs root (to read every /proc/PID/maps) and a /dev/shm tmpfs",
)


@pytest.fixture
def files():
    made = Files()
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def podman(tmp_path: Path) -> str:
    script = tmp_path / "podman"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    return str(script)


def reclaim(files: Files, podman: str, *extra: str) -> list[str]:
    """The argv; the process table is /proc, or links to what root can read of it (see
    test_shm_offload.process_table: this VM's PID 1 refuses its maps even to root)."""
    if "--proc-root" not in extra:
        table = process_table(Path(podman).parent / f"proc-{len(os.listdir(Path(podman).parent))}")
        extra = (*extra, "--proc-root", table)
    return [
        "reclaim", "--confirm", "--pattern", files.pattern, "--settle", "0",
        "--podman", podman, *extra,
    ]


def test_orphans_are_reclaimed_and_a_mapped_file_is_kept(files, podman, capsys):
    orphan = files.make(0)
    mapped = files.make(1)
    with holder(mapped):
        assert main(reclaim(files, podman)) == 0
        out, err = capsys.readouterr()
        assert err == ""
        assert out.startswith("localinference shm-offload: reclaimed 1 orphan(s) in /dev/shm/")
        assert "1 in use" in out
        assert not orphan.exists() and mapped.exists()
        assert main(reclaim(files, podman)) == 0
        assert "nothing to reclaim" in capsys.readouterr().out
    assert files.present() == [mapped.name]


def test_nothing_there_is_nothing_to_do(files, podman, capsys):
    assert main(reclaim(files, podman)) == 0
    assert capsys.readouterr().out.startswith("localinference shm-offload: nothing to reclaim")


def test_an_unreadable_process_entry_refuses_and_deletes_nothing(tmp_path, files, podman, capsys):
    orphan = files.make(0)
    proc = fake_proc(tmp_path / "proc", {os.getpid(): maps_line(Path("/etc/hostname")), 424242: None})
    assert main(reclaim(files, podman, "--proc-root", str(proc))) == 1
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"{REFUSAL_MARKER}: 1 possible orphan(s)")
    assert "cannot be proven unused" in line and line.endswith("(docs/failure-catalog.md#f13)")
    assert orphan.exists()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["reclaim"], "add --confirm"),
        (["reclaim", "--confirm", "--pattern", "*"], "literal"),
        (["reclaim", "--confirm", "--directory", "relative"], "absolute"),
        (["reclaim", "--confirm", "--owner", "no-such-user-here"], "no user"),
        (["reclaim", "--confirm", "--settle", "99"], "--settle"),
        (["reclaim", "--confirm", "--podman", "/nonexistent/podman"], "--podman"),
    ],
    ids=["no confirm", "bare glob", "relative directory", "unknown owner", "settle", "podman"],
)
def test_bad_input_refuses_with_one_line(argv, said, capsys):
    assert main(argv) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(REFUSAL_MARKER) and said in line


def test_status_reports_json_and_deletes_nothing(files, podman, capsys):
    orphan = files.make(0)
    argv = reclaim(files, podman)
    argv[0:2] = ["status"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["proven"] is True
    assert [o["path"] for o in report["orphans"]] == [str(orphan)]
    assert orphan.exists()


def test_usage_errors_exit_2():
    with pytest.raises(SystemExit) as usage:
        main(["remove"])
    assert usage.value.code == 2
