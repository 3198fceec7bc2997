#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: serving_state
short_description: Render, write and verify the reconciled vLLM serving state of one node
version_added: 0.1.0
description:
  - Normalises a serving recipe (inventory variable C(vllm_recipe)), computes its canonical
    sha256 hash and renders the node's Podman Quadlet C(.container) or systemd C(.service)
    units for its rank (Ray head/worker or vLLM C(mp) ranks).
  - Keeps one reconciled state document per node (default C(/etc/localinference/serving.json))
    with the recipe, its hash and the checksums of the unit files; every unit carries the hash.
  - C(state=verified) proves the node's document and unit files equal what the inventory asks
    and fails with the difference otherwise (failure F10, a stale reconciled registry).
extends_documentation_fragment:
  - localinference.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
options:
  recipe:
    description:
      - The serving recipe; keys are vLLM option names with underscores plus deployment keys
        (C(model), C(revision), C(deploy_mode), C(image), C(vllm_version), C(executor_backend),
        C(ipc_host), C(shm_size), C(privileged), C(extra_args), C(env), C(devices),
        C(podman_args), C(ulimits), C(cache_dir), C(ray_port), C(entrypoint)).
    type: dict
    required: true
  plan_max_model_len:
    description:
      - The plan's C(max_model_len), used when the recipe says C(max_model_len=plan).
    type: int
  node:
    description: Where this node sits in the cluster.
    type: dict
    required: true
    suboptions:
      host:
        description: Inventory name of the node.
        type: str
        required: true
      rank:
        description: Node rank; the head is C(0).
        type: int
        required: true
      nnodes:
        description: Number of nodes in the cluster.
        type: int
        required: true
      head_address:
        description: The head's cluster-link address (C(--master-addr), Ray address).
        type: str
        required: true
      address:
        description: This node's cluster-link address (Ray C(--node-ip-address)).
        type: str
        default: ''
      env:
        description: Per-node environment from the fabric stage (C(cluster_network_env)).
        type: dict
        default: {}
      weights_path:
        description: The model snapshot directory on this node (C(model_weights_path)).
        type: str
        required: true
  state:
    description:
      - C(staged) writes the document and units under O(staging_dir) only and reports whether
        the live state differs (RV(live_matches)).
      - C(present) writes the live document and units (the previous document is kept as
        C(serving.previous.json) for rollback).
      - C(verified) changes nothing and fails unless the live document and unit files equal
        the inventory's ask.
      - C(absent) removes the unit files the live document lists; the document stays.
    type: str
    choices: [staged, present, verified, absent]
    default: present
  path:
    description: The reconciled state document.
    type: path
    default: /etc/localinference/serving.json
  staging_dir:
    description: Where C(state=staged) renders the document (C(serving.json)) and units (C(units/)).
    type: path
    default: /etc/localinference/staging
  unit_dir:
    description:
      - Directory of the live unit files. Defaults to C(/etc/containers/systemd) for
        C(deploy_mode=quadlet) and C(/etc/systemd/system) for C(deploy_mode=systemd).
    type: path
  venv_dir:
    description:
      - vLLM virtual environment for C(deploy_mode=systemd).
        Defaults to C(/opt/localinference/vllm-<vllm_version>).
    type: path
  help_text:
    description:
      - Path to the output of C(vllm serve --help=all) of the targeted release; when set,
        every rendered flag must exist in it.
    type: path
author:
  - localinference.vllm developers (@localinference)
"""

EXAMPLES = r"""
- name: Render the new recipe into the staging place
  localinference.vllm.serving_state:
    recipe: "{{ vllm_recipe }}"
    plan_max_model_len: "{{ hostvars['localhost'].plan_budget.max_model_len | default(omit) }}"
    node:
      host: "{{ inventory_hostname }}"
      rank: 0
      nnodes: 2
      head_address: 10.77.0.11
      address: 10.77.0.11
      env: "{{ cluster_network_env }}"
      weights_path: "{{ model_weights_path }}"
    state: staged

