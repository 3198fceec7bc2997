# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Readiness of a vLLM endpoint: a streamed first token, not only ``/health``.

Pure helpers: whether a unit failed to start (its ``systemctl show`` read by
``common/_systemctl.parse_show``); the
stream's first token is read by ``engine/_sse.py``.  The module does the waiting
and the HTTP.
"""

from __future__ import annotations


def unit_failed(show: dict[str, str], restarts_before: int = 0) -> str | None:
    """Why a unit counts as a failed start, or None while it may still come up."""
    if show.get("LoadState") in ("not-found", "bad-setting", "error", "masked"):
        return (
            f"unit cannot be watched (LoadState={show['LoadState']}): check the unit name"
            " ('systemctl list-units --all') and the unit file"
        )
    if show.get("ActiveState") == "failed":
        return f"unit failed ({show.get('Result', 'unknown result')})"
    if show.get("SubState") == "auto-restart":
        return "unit exited and systemd is restarting it (Restart=on-failure)"
    try:
        restarts = int(show.get("NRestarts", "0") or 0)
    except ValueError:
        restarts = 0
    if restarts > restarts_before:
        return f"unit restarted {restarts - restarts_before} time(s) since the start"
    if show.get("ActiveState") == "inactive" and show.get("LoadState") == "loaded":
        return "unit is inactive (stopped or exited)"
    return None
