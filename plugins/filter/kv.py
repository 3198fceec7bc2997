# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KV and client-budget filters for templates; the arithmetic lives in module_utils.

- ``kv_tokens_for``: vLLM's predicted KV cache tokens for observations at a context length.
- ``kv_concurrency``: full-length requests at a context length (worst, median or best boot).
- ``client_budget``: opencode ``limit.*`` and ``compaction.reserved`` for a server context.
- ``opencode_working_budget``: opencode 1.18.33's compaction trigger for a ``limit.*`` dict.
- ``kv_scheduled_tokens``: tokens scheduled per step with parallel drafting.
- ``kv_calibration``: the calibration key of a recipe (what its boots calibrate).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._client_budget import (
    ClientInputError,
    plan_client,
    working_budget,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_model import (
    KvInputError,
    boot_memory,
    calibration_key,
    fit_boots,
    group_boots,
    normalise_observations,
    predict_concurrency,
    predict_tokens,
    scheduled_tokens,
    spread,
)

_LEVELS = ("worst", "median", "best")


def _level_memory(observations: list[Any], level: str, memory_gib: float | None):
    if level not in _LEVELS:
        raise AnsibleFilterError(f"level must be one of {', '.join(_LEVELS)}, got {level!r}")
    try:
        boots = group_boots(normalise_observations(observations))
        if not boots:
            raise KvInputError("observations is empty: pass at least one observed boot")
        fit = fit_boots(boots)
    except KvInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    if memory_gib is not None:
        if fit.mode != "memory":
            raise AnsibleFilterError("memory_gib needs observations that carry kv_memory_gib")
        try:
            return fit, validate.number("memory_gib", memory_gib, minimum=0)
        except validate.ValidationError as exc:
            raise AnsibleFilterError(str(exc)) from None
    return fit, spread([boot_memory(fit, b) for b in boots])[level]


def kv_tokens_for(
    observations: list[Any],
    max_model_len: int,
    level: str = "worst",
    memory_gib: float | None = None,
) -> int:
    """``observations | kv_tokens_for(32768)``: KV tokens vLLM would report at that context."""
    fit, memory = _level_memory(observations, level, memory_gib)
    return predict_tokens(fit, memory, int(max_model_len))


def kv_concurrency(
    observations: list[Any],
    max_model_len: int,
    level: str = "worst",
    memory_gib: float | None = None,
) -> float:
    """``observations | kv_concurrency(24576)``: full-length requests that fit."""
    fit, memory = _level_memory(observations, level, memory_gib)
    return round(predict_concurrency(fit, memory, int(max_model_len)), 4)


def client_budget(
    max_model_len: int,
    prompt_floor: int | None = None,
    output_tokens: int | None = None,
    reserved_tokens: int | None = None,
) -> dict[str, Any]:
    """``24576 | client_budget(8193)``: opencode limits for that server context."""
    try:
        return plan_client(int(max_model_len), prompt_floor, output_tokens, reserved_tokens)
    except ClientInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def opencode_working_budget(limits: dict[str, Any]) -> int:
    """``{'context': 8192, 'input': 8192, 'output': 4096, 'reserved': 8000} | opencode_working_budget``."""
    if "context" not in limits or "output" not in limits:
        raise AnsibleFilterError("opencode_working_budget needs context and output")
    return working_budget(
        limits["context"], limits["output"], limits.get("input"), limits.get("reserved")
    )


def kv_scheduled_tokens(
    max_num_batched_tokens: int,
    max_num_seqs: int,
    speculative_tokens: int = 0,
    parallel_drafting: bool = True,
) -> int:
    """``8192 | kv_scheduled_tokens(2, 5)`` is 8184."""
    return scheduled_tokens(
        int(max_num_batched_tokens),
        int(max_num_seqs),
        int(speculative_tokens),
        bool(parallel_drafting),
    )


def kv_calibration(recipe: dict[str, Any]) -> str | None:
    return calibration_key(recipe)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "kv_tokens_for": kv_tokens_for,
            "kv_concurrency": kv_concurrency,
            "client_budget": client_budget,
            "opencode_working_budget": opencode_working_budget,
            "kv_scheduled_tokens": kv_scheduled_tokens,
            "kv_calibration": kv_calibration,
        }
