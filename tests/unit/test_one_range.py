# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A range is declared once (issue 39, item 2): argument specs carry types and, in words, the
range of the one check that enforces it; this test holds the words to that check.

Ansible's ``meta/argument_specs.yml`` checks types and choices, never a range, so every range
has one enforcing home: the module_utils code that reads the option (the watchdog's
``NUMBERS`` table, the serve guards' ``parse_policy``, the monitoring and ingress specs), or,
for a variable that no module_utils function reads with bounds, the role's own table of inputs
(``{'name': ..., 'minimum': ..., 'maximum': ...} | input_findings``, checked by
``_validate.table_errors``).  Two rules:

- no role variable is bounded both in a role's table and in module_utils (one home);
- a range an argument spec's description states (``MTU of the cluster link (1280-9216)``) is
  the range its home enforces: each end is accepted, one step beyond each end is refused.
  The test probes the home with values; it holds no range of its own.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.ingress import _caddy
from ansible_collections.localinference.vllm.plugins.module_utils.monitoring._rules import (
    rules_spec,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    ROLE_VARIABLES,
    parse_policy,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog import (
    _config as _watchdog_config,
)
from ansible_collections.localinference.vllm.tests.unit.plugins.module_utils.ingress.test_caddy import (
    spec as ingress_spec,
)

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
UTILS = ROOT / "plugins" / "module_utils"

# A role table's row: {'name': 'x', 'value': ..., 'kind': 'integer', 'minimum': 1, ...}
_ROW = re.compile(r"\{'name': '(?P<name>\w+)',(?P<body>[^{}]*)\}")
_KEY = re.compile(r"'(?P<key>kind|minimum|maximum|above|optional)': (?P<value>'\w+'|[\w.\-]+)")
# "(1280-9216)", "(0 to 65536)", "(-999 to 1000; ...)", "1 to 60 seconds"
_SPOKEN = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?) ?(?:-|to) ?(-?\d+(?:\.\d+)?)(?![\w.])")


# --- the homes -----------------------------------------------------------------------------------


def _role_vars(role: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in ("defaults", "vars"):
        path = role / name / "main.yml"
        if path.is_file():
            found |= yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return found


def role_table_rows() -> dict[str, dict[str, Any]]:
    """Every row of the roles' input tables with a bound: {variable: {kind, minimum, ...}}."""
    rows = {}
    for tasks in sorted(ROLES.glob("*/tasks/*.yml")):
        names = _role_vars(tasks.parents[1])
        for row in _ROW.finditer(tasks.read_text(encoding="utf-8")):
            fields = {}
            for key in _KEY.finditer(row["body"]):
                text = key["value"]
                value: Any = text.strip("'") if text.startswith("'") else names.get(text, text)
                fields[key["key"]] = yaml.safe_load(str(value)) if not isinstance(value, str) or key["key"] != "kind" else value
            if set(fields) & {"minimum", "maximum", "above"}:
                rows[row["name"]] = fields
    return rows


def module_utils_bounded_names() -> set[str]:
    """Literal variable names module_utils reads with bounds (``validate.integer("x", ..., minimum=1)``)."""
    found = set()
    for path in UTILS.rglob("*.py"):
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("number", "integer", "whole")
                and call.args
                and isinstance(call.args[0], ast.Constant)
                and isinstance(call.args[0].value, str)
                and {k.arg for k in call.keywords} & {"minimum", "maximum", "above"}
            ):
                found.add(call.args[0].value)
    return found | {f"watchdog_{key}" for key, *_ in _watchdog_config.NUMBERS}


def _from_table(row: dict[str, Any], name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        errors = validate.table_errors([{"name": name, "value": value, **row}])
        if errors:
            raise errors[0]

    return check


def _watchdog(key: str, low: float, high: float, integer: bool) -> Callable[[Any], None]:
    return lambda value: _watchdog_config._number({key: value}, key, low, high, integer)


# How to reach the module_utils home of a variable with one value (the range is the home's).
MODULE_UTILS_HOMES: dict[str, Callable[[Any], Any]] = {
    **{variable: (lambda v, k=key: parse_policy({k: v})) for key, variable in ROLE_VARIABLES.items()},
    **{f"watchdog_{row[0]}": _watchdog(*row) for row in _watchdog_config.NUMBERS},
    **{
        f"monitoring_{key}": (lambda v, k=key: rules_spec({k: v}))
        for key in ("ttft_p95_threshold_s", "kv_cache_usage_threshold", "memory_pressure_threshold")
    },
    "ingress_retry_after": lambda v: _caddy.config(ingress_spec(retry_after=v)),
}


# --- the words -----------------------------------------------------------------------------------


# Stated in words but enforced by no check, with the reason it is left so.
STATED_ONLY = {
    "tune_slot": "set by playbooks/tune.yml to the slot it runs (1 to 4), never by a user",
}


def spoken_ranges(include_stated_only: bool = False) -> list[tuple[str, str, float, float]]:
    """(role, variable, low, high) of each int/float option whose description states a range.

    An option shared by several entry points (a YAML anchor) counts once.
    """
    found: list[tuple[str, str, float, float]] = []
    for spec in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        document = yaml.safe_load(spec.read_text(encoding="utf-8"))
        for entry in (document.get("argument_specs") or {}).values():
            for name, option in (entry.get("options") or {}).items():
                if option.get("type") not in ("int", "float"):
                    continue
                text = option.get("description") or ""
                text = " ".join(text) if isinstance(text, list) else text
                match = _SPOKEN.search(text)
                row = (spec.parts[-3], name, float(match[1]), float(match[2])) if match else None
                if row and row not in found and (include_stated_only or name not in STATED_ONLY):
                    found.append(row)
    return found


def _refused(check: Callable[[Any], Any], value: Any) -> bool:
    try:
        check(value)
    except ValueError:  # validate's errors and the stages' are InputErrors (ValueError)
        return True
    return False


# --- the rules -----------------------------------------------------------------------------------


def test_a_range_has_one_home() -> None:
    both = sorted(set(role_table_rows()) & module_utils_bounded_names())
    assert both == [], f"bounded both in a role's table and in module_utils (keep the module_utils one): {both}"


def test_the_spoken_ranges_are_found() -> None:
    # the parse itself: the documented ranges of the tree today, at least these
    spoken = {name: (low, high) for _, name, low, high in spoken_ranges()}
    assert spoken["cluster_network_mtu"] == (1280, 9216)
    assert spoken["watchdog_interval_s"] == (1, 3600)
    assert spoken["serve_oom_score_adjust"] == (-999, 1000)
    assert len(spoken) >= 9
    assert set(STATED_ONLY) <= {n for _, n, _, _ in spoken_ranges(include_stated_only=True)}


@pytest.mark.parametrize(("role", "name", "low", "high"), spoken_ranges(), ids=lambda x: str(x))
def test_an_argument_spec_states_the_range_its_home_enforces(role, name, low, high) -> None:
    rows = role_table_rows()
    homes = [MODULE_UTILS_HOMES[name]] if name in MODULE_UTILS_HOMES else []
    homes += [_from_table(rows[name], name)] if name in rows else []
    assert len(homes) == 1, f"{role}: {name} states {low:g}-{high:g} but has {len(homes)} homes"
    check = homes[0]
    integer = float(low).is_integer() and float(high).is_integer() and not _refused(check, int(high))
    step = 1 if integer else 1e-6 * max(1.0, abs(high), abs(low))
    kind = int if integer else float
    assert not _refused(check, kind(high)), f"{name}: {high:g} is refused but documented"
    assert _refused(check, kind(high + step)), f"{name}: above {high:g} is accepted"
    assert _refused(check, kind(low - step)), f"{name}: below {low:g} is accepted"
    # the low end itself, or just above it for an exclusive bound (a fraction in (0, 1])
    assert not (_refused(check, kind(low)) and _refused(check, kind(low + step))), f"{name}: {low:g} is refused"
