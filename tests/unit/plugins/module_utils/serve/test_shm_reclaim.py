# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one core behind shm_offload and shm-offload (module_utils/serve/_shm_reclaim.py), F13.

Both front doors check the same inputs in the same order and each refusal names the option as
its door spells it (a case table: the module's ``settle``, the program's ``--settle``); the
module's door reports, predicts in check mode and reclaims an orphan on a tmp directory with a
copied process table. The evidence itself is test_shm_offload.py's; the program's lines and
exit codes are test_shm_offload_cli.py's.
"""

from __future__ import annotations

import math
import os
import pwd
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve._shm_offload import (
    ShmOffloadError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._shm_reclaim import (
    MODULE,
    PROGRAM,
    module_result,
    survey_offload,
)

from tests.unit.plugins.module_utils.serve.test_shm_offload import fake_proc, maps_line

PATTERN = "vllm_offload_*.mmap"


def options(tmp_path: Path, **given) -> dict:
    base = {"directory": str(tmp_path), "proc_root": str(tmp_path), "pattern": PATTERN,
            "owner": "root", "settle": 0.0, "timeout": 60.0, "podman": None}
    return {**base, **given}


@pytest.mark.parametrize(
    ("given", "module_says", "program_says"),
    [
        ({"directory": "relative"}, "directory:", "--directory:"),
        ({"proc_root": "relative"}, "proc_root:", "--proc-root:"),
        ({"settle": 61.0}, "settle: 61.0 is outside 0 to 60 seconds", "--settle: 61.0 is outside 0 to 60 seconds"),
        ({"timeout": math.nan}, "timeout: nan is outside 1 to 600 seconds", "--timeout: nan is outside 1 to 600 seconds"),
        ({"podman": "/nonexistent/podman"},
         "podman: '/nonexistent/podman' is not an executable; give the Podman binary or leave the option out",
         "--podman: '/nonexistent/podman' is not an executable; give the Podman binary"),
        ({"pattern": "*"}, "literal", "literal"),
        ({"owner": "no-such-user-here"}, "no user", "no user"),
    ],
    ids=["directory", "proc_root", "settle", "NaN timeout", "podman", "a bare glob", "an unknown owner"],
)
def test_each_door_names_the_bad_option_its_own_way(tmp_path, given, module_says, program_says):
    for names, says in ((MODULE, module_says), (PROGRAM, program_says)):
        with pytest.raises(ShmOffloadError) as caught:
            survey_offload(options(tmp_path, **given), names)
        assert says in str(caught.value), names


def test_the_first_bad_input_is_the_same_through_both_doors(tmp_path):
    both_bad = options(tmp_path, directory="relative", settle=99.0)
    said = []
    for names in (MODULE, PROGRAM):
        with pytest.raises(ShmOffloadError) as caught:
            survey_offload(both_bad, names)
        said.append(str(caught.value).split(":")[0])
    assert said == ["directory", "--directory"]


def test_reclaiming_needs_confirm_before_anything_is_read(tmp_path):
    params = {**options(tmp_path, directory="relative"), "state": "reclaimed", "confirm": False}
    with pytest.raises(ShmOffloadError, match="set confirm: true to proceed"):
        module_result(params, check_mode=False, diff=False, warn=print)


@pytest.fixture
def shm(tmp_path):
    """An orphan offload file in a tmp directory, a process table where one process maps
    another file, and a Podman that runs no container."""
    directory = tmp_path / "shm"
    directory.mkdir()
    orphan = directory / "vllm_offload_0.mmap"
    orphan.write_bytes(b"\0" * 8192)
    proc = fake_proc(tmp_path / "proc", {os.getpid(): maps_line(Path("/etc/hostname"))})
    podman = tmp_path / "podman"
    podman.write_text("#!/bin/sh\nexit 0\n")
    podman.chmod(0o755)
    owner = pwd.getpwuid(os.getuid()).pw_name
    params = {**options(tmp_path, directory=str(directory), proc_root=str(proc), podman=str(podman),
                        owner=owner), "state": "status", "confirm": False}
    return params, orphan


def test_status_reports_the_orphan_and_deletes_nothing(shm):
    params, orphan = shm
    out = module_result(params, check_mode=False, diff=False, warn=print)
    assert out["proven"] is True and out["changed"] is False
    assert [o["path"] for o in out["orphans"]] == [str(orphan)] and out["unproven"] == []
    assert out["sources"]["proc"] == params["proc_root"] and out["sources"]["podman"] == params["podman"]
    assert out["containers"] == [] and out["refusals"] == []
    assert orphan.exists()


def test_check_mode_predicts_the_reclaim_with_its_diff(shm):
    params, orphan = shm
    out = module_result({**params, "state": "reclaimed", "confirm": True}, check_mode=True, diff=True, warn=print)
    assert out["changed"] is True and [r["path"] for r in out["reclaimed"]] == [str(orphan)]
    assert out["bytes_freed"] == orphan.stat().st_blocks * 512
    assert out["diff"]["before"] == f"{orphan}\n" and out["diff"]["after"] == ""
    assert orphan.exists()


def test_reclaimed_deletes_the_proven_orphan(shm):
    params, orphan = shm
    warned: list[str] = []
    out = module_result({**params, "state": "reclaimed", "confirm": True}, check_mode=False, diff=False,
                        warn=warned.append)
    assert out["changed"] is True and not orphan.exists()
    assert warned == []
