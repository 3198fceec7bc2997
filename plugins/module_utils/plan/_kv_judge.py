# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan's own judgements of a KV plan: F4, F8, F9 and F12 as violations.

``kv_budget`` sizes the KV cache (``_kv_model``) and the client budget (``_client_budget``);
this file says what is wrong with the result: a pinned KV size the weakest rank cannot hold
(F4), a client budget whose full requests overflow the context (F8) or that has no sound
budget at all (F9), and a plan with no boot to size from or no room for one request (F12).
Pure: no AnsibleModule, no node.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_model import (
    GIB,
    KvInputError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    MAX_BYTES,
)


def weakest_rank_check(
    weakest: dict[str, Any] | None, pinned: int | None
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """F4: ``({host, fits}, violations)`` for the KV bytes per rank the recipe ``pinned``."""
    if not weakest:
        return {}, []
    host = str(weakest.get("host") or "the weakest rank")
    free = weakest.get("free_bytes")
    if free is not None:
        free_gib = (
            validate.number("weakest_rank.free_bytes", free, minimum=0, maximum=MAX_BYTES) / GIB
        )
    elif weakest.get("free_gib") is not None:
        free_gib = validate.number(
            "weakest_rank.free_gib", weakest["free_gib"], minimum=0, maximum=MAX_BYTES // GIB
        )
    else:
        raise KvInputError(
            f"weakest_rank needs free_gib or free_bytes as a finite number, got {validate.shown(weakest)}"
        )
    if pinned is None:
        return {"host": host, "fits": None}, []
    fits = pinned <= free_gib * GIB
    found = []
    if not fits:
        found.append(
            finding(
                "F4",
                "error",
                f"the recipe pins {pinned / GIB:.2f} GiB of KV cache per rank, but the"
                f" weakest rank {host} has only {free_gib:.2f} GiB free (preflight): the start"
                " would fail there, not on the head; free memory on that rank (other tenants,"
                " swap) or pin less",
                f"free memory on {host} (--tags preflight lists who holds it) or lower"
                " vllm_recipe.kv_cache_memory_bytes, then run --tags plan",
            )
        )
    return {"host": host, "fits": fits}, found


# The client budget is fitted to the served context: raise it or ask less of the client.
CLIENT_FIX = (
    "raise vllm_recipe.max_model_len by the tokens the message names, or lower the client's"
    " output_tokens, then run --tags plan"
)


def client_violations(client: dict[str, Any], length: int) -> list[dict[str, str]]:
    """F8 and F9 of the client budget ``client`` (``plan_client``) at ``length`` tokens."""
    found = []
    floor = client["prompt_floor"]
    if client["ok"] is not False:
        return found
    if floor is None:
        # no floor to judge the budget by, but an output that leaves no input is wrong anyway
        return [finding("F8", "error", client["reason"], CLIENT_FIX)]
    if floor + client["output"] > length:
        found.append(
            finding(
                "F8",
                "error",
                f"prompt floor {floor} + output_tokens {client['output']} ="
                f" {floor + client['output']} > max_model_len {length}: full requests overflow;"
                f" lower output_tokens or raise max_model_len by"
                f" {client['additional_context_needed']}",
                CLIENT_FIX,
            )
        )
    found.append(
        finding(
            "F9",
            "error",
            f"no sound opencode budget at max_model_len {length}: {client['reason']};"
            f" {client['additional_context_needed']} more tokens of context are needed"
            f" ({client['needed_context']})",
            CLIENT_FIX,
        )
    )
    return found


def first_boot_violations(explicit: int | None) -> list[dict[str, str]]:
    """F12 before any boot was observed: only an explicit max_model_len can start."""
    if explicit is not None:
        return []
    return [
        finding(
            "F12",
            "error",
            "max_model_len: plan needs at least one recorded boot (observations,"
            " the head's observation file or inventory kv_observations) and there is none:"
            " set an explicit vllm_recipe.max_model_len for the first boot",
            "set vllm_recipe.max_model_len, roll out once (--tags plan,rollout), then plan from"
            " the boot it records",
        )
    ]


def capacity_violations(
    plan: dict[str, Any], granularity: int, min_concurrency: float
) -> list[dict[str, str]]:
    """F12 when the worst boot holds no request of ``granularity`` tokens at ``min_concurrency``."""
    if plan["max_model_len"] > 0:
        return []
    fit = plan["model"]
    return [
        finding(
            "F12",
            "error",
            f"the worst boot ({plan['memory']['worst']} {fit['unit']} per rank)"
            f" holds no request of {granularity} tokens at min_concurrency"
            f" {min_concurrency:g}: free memory (preflight) or lower min_concurrency",
            "free memory on the weakest rank (--tags preflight lists who holds it) or lower"
            " min_concurrency, then run --tags plan",
        )
    ]
