#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: kv_budget
short_description: Plan max_model_len, concurrency and the opencode client budget from vLLM's reports
version_added: 0.2.0
description:
  - Fits the KV memory one request needs, C(a + b*L), from observed boots (vLLM's reported KV tokens at a
    C(max_model_len), with KV memory per rank when known) and picks the largest C(max_model_len)
    that is a multiple of O(granularity) and meets O(min_concurrency) at the worst observed boot
    and weakest rank.
  - Without C(kv_memory_gib) in the observations it plans in tokens, assuming a boot's token count
    does not depend on C(max_model_len), and says so in C(model.notes).
  - A start that failed for lack of KV calibrates too - C(vllm_log_facts) turns vLLM's error into two
    observations (C(source=error_report)) - the requested length with the memory it needs and vLLM's
    estimate with the memory available - so the plan at that memory is vLLM's own estimate.
  - When the evidence cannot tell the fixed per-request cost from the per-token cost (one
    C(max_model_len) observed, or no memory figure), the plan offers no context above the longest
    observed to hold the concurrency at that memory, unless O(constant_per_token) or the observations
    (V0 block reports) say the cost per token is constant; RV(model) says how the plan was derived.
  - Computes the tokens vLLM schedules per step under parallel drafting, an active-sequence table,
    opencode's C(limit.*) and C(compaction.reserved) for the chosen context, and lints a recipe
    against the failure catalog (F1 F2 F3 F6 F8 F9 F12 F14 F15 F16 F17).
  - Runs on the controller; reads and changes nothing.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.INFO
options:
  observations:
    description:
      - Observed boots, one entry per rank and boot, as written to
        C(/var/lib/localinference/observations.json) or set in inventory C(kv_observations).
      - Each entry needs C(max_model_len) and C(kv_tokens); C(kv_memory_gib) (or
        C(available_kv_gib)) enables the memory model. Entries of one boot share C(recorded_at).
    type: list
    elements: dict
    default: []
  observations_path:
    description:
      - A JSON file of further observations on the host that runs the module (the head's
        C(/var/lib/localinference/observations.json), appended to by every rollout). A missing file
        adds nothing; a file that is not a JSON list of observation dicts fails naming the file.
    type: path
  weakest_rank:
    description:
      - The weakest rank preflight found (C(host), and C(free_gib) or C(free_bytes)), from the saved
        C(/etc/localinference/preflight.json). A KV size the recipe pins (C(kv_cache_memory_bytes) or
        the CPU build's C(env.VLLM_CPU_KVCACHE_SPACE)) larger than that rank's free memory is an F4
        error.
    type: dict
  available_kv_gib:
    description:
      - KV memory per rank the next boot will have, in GiB. Overrides the observed boots' memory;
        observations still calibrate the per-request cost.
      - Defaults to C(recipe.kv_cache_memory_bytes) (or the CPU build's C(recipe.env.VLLM_CPU_KVCACHE_SPACE),
        in GiB) when the recipe pins it and the model is in GiB.
    type: float
  per_token_kib:
    description:
      - KV bytes per token per rank, in KiB, used with O(available_kv_gib) when no observation
        carries memory (an uncalibrated plan, a=0).
    type: float
  min_concurrency:
    description: Full-length requests the worst boot must hold; 1.0 guarantees a start.
    type: float
    default: 1.0
  preferred_concurrency:
    description:
      - Concurrency wanted at the worst boot for prefix-cache headroom. Honoured only when the
        shorter context still satisfies the client budget; see RV(preferred_met).
    type: float
  granularity:
    description: C(max_model_len) is a multiple of this.
    type: int
    default: 1024
  model_max_len:
    description: The model's own maximum context (C(max_position_embeddings)); caps the plan.
    type: int
  max_num_seqs:
    description: Sequences vLLM admits at once. Defaults to C(recipe.max_num_seqs).
    type: int
  max_num_batched_tokens:
    description: vLLM's batched-token cap. Defaults to C(recipe.max_num_batched_tokens).
    type: int
  speculative_tokens:
    description: Draft tokens per step. Defaults to C(recipe.speculative_config.num_speculative_tokens).
    type: int
  parallel_drafting:
    description: Whether drafts are proposed in parallel. Defaults to C(recipe.speculative_config.parallel_drafting).
    type: bool
  prompt_floor:
    description:
      - The client's first request in tokens (system prompt plus tool schemas), measured from a real
        request's C(usage.prompt_tokens). A rejection message's "at least N" is only a lower bound.
    type: int
  output_tokens:
    description: opencode C(limit.output). Chosen by the plan when omitted.
    type: int
  reserved_tokens:
    description: opencode C(compaction.reserved). Defaults to opencode's own C(min(20000, output)).
    type: int
  client_limits:
    description:
      - An existing opencode model config to check (F8, F9) against the chosen context.
      - Keys C(context), C(output) (required), C(input), C(reserved).
    type: dict
  recipe:
    description:
      - The inventory recipe C(vllm_recipe) (vLLM option names with underscores) to lint.
      - Each key it sets is checked as the rollout checks it (a one-line C(served_model_name), a
        finite C(gpu_memory_utilization) in (0, 1], C(devices) as CDI names or nodes under C(/dev),
        ...), so a value the rollout would refuse fails here, naming C(vllm_recipe.<key>), before a
        plan is made of it. No key is required; C(max_model_len) may be C(plan).
    type: dict
    default: {}
  allow_unpinned_image:
    description:
      - The serve role's C(serve_allow_unpinned_image). V(true) accepts a C(vllm_recipe.image)
        without a digest (a tag), as the rollout will, which resolves it once on the head to the
        digest it names then; V(false) refuses it, naming both variables.
    type: bool
    default: false
  host_limits:
    description:
      - Host limits for the offload check (F16), for example from preflight facts, in bytes.
      - Keys C(shm_size_bytes), C(shm_free_bytes), C(memlock_bytes) (C(-1) or C(unlimited) for no
        limit) and C(mem_available_bytes), each a size such as C(8g) or a finite byte count;
        missing keys are not checked.
    type: dict
  calibration:
    description:
      - The calibration the recipe's boots belong to, as observations record it in C(calibration)
        (the model, tensor and pipeline parallel sizes, KV cache dtype, dtype and quantization; what
        decides the KV bytes per token). Boots of recipes that differ only in C(max_model_len) or the
        KV size share it, so they calibrate C(a + b*L) together.
      - Defaults to the key derived from O(recipe) when it names a C(model).
    type: str
  constant_per_token:
    description:
      - The model's KV cost per token is constant (plain attention, no sliding window, no compressed
        or indexer cache), so one boot predicts any C(max_model_len). With V(false) (the default) an
        uncalibrated plan never goes beyond the longest length observed; observations marked
        C(constant_per_token) (V0-style block reports) count as such evidence.
    type: bool
    default: false
  nodes:
    description:
      - The number of hosts in C(vllm_cluster). When given, the recipe's parallel layout is linted
        against it (F27) - C(tensor_parallel_size) x C(pipeline_parallel_size) ranks must spread
        evenly over the nodes - and the findings join C(violations).
    type: int
  recipe_hash:
    description:
      - The C(recipe_hash) of the recipe being planned, as the observations record it. Observations
        of different recipes are separate calibrations and are never fitted together.
      - When given and some observations carry it, only those are used; otherwise (not given, or no
        observation of it yet) every recipe is planned on its own and the worst plan wins.
    type: str
