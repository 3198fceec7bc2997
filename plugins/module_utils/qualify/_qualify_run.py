# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One qualification check by name: the dispatcher over the checks of _qualify (single
requests), _qualify_tools (tool calls) and _qualify_load (load and context). It sits above
the three so that none of them imports another's caller (no import cycle).
"""

from __future__ import annotations

import time
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.qualify import _qualify as Q
from ansible_collections.localinference.vllm.plugins.module_utils.qualify import _qualify_judge as J
from ansible_collections.localinference.vllm.plugins.module_utils.qualify import (
    _qualify_load,
    _qualify_tools,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._qualify_http import (
    HttpError,
)


def run_check(name: str, target: Q.Target) -> dict[str, Any]:
    """Run one check; a transport failure is a failed check with the reason, never a traceback."""
    runners = {
        "smoke": Q.check_smoke,
        "structured_json": Q.check_structured_json,
        "tools": _qualify_tools.check_tools,
        "tools_stream": _qualify_tools.check_tools_stream,
        "tool_continuation": _qualify_tools.check_tool_continuation,
        "responses_api": Q.check_responses_api,
        "anthropic_messages": Q.check_anthropic_messages,
        "reasoning_split": Q.check_reasoning_split,
        "reasoning_budget": Q.check_reasoning_budget,
        "truncated_tool_call": _qualify_tools.check_truncated_tool_call,
        "concurrency": _qualify_load.check_concurrency,
        "context_ladder": _qualify_load.check_context_ladder,
        "shared_prefix": _qualify_load.check_shared_prefix,
        "head_of_line": _qualify_load.check_head_of_line,
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
