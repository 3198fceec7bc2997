#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: memory_facts
short_description: Read memory-pressure facts and other users' processes by RSS
version_added: 0.2.0
description:
  - Reads C(MemTotal)/C(MemAvailable) and swap from C(/proc/meminfo), memory pressure (PSI) from
    C(/proc/pressure/memory), the size and free space of C(/dev/shm), the memlock limit, the load average, the
    cgroup memory limit of the node (when it runs inside one) and the processes of other users with the largest RSS.
  - Processes are only read, never signalled. The two-Spark field report lost a start to another user's 17.56 GB
    of processes on the worker; the memory is reported so the plan sizes for it, not reclaimed.
  - Results are returned under C(ansible_facts.memory).
  - A C(/proc/<pid>/status) the kernel did not write (binary content, a line missing, a value that is
    not a number) fails the module with the file's name; a process that exits while it is read is skipped.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.FACTS
  - localinference.vllm.node.PROC_ROOT
  - localinference.vllm.node.SYS_ROOT
options:
  shm_path:
    description:
      - The shared-memory mount to measure.
    type: path
    default: /dev/shm
  own_users:
    description:
      - Users whose processes are not "other users" (for example the service account that runs vLLM).
      - The user the module runs as is always included.
    type: list
    elements: str
    default: []
  min_uid:
    description:
      - Accounts below this uid are system accounts, not other users.
    type: int
    default: 1000
  top_processes:
    description:
      - How many of the other users' largest processes to list.
    type: int
    default: 10
notes:
  - The memlock limit is the one of the process that runs the module; a service's own limit comes from its unit.
"""

EXAMPLES = r"""
- name: Read memory facts
  localinference.vllm.memory_facts:
    own_users: [vllm]

- name: Show who else holds memory on this node
  ansible.builtin.debug:
    msg: "{{ ansible_facts.memory.other_users.by_user }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    memory:
      description: Memory-pressure facts (all sizes in bytes).
      returned: always
      type: dict
      contains:
        mem_total_bytes:
          description: C(MemTotal).
          type: int
        mem_available_bytes:
          description: C(MemAvailable).
          type: int
        effective_available_bytes:
          description: C(MemAvailable), capped by the cgroup limit minus usage when the node runs inside a limited cgroup.
          type: int
        cgroup_limit_bytes:
          description: Memory limit of the node's cgroup; null when unlimited or unknown.
          type: int
        cgroup_usage_bytes:
          description: Memory charged to that cgroup minus its inactive (reclaimable) file cache; null when unknown.
          type: int
        swap_total_bytes:
          description: C(SwapTotal).
          type: int
        swap_free_bytes:
          description: C(SwapFree).
          type: int
        swap_used_bytes:
          description: Swap in use.
          type: int
        swap_used_percent:
          description: Swap in use as a percentage of C(SwapTotal) (0 without swap).
          type: float
        shmem_bytes:
          description: C(Shmem) (tmpfs and shared memory pages).
          type: int
        psi:
          description: Memory pressure stall information; null when the kernel has no PSI.
          type: dict
          sample: {some: {avg10: 0.0, avg60: 0.0, avg300: 0.0, total: 0}, full: {avg10: 0.0, avg60: 0.0, avg300: 0.0, total: 0}}
        shm:
          description: Size and free space of O(shm_path).
          type: dict
          sample: {path: /dev/shm, size_bytes: 2147483648, free_bytes: 2147483648, used_bytes: 0}
        memlock:
          description: Memlock limit in bytes; null means unlimited.
          type: dict
          sample: {soft_bytes: 8388608, hard_bytes: 8388608}
        loadavg:
          description: Load averages and task counts.
          type: dict
          sample: {1m: 0.52, 5m: 0.4, 15m: 0.31, runnable: 1, tasks: 412}
        cpu_count:
          description: Online CPUs (to judge the load average).
          type: int
        other_users:
          description: Processes of other users, largest RSS first, and their sum per user.
          type: dict
          sample:
            total_rss_bytes: 18855469056
            process_count: 20
            by_user: [{user: alice, uid: 1001, processes: 20, rss_bytes: 18855469056}]
            top_processes: [{pid: 4242, user: alice, uid: 1001, name: opencode, cmdline: opencode, rss_bytes: 943718400}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    run_facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_gather import (
    facts,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "proc_root": {"type": "path", "default": "/proc"},
            "sys_root": {"type": "path", "default": "/sys"},
            "shm_path": {"type": "path", "default": "/dev/shm"},
            "own_users": {"type": "list", "elements": "str", "default": []},
            "min_uid": {"type": "int", "default": 1000},
            "top_processes": {"type": "int", "default": 10},
        },
        supports_check_mode=True,
    )
    run_facts(module, "memory", lambda _runner: facts(module), timeouts=())


if __name__ == "__main__":
    main()