notes:
  - The arithmetic lives in C(module_utils/plan/_kv_model.py), C(module_utils/client/_budget.py) and
    C(_recipe_lint.py); the C(localinference.vllm.kv_*) filters call the same code.
"""

EXAMPLES = r"""
- name: Plan from four profiled boots (the two-Spark field report), tokens only
  localinference.vllm.kv_budget:
    observations:
      - {max_model_len: 24576, kv_tokens: 26890}
      - {max_model_len: 16384, kv_tokens: 33932}
      - {max_model_len: 24576, kv_tokens: 34887}
      - {max_model_len: 24576, kv_tokens: 47930}
    granularity: 8192
    prompt_floor: 8193
    recipe: "{{ vllm_recipe }}"
  register: plan

- name: Plan a pinned KV size from a calibrated build
  localinference.vllm.kv_budget:
    observations: "{{ kv_observations }}"
    available_kv_gib: 8.59
    max_num_batched_tokens: 8192
    max_num_seqs: 2
    speculative_tokens: 5
    parallel_drafting: true
"""

RETURN = r"""
max_model_len:
  description: The chosen context; 0 when not even one request of O(granularity) tokens fits.
  returned: always
  type: int
  sample: 24576
served_max_model_len:
  description:
    - The context the server will run - C(recipe.max_model_len) when it is a number, else
      RV(max_model_len); RV(client) is computed for it.
  returned: always
  type: int
guaranteed_max_model_len:
  description: The largest context meeting O(min_concurrency) at the worst boot.
  returned: always
  type: int
preferred_max_model_len:
  description: The largest context meeting O(preferred_concurrency) at the worst boot.
  returned: always
  type: int
preferred_met:
  description: Whether O(preferred_concurrency) was honoured; null when not asked.
  returned: always
  type: bool
calibrated:
  description: True when at least two boots at distinct C(max_model_len) carry KV memory.
  returned: always
  type: bool
