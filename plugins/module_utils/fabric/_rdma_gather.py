# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``rdma_facts``: the node's RDMA devices and ports, from ``ibv_devinfo -v`` and sysfs.

Each port's GID table (sysfs first, ``ibv_devinfo`` otherwise), its network interface, that
interface's IPv4 addresses and the RoCE v2 GID index that carries one of them; the parsing
and the index are ``_rdma_facts``'s. A node without rdma-core or a device is :class:`Absent`
(``WHEN_ABSENT`` says what the module returns then).

No AnsibleModule here: ``module`` is the caller's (``params``, ``get_bin_path``, ``fail_json``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    Absent,
    WhenAbsent,
    find_binary,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
    interface_name,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._rdma_facts import (
    RdmaParseError,
    gid_table,
    parse_ibv_devinfo,
    rdma_device_name,
    read_sysfs_gids,
    roce_v2_ipv4_index,
)

HINT = (
    "the RDMA driver or rdma-core may be stuck (see 'dmesg' and 'rdma link'); raise timeout only"
    " if the command is merely slow"
)


def _valid_netdev(name: str | None) -> str | None:
    """A netdev name read from sysfs, or None when it is no valid interface name."""
    try:
        return interface_name("netdev", name) if name else None
    except ValidationError:
        return None


def _valid_hca(name: str) -> str | None:
    try:
        return rdma_device_name("devices", name)
    except ValidationError:
        return None


def _sysfs_netdev(sys_root: str, hca: str) -> str | None:
    net_dir = os.path.join(sys_root, "class", "infiniband", hca, "device", "net")
    if os.path.isdir(net_dir):
        names = sorted(os.listdir(net_dir))
        if len(names) == 1:
            return _valid_netdev(names[0])
    return None


def _ipv4_addresses(module: Any, runner: Runner, netdev: str) -> list[str]:
    ip = module.get_bin_path("ip")
    if not ip:
        return []
    rc, out, _ = runner.run([ip, "-j", "-4", "addr", "show", "dev", netdev], HINT)
    if rc != 0:
        return []
    try:
        links = json.loads(out or "[]")
    except ValueError:
        return []
    if not isinstance(links, list):
        return []
    return [
        info["local"]
        for link in links
        if isinstance(link, dict) and isinstance(link.get("addr_info"), list)
        for info in link["addr_info"]
        if isinstance(info, dict)
        and info.get("family") == "inet"
        and isinstance(info.get("local"), str)
    ]


def _resolve_ports(module: Any, runner: Runner, sys_root: str, devices: dict) -> dict:
    """Fill each port's GID table, netdev, IPv4 addresses and RoCE v2 index; ``netdev_to_hca``."""
    netdev_to_hca = {}
    address_cache: dict[str, list[str]] = {}
    for hca, device in devices.items():
        fallback_netdev = _sysfs_netdev(sys_root, hca)
        for number, port in device["ports"].items():
            port_dir = os.path.join(sys_root, "class", "infiniband", hca, "ports", number)
            sysfs = gid_table(read_sysfs_gids(port_dir, _files.read_sysfs, _valid_netdev))
            if sysfs:
                port["gids"] = sysfs
                port["gid_source"] = "sysfs"
            else:
                port["gid_source"] = "ibv_devinfo" if port.get("gids") else None
            netdevs = sorted(
                {entry["netdev"] for entry in port["gids"].values() if entry.get("netdev")}
            )
            netdev = netdevs[0] if len(netdevs) == 1 else fallback_netdev
            port["netdev"] = netdev
            if netdev:
                netdev_to_hca[netdev] = {"hca": hca, "port": number}
                if netdev not in address_cache:
                    address_cache[netdev] = _ipv4_addresses(module, runner, netdev)
            port["ipv4_addresses"] = address_cache.get(netdev, []) if netdev else []
            index = roce_v2_ipv4_index(port["gids"], port["ipv4_addresses"], netdev)
            port["roce_v2_gid_index"] = index
            port["roce_v2_gid"] = port["gids"][str(index)]["gid"] if index is not None else None
    return netdev_to_hca


WHEN_ABSENT = WhenAbsent(
    name="rdma_facts",
    fix="Install rdma-core and the NIC driver, or set required=false for a node without RDMA.",
    facts=lambda why: {"present": False, "absent_reason": why, "devices": {}, "netdev_to_hca": {}},
)


def facts(module: Any, runner: Runner) -> dict:
    """The facts of ``ansible_facts.rdma``; raises Absent on a node without rdma-core or a device."""
    try:
        for position, name in enumerate(module.params["devices"]):
            rdma_device_name(f"devices[{position}]", name)
    except ValidationError as exc:
        module.fail_json(msg=str(exc))
    sys_root = module.params["sys_root"]
    try:
        validate.existing_directory("sys_root", sys_root, must_exist=False)
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))

    binary = module.params["ibv_devinfo"]
    path = find_binary(module, binary)
    rc, out, err = runner.run([path, "-v"], HINT)
    if rc != 0 or "No IB devices found" in (out + err):
        raise Absent(f"'{binary} -v' found no device (rc={rc}): {(err or out).strip()[:200]}")
    try:
        devices = parse_ibv_devinfo(out)
    except RdmaParseError as exc:
        module.fail_json(msg=f"Could not parse '{binary} -v' output: {exc}")
    # Device names become sysfs paths: one that breaks the kernel's naming rule is garbage.
    bad = [name for name in devices if _valid_hca(name) is None]
    if bad:
        module.fail_json(
            msg=f"'{binary} -v' reported device name(s) that cannot be RDMA devices: "
            f"{', '.join(repr(name[:80]) for name in bad)}"
        )

    wanted = module.params["devices"]
    unknown = [name for name in wanted if name not in devices]
    if unknown:
        module.fail_json(
            msg=f"devices: no RDMA device {', '.join(unknown)} (present: {', '.join(sorted(devices))})."
        )
    if wanted:
        devices = {name: devices[name] for name in wanted}

    netdev_to_hca = _resolve_ports(module, runner, sys_root, devices)
    return {"present": bool(devices), "devices": devices, "netdev_to_hca": netdev_to_hca}
