# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One survey, and one reclaim, of vLLM's KV-offload files in /dev/shm (F13): the core behind both front doors.

The ``shm_offload`` module and the node program ``shm-offload`` (``_shm_offload_cli``, which a
serving unit runs before start and after stop) check the same inputs in the same order, gather
the same evidence (``_shm_offload.survey``: two inspections, every process's maps and
descriptors, the running containers) and delete only through ``_shm_offload.reclaim``. Each
front door only words the outcome its own way: :func:`module_result` is the module's result
(check mode, diff), the program prints one line and exits with a code.

A front door names its options its own way in a refusal (:class:`Names`). Standard library
only: this file is embedded into the node program (``common/_embed.py``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import Runner
from ansible_collections.localinference.vllm.plugins.module_utils.serve._shm_offload import (
    CATALOG,
    Entry,
    ShmOffloadError,
    Verdict,
    check_directory,
    check_pattern,
    owner_uid,
    reclaim,
    survey,
)

# Seconds between the two inspections, and per scan or Podman command.
SETTLE_RANGE = (0, 60)
TIMEOUT_RANGE = (1, 600)


@dataclass(frozen=True)
class Names:
    """How a front door names its options in a refusal (``settle`` or ``--settle``)."""

    directory: str
    proc_root: str
    settle: str
    timeout: str
    podman: str
    podman_fix: str  # what to do about a Podman binary that is not one


MODULE = Names("directory", "proc_root", "settle", "timeout", "podman",
               "give the Podman binary or leave the option out")
PROGRAM = Names("--directory", "--proc-root", "--settle", "--timeout", "--podman",
                "give the Podman binary")


class Refused(ShmOffloadError):
    """The module refuses to reclaim; ``result`` is what it found (returned with the failure)."""

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class Survey:
    """The checked inputs and the verdict of the two inspections."""

    directory: str
    pattern: str
    proc_root: str
    podman: str | None
    verdict: Verdict

    @property
    def candidates(self) -> list[dict[str, Any]]:
        """Every file that would be an orphan, proven or not."""
        return [e.public() for e in self.verdict.orphans]

    def report(self) -> dict[str, Any]:
        """What both front doors return: the evidence, nothing reclaimed yet."""
        proven = self.verdict.proven
        return {
            "proven": proven,
            "live": self.verdict.live,
            "orphans": self.candidates if proven else [],
            "unproven": [] if proven else self.candidates,
            "skipped": self.verdict.skipped,
            "reclaimed": [],
            "bytes_freed": 0,
            "refusals": self.verdict.refusals,
        }


def _bounded(name: str, value: float, low: float, high: float) -> float:
    if not low <= value <= high:  # also refuses NaN
        raise ShmOffloadError(f"{name}: {value!r} is outside {low:g} to {high:g} seconds")
    return value


def _podman(value: str | None, names: Names) -> str | None:
    """The Podman binary to ask, or None when none is installed (the check is then skipped)."""
    if value is None:
        return shutil.which("podman")
    found = shutil.which(value) if "/" not in value else value
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise ShmOffloadError(f"{names.podman}: {value!r} is not an executable; {names.podman_fix}")
    return found


def survey_offload(options: dict[str, Any], names: Names) -> Survey:
    """Check ``options`` (directory, proc_root, pattern, owner, settle, timeout, podman), then survey.

    Raises ShmOffloadError naming the option as ``names`` spells it.
    """
    directory = check_directory(names.directory, options["directory"])
    proc_root = check_directory(names.proc_root, options["proc_root"])
    pattern = check_pattern(options["pattern"])
    uid = owner_uid(options["owner"])
    settle = _bounded(names.settle, options["settle"], *SETTLE_RANGE)
    timeout = _bounded(names.timeout, options["timeout"], *TIMEOUT_RANGE)
    podman = _podman(options["podman"], names)
    verdict = survey(
        directory,
        pattern,
        uid,
        options["owner"],
        proc_root=proc_root,
        settle=settle,
        timeout=timeout,
        podman=podman,
        runner=Runner(timeout=timeout) if podman else None,
    )
    return Survey(directory, pattern, proc_root, podman, verdict)


def reclaimed(done: list[Entry]) -> dict[str, Any]:
    """The result's keys for the files ``done`` (deleted, or that would be in check mode)."""
    return {
        "changed": bool(done),
        "reclaimed": [e.public() for e in done],
        "bytes_freed": sum(e.allocated for e in done),
    }


def module_result(
    params: dict[str, Any], check_mode: bool, diff: bool, warn: Callable[[str], None]
) -> dict[str, Any]:
    """The ``shm_offload`` module's result; raises :class:`Refused` or ShmOffloadError to fail."""
    reclaiming = params["state"] == "reclaimed"
    if reclaiming and not params["confirm"]:
        raise ShmOffloadError(
            "state=reclaimed deletes files: set confirm: true to proceed (state=status only reports)"
        )
    found = survey_offload(params, MODULE)
    verdict, directory, pattern = found.verdict, found.directory, found.pattern
    out: dict[str, Any] = {
        "changed": False,
        **found.report(),
        "containers": verdict.containers,
        "sources": {
            "proc": found.proc_root,
            "processes": verdict.processes,
            "podman": found.podman or "not installed (container check skipped)",
            "running_containers": verdict.running_containers,
        },
    }
    if not reclaiming:
        return out
    if not verdict.proven:
        raise Refused(
            f"nothing reclaimed in {directory}: cannot prove the offload files unused ("
            + "; ".join(verdict.refusals)
            + f"); see {CATALOG}",
            out,
        )
    before = sorted(e.path for e in verdict.orphans)
    if check_mode:
        done = verdict.orphans
    else:
        done, problems, notes = reclaim(directory, verdict.orphans)
        for note in notes:
            warn(note)
        if problems:
            out.update(reclaimed(done))
            raise Refused("; ".join(problems), out)
    out.update(reclaimed(done))
    if diff:
        gone = {e.path for e in done}
        out["diff"] = {
            "before": "\n".join(before) + ("\n" if before else ""),
            "after": "".join(f"{p}\n" for p in before if p not in gone),
            "before_header": f"{directory}/{pattern}",
            "after_header": f"{directory}/{pattern}",
        }
    return out