model:
  description:
    - The fit of C(a + b*L) per rank; C(mode) is C(memory) (GiB) or C(tokens), C(fit_error) the
      largest relative error of predicted tokens over the observations, C(notes) the assumptions.
    - C(calibration) says how it was derived - C(two_points) (boots at two lengths), C(error_report)
      (a not-enough-KV error's two points), C(single_boot_bounded) (one length with memory),
      C(tokens_only) (no memory figure), C(constant_per_token), C(per_token_kib), or C(none) without any
      boot; C(bounded_by_evidence) the length the plan was held to and C(evidence_needed) what would
      let it go further.
    - C(sources) counts the boots the fit stands on by source - C(boot) (a start that reported its KV
      cache) and C(error_report) (the points of a start vLLM refused, recorded by the rollout).
  returned: always
  type: dict
memory_source:
  description: >-
    C(observations), C(available_kv_gib), C(recipe.kv_cache_memory_bytes) or
    C(recipe.env.VLLM_CPU_KVCACHE_SPACE).
  returned: always
  type: str
memory:
  description: Worst, median and best KV memory per rank (in the model's unit).
  returned: always
  type: dict
concurrency:
  description: Full-length requests at the chosen context at the worst, median and best boot.
  returned: always
  type: dict
  sample: {worst: 1.094, median: 1.4001, best: 1.9503}
kv_tokens:
  description: Predicted vLLM KV cache tokens at the chosen context (worst, median, best).
  returned: always
  type: dict
options:
  description:
    - Context lengths around the chosen one with C(concurrency), C(kv_tokens),
      C(meets_min_concurrency), C(meets_preferred_concurrency), C(client_ok) and C(chosen).
  returned: always
  type: list
  elements: dict
active_sequences:
  description: Tokens per sequence when one, two or four sequences share the worst boot's cache.
  returned: always
  type: list
  elements: dict
scheduled_tokens:
  description: Tokens scheduled per step (max_num_batched_tokens - (K-1)*max_num_seqs with parallel drafting); null when max_num_batched_tokens is unknown.
  returned: always
  type: int
  sample: 8184
client:
  description:
    - opencode limits for the chosen context - C(context), C(input), C(output), C(reserved) and the
      resulting C(working_budget); C(ok), C(reason), C(needed_context), C(additional_context_needed).
  returned: always
  type: dict
violations:
  description: Failure-catalog findings C({id, severity, message}); severity is C(error) or C(warning).
  returned: always
  type: list
  elements: dict
boots:
  description: The observed boots, weakest first, with the memory used for each.
  returned: always
  type: list
  elements: dict
weakest_rank:
  description: >-
    The host of the weakest rank the plan was checked against and whether the pinned KV size fits
    its free memory (C(fits) is null when the KV size is profiled, not pinned); empty without
    O(weakest_rank).
  returned: always
  type: dict
  sample: {host: spark-worker, fits: true}
feasible:
  description: True when a context exists and no violation has severity C(error).
  returned: always
  type: bool
calibration_recipe_hash:
  description: The C(recipe_hash) of the observations the chosen plan rests on (null for entries without one).
  returned: when observations or a memory size were given
  type: str
calibrations:
  description:
    - One entry per recipe found in the observations (C(recipe_hash), C(boots), C(max_model_len),
      C(guaranteed_max_model_len), C(calibrated), C(worst_memory), C(unit), C(chosen)).
  returned: when observations or a memory size were given
  type: list
  elements: dict
worst_boot_bound:
  description:
    - Factor (at most 1) applied to the memory so that the fit promises no observed boot more tokens
      than it reported; 1.0 when the fit agrees with every boot.
  returned: when observations or a memory size were given
  type: float
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.client._budget import (
    MIN_OUTPUT,
    ClientInputError,
    check_client_limits,
    needed_context,
    plan_client,
)
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
    RecipeInputError,
    lint_context,
    lint_offload,
    lint_parallel,
    lint_scheduling,
    lint_static,
    parse_size,
    recipe_max_model_len,
    speculative_settings,
)

ARGUMENT_SPEC: dict[str, Any] = {
    "observations": {"type": "list", "elements": "dict", "default": []},
    "observations_path": {"type": "path"},
    "weakest_rank": {"type": "dict"},
    "available_kv_gib": {"type": "float"},
    "per_token_kib": {"type": "float", "no_log": False},
    "min_concurrency": {"type": "float", "default": 1.0},
    "preferred_concurrency": {"type": "float"},
    "granularity": {"type": "int", "default": 1024},
    "model_max_len": {"type": "int"},
    "max_num_seqs": {"type": "int"},
    "max_num_batched_tokens": {"type": "int", "no_log": False},
    "speculative_tokens": {"type": "int", "no_log": False},
    "parallel_drafting": {"type": "bool"},
    "prompt_floor": {"type": "int"},
    "output_tokens": {"type": "int", "no_log": False},
    "reserved_tokens": {"type": "int", "no_log": False},
    "client_limits": {"type": "dict"},
    "recipe": {"type": "dict", "default": {}},
    "allow_unpinned_image": {"type": "bool", "default": False},
    "host_limits": {"type": "dict"},
    "recipe_hash": {"type": "str"},
    "calibration": {"type": "str"},
    "constant_per_token": {"type": "bool", "default": False},
    "nodes": {"type": "int"},
}


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


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = compute(module.params)
    except (KvInputError, ClientInputError, RecipeInputError, ValidationError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
