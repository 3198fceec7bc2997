# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``systemctl show`` says about units, parsed one way for every stage.

One unit's properties (``parse_show``): serving_ready watches its units while it waits
(``serve/_ready_probe``), the doctor judges what it recorded (``doctor/_evidence``). Several
units' blocks (``parse_unit_show``): the serve stage reads its units' states after staging
(``serve/_stage_checks``), every stage's saved result watches units (``common/_stage_file``), the
watchdog reads its node's units (``watchdog/_node``). Standard library only (the watchdog
program embeds it).
"""

from __future__ import annotations

from typing import Any


def parse_show(text: Any) -> dict[str, str]:
    """``KEY=VALUE`` lines of one unit's ``systemctl show`` as a dict.

    A line that is no property (garbage, a key that is not an identifier) is skipped, and
    anything but text holds no properties: what a node hands back is never trusted.
    """
    found: dict[str, str] = {}
    if not isinstance(text, str):
        return found
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and key.isidentifier():
            found[key] = value.strip()
    return found


def parse_unit_show(show: str) -> dict[str, dict[str, str]]:
    """``{unit: {property: value}}`` from ``systemctl show -p Id,... UNIT...`` (a block per unit)."""
    states: dict[str, dict[str, str]] = {}
    for block in show.split("\n\n"):
        fields = parse_show(block)
        if "Id" in fields:
            states[fields["Id"]] = fields
    return states
