# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``stack_lock``'s lockfile on the head: read it, diff a new entry against it, record it.

The history's judgement (entries, diffs, the revert plan, what a record keeps) is
``_stack_lock``'s; here the file is read (bounded, a malformed file is a finding) and written
atomically, outside check mode, with the malformed one kept aside. :func:`run` is the module:
state=gathered reads the node (``_stack_gather``), the other states the lockfile.

No AnsibleModule here: ``module`` is the caller's (``params``, ``check_mode``, ``_diff``,
``warn``, ``fail_json``, ``atomic_move``).
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    timeout_error,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    StateFileError,
    read_text,
)
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade import _stack_lock as lock
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade._stack_gather import (
    gather,
)

MAX_LOCK_BYTES = 16 * 1024 * 1024


def _read_lock(path: str) -> tuple[bool, str | None, list[dict[str, Any]], list[dict[str, Any]]]:
    """``(found, text, entries, findings)``; a file that cannot be read is a finding."""
    try:
        text = read_text(path, MAX_LOCK_BYTES)
    except StateFileError as exc:
        fix = f"move {path} aside (the next good rollout records a new history)"
        return True, None, [], [finding(lock.CHECK, "error", str(exc), fix, path=path)]
    if text is None:
        return False, None, [], []
    entries, findings = lock.check_document(text, path)
    return True, text, entries, findings


def _write(module: Any, path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".stack-lock-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    module.atomic_move(tmp, path)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def history(module: Any) -> dict[str, Any]:
    """state=read, diffed or recorded: the lockfile's history, and the new entry recorded."""
    params = module.params
    path = params["path"]
    found, text, entries, findings = _read_lock(path)
    for item in findings:
        module.warn(f"stack_lock: {item['message']}")
    out: dict[str, Any] = {"changed": False, "path": path, "found": found, "findings": findings}
    state = params["state"]
    if state == "read":
        current = entries[0] if entries else None
        last_good = entries[1] if len(entries) > 1 else None
        out.update(
            entry=current,
            last_good=last_good,
            changes=lock.diff_entries(last_good, current) if last_good else [],
            entries=entries,
            revert=lock.revert_plan(entries, findings, path),
        )
        return out
    if params["nodes"] is None:
        if state == "recorded":
            raise lock.StackLockError(
                "nodes is required with state=recorded (the gathered records)"
            )
        current = entries[0] if entries else None
        last_good = entries[1] if len(entries) > 1 else None
        out.update(
            entry=current,
            last_good=last_good,
            changes=lock.diff_entries(last_good, current) if last_good else [],
        )
        return out
    entry = lock.build_entry(params["nodes"], _now())
    result = lock.record(entries, entry, params["keep"])
    out.update(
        entry=result["entry"],
        changes=result["changes"],
        last_good=result["last_good"],
        added=result["added"],
    )
    if state == "diffed":
        return out
    new_text = lock.render(result["entries"])
    out["changed"] = changed = new_text != text
    if changed and not module.check_mode:
        if findings and text is not None and any(f["severity"] == "error" for f in findings):
            _write(module, path + ".malformed", text)
        _write(module, path, new_text)
    if module._diff:
        out["diff"] = {
            "before": text or "",
            "after": new_text,
            "before_header": path,
            "after_header": path,
        }
    return out


def run(module: Any) -> dict[str, Any]:
    """The module's result for its ``state``; raises StackLockError or OSError to refuse."""
    for option in ("timeout", "image_timeout"):
        problem = timeout_error(module.params[option], option)
        if problem:
            module.fail_json(msg=problem)
    return gather(module) if module.params["state"] == "gathered" else history(module)
