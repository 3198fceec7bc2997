# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names of kernel objects that become sysfs paths or command arguments.

A network interface or RDMA device name is joined to ``/sys/class/...``; a
name such as ``..`` or ``../../etc`` would walk out of that directory.  The
kernel's own rule (``dev_valid_name``) is: 1 to 15 bytes, not ``.`` or
``..``, no ``/``, no ``:`` and no white space.  RDMA device names follow the
same rule with a longer limit (``IB_DEVICE_NAME_MAX`` is 64 with the NUL).

No AnsibleModule here: this file is unit-tested on its own.
"""

from __future__ import annotations

IFNAMSIZ = 16
IB_DEVICE_NAME_MAX = 64


class InvalidName(ValueError):
    """A name that cannot be a kernel object name; the message names the option."""


def _check(value: object, option: str, limit: int, kind: str) -> str:
    if not isinstance(value, str):
        raise InvalidName(f"{option}: {kind} name must be a string, got {value!r}")
    if not value:
        raise InvalidName(f"{option}: {kind} name is empty")
    if value in (".", ".."):
        raise InvalidName(f"{option}: {value!r} is not a {kind} name (it is a directory reference)")
    if len(value.encode("utf-8", errors="replace")) > limit:
        raise InvalidName(
            f"{option}: {kind} name {value[:80]!r} is {len(value)} characters; the kernel allows"
            f" at most {limit}"
        )
    for char in value:
        if char == "/" or char == ":" or char.isspace() or not char.isprintable():
            raise InvalidName(
                f"{option}: {kind} name {value!r} contains {char!r}, which no {kind} name can"
                " contain; use the name 'ip -br link' (or 'ibv_devices') prints"
            )
    return value


def interface_name(value: object, option: str = "interfaces") -> str:
    """A network interface name (1 to 15 bytes); raises :class:`InvalidName`."""
    return _check(value, option, IFNAMSIZ - 1, "interface")


def rdma_device_name(value: object, option: str = "devices") -> str:
    """An RDMA device (HCA) name (1 to 63 bytes); raises :class:`InvalidName`."""
    return _check(value, option, IB_DEVICE_NAME_MAX - 1, "RDMA device")
