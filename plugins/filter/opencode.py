# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measurement filters of the agent_client role; the parsing lives in module_utils/client/_opencode_measure.py.

- ``opencode_prompt_floor``: opencode's first request in tokens from /metrics before/after one run.
- ``opencode_stream_fields``: the delta keys that carried text in a streamed chat completion.
- ``opencode_run_events``: answer text, steps (server usage), errors of ``opencode run --format json``.
- ``opencode_turn_wanted``, ``opencode_turn_ready``, ``opencode_turn_verdict``: the rollout's agent turn
  (module_utils/client/_opencode_turn.py).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode_measure import (
    MeasureError,
    prompt_floor,
    run_events,
    stream_fields,
)
from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode_turn import (
    turn_ready,
    turn_verdict,
    turn_wanted,
)


def opencode_prompt_floor(
    before: str, after: str, stdout: str, model: str | None = None
) -> dict[str, Any]:
    try:
        return prompt_floor(before, after, stdout, model)
    except MeasureError as exc:
        raise AnsibleFilterError(str(exc)) from None


def opencode_stream_fields(sse: str) -> dict[str, Any]:
    return stream_fields(sse)


def opencode_run_events(stdout: str) -> dict[str, Any]:
    return run_events(stdout)


def opencode_turn_wanted(mode: str, check_mode: bool, started: bool) -> str:
    return turn_wanted(mode, bool(check_mode), bool(started))


def opencode_turn_ready(
    client: Any, config_exists: bool, config_path: str, models: Any = None
) -> str:
    return turn_ready(client, bool(config_exists), config_path, models)


def opencode_turn_verdict(
    result: dict[str, Any], timeout: int, secrets: list[str] | None = None
) -> dict[str, Any]:
    """The verdict of a registered ``command`` result of the turn's run."""
    result = result if isinstance(result, dict) else {}
    # A command that could not start has no stderr, only Ansible's msg; "non-zero return code"
    # beside an empty stderr is not the client's word.
    stderr = result.get("stderr")
    return turn_verdict(
        result.get("rc"),
        result.get("stdout", ""),
        result.get("msg", "") if stderr is None else stderr,
        timeout,
        secrets or (),
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "opencode_prompt_floor": opencode_prompt_floor,
            "opencode_stream_fields": opencode_stream_fields,
            "opencode_run_events": opencode_run_events,
            "opencode_turn_wanted": opencode_turn_wanted,
            "opencode_turn_ready": opencode_turn_ready,
            "opencode_turn_verdict": opencode_turn_verdict,
        }
