# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse ``ibv_devinfo [-v]``, ``show_gids`` and the sysfs GID table.

The RoCE v2 GID index that carries an interface's IPv4 address is what
``NCCL_IB_GID_INDEX`` must be.  It is 3 on a freshly configured DGX Spark but
moves when addresses are added or rebuilt, and can differ per node (F20), so
it is resolved per node from the GID table rather than assumed.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
    text,
)

_ENUM = re.compile(r"^(?P<name>\S+)\s+\((?P<code>-?\d+)\)$")
_GID_LINE = re.compile(
    r"^GID\[\s*(?P<index>\d{1,6})\]:\s*(?P<gid>[0-9A-Fa-f:.]+)(?:,\s*(?P<type>.+))?$"
)
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# IB_DEVICE_NAME_MAX is 64 with the terminating NUL.
MAX_DEVICE_NAME = 63


class RdmaParseError(validate.InputError):
    """The text is not ibv_devinfo/show_gids output."""


def rdma_device_name(name: str, value: Any) -> str:
    """An RDMA device (HCA) name, which becomes a sysfs path: as strict as an interface name.

    Raises ``_validate.ValidationError`` naming ``name``.
    """
    value = text(name, value, max_length=256)
    fix = "use the name 'ibv_devices' or 'rdma link' shows"
    for index, char in enumerate(value):
        if char in "/:" or char.isspace():
            raise ValidationError(
                name, f"contains {char!r} (no RDMA device name can) at position {index}", fix
            )
    if value in (".", ".."):
        raise ValidationError(name, f"{value!r} is not an RDMA device name", fix)
    if len(value.encode("utf-8")) > MAX_DEVICE_NAME:
        raise ValidationError(
            name, f"{value[:80]!r} is longer than {MAX_DEVICE_NAME} bytes (IB_DEVICE_NAME_MAX)", fix
        )
    return value


def _mtu(value: str | None) -> int | None:
    """``4096 (5)`` -> 4096."""
    if not value:
        return None
    match = _ENUM.match(value.strip())
    token = match.group("name") if match else value
    try:
        return validate.counter("active_mtu", token, max_digits=9)
    except validate.ValidationError:
        return None


def _enum_name(value: str | None) -> str | None:
    """``PORT_ACTIVE (4)`` -> ``PORT_ACTIVE``."""
    if not value:
        return None
    match = _ENUM.match(value.strip())
    return match.group("name") if match else value.strip()


def normalize_gid_type(value: str | None) -> str | None:
    """``RoCE v2``/``v2`` -> ``RoCE v2``; ``IB/RoCE v1``/``v1`` -> ``RoCE v1``."""
    if not value:
        return None
    text = value.strip().lower()
    if text.endswith("v2"):
        return "RoCE v2"
    if text.endswith("v1"):
        return "RoCE v1"
    return value.strip()


def gid_ipv4(gid: str | None) -> str | None:
    """The IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), else None."""
    if not gid:
        return None
    try:
        address = ipaddress.IPv6Address(gid.strip())
    except ValueError:
        return None
    mapped = address.ipv4_mapped
    return str(mapped) if mapped else None


def parse_ibv_devinfo(text: str) -> dict[str, Any]:
    """``ibv_devinfo`` or ``ibv_devinfo -v`` -> ``{hca_id: {..., "ports": {n: {...}}}}``."""
    devices: dict[str, Any] = {}
    device: dict[str, Any] | None = None
    port: dict[str, Any] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        key, sep, value = line.partition(":")
        key = key.strip()
        value = value.strip()
        if key == "hca_id" and sep:
            device = {"ports": {}}
            devices[value] = device
            port = None
            continue
        if device is None:
            continue
        if key == "port" and sep and value.isascii() and value.isdigit() and len(value) <= 4:
            port = {"gids": {}}
            device["ports"][value] = port
            continue
        gid = _GID_LINE.match(line)
        if gid and port is not None:
            port["gids"][gid.group("index")] = {
                "gid": gid.group("gid"),
                "type": normalize_gid_type(gid.group("type")),
                "netdev": None,
                "ipv4": gid_ipv4(gid.group("gid")),
            }
            continue
        if not sep:
            continue
        target = port if port is not None else device
        if target is device and key in (
            "transport",
            "fw_ver",
            "node_guid",
            "sys_image_guid",
            "vendor_id",
            "vendor_part_id",
            "hw_ver",
            "board_id",
            "phys_port_cnt",
        ):
            device[key] = value
        elif target is port and port is not None:
            if key in ("max_mtu", "active_mtu"):
                port[key] = _mtu(value)
            elif key in ("state", "phys_state"):
                port[key] = _enum_name(value)
            elif key in ("link_layer", "active_width", "active_speed", "gid_tbl_len"):
                port[key] = value
    if not devices:
        raise RdmaParseError("no 'hca_id:' in output: not ibv_devinfo output")
    for device in devices.values():
        count = device.get("phys_port_cnt")
        if count is not None and count.isascii() and count.isdigit() and len(count) <= 4:
            device["phys_port_cnt"] = int(count)
    return devices


