#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: rdma_facts
short_description: Read RDMA port state, MTU, link layer and the RoCE v2 GID index per port
version_added: 0.2.0
description:
  - Runs C(ibv_devinfo -v) for port state, C(max_mtu)/C(active_mtu) and link layer, and reads the GID table from
    sysfs (C(<sys_root>/class/infiniband/<hca>/ports/<n>/gids/*), C(gid_attrs/types/*), C(gid_attrs/ndevs/*)).
  - For each port it resolves the network device and the lowest RoCE v2 GID index whose GID carries one of that
    device's IPv4 addresses; this is the value for C(NCCL_IB_GID_INDEX) on this node (it can differ per node).
  - When sysfs has no GID table the GID lines of C(ibv_devinfo -v) are used.
  - Results are returned under C(ansible_facts.rdma).
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.FACTS
  - localinference.vllm.node
  - localinference.vllm.node.SYS_ROOT
  - localinference.vllm.node.REQUIRED
options:
  ibv_devinfo:
    description:
      - Name or path of the C(ibv_devinfo) executable.
    type: str
    default: ibv_devinfo
  devices:
    description:
      - Only report these HCAs (for example V(rocep1s0f0)). Empty means all.
    type: list
    elements: str
    default: []
  timeout:
    default: 30
notes:
  - Commands run with C(LC_ALL=C).
  - Device names in O(devices) and network device names read from sysfs are checked against the kernel's
    naming rule (no C(/), not C(..), at most 63 or 15 characters) before they become paths or arguments.
"""

EXAMPLES = r"""
- name: Read RDMA facts
  localinference.vllm.rdma_facts:

- name: GID index for NCCL on this node
  ansible.builtin.debug:
    msg: "{{ ansible_facts.rdma.devices.rocep1s0f0.ports['1'].roce_v2_gid_index }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    rdma:
      description: RDMA facts.
      returned: always
      type: dict
      contains:
        present:
          description: Whether any RDMA device was found.
          type: bool
        absent_reason:
          description: Why no device was found.
          type: str
          returned: when present is false
        netdev_to_hca:
          description: Map of network device name to C({hca, port}).
          type: dict
          sample: {enp1s0f0np0: {hca: rocep1s0f0, port: "1"}}
        devices:
          description: One entry per HCA; C(ports) maps the port number (a string) to its state.
          type: dict
          sample:
            rocep1s0f0:
              fw_ver: 28.45.4028
              vendor_part_id: "4129"
              board_id: NVD0000000087
              ports:
                "1":
                  state: PORT_ACTIVE
                  max_mtu: 4096
                  active_mtu: 4096
                  link_layer: Ethernet
                  netdev: enp1s0f0np0
                  ipv4_addresses: [192.168.100.10]
                  roce_v2_gid_index: 3
                  roce_v2_gid: "0000:0000:0000:0000:0000:ffff:c0a8:640a"
                  gid_source: sysfs
                  gids: {"3": {gid: "0000:0000:0000:0000:0000:ffff:c0a8:640a", type: RoCE v2, netdev: enp1s0f0np0, ipv4: 192.168.100.10}}
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    Absent,
    WhenAbsent,
    run_facts,
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


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(4096).strip()
    except (OSError, ValueError):
        return None


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


def _ipv4_addresses(module: AnsibleModule, runner: Runner, netdev: str) -> list[str]:
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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "ibv_devinfo": {"type": "str", "default": "ibv_devinfo"},
            "sys_root": {"type": "path", "default": "/sys"},
            "devices": {"type": "list", "elements": "str", "default": []},
            "required": {"type": "bool", "default": False},
            "timeout": {"type": "float", "default": 30.0},
        },
        supports_check_mode=True,
    )
    run_facts(module, "rdma", lambda runner: _facts(module, runner), absent=WHEN_ABSENT)


def _resolve_ports(module: AnsibleModule, runner: Runner, sys_root: str, devices: dict) -> dict:
    """Fill each port's GID table, netdev, IPv4 addresses and RoCE v2 index; ``netdev_to_hca``."""
    netdev_to_hca = {}
    address_cache: dict[str, list[str]] = {}
    for hca, device in devices.items():
        fallback_netdev = _sysfs_netdev(sys_root, hca)
        for number, port in device["ports"].items():
            port_dir = os.path.join(sys_root, "class", "infiniband", hca, "ports", number)
            sysfs = gid_table(read_sysfs_gids(port_dir, _read, _valid_netdev))
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


def _facts(module: AnsibleModule, runner: Runner) -> dict:
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
    path = (
        (binary if os.access(binary, os.X_OK) else None)
        if "/" in binary
        else module.get_bin_path(binary)
    )
    if not path:
        raise Absent(f"{binary} not found in PATH")
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


if __name__ == "__main__":
    main()
