# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Failure-catalog lint of a recipe against the KV plan and the host's limits.

Each finding is ``{id, severity, message}`` with the catalog id (F1, F2, F3,
F6, F8, F9, F12, F14, F15, F16, F17); the message names the recipe key and
the fix. The recipe uses vLLM's option names with underscores (the serve
engineer's ``_recipe.py`` owns the schema; this file only reads it).
"""

from __future__ import annotations

import re
from typing import Any

GIB = 1024**3

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNLIMITED = ("unlimited", "infinity", "-1")


class RecipeInputError(ValueError):
    """A recipe or host_limits value has the wrong type; the message names it."""


def parse_size(value: Any, name: str) -> int:
    """Bytes from ``1g``/``512m``/``8GiB``/an integer (binary units, as Podman reads them)."""
    if isinstance(value, bool):
        raise RecipeInputError(f"{name} must be a size such as 1g or a byte count, got {value!r}")
    if isinstance(value, int | float):
        return int(value)
    match = _SIZE.match(str(value))
    if not match:
        raise RecipeInputError(f"{name} must be a size such as 1g or a byte count, got {value!r}")
    factor = {"": 1, "k": 1024, "m": 1024**2, "g": GIB, "t": 1024**4}[match.group(2).lower()]
    return int(float(match.group(1)) * factor)


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
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RecipeInputError(f"recipe.{key} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError as exc:
        raise RecipeInputError(f"recipe.{key} must be an integer, got {value!r}") from exc


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _v(fid: str, severity: str, message: str) -> dict[str, str]:
    return {"id": fid, "severity": severity, "message": message}


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
                    " kv_cache_memory_bytes and let the profiler size the cache (seed 000:"
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
        pool = int(float(recipe["kv_offloading_size"]) * GIB)
    except (TypeError, ValueError) as exc:
        raise RecipeInputError(
            f"recipe.kv_offloading_size must be GiB as a number, got {recipe['kv_offloading_size']!r}"
        ) from exc
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
