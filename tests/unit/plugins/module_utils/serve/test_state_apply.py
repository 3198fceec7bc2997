# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""serving_state's writes and removals (module_utils/serve/_state_apply.Files), on a tmp tree.

Files honours check mode (it says what would change and changes nothing), writes atomically
with the unit's mode, refuses a directory where a file belongs before anything changes, and
removes only regular files and links (never followed). run() is exercised end to end by
tests/unit/plugins/modules/test_serving_state*.py.
"""

from __future__ import annotations

import os
import stat

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state_apply import Files
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit


def files(check_mode: bool = False) -> Files:
    return Files(FakeModule({}, check_mode=check_mode), {"changed": False})


def test_a_write_creates_the_directory_sets_the_mode_and_is_idempotent(tmp_path):
    path = tmp_path / "units" / "gid-start"
    assert files().write(str(path), "#!/bin/sh\n", "checks.programs", mode=0o755) is True
    assert path.read_text() == "#!/bin/sh\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert files().write(str(path), "#!/bin/sh\n", "checks.programs", mode=0o755) is False
    assert [p.name for p in path.parent.iterdir()] == ["gid-start"]  # no temporary file left


def test_check_mode_says_a_write_would_change_and_writes_nothing(tmp_path):
    path = tmp_path / "serving.json"
    assert files(check_mode=True).write(str(path), "{}\n", "path") is True
    assert not path.exists()


def test_a_directory_where_the_file_belongs_ends_the_module_naming_the_option(tmp_path):
    (tmp_path / "serving.json").mkdir()
    with pytest.raises(ModuleExit) as caught:
        files().write(str(tmp_path / "serving.json"), "{}\n", "path")
    assert caught.value.result["msg"] == (
        f"path: {tmp_path}/serving.json is a directory where a file belongs; remove it or choose another path"
    )
    assert caught.value.result["changed"] is False  # the result so far goes with the failure


@pytest.mark.parametrize(
    ("make", "changed", "problem", "left"),
    [
        ("nothing", False, None, False),
        ("file", True, None, False),
        ("link", True, None, False),
        ("directory", False, "is a directory, not a unit file the collection wrote; left in place", True),
        ("fifo", False, "is not a regular file, not a unit file the collection wrote; left in place", True),
    ],
    ids=["absent", "a file", "a link, not its target", "a directory", "a FIFO"],
)
def test_remove_takes_only_files_and_links(tmp_path, make, changed, problem, left):
    path = tmp_path / "localinference-vllm.container"
    target = tmp_path / "target"
    target.write_text("kept")
    if make == "file":
        path.write_text("[Container]\n")
    elif make == "link":
        os.symlink(target, path)
    elif make == "directory":
        path.mkdir()
    elif make == "fifo":
        os.mkfifo(path)
    done, said = files().remove(str(path))
    assert done is changed
    assert (said is None) if problem is None else said == f"{path}: {problem}"
    assert os.path.lexists(path) is left and target.read_text() == "kept"


def test_check_mode_removes_nothing(tmp_path):
    path = tmp_path / "old.container"
    path.write_text("[Container]\n")
    assert files(check_mode=True).remove(str(path)) == (True, None)
    assert path.exists()
