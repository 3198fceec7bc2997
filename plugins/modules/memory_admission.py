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
from ansible_collections.localinference.vllm.plugins.module_utils.serve._admission_run import run


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
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
