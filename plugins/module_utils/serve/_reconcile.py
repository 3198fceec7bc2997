# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``serving_state`` writes, backs up, removes, stops and reloads: one pure decision.

The module reads the node first (:class:`Observed`: the text of every file it may write,
the kind of every file it may remove, the names in the staging unit directory), calls
:func:`decide`, then applies the :class:`Plan` in order. Nothing here touches the node,
so every branch of a rollout step is a row of a case table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    OWN_UNIT_NAMES,
    dump,
)

# Kinds of a file the plan may remove (os.lstat, links never followed); any other value
# is the reason the file could not be inspected.
ABSENT, REMOVABLE, DIRECTORY, SPECIAL = "absent", "file", "directory", "special"


@dataclass(frozen=True)
class Observed:
    """What the module read on the node before deciding."""

    # Current text of the files the plan may write; missing or None: absent or unreadable.
    texts: Mapping[str, str | None] = field(default_factory=dict)
    # Of the state document (``path``) and the files the plan may write, those that are directories.
    directories: frozenset[str] = frozenset()
    # Kind of each file the plan may remove (ABSENT, REMOVABLE, DIRECTORY, SPECIAL or a reason).
    kinds: Mapping[str, str] = field(default_factory=dict)
    # Names in the staging unit directory (state=staged).
    staged_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """Write ``text`` to ``path`` (``action="write"``) or remove ``path`` (``"remove"``)."""

    action: str
    path: str
    text: str = ""
    option: str = ""
    unit: bool = False  # a live unit file: a change asks for systemctl daemon-reload


@dataclass(frozen=True)
class Plan:
    refusal: str | None = None  # fail with this before anything changes
    stop: tuple[str, ...] | None = None  # the live services to stop first (None: no stop)
    steps: tuple[Step, ...] = ()
    refused: tuple[str, ...] = ()  # files left in place, one line each
    reload: bool = False  # systemctl daemon-reload once a unit step changed something
    checks: str = ""  # "staged": after the steps, on the staged units; "live": on the live ones


def previous_path(state_path: str) -> str:
    """Where the rollback target (the document before the last change) is kept."""
    return os.path.join(os.path.dirname(state_path), "serving.previous.json")


def staged_unit_root(staging_dir: str) -> str:
    return os.path.join(staging_dir, "units")


def _write(observed: Observed, path: str, text: str, option: str, unit: bool = False) -> list[Step]:
    """A write step when the file's text differs (a directory there is refused on writing)."""
    if observed.texts.get(path) == text:
        return []
    return [Step("write", path, text, option, unit)]


def _remove(observed: Observed, path: str, unit: bool = False) -> tuple[list[Step], list[str]]:
    """A removal step for a regular file or link; anything else is left, with the reason."""
    kind = observed.kinds.get(path, ABSENT)
    if kind == ABSENT:
        return [], []
    if kind == REMOVABLE:
        return [Step("remove", path, unit=unit)], []
    if kind in (DIRECTORY, SPECIAL):
        what = "a directory" if kind == DIRECTORY else "not a regular file"
        return [], [f"{path}: is {what}, not a unit file the collection wrote; left in place"]
    return [], [f"{path}: cannot be inspected ({kind}); left in place"]


def _staged(document, units, staging_dir, observed):
    steps = _write(
        observed, os.path.join(staging_dir, "serving.json"), dump(document), "staging_dir"
    )
    unit_root = staged_unit_root(staging_dir)
    for unit in units:
        steps += _write(
            observed, os.path.join(unit_root, unit["name"]), unit["content"], "staging_dir"
        )
    names = {unit["name"] for unit in units}
    refused: list[str] = []
    for name in sorted(observed.staged_names):
        if name in names:
            continue
        if name not in OWN_UNIT_NAMES:
            refused.append(
                f"{os.path.join(unit_root, name)}: not a unit this collection writes; "
                "left in place (the Quadlet check reads it too)"
            )
            continue
        removal, problems = _remove(observed, os.path.join(unit_root, name))
        steps += removal
        refused += problems
    return steps, refused


def _present(document, units, live, trusted, state_path, observed):
    steps: list[Step] = []
    refused: list[str] = []
    if trusted["valid"] and trusted["recipe_hash"] != document["recipe_hash"]:
        steps += _write(observed, previous_path(state_path), dump(live), "path")
    wanted = {unit["path"] for unit in units}
    for unit in trusted["units"]:
        if unit["path"] not in wanted:
            removal, problems = _remove(observed, unit["path"], unit=True)
            steps += removal
            refused += problems
    for unit in units:
        steps += _write(observed, unit["path"], unit["content"], "unit_dir", unit=True)
    steps += _write(observed, state_path, dump(document), "path")
    return steps, refused


def _directory_refusal(path: str, option: str) -> str:
    return f"{option}: {path} is a directory where a file belongs; remove it or choose another {option}"


def _written_directory(steps: Sequence[Step], observed: Observed) -> str | None:
    """The refusal when a step would write over a directory (checked before anything changes)."""
    for step in steps:
        if step.action == "write" and step.path in observed.directories:
            return _directory_refusal(step.path, step.option)
    return None


def decide(
    state: str,
    wanted: Mapping[str, Any],
    live: Any,
    trusted: Mapping[str, Any],
    live_diff: Sequence[str],
    observed: Observed,
    options: Mapping[str, Any],
) -> Plan:
    """The steps that bring the node to ``wanted`` (``{"document", "units"}``) for ``state``.

    ``live``/``trusted``/``live_diff`` are the node's document, its schema-checked view
    (:func:`_state.check_document`) and its differences from the ask. ``options`` holds
    ``path``, ``staging_dir``, ``problems`` (the recipe's, with ``blocking``), ``stop_live``,
    ``daemon_reload``, ``checks`` (whether checks were asked) and ``check_mode``.
    """
    document, units = wanted["document"], wanted["units"]
    if options["path"] in observed.directories:
        # In every state: a directory there is no document to read, stage beside or replace.
        return Plan(refusal=_directory_refusal(options["path"], "path"))
    blocking = [p for p in options["problems"] if p["blocking"]]
    if blocking and state != "absent":
        return Plan(refusal="; ".join(
            f"{p['id']}: {p['message']}" + (f"; {p['fix']}" if p.get("fix") else "") for p in blocking
        ))
    if state == "staged":
        steps, refused = _staged(document, units, options["staging_dir"], observed)
        refusal = _written_directory(steps, observed)
        if refusal:
            return Plan(refusal=refusal)
        return Plan(
            steps=tuple(steps), refused=tuple(refused), checks="staged" if options["checks"] else ""
        )
    if state == "present":
        steps, refused = _present(document, units, live, trusted, options["path"], observed)
        refusal = _written_directory(steps, observed)
        if refusal:
            return Plan(refusal=refusal)
        reload = (
            options["daemon_reload"] and not options["check_mode"] and any(s.unit for s in steps)
        )
        stop = tuple(trusted["start_order"]) if options["stop_live"] else None
        return Plan(stop=stop, steps=tuple(steps), refused=tuple(refused), reload=reload)
    if state == "absent":
        steps, refused = [], []
        for unit in trusted["units"]:
            removal, problems = _remove(observed, unit["path"], unit=True)
            steps += removal
            refused += problems
        return Plan(steps=tuple(steps), refused=tuple(refused))
    if live_diff:
        return Plan(
            refusal="the reconciled state on this node differs from the inventory (F10); "
            "run the rollout (rm -> update -> verify -> start) instead of starting it: "
            + "; ".join(live_diff)
        )
    return Plan(checks="live" if options["checks"] and not options["check_mode"] else "")
