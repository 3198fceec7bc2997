#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: quadlet_verify
short_description: Check Podman Quadlet units with the real generator before they start
version_added: 0.2.0
description:
  - Runs the node's own Quadlet generator in dry-run mode
    (C(QUADLET_UNIT_DIRS=DIR /usr/libexec/podman/quadlet -dryrun)) on a directory of
    C(.container) files; unknown keys or malformed values fail here, not at start.
  - Reads the C(podman run) command line the generator produced for each service and fails
    on what Podman refuses only at run time or what should never be needed
    (F14 C(--ipc=host) with C(--shm-size); F17 C(--privileged) unless O(allow_privileged)).
  - Fails, naming the file, when O(unit_dir) holds no C(.container) file, when a C(.container)
    entry is not a regular file, or when the generator's output cannot be read; it never
    succeeds on nothing.
extends_documentation_fragment:
  - localinference.vllm.attributes.INFO
options:
  unit_dir:
    description: Directory holding the C(.container) files to check (only this directory is read).
    type: path
    required: true
  quadlet:
    description: The Quadlet generator binary (Podman 4.4 or later).
    type: path
    default: /usr/libexec/podman/quadlet
  allow_privileged:
    description:
      - Accept C(--privileged) (reported as a warning). Mirrors the recipe's C(privileged) key.
    type: bool
    default: false
  timeout:
    description:
      - Seconds the generator may take. A generator that does not finish in time is killed and
        the module fails naming it.
    type: float
    default: 60
author:
  - localinference.vllm developers (@localinference)
"""

EXAMPLES = r"""
- name: Validate the staged units with the node's Quadlet generator
  localinference.vllm.quadlet_verify:
    unit_dir: /etc/localinference/staging/units
"""

RETURN = r"""
services:
  description: Generated services by name, each with its C(exec_start) argv.
  returned: success
  type: dict
  sample: {"localinference-vllm.service": {"exec_start": ["/usr/bin/podman", "run", "..."]}}
findings:
  description: F14/F17 findings (C(id), C(blocking), C(message), C(service)).
  returned: always
  type: list
  elements: dict
stderr:
  description: The generator's diagnostics.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.serve._quadlet import run


def main():
    module = AnsibleModule(
        argument_spec={
            "unit_dir": {"type": "path", "required": True},
            "quadlet": {"type": "path", "default": "/usr/libexec/podman/quadlet"},
            "allow_privileged": {"type": "bool", "default": False},
            "timeout": {"type": "float", "default": 60.0},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