def parse_show_gids(text: str) -> list[dict[str, Any]]:
    """Rows of Mellanox ``show_gids`` (DEV PORT INDEX GID IPv4 VER DEV)."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("\t")]
        cells = [cell for cell in cells if cell != ""]
        if len(cells) < 5 or not all(
            cell.isascii() and cell.isdigit() and len(cell) <= 6 for cell in cells[1:3]
        ):
            continue
        device, port, index, gid = cells[0], cells[1], cells[2], cells[3]
        rest = cells[4:]
        ipv4 = rest[0] if len(rest) == 3 else None
        version, netdev = rest[-2], rest[-1]
        rows.append(
            {
                "device": device,
                "port": port,
                "index": int(index),
                "gid": gid,
                "ipv4": ipv4 or gid_ipv4(gid),
                "type": normalize_gid_type(version),
                "netdev": netdev,
            }
        )
    return rows


def gid_table(entries: dict[str, dict[str, str | None]]) -> dict[str, dict[str, Any]]:
    """sysfs ``gids/N`` + ``gid_attrs/types/N`` + ``gid_attrs/ndevs/N`` -> table.

    ``entries`` maps the index (a string) to ``{"gid", "type", "netdev"}`` raw
    file contents; unused slots (all-zero GID) are dropped.
    """
    table: dict[str, dict[str, Any]] = {}
    for index, entry in entries.items():
        gid = (entry.get("gid") or "").strip()
        if not gid or gid == ZERO_GID:
            continue
        netdev = (entry.get("netdev") or "").strip() or None
        table[str(index)] = {
            "gid": gid,
            "type": normalize_gid_type(entry.get("type")),
            "netdev": netdev,
            "ipv4": gid_ipv4(gid),
        }
    return table


def roce_v2_ipv4_index(
    gids: dict[str, dict[str, Any]],
    ipv4_addresses: list[str],
    netdev: str | None = None,
) -> int | None:
    """Lowest GID index of type RoCE v2 whose GID maps one of ``ipv4_addresses``.

    When the table records a netdev per entry it must match ``netdev`` too.
    """
    wanted = set(ipv4_addresses)
    candidates = []
    for index, entry in gids.items():
        if not (str(index).isascii() and str(index).isdigit()):
            continue
        if entry.get("type") != "RoCE v2" or entry.get("ipv4") not in wanted:
            continue
        if netdev and entry.get("netdev") and entry["netdev"] != netdev:
            continue
        candidates.append(int(index))
    return min(candidates) if candidates else None


def read_sysfs_gids(
    port_dir: str,
    read: Callable[[str], str | None],
    netdev: Callable[[str | None], str | None],
) -> dict[str, dict[str, str | None]]:
    """The raw ``gids/N``, ``gid_attrs/types/N`` and ``gid_attrs/ndevs/N`` of one port.

    ``read(path)`` returns a sysfs file's text or None; ``netdev(name)`` keeps a valid
    interface name. The rdma_facts module and the watchdog read the table this one way.
    """
    gids_dir = os.path.join(port_dir, "gids")
    if not os.path.isdir(gids_dir):
        return {}
    entries = {}
    indices = [name for name in os.listdir(gids_dir) if name.isascii() and name.isdigit()]
    for index in sorted(indices, key=lambda name: (len(name), name)):
        entries[index] = {
            "gid": read(os.path.join(gids_dir, index)),
            # Reading the type or netdev of an unused slot fails with EINVAL on a real kernel.
            "type": read(os.path.join(port_dir, "gid_attrs", "types", index)),
            "netdev": netdev(read(os.path.join(port_dir, "gid_attrs", "ndevs", index))),
        }
    return entries


def sysfs_port_dir(sys_root: str, hca: str, port: int | str) -> str:
    """``<sys_root>/class/infiniband/<hca>/ports/<port>``: where one port's GID table lives."""
    return os.path.join(sys_root, "class", "infiniband", hca, "ports", str(port))


def live_roce_v2_index(
    sys_root: str,
    hca: str,
    port: int | str,
    ipv4: str,
    netdev: str | None,
    read: Callable[[str], str | None],
) -> tuple[int | None, dict[str, dict[str, Any]]]:
    """(the RoCE v2 index of ``ipv4`` in the port's sysfs GID table now, that table).

    The one reader of a live table: the watchdog's probe and the units' start program
    (``_gid_start``) both call it, so they cannot disagree on what the table says.
    """
    entries = read_sysfs_gids(sysfs_port_dir(sys_root, hca, port), read, lambda name: name or None)
    table = gid_table(entries)
    return roce_v2_ipv4_index(table, [ipv4], netdev), table
