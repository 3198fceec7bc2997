# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``serving_state`` reads on the node before it decides (the observe of observe -> decide -> apply).

:func:`live` reads the node's serving.json against the rendered one (the restart path's
verifier, ``_restart.verify_node``); :func:`observe` reads what :func:`_reconcile.decide`
weighs: the current text of every file a step may write, the kind of every file it may
remove, the names in the staging unit directory. Reads only; nothing here writes.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.serve._reconcile import (
    ABSENT,
    DIRECTORY,
    REMOVABLE,
    SPECIAL,
    Observed,
    previous_path,
    staged_unit_root,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._restart import verify_node
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    StateFileError,
    check_document,
    differences,
    parse_document,
    read_text,
    unit_file_problems,
)

STATE_FIX = (
    "run the rollout (state=present rewrites serving.json and the units); if the file is not the "
    "collection's, move it away"
)


def load(path: str, unit_dirs: list[str], label: str) -> tuple:
    """``(text, document, trusted, problems)`` of a state document on the node; never raises.

    ``text`` is None when the file does not exist (no problem then).
    """
    try:
        text = read_text(path)
    except StateFileError as exc:
        return None, None, check_document(None, unit_dirs, label)[0], [f"{label}: {exc}"]
    if text is None:
        return None, None, check_document(None, unit_dirs, label)[0], []
    document, found = parse_document(text, label)
    if found:
        return text, None, check_document(None, unit_dirs, label)[0], found
    trusted, found = check_document(document, unit_dirs, label)
    return text, document, trusted, found


def live(state_path: str, unit_dirs: list[str], document: dict[str, Any]) -> tuple:
    """``(text, live, trusted, live_diff, findings)``: the node's document against the ask."""
    live_text, live, trusted, live_problems = load(state_path, unit_dirs, "serving.json")
    if live_text is None and not live_problems:
        live_diff = differences(None, document)
    elif live_problems:
        # A malformed document is reported by what is wrong with it, not key by key.
        live_diff = list(live_problems) + unit_file_problems(trusted, read_text)
    else:
        # What is on disk against what was rendered: the restart path's one verifier.
        live_diff = verify_node(live, unit_dirs, read_text, wanted=document)["problems"]
    findings = [finding("F10", "error", problem, STATE_FIX) for problem in live_problems]
    return live_text, live, trusted, live_diff, findings


def _current(path: str) -> str | None:
    try:
        return read_text(path)
    except StateFileError:
        return None  # a binary or unreadable file of ours is replaced


def _lstat_kind(path: str) -> str:
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode):
        return REMOVABLE
    return DIRECTORY if stat.S_ISDIR(info.st_mode) else SPECIAL


def observe(
    state: str, units: list[dict[str, Any]], trusted: dict[str, Any], state_path: str, staging_dir: str
) -> Observed:
    """What ``decide`` weighs: the files a step may write or remove, the staged unit names."""
    writes, removals, names = [], [], ()
    if state == "staged":
        root = staged_unit_root(staging_dir)
        writes = [os.path.join(staging_dir, "serving.json"), *(os.path.join(root, u["name"]) for u in units)]
        names = tuple(os.listdir(root)) if os.path.isdir(root) else ()
        removals = [os.path.join(root, name) for name in names]
    elif state in ("present", "absent"):
        if state == "present":
            writes = [state_path, previous_path(state_path), *(u["path"] for u in units)]
        removals = [u["path"] for u in trusted["units"]]
    return Observed(
        texts={path: _current(path) for path in writes},
        directories=frozenset(path for path in {state_path, *writes} if os.path.isdir(path)),
        kinds={path: _lstat_kind(path) for path in removals},
        staged_names=names,
    )
