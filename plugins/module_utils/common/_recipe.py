# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving recipe: schema, normalisation, canonical hash.

A recipe is one dict (inventory variable ``vllm_recipe``).  Its keys are vLLM's
option names with underscores plus a few deployment keys (``DEPLOY_KEYS``).
Everything here is pure: no AnsibleModule, no I/O, unit-tested on its own.
It is shared: the plan lints it, the rollout serves it, preflight, the doctor
and the upgrade read it. The ``vllm serve`` command lines are rendered by
``serve/_argv.py``, the unit text (Quadlet / systemd) by ``serve/_units.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from functools import partial
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _build_recipe,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)

SCHEMA_VERSION = 1
HEX40 = re.compile(r"[0-9a-f]{40}")
KEY = re.compile(r"[a-z][a-z0-9_]{0,63}")
# A Hugging Face repository id; ``..`` and ``--`` are refused by the Hub too and would
# make the snapshot path (models--org--name) ambiguous or escape it.
MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(?:/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
VERSION = re.compile(r"[0-9][0-9A-Za-z.+_-]{0,63}")
ULIMIT = re.compile(
    r"(?P<name>as|core|cpu|data|fsize|locks|memlock|msgqueue|nice|nofile|nproc|rss|rtprio"
    r"|rttime|sigpending|stack)=(?P<soft>-1|[0-9]{1,20})(?::(?P<hard>-1|[0-9]{1,20}))?"
)
# Deepest nesting accepted in a dict-valued vLLM option (speculative_config, ...).
MAX_DEPTH = 8
MAX_INT = 2**63 - 1

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
    "build",
    "mounts",
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
}
PORT_KEYS = {"port", "master_port", "ray_port"}
FLOAT_KEYS = {"gpu_memory_utilization", "kv_offloading_size"}
BOOL_KEYS = {"enable_auto_tool_choice", "ipc_host", "privileged", "enforce_eager"}
LIST_KEYS = {"extra_args", "devices", "podman_args", "ulimits"}


class RecipeError(ValidationError):
    """A recipe that cannot be served; the message names the key and the fix."""


def _fail(key: str, problem: str, fix: str) -> RecipeError:
    return RecipeError(f"vllm_recipe.{key}" if key else "vllm_recipe", problem, fix)


def _name(key: str) -> str:
    return f"vllm_recipe.{key}"


IMAGE_NAME = _name("image")
# The serve role's option that lets a tag alone through (resolved once on the head).
ALLOW_UNPINNED_IMAGE = "serve_allow_unpinned_image"


def _as_int(key: str, value: Any, minimum: int) -> int:
    return validate.integer(_name(key), value, minimum=minimum, maximum=MAX_INT)


def _as_float(key: str, value: Any) -> float | int:
    if key == "gpu_memory_utilization":
        number = validate.number(_name(key), value)
        if not 0 < number <= 1:
            raise _fail(key, "must be in (0, 1]", "use a fraction such as 0.85")
        return number
    number = validate.number(_name(key), value, minimum=0)
    return int(number) if number.is_integer() else number


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, (str, int)) else ""
    if text in {"true", "yes", "on", "1"}:
        return True
    if text in {"false", "no", "off", "0"}:
        return False
    raise _fail(key, f"expected true or false, got {validate.shown(value)}", "set a boolean")


