#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: quadlet_verify
short_description: Check Podman Quadlet units with the real generator before they start
version_added: 0.1.0
description:
  - Runs the node's own Quadlet generator in dry-run mode
    (C(QUADLET_UNIT_DIRS=DIR /usr/libexec/podman/quadlet -dryrun)) on a directory of
    C(.container) files; unknown keys or malformed values fail here, not at start.
  - Reads the C(podman run) command line the generator produced for each service and fails
    on what Podman refuses only at run time or what should never be needed
    (F14 C(--ipc=host) with C(--shm-size); F17 C(--privileged) unless O(allow_privileged)).
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

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils._quadlet import (
    exec_start,
    run_time_conflicts,
    split_dryrun,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "unit_dir": {"type": "path", "required": True},
            "quadlet": {"type": "path", "default": "/usr/libexec/podman/quadlet"},
            "allow_privileged": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    unit_dir = module.params["unit_dir"]
    quadlet = module.params["quadlet"]
    if not os.access(quadlet, os.X_OK):
        module.fail_json(
            msg=f"quadlet: {quadlet} is not executable; Quadlet needs Podman 4.4 or later "
            "(Debian trixie, Ubuntu 24.04) or set deploy_mode: systemd",
            findings=[],
            stderr="",
        )
    if not os.path.isdir(unit_dir):
        module.fail_json(msg=f"unit_dir: {unit_dir} is not a directory", findings=[], stderr="")
    rc, out, err = module.run_command(
        [quadlet, "-dryrun"],
        environ_update={"LC_ALL": "C", "QUADLET_UNIT_DIRS": unit_dir},
    )
    if rc != 0:
        lines = [line for line in err.splitlines() if "Loading source unit file" not in line]
        module.fail_json(
            msg=f"the Quadlet generator rejected the units in {unit_dir}: "
            + " ".join(lines).strip(),
            findings=[],
            stderr=err,
            rc=rc,
        )
    services = {name: {"exec_start": exec_start(text)} for name, text in split_dryrun(out).items()}
    expected = {n for n in os.listdir(unit_dir) if n.endswith(".container")}
    produced = {name.rsplit(".", 1)[0] + ".container" for name in services}
    missing = sorted(expected - produced)
    if missing:
        module.fail_json(
            msg=f"the Quadlet generator produced no service for {', '.join(missing)}",
            findings=[],
            stderr=err,
            services=services,
        )
    findings = []
    for name, service in sorted(services.items()):
        for finding in run_time_conflicts(service["exec_start"], module.params["allow_privileged"]):
            findings.append({**finding, "service": name})
    blocking = [f for f in findings if f["blocking"]]
    if blocking:
        module.fail_json(
            msg="; ".join(f"{f['service']}: {f['id']}: {f['message']}" for f in blocking),
            findings=findings,
            services=services,
            stderr=err,
        )
    for finding in findings:
        module.warn(f"{finding['service']}: {finding['id']}: {finding['message']}")
    module.exit_json(changed=False, services=services, findings=findings, stderr=err)


if __name__ == "__main__":
    main()
