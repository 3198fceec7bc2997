# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small TOML writer for client configs (Codex's ``config.toml``).

Python reads TOML (``tomllib``) but does not write it. This writes the subset
a client config uses: strings, integers, floats, booleans, lists of those and
nested tables. Root keys come before tables, as TOML requires. Anything else
is refused by name rather than written wrong.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class TomlWriteError(validate.InputError):
    """A value TOML cannot hold as this writer writes it."""


def _key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise TomlWriteError(f"TOML keys must be non-empty strings, got {key!r}")
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TomlWriteError(f"{where} is {value!r}: TOML has no NaN or infinity here")
        return repr(value)
    if isinstance(value, str):
        # JSON's escapes (\" \\ \n \t \uXXXX) are TOML basic-string escapes too.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(item, f"{where}[]") for item in value) + "]"
    raise TomlWriteError(
        f"{where} is a {type(value).__name__}, which this TOML writer does not write"
    )


def dumps(doc: dict[str, Any]) -> str:
    """``doc`` as TOML text (tables after the keys of their parent)."""
    lines: list[str] = []
    _table(doc, [], lines)
    return "\n".join(lines).strip("\n") + "\n"


def _table(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, dict)]
    if path and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    for key, value in scalars:
        if value is None:
            continue
        lines.append(f"{_key(key)} = {_value(value, '.'.join([*path, key]))}")
    for key, value in tables:
        _table(value, [*path, key], lines)
