#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: stage_result
short_description: Save or read a stage's result, the contract between the stages of the pipeline
version_added: 0.2.0
description:
  - Every stage publishes one typed result, saved on the node it concerns as JSON with the hash of
    its inputs (C(/etc/localinference/preflight.json), C(fabric.json), C(plan.json)). A later stage
    reads the saved result when the earlier stage did not run in this play, so C(--tags rollout)
    works alone on a cluster configured by an earlier run.
  - With O(state=present) the document is written only when its content changes (no timestamps), so
    a second run reports no change.
  - With O(state=read) the document is schema-checked before anything in it is used; a document that
    is not JSON, not a saved result of O(stage), or lacks one of O(required_keys) fails with the path
    and the stage to re-run, never a traceback.
  - With O(state=present), O(watch_files) and O(watch_units) record the sha256 of files on the node and
    the enablement of units with the result. O(state=converged) then tells, in one call, whether the
    stage has nothing to do - the saved inputs hash equals this run's, every watched file has the
    recorded digest, every watched unit is active and enabled as recorded - and returns the saved
    result, which the stage publishes instead of doing its work again.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes.CHANGES
options:
  stage:
    description: The stage whose result this is.
    type: str
    required: true
    choices: [preflight, fabric, plan, weights, ingress, client, qualify, site]
  state:
    description:
      - C(present) saves O(result); C(read) reads and checks the saved document.
      - C(converged) reads it and compares it with O(inputs) and the node (RV(converged), RV(reason)).
    type: str
    default: present
    choices: [present, read, converged]
  path:
    description: The document; default C(/etc/localinference/<stage>.json).
    type: path
  inputs:
    description: What the result was computed from; only its sha256 is saved (RV(inputs_hash)).
    type: raw
  result:
    description: The result to save (O(state=present)).
    type: dict
  required:
    description: With O(state=read), fail when no document exists (naming the stage to run).
    type: bool
    default: false
  required_keys:
    description: Keys the saved C(result) must have (O(state=read) and O(state=converged)); a missing one fails.
    type: list
    elements: str
    default: []
  fingerprint:
    description:
      - What this run depends on, when O(inputs) cannot be known before the stage runs (the client's
        inputs include opencode's version, read by running it); only its sha256 is saved, with the
        watched state (O(state=present)), and compared (O(state=converged)).
      - With O(state=converged), O(inputs) is compared only when given.
    type: raw
  watch_files:
    description:
      - Absolute paths on the node whose sha256 the result records (O(state=present)) or is compared with
        (O(state=converged)); a missing file is recorded as such.
    type: list
    elements: path
    default: []
  watch_units:
    description:
      - systemd units whose enablement (C(UnitFileState)) the result records; O(state=converged) also
        requires them active.
    type: list
    elements: str
    default: []
  watch_commands:
    description:
      - Read-only commands (argv lists, no shell) whose exit status and output the result records
        (O(state=present)) or is compared with (O(state=converged)), such as NetworkManager's view of a
        profile. Each has the deadline O(timeout).
    type: list
    elements: list
    default: []
  watch_secrets:
    description:
      - Files on the node that must hold exactly C(content) (O(state=converged)), such as a key file; one
        final newline on either side is ignored. The comparison happens on the node; neither the content nor
        a digest of it is recorded or returned.
      - Give C(content) without its final newline - Ansible masks a no_log value in the module's invocation
        log only where it appears verbatim, and a newline is logged escaped.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file.
        type: path
        required: true
      content:
        description: What it must hold (masked in every log).
        type: str
        required: true
  watch_recorded:
    description:
      - With O(state=present), the result also records its watch lists as C(result.watch) (C(files),
        C(units), C(commands)).
      - With O(state=converged), the lists the saved result recorded are watched as well, so a caller
        that has not run the stages can check all they left on the node (the site's record of a whole
        run, C(playbooks/site.yml)).
    type: bool
    default: false
  prove_commands:
    description:
      - Commands (argv lists, no shell) that must exit 0 for the result to hold (O(state=converged)), run
        only once everything else holds, each with the deadline O(timeout); their output is neither
        recorded nor compared, such as a ping with a jumbo payload and the don't-fragment bit.
    type: list
    elements: list
    default: []
  timeout:
    description:
      - Deadline in seconds of each command run (the C(systemctl show) of O(watch_units), each of
        O(watch_commands) and O(prove_commands)).
    type: float
    default: 30
"""

EXAMPLES = r"""
- name: Publish this node's fabric result
  localinference.vllm.stage_result:
    stage: fabric
    inputs: "{{ cluster_network_interfaces }}"
    result:
      env: "{{ cluster_network_env }}"

- name: Nothing to do when the saved ingress result still holds on the head
  localinference.vllm.stage_result:
    stage: ingress
    state: converged
    inputs: "{{ lookup('localinference.vllm.stage_fingerprint', 'ingress') }}"
    watch_files: [/etc/caddy/Caddyfile]
    watch_units: [caddy.service]
  register: saved_ingress

- name: Read the plan saved on the head
  localinference.vllm.stage_result:
    stage: plan
    state: read
    required: true
    required_keys: [max_model_len, violations, recipe_hash]
  register: saved_plan
"""

RETURN = r"""
path:
  description: The document's path.
  returned: always
  type: str
  sample: /etc/localinference/fabric.json
found:
  description: Whether a saved document exists (O(state=read)); always true after O(state=present).
  returned: always
  type: bool
inputs_hash:
  description: sha256 of the canonical JSON of the inputs; null when O(state=read) found nothing.
  returned: always
  type: str
result:
  description: The saved result (empty when nothing is saved).
  returned: always
  type: dict
converged:
  description: Whether the saved result still holds (O(state=converged)).
  returned: when O(state=converged)
  type: bool
reason:
  description: Why the stage must run, one sentence; null when RV(converged).
  returned: when O(state=converged)
  type: str
  sample: /etc/caddy/Caddyfile changed since the stage last ran
"""

import hashlib
import os
import re
import tempfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
    timeout_error,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    STAGES,
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
from ansible_collections.localinference.vllm.plugins.module_utils.serve._stage_checks import (
    parse_unit_show,
)

ARGUMENT_SPEC: dict[str, Any] = {
    "stage": {"type": "str", "required": True, "choices": list(STAGES)},
    "state": {"type": "str", "default": "present", "choices": ["present", "read", "converged"]},
    "path": {"type": "path"},
    "inputs": {"type": "raw"},
    "result": {"type": "dict"},
    "required": {"type": "bool", "default": False},
    "required_keys": {"type": "list", "elements": "str", "default": [], "no_log": False},
    "fingerprint": {"type": "raw"},
    "watch_files": {"type": "list", "elements": "path", "default": []},
    "watch_units": {"type": "list", "elements": "str", "default": []},
    "watch_commands": {"type": "list", "elements": "list", "default": []},
    "watch_secrets": {
        # The paths are not secret; each content is (no_log on the suboption).
        "no_log": False,
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "path": {"type": "path", "required": True},
            "content": {"type": "str", "required": True, "no_log": True},
        },
    },
    "watch_recorded": {"type": "bool", "default": False},
    "prove_commands": {"type": "list", "elements": "list", "default": []},
    "timeout": {"type": "float", "default": 30.0},
}
MAX_BYTES = 16 * 1024 * 1024
_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]+\.(service|socket|target|timer|mount|path)\Z")


def _read(path: str) -> bytes | None:
    if not os.path.lexists(path):
        return None
    if not os.path.isfile(path) or os.path.islink(path):
        raise StageResultError(f"{path} is not a regular file; remove it and re-run the stage")
    if os.path.getsize(path) > MAX_BYTES:
        raise StageResultError(f"{path} is larger than {MAX_BYTES} bytes: not a saved result")
    with open(path, "rb") as handle:
        return handle.read()


def _write(module: AnsibleModule, path: str, text: str) -> None:
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
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(block)
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
            with open(path, "rb") as handle:
                held = handle.read(MAX_BYTES)
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


def _converged(params: dict[str, Any], raw: bytes | None, where: str) -> dict[str, Any]:
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
    return {
        "changed": False,
        "converged": reason is None,
        "reason": reason,
        "found": doc is not None,
        "inputs_hash": doc["inputs_hash"] if doc else None,
        "result": doc["result"] if doc else {},
    }


def run(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    stage = params["stage"]
    path = params["path"] or f"/etc/localinference/{stage}.json"
    where = f"{path} ({stage} result)"
    problem = timeout_error(params["timeout"])
    if problem:
        raise StageResultError(problem)
    raw = _read(path)
    if params["state"] == "converged":
        return {"path": path, **_converged(params, raw, where)}
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


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module)
    except StageResultError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"cannot access the {module.params['stage']} result: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
