# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Failure-catalog lint of a recipe against the KV plan and the host's limits.

Each finding is ``{id, severity, message}`` with the catalog id (F1, F2, F3,
F6, F8, F9, F12, F14, F15, F16, F17, F27); the message names the recipe key and
the fix. The recipe uses vLLM's option names with underscores (``common/_recipe.py``
owns the schema; this file only reads it).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding

GIB = 1024**3
# 1 EiB: more memory than any node holds; a larger size is a typo or garbage.
MAX_BYTES = 2**60

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNLIMITED = ("unlimited", "infinity", "-1")


class RecipeInputError(validate.InputError):
    """A recipe or host_limits value has the wrong type; the message names it."""


def parse_size(value: Any, name: str) -> int:
    """Bytes from ``1g``/``512m``/``8GiB``/a finite number (binary units, as Podman reads them).

    A negative size or one beyond ``MAX_BYTES`` is refused: no node holds it, so it is a typo
    or garbage read from a tool, never a limit to plan against.
    """
    if isinstance(value, bool):
        raise RecipeInputError(f"{name} must be a size such as 1g or a byte count, got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float):
        size = int(validate.number(name, value))
    else:
        match = _SIZE.match(str(value)) if len(str(value)) <= 40 else None
        if not match:
            raise RecipeInputError(
                f"{name} must be a size such as 1g or a byte count, got {validate.shown(value)}"
            )
        factor = {"": 1, "k": 1024, "m": 1024**2, "g": GIB, "t": 1024**4}[match.group(2).lower()]
        size = int(float(match.group(1)) * factor)
    if not 0 <= size <= MAX_BYTES:
        raise RecipeInputError(
            f"{name} must be a size from 0 to {MAX_BYTES} bytes (1 EiB), got {validate.shown(value)};"
            " give the size in bytes or with a unit such as 64g"
        )
    return size


def _limit(value: Any, name: str) -> int | None:
    """Bytes, or None for unlimited."""
    if value is None:
        return None
    if str(value).strip().lower() in _UNLIMITED:
        return None
    size = parse_size(value, name)
    return None if size < 0 else size


def _int(recipe: dict[str, Any], key: str) -> int | None:
    value = recipe.get(key)
    if value is None:
        return None
    return validate.whole(f"recipe.{key}", value, error=RecipeInputError)


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


# Where each finding is fixed; the message already says what to change.
RECIPE_FIX = "change vllm_recipe as the message says, then run the plan again (--tags plan)"
FIXES = {
    "F2": "set vllm_recipe.max_model_len to the planned length or to plan, then run --tags plan",
    "F12": "set vllm_recipe.max_model_len to the planned length or to plan, then run --tags plan",
    "F16": "size the offload pool to the node (vllm_recipe.kv_offloading_size) or grow the limit"
    " the message names, then run --tags preflight,plan",
    "F27": "change vllm_recipe's parallel sizes or devices, or the hosts of vllm_cluster, then run"
    " --tags plan",
}


def _v(fid: str, severity: str, message: str) -> dict[str, str]:
    return finding(fid, severity, message, FIXES.get(fid, RECIPE_FIX))


def recipe_max_model_len(recipe: dict[str, Any]) -> int | None:
    """The recipe's explicit context, or None when it is ``plan`` or unset."""
    value = recipe.get("max_model_len")
    if value is None or (isinstance(value, str) and value.strip().lower() == "plan"):
        return None
    return _int(recipe, "max_model_len")


def speculative_settings(recipe: dict[str, Any]) -> tuple[int, bool]:
    """``(num_speculative_tokens, parallel_drafting)`` from ``recipe.speculative_config``."""
    config = recipe.get("speculative_config") or {}
    if not isinstance(config, dict):
        raise RecipeInputError("recipe.speculative_config must be a dict (vLLM's JSON form)")
    tokens = config.get("num_speculative_tokens") or 0
    try:
        tokens = int(tokens)
    except (TypeError, ValueError) as exc:
        raise RecipeInputError(
            f"recipe.speculative_config.num_speculative_tokens must be an integer, got {tokens!r}"
        ) from exc
    return tokens, _truthy(config.get("parallel_drafting", False))


def lint_static(recipe: dict[str, Any]) -> list[dict[str, str]]:
    """Findings that need nothing but the recipe: F1, F3, F6, F14, F17."""
    found = []
    if recipe.get("kv_cache_memory_bytes") is not None:
        size = parse_size(recipe["kv_cache_memory_bytes"], "recipe.kv_cache_memory_bytes")
        if recipe.get("gpu_memory_utilization") is not None:
            found.append(
                _v(
                    "F1",
                    "error",
                    f"recipe.kv_cache_memory_bytes ({size / GIB:.2f} GiB) makes vLLM skip memory"
                    f" profiling, so recipe.gpu_memory_utilization"
                    f" ({recipe['gpu_memory_utilization']}) is inert: remove"
                    " kv_cache_memory_bytes and let the profiler size the cache (the two-Spark field report,"
                    " 18,272 tokens hand-sized vs 47,930 profiled)",
                )
            )
        else:
            found.append(
                _v(
                    "F1",
                    "warning",
                    f"recipe.kv_cache_memory_bytes ({size / GIB:.2f} GiB) disables vLLM's memory"
                    " profiling: the cache size is a hand estimate against unmeasured memory;"
                    " remove it and set gpu_memory_utilization unless the plan is calibrated",
                )
            )
    seqs = _int(recipe, "max_num_seqs")
    if seqs is not None and seqs <= 1:
        found.append(
            _v(
                "F3",
                "error",
                f"recipe.max_num_seqs is {seqs}: the endpoint serves one request at a time and"
                " an agent's second caller (tool calls, probes) waits; set max_num_seqs: 4",
            )
        )
    tool_parser = recipe.get("tool_call_parser")
    if (tool_parser or _truthy(recipe.get("enable_auto_tool_choice"))) and not recipe.get(
        "reasoning_parser"
    ):
        found.append(
            _v(
                "F6",
                "error",
                f"recipe.tool_call_parser is {tool_parser!r} but recipe.reasoning_parser is unset:"
                " a reasoning model's chain-of-thought lands in content and corrupts tool calls;"
                " set reasoning_parser (for DeepSeek V4: deepseek_v4)",
            )
        )
    if _truthy(recipe.get("ipc_host")) and recipe.get("shm_size"):
        found.append(
            _v(
                "F14",
                "error",
                f"recipe.ipc_host is true and recipe.shm_size is {recipe['shm_size']!r}: Podman"
                " refuses --ipc=host with ShmSize= at run time; keep one (ipc_host shares the"
                " host's /dev/shm, shm_size sizes a private one)",
            )
        )
    if _truthy(recipe.get("privileged")):
        found.append(
            _v(
                "F17",
                "warning",
                "recipe.privileged is true: the container gets every device and capability;"
                " set privileged: false and grant GPUs with AddDevice=nvidia.com/gpu=N"
                " (and memlock through ulimits) instead",
            )
        )
    return found


def lint_scheduling(recipe: dict[str, Any], scheduled: int | None) -> list[dict[str, str]]:
    """F15: parallel drafting takes scheduler slots from max_num_batched_tokens."""
    batched = _int(recipe, "max_num_batched_tokens")
    seqs = _int(recipe, "max_num_seqs")
    tokens, parallel = speculative_settings(recipe)
    if scheduled is None or batched is None or scheduled >= batched:
        return []
    restore = batched + (tokens - 1) * (seqs or 0)
    return (
        [
            _v(
                "F15",
                "warning",
                f"recipe.speculative_config drafts {tokens} tokens in parallel for"
                f" {seqs} sequences, so vLLM schedules {scheduled} tokens per step instead of"
                f" recipe.max_num_batched_tokens={batched}; raise max_num_batched_tokens to"
                f" {restore} to keep {batched}, or lower num_speculative_tokens or max_num_seqs",
            )
        ]
        if parallel
        else []
    )


def lint_offload(
    recipe: dict[str, Any], host_limits: dict[str, Any] | None
) -> list[dict[str, str]]:
    """F16: the offload pool must fit /dev/shm, memlock and free RAM."""
    if recipe.get("kv_offloading_size") is None:
        return []
    try:
        gib = validate.number("recipe.kv_offloading_size", recipe["kv_offloading_size"], minimum=0)
        pool = int(gib * GIB)
    except (validate.ValidationError, OverflowError):
        raise RecipeInputError(
            f"recipe.kv_offloading_size must be GiB as a finite number, 0 or more, got"
            f" {validate.shown(recipe['kv_offloading_size'])}"
        ) from None
    need = f"recipe.kv_offloading_size={recipe['kv_offloading_size']} GiB ({pool / GIB:.1f} GiB)"
    found = []
    private_shm = recipe.get("shm_size") and not _truthy(recipe.get("ipc_host"))
    if private_shm and recipe.get("deploy_mode", "quadlet") == "quadlet":
        shm = parse_size(recipe["shm_size"], "recipe.shm_size")
        if pool > shm:
            found.append(
                _v(
                    "F16",
                    "error",
                    f"{need} does not fit the container's /dev/shm (recipe.shm_size="
                    f"{recipe['shm_size']}): raise shm_size above the pool or use ipc_host",
                )
            )
    if not host_limits:
        found.append(
            _v(
                "F16",
                "warning",
                f"{need} cannot be checked against /dev/shm, memlock and free RAM: pass"
                " host_limits (from preflight) so the pool is verified before start",
            )
        )
        return found
    checks = (
        (
            "shm_free_bytes",
            "free space in /dev/shm",
            "remove orphan /dev/shm/vllm_offload_*.mmap"
            " files (see the offload reclaim) or lower kv_offloading_size",
        ),
        (
            "shm_size_bytes",
            "the size of /dev/shm",
            "grow /dev/shm (tmpfs size=) or lower kv_offloading_size",
        ),
        ("mem_available_bytes", "available RAM", "lower kv_offloading_size"),
    )
    for key, what, fix in checks:
        value = host_limits.get(key)
        if value is None:
            continue
        limit = parse_size(value, f"host_limits.{key}")
        if pool > limit:
            found.append(
                _v(
                    "F16",
                    "error",
                    f"{need} exceeds {what} ({limit / GIB:.1f} GiB, host_limits.{key}): {fix}",
                )
            )
    if "memlock_bytes" in host_limits:
        memlock = _limit(host_limits["memlock_bytes"], "host_limits.memlock_bytes")
        if memlock is not None and pool > memlock:
            found.append(
                _v(
                    "F16",
                    "error",
                    f"{need} exceeds the memlock limit ({memlock} bytes, host_limits.memlock_bytes):"
                    " set LimitMEMLOCK=infinity (systemd) or Ulimit=memlock=-1:-1 (Quadlet)",
                )
            )
    return found


def lint_context(
    recipe: dict[str, Any],
    fits: dict[str, float] | None,
    planned: int,
    min_concurrency: float,
) -> list[dict[str, str]]:
    """F2 and F12 for an explicit ``recipe.max_model_len``.

    ``fits`` is the concurrency at that length at the worst, median and best boot.
    """
    length = recipe_max_model_len(recipe)
    if length is None or fits is None:
        return []
    if fits["best"] < 1.0:
        return [
            _v(
                "F12",
                "error",
                f"recipe.max_model_len={length} needs more KV than any observed boot holds"
                f" (best {fits['best']:.2f}x): vLLM refuses to start; set max_model_len to"
                f" {planned} (or plan)",
            )
        ]
    if fits["worst"] < min_concurrency:
        severity = "error" if fits["worst"] < 1.0 else "warning"
        return [
            _v(
                "F2",
                severity,
                f"recipe.max_model_len={length} fits the best boot ({fits['best']:.2f}x) but not"
                f" the worst ({fits['worst']:.2f}x < min_concurrency {min_concurrency:g}):"
                f" starts will fail intermittently (F12); set max_model_len to {planned} (or plan)",
            )
        ]
    return []


# --------------------------------------------------------------------------- parallel layout (F27)

# Where the layout's sizes come from in a Hugging Face config.json; multimodal
# checkpoints keep the language model's under ``text_config``.
_GEOMETRY_KEYS = {
    "attention_heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "layers": "num_hidden_layers",
}
# A GPU named one by one in vllm_recipe.devices (CDI name or device node).
_ONE_GPU = re.compile(r"^(?:nvidia\.com/gpu=\d+|/dev/nvidia\d+)(?::.*)?$")


def model_geometry(config: Any) -> dict[str, int]:
    """Heads, KV heads and layers from a ``config.json`` mapping (what is there and positive)."""
    if not isinstance(config, dict):
        return {}
    sources = [config]
    if isinstance(config.get("text_config"), dict):
        sources.insert(0, config["text_config"])
    out: dict[str, int] = {}
    for name, key in _GEOMETRY_KEYS.items():
        for source in sources:
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                out[name] = value
                break
    return out


def gpus_in_devices(devices: Any) -> int | None:
    """GPUs ``vllm_recipe.devices`` hands the engine one by one, or None when not countable.

    ``nvidia.com/gpu=0`` and ``/dev/nvidia0`` count one each; ``nvidia.com/gpu=all``
    or no GPU entry at all leaves the count unknown (None), never a guess.
    """
    if not isinstance(devices, list):
        return None
    named = [d for d in devices if isinstance(d, str) and _ONE_GPU.match(d.strip())]
    if not named or any(isinstance(d, str) and d.strip().endswith("=all") for d in devices):
        return None
    return len(set(named))


def _layout_hint(ranks: int, per_node: int, heads: int | None, layers: int | None) -> str:
    """A TP x PP pair for ``ranks`` ranks: TP within a node, PP across nodes, when the model allows."""
    divisors = [d for d in range(1, ranks + 1) if ranks % d == 0]
    fits = [
        d
        for d in divisors
        if (heads is None or heads % d == 0) and (layers is None or ranks // d <= layers)
    ]
    if not fits:
        return ""
    tp = per_node if per_node in fits else max(fits)
    return f"tensor_parallel_size: {tp} and pipeline_parallel_size: {ranks // tp}"


def lint_parallel(
    recipe: dict[str, Any],
    nodes: int,
    gpus_per_node: int | None = None,
    geometry: dict[str, int] | None = None,
) -> list[dict[str, str]]:
    """F27: the parallel layout does not fit the cluster or the model.

    vLLM runs ``tensor_parallel_size x pipeline_parallel_size`` (x
    ``data_parallel_size``) ranks, ``world_size / nnodes`` of them on each node
    (``nodes``: the hosts of ``vllm_cluster``). The ranks must spread evenly over
    the nodes and, when ``gpus_per_node`` is known, match the GPUs each node
    gives the engine. With the model's ``geometry`` (:func:`model_geometry`)
    the attention and KV heads must divide by TP and every pipeline stage must
    hold a layer.
    """
    tp, pp, dp = _parallel_sizes(recipe, nodes, gpus_per_node)
    geometry = geometry or {}
    heads, kv_heads, layers = (geometry.get(k) for k in ("attention_heads", "kv_heads", "layers"))
    return _spread_findings(tp, pp, dp, nodes, gpus_per_node, heads, layers) + _geometry_findings(
        tp, pp, heads, kv_heads, layers
    )


def _parallel_sizes(
    recipe: dict[str, Any], nodes: Any, gpus_per_node: Any
) -> tuple[int, int, int]:
    """``(tp, pp, dp)`` of the recipe (1 when unset), with the cluster's counts checked."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise RecipeInputError(f"nodes must be the number of hosts in vllm_cluster, got {nodes!r}")
    if gpus_per_node is not None and (
        isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1
    ):
        raise RecipeInputError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")
    sizes = {}
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        value = _int(recipe, key)
        if value is not None and value < 1:
            raise RecipeInputError(f"recipe.{key} must be 1 or more, got {value}")
        sizes[key] = value or 1
    tp, pp, dp = (sizes[k] for k in sizes)
    return tp, pp, dp


def _spread_findings(
    tp: int,
    pp: int,
    dp: int,
    nodes: int,
    gpus_per_node: int | None,
    heads: int | None,
    layers: int | None,
) -> list[dict[str, str]]:
    """The ranks spread evenly over the nodes and match the GPUs each node gives the engine."""
    ranks = tp * pp * dp
    layout = f"tensor_parallel_size x pipeline_parallel_size = {tp} x {pp}"
    layout += f" x data_parallel_size {dp}" if dp > 1 else ""
    found = []
    if ranks % nodes:
        # Unknown GPUs: no more ranks per node than the recipe already asks of some node.
        per_node = gpus_per_node or max(1, ranks // nodes)
        hint = _layout_hint(nodes * per_node, per_node, heads, layers)
        found.append(
            _v(
                "F27",
                "error",
                f"vllm_recipe.{layout} = {ranks} rank{'s' if ranks > 1 else ''} cannot be spread"
                f" evenly over the {nodes} node{'s' if nodes > 1 else ''} of vllm_cluster (vLLM"
                " starts world_size / nnodes ranks on each node, so some ranks would never"
                f" start): set the product to {nodes * per_node}"
                + (f" ({hint})" if hint else "")
                + f", or put {ranks} nodes in vllm_cluster",
            )
        )
    elif gpus_per_node is not None and ranks // nodes != gpus_per_node:
        per_node = ranks // nodes
        hint = _layout_hint(nodes * gpus_per_node, gpus_per_node, heads, layers)
        more = per_node > gpus_per_node
        found.append(
            _v(
                "F27",
                "error" if more else "warning",
                f"vllm_recipe.{layout} = {ranks} ranks over {nodes} node{'s' if nodes > 1 else ''}"
                f" is {per_node} rank{'s' if per_node > 1 else ''} per node, but each node gives"
                f" the engine {gpus_per_node} GPU{'s' if gpus_per_node > 1 else ''}"
                " (vllm_recipe.devices): "
                + (
                    "the extra ranks find no GPU and the start fails"
                    if more
                    else f"{gpus_per_node - per_node} GPU(s) per node stay idle"
                )
                + f"; use {nodes * gpus_per_node} ranks"
                + (f" ({hint})" if hint else "")
                + " or change vllm_recipe.devices",
            )
        )
    return found


def _geometry_findings(
    tp: int, pp: int, heads: int | None, kv_heads: int | None, layers: int | None
) -> list[dict[str, str]]:
    """TP divides the attention heads and shards or replicates the KV heads; PP leaves each
    stage a layer."""
    found = []
    if heads is not None and heads % tp:
        divisors = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        found.append(
            _v(
                "F27",
                "error",
                f"vllm_recipe.tensor_parallel_size {tp} does not divide the model's {heads}"
                " attention heads (config.json num_attention_heads): vLLM refuses to start; use"
                f" one of {divisors} and carry the other ranks with pipeline_parallel_size",
            )
        )
    elif kv_heads is not None and (kv_heads % tp if tp < kv_heads else tp % kv_heads):
        found.append(
            _v(
                "F27",
                "error",
                f"vllm_recipe.tensor_parallel_size {tp} and the model's {kv_heads} KV heads"
                " (config.json num_key_value_heads) neither divide the other: vLLM cannot shard"
                " or replicate the KV heads; use a tensor_parallel_size that divides or is a"
                f" multiple of {kv_heads}",
            )
        )
    if layers is not None and pp > layers:
        found.append(
            _v(
                "F27",
                "error",
                f"vllm_recipe.pipeline_parallel_size {pp} exceeds the model's {layers} layers"
                " (config.json num_hidden_layers): a pipeline stage would hold no layer; set"
                f" pipeline_parallel_size to at most {layers} and carry the other ranks with"
                " tensor_parallel_size",
            )
        )
    return found
