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
  - Every recipe and node value that reaches a unit file, a command line or a path is validated
    first (no control characters, image pinned by digest, absolute normalised paths, host names,
    environment names, ports in range); a refusal names the variable, the offending character
    and the fix. Rendered units are checked again; a line the template did not write is an error
    and nothing is written.
  - The node's state document is never trusted. It is schema-checked; a malformed one (not an
    object, a unit without C(sha256), a path that is a directory, binary or invalid JSON) is
    reported as an F10 difference (RV(differences), RV(live_findings)), never a traceback. Only
    this collection's unit names inside its unit directories are ever read, stopped or removed.
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
      weights_digest:
        description:
          - sha256 (64 hex) of the content the weights stage verified on this node
            (C(/etc/localinference/weights.json)); empty when the weights are managed elsewhere.
          - Part of the node's document, so new weights under the same path restart the engine.
        type: str
        default: ''
  state:
    description:
      - C(staged) writes the document and units under O(staging_dir) only and reports whether
        the live state differs (RV(live_matches)).
      - C(present) writes the live document and units (the previous document is kept as
        C(serving.previous.json) for rollback).
      - C(verified) changes nothing and fails unless the live document and unit files equal
        the inventory's ask.
      - C(absent) removes the unit files the live document lists; the document stays. Only this
        collection's unit names (C(localinference-vllm), C(localinference-ray) C(.container) or
        C(.service)) inside O(unit_dir) or the default unit directories are removed, and only
        regular files or symbolic links (never followed); anything else is left and reported.
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
  guards:
    description:
      - The memory guards of the serving units (F4, F13; C(docs/failure-catalog.md)), as the serve
        role passes them from its C(serve_*) variables; omitted, the units carry none.
      - The node's need is derived from the recipe, the weight files in C(node.weights_path) and
        C(MemTotal) (C(plugins/module_utils/_serve_memory.py)); it is returned as RV(memory) and
        recorded in the state document.
      - Keys C(admission) (bool), C(reserve_gib), C(overhead_gib) (per engine worker),
        C(unified_memory) (bool), C(oom_score_adjust) (-999 to 1000),
        C(memory_high_margin_gib), C(memory_max_margin_gib), C(libexec_dir) (where the
        C(admission) and C(shm-offload) programs are installed) and C(max_gpu_memory_utilization)
        (on unified memory a recipe asking more is a blocking F4 problem).
    type: dict
  slice_dir:
    description:
      - Where the C(localinference.slice) unit is written (unified memory). Defaults to O(unit_dir)
        for C(deploy_mode=systemd) and C(/etc/systemd/system) for C(deploy_mode=quadlet).
    type: path
author:
  - localinference.vllm developers (@localinference)
"""

EXAMPLES = r"""
- name: Render the new recipe into the staging place
  localinference.vllm.serving_state:
    recipe: "{{ vllm_recipe }}"
    plan_max_model_len: "{{ serve_plan.max_model_len }}"
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
  description:
    - Deployment defects in the recipe (C(id), C(blocking), C(message)); F14, F17.
    - F27 when the parallel layout does not fit the cluster (C(node.nnodes)), the GPUs named in
      C(recipe.devices) or the model's C(config.json) in C(node.weights_path) (heads, KV heads, layers).
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
live_findings:
  description:
    - Problems with the node's state documents (C(serving.json), C(serving.previous.json)) and
      unit files this run refused to touch, as findings (C(id) F10, C(severity), C(message),
      C(fix)). An C(error) finding is also listed in RV(differences).
  returned: always
  type: list
  elements: dict
memory:
  description:
    - This node's memory need as the admission checks it (C(need_bytes), C(weights_bytes),
      C(kv_bytes), C(engine_bytes), C(offload_bytes), C(overhead_bytes), C(workers),
      C(unified_memory), C(basis)) and C(weights_found) (how the weights were counted); null
      without O(guards).
  returned: always
  type: dict
