#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: serving_state
short_description: Render, write and verify the reconciled vLLM serving state of one node
version_added: 0.2.0
description:
  - Normalises a serving recipe (inventory variable C(vllm_recipe)), computes its canonical
    sha256 hash and renders the node's Podman Quadlet C(.container) or systemd C(.service)
    units for its rank (Ray head/worker or vLLM C(mp) ranks).
  - Keeps one reconciled state document per node (default C(/etc/localinference/serving.json))
    with the recipe, its hash and the checksums of the unit files; every unit carries the hash.
  - C(state=verified) proves the node's document and unit files equal what the inventory asks
    and fails with the difference otherwise (failure F10, a stale reconciled registry) - the
    recipe and its hash, the image by digest, the environment, the weights digest and every unit
    file's checksum and carried hash, exactly as rendered. The rollout calls it after the update
    and before the start on every node, with the verifier the watchdog's restart uses.
  - Every recipe and node value that reaches a unit file, a command line or a path is validated
    first (no control characters, image pinned by digest, absolute normalised paths, C(devices) as
    CDI names or nodes under C(/dev), host names, environment names, ports in range); a refusal
    names the variable, the offending character and the fix. Rendered units are checked again; a
    line the template did not write is an error and nothing is written.
  - The node's state document is never trusted. It is schema-checked; a malformed one (not an
    object, a unit without C(sha256), binary or invalid JSON) is reported as an F10 difference
    (RV(differences), RV(live_findings)), never a traceback. A directory at O(path), or where
    a file is to be written, is refused in every state before anything is written or removed.
    Only this collection's unit names inside its unit directories are ever read, stopped or
    removed.
extends_documentation_fragment:
  - localinference.vllm.attributes.CHANGES
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
      rdma:
        description:
          - The RDMA port behind the cluster interface whose GID table the units read at every
            start (C(hca), C(port), C(sys_root)); empty where the fabric stage resolved no
            C(NCCL_IB_GID_INDEX).
          - With O(guards), every serving unit then starts with C(ExecStartPre=) gid-start (from
            O(checks.programs)), which writes the index this start finds to
            C(/run/localinference/nccl-gid.env), and reads it from there (C(EnvironmentFile=));
            a GID table without a RoCE v2 entry for O(node.address) refuses the start.
        type: dict
        default: {}
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
        C(MemTotal) (C(plugins/module_utils/serve/_memory.py)); it is returned as RV(memory) and
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
  stop_live:
    description:
      - With C(state=present), first stop the units the live document lists that systemd does
        not report inactive (the server before its runtime, in reverse start order), one
        C(systemctl stop) each within O(stop_timeout) (the C(rm) step of the rollout).
        RV(stopped) names them. In check mode nothing is stopped.
    type: bool
    default: false
  stop_timeout:
    description: Seconds each C(systemctl stop) may take (the head's server has 120 s to stop).
    type: float
    default: 300
  daemon_reload:
    description:
      - With C(state=present), run C(systemctl daemon-reload) when a unit file changed, so
        systemd (and the Quadlet generator) read the new units. RV(reloaded) says whether it ran.
    type: bool
    default: false
  checks:
    description:
      - With C(state=staged), the node-side checks of staging in the same call (one round trip
        per node), in the order of the suboptions below; each refusal names the node, the cause
        and the fix, and nothing that runs is touched.
      - With C(state=verified) (not in check mode), only O(checks.quadlet) and
        O(checks.unit_states) apply, on the live units.
    type: dict
    suboptions:
      max_load_per_cpu:
        description:
          - Refuse a saturated node (F5), one whose 1-minute load (C(/proc/loadavg)) per online CPU
            is above this, before anything else. Unset, the load is not read.
        type: float
      cluster_address:
        description: Refuse a node whose C(node.address) is on none of its interfaces (C(ip -o addr show)).
        type: bool
        default: true
      help_cache_dir:
        description:
          - Where the image's C(vllm serve --help=all) is cached on the node (C(sha256(image).txt));
            a missing file is asked of the image once (C(podman run --rm --network=none); not in
            check mode). Every rendered flag is checked against it (C(deploy_mode=quadlet));
            O(help_text) wins when given.
        type: path
      help_timeout:
        description: Seconds the image may take to print its options (a first pull included).
        type: float
        default: 1800
      quadlet:
        description:
          - The node's Quadlet generator, run on the staged units (with C(state=verified), the live
            ones), with the checks of M(localinference.vllm.quadlet_verify) (F14, F17).
        type: path
      ports:
        description:
          - On the head, refuse an API, torch-store or Ray port that another process holds (the
            checks of M(localinference.vllm.port_listeners)).
        type: bool
        default: false
      unit_states:
        description:
          - Read the ActiveState of the live units (RV(live_active), RV(live_running)); with
            C(state=verified), fail unless systemd has loaded every service of RV(start_order).
        type: bool
        default: false
      programs:
        description: The units' guard programs to install into O(checks.programs_dir) (mode 0755), last.
        type: list
        elements: dict
        default: []
        suboptions:
          name:
            description: File name of the program.
            type: str
            required: true
          content:
            description: The program's text.
            type: str
            required: true
      programs_dir:
        description: Where O(checks.programs) go.
        type: path
      timeout:
        description: Seconds every other command may take.
        type: float
        default: 60
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
    - Deployment defects in the recipe as findings (C(id), C(severity), C(blocking), C(message), C(fix)); F4, F14, F17, F27.
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
stopped:
  description: The live units O(stop_live) stopped (or would stop in check mode), in stop order.
  returned: with state=present
  type: list
  elements: str
