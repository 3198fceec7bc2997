#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: memory_admission
short_description: Check that a rank has the memory its plan needs right now (admission, F4)
version_added: 0.2.0
description:
  - Reads C(MemAvailable) from C(/proc/meminfo) and, for the cgroup (v2 C(memory.max)/C(memory.high)/C(memory.current),
    v1 C(memory.limit_in_bytes)/C(memory.usage_in_bytes)) and each of its parents up to the mount root, the limit
    minus the usage less reclaimable inactive file cache. The lowest of these is what is available.
  - Admits when that covers O(need_bytes) plus O(reserve_bytes); otherwise names the largest processes by RSS (read
    from C(/proc/*/status), the unit's own excluded) and, with O(fail_when_refused), fails with one line that says so.
  - The same check (C(plugins/module_utils/serve/_admission.py)) runs on the node as the serving unit's C(ExecStartPre),
    where memory taken between preflight and the start refuses the start instead of letting the rank OOM.
  - Only reads; nothing is signalled.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.INFO
  - localinference.vllm.node.PROC_ROOT
options:
  need_bytes:
    description:
      - This rank's memory need in bytes (its share of the weights, its KV cache and overhead, from the plan).
    type: int
    required: true
  reserve_bytes:
    description:
      - Memory that must remain free on top of O(need_bytes).
    type: int
    default: 0
  cgroup:
    description:
      - The cgroup to judge, as written in C(/proc/PID/cgroup) (for example C(/system.slice/localinference-vllm.service)).
      - Default is O(unit)'s when it is given, else the cgroup this module runs in.
    type: str
  unit:
    description:
      - A systemd unit whose cgroup is judged (its C(ControlGroup) while it runs, else its slice).
    type: str
  top_tenants:
    description:
      - How many of the largest processes a refusal names.
    type: int
    default: 5
  exclude_pids:
    description:
      - Processes that are not tenants (for example the engine of this rank).
    type: list
    elements: int
    default: []
  fail_when_refused:
    description:
      - Fail the task when the rank is not admitted; V(false) only reports RV(admitted).
    type: bool
    default: true
  timeout:
    description:
      - Seconds C(systemctl show) may take when O(unit) is given.
    type: float
    default: 10
"""

EXAMPLES = r"""
- name: Refuse the start of this rank without 60 GiB plus a 4 GiB reserve
  localinference.vllm.memory_admission:
    need_bytes: "{{ 60 * 1024 ** 3 }}"
    reserve_bytes: "{{ 4 * 1024 ** 3 }}"
    unit: localinference-vllm.service
"""

RETURN = r"""
admitted:
  description: Whether the available memory covers the need plus the reserve.
  returned: always
  type: bool
available_bytes:
  description: The lowest of MemAvailable and every limited cgroup level's headroom.
  returned: always
  type: int
mem_available_bytes:
  description: C(MemAvailable).
  returned: always
  type: int
need_bytes:
  description: O(need_bytes) plus O(reserve_bytes).
  returned: always
  type: int
source:
  description: What bounded RV(available_bytes) (C(MemAvailable) or the cgroup level).
  returned: always
  type: str
cgroup:
  description: The cgroup judged.
  returned: always
  type: str
cgroup_levels:
  description: Limited levels from the cgroup up to the mount root (path, limit_bytes, usage_bytes, headroom_bytes).
  returned: always
  type: list
  elements: dict
tenants:
  description: The largest processes by RSS (pid, user, uid, name, cmdline, rss_bytes); filled when refused.
  returned: always
  type: list
  elements: dict
message:
  description: The one-line verdict (what the C(ExecStartPre) program prints).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
    timeout_error,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._admission import (
    AdmissionError,
    check,
    own_cgroups,
)


def _unit_cgroup(module: AnsibleModule, unit: str) -> str:
    systemctl = module.get_bin_path("systemctl", required=True)
    runner = Runner(module.params["timeout"])
    try:
        rc, out, err = runner.run(
            [systemctl, "show", "-p", "ControlGroup", "-p", "Slice", unit],
            "systemd does not answer",
        )
    except CommandError as exc:
        module.fail_json(msg=f"unit={unit}: {exc}")
    if rc != 0:
        module.fail_json(msg=f"unit={unit}: systemctl show exited {rc}: {err.strip()[:300]}")
    shown = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
    if shown.get("ControlGroup"):
        return shown["ControlGroup"]
    # Not running: its slice, under the root systemd manages (PID 1's cgroup less init.scope).
    with open(
        f"{module.params['proc_root']}/1/cgroup", encoding="utf-8", errors="replace"
    ) as handle:
        paths = own_cgroups(handle.read())
    base = (paths.get("v2") or paths.get("memory") or "/").rstrip("/")
    if base.endswith("/init.scope"):
        base = base[: -len("/init.scope")]
    return f"{base}/{shown.get('Slice') or 'system.slice'}"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "need_bytes": {"type": "int", "required": True},
            "reserve_bytes": {"type": "int", "default": 0},
            "proc_root": {"type": "path", "default": "/proc"},
            "cgroup": {"type": "str"},
            "unit": {"type": "str"},
            "top_tenants": {"type": "int", "default": 5},
            "exclude_pids": {"type": "list", "elements": "int", "default": []},
            "fail_when_refused": {"type": "bool", "default": True},
            "timeout": {"type": "float", "default": 10.0},
        },
        mutually_exclusive=[("cgroup", "unit")],
        supports_check_mode=True,
    )
    params = module.params
    for option in ("need_bytes", "reserve_bytes", "top_tenants"):
        if params[option] < 0:
            module.fail_json(msg=f"{option} must be 0 or more, got {params[option]}")
    problem = timeout_error(params["timeout"])
    if problem:
        module.fail_json(msg=problem)
    cgroup = params["cgroup"]
    if params["unit"]:
        try:
            cgroup = _unit_cgroup(module, params["unit"])
        except OSError as exc:
            module.fail_json(msg=f"unit={params['unit']}: cannot find its cgroup: {exc}")
    try:
        decision = check(
            params["need_bytes"],
            params["reserve_bytes"],
            params["proc_root"],
            cgroup,
            params["top_tenants"],
            params["exclude_pids"],
        )
    except AdmissionError as exc:
        module.fail_json(
            msg=f"memory admission cannot judge this node: {exc}; is proc_root={params['proc_root']}"
            " a procfs mount?",
            admitted=False,
        )
    result = {"changed": False, **decision}
    if not decision["admitted"] and params["fail_when_refused"]:
        module.fail_json(msg=decision["message"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
