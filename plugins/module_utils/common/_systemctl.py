# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``systemctl show`` says about several units, parsed once for every stage.

The serve stage reads its units' states after staging (``serve/_stage_checks``), every stage's
saved result watches units (``common/_stage_file``): both ask ``systemctl show -p Id,... UNIT...``
and read its blocks here. Standard library only (the watchdog program embeds it).
"""

from __future__ import annotations


def parse_unit_show(show: str) -> dict[str, dict[str, str]]:
    """``{unit: {property: value}}`` from ``systemctl show -p Id,... UNIT...``."""
    states: dict[str, dict[str, str]] = {}
    for block in show.split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" in fields:
            states[fields["Id"]] = fields
    return states
