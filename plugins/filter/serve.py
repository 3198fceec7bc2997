# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the serve role; the logic lives in module_utils.

- ``start_refusals``: the lines of a unit's log in which a guard refused the start (the memory
  admission, F4; the offload reclaim, F13), journal prefix cut, the last three, repeats once.
- ``build_sources``: where the controller holds each ``vllm_recipe.build`` file and patch
  (``collection:``, ``inventory:``, an absolute path below ``serve_build_roots``), with its pin.
"""

from __future__ import annotations

import os
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.common import _build_recipe
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    start_refusals as _start_refusals,
)


def start_refusals(lines: Any, limit: int = 3) -> list[str]:
    if isinstance(lines, str):
        lines = lines.splitlines()
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise AnsibleFilterError(
            f"start_refusals takes the log as text or a list of lines, got {type(lines).__name__}"
        )
    return _start_refusals(lines, int(limit))


def build_sources(
    build: Any, collection_files: str, inventory_dir: str, roots: Any = (), host_dir: str = ""
) -> list[dict[str, str]]:
    """Where the controller holds each ``vllm_recipe.build`` source (``_build_recipe.controller_sources``),
    and where the build host keeps its copy (``on_host``: ``host_dir/<sha256>``)."""
    try:
        found = _build_recipe.controller_sources(build, collection_files, inventory_dir, list(roots or []))
    except ValidationError as exc:
        raise AnsibleFilterError(str(exc)) from None
    for item in found:
        if not os.path.isfile(item["path"]):
            raise AnsibleFilterError(
                f"{item['key']}: {item['src']} is not a file on the controller ({item['path']}); "
                "fix the path (collection: is the collection's files/, inventory: the inventory's directory)"
            )
    return [{**item, "on_host": f"{host_dir.rstrip('/')}/{item['sha256']}"} for item in found]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"start_refusals": start_refusals, "build_sources": build_sources}