- name: Prove the node serves what the inventory asks
  localinference.vllm.serving_state:
    recipe: "{{ vllm_recipe }}"
    node: "{{ serve_node }}"
    state: verified
"""

RETURN = r"""
recipe:
  description: The normalised recipe (defaults filled, C(plan) resolved).
  returned: always
  type: dict
recipe_hash:
  description: sha256 of the canonical JSON of RV(recipe).
  returned: always
  type: str
  sample: 39c6af1567e6a9c3c59447fc395848a1e42f53aff98c82106197aef08916d166
document:
  description: The reconciled state document the inventory asks for.
  returned: always
  type: dict
units:
  description: Rendered unit files of this node (C(name), C(path), C(content)).
  returned: always
  type: list
  elements: dict
start_order:
  description: systemd service names to start on this node, in order.
  returned: always
  type: list
  elements: str
  sample: [localinference-vllm.service]
server_argv:
  description: Arguments after C(vllm) for this node's server, or null (Ray worker).
  returned: always
  type: list
  elements: str
ray_argv:
  description: Arguments after C(ray) for this node's Ray unit, or null (C(mp) backend).
  returned: always
  type: list
  elements: str
environment:
  description: The environment of this node's units.
  returned: always
  type: dict
problems:
  description: Deployment defects in the recipe (C(id), C(blocking), C(message)); F14, F17.
  returned: always
  type: list
  elements: dict
live_hash:
  description: Recipe hash of the live document before this run, or null.
  returned: always
  type: str
live_recipe:
  description: The recipe of the live document before this run (the rollback target of this run), or null.
  returned: always
  type: dict
live_start_order:
  description: Services the live document says run on this node (what C(rm) stops), in start order.
  returned: always
  type: list
  elements: str
live_matches:
  description: Whether the live document and unit files equal the inventory's ask.
  returned: always
  type: bool
differences:
  description: Differences between the live state and the ask, one line each.
  returned: always
  type: list
  elements: str
previous_recipe:
  description: The recipe kept in C(serving.previous.json) (the rollback target), or null.
  returned: always
  type: dict
previous_hash:
  description: Hash of RV(previous_recipe), or null.
  returned: always
  type: str
