# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One finding type for the whole collection, and a plain-text table for it.

A finding is a dict ``{id, severity, message, fix}`` plus optional context keys
(``host``, ``check``, ``interface``, ...). ``id`` is a failure-catalog id
(``F1``..``F20``) or a stage-specific check name; ``severity`` is ``error``
(stops the stage) or ``warning`` (printed, never stops).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

SEVERITIES = ("error", "warning")


def finding(
    id: str, severity: str, message: str, fix: str = "", **context: Any
) -> dict[str, Any]:
    """A finding; ``context`` keys (host, check, interface, ...) are kept as given."""
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
    return {"id": id, "severity": severity, "message": message, "fix": fix, **context}


def errors(findings: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings that stop a stage."""
    return [f for f in findings if f.get("severity") == "error"]


def sentence(f: dict[str, Any]) -> str:
    """``[F19 error] message; fix`` on one line."""
    text = f"[{f['id']} {f['severity']}] {f['message']}"
    return f"{text}; {f['fix']}" if f.get("fix") else text


def text_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Left-aligned columns as wide as their widest cell; the last column is not padded."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    last = len(widths) - 1
    return [
        "  ".join(c if i == last else c.ljust(widths[i]) for i, c in enumerate(row)).rstrip()
        for row in cells
    ]
