# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving recipe: schema, normalisation, canonical hash, vLLM command lines.

A recipe is one dict (inventory variable ``vllm_recipe``).  Its keys are vLLM's
option names with underscores plus a few deployment keys (``DEPLOY_KEYS``).
Everything here is pure: no AnsibleModule, no I/O, unit-tested on its own.
Unit text (Quadlet / systemd) lives in ``_units.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
HEX40 = re.compile(r"^[0-9a-f]{40}$")
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
KEY = re.compile(r"^[a-z][a-z0-9_]*$")

# Deployment keys: how and where to run vLLM; never rendered as vLLM flags.
DEPLOY_DEFAULTS: dict[str, Any] = {
    "deploy_mode": "quadlet",
    "executor_backend": "mp",
    "ipc_host": False,
    "privileged": False,
    "extra_args": [],
    "env": {},
    "devices": [],
    "podman_args": [],
    "ulimits": ["memlock=-1:-1", "nofile=1048576:1048576", "stack=67108864:67108864"],
    "cache_dir": "/var/cache/localinference/vllm",
    "ray_port": 6379,
    "entrypoint": "vllm",
}
DEPLOY_KEYS = frozenset(DEPLOY_DEFAULTS) | {
    "model",
    "revision",
    "image",
    "vllm_version",
    "shm_size",
}

# vLLM options with defaults the collection always renders explicitly.
VLLM_DEFAULTS: dict[str, Any] = {
    "tensor_parallel_size": 1,
    "host": "0.0.0.0",
    "port": 8000,
}

# The renderer owns these; a recipe that sets them would fight the topology.
RESERVED_KEYS = {
    "distributed_executor_backend": "executor_backend",
    "nnodes": "the inventory (one node per host in vllm_cluster)",
    "node_rank": "the inventory (the head is rank 0)",
    "master_addr": "the head's cluster address (cluster_network_env)",
    "headless": "the node's role (workers run headless)",
    "model_tag": "model",
}

INT_KEYS = {
    "max_num_seqs": 1,
    "max_num_batched_tokens": 1,
    "kv_cache_memory_bytes": 1,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "port": 1,
    "master_port": 1,
    "ray_port": 1,
}
FLOAT_KEYS = {"gpu_memory_utilization", "kv_offloading_size"}
BOOL_KEYS = {"enable_auto_tool_choice", "ipc_host", "privileged", "enforce_eager"}
LIST_KEYS = {"extra_args", "devices", "podman_args", "ulimits"}


class RecipeError(ValueError):
    """A recipe that cannot be served; the message names the key and the fix."""


def _fail(key: str, problem: str, fix: str) -> RecipeError:
    return RecipeError(f"vllm_recipe.{key}: {problem}; {fix}")


def _as_int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise _fail(key, f"expected an integer, got {value!r}", "set a whole number")
    try:
        number = int(str(value).replace("_", ""))
    except ValueError:
        raise _fail(key, f"expected an integer, got {value!r}", "set a whole number") from None
    if number < minimum:
        raise _fail(key, f"{number} is below {minimum}", f"set at least {minimum}")
    return number


def _as_float(key: str, value: Any) -> float | int:
    if isinstance(value, bool):
        raise _fail(key, f"expected a number, got {value!r}", "set a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _fail(key, f"expected a number, got {value!r}", "set a number") from None
    return int(number) if number.is_integer() and key != "gpu_memory_utilization" else number


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"true", "yes", "on", "1"}:
        return True
    if text in {"false", "no", "off", "0"}:
        return False
    raise _fail(key, f"expected true or false, got {value!r}", "set a boolean")


