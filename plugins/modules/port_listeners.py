#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: port_listeners
short_description: Refuse TCP ports the serving units need that something else already holds
version_added: 0.2.0
description:
  - Reads the listening TCP sockets of the node (C(/proc/net/tcp), C(/proc/net/tcp6)) and the
    processes that hold them (C(/proc/PID/fd)), without running a command.
  - A listener belongs to the collection when its process's cgroup path names one of O(units)
    (Quadlet containers run inside their unit's cgroup). Any other listener on one of O(ports)
    is foreign, and the module fails naming the port, the address, the process and the fix,
    before the rollout stops the running engine (a new engine would die at bind time).
  - Read-only; the same in check mode.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
options:
  ports:
    description: The TCP ports the serving units of this node will listen on.
    type: list
    elements: int
    required: true
  units:
    description: The collection's serving units on this node; their listeners are not foreign.
    type: list
    elements: str
    default: []
  fail_on_foreign:
    description: Fail when a foreign listener holds one of O(ports); false only reports.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Refuse the API port held by a stray process
  localinference.vllm.port_listeners:
    ports: [8000, 29501]
    units: [localinference-vllm.service]
"""

RETURN = r"""
listeners:
  description: Every listener on O(ports) (port, address, pid, command, cgroup).
  returned: always
  type: list
  elements: dict
foreign:
  description: The listeners that belong to none of O(units).
  returned: always
  type: list
  elements: dict
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.serve._ports import run

ARGUMENT_SPEC: dict[str, Any] = {
    "ports": {"type": "list", "elements": "int", "required": True},
    "units": {"type": "list", "elements": "str", "default": []},
    "fail_on_foreign": {"type": "bool", "default": True},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
