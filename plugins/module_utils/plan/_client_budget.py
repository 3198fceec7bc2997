# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The client budget: opencode's limits for a server context, as opencode 1.18.33 behaves.

opencode's working budget ``B`` is ``limit.input - reserved`` when
``limit.input`` is set (``reserved`` defaults to ``min(20000, output)``),
otherwise ``limit.context - min(limit.output, 32000)`` and ``reserved`` is
ignored. It compacts when a reply's token count exceeds ``B``; below the
prompt floor ``F`` (system prompt plus tool schemas) it compacts after every
turn, forever.

A sound budget for server context ``L``: output ``O < L``; input
``I = L - O`` (prompt plus output always fits); reserved ``R`` (defaults to
opencode's own ``min(20000, O)``); ``B = I - R >= F + WORK_ROOM``;
``context = L``.

The plan owns this arithmetic: ``kv_budget`` sizes the served context by it, and
the client stage (``client/_opencode.py``, ``client/_agents.py``) writes and judges
the limits it gives, importing it from here (a stage imports only earlier ones).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding

WORK_ROOM = 10240
RESERVED_CAP = 20000
OUTPUT_CAP = 32000
MIN_OUTPUT = 1024
AUTO_OUTPUT_CAP = 16384
STEP = 1024


class ClientInputError(validate.InputError):
    """Bad client input; the message names the option."""


# A client limit: a whole, non-negative number of tokens, as a number in opencode's config.
TOKENS = {"minimum": 0, "error": ClientInputError, "text": False, "fix": "set a whole number of tokens (0 or more)"}


def _output_too_large(output: int, context: int) -> str:
    return (
        f"output_tokens {output} must be below the context {context}: limit.input would be"
        f" {context - output} (I = L - O); lower output_tokens below {context} or raise"
        " max_model_len (F8)"
    )


def default_reserved(output: int) -> int:
    """opencode's default ``compaction.reserved``."""
    return min(RESERVED_CAP, output)


def working_budget(
    context: int, output: int, input_limit: int | None = None, reserved: int | None = None
) -> int:
    """opencode 1.18.33's compaction trigger ``B`` for a model's ``limit.*``."""
    if input_limit is not None:
        return input_limit - (default_reserved(output) if reserved is None else reserved)
    return context - min(output, OUTPUT_CAP)


def needed_context(prompt_floor: int, output: int, reserved: int | None = None) -> int:
    """Smallest server context that gives this output a sound budget."""
    reserve = default_reserved(output) if reserved is None else reserved
    return prompt_floor + WORK_ROOM + reserve + output


def rejection_prompt_bound(max_context_length: int, requested_output_tokens: int) -> int:
    """The "at least N input tokens" vLLM prints: ``L - O + 1``, a bound, not a measurement.

    The two-Spark field report's 8,193 is exactly 16,384 - 8,192 + 1: vLLM only proved the prompt
    did not fit beside 8,192 output tokens.
    """
    return max_context_length - requested_output_tokens + 1


def _auto_output(context: int, prompt_floor: int, reserved: int | None) -> int:
    spare = context - prompt_floor - WORK_ROOM
    if reserved is not None:
        output = spare - reserved
    else:
        # O + min(20000, O) = spare
        output = spare // 2 if spare // 2 <= RESERVED_CAP else spare - RESERVED_CAP
    output = min(output, AUTO_OUTPUT_CAP)
    return (output // STEP) * STEP


def plan_client(
    context: int,
    prompt_floor: int | None,
    output_tokens: int | None = None,
    reserved_tokens: int | None = None,
) -> dict[str, Any]:
    """opencode ``limit.*`` and ``compaction.reserved`` for server context ``context``."""
    for name, value in (
        ("prompt_floor", prompt_floor),
        ("output_tokens", output_tokens),
        ("reserved_tokens", reserved_tokens),
    ):
        if value is not None and value < 0:
            raise ClientInputError(f"{name} must not be negative, got {value}")
    if prompt_floor is None:
        output = output_tokens if output_tokens is not None else min(AUTO_OUTPUT_CAP, context // 4)
        output = max(0, output)
        reserved = default_reserved(output) if reserved_tokens is None else reserved_tokens
        too_large = output >= context
        input_limit = max(0, context - output)
        return {
            "context": context,
            "input": input_limit,
            "output": output,
            "reserved": reserved,
            "working_budget": input_limit - reserved,
            "prompt_floor": None,
            # Without a floor the budget cannot be judged, but an output that leaves no
            # input is wrong whatever the floor.
            "ok": False if too_large else None,
            "reason": _output_too_large(output, context)
            if too_large
            else (
                "prompt_floor not given: measure usage.prompt_tokens of a real opencode request"
                " (opencode 1.18.33 sends about 30 KB of system prompt and tool schemas)"
            ),
            "needed_context": None,
            "additional_context_needed": None,
        }
    auto = output_tokens is None
    output = _auto_output(context, prompt_floor, reserved_tokens) if auto else output_tokens
    if auto and output < MIN_OUTPUT:
        output = MIN_OUTPUT
    reserved = default_reserved(output) if reserved_tokens is None else reserved_tokens
    input_limit = max(0, context - output)
    budget = input_limit - reserved
    need = needed_context(prompt_floor, output, reserved_tokens)
    reasons = []
    if output >= context:
        reasons.append(_output_too_large(output, context))
    if prompt_floor + output > context:
        reasons.append(
            f"prompt floor {prompt_floor} + output {output} = {prompt_floor + output} exceeds the"
            f" server context {context} (F8)"
        )
    if budget < prompt_floor:
        reasons.append(
            f"working budget {budget} (input {input_limit} - reserved {reserved}) is below the"
            f" prompt floor {prompt_floor}: opencode would compact after every turn (F9)"
        )
    elif budget < prompt_floor + WORK_ROOM:
        reasons.append(
            f"working budget {budget} leaves {budget - prompt_floor} tokens above the prompt floor"
            f" {prompt_floor}; at least {WORK_ROOM} are needed to work (F9)"
        )
    ok = not reasons
    return {
        "context": context,
        "input": input_limit,
        "output": output,
        "reserved": reserved,
        "working_budget": budget,
        "prompt_floor": prompt_floor,
        "ok": ok,
        "reason": "; ".join(reasons)
        if reasons
        else f"working budget {budget} >= prompt floor {prompt_floor} + {WORK_ROOM}",
        "needed_context": need,
        "additional_context_needed": max(0, need - context),
    }


def _client_limits(limits: Any) -> tuple[int, int, int | None, int | None]:
    """``(context, output, input, reserved)`` of an opencode model config, checked."""
    if not isinstance(limits, dict):
        raise ClientInputError(f"client_limits must be a dict, got {type(limits).__name__}")
    context = limits.get("context")
    output = limits.get("output")
    if context is None or output is None:
        raise ClientInputError(
            "client_limits needs context and output (opencode's limit.context and limit.output)"
        )
    context = validate.whole("client_limits.context", context, **TOKENS)
    output = validate.whole("client_limits.output", output, **TOKENS)
    input_limit = limits.get("input")
    reserved = limits.get("reserved")
    if input_limit is not None:
        input_limit = validate.whole("client_limits.input", input_limit, **TOKENS)
    if reserved is not None:
        reserved = validate.whole("client_limits.reserved", reserved, **TOKENS)
    return context, output, input_limit, reserved


def check_client_limits(
    limits: dict[str, Any], server_context: int, prompt_floor: int | None
) -> list[dict[str, str]]:
    """Findings for an existing opencode model config ``{context, input, output, reserved}``."""
    context, output, input_limit, reserved = _client_limits(limits)
    budget = working_budget(context, output, input_limit, reserved)
    found: list[dict[str, str]] = []
    if context > server_context:
        found.append(
            _finding(
                "F8",
                "error",
                f"client_limits.context {context} exceeds the server's max_model_len"
                f" {server_context}: long prompts get HTTP 400 and opencode loops on compaction;"
                f" set limit.context to {server_context}",
            )
        )
    sent_input = input_limit if input_limit is not None else context - min(output, OUTPUT_CAP)
    if sent_input + output > server_context:
        found.append(
            _finding(
                "F8",
                "error",
                f"client_limits input {sent_input} + output {output} = {sent_input + output}"
                f" exceeds max_model_len {server_context} by {sent_input + output - server_context}"
                f" token(s): set limit.input to {server_context - output} (I = L - O)",
            )
        )
    if prompt_floor is not None:
        return found + _prompt_floor_findings(prompt_floor, output, budget, server_context)
    if budget <= 0:
        found.append(
            _finding(
                "F9",
                "error",
                f"opencode's working budget is {budget}: it compacts after every turn;"
                " lower limit.output or compaction.reserved",
            )
        )
    return found


def _prompt_floor_findings(
    prompt_floor: int, output: int, budget: int, server_context: int
) -> list[dict[str, str]]:
    """F8/F9 against the measured prompt floor: a full request must fit, with room to work."""
    found: list[dict[str, str]] = []
    if prompt_floor + output > server_context:
        found.append(
            _finding(
                "F8",
                "error",
                f"prompt floor {prompt_floor} + client_limits.output {output} ="
                f" {prompt_floor + output} > max_model_len {server_context}: every full"
                f" request overflows; lower limit.output to at most"
                f" {server_context - prompt_floor - 1} or raise max_model_len",
            )
        )
    if budget < prompt_floor:
        found.append(
            _finding(
                "F9",
                "error",
                f"opencode's working budget is {budget} tokens, below the prompt floor"
                f" {prompt_floor}: it compacts after every turn; use the client budget this"
                " plan computes (input = L - output, reserved <= input - floor - 10240)",
            )
        )
    elif budget < prompt_floor + WORK_ROOM:
        found.append(
            _finding(
                "F9",
                "warning",
                f"opencode's working budget {budget} leaves {budget - prompt_floor} tokens"
                f" above the prompt floor; keep at least {WORK_ROOM}",
            )
        )
    return found


# The message says which limit to change; the client stage writes them from the served context.
CLIENT_FIX = "rewrite the limits from the served context (--tags client)"


def _finding(fid: str, severity: str, message: str) -> dict[str, str]:
    return finding(fid, severity, message, CLIENT_FIX)
