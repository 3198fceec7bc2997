#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: stack_lock
short_description: Record the whole stack that served, diff it against the last good one, read it back
version_added: 0.2.0
description:
  - The stack lockfile (default C(/etc/localinference/stack.lock.json), on the head) keeps the newest
    O(keep) stacks that served, newest first. Each entry has C(recorded_at), C(stack_hash) and, per node,
    the image reference, digest and local id, the vLLM version, the recipe hash and the full normalised
    recipe, the model revision and the digest of its weights manifest, the kernel, the driver and CUDA
    versions, the GPU names, the NCCL version and the firmware of the cluster NICs and RDMA devices.
    A value the node cannot tell is null.
  - O(state=gathered) reads one node (run it on every node). Every command runs with a timeout and a C
    locale; a command that fails or times out leaves its value null with a warning. It changes nothing.
  - O(state=recorded) puts the stack made of the O(nodes) records on top of the history (on the head).
    The same stack as the newest entry adds nothing and reports no change. A file that cannot be
    trusted is kept beside it as C(<path>.malformed) and a new history starts (RV(findings) lists why).
  - O(state=diffed) changes nothing. With O(nodes) it returns what recording them would change; without,
    what the last change brought (the last good stack to the current one).
  - O(state=read) changes nothing and returns the history and what C(--tags revert) would do (RV(revert)).
  - The file read back from the node is schema-checked (the types of every key, each entry against its
    C(stack_hash), each recipe against its C(recipe_hash)); what is wrong is returned as findings, never
    a traceback.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes.CHANGES
options:
  state:
    description: What to do (see the description).
    type: str
    choices: [gathered, recorded, diffed, read]
    default: read
  path:
    description: The lockfile (O(state=recorded), O(state=diffed), O(state=read)).
    type: path
    default: /etc/localinference/stack.lock.json
  nodes:
    description:
      - Each node's inventory name mapped to the C(node) that O(state=gathered) returned on it
        (O(state=recorded), O(state=diffed)).
    type: dict
  keep:
    description: How many entries the history keeps (O(state=recorded)).
    type: int
    default: 10
  state_path:
    description: The node's reconciled state document, whose recipe, hash, rank and environment are read (O(state=gathered)).
    type: path
    default: /etc/localinference/serving.json
  weights_path:
    description:
      - The model snapshot directory on the node; the digest is taken from its manifest
        C(<repo>/localinference-manifests/<revision>.json) (O(state=gathered)). Empty leaves it null.
    type: str
    default: ''
  vllm_version:
    description: The vLLM version this run read from the boot log, if it read one (O(state=gathered)).
    type: str
  read_log:
    description:
      - Read the current run of C(localinference-vllm.service) from the journal for the vLLM and NCCL
        versions (O(state=gathered)); for a boot this rollout started.
    type: bool
    default: false
  previous:
    description:
      - This node's record in the current stack (the newest entry), from O(state=read) on the head.
        Its vLLM and NCCL versions are reused when the node runs the same image (O(state=gathered)).
    type: dict
    default: {}
  query_image:
    description:
      - When the vLLM version is still unknown, run C(<entrypoint> --version) in the image
        (C(podman run --rm --pull=never --network=none), bounded by O(image_timeout)) (O(state=gathered), quadlet).
    type: bool
    default: false
  venv_root:
    description: Root of the venvs of deploy_mode systemd (C(<root>/vllm-<vllm_version>)), for the dist-info versions.
    type: path
    default: /opt/localinference
  sys_root:
    description: Where sysfs is mounted (C(class/net), C(class/infiniband)).
    type: path
    default: /sys
  timeout:
    description: Seconds each read command (podman image inspect, journalctl, nvidia-smi, ethtool) may take.
    type: float
    default: 30
  image_timeout:
    description: Seconds C(vllm --version) in the image may take (it imports vLLM).
    type: float
    default: 180
notes:
  - Commands run with C(LC_ALL=C).
"""

EXAMPLES = r"""
- name: Read the head's lockfile
  localinference.vllm.stack_lock:
    state: read
  register: stack

- name: Gather each node's stack
  localinference.vllm.stack_lock:
    state: gathered
    weights_path: /srv/models/hub/models--org--name/snapshots/0123456789abcdef0123456789abcdef01234567
    previous: "{{ (stack.entry.nodes | default({}))[inventory_hostname] | default({}) }}"
  register: node_stack