def normalise(raw: dict[str, Any], plan_max_model_len: int | None = None) -> dict[str, Any]:
    """Return the canonical recipe: defaults filled, types coerced, ``plan`` resolved.

    Normalising an already normalised recipe returns it unchanged, so a recipe
    read back from a node (for a rollback) hashes exactly as when written.
    """
    if not isinstance(raw, dict):
        raise RecipeError("vllm_recipe: expected a dict of vLLM options and deployment keys")
    recipe: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not KEY.match(key):
            raise _fail(str(key), "not an option name", "use vLLM's option name with underscores")
        if key in RESERVED_KEYS:
            raise _fail(
                key, "is set by the collection", f"remove it; it follows {RESERVED_KEYS[key]}"
            )
        if value is None:
            continue
        recipe[key] = value
    for key, default in {**DEPLOY_DEFAULTS, **VLLM_DEFAULTS}.items():
        recipe.setdefault(key, json.loads(json.dumps(default)))

    for key in ("model", "revision"):
        if not recipe.get(key):
            raise _fail(key, "is required", "set the Hugging Face id and its pinned 40-hex commit")
    recipe["revision"] = str(recipe["revision"]).lower()
    if not HEX40.match(recipe["revision"]):
        raise _fail(
            "revision", f"{raw.get('revision')!r} is not a 40-hex commit", "pin the snapshot commit"
        )
    recipe.setdefault("served_model_name", recipe["model"])

    if recipe["deploy_mode"] not in ("quadlet", "systemd"):
        raise _fail(
            "deploy_mode", f"unknown mode {recipe['deploy_mode']!r}", "use quadlet or systemd"
        )
    if recipe["deploy_mode"] == "quadlet":
        image = str(recipe.get("image") or "")
        if not DIGEST.search(image):
            raise _fail(
                "image", f"{image or 'missing'}: not pinned by digest", "use NAME@sha256:<64 hex>"
            )
    elif not recipe.get("vllm_version"):
        raise _fail(
            "vllm_version",
            "is required for deploy_mode systemd",
            "set the vLLM release, e.g. 0.32.0",
        )
    if recipe["executor_backend"] not in ("mp", "ray"):
        raise _fail(
            "executor_backend", f"unknown backend {recipe['executor_backend']!r}", "use mp or ray"
        )

    mml = recipe.get("max_model_len")
    if mml == "plan":
        if plan_max_model_len is None:
            raise _fail(
                "max_model_len",
                "is 'plan' but no plan result is available",
                "run playbooks/plan.yml first (fact plan_budget on localhost) or set a number",
            )
        recipe["max_model_len"] = _as_int("max_model_len", plan_max_model_len, 1)
    elif mml is not None:
        recipe["max_model_len"] = _as_int("max_model_len", mml, 1)

    for key, minimum in INT_KEYS.items():
        if key in recipe:
            recipe[key] = _as_int(key, recipe[key], minimum)
    for key in FLOAT_KEYS & recipe.keys():
        recipe[key] = _as_float(key, recipe[key])
    for key in BOOL_KEYS & recipe.keys():
        recipe[key] = _as_bool(key, recipe[key])
    for key in LIST_KEYS & recipe.keys():
        if not isinstance(recipe[key], list):
            raise _fail(key, "expected a list", "write it as a YAML list")
        recipe[key] = [str(item) for item in recipe[key]]
    if not recipe["ipc_host"]:
        recipe.setdefault("shm_size", "1g")
    if not isinstance(recipe["env"], dict):
        raise _fail("env", "expected a dict", "write it as NAME: value pairs")
    recipe["env"] = {str(k): str(v) for k, v in sorted(recipe["env"].items())}
    if "speculative_config" in recipe and not isinstance(recipe["speculative_config"], dict):
        raise _fail("speculative_config", "expected a dict", "write vLLM's JSON keys as YAML")
    if "gpu_memory_utilization" in recipe and not 0 < recipe["gpu_memory_utilization"] <= 1:
        raise _fail("gpu_memory_utilization", "must be in (0, 1]", "use a fraction such as 0.85")
    for token in recipe["extra_args"]:
        name = token.split("=", 1)[0]
        if name.startswith("--") and name[2:].replace("-", "_") in RESERVED_KEYS:
            raise _fail(
                "extra_args", f"{name} is set by the collection", "remove it from extra_args"
            )
    return json.loads(canonical_json(recipe))


