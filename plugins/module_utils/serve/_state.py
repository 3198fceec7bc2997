# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The reconciled serving state of one node and how to compare it with the inventory.

The two-Spark field report: a start that reads a reconciled registry instead of the edited
source silently replays old settings.  The collection therefore writes one
document per node (``/etc/localinference/serving.json``) holding the recipe,
its hash and the checksums of the unit files, and refuses to start unless that
document, the unit files and the inventory all agree (F10).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._files import (
    FileError,
    read_regular,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    canonical_json,
    recipe_hash,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import Node
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    SLICE,
    Guards,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._units import (
    RAY_UNIT,
    SERVER_UNIT,
    render_units,
    unit_hash,
)

STATE_SCHEMA = 1
# serving.json is a few kilobytes; anything far larger is not ours.
MAX_STATE_BYTES = 4 * 1024 * 1024
# The only unit files and services this collection writes (the slice: unified memory only).
OWN_UNIT_NAMES = frozenset(
    f"{unit}.{kind}" for unit in (SERVER_UNIT, RAY_UNIT) for kind in ("container", "service")
) | {SLICE}
OWN_SERVICES = frozenset(f"{unit}.service" for unit in (SERVER_UNIT, RAY_UNIT))
HEX64 = re.compile(r"[0-9a-f]{64}")
# differences() lists at most this many lines and compares no deeper than this.
MAX_DIFFERENCES = 40
MAX_FLATTEN_DEPTH = 16


class StateFileError(validate.InputError):
    """A state or unit file that exists but cannot be read as text; the message says why."""


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_text(path: str, max_bytes: int = MAX_STATE_BYTES) -> str | None:
    """The UTF-8 text of ``path``, or None when it does not exist.

    Raises :class:`StateFileError` for a directory, a device or FIFO (never
    opened: a FIFO would block), a file larger than ``max_bytes``, unreadable
    or binary content.
    """
    try:
        data = read_regular(path, max_bytes)
    except FileError as exc:
        raise StateFileError(str(exc)) from None
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateFileError(f"{path} is not UTF-8 text (byte {exc.start})") from None


def parse_document(text: str, label: str) -> tuple[Any, list[str]]:
    """``(document, problems)`` from a state file's text; never raises."""
    try:
        return json.loads(text), []
    except RecursionError:
        return None, [f"{label}: nested too deeply to be a serving state document"]
    except ValueError as exc:
        return None, [f"{label}: not valid JSON ({exc})"]


def desired(
    recipe: dict[str, Any],
    node: Node,
    unit_dir: str,
    venv_dir: str = "",
    guards: Guards | None = None,
    slice_dir: str = "/etc/systemd/system",
) -> dict[str, Any]:
    """``{"document": ..., "units": [{name, path, content}]}`` for a normalised recipe.

    The slice unit (``guards`` on unified memory) goes to ``slice_dir``: systemd reads slices
    there, not in Quadlet's directory. The document records the guards' ``memory`` need.
    """
    digest = recipe_hash(recipe)
    rendered = render_units(recipe, node, digest, venv_dir, guards)
    units = [
        {
            "name": u["name"],
            "path": f"{(slice_dir if u['name'] == SLICE else unit_dir).rstrip('/')}/{u['name']}",
            "content": u["content"],
        }
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
            **({"weights_digest": node.weights_digest} if node.weights_digest else {}),
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
    if guards is not None:
        document["memory"] = guards.need
    return {"document": json.loads(canonical_json(document)), "units": units}


def dump(document: Any) -> str:
    """The on-disk form: sorted, indented, newline-terminated (stable bytes)."""
    return json.dumps(document, sort_keys=True, indent=2) + "\n"


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else f"a {type(value).__name__}"
    )


def _string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def check_document(
    document: Any, unit_dirs: list[str] | tuple[str, ...], label: str = "serving.json"
) -> tuple[dict[str, Any], list[str]]:
    """Schema-check a state document read back from a node; never trust it.

    Returns ``(trusted, problems)``.  ``trusted`` holds only what passed:
    ``recipe_hash`` (64 hex or None), ``recipe`` (a dict or None),
    ``start_order`` (only this collection's services) and ``units`` (only this
    collection's unit names, at ``<unit_dir>/<name>`` in one of ``unit_dirs``,
    with a 64-hex ``sha256``); ``valid`` says whether the whole document passed.
    Deletions and stops may use ``trusted`` and nothing else.
    """
    trusted: dict[str, Any] = {
        "valid": False,
        "recipe_hash": None,
        "recipe": None,
        "start_order": [],
        "units": [],
    }
    if not isinstance(document, dict):
        return trusted, [
            f"{label}: expected a JSON object written by the collection, found {_kind(document)}"
        ]
    problems = []

    def bad(key: str, problem: str) -> None:
        problems.append(f"{label}: {key}: {problem}")

    _check_fields(document, trusted, bad)
    order = document.get("start_order")
    if _string_list(order):
        trusted["start_order"] = _own_services(order, bad)
    else:
        bad("start_order", f"{_kind(order)} where a list of service names was expected")
    units = document.get("units")
    if not isinstance(units, list):
        bad("units", f"{_kind(units)} where a list of unit records was expected")
        units = []
    trusted["units"] = _own_units(units, unit_dirs, bad)
    trusted["valid"] = not problems
    return trusted, problems


def _check_fields(
    document: dict[str, Any], trusted: dict[str, Any], bad: Callable[[str, str], None]
) -> None:
    """The schema, the recipe and its hash, the node, the argv lists and the environment."""
    if document.get("schema") != STATE_SCHEMA:
        bad("schema", f"is {json.dumps(document.get('schema'))}, expected {STATE_SCHEMA}")
    digest = document.get("recipe_hash")
    if isinstance(digest, str) and HEX64.fullmatch(digest):
        trusted["recipe_hash"] = digest
    else:
        bad("recipe_hash", f"{_kind(digest)} where 64 hex digits were expected")
    if isinstance(document.get("recipe"), dict):
        trusted["recipe"] = document["recipe"]
    else:
        bad("recipe", f"{_kind(document.get('recipe'))} where an object was expected")
    if not isinstance(document.get("node"), dict):
        bad("node", f"{_kind(document.get('node'))} where an object was expected")
    for key in ("server_argv", "ray_argv"):
        if document.get(key) is not None and not _string_list(document.get(key)):
            bad(key, f"{_kind(document.get(key))} where a list of strings or null was expected")
    environment = document.get("environment")
    if not (
        isinstance(environment, dict) and all(isinstance(v, str) for v in environment.values())
    ):
        bad("environment", f"{_kind(environment)} where an object of strings was expected")


def _own_services(order: list[str], bad: Callable[[str, str], None]) -> list[str]:
    """This collection's services of ``start_order``, each once; anything else is a problem."""
    own: list[str] = []
    for name in order:
        if name in OWN_SERVICES and name not in own:
            own.append(name)
        else:
            bad(
                "start_order",
                f"{name[:80]!r} is not a service of this collection (or repeated)",
            )
    return own


def _own_units(
    units: list[Any], unit_dirs: list[str] | tuple[str, ...], bad: Callable[[str, str], None]
) -> list[dict[str, Any]]:
    """The unit records that name this collection's units at their own paths, each once."""
    own: list[dict[str, Any]] = []
    seen = set()
    for index, unit in enumerate(units):
        key = f"units[{index}]"
        if not isinstance(unit, dict):
            bad(key, f"{_kind(unit)} where an object with name, path and sha256 was expected")
            continue
        name, path, checksum = unit.get("name"), unit.get("path"), unit.get("sha256")
        if not isinstance(name, str) or name not in OWN_UNIT_NAMES:
            bad(f"{key}.name", f"{json.dumps(name)[:80]} is not a unit this collection writes")
            continue
        if not isinstance(path, str) or not any(
            path == f"{d.rstrip('/')}/{name}" for d in unit_dirs
        ):
            bad(
                f"{key}.path",
                f"{json.dumps(path)[:120]} is not {name} in the collection's unit directories "
                f"({', '.join(unit_dirs)}); it is neither read nor removed",
            )
            continue
        if not isinstance(checksum, str) or not HEX64.fullmatch(checksum):
            bad(f"{key}.sha256", "missing or not 64 hex digits; the unit file cannot be verified")
            checksum = None
        if path in seen:
            bad(f"{key}.path", f"{path} is listed twice")
            continue
        seen.add(path)
        own.append({"name": name, "path": path, "sha256": checksum})
    return own


def _flatten(value: Any, prefix: str, out: dict[str, Any], depth: int = 0) -> None:
    if isinstance(value, dict) and value and depth < MAX_FLATTEN_DEPTH:
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out, depth + 1)
    else:
        out[prefix] = value


