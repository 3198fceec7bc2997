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

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

SCHEMA = 1
STAGES = ("preflight", "fabric", "plan", "weights", "ingress", "client", "qualify", "site")
_HASH = re.compile(r"^[0-9a-f]{64}$")


class StageResultError(validate.Error):
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


def document(stage: str, inputs: Any, result: dict[str, Any], live: dict[str, Any] | None = None) -> dict[str, Any]:
    if stage not in STAGES:
        raise StageResultError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    if not isinstance(result, dict):
        raise StageResultError(f"result must be a mapping, got {type(result).__name__}")
    _check_finite(result, "result")
    doc = {"schema": SCHEMA, "stage": stage, "inputs_hash": inputs_hash(inputs), "result": result}
    if live is not None:
        doc["live"] = live
    return doc


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
    if "live" in doc:
        check_live(doc["live"], where)
    return doc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


# --- converged: a saved result that still holds on the node ------------------
# A stage may record, when it saves its result, the sha256 of the files it
# wrote or read on the node and the enablement of the units it runs
# (``watch_files``, ``watch_units``).  A later run is *converged* for that stage
# when the saved inputs hash equals this run's and every watched file and unit
# is as recorded (units also active): the stage then has nothing to do.


def live_record(
    files: dict[str, str | None],
    units: dict[str, dict[str, str]],
    fingerprint: str | None = None,
    commands: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The ``live`` part of a saved document: file digests (None: absent) and unit enablement.

    ``fingerprint`` is for a stage whose ``inputs_hash`` covers what its result was
    measured from (the client's opencode version, read by running it): the run's
    cheap fingerprint is then recorded beside it and compared instead.
    ``commands`` maps a read-only command (its argv joined by spaces) to the
    sha256 of its exit status and output (NetworkManager's view of a profile).
    """
    live: dict[str, Any] = {
        "files": dict(sorted(files.items())),
        "units": {name: units[name].get("UnitFileState", "") for name in sorted(units)},
    }
    if fingerprint is not None:
        live["fingerprint"] = fingerprint
    if commands:
        live["commands"] = dict(sorted(commands.items()))
    return live


def check_live(live: Any, where: str) -> dict[str, Any]:
    """Schema-check a saved ``live`` record (anything read back from a node is checked)."""
    fix = "re-run the stage to write it again"
    if not isinstance(live, dict) or not {"files", "units"} <= set(live) <= {"files", "units", "fingerprint", "commands"}:
        raise StageResultError(f"{where}: live is not a mapping of files and units; {fix}")
    commands = live.get("commands", {})
    if not isinstance(commands, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and _HASH.match(v) for k, v in commands.items()
    ):
        raise StageResultError(f"{where}: live.commands is not a mapping of commands to sha256 digests; {fix}")
    if "fingerprint" in live and not (isinstance(live["fingerprint"], str) and _HASH.match(live["fingerprint"])):
        raise StageResultError(f"{where}: live.fingerprint is not a sha256 hex digest; {fix}")
    files, units = live["files"], live["units"]
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and (v is None or (isinstance(v, str) and _HASH.match(v))) for k, v in files.items()
    ):
        raise StageResultError(f"{where}: live.files is not a mapping of paths to sha256 digests; {fix}")
    if not isinstance(units, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in units.items()):
        raise StageResultError(f"{where}: live.units is not a mapping of units to their enablement; {fix}")
    return live


def judge_converged(
    doc: dict[str, Any] | None,
    want_hash: str | None,
    files: dict[str, str | None],
    units: dict[str, dict[str, str]],
    secrets_differ: list[str] | tuple[str, ...] = (),
    fingerprint: str | None = None,
    commands: dict[str, str] | None = None,
) -> str | None:
    """Why the stage must run (one sentence), or None when its saved result still holds.

    ``want_hash`` (this run's inputs hash) and ``fingerprint`` are compared when
    given. ``secrets_differ`` names the files that do not hold this run's secret
    (compared on the node, never recorded).
    """
    if doc is None:
        return "no saved result"
    if want_hash is not None and doc["inputs_hash"] != want_hash:
        return "its inputs changed (variables, the collection's code or what it reads)"
    live = doc.get("live")
    if live is None:
        return "the saved result records no live state"
    if fingerprint is not None and live.get("fingerprint") != fingerprint:
        return "its inputs changed (variables, the collection's code or the files it reads)"
    commands = commands or {}
    saved_commands = live.get("commands", {})
    if set(live["files"]) != set(files) or set(live["units"]) != set(units) or set(saved_commands) != set(commands):
        return "it watches other files, units or commands than the saved result records"
    for path in sorted(files):
        if files[path] != live["files"][path]:
            state = "is missing" if files[path] is None else "changed"
            return f"{path} {state} since the stage last ran"
    for command in sorted(commands):
        if commands[command] != saved_commands[command]:
            return f"{command} answers otherwise than when the stage last ran"
    for name in sorted(units):
        fields = units[name]
        if fields.get("ActiveState") != "active":
            return f"{name} is {fields.get('ActiveState') or 'unknown'}, not active"
        if fields.get("UnitFileState", "") != live["units"][name]:
            return f"{name} is {fields.get('UnitFileState') or 'not installed'} (was {live['units'][name]})"
    if secrets_differ:
        return f"{secrets_differ[0]} does not hold this run's secret"
    return None


# --- watch_recorded: the saved result names what it watches -------------------
# The site's record (playbooks/site.yml) holds the union of what every stage
# left on a node; the next run, which has not run the stages, takes the lists
# from the record itself and checks them all in one call.


def recorded_watch(result: dict[str, Any], where: str) -> dict[str, list[Any]]:
    """The ``watch`` lists a saved result recorded (files, units, commands as argv lists), schema-checked."""
    fix = "re-run the whole site.yml to write it again"
    watch = result.get("watch")
    if not isinstance(watch, dict) or set(watch) != {"files", "units", "commands"}:
        raise StageResultError(f"{where}: result.watch is not a mapping of files, units and commands; {fix}")
    files, units, commands = watch["files"], watch["units"], watch["commands"]
    if not isinstance(files, list) or not all(isinstance(f, str) and f.startswith("/") and "\n" not in f for f in files):
        raise StageResultError(f"{where}: result.watch.files is not a list of absolute paths; {fix}")
    if not isinstance(units, list) or not all(isinstance(u, str) for u in units):
        raise StageResultError(f"{where}: result.watch.units is not a list of unit names; {fix}")
    if not isinstance(commands, list) or not all(
        isinstance(c, list) and c and all(isinstance(a, str) and a for a in c) for c in commands
    ):
        raise StageResultError(f"{where}: result.watch.commands is not a list of commands (argv lists); {fix}")
    return {"files": files, "units": units, "commands": commands}


def merge_watch(*lists: list[Any]) -> list[Any]:
    """Concatenate watch lists, first occurrence kept (commands compare as lists)."""
    out: list[Any] = []
    for items in lists:
        for item in items:
            if item not in out:
                out.append(item)
    return out