- name: Record the stack on the head
  localinference.vllm.stack_lock:
    state: recorded
    nodes: "{{ dict(groups['vllm_cluster'] | zip(groups['vllm_cluster'] | map('extract', hostvars, ['node_stack', 'node']))) }}"
  when: inventory_hostname == groups['vllm_head'][0]
  register: recorded

- name: Print what changed since the last good stack
  ansible.builtin.debug:
    msg: "{{ recorded.changes }}"
  when: recorded is changed
"""

RETURN = r"""
node:
  description: This node's record (O(state=gathered)).
  returned: state=gathered
  type: dict
  sample:
    rank: 0
    deploy_mode: quadlet
    image: localhost/localinference-vllm-cpu@sha256:6f1d...
    image_digest: sha256:6f1d...
    image_id: 0b7e...
    vllm_version: 0.32.0
    recipe_hash: 39c6af1567e6a9c3c59447fc395848a1e42f53aff98c82106197aef08916d166
    recipe: {model: localinference/tiny-deepseek, max_num_seqs: 4}
    model: localinference/tiny-deepseek
    revision: 5eed0c0ffee0000000000000000000000000000a
    manifest_digest: 2c26...
    kernel: 6.8.0-49-generic
    driver_version: "580.173.02"
    cuda_version: "13.0"
    gpus: [NVIDIA GB10]
    nccl_version: null
    nics: {enp1s0f0np0: null}
    hcas: {}
sources:
  description:
    - Where C(vllm_version) and C(nccl_version) came from (C(boot log), C(journal), C(last good stack),
      C(image env), C(venv), C(image)); null when unknown.
  returned: state=gathered
  type: dict
entry:
  description: The stack recorded (or that would be), or the current one (O(state=read)); null when none.
  returned: state=recorded, state=diffed, state=read
  type: dict
changes:
  description:
    - "What changed since the last good stack, one line each (C(image: A -> B), C(recipe.max_num_seqs: 4 -> 8),
      C(spark-worker kernel: A -> B)). Empty when the stack is the one already recorded."
  returned: state=recorded, state=diffed, state=read
  type: list
  elements: str
last_good:
  description: The good stack before RV(entry), or null.
  returned: state=recorded, state=diffed, state=read
  type: dict
added:
  description: Whether RV(entry) is a new stack on top of the history (false when it is the newest entry already).
  returned: state=recorded, state=diffed
  type: bool
entries:
  description: The whole history, newest first (entries that failed the schema check left out).
  returned: state=read
  type: list
  elements: dict
revert:
  description:
    - What C(--tags revert) would do. C(possible), C(reason) (why not), C(recipe) and C(recipe_hash) of
      the last good stack's head, its C(recorded_at), and C(changes) from the current stack to it.
  returned: state=read
  type: dict
findings:
  description: Problems with the lockfile read back (C(id) stack_lock, C(severity), C(message), C(fix)).
  returned: state=recorded, state=diffed, state=read
  type: list
  elements: dict
found:
  description: Whether the lockfile exists.
  returned: state=recorded, state=diffed, state=read
  type: bool
path:
  description: The lockfile.
  returned: state=recorded, state=diffed, state=read
  type: str
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade import _stack_lock as lock
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade._lock_history import run

ARGUMENT_SPEC: dict[str, Any] = {
    "state": {
        "type": "str",
        "default": "read",
        "choices": ["gathered", "recorded", "diffed", "read"],
    },
    "path": {"type": "path", "default": "/etc/localinference/stack.lock.json"},
    "nodes": {"type": "dict"},
    "keep": {"type": "int", "default": lock.DEFAULT_KEEP},
    "state_path": {"type": "path", "default": "/etc/localinference/serving.json"},
    "weights_path": {"type": "str", "default": ""},
    "vllm_version": {"type": "str"},
    "read_log": {"type": "bool", "default": False},
    "previous": {"type": "dict", "default": {}},
    "query_image": {"type": "bool", "default": False},
    "venv_root": {"type": "path", "default": "/opt/localinference"},
    "sys_root": {"type": "path", "default": "/sys"},
    "timeout": {"type": "float", "default": 30.0},
    "image_timeout": {"type": "float", "default": 180.0},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module)
    except lock.StackLockError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"cannot access the stack lockfile {module.params['path']}: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
