# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The saved result of a stage: the contract between stages.

Every stage publishes one JSON document on the node it concerns
(``/etc/localinference/<stage>.json``)::

    {"schema": 1, "stage": "fabric", "inputs_hash": "<sha256>", "result": {...}}

``inputs_hash`` is the sha256 of the canonical JSON of what the stage was
computed from, so a later stage (or a later run with ``--tags``) can tell a
current result from a stale one without re-running the stage. The document is
read back with :func:`check_document`: anything a node hands back is
schema-checked, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

SCHEMA = 1
STAGES = ("preflight", "fabric", "plan", "weights", "ingress", "client", "qualify")
_HASH = re.compile(r"^[0-9a-f]{64}$")


class StageResultError(Exception):
    """A saved result that cannot be trusted (message says what and how to fix it)."""


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, no NaN: the same inputs give the same bytes everywhere."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)


def inputs_hash(inputs: Any) -> str:
    try:
        return hashlib.sha256(canonical_json(inputs).encode("utf-8")).hexdigest()
    except ValueError as exc:  # NaN or infinity
        raise StageResultError(f"inputs cannot be hashed: {exc}") from None


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise StageResultError(f"{where} is {value}, not a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_finite(item, f"{where}[{index}]")


def document(stage: str, inputs: Any, result: dict[str, Any]) -> dict[str, Any]:
    if stage not in STAGES:
        raise StageResultError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    if not isinstance(result, dict):
        raise StageResultError(f"result must be a mapping, got {type(result).__name__}")
    _check_finite(result, "result")
    return {"schema": SCHEMA, "stage": stage, "inputs_hash": inputs_hash(inputs), "result": result}


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, indent=2, allow_nan=False) + "\n"


def check_document(text: str | bytes, stage: str, where: str) -> dict[str, Any]:
    """Parse and schema-check a saved document; raise StageResultError naming ``where``."""
    fix = f"re-run the {stage} stage (--tags {stage}) to write it again"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise StageResultError(f"{where} is not UTF-8 text; {fix}") from None
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise StageResultError(f"{where} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(doc, dict):
        raise StageResultError(f"{where} holds a {type(doc).__name__}, not a saved result; {fix}")
    problems = []
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA}")
    if doc.get("stage") != stage:
        problems.append(f"stage is {doc.get('stage')!r}, expected {stage!r}")
    if not isinstance(doc.get("inputs_hash"), str) or not _HASH.match(doc["inputs_hash"]):
        problems.append("inputs_hash is not a sha256 hex digest")
    if not isinstance(doc.get("result"), dict):
        problems.append("result is not a mapping")
    if problems:
        raise StageResultError(f"{where} cannot be trusted: {'; '.join(problems)}; {fix}")
    return doc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")
