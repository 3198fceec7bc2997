# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The reconciled serving state of one node and how to compare it with the inventory.

Seed 000 §3.6: a start that reads a reconciled registry instead of the edited
source silently replays old settings.  The collection therefore writes one
document per node (``/etc/localinference/serving.json``) holding the recipe,
its hash and the checksums of the unit files, and refuses to start unless that
document, the unit files and the inventory all agree (F10).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils._recipe import (
    Node,
    canonical_json,
    recipe_hash,
)
from ansible_collections.localinference.vllm.plugins.module_utils._units import (
    render_units,
    unit_hash,
)

STATE_SCHEMA = 1


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def desired(
    recipe: dict[str, Any], node: Node, unit_dir: str, venv_dir: str = ""
) -> dict[str, Any]:
    """``{"document": ..., "units": [{name, path, content}]}`` for a normalised recipe."""
    digest = recipe_hash(recipe)
    rendered = render_units(recipe, node, digest, venv_dir)
    units = [
        {"name": u["name"], "path": f"{unit_dir.rstrip('/')}/{u['name']}", "content": u["content"]}
        for u in rendered["units"]
    ]
    document = {
        "schema": STATE_SCHEMA,
        "recipe_hash": digest,
        "recipe": recipe,
        "node": {
            "host": node.host,
            "rank": node.rank,
            "nnodes": node.nnodes,
            "role": node.role,
            "head_address": node.head_address,
            "address": node.address,
        },
        "server_argv": rendered["server_argv"],
        "ray_argv": rendered["ray_argv"],
        "environment": rendered["environment"],
        "start_order": rendered["start_order"],
        "units": [
            {"name": u["name"], "path": u["path"], "sha256": sha256_text(u["content"])}
            for u in units
        ],
    }
    return {"document": json.loads(canonical_json(document)), "units": units}


def dump(document: dict[str, Any]) -> str:
    """The on-disk form: sorted, indented, newline-terminated (stable bytes)."""
    return json.dumps(document, sort_keys=True, indent=2) + "\n"


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def differences(live: dict[str, Any] | None, wanted: dict[str, Any]) -> list[str]:
    """Human-readable differences between the node's document and the inventory's ask."""
    if live is None:
        return ["serving.json: missing on the node (never rolled out, or removed)"]
    have: dict[str, Any] = {}
    want: dict[str, Any] = {}
    _flatten(live, "", have)
    _flatten(wanted, "", want)
    lines = []
    for key in sorted(have.keys() | want.keys()):
        if have.get(key, "<absent>") != want.get(key, "<absent>"):
            lines.append(
                f"{key}: node has {json.dumps(have.get(key, '<absent>'))}, "
                f"inventory asks {json.dumps(want.get(key, '<absent>'))}"
            )
    return lines


def unit_file_problems(document: dict[str, Any], read: Any) -> list[str]:
    """Compare unit files on disk with the checksums and hash a document records.

    ``read(path)`` returns the file's text or None when it does not exist.
    """
    found = []
    for unit in document.get("units", []):
        text = read(unit["path"])
        if text is None:
            found.append(f"{unit['path']}: missing")
            continue
        if sha256_text(text) != unit["sha256"]:
            found.append(f"{unit['path']}: edited on the node (sha256 differs from serving.json)")
        carried = unit_hash(text)
        if carried != document.get("recipe_hash"):
            found.append(
                f"{unit['path']}: carries recipe hash {carried}, serving.json records "
                f"{document.get('recipe_hash')}"
            )
    return found