def canonical_json(recipe: dict[str, Any]) -> str:
    """Sorted keys, no whitespace, ASCII: the same bytes on every controller."""
    return json.dumps(recipe, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def recipe_hash(recipe: dict[str, Any]) -> str:
    """sha256 of the schema version and the canonical JSON of a normalised recipe."""
    payload = f"localinference.vllm/recipe/v{SCHEMA_VERSION}\n{canonical_json(recipe)}"
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def vllm_options(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe keys that are vLLM options (everything but deployment keys)."""
    return {k: v for k, v in recipe.items() if k not in DEPLOY_KEYS}


def option_flags(options: dict[str, Any]) -> list[str]:
    """Render vLLM options as CLI arguments, in sorted key order.

    ``True`` gives ``--flag``, ``False`` gives ``--no-flag`` (vLLM's boolean
    options accept both); dicts become compact JSON; lists become nargs.
    """
    argv: list[str] = []
    for key in sorted(options):
        value = options[key]
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, list):
            argv += [flag, *(str(item) for item in value)]
        else:
            argv += [flag, str(value)]
    return argv


@dataclass
class Node:
    """Where one rank runs: its place in the cluster and its fabric environment."""

    host: str
    rank: int
    nnodes: int
    head_address: str
    address: str = ""
    env: dict[str, str] = field(default_factory=dict)
    weights_path: str = ""

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


def serve_argv(recipe: dict[str, Any], node: Node, model_path: str) -> list[str] | None:
    """The ``vllm serve`` arguments (after the ``vllm`` executable) for one node.

    mp: every rank runs ``vllm serve`` with ``--nnodes/--node-rank/--master-addr``;
    ranks other than 0 add ``--headless``.  ray: only the head runs ``vllm serve``
    with ``--distributed-executor-backend ray`` once the Ray cluster has formed;
    workers run no server (``None``).
    """
    backend = recipe["executor_backend"]
    if backend == "ray" and node.rank != 0:
        return None
    argv = ["serve", model_path, *option_flags(vllm_options(recipe))]
    argv += ["--distributed-executor-backend", backend]
    if backend == "mp" and node.nnodes > 1:
        argv += ["--nnodes", str(node.nnodes), "--node-rank", str(node.rank)]
        argv += ["--master-addr", node.head_address]
        if node.rank != 0:
            argv.append("--headless")
    return argv + list(recipe["extra_args"])


def ray_argv(recipe: dict[str, Any], node: Node) -> list[str] | None:
    """``ray start`` arguments for the Ray head or worker unit (ray backend, >1 node)."""
    if recipe["executor_backend"] != "ray" or node.nnodes < 2:
        return None
    port = str(recipe["ray_port"])
    argv = ["start", "--block", "--disable-usage-stats"]
    if node.address:
        argv += ["--node-ip-address", node.address]
    if node.rank == 0:
        return [*argv, "--head", "--port", port]
    return [*argv, "--address", f"{node.head_address}:{port}"]


def environment(recipe: dict[str, Any], node: Node, digest: str) -> dict[str, str]:
    """Per-node environment: fabric variables, then the recipe's ``env``, then the hash."""
    env = {str(k): str(v) for k, v in node.env.items() if v not in (None, "")}
    env.update(recipe["env"])
    if recipe["executor_backend"] == "ray":
        # Ray's memory monitor mistakes page cache for pressure on unified memory.
        env.setdefault("RAY_memory_monitor_refresh_ms", "0")
        if node.rank == 0 and node.nnodes > 1:
            env.setdefault("RAY_ADDRESS", f"{node.head_address}:{recipe['ray_port']}")
    env["LOCALINFERENCE_RECIPE_HASH"] = digest
    return dict(sorted(env.items()))


def parse_help_flags(help_text: str) -> set[str]:
    """Every ``--flag`` that ``vllm serve --help=all`` defines."""
    flags: set[str] = set()
    for line in help_text.splitlines():
        if not line.startswith("  -"):
            continue
        spec = re.split(r"\s{2,}", line[2:], maxsplit=1)[0]
        flags.update(re.findall(r"--[a-zA-Z0-9][a-zA-Z0-9-]*", spec))
    return flags


def unknown_flags(argv: list[str], flags: set[str]) -> list[str]:
    """Flags in ``argv`` that the targeted vLLM release does not define."""
    unknown = []
    for token in argv:
        if token.startswith("--"):
            name = token.split("=", 1)[0]
            if name not in flags and name not in unknown:
                unknown.append(name)
    return unknown


def problems(recipe: dict[str, Any]) -> list[dict[str, Any]]:
    """Deployment defects this module can see in a normalised recipe (F14, F17).

    Capacity lint (F1, F3, F12, F15...) belongs to the plan's lint.
    """
    found = []
    podman = recipe["podman_args"]
    ipc_host = recipe["ipc_host"] or any(a in ("--ipc=host",) for a in podman)
    if ipc_host and (recipe.get("shm_size") or any(a.startswith("--shm-size") for a in podman)):
        found.append(
            {
                "id": "F14",
                "blocking": True,
                "message": "ipc_host with shm_size: Podman refuses --ipc=host together with "
                "ShmSize= at run time; choose host IPC (drop shm_size) or a container "
                "/dev/shm size (ipc_host: false)",
            }
        )
    if recipe["privileged"] or "--privileged" in podman:
        found.append(
            {
                "id": "F17",
                "blocking": not recipe["privileged"],
                "message": "--privileged grants every device and capability; list the GPUs in "
                "devices (AddDevice=nvidia.com/gpu=N) and keep privileged: false",
            }
        )
    return found