"""

import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils._recipe import (
    Node,
    RecipeError,
    normalise,
    parse_help_flags,
    problems,
    unknown_flags,
)
from ansible_collections.localinference.vllm.plugins.module_utils._state import (
    desired,
    differences,
    dump,
    unit_file_problems,
)

UNIT_DIRS = {"quadlet": "/etc/containers/systemd", "systemd": "/etc/systemd/system"}


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _load(path):
    text = _read(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]}


def _write(module, path, text, mode=0o644):
    """Write ``text`` atomically; return True when the file changed."""
    if _read(path) == text:
        return False
    if module.check_mode:
        return True
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".serving-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    module.atomic_move(tmp, path)
    return True


def _remove(module, path):
    if not os.path.lexists(path):
        return False
    if not module.check_mode:
        os.unlink(path)
    return True


def main():
    module = AnsibleModule(
        argument_spec={
            "recipe": {"type": "dict", "required": True},
            "plan_max_model_len": {"type": "int"},
            "node": {
                "type": "dict",
                "required": True,
                "options": {
                    "host": {"type": "str", "required": True},
                    "rank": {"type": "int", "required": True},
                    "nnodes": {"type": "int", "required": True},
                    "head_address": {"type": "str", "required": True},
                    "address": {"type": "str", "default": ""},
                    "env": {"type": "dict", "default": {}},
                    "weights_path": {"type": "str", "required": True},
                },
            },
            "state": {
                "type": "str",
                "default": "present",
                "choices": ["staged", "present", "verified", "absent"],
            },
            "path": {"type": "path", "default": "/etc/localinference/serving.json"},
            "staging_dir": {"type": "path", "default": "/etc/localinference/staging"},
            "unit_dir": {"type": "path"},
            "venv_dir": {"type": "path"},
            "help_text": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        recipe = normalise(params["recipe"], params["plan_max_model_len"])
    except RecipeError as exc:
        module.fail_json(msg=str(exc))
    node = Node(**params["node"])
    if not 0 <= node.rank < node.nnodes:
        module.fail_json(
            msg=f"node.rank {node.rank} is outside 0..{node.nnodes - 1}; the head is rank 0"
        )
    unit_dir = params["unit_dir"] or UNIT_DIRS[recipe["deploy_mode"]]
    venv_dir = (
        params["venv_dir"] or f"/opt/localinference/vllm-{recipe.get('vllm_version', 'unset')}"
    )
    wanted = desired(recipe, node, unit_dir, venv_dir)
    document = wanted["document"]

    state_dir = os.path.dirname(params["path"])
    previous_path = os.path.join(state_dir, "serving.previous.json")
    live = _load(params["path"])
    live_diff = differences(live, document) + (unit_file_problems(live, _read) if live else [])
    result = {
        "changed": False,
        "recipe": recipe,
        "recipe_hash": document["recipe_hash"],
        "document": document,
        "units": wanted["units"],
        "start_order": document["start_order"],
        "server_argv": document["server_argv"],
        "ray_argv": document["ray_argv"],
        "environment": document["environment"],
        "problems": problems(recipe),
        "live_hash": (live or {}).get("recipe_hash"),
        "live_start_order": (live or {}).get("start_order") or [],
        "live_recipe": (live or {}).get("recipe"),
        "live_matches": not live_diff,
        "differences": live_diff,
    }

    if params["help_text"] and params["state"] != "absent":
        text = _read(params["help_text"])
        if text is None:
            module.fail_json(msg=f"help_text {params['help_text']} does not exist", **result)
        argv = (document["server_argv"] or []) + recipe["extra_args"]
        unknown = unknown_flags(argv, parse_help_flags(text))
        if unknown:
            module.fail_json(
                msg=f"vllm_recipe renders flags this vLLM release does not have: {', '.join(unknown)}; "
                "remove or rename them (see `vllm serve --help=all` of the targeted release)",
                unknown_flags=unknown,
                **result,
            )
    blocking = [p for p in result["problems"] if p["blocking"]]
    if blocking and params["state"] != "absent":
        module.fail_json(msg="; ".join(f"{p['id']}: {p['message']}" for p in blocking), **result)

    state = params["state"]
    if state == "staged":
        changed = _write(
            module, os.path.join(params["staging_dir"], "serving.json"), dump(document)
        )
        unit_root = os.path.join(params["staging_dir"], "units")
        names = {u["name"] for u in wanted["units"]}
        for unit in wanted["units"]:
            changed |= _write(module, os.path.join(unit_root, unit["name"]), unit["content"])
        if os.path.isdir(unit_root):
            for name in os.listdir(unit_root):
                if name not in names:
                    changed |= _remove(module, os.path.join(unit_root, name))
        result["changed"] = changed
    elif state == "present":
        changed = False
        if live and live.get("recipe_hash") not in (None, document["recipe_hash"]):
            changed |= _write(module, previous_path, dump(live))
        names = {u["path"] for u in wanted["units"]}
        for unit in (live or {}).get("units", []):
            if unit.get("path") not in names:
                changed |= _remove(module, unit["path"])
        for unit in wanted["units"]:
            changed |= _write(module, unit["path"], unit["content"])
        changed |= _write(module, params["path"], dump(document))
        result["changed"] = changed
    elif state == "absent":
        changed = False
        for unit in (live or {}).get("units", []):
            changed |= _remove(module, unit["path"])
        result["changed"] = changed
    elif live_diff:
        module.fail_json(
            msg="the reconciled state on this node differs from the inventory (F10); "
            "run the rollout (rm -> update -> verify -> start) instead of starting it: "
            + "; ".join(live_diff),
            **result,
        )

    previous = _load(previous_path)
    result["previous_recipe"] = (previous or {}).get("recipe")
    result["previous_hash"] = (previous or {}).get("recipe_hash")
    if module._diff:
        result["diff"] = {
            "before": dump(live) if live else "",
            "after": dump(document) if state != "absent" else dump(live or {}),
            "before_header": params["path"],
            "after_header": params["path"],
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