def differences(live: Any, wanted: dict[str, Any]) -> list[str]:
    """Human-readable differences between the node's document and the inventory's ask.

    At most ``MAX_DIFFERENCES`` lines; a document that is not an object is one line.
    """
    if live is None:
        return ["serving.json: missing on the node (never rolled out, or removed)"]
    if not isinstance(live, dict):
        return [f"serving.json: node has {_kind(live)}, inventory asks an object"]
    have: dict[str, Any] = {}
    want: dict[str, Any] = {}
    _flatten(live, "", have)
    _flatten(wanted, "", want)
    lines = []
    for key in sorted(have.keys() | want.keys()):
        if have.get(key, "<absent>") != want.get(key, "<absent>"):
            lines.append(
                f"{_printable(key)}: node has {_brief(have.get(key, '<absent>'))}, "
                f"inventory asks {_brief(want.get(key, '<absent>'))}"
            )
    if len(lines) > MAX_DIFFERENCES:
        more = len(lines) - MAX_DIFFERENCES
        lines = [*lines[:MAX_DIFFERENCES], f"... and {more} more differences"]
    return lines


def _printable(key: str, limit: int = 200) -> str:
    """A flattened key from the node's document, safe to print on one line."""
    return key[:limit] if key.isprintable() else repr(key[:limit])


def _brief(value: Any, limit: int = 300) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unit_file_problems(document: dict[str, Any], read: Callable[[str], str | None]) -> list[str]:
    """Compare unit files on disk with the checksums and hash a document records.

    ``document`` is the trusted view from :func:`check_document` (or a document
    this collection wrote); ``read(path)`` returns the file's text or None when it
    does not exist and may raise ``ValueError``/``OSError`` (reported, not raised).
    """
    found = []
    expected_hash = document.get("recipe_hash")
    for unit in document.get("units", []):
        try:
            text = read(unit["path"])
        except (OSError, ValueError) as exc:
            found.append(str(exc))
            continue
        if text is None:
            found.append(f"{unit['path']}: missing")
            continue
        if unit.get("sha256") and sha256_text(text) != unit["sha256"]:
            found.append(f"{unit['path']}: edited on the node (sha256 differs from serving.json)")
        carried = unit_hash(text)
        if carried != expected_hash:
            found.append(
                f"{unit['path']}: carries recipe hash {str(carried)[:80]}, serving.json records "
                f"{expected_hash}"
            )
    return found
