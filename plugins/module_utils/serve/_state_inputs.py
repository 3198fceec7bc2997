# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``serving_state``'s options, checked before the node is read or written.

:func:`inputs` turns the options into the normalised recipe, the node and the paths the
module works with (a bad value or combination ends the module, naming the option and where
the serve role takes it from); :func:`memory` adds the units' memory guards and the node's
need; :func:`layout_problems` judges the parallel layout against the node (F27).

No AnsibleModule here: ``module`` is the caller's (``params``, ``warn``, ``fail_json``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    timeout_error,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import normalise
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._gid_start import (
    start_argv as gid_start_argv,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    gpus_in_devices,
    lint_parallel,
    model_geometry,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import make_node
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    guards as memory_guards,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    mem_total_bytes,
    parse_policy,
    utilization_problems,
    weights_on_disk,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    StateFileError,
    read_text,
)

UNIT_DIRS = {"quadlet": "/etc/containers/systemd", "systemd": "/etc/systemd/system"}

# A config.json larger than this is not a model configuration.
MAX_CONFIG_BYTES = 4 * 1024 * 1024

# Where the serve role takes each node value from, named in a refusal of that value.
NODE_SOURCES = {
    "address": "serve_cluster_address, else the fabric stage's primary_ip",
    "head_address": "the head's serve_cluster_address, else its fabric stage's primary_ip",
    "weights_path": "serve_weights_path, else model_weights_path",
    "rdma": "the fabric stage's saved interfaces[0].hca and serve_rdma_sys_root",
}


def layout_problems(recipe: dict[str, Any], node: Any) -> list[dict[str, Any]]:
    """F27 (the parallel layout against the nodes, the devices and the model) as problems.

    The model's geometry comes from the node's ``config.json`` when it can be read;
    an absent or unreadable file leaves the head and layer checks out, never guesses.
    """
    try:
        text = read_text(os.path.join(node.weights_path, "config.json"), MAX_CONFIG_BYTES)
        config = json.loads(text) if text is not None else None
    except (StateFileError, ValueError):
        config = None
    found = lint_parallel(
        recipe, node.nnodes, gpus_in_devices(recipe["devices"]), model_geometry(config)
    )
    return [{**f, "blocking": f["severity"] == "error"} for f in found]


def absolute(option: str, value: Any) -> str:
    """``value`` as an absolute path of printable characters, or a refusal naming ``option``."""
    value = validate.text(option, value, max_length=validate.MAX_PATH)
    if not value.startswith("/"):
        raise validate.ValidationError(
            option, f"{value!r} is not an absolute path", "start it with /"
        )
    return value


def _check_options(checks: dict[str, Any]) -> None:
    """Validate the checks' paths, names and deadlines before anything runs."""
    for option in ("timeout", "help_timeout"):
        if timeout_error(checks[option]):
            raise validate.ValidationError(
                f"checks.{option}",
                f"{checks[option]!r} is not a number of seconds above 0 and at most 86400",
                "give the seconds the command may take",
            )
    if checks["max_load_per_cpu"] is not None:  # NaN would let every load through
        try:
            validate.number("checks.max_load_per_cpu", checks["max_load_per_cpu"])
        except validate.ValidationError as exc:
            fix = f"{exc.fix} (the serve role takes it from serve_max_load_per_cpu)"
            raise validate.ValidationError(exc.name, exc.problem, fix) from None
    for option in ("help_cache_dir", "quadlet", "programs_dir"):
        if checks[option]:
            checks[option] = absolute(f"checks.{option}", checks[option])
    if checks["programs"] and not checks["programs_dir"]:
        raise validate.ValidationError(
            "checks.programs_dir", "is not set but checks.programs is", "name the directory"
        )
    for index, program in enumerate(checks["programs"]):
        name = validate.text(f"checks.programs[{index}].name", program["name"], max_length=64)
        if "/" in name or name in (".", ".."):
            raise validate.ValidationError(
                f"checks.programs[{index}].name", f"{name!r} is not a file name", "give a plain name"
            )


def inputs(module: Any) -> dict[str, Any]:
    """The validated recipe, node and paths; a bad value or combination ends the module."""
    params = module.params
    state, checks = params["state"], params["checks"]
    if checks is not None and state not in ("staged", "verified"):
        module.fail_json(msg=f"checks: only with state=staged or verified (state is {state}); remove checks")
    try:
        recipe = normalise(params["recipe"], params["plan_max_model_len"])
        try:
            node = make_node(params["node"])
        except validate.ValidationError as exc:
            source = NODE_SOURCES.get(exc.name.split(".")[1] if exc.name.startswith("node.") else "")
            if source:
                exc = validate.ValidationError(exc.name, exc.problem, f"{exc.fix} (the serve role takes it from {source})")
            raise exc from None
        found = {
            "recipe": recipe,
            "node": node,
            "state_path": absolute("path", params["path"]),
            "staging_dir": absolute("staging_dir", params["staging_dir"]),
            "unit_dir": validate.path("unit_dir", params["unit_dir"] or UNIT_DIRS[recipe["deploy_mode"]]),
            "venv_dir": validate.path(
                "venv_dir",
                params["venv_dir"] or f"/opt/localinference/vllm-{recipe.get('vllm_version', 'unset')}",
            ),
            "help_path": params["help_text"] and absolute("help_text", params["help_text"]),
        }
        if checks is not None:
            _check_options(checks)
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    if not 0 <= node.rank < node.nnodes:
        module.fail_json(msg=f"node.rank {node.rank} is outside 0..{node.nnodes - 1}; the head is rank 0")
    if (params["stop_live"] or params["daemon_reload"]) and state != "present":
        module.fail_json(msg=f"stop_live and daemon_reload: only with state=present (state is {state})")
    if timeout_error(params["stop_timeout"]):
        module.fail_json(
            msg=f"stop_timeout: {params['stop_timeout']!r} is not a number of seconds above 0 and at "
            "most 86400; give the seconds one systemctl stop may take"
        )
    return found


def _mem_total(module: Any) -> int:
    """MemTotal of this node (the unified-memory need of a profiled recipe)."""
    try:
        return mem_total_bytes(
            _files.read_text("/proc/meminfo", _files.MAX_KERNEL_TEXT, errors="replace")
        )
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"guards: cannot read MemTotal from /proc/meminfo ({exc})")


def memory(module: Any, recipe: dict[str, Any], node: Any, unit_dir: str) -> tuple:
    """``(slice_dir, guards, memory, capped)``: the units' memory guards and the node's need."""
    guards, memory, capped = None, None, []
    try:
        slice_dir = validate.path(
            "slice_dir",
            module.params["slice_dir"]
            or (unit_dir if recipe["deploy_mode"] == "systemd" else UNIT_DIRS["systemd"]),
        )
        if module.params["guards"] is not None:
            policy = parse_policy(module.params["guards"])
            capped = utilization_problems(recipe, policy)
            weights, weights_found = weights_on_disk(node.weights_path)
            guards = memory_guards(recipe, node.host, node.nnodes, policy, weights, _mem_total(module))
            gid_argv = gid_start_argv(policy.libexec_dir, node.rdma, node.address, node.env)
            if gid_argv:
                guards = dataclasses.replace(guards, gid_argv=gid_argv)
            memory = {**guards.need, "weights_found": weights_found}
            if memory["unified_memory"] and not weights and not memory["engine_bytes"]:
                module.warn(f"the admission need of {node.host} counts no weights: {weights_found}")
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    return slice_dir, guards, memory, capped
