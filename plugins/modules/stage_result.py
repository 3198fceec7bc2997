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
  reverify_weights:
    description:
      - With O(state=converged), once everything else holds, re-verify the node's weights against the
        manifest the saved result names (its C(reverify), with C(path), C(manifest) and C(workers)), as
        M(localinference.vllm.model_manifest) O(localinference.vllm.model_manifest#module:mode=verify)
        does. A file that differs, a file the manifest does not list or a manifest that cannot be read
        is the RV(reason) the stages run; a modification time whose content matches is restored
        (RV(weights_restored)).
      - The site's one call per node (C(playbooks/site_converged.yml)).
    type: bool
    default: false
    version_added: 0.3.0
  stream:
    description:
      - With O(state=converged), once everything else holds (the weights too), stream one first token for
        each route the saved result names (its C(routes) and C(tls)) through the ingress on this node,
        with the key; a route that does not stream is the RV(reason) the stages run.
      - The site's one call per node on the head (C(playbooks/site_converged.yml)).
    type: dict
    version_added: 0.3.0
    suboptions:
      port:
        description: The ingress's port on 127.0.0.1.
        type: int
        required: true
      api_key:
        description: The key a request sends (masked in every log); none when the ingress has no key.
        type: str
      timeout:
        description: Seconds to wait for each first token.
        type: float
        default: 60
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
weights_restored:
  description: The weights' files whose modification time was restored from the manifest (content matched).
  returned: when O(reverify_weights) ran
  type: list
  elements: str
  version_added: 0.3.0
streamed:
  description: The first token of each route that streamed (C(model), C(ttft_s) in seconds).
  returned: when O(stream) ran
  type: list
  elements: dict
  version_added: 0.3.0
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_file import run
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    STAGES,
    StageResultError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._token_probe import (
    first_token,
)
from ansible_collections.localinference.vllm.plugins.module_utils.weights._manifest_apply import (
    reverify_reason,
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
    "reverify_weights": {"type": "bool", "default": False},
    "stream": {
        "type": "dict",
        "options": {
            "port": {"type": "int", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "timeout": {"type": "float", "default": 60.0},
        },
    },
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module, reverify=reverify_reason, first_token=first_token)
    except StageResultError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"cannot access the {module.params['stage']} result: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
