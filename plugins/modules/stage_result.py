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
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
options:
  stage:
    description: The stage whose result this is.
    type: str
    required: true
    choices: [preflight, fabric, plan, weights, ingress, client, qualify]
  state:
    description: C(present) saves O(result); C(read) reads and checks the saved document.
    type: str
    default: present
    choices: [present, read]
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
    description: Keys the saved C(result) must have (O(state=read)); a missing one fails.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Publish this node's fabric result
  localinference.vllm.stage_result:
    stage: fabric
    inputs: "{{ cluster_network_interfaces }}"
    result:
      env: "{{ cluster_network_env }}"

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
"""

import os
import tempfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils._stage_result import (
    STAGES,
    StageResultError,
    check_document,
    document,
    render,
)

ARGUMENT_SPEC: dict[str, Any] = {
    "stage": {"type": "str", "required": True, "choices": list(STAGES)},
    "state": {"type": "str", "default": "present", "choices": ["present", "read"]},
    "path": {"type": "path"},
    "inputs": {"type": "raw"},
    "result": {"type": "dict"},
    "required": {"type": "bool", "default": False},
    "required_keys": {"type": "list", "elements": "str", "default": [], "no_log": False},
}
MAX_BYTES = 16 * 1024 * 1024


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


def run(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    stage = params["stage"]
    path = params["path"] or f"/etc/localinference/{stage}.json"
    where = f"{path} ({stage} result)"
    raw = _read(path)
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
    doc = document(stage, params["inputs"], params["result"])
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
