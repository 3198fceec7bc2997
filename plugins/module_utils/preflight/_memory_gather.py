# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``memory_facts``: the node's memory as the preflight judges it, read from /proc and the cgroup.

MemTotal and what is available, this cgroup's limit and usage (less the reclaimable inactive
file cache), pressure (PSI), the load, the locked-memory limit, /dev/shm, and the processes of
other users that hold memory. Every file is parsed by ``_memory_facts``; content that is not
what the kernel writes ends the module naming the file.

No AnsibleModule here: ``module`` is the caller's (``params``, ``warn``, ``fail_json``).
"""

from __future__ import annotations

import os
import pwd
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._files import (
    read_kernel_text,
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
        limit_text = read_kernel_text(os.path.join(base, limit_file))
        usage_text = read_kernel_text(os.path.join(base, usage_file))
        if limit_text is not None and usage_text is not None:
            stat_text = read_kernel_text(os.path.join(base, stat_file))
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
        status_text = read_kernel_text(status_path)
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
        cmdline = read_kernel_text(os.path.join(proc_root, entry, "cmdline")) or ""
        cmdline = cmdline.replace("\x00", " ").strip()
        found.append(status | {"pid": int(entry), "user": users[uid], "cmdline": cmdline[:200]})
    return found


def facts(module: Any) -> dict:
    """The facts of ``ansible_facts.memory``; unreadable or garbled /proc ends the module."""
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
    meminfo_text = read_kernel_text(os.path.join(proc_root, "meminfo"))
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
        psi_text = read_kernel_text(where)
        facts["psi"] = parse_psi(psi_text) if psi_text else None
        where = os.path.join(proc_root, "loadavg")
        facts["loadavg"] = parse_loadavg(read_kernel_text(where) or "")
        where = os.path.join(proc_root, "self", "limits")
        facts["memlock"] = parse_memlock(read_kernel_text(where) or "")
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
