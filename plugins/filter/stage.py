# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for the saved stage results and findings.

- ``stage_hash``: sha256 of the canonical JSON of a value (the ``inputs_hash`` of a saved result).
- ``findings_table``: findings as one plain-text table (a list of lines).
- ``findings_errors``: the findings of severity ``error``.
- ``input_findings``: a role's table of inputs checked by ``_validate`` (``table_errors``), one
  finding per refused input naming the variable and the fix; a role asserts it is empty.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import (
    errors,
    finding,
    sentence,
    text_table,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    StageResultError,
    inputs_hash,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    table_errors,
)


def stage_hash(value: Any) -> str:
    try:
        return inputs_hash(value)
    except StageResultError as exc:
        raise AnsibleFilterError(str(exc)) from None


def findings_table(findings: list[dict[str, Any]], columns: list[str] | None = None) -> list[str]:
    columns = columns or ["host", "id", "severity", "message", "fix"]
    if not isinstance(findings, list) or not all(isinstance(f, dict) for f in findings):
        raise AnsibleFilterError("findings_table expects a list of findings (dicts)")
    return text_table(
        [c.upper() for c in columns], ([f.get(c, "") for c in columns] for f in findings)
    )


def findings_errors(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return errors(findings)


def input_findings(rows: list[dict[str, Any]], role: str = "") -> list[dict[str, Any]]:
    """One ``input`` finding per refused row of the table (its ``sentence`` in ``text``)."""
    try:
        refused = table_errors(rows)
    except TypeError as exc:
        raise AnsibleFilterError(f"input_findings{f' ({role})' if role else ''}: {exc}") from None
    found = [
        finding("input", "error", f"{exc.name}: {exc.problem}", exc.fix, variable=exc.name)
        for exc in refused
    ]
    return [f | {"text": sentence(f)} for f in found]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "stage_hash": stage_hash,
            "findings_table": findings_table,
            "findings_errors": findings_errors,
            "input_findings": input_findings,
        }
