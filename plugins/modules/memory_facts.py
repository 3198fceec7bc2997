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

import os
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    run_facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    ProcParseError,
    memory_summary,
    other_users_processes,
    parse_cgroup_limit,
    parse_cgroup_usage,
    parse_loadavg,
    parse_meminfo,
    parse_memlock,
    parse_psi,
    parse_status,
    shm_summary,
)

# /proc and cgroup files are a few KiB; a larger one is not what it claims to be.
MAX_READ = 1024 * 1024


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(MAX_READ)
    except (OSError, ValueError):
        return None


def _cgroup(sys_root: str) -> tuple[int | None, int | None]:
    """Limit and usage (minus reclaimable inactive file cache) of this cgroup."""
    base = os.path.join(sys_root, "fs", "cgroup")
    layouts = (
        ("memory.max", "memory.current", "memory.stat", "inactive_file"),
        (
            os.path.join("memory", "memory.limit_in_bytes"),
            os.path.join("memory", "memory.usage_in_bytes"),
            os.path.join("memory", "memory.stat"),
            "total_inactive_file",
        ),
    )
    for limit_file, usage_file, stat_file, inactive_key in layouts:
        limit_text = _read(os.path.join(base, limit_file))
        usage_text = _read(os.path.join(base, usage_file))
        if limit_text is not None and usage_text is not None:
            stat_text = _read(os.path.join(base, stat_file))
            return (
                parse_cgroup_limit(limit_text),
                parse_cgroup_usage(usage_text, stat_text, inactive_key),
            )
    return None, None


def _processes(proc_root: str) -> list[dict]:
    users: dict[int, str] = {}
    found = []
    for entry in os.listdir(proc_root):
        if not (entry.isascii() and entry.isdigit()):
            continue
        status_path = os.path.join(proc_root, entry, "status")
        status_text = _read(status_path)
        if status_text is None:
            continue  # the process exited while we looked
        try:
            status = parse_status(status_text)
        except ProcParseError as exc:
            raise ProcParseError(f"{status_path}: {exc}") from None
        uid = status["uid"]
        if uid not in users:
            try:
                users[uid] = pwd.getpwuid(uid).pw_name
            except (KeyError, OverflowError, ValueError):
                users[uid] = str(uid)
        cmdline = (
            (_read(os.path.join(proc_root, entry, "cmdline")) or "").replace("\x00", " ").strip()
        )
        found.append(status | {"pid": int(entry), "user": users[uid], "cmdline": cmdline[:200]})
    return found


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
    run_facts(module, "memory", lambda _runner: _facts(module), timeouts=())


def _facts(module: AnsibleModule) -> dict:
    try:
        for option in ("proc_root", "sys_root"):  # absent: reported below as unreadable
            validate.existing_directory(option, module.params[option], must_exist=False)
        validate.existing_directory("shm_path", module.params["shm_path"])
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    proc_root = module.params["proc_root"]
    for option in ("min_uid", "top_processes"):
        if module.params[option] < 0:
            module.fail_json(msg=f"{option} must be 0 or more, got {module.params[option]}")
    meminfo_text = _read(os.path.join(proc_root, "meminfo"))
    if meminfo_text is None:
        module.fail_json(
            msg=f"Cannot read {proc_root}/meminfo: is proc_root={proc_root} a procfs mount?"
        )
    where = os.path.join(proc_root, "meminfo")
    try:
        meminfo = parse_meminfo(meminfo_text)
        where = os.path.join(module.params["sys_root"], "fs", "cgroup")
        limit, usage = _cgroup(module.params["sys_root"])
        facts = memory_summary(meminfo, limit, usage)
        where = os.path.join(proc_root, "pressure", "memory")
        psi_text = _read(where)
        facts["psi"] = parse_psi(psi_text) if psi_text else None
        where = os.path.join(proc_root, "loadavg")
        facts["loadavg"] = parse_loadavg(_read(where) or "")
        where = os.path.join(proc_root, "self", "limits")
        facts["memlock"] = parse_memlock(_read(where) or "")
    except ProcParseError as exc:
        module.fail_json(
            msg=f"Unexpected content in {where}: {exc}; is proc_root={proc_root} (sys_root="
            f"{module.params['sys_root']}) a real procfs (sysfs) mount?"
        )

    try:
        stat = os.statvfs(module.params["shm_path"])
        facts["shm"] = shm_summary(
            module.params["shm_path"], stat.f_frsize, stat.f_blocks, stat.f_bavail
        )
    except OSError as exc:
        module.fail_json(msg=f"Cannot measure shm_path={module.params['shm_path']}: {exc}")
    facts["cpu_count"] = os.cpu_count() or 1

    own_uids = {os.getuid()}
    for name in module.params["own_users"]:
        try:
            own_uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            module.warn(f"own_users: no such user {name!r} on this host; ignored")
    try:
        processes = _processes(proc_root)
    except ProcParseError as exc:
        module.fail_json(
            msg=f"Unexpected content in {exc}; is proc_root={proc_root} a real procfs mount?"
        )
    facts["other_users"] = other_users_processes(
        processes, own_uids, module.params["min_uid"], module.params["top_processes"]
    )
    return facts


if __name__ == "__main__":
    main()
