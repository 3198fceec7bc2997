# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measurement filters of the agent_client role; the parsing lives in module_utils/_opencode_measure.py.

- ``opencode_prompt_floor``: opencode's first request in tokens from /metrics before/after one run.
- ``opencode_stream_fields``: the delta keys that carried text in a streamed chat completion.
- ``opencode_run_events``: answer text, steps (server usage), errors of ``opencode run --format json``.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils._opencode_measure import (
    MeasureError,
    prompt_floor,
    run_events,
    stream_fields,
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


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "opencode_prompt_floor": opencode_prompt_floor,
            "opencode_stream_fields": opencode_stream_fields,
            "opencode_run_events": opencode_run_events,
        }
