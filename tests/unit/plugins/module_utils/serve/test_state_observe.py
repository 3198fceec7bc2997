# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What serving_state reads before it decides (module_utils/serve/_state_observe.py), on a tmp tree.

``observe`` gives ``_reconcile.decide`` the text of every file a step may write, the kind of
every file it may remove (links never followed) and the staged unit names; ``load`` reads a
state document and never raises. The decisions themselves are test_reconcile.py's case table.
"""

from __future__ import annotations

import os

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve._reconcile import (
    ABSENT,
    DIRECTORY,
    REMOVABLE,
    SPECIAL,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state_observe import (
    STATE_FIX,
    live,
    load,
    observe,
)

UNIT_DIRS = ["/etc/containers/systemd", "/etc/systemd/system"]
NO_UNITS = {"units": [], "recipe_hash": None, "start_order": [], "recipe": None}


def test_a_staged_step_reads_its_writes_and_the_names_already_staged(tmp_path):
    staging = tmp_path / "staging"
    (staging / "units").mkdir(parents=True)
    (staging / "serving.json").write_text("{}\n")
    (staging / "units" / "old.container").write_text("[Container]\n")
    (staging / "units" / "subdir").mkdir()
    units = [{"name": "localinference-vllm.container", "content": "x"}]
    seen = observe("staged", units, NO_UNITS, str(tmp_path / "serving.json"), str(staging))
    assert seen.texts == {
        str(staging / "serving.json"): "{}\n",
        str(staging / "units" / "localinference-vllm.container"): None,
    }
    assert sorted(seen.staged_names) == ["old.container", "subdir"]
    assert seen.kinds == {
        str(staging / "units" / "old.container"): REMOVABLE,
        str(staging / "units" / "subdir"): DIRECTORY,
    }
    assert seen.directories == frozenset()


def test_present_reads_the_document_its_backup_and_each_unit_and_names_a_directory(tmp_path):
    state = tmp_path / "serving.json"
    state.mkdir()  # a directory where the document belongs: decide refuses it by name
    unit = tmp_path / "units" / "localinference-vllm.container"
    seen = observe("present", [{"path": str(unit)}], NO_UNITS, str(state), str(tmp_path / "staging"))
    assert set(seen.texts) == {str(state), str(tmp_path / "serving.previous.json"), str(unit)}
    assert seen.directories == frozenset({str(state)})
    assert seen.kinds == {} and seen.staged_names == ()


@pytest.mark.parametrize(
    ("make", "kind"),
    [("nothing", ABSENT), ("file", REMOVABLE), ("link", REMOVABLE), ("directory", DIRECTORY),
     ("fifo", SPECIAL)],
    ids=["absent", "a file", "a link is not followed", "a directory", "a FIFO"],
)
def test_absent_knows_the_kind_of_every_unit_it_would_remove(tmp_path, make, kind):
    path = tmp_path / "localinference-vllm.container"
    if make == "file":
        path.write_text("[Container]\n")
    elif make == "link":
        os.symlink(tmp_path / "elsewhere", path)
    elif make == "directory":
        path.mkdir()
    elif make == "fifo":
        os.mkfifo(path)
    trusted = {**NO_UNITS, "units": [{"path": str(path)}]}
    seen = observe("absent", [], trusted, str(tmp_path / "serving.json"), str(tmp_path))
    assert seen.kinds == {str(path): kind} and seen.texts == {}


@pytest.mark.parametrize(
    ("content", "text", "refused"),
    [
        (None, None, False),
        ("not json", "not json", True),
        (b"\xff\xfe", None, True),
    ],
    ids=["absent: no problem", "not JSON", "not UTF-8"],
)
def test_load_never_raises_and_names_what_is_wrong(tmp_path, content, text, refused):
    path = tmp_path / "serving.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    found, document, trusted, problems = load(str(path), UNIT_DIRS, "serving.json")
    assert (found, document, trusted["units"]) == (text, None, [])
    assert bool(problems) is refused
    assert all(problem.startswith("serving.json") for problem in problems)


def test_a_malformed_live_document_is_an_f10_finding_with_the_fix(tmp_path):
    path = tmp_path / "serving.json"
    path.write_text("{not json")
    _, document, _, diff, findings = live(str(path), UNIT_DIRS, {"recipe_hash": "x"})
    assert document is None and diff
    assert [f["id"] for f in findings] == ["F10"] * len(findings) and findings
    assert all(f["severity"] == "error" and f["fix"] == STATE_FIX for f in findings)


def test_no_live_document_differs_from_the_ask_key_by_key(tmp_path):
    text, document, _, diff, findings = live(str(tmp_path / "serving.json"), UNIT_DIRS, {"recipe_hash": "x"})
    assert (text, document, findings) == (None, None, [])
    assert diff and all(isinstance(line, str) for line in diff)
