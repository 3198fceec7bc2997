# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node program around :mod:`_shm_offload`: ``shm-offload reclaim --confirm`` (F13).

The serve role installs it as ``/usr/local/libexec/localinference/shm-offload``
(``roles/serve/templates/shm_offload.j2`` embeds this file, ``_shm_reclaim.py``,
``_shm_offload.py``, ``_validate.py`` and ``_commands.py`` unchanged) and a recipe that offloads
KV natively runs it as ``ExecStartPre=`` and ``ExecStopPost=`` of the unit that hosts the
engine's workers. The inputs, the evidence and the deletion are ``_shm_reclaim``'s, the core the
``shm_offload`` module calls too; this file only parses the command line and words the outcome
as one line and an exit code. It deletes only what ``_shm_offload`` proves orphaned (two inspections, no live mapping or open
descriptor, no running container with the directory, the owner's regular files) and nothing
else: no container, no log.

Exit 0 when nothing is left to reclaim (no offload file, only files in use or not ours, or the
orphans deleted), with one line on stdout; 1 with one line on stderr starting with
``REFUSAL_MARKER`` when orphans exist that cannot be proven unused or cannot be deleted (fail
closed: the next start would fail with ``[Errno 14] Bad address``); 2 on a usage error.
``status`` only reports (JSON on stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.serve._shm_offload import (
    CATALOG,
    DEFAULT_PATTERN,
    ShmOffloadError,
    reclaim,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._shm_reclaim import (
    PROGRAM,
    survey_offload,
)

REFUSAL_MARKER = "localinference shm-offload refused"
DONE, REFUSED = 0, 1
GIB = 1024**3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shm-offload",
        description="Report, or reclaim fail-closed, orphaned vLLM KV-offload mmaps (F13).",
    )
    parser.add_argument("action", choices=["status", "reclaim"])
    parser.add_argument("--confirm", action="store_true", help="required by reclaim")
    parser.add_argument("--directory", default="/dev/shm")
    parser.add_argument("--pattern", default=DEFAULT_PATTERN)
    parser.add_argument("--owner", default="root", help="the user the serving units run as")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds between inspections")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per scan or command")
    parser.add_argument("--podman", default=None, help="Podman binary (default: podman on PATH)")
    parser.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    return parser


def _size(entries: Sequence[dict[str, Any]]) -> str:
    return f"{sum(e.get('allocated', 0) for e in entries) / GIB:.2f} GiB"


def run(args: argparse.Namespace) -> tuple[int, str, dict[str, Any]]:
    """(exit code, the one line, the details) of one run; raises ShmOffloadError on bad input."""
    if args.action == "reclaim" and not args.confirm:
        raise ShmOffloadError("reclaim deletes files: add --confirm (status only reports)")
    found = survey_offload(vars(args), PROGRAM)
    verdict, directory, pattern = found.verdict, found.directory, found.pattern
    candidates = found.candidates
    details = found.report()
    where = f"{directory}/{pattern}"
    kept = f"; {len(verdict.live)} in use and {len(verdict.skipped)} not ours left alone"
    if args.action == "status":
        return DONE, json.dumps(details, sort_keys=True), details
    if not candidates:
        return DONE, f"localinference shm-offload: nothing to reclaim in {where}{kept}", details
    if not verdict.proven:
        return (
            REFUSED,
            f"{REFUSAL_MARKER}: {len(candidates)} possible orphan(s) in {where}"
            f" ({_size(candidates)}) cannot be proven unused: "
            + "; ".join(verdict.refusals)
            + f"; nothing deleted ({CATALOG})",
            details,
        )
    done, problems, notes = reclaim(directory, verdict.orphans)
    freed = sum(e.allocated for e in done)
    details.update(reclaimed=[e.public() for e in done], bytes_freed=freed, notes=notes)
    if problems:
        return (
            REFUSED,
            f"{REFUSAL_MARKER}: {len(done)} of {len(candidates)} orphan(s) in {where} reclaimed, "
            + "; ".join(problems)
            + f" ({CATALOG})",
            details,
        )
    return (
        DONE,
        f"localinference shm-offload: reclaimed {len(done)} orphan(s) in {where},"
        f" {freed / GIB:.2f} GiB freed{kept}" + (f"; {'; '.join(notes)}" if notes else ""),
        details,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code, line, _ = run(args)
    except ShmOffloadError as exc:
        print(f"{REFUSAL_MARKER}: {exc} ({CATALOG})", file=sys.stderr)
        return REFUSED
    except OSError as exc:
        print(
            f"{REFUSAL_MARKER}: cannot inspect {args.directory}: {exc} ({CATALOG})", file=sys.stderr
        )
        return REFUSED
    print(line, file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
