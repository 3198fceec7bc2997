# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse ``ethtool IF`` and ``ethtool -i IF`` (run with LC_ALL=C)."""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

_SPEED = re.compile(r"^(?P<value>\d{1,9})\s*(?P<unit>[MG])b/s$")


class EthtoolParseError(validate.InputError):
    """The text is not ethtool output."""


def _fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith(("\t", " ")):
            continue
        key, sep, value = line.strip().partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def speed_mbps(value: str | None) -> int | None:
    """``10000Mb/s`` -> 10000, ``100Gb/s`` -> 100000, ``Unknown!`` -> None."""
    if not value:
        return None
    match = _SPEED.match(value.strip())
    if not match:
        return None
    number = int(match.group("value"))
    return number * 1000 if match.group("unit") == "G" else number


def parse_settings(text: str) -> dict[str, Any]:
    """``ethtool IF`` -> link, speed, duplex, port, autonegotiation."""
    if not text.startswith("Settings for "):
        raise EthtoolParseError("output does not start with 'Settings for': not ethtool output")
    fields = _fields(text)
    link = fields.get("Link detected")
    duplex = fields.get("Duplex")
    if duplex and duplex.startswith("Unknown"):
        duplex = None
    return {
        "link_detected": link == "yes" if link is not None else None,
        "speed_mbps": speed_mbps(fields.get("Speed")),
        "speed_raw": fields.get("Speed"),
        "duplex": duplex.lower() if duplex else None,
        "port": fields.get("Port"),
        "autoneg": fields.get("Auto-negotiation") == "on" if "Auto-negotiation" in fields else None,
    }


def sysfs_int(value: str | None) -> int | None:
    """A small decimal sysfs number such as ``mtu``; None for anything else."""
    try:
        return validate.counter("sysfs", value or "", max_digits=9)
    except validate.ValidationError:
        return None


def parse_driver(text: str) -> dict[str, Any]:
    """``ethtool -i IF`` -> driver, version, firmware, bus-info."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()
    if "driver" not in values:
        raise EthtoolParseError("no 'driver:' line: not 'ethtool -i' output")
    return {
        "driver": values["driver"] or None,
        "driver_version": values.get("version") or None,
        "firmware_version": values.get("firmware-version") or None,
        "bus_info": values.get("bus-info") or None,
    }
