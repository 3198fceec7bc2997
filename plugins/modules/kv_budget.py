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
  - The arithmetic lives in C(module_utils/plan/_kv_model.py), C(_client_budget.py) and
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
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._client_budget import (
    ClientInputError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_budget import compute
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_model import KvInputError
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    RecipeInputError,
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


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = compute(module.params)
    except (KvInputError, ClientInputError, RecipeInputError, ValidationError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