"""

import json
import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils import _validate as validate
from ansible_collections.localinference.vllm.plugins.module_utils._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils._recipe import (
    make_node,
    normalise,
    parse_help_flags,
    problems,
    unknown_flags,
)
from ansible_collections.localinference.vllm.plugins.module_utils._recipe_lint import (
    RecipeInputError,
    gpus_in_devices,
    lint_parallel,
    model_geometry,
)
from ansible_collections.localinference.vllm.plugins.module_utils._serve_memory import (
    guards as memory_guards,
)
from ansible_collections.localinference.vllm.plugins.module_utils._serve_memory import (
    mem_total_bytes,
    parse_policy,
    utilization_problems,
    weights_on_disk,
)
from ansible_collections.localinference.vllm.plugins.module_utils._state import (
    OWN_UNIT_NAMES,
    StateFileError,
    check_document,
    desired,
    differences,
    dump,
    parse_document,
    read_text,
    unit_file_problems,
)

UNIT_DIRS = {"quadlet": "/etc/containers/systemd", "systemd": "/etc/systemd/system"}
# `vllm serve --help=all` is a few hundred kilobytes.
MAX_HELP_BYTES = 16 * 1024 * 1024
STATE_FIX = (
    "run the rollout (state=present rewrites serving.json and the units); if the file is not the "
    "collection's, move it away"
)


# A config.json larger than this is not a model configuration.
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def layout_problems(recipe, node):
    """F27 (the parallel layout against the nodes, the devices and the model) as problems.

    The model's geometry comes from the node's ``config.json`` when it can be read;
    an absent or unreadable file leaves the head and layer checks out, never guesses.
    """
    try:
        text = read_text(os.path.join(node.weights_path, "config.json"), MAX_CONFIG_BYTES)
        config = json.loads(text) if text is not None else None
    except (StateFileError, ValueError):
        config = None
    found = lint_parallel(
        recipe, node.nnodes, gpus_in_devices(recipe["devices"]), model_geometry(config)
    )
    return [
        {"id": f["id"], "blocking": f["severity"] == "error", "message": f["message"]}
        for f in found
    ]


def _load(path, unit_dirs, label):
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


class _Files:
    """Writes and removals of this module; failures end the module with a clear message."""

    def __init__(self, module, result):
        self.module = module
        self.result = result

    def fail(self, msg):
        self.module.fail_json(msg=msg, **self.result)

    def require_file(self, path, option):
        """Stop before anything changes when ``path`` exists and is a directory."""
        if os.path.isdir(path):
            self.fail(
                f"{option}: {path} is a directory where a file belongs; remove it or choose "
                f"another {option}"
            )

    def write(self, path, text, option, mode=0o644):
        """Write ``text`` atomically; return True when the file changed."""
        self.require_file(path, option)
        try:
            current = read_text(path)
        except StateFileError:
            current = None  # a binary or unreadable file of ours is replaced
        if current == text:
            return False
        if self.module.check_mode:
            return True
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".serving-")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(tmp, mode)
        except OSError as exc:
            self.fail(f"{option}: cannot write {path} ({exc.strerror}); check {directory}")
        self.module.atomic_move(tmp, path)
        return True

    def remove(self, path):
        """Remove a regular file or a symbolic link (never followed); ``(changed, problem)``."""
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False, None
        except OSError as exc:
            return False, f"{path}: cannot be inspected ({exc.strerror}); left in place"
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            return False, f"{path}: is {kind}, not a unit file the collection wrote; left in place"
        if not self.module.check_mode:
            try:
                os.unlink(path)
            except OSError as exc:
                return False, f"{path}: cannot be removed ({exc.strerror})"
        return True, None


def _mem_total(module):
    """MemTotal of this node (the unified-memory need of a profiled recipe)."""
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as handle:
            return mem_total_bytes(handle.read())
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"guards: cannot read MemTotal from /proc/meminfo ({exc})")


def _absolute(option, value):
    value = validate.text(option, value, max_length=validate.MAX_PATH)
    if not value.startswith("/"):
        raise validate.ValidationError(
            option, f"{value!r} is not an absolute path", "start it with /"
        )
    return value


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
                    "weights_digest": {"type": "str", "default": ""},
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
            "guards": {"type": "dict"},
            "slice_dir": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    state = params["state"]
    try:
        recipe = normalise(params["recipe"], params["plan_max_model_len"])
        node = make_node(params["node"])
        state_path = _absolute("path", params["path"])
        staging_dir = _absolute("staging_dir", params["staging_dir"])
        unit_dir = validate.path("unit_dir", params["unit_dir"] or UNIT_DIRS[recipe["deploy_mode"]])
        venv_dir = validate.path(
            "venv_dir",
            params["venv_dir"] or f"/opt/localinference/vllm-{recipe.get('vllm_version', 'unset')}",
        )
        help_path = params["help_text"] and _absolute("help_text", params["help_text"])
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    if not 0 <= node.rank < node.nnodes:
        module.fail_json(
            msg=f"node.rank {node.rank} is outside 0..{node.nnodes - 1}; the head is rank 0"
        )
    try:
        layout = layout_problems(recipe, node)
    except RecipeInputError as exc:
        module.fail_json(msg=f"vllm_recipe: {exc}")
    guards, memory, capped = None, None, []
    try:
        slice_dir = validate.path(
            "slice_dir",
            params["slice_dir"]
            or (unit_dir if recipe["deploy_mode"] == "systemd" else UNIT_DIRS["systemd"]),
        )
        if params["guards"] is not None:
            policy = parse_policy(params["guards"])
            capped = utilization_problems(recipe, policy)
            weights, weights_found = weights_on_disk(node.weights_path)
            guards = memory_guards(
                recipe, node.host, node.nnodes, policy, weights, _mem_total(module)
            )
            memory = {**guards.need, "weights_found": weights_found}
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    if memory and memory["unified_memory"] and not weights and not memory["engine_bytes"]:
        module.warn(f"the admission need of {node.host} counts no weights: {weights_found}")
    # Unit records in a node's document are trusted only inside these directories.
    unit_dirs = sorted({unit_dir, slice_dir, *UNIT_DIRS.values()})
    try:
        wanted = desired(recipe, node, unit_dir, venv_dir, guards, slice_dir)
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    document = wanted["document"]

    previous_path = os.path.join(os.path.dirname(state_path), "serving.previous.json")
    live_text, live, trusted, live_problems = _load(state_path, unit_dirs, "serving.json")
    if live_text is None and not live_problems:
        live_diff = differences(None, document)
    else:
        # A malformed document is reported by what is wrong with it, not key by key.
        live_diff = list(live_problems) or differences(live, document)
        live_diff += unit_file_problems(trusted, read_text)
    findings = [finding("F10", "error", problem, STATE_FIX) for problem in live_problems]
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
        "problems": problems(recipe) + layout + capped,
        "live_hash": trusted["recipe_hash"],
        "live_start_order": trusted["start_order"],
        "live_recipe": trusted["recipe"],
        "live_matches": not live_diff,
        "differences": live_diff,
        "live_findings": findings,
        "memory": memory,
    }
    files = _Files(module, result)

    if help_path and state != "absent":
        try:
            text = read_text(help_path, MAX_HELP_BYTES)
        except StateFileError as exc:
            module.fail_json(msg=f"help_text: {exc}", **result)
        if text is None:
            module.fail_json(msg=f"help_text {help_path} does not exist", **result)
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
    if blocking and state != "absent":
        module.fail_json(msg="; ".join(f"{p['id']}: {p['message']}" for p in blocking), **result)

    refused = []
    if state == "staged":
        changed = files.write(
            os.path.join(staging_dir, "serving.json"), dump(document), "staging_dir"
        )
        unit_root = os.path.join(staging_dir, "units")
        names = {u["name"] for u in wanted["units"]}
        for unit in wanted["units"]:
            changed |= files.write(
                os.path.join(unit_root, unit["name"]), unit["content"], "staging_dir"
            )
        if os.path.isdir(unit_root):
            for name in sorted(os.listdir(unit_root)):
                if name in names:
                    continue
                if name not in OWN_UNIT_NAMES:
                    refused.append(
                        f"{os.path.join(unit_root, name)}: not a unit this collection writes; "
                        "left in place (the Quadlet check reads it too)"
                    )
                    continue
                removed, problem = files.remove(os.path.join(unit_root, name))
                changed |= removed
                refused += [problem] if problem else []
        result["changed"] = changed
    elif state == "present":
        files.require_file(state_path, "path")
        for unit in wanted["units"]:
            files.require_file(unit["path"], "unit_dir")
        changed = False
        if trusted["valid"] and trusted["recipe_hash"] != document["recipe_hash"]:
            changed |= files.write(previous_path, dump(live), "path")
        names = {u["path"] for u in wanted["units"]}
        for unit in trusted["units"]:
            if unit["path"] not in names:
                removed, problem = files.remove(unit["path"])
                changed |= removed
                refused += [problem] if problem else []
        for unit in wanted["units"]:
            changed |= files.write(unit["path"], unit["content"], "unit_dir")
        changed |= files.write(state_path, dump(document), "path")
        result["changed"] = changed
    elif state == "absent":
        changed = False
        for unit in trusted["units"]:
            removed, problem = files.remove(unit["path"])
            changed |= removed
            refused += [problem] if problem else []
        result["changed"] = changed
    elif live_diff:
        module.fail_json(
            msg="the reconciled state on this node differs from the inventory (F10); "
            "run the rollout (rm -> update -> verify -> start) instead of starting it: "
            + "; ".join(live_diff),
            **result,
        )
    findings += [
        finding("F10", "warning", problem, "remove it by hand if it is stale")
        for problem in refused
    ]
    _, _, previous, previous_problems = _load(previous_path, unit_dirs, "serving.previous.json")
    findings += [
        finding("F10", "warning", problem, "the rollback has no target until the next update")
        for problem in previous_problems
    ]
    for item in findings:
        module.warn(f"{item['id']}: {item['message']}")
    result["previous_recipe"] = previous["recipe"] if not previous_problems else None
    result["previous_hash"] = previous["recipe_hash"] if not previous_problems else None
    if module._diff:
        before = dump(live) if live is not None else (live_text or "")[:4096]
        result["diff"] = {
            "before": before,
            "after": dump(document) if state != "absent" else before,
            "before_header": state_path,
            "after_header": state_path,
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
