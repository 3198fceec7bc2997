# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``kv_budget``'s whole result from its options: the recipe as the rollout checks it, the KV plan,
the client budget and every lint, in one call (:func:`compute`).

The arithmetic is ``_kv_model``'s, the verdicts ``_kv_judge``'s and ``_recipe_lint``'s, the
client budget ``_client_budget``'s; here they are put together in the module's order.
Pure but for one read: ``observations_path`` (``_kv_input.read_observations_file``). With no
boot observed and no memory given, the recipe is only linted (:func:`_lint_only`).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    check as check_recipe,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    unpinned_image,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._client_budget import (
    MIN_OUTPUT,
    check_client_limits,
    needed_context,
    plan_client,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_input import (
    read_observations_file,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_judge import (
    capacity_violations,
    client_violations,
    first_boot_violations,
    weakest_rank_check,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_model import (
    GIB,
    KvInputError,
    calibration_key,
    concurrency_at,
    plan_kv,
    scheduled_tokens,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    MAX_BYTES,
    lint_context,
    lint_offload,
    lint_parallel,
    lint_scheduling,
    lint_static,
    parse_size,
    recipe_max_model_len,
    speculative_settings,
)


def _effective_recipe(params: dict[str, Any]) -> dict[str, Any]:
    """The recipe's keys as the rollout checks them, then the options that override them."""
    recipe = check_recipe(
        params["recipe"] or {}, allow_unpinned_image=bool(params.get("allow_unpinned_image"))
    )
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if params[key] is not None:
            recipe[key] = params[key]
    if params["speculative_tokens"] is not None or params["parallel_drafting"] is not None:
        spec = dict(recipe.get("speculative_config") or {})
        if params["speculative_tokens"] is not None:
            spec["num_speculative_tokens"] = params["speculative_tokens"]
        if params["parallel_drafting"] is not None:
            spec["parallel_drafting"] = params["parallel_drafting"]
        recipe["speculative_config"] = spec
    return recipe


def _image_warning(recipe: dict[str, Any]) -> list[dict[str, Any]]:
    """A tag the recipe check let through (allow_unpinned_image) is said, with its fix."""
    image = recipe.get("image")
    if not image or "@" in image or recipe.get("deploy_mode", "quadlet") != "quadlet":
        return []
    return [unpinned_image(image)]


def _pinned_kv(recipe: dict[str, Any]) -> tuple[int | None, str]:
    """KV bytes per rank the recipe pins, and which key pins them."""
    if recipe.get("kv_cache_memory_bytes") is not None:
        return (
            parse_size(recipe["kv_cache_memory_bytes"], "recipe.kv_cache_memory_bytes"),
            "recipe.kv_cache_memory_bytes",
        )
    space = (recipe.get("env") or {}).get("VLLM_CPU_KVCACHE_SPACE")
    if space not in (None, ""):
        # vLLM's CPU build reads it as whole GiB (vllm/platforms/cpu.py).
        name = "recipe.env.VLLM_CPU_KVCACHE_SPACE"
        try:
            gib = validate.integer(name, space, minimum=0, maximum=MAX_BYTES // GIB)
        except ValidationError as exc:
            raise ValidationError(
                name,
                exc.problem,
                "set whole GiB (vLLM's CPU build reads it with int()), or kv_cache_memory_bytes"
                " for a finer size",
            ) from None
        return gib * GIB, name
    return None, ""


def _scheduled(recipe: dict[str, Any]) -> int | None:
    tokens, parallel = speculative_settings(recipe)
    batched = recipe.get("max_num_batched_tokens")
    if batched is None:
        return None
    return scheduled_tokens(int(batched), int(recipe.get("max_num_seqs") or 1), tokens, parallel)


def _layout(params: dict[str, Any], recipe: dict[str, Any]) -> list[dict[str, str]]:
    """F27 against the cluster's node count, when the caller knows it."""
    nodes = params.get("nodes")
    return lint_parallel(recipe, nodes) if nodes is not None else []


def _lint_only(
    params: dict[str, Any], recipe: dict[str, Any], explicit: int | None, pinned: int | None
) -> dict[str, Any]:
    """No boot observed yet: lint the recipe, plan nothing, say what evidence is missing."""
    note = (
        "no boot observed yet: the plan cannot size the KV cache; the rollout records what vLLM"
        " reports at the first boot and the next plan uses it"
    )
    violations = first_boot_violations(explicit)
    weakest, found = weakest_rank_check(params["weakest_rank"], pinned)
    scheduled = _scheduled(recipe)
    violations += found + lint_static(recipe) + _layout(params, recipe) + _image_warning(recipe)
    violations += lint_scheduling(recipe, scheduled)
    violations += lint_offload(recipe, params["host_limits"])
    served = explicit or 0
    client = (
        plan_client(
            served, params["prompt_floor"], params["output_tokens"], params["reserved_tokens"]
        )
        if served
        else None
    )
    if params["client_limits"] and served:
        violations += check_client_limits(params["client_limits"], served, params["prompt_floor"])
    empty = {"worst": None, "median": None, "best": None}
    return {
        "max_model_len": 0,
        "served_max_model_len": served,
        "guaranteed_max_model_len": 0,
        "preferred_max_model_len": 0,
        "preferred_met": None,
        "calibrated": False,
        "model": {"mode": "none", "calibration": "none", "points": 0, "notes": [note]},
        "memory_source": "none",
        "memory": empty,
        "concurrency": {},
        "kv_tokens": empty,
        "options": [],
        "active_sequences": [],
        "boots": [],
        "scheduled_tokens": scheduled,
        "client": client,
        "weakest_rank": weakest,
        "violations": violations,
        "feasible": not any(v["severity"] == "error" for v in violations),
    }


def _explicit_len(params: dict[str, Any], recipe: dict[str, Any]) -> int | None:
    """The recipe's explicit max_model_len once the token options are checked against it."""
    floor = params["prompt_floor"]
    for name in ("prompt_floor", "output_tokens", "reserved_tokens", "model_max_len"):
        if params[name] is not None and params[name] < 0:
            raise KvInputError(f"{name} must not be negative, got {params[name]}")
    explicit = recipe_max_model_len(recipe)
    if explicit is not None and floor is not None and explicit < floor:
        raise KvInputError(
            f"recipe.max_model_len {explicit} is below prompt_floor {floor}: every agent request"
            " would be rejected; raise max_model_len (or set it to plan) or re-measure prompt_floor"
        )
    return explicit


def _kv_memory(
    params: dict[str, Any], observations: list[Any], pinned: int | None, pinned_by: str
) -> tuple[float | None, str]:
    """The KV memory per rank the plan sizes with, in GiB, and where it comes from."""
    memory, source = params["available_kv_gib"], "available_kv_gib"
    if memory is None and pinned is not None:
        has_memory = any(
            isinstance(o, dict) and (o.get("kv_memory_gib") or o.get("available_kv_gib"))
            for o in observations
        )
        if has_memory or params["per_token_kib"]:
            memory, source = pinned / GIB, pinned_by
    return memory, source


def compute(params: dict[str, Any]) -> dict[str, Any]:
    """The whole kv_budget result; raises *InputError with the option named."""
    recipe = _effective_recipe(params)
    floor = params["prompt_floor"]
    explicit = _explicit_len(params, recipe)
    observations = list(params["observations"]) + read_observations_file(
        params["observations_path"]
    )
    pinned, pinned_by = _pinned_kv(recipe)
    memory, source = _kv_memory(params, observations, pinned, pinned_by)
    if not observations and memory is None and not params["per_token_kib"]:
        return _lint_only(params, recipe, explicit, pinned)
    min_length = 0
    if floor is not None:
        output = params["output_tokens"] if params["output_tokens"] is not None else MIN_OUTPUT
        min_length = needed_context(floor, output, params["reserved_tokens"])
    plan = plan_kv(
        observations,
        available_kv_gib=memory,
        per_token_kib=params["per_token_kib"],
        min_concurrency=params["min_concurrency"],
        preferred_concurrency=params["preferred_concurrency"],
        granularity=params["granularity"],
        model_max_len=params["model_max_len"],
        min_length=min_length,
        memory_source=source,
        recipe_hash=params.get("recipe_hash")
        or params.get("calibration")
        or calibration_key(recipe),
        constant_per_token=bool(params.get("constant_per_token")),
    )
    length = plan["max_model_len"]
    served = explicit or length
    client = plan_client(served, floor, params["output_tokens"], params["reserved_tokens"])
    for row in plan["options"]:
        row["client_ok"] = plan_client(
            row["max_model_len"], floor, params["output_tokens"], params["reserved_tokens"]
        )["ok"]
    scheduled = _scheduled(recipe)
    violations = capacity_violations(plan, params["granularity"], params["min_concurrency"])
    weakest, weakest_violations = weakest_rank_check(params["weakest_rank"], pinned)
    violations += weakest_violations
    violations += lint_static(recipe) + _layout(params, recipe) + _image_warning(recipe)
    if explicit is not None:
        violations += lint_context(
            recipe, concurrency_at(plan, explicit), length, params["min_concurrency"]
        )
    violations += lint_scheduling(recipe, scheduled)
    violations += lint_offload(recipe, params["host_limits"])
    if served > 0:
        violations += client_violations(client, served)
    if params["client_limits"]:
        violations += check_client_limits(params["client_limits"], served, floor)
    if plan["preferred_met"] is False:
        plan["model"]["notes"].append(
            f"preferred_concurrency {params['preferred_concurrency']:g} would leave less context"
            f" than the client needs ({min_length}); planned for min_concurrency instead"
        )
    result = {k: v for k, v in plan.items() if not k.startswith("_")}
    result.update(
        served_max_model_len=served,
        scheduled_tokens=scheduled,
        client=client,
        weakest_rank=weakest,
        violations=violations,
        feasible=length > 0 and not any(v["severity"] == "error" for v in violations),
    )
    return result
