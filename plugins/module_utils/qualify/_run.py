# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One qualification check by name: the dispatcher over the checks of _checks (single
requests), _tools (tool calls) and _load (load and context). It sits above
the three so that none of them imports another's caller (no import cycle).
"""

from __future__ import annotations

import time
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.qualify import _checks as Q
from ansible_collections.localinference.vllm.plugins.module_utils.qualify import _judge as J
from ansible_collections.localinference.vllm.plugins.module_utils.qualify import (
    _load,
    _tools,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._http import (
    HttpError,
)


def run_check(name: str, target: Q.Target) -> dict[str, Any]:
    """Run one check; a transport failure is a failed check with the reason, never a traceback."""
    runners = {
        "smoke": Q.check_smoke,
        "structured_json": Q.check_structured_json,
        "tools": _tools.check_tools,
        "tools_stream": _tools.check_tools_stream,
        "tool_continuation": _tools.check_tool_continuation,
        "responses_api": Q.check_responses_api,
        "anthropic_messages": Q.check_anthropic_messages,
        "reasoning_split": Q.check_reasoning_split,
        "reasoning_budget": Q.check_reasoning_budget,
        "truncated_tool_call": _tools.check_truncated_tool_call,
        "concurrency": _load.check_concurrency,
        "context_ladder": _load.check_context_ladder,
        "shared_prefix": _load.check_shared_prefix,
        "head_of_line": _load.check_head_of_line,
    }
    if name not in runners:
        raise Q.QualifyInputError(f"check must be one of {', '.join(Q.CHECKS)}, got {name!r}")
    started = time.monotonic()
    try:
        out = runners[name](target)
    except HttpError as err:
        out = Q.result(name, J.FAIL, str(err), {}, {})
    out["timings"]["check_s"] = round(time.monotonic() - started, 3)
    return out
