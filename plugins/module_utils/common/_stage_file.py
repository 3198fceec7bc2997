# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``stage_result``: a stage's saved result on the node, written, read back, and judged still true.

state=present writes the stage's result (``_stage_result.document``, with the live record of
what it watches) atomically, outside check mode; state=read returns it, refusing one written by
another version; state=converged says whether the stage may be skipped: the saved inputs hash
and what it watches (files, units, commands, secrets) are as recorded
(``_stage_result.judge_converged``), and every prove command exits 0.

No AnsibleModule here: ``module`` is the caller's (``params``, ``check_mode``, ``_diff``,
``atomic_move``).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
    timeout_error,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._site_check import (
    FirstToken,
    Reverify,
    check_options,
    node_reason,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    StageResultError,
    check_document,
    document,
    inputs_hash,
    judge_converged,
    live_record,
    merge_watch,
    recorded_watch,
    render,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._systemctl import (
    parse_unit_show,
)

MAX_BYTES = 16 * 1024 * 1024
_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]+\.(service|socket|target|timer|mount|path)\Z")


def _read(path: str) -> bytes | None:
    if not os.path.lexists(path):
        return None
    if not os.path.isfile(path) or os.path.islink(path):
        raise StageResultError(f"{path} is not a regular file; remove it and re-run the stage")
    if os.path.getsize(path) > MAX_BYTES:
        raise StageResultError(f"{path} is larger than {MAX_BYTES} bytes: not a saved result")
    return _files.read_bytes(path, MAX_BYTES)  # bounded, should it grow after the check


def _write(module: Any, path: str, text: str) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".stage-result-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    module.atomic_move(tmp, path)


def _file_digest(path: str) -> str | None:
    if not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    _files.hash_into(path, digest)
    return digest.hexdigest()


def _check_commands(option: str, commands: list[Any]) -> None:
    for argv in commands:
        if not argv or not all(isinstance(a, str) and a and "\0" not in a and "\n" not in a for a in argv):
            raise StageResultError(f"{option}: {argv!r} is not a command (a list of one-line words)")


def _commands(commands: list[list[str]], timeout: float) -> dict[str, str]:
    """The watched commands' exit status and output, as one digest each, read now."""
    _check_commands("watch_commands", commands)
    out: dict[str, str] = {}
    for argv in commands:
        try:
            rc, stdout, _ = Runner(timeout).run(argv)
        except CommandError as exc:
            raise StageResultError(str(exc)) from None
        out[" ".join(argv)] = hashlib.sha256(f"rc={rc}\n{stdout}".encode()).hexdigest()
    return out


def _unproven(commands: list[list[str]], timeout: float) -> str | None:
    """Why the first of ``commands`` that does not exit 0 fails (one sentence), or None."""
    for argv in commands:
        try:
            rc, stdout, stderr = Runner(timeout).run(argv)
        except CommandError as exc:
            return str(exc)
        if rc != 0:
            said = (stderr.strip() or stdout.strip()).splitlines()
            return f"{' '.join(argv)} failed (rc {rc}){': ' + said[-1][:200] if said else ''}"
    return None


def _watched(
    watch_files: list[str], units: list[str], timeout: float
) -> tuple[dict[str, str | None], dict[str, dict[str, str]]]:
    """The watched files' digests and the watched units' states, read now."""
    for path in watch_files:
        if not os.path.isabs(path) or "\n" in path:
            raise StageResultError(f"watch_files: {path!r} is not an absolute path on one line")
    for unit in units:
        if not _UNIT.match(unit):
            raise StageResultError(f"watch_units: {unit!r} is not a systemd unit name (e.g. caddy.service)")
    files = {path: _file_digest(path) for path in watch_files}
    states: dict[str, dict[str, str]] = {}
    if units:
        try:
            rc, out, err = Runner(timeout).run(
                ["systemctl", "show", "-p", "Id,ActiveState,UnitFileState", "--", *units]
            )
        except CommandError as exc:
            raise StageResultError(str(exc)) from None
        if rc != 0:
            raise StageResultError(f"systemctl show {' '.join(units)} failed (rc {rc}): {err.strip()[:300]}")
        shown = parse_unit_show(out)
        states = {unit: shown.get(unit, {}) for unit in units}
    return files, states


def _secrets_differ(secrets: list[dict[str, str]]) -> list[str]:
    differ = []
    for secret in secrets:
        path = secret["path"]
        try:
            held = _files.read_bytes(path, MAX_BYTES)
        except OSError:
            held = None
        if held is None or held.removesuffix(b"\n") != secret["content"].removesuffix("\n").encode("utf-8"):
            differ.append(path)
    return differ