def _as_list(key: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(key, f"expected a list, got {validate.shown(value)}", "write it as a YAML list")
    return value


def _ulimit(key: str, value: Any) -> str:
    value = validate.systemd_value(key, value, max_length=128)
    match = ULIMIT.fullmatch(value)
    if match is None:
        raise RecipeError(
            key,
            f"{value!r} is not a ulimit",
            "write NAME=SOFT[:HARD] with NAME one of nofile, memlock, stack, nproc, core, ... "
            "and -1 for unlimited, e.g. nofile=1048576:1048576",
        )
    soft, hard = match.group("soft"), match.group("hard")
    if hard is not None and soft != "-1" and (hard != "-1" and int(soft) > int(hard)):
        raise RecipeError(key, f"{value!r}: soft limit above hard limit", "set SOFT <= HARD")
    return value


def _entrypoint(value: Any) -> str:
    name = _name("entrypoint")
    value = validate.systemd_value(name, value, max_length=validate.MAX_PATH)
    if "/" in value:
        return validate.path(name, value)
    if value.startswith("-"):
        raise RecipeError(name, f"{value!r} reads as an option", "name the program, e.g. vllm")
    return value


def _option_value(name: str, value: Any, depth: int = 0) -> Any:
    """Any other vLLM option: text, finite numbers, booleans, lists of them, nested dicts."""
    if depth > MAX_DEPTH:
        raise RecipeError(name, f"nested deeper than {MAX_DEPTH} levels", "flatten the value")
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return validate.integer(name, value, minimum=-MAX_INT, maximum=MAX_INT)
    if isinstance(value, float):
        return validate.number(name, value)
    if isinstance(value, str):
        return validate.text(name, value)
    if isinstance(value, list):
        return [_option_value(f"{name}[{i}]", item, depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        checked = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise RecipeError(name, f"key {key!r} is not a string", "use string keys")
            validate.text(f"{name} key {validate.shown(key)}", key)
            if item is not None:
                checked[key] = _option_value(f"{name}.{key}", item, depth + 1)
        return checked
    raise RecipeError(
        name, f"unsupported value {validate.shown(value)}", "use text, a number, a list or a dict"
    )


# --------------------------------------------------------------------------- one check per key


def _model(value: Any) -> str:
    model = validate.text(_name("model"), value, max_length=200)
    if not MODEL_ID.fullmatch(model) or ".." in model or "--" in model:
        raise _fail(
            "model",
            f"{model!r} is not a Hugging Face repository id",
            "write ORG/NAME with letters, digits, '-', '_' and '.' (no '..' or '--')",
        )
    return model


def _revision(value: Any) -> str:
    revision = validate.text(_name("revision"), value, max_length=64).lower()
    if not HEX40.fullmatch(revision):
        raise _fail("revision", f"{value!r} is not a 40-hex commit", "pin the snapshot commit")
    return revision


def _served_model_name(value: Any) -> str | list[str]:
    name = _name("served_model_name")
    if not isinstance(value, list):
        return validate.text(name, value, strip_ok=False, max_length=256)
    if not value:
        raise _fail("served_model_name", "is an empty list", "name the model or drop the key")
    return [
        validate.text(f"{name}[{i}]", s, strip_ok=False, max_length=256)
        for i, s in enumerate(value)
    ]


def _one_of(key: str, what: str, choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise _fail(key, f"unknown {what} {value!r}", f"use {' or '.join(choices)}")
        return value

    return check


def _vllm_version(value: Any) -> str:
    version = validate.systemd_value(_name("vllm_version"), value)
    if not VERSION.fullmatch(version) or ".." in version:
        raise _fail(
            "vllm_version", f"{version!r} is not a release number", "write it as e.g. 0.32.0"
        )
    return version


def _max_model_len(value: Any) -> int | str:
    """A length, or ``plan`` (resolved by :func:`normalise`, kept by :func:`check`)."""
    return value if value == "plan" else _as_int("max_model_len", value, 1)


def _texts(key: str) -> Callable[[Any], list[str]]:
    def check(value: Any) -> list[str]:
        return [validate.text(f"{_name(key)}[{i}]", a) for i, a in enumerate(_as_list(key, value))]

    return check


def _extra_args(value: Any) -> list[str]:
    args = _texts("extra_args")(value)
    for token in args:
        name = token.split("=", 1)[0]
        if name.startswith("--") and name[2:].replace("-", "_") in RESERVED_KEYS:
            raise _fail(
                "extra_args", f"{name} is set by the collection", "remove it from extra_args"
            )
    return args


def _devices(value: Any) -> list[str]:
    return [
        validate.device(f"{_name('devices')}[{i}]", d)
        for i, d in enumerate(_as_list("devices", value))
    ]


def _ulimits(value: Any) -> list[str]:
    return [
        _ulimit(f"{_name('ulimits')}[{i}]", u) for i, u in enumerate(_as_list("ulimits", value))
    ]


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _fail("env", "expected a dict", "write it as NAME: value pairs")
    env = {}
    for key, item in value.items():
        name = validate.env_name(f"{_name('env')} key {validate.shown(key)}", key)
        env[name] = validate.env_value(f"{_name('env')}.{name}", item)
    return dict(sorted(env.items()))


def _speculative_config(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail("speculative_config", "expected a dict", "write vLLM's JSON keys as YAML")
    return _option_value(_name("speculative_config"), value)


# Every key with a check of its own, in the order a recipe is checked (the first refusal
# is reported); any other key is a vLLM option (_option_value). The image is checked
# with the deploy mode (_image).
_CHECKS: dict[str, Callable[[Any], Any]] = {
    "model": _model,
    "revision": _revision,
    "served_model_name": _served_model_name,
    "deploy_mode": _one_of("deploy_mode", "mode", ("quadlet", "systemd")),
    "vllm_version": _vllm_version,
    "executor_backend": _one_of("executor_backend", "backend", ("mp", "ray")),
    "max_model_len": _max_model_len,
    **{key: partial(_as_int, key, minimum=minimum) for key, minimum in INT_KEYS.items()},
    **{key: partial(validate.port, _name(key)) for key in sorted(PORT_KEYS)},
    **{key: partial(_as_float, key) for key in sorted(FLOAT_KEYS)},
    **{key: partial(_as_bool, key) for key in sorted(BOOL_KEYS)},
    "host": partial(validate.host, _name("host")),
    "extra_args": _extra_args,
    "podman_args": _texts("podman_args"),
    "devices": _devices,
    "ulimits": _ulimits,
    "cache_dir": partial(validate.path, _name("cache_dir")),
    "entrypoint": _entrypoint,
    "shm_size": partial(validate.size, _name("shm_size")),
    "env": _env,
    "speculative_config": _speculative_config,
    "build": _build_recipe.build,
    "mounts": _build_recipe.mounts,
}


def _keys(raw: Any) -> dict[str, Any]:
    """The recipe's keys checked as option names, unset (None) values left out."""
    if not isinstance(raw, dict):
        raise _fail(
            "",
            f"expected a dict of vLLM options and deployment keys, got {validate.shown(raw)}",
            "write vllm_recipe as a YAML mapping",
        )
    for key in raw:
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise _fail(
                key if isinstance(key, str) and key.isprintable() else validate.shown(key),
                "not an option name",
                "use vLLM's option name with underscores",
            )
        if key in RESERVED_KEYS:
            raise _fail(
                key, "is set by the collection", f"remove it; it follows {RESERVED_KEYS[key]}"
            )
    return {key: value for key, value in raw.items() if value is not None}


def _each_key(recipe: dict[str, Any]) -> dict[str, Any]:
    """Every key checked on its own: the table's keys in its order, then the other options."""
    others = sorted(recipe.keys() - _CHECKS.keys() - {"image"})
    order = [key for key in _CHECKS if key in recipe] + others
    checked = {
        key: _CHECKS.get(key, partial(_option_value, _name(key)))(recipe[key]) for key in order
    }
    return {**recipe, **checked}


def image(
    value: Any,
    *,
    deploy_mode: str = "quadlet",
    allow_unpinned: bool = False,
    name: str = IMAGE_NAME,
) -> str:
    """The image reference as the plan's lint, the rollout and the image step check it.

    Quadlet (the default mode) runs the image by digest: a tag alone is refused, as an
    unpinned weights revision is, unless ``allow_unpinned`` (``serve_allow_unpinned_image``);
    then the head resolves the tag once to the digest it names (``container_image``) and
    everything after it uses that digest. A digest, when given, is always a sha256.
    """
    reference = validate.image_reference(name, value, require_digest=False)
    pinned = "@" in reference
    if deploy_mode != "quadlet" or (allow_unpinned and not pinned):
        return reference
    if not pinned:
        raise ValidationError(
            name,
            f"{reference}: not pinned by digest (a tag can name another image tomorrow)",
            f"pin it as NAME[:TAG]@sha256:<64 hex>, or set {ALLOW_UNPINNED_IMAGE}: true to pull the"
            " tag once on the head and serve the digest it names then",
        )
    return validate.image_reference(name, reference, require_digest=True)


def unpinned_image(reference: str, resolved: str = "", host: str = "the head") -> dict[str, Any]:
    """The warning a run gives for a tag it accepted (:func:`image`), with the digest once known."""
    name, _, _ = reference.partition("@")
    if resolved:
        message = (
            f"{IMAGE_NAME} {name} is not pinned by digest: {host} resolved it to {resolved}, which this"
            " run serves and records"
        )
        fix = f"pin it: {IMAGE_NAME}: {resolved} (then {ALLOW_UNPINNED_IMAGE}: false)"
    else:
        message = (
            f"{IMAGE_NAME} {name} is not pinned by digest ({ALLOW_UNPINNED_IMAGE}): the rollout"
            " pulls the tag once on the head and serves the digest it names then"
        )
        fix = f"pin it as {name}@sha256:<64 hex> (the rollout names the digest it resolved)"
    return finding("image_unpinned", "warning", message, fix)


def _image(recipe: dict[str, Any], required: bool, allow_unpinned: bool = False) -> None:
    """The image, pinned by digest for Quadlet (the default mode); see :func:`image`."""
    mode = recipe.get("deploy_mode", "quadlet")
    if "image" in recipe or (required and mode == "quadlet"):
        recipe["image"] = image(
            recipe.get("image"), deploy_mode=mode, allow_unpinned=allow_unpinned
        )


def _refused(check: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run ``check``; any refusal becomes a :class:`RecipeError` naming ``vllm_recipe.<key>``."""
    try:
        return check(*args)
    except RecipeError:
        raise
    except ValidationError as exc:
        raise RecipeError(exc.name, exc.problem, exc.fix) from None


def normalise(raw: dict[str, Any], plan_max_model_len: int | None = None) -> dict[str, Any]:
    """Return the canonical recipe: defaults filled, types coerced, ``plan`` resolved.

    Every value that reaches a unit file, a command line or a path is validated
    here, once (``_validate``); a refusal is a :class:`RecipeError` naming
    ``vllm_recipe.<key>``, the offending character or value and the fix.
    Normalising an already normalised recipe returns it unchanged, so a recipe
    read back from a node (for a rollback) hashes exactly as when written.
    """
    return _refused(_normalise, raw, plan_max_model_len)


def check(raw: Any, allow_unpinned_image: bool = False) -> dict[str, Any]:
    """The keys a recipe sets, each checked as :func:`normalise` checks it.

    For a recipe that need not be whole (the plan's lint, ``kv_budget``): no key is
    required, no default is added and ``max_model_len: plan`` stays ``plan``; a refusal
    is the same :class:`RecipeError`, so a value the rollout would refuse is refused
    before the plan is saved. ``allow_unpinned_image`` is ``serve_allow_unpinned_image``:
    a tag the rollout will resolve on the head is accepted (:func:`image`).
    """
    return _refused(_check, raw, allow_unpinned_image)


def _check(raw: Any, allow_unpinned_image: bool) -> dict[str, Any]:
    recipe = _each_key(_keys(raw))
    _image(recipe, required=False, allow_unpinned=allow_unpinned_image)
    return recipe


def _normalise(raw: Any, plan_max_model_len: Any) -> dict[str, Any]:
    recipe = _keys(raw)
    for key, default in {**DEPLOY_DEFAULTS, **VLLM_DEFAULTS}.items():
        recipe.setdefault(key, json.loads(json.dumps(default)))
    for key in ("model", "revision"):
        if recipe.get(key) in (None, ""):
            raise _fail(key, "is required", "set the Hugging Face id and its pinned 40-hex commit")
    if recipe["deploy_mode"] == "systemd" and not recipe.get("vllm_version"):
        raise _fail(
            "vllm_version",
            "is required for deploy_mode systemd",
            "set the vLLM release, e.g. 0.32.0",
        )
    recipe.setdefault("served_model_name", recipe["model"])
    recipe = _each_key(recipe)
    for key in ("build", "mounts"):
        if key in recipe and recipe["deploy_mode"] != "quadlet":
            raise _fail(key, "needs deploy_mode quadlet (a container image)", f"drop {key} or serve with Quadlet")
    # Units run a digest, always: a tag (serve_allow_unpinned_image) reaches here resolved.
    _image(recipe, required=True)
    if recipe.get("max_model_len") == "plan":
        if plan_max_model_len is None:
            raise _fail(
                "max_model_len",
                "is 'plan' but no plan result is available",
                "run the plan stage first (--tags plan; the rollout passes the saved plan) or set a number",
            )
        recipe["max_model_len"] = validate.integer(
            "plan_max_model_len", plan_max_model_len, minimum=1, maximum=MAX_INT
        )
    if not recipe["ipc_host"]:
        recipe.setdefault("shm_size", "1g")
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


def problems(recipe: dict[str, Any]) -> list[dict[str, Any]]:
    """Deployment defects this module can see in a normalised recipe (F14, F17), as findings
    with ``blocking`` (an error stops the start; an asked ``privileged: true`` only warns).

    Capacity lint (F1, F3, F12, F15...) belongs to the plan's lint.
    """
    found = []
    podman = recipe["podman_args"]
    ipc_host = recipe["ipc_host"] or any(a in ("--ipc=host",) for a in podman)
    if ipc_host and (recipe.get("shm_size") or any(a.startswith("--shm-size") for a in podman)):
        found.append(
            finding(
                "F14",
                "error",
                "ipc_host with shm_size: Podman refuses --ipc=host together with ShmSize= at run time",
                "choose host IPC (drop shm_size) or a container /dev/shm size (ipc_host: false)",
                blocking=True,
            )
        )
    if recipe["privileged"] or "--privileged" in podman:
        found.append(
            finding(
                "F17",
                "warning" if recipe["privileged"] else "error",
                "--privileged grants every device and capability",
                "list the GPUs in devices (AddDevice=nvidia.com/gpu=N) and keep privileged: false",
                blocking=not recipe["privileged"],
            )
        )
    return found