stopped_at:
  description:
    - The node's local time (C(%Y-%m-%d %H:%M:%S)) once the old units were stopped, before the new
      ones were written, where the new boot's log begins (C(journalctl --since)).
  returned: with state=present
  type: str
reloaded:
  description: Whether O(daemon_reload) ran C(systemctl daemon-reload).
  returned: with state=present
  type: bool
node_load:
  description: The node's 1-minute load (C(load1)), online CPUs (C(ncpu)) and C(per_cpu), with O(checks.max_load_per_cpu).
  returned: with checks
  type: dict
live_active:
  description: The ActiveState of each unit of RV(live_start_order) (O(checks.unit_states)).
  returned: with checks
  type: dict
live_running:
  description: Whether the live document lists units and every one is active (O(checks.unit_states)).
  returned: with checks
  type: bool
quadlet:
  description: What the Quadlet generator made of the staged units (C(services), C(findings)), with O(checks.quadlet).
  returned: with checks
  type: dict
listeners:
  description: Who listens on the ports the head's units need (O(checks.ports)).
  returned: with checks
  type: list
  elements: dict
programs:
  description: Paths of the guard programs this run installed or would install (O(checks.programs)).
  returned: with checks
  type: list
  elements: str
memory:
  description:
    - This node's memory need as the admission checks it (C(need_bytes), C(weights_bytes),
      C(kv_bytes), C(engine_bytes), C(offload_bytes), C(overhead_bytes), C(workers),
      C(unified_memory), C(basis)) and C(weights_found) (how the weights were counted); null
      without O(guards).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state_apply import run

CHECKS_SPEC = {
    "max_load_per_cpu": {"type": "float"},
    "cluster_address": {"type": "bool", "default": True},
    "help_cache_dir": {"type": "path"},
    "help_timeout": {"type": "float", "default": 1800.0},
    "quadlet": {"type": "path"},
    "ports": {"type": "bool", "default": False},
    "programs": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "name": {"type": "str", "required": True},
            "content": {"type": "str", "required": True},
        },
    },
    "programs_dir": {"type": "path"},
    "unit_states": {"type": "bool", "default": False},
    "timeout": {"type": "float", "default": 60.0},
}


ARGUMENT_SPEC = {
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
            "rdma": {"type": "dict", "default": {}},
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
    "checks": {"type": "dict", "options": CHECKS_SPEC},
    "stop_live": {"type": "bool", "default": False},
    "stop_timeout": {"type": "float", "default": 300.0},
    "daemon_reload": {"type": "bool", "default": False},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