def _watch_lists(params: dict[str, Any], recorded: dict[str, list[Any]] | None = None) -> dict[str, list[Any]]:
    """The options' watch lists, and those ``recorded`` with a saved result (O(watch_recorded))."""
    recorded = recorded or {"files": [], "units": [], "commands": []}
    return {
        "files": merge_watch(params["watch_files"], recorded["files"]),
        "units": merge_watch(params["watch_units"], recorded["units"]),
        "commands": merge_watch(params["watch_commands"], recorded["commands"]),
    }


def _converged(
    params: dict[str, Any],
    raw: bytes | None,
    where: str,
    check_mode: bool = False,
    reverify: Reverify | None = None,
    first_token: FirstToken | None = None,
) -> dict[str, Any]:
    stage = params["stage"]
    _check_commands("prove_commands", params["prove_commands"])
    doc, untrusted, recorded = None, None, None
    if raw is not None:
        try:
            doc = check_document(raw, stage, where)
            if params["watch_recorded"]:
                recorded = recorded_watch(doc["result"], where)
        except StageResultError as exc:
            # The stage about to run writes it again: asking the user to re-run it would loop.
            doc, untrusted = None, f"the saved result cannot be trusted ({exc})"
    if doc is not None and any(k not in doc["result"] for k in params["required_keys"]):
        doc, untrusted = None, "the saved result was written by another version"
    watch = _watch_lists(params, recorded)
    files, units = _watched(watch["files"], watch["units"], params["timeout"])
    want = inputs_hash(params["inputs"]) if params["inputs"] is not None else None
    fingerprint = inputs_hash(params["fingerprint"]) if params["fingerprint"] is not None else None
    reason = judge_converged(
        doc,
        want,
        files,
        units,
        _secrets_differ(params["watch_secrets"]),
        fingerprint,
        _commands(watch["commands"], params["timeout"]),
    )
    if untrusted:
        reason = untrusted
    if reason is None:
        reason = _unproven(params["prove_commands"], params["timeout"])
    found: dict[str, Any] = {}
    if reason is None and doc is not None:
        reason, found = node_reason(doc["result"], params, check_mode, reverify, first_token)
    return {
        "changed": bool(found.get("weights_restored")),
        **found,
        "converged": reason is None,
        "reason": reason,
        "found": doc is not None,
        "inputs_hash": doc["inputs_hash"] if doc else None,
        "result": doc["result"] if doc else {},
    }


def run(module: Any, reverify: Reverify | None = None, first_token: FirstToken | None = None) -> dict[str, Any]:
    """The module's result for its ``state``; raises StageResultError or OSError to refuse.

    ``reverify`` and ``first_token`` are the weights' re-verify and the engine's token probe
    (``_site_check.node_reason``), handed in by the module for ``reverify_weights`` and ``stream``."""
    params = module.params
    stage = params["stage"]
    path = params["path"] or f"/etc/localinference/{stage}.json"
    where = f"{path} ({stage} result)"
    problem = timeout_error(params["timeout"])
    if problem:
        raise StageResultError(problem)
    check_options(params)
    raw = _read(path)
    if params["state"] == "converged":
        return {"path": path, **_converged(params, raw, where, module.check_mode, reverify, first_token)}
    if params["state"] == "read":
        if raw is None:
            if params["required"]:
                raise StageResultError(
                    f"no saved {stage} result at {path}: run the {stage} stage first"
                    f" (--tags {stage}) or the whole site.yml"
                )
            return {"changed": False, "path": path, "found": False, "inputs_hash": None, "result": {}}
        doc = check_document(raw, stage, where)
        missing = [k for k in params["required_keys"] if k not in doc["result"]]
        if missing:
            raise StageResultError(
                f"{where} lacks {', '.join(missing)}: it was written by another version;"
                f" re-run the {stage} stage (--tags {stage})"
            )
        return {
            "changed": False,
            "path": path,
            "found": True,
            "inputs_hash": doc["inputs_hash"],
            "result": doc["result"],
        }
    if params["result"] is None:
        raise StageResultError("result is required with state=present")
    live = None
    watch = _watch_lists(params)
    result = params["result"]
    if params["watch_recorded"]:
        result = {**result, "watch": watch}
    if watch["files"] or watch["units"] or watch["commands"] or params["fingerprint"] is not None:
        fingerprint = inputs_hash(params["fingerprint"]) if params["fingerprint"] is not None else None
        live = live_record(
            *_watched(watch["files"], watch["units"], params["timeout"]),
            fingerprint=fingerprint,
            commands=_commands(watch["commands"], params["timeout"]),
        )
    doc = document(stage, params["inputs"], result, live)
    text = render(doc)
    before = raw.decode("utf-8", "replace") if raw is not None else ""
    changed = before != text
    if changed and not module.check_mode:
        _write(module, path, text)
    out: dict[str, Any] = {
        "changed": changed,
        "path": path,
        "found": True,
        "inputs_hash": doc["inputs_hash"],
        "result": doc["result"],
    }
    if module._diff:
        out["diff"] = {"before": before, "after": text, "before_header": path, "after_header": path}
    return out
