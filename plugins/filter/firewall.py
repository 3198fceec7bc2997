# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Firewall filters of the serve role; the rules live in module_utils/serve/_firewall.py.

- ``firewall_ports``: the internal ports of one node (``[{port, what}]``) from the normalised recipe.
- ``firewall_rules``: the validated data the rules file (``table inet localinference``) is rendered from.
- ``firewall_confined``: the ports the live table confines, from ``nft -j list table inet localinference``.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _firewall


def firewall_ports(
    recipe: Any, rank: Any, nnodes: Any, behind_ingress: Any = False
) -> list[dict[str, Any]]:
    if not isinstance(recipe, dict):
        raise AnsibleFilterError(
            f"firewall_ports expects the normalised recipe, got {type(recipe).__name__}"
        )
    try:
        return _firewall.internal_ports(recipe, rank, nnodes, bool(behind_ingress))
    except ValidationError as exc:
        raise AnsibleFilterError(str(exc)) from None


def firewall_rules(spec: Any) -> dict[str, Any]:
    try:
        return _firewall.ruleset(spec)
    except ValidationError as exc:
        raise AnsibleFilterError(str(exc)) from None


def firewall_confined(text: Any) -> list[int]:
    return _firewall.confined_ports(text)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "firewall_ports": firewall_ports,
            "firewall_rules": firewall_rules,
            "firewall_confined": firewall_confined,
        }
