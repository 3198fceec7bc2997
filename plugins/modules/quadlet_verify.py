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

import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils._commands import (
    CommandError,
    CommandTimeout,
    Runner,
    timeout_error,
)
from ansible_collections.localinference.vllm.plugins.module_utils._quadlet import (
    QuadletOutputError,
    exec_start,
    run_time_conflicts,
    split_dryrun,
)

# The generator's diagnostics quoted in a failure message, at most.
MAX_MESSAGE = 2000


def _container_files(module, unit_dir):
    """Names of the ``.container`` files in ``unit_dir``; fails on anything else so named."""
    try:
        names = sorted(n for n in os.listdir(unit_dir) if n.endswith(".container"))
    except OSError as exc:
        module.fail_json(
            msg=f"unit_dir: {unit_dir} cannot be listed ({exc.strerror})", findings=[], stderr=""
        )
    for name in names:
        path = os.path.join(unit_dir, name)
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            module.fail_json(
                msg=f"unit_dir: {path} cannot be read ({exc.strerror}); remove or fix it",
                findings=[],
                stderr="",
            )
        if not stat.S_ISREG(mode):
            module.fail_json(
                msg=f"unit_dir: {path} is not a regular file; remove it (only unit files belong "
                "in a Quadlet directory)",
                findings=[],
                stderr="",
            )
    if not names:
        module.fail_json(
            msg=f"unit_dir: {unit_dir} holds no .container file; nothing to check (render the "
            "units first: serving_state state=staged or present)",
            findings=[],
            stderr="",
        )
    return names


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
    problem = timeout_error(module.params["timeout"])
    if problem:
        module.fail_json(msg=problem, findings=[], stderr="")
    unit_dir = module.params["unit_dir"]
    quadlet = module.params["quadlet"]
    if not (os.path.isfile(quadlet) and os.access(quadlet, os.X_OK)):
        module.fail_json(
            msg=f"quadlet: {quadlet} is not an executable file; Quadlet needs Podman 4.4 or later "
            "(Debian trixie, Ubuntu 24.04) or set deploy_mode: systemd",
            findings=[],
            stderr="",
        )
    if not os.path.isdir(unit_dir):
        why = "does not exist" if not os.path.lexists(unit_dir) else "is not a directory"
        module.fail_json(msg=f"unit_dir: {unit_dir} {why}", findings=[], stderr="")
    expected = set(_container_files(module, unit_dir))
    runner = Runner(module.params["timeout"], {"QUADLET_UNIT_DIRS": unit_dir})
    try:
        rc, out, err = runner.run(
            [quadlet, "-dryrun"], hint="raise timeout only if the generator is merely slow"
        )
    except CommandTimeout as exc:
        module.fail_json(msg=f"quadlet: {exc}", findings=[], stderr="")
    except CommandError as exc:
        reason = str(exc).split(": ", 1)[-1]
        module.fail_json(
            msg=f"quadlet: {quadlet} cannot be run ({reason}); point quadlet at Podman's "
            "generator (/usr/libexec/podman/quadlet)",
            findings=[],
            stderr="",
        )
    if rc != 0:
        lines = [line for line in err.splitlines() if "Loading source unit file" not in line]
        detail = " ".join(lines).strip() or f"no diagnostics, exit code {rc}"
        module.fail_json(
            msg=f"the Quadlet generator rejected the units in {unit_dir}: {detail[:MAX_MESSAGE]}",
            findings=[],
            stderr=err,
            rc=rc,
        )
    services = {}
    for name, text in split_dryrun(out).items():
        try:
            services[name] = {"exec_start": exec_start(text)}
        except QuadletOutputError as exc:
            module.fail_json(
                msg=f"the Quadlet generator's ExecStart= for {name} is unreadable: {exc}",
                findings=[],
                stderr=err,
            )
    produced = {name.rsplit(".", 1)[0] + ".container" for name in services}
    missing = sorted(expected - produced)
    if missing:
        module.fail_json(
            msg=f"the Quadlet generator produced no service for {', '.join(missing)}",
            findings=[],
            stderr=err,
            services=services,
        )
    empty = sorted(name for name, service in services.items() if not service["exec_start"])
    if empty:
        module.fail_json(
            msg=f"the Quadlet generator produced no ExecStart= for {', '.join(empty)}",
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
