# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's incident log: one JSON object per line, bounded and rotated.

``/var/lib/localinference/incidents.jsonl`` on the head (roles/watchdog/README.md has the
schema). The watchdog appends; the doctor and the tests read the last few. A line that is not
an incident (a torn write, an edit by hand) is reported by :func:`read_recent`, never raised.

No AnsibleModule here: the watchdog program embeds this file unchanged.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

SCHEMA = 1
VERDICTS = ("healthy", "degraded", "wedged", "down", "unknown")
ACTIONS = ("none", "restart", "restart-ingress", "page", "hold")
OUTCOMES = ("detected", "recovered", "failed", "paged", "budget-spent", "cleared")
# A line longer than this is not an incident the watchdog wrote.
MAX_LINE = 16384
# How much of the file's end read_recent reads.
TAIL_BYTES = 1024 * 1024


def incident(
    verdict: str,
    evidence: str,
    action: str,
    outcome: str,
    *,
    now: float,
    previous: str = "healthy",
    findings: list[dict[str, Any]] | None = None,
    detect_seconds: float | None = None,
    recover_seconds: float | None = None,
) -> dict[str, Any]:
    """One incident record; raises ValueError on a value outside the schema."""
    record = {
        "schema": SCHEMA,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "epoch": round(now, 3),
        "verdict": verdict,
        "previous": previous,
        "evidence": evidence,
        "findings": findings or [],
        "action": action,
        "detect_seconds": _seconds(detect_seconds),
        "recover_seconds": _seconds(recover_seconds),
        "outcome": outcome,
    }
    problem = check(record)
    if problem:
        raise ValueError(problem)
    return record


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(validate.number("seconds", value), 1)


def check(record: Any) -> str | None:
    """Why ``record`` is not an incident of this schema, or None."""
    if not isinstance(record, dict):
        return f"not a JSON object ({type(record).__name__})"
    if record.get("schema") != SCHEMA:
        return f"schema {record.get('schema')!r}, expected {SCHEMA}"
    for key, allowed in (("verdict", VERDICTS), ("previous", VERDICTS), ("action", ACTIONS),
                         ("outcome", OUTCOMES)):
        if record.get(key) not in allowed:
            return f"{key} {str(record.get(key))[:40]!r} is not one of {', '.join(allowed)}"
    for key in ("time", "evidence"):
        if not isinstance(record.get(key), str):
            return f"{key} is not a string"
    if not isinstance(record.get("findings"), list):
        return "findings is not a list"
    for key in ("epoch", "detect_seconds", "recover_seconds"):
        value = record.get(key)
        if key == "epoch" and value is None:
            return "epoch is missing"
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0
        ):
            return f"{key} {str(value)[:40]!r} is not a number of seconds"
    return None


def append(path: str, record: dict[str, Any], max_bytes: int, keep: int) -> None:
    """Append ``record``; first rotate when the file would pass ``max_bytes``.

    ``path.1`` is the newest rotated file, ``path.<keep>`` the oldest kept; older ones go.
    The file is 0640 (evidence can name hosts and units, never a key).
    """
    line = json.dumps(record, sort_keys=True, ensure_ascii=True) + "\n"
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        size = 0
    if size and size + len(line) > max_bytes:
        rotate(path, keep)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    with os.fdopen(fd, "a", encoding="ascii") as handle:
        handle.write(line)


def rotate(path: str, keep: int) -> None:
    """``path`` -> ``path.1`` -> ... -> ``path.<keep>``; with ``keep`` 0 the file is dropped."""
    if keep <= 0:
        os.unlink(path)
        return
    for index in range(keep, 0, -1):
        older = f"{path}.{index}"
        newer = path if index == 1 else f"{path}.{index - 1}"
        if os.path.exists(newer):
            os.replace(newer, older)


def parse_lines(data: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    """Incidents and problems (one sentence per bad line) from a tail of the file."""
    records, problems = [], []
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE:
            problems.append(f"line {number}: {len(raw)} bytes, longer than an incident")
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            problems.append(f"line {number}: not JSON ({str(exc)[:80]})")
            continue
        problem = check(record)
        if problem:
            problems.append(f"line {number}: {problem}")
        else:
            records.append(record)
    return records, problems


def read_recent(path: str, limit: int = 5) -> dict[str, Any]:
    """The last ``limit`` incidents of ``path``: ``{incidents, problems, exists}``."""
    try:
        data, size = _files.read_tail(path, TAIL_BYTES)  # a FIFO is refused: it would block
    except FileNotFoundError:
        return {"incidents": [], "problems": [], "exists": False}
    except _files.FileError as exc:
        return {"incidents": [], "problems": [str(exc)], "exists": True}
    except OSError as exc:
        return {"incidents": [], "problems": [f"{path}: {exc.strerror or exc}"], "exists": True}
    if size > TAIL_BYTES:
        # The first line of a tail read may be cut: drop it.
        data = data.partition(b"\n")[2]
    records, problems = parse_lines(data)
    return {"incidents": records[-limit:] if limit > 0 else [], "problems": problems, "exists": True}
