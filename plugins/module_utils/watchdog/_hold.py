# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's hold file: ``<deadline epoch seconds>[ <holder>]`` on the head.

A rollout writes a deadline alone while it restarts the engine (holder ``rollout``); the
qualification writes ``<deadline> qualify`` while its checks load the engine. The watchdog
judges and records but does not restart while a hold has not run out. One reader for all.
"""

from __future__ import annotations

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

QUALIFY = "qualify"
ROLLOUT = "rollout"


def parse(text: str | None) -> tuple[float, str] | None:
    """``(deadline, holder)`` of the file's text, or None when it holds no deadline."""
    deadline, _, holder = (text or "").strip().partition(" ")
    try:  # NaN or infinity is no deadline
        until = validate.number("hold deadline", deadline)
    except validate.ValidationError:
        return None
    return until, (QUALIFY if holder.strip() == QUALIFY else ROLLOUT)


def active(text: str | None, now: float) -> tuple[float, str] | None:
    """The hold when it has not run out at ``now``, else None."""
    hold = parse(text)
    return hold if hold and hold[0] > now else None
