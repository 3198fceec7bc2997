# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one node's serving units need from its memory, and the guards rendered from it (F4, F13).

The plan (``plan.json``) holds the KV memory per rank it planned with, not a node's whole
need, and it is made for the inventory's recipe only, while a rollback starts the previous
one. So a node's need is derived here from the recipe its units start and two facts of the
node, the weight files on its disk and ``MemTotal``; same input, same need, same unit text:

- **workers** on the node: ``ceil(tensor_parallel_size x pipeline_parallel_size / nnodes)``,
  at least 1 (one engine worker per GPU; vLLM's CPU build runs one per rank);
- **weights**: the node's share, the snapshot's weight files (``*.safetensors``, else
  ``*.bin``/``*.pt``/``*.pth``, else ``*.gguf``; links followed, each file once) ``/ nnodes``;
- **KV**: a pinned size per worker (``kv_cache_memory_bytes``, or the CPU build's
  ``env.VLLM_CPU_KVCACHE_SPACE`` in GiB) times the workers. Without one, on unified memory the
  engine takes ``gpu_memory_utilization`` (vLLM's default 0.9) of the pool for weights, KV and
  activations together, so the need is that fraction of ``MemTotal`` instead of weights + KV;
- **offload**: native KV offload (``kv_offloading_size`` GiB, the total over all ranks, in
  ``/dev/shm``): ``/ nnodes``;
- **overhead**: ``overhead_bytes`` per worker (CUDA context, NCCL, the Python processes).

With ``unified_memory`` false (discrete GPUs) weights and KV are device memory, which
``MemAvailable`` does not count: the host need is the overhead and the offload share only.
"Unified" means: the engine's weights and KV live in the memory ``MemAvailable`` counts (GB10,
and vLLM's CPU build in the lab).

The guards: admission (``ExecStartPre``, every node, :mod:`_admission`), on unified memory
page caches dropped before it, ``OOMScoreAdjust=`` for the serving units and a
``localinference.slice`` with ``MemoryHigh``/``MemoryMax`` of need + margin; and the fail-closed
reclaim of orphaned offload files (:mod:`_shm_offload_cli`) before start and after stop when the
recipe offloads KV natively. Which unit carries which line is ``_units``'s business.
No AnsibleModule here.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._gid_start import (
    REFUSAL_MARKER as GID_MARKER,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    parse_meminfo,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._admission import (
    REFUSAL_MARKER as ADMISSION_MARKER,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._admission import (
    rank_need_bytes,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._shm_offload_cli import (
    REFUSAL_MARKER as OFFLOAD_MARKER,
)

GIB = 1024**3
VLLM_DEFAULT_UTILIZATION = 0.9
SLICE = "localinference.slice"
ADMISSION_PROGRAM = "admission"
OFFLOAD_PROGRAM = "shm-offload"
OFFLOAD_DIRECTORY = "/dev/shm"
OFFLOAD_PATTERN = "vllm_offload_*.mmap"
DEFAULT_LIBEXEC = "/usr/local/libexec/localinference"
# Larger than any node this collection serves on; bounds every GiB knob.
MAX_GIB = 65536.0
WEIGHT_GROUPS = ((".safetensors",), (".bin", ".pt", ".pth"), (".gguf",))
# The role variable behind each guards option, so a refusal names what the user set.
ROLE_VARIABLES = {
    "admission": "serve_admission",
    "reserve_gib": "serve_admission_reserve_gib",
    "overhead_gib": "serve_admission_overhead_gib",
    "unified_memory": "serve_unified_memory",
    "oom_score_adjust": "serve_oom_score_adjust",
    "memory_high_margin_gib": "serve_memory_high_margin_gib",
    "memory_max_margin_gib": "serve_memory_max_margin_gib",
    "libexec_dir": "serve_libexec_dir",
    "max_gpu_memory_utilization": "serve_max_gpu_memory_utilization",
}


@dataclass(frozen=True)
class Policy:
    """The role's knobs, validated (sizes in bytes)."""

    admission: bool = True
    reserve_bytes: int = 2 * GIB
    overhead_bytes: int = 4 * GIB
    unified_memory: bool = False
    oom_score_adjust: int = -500
    memory_high_margin_bytes: int = 4 * GIB
    memory_max_margin_bytes: int = 8 * GIB
    libexec_dir: str = DEFAULT_LIBEXEC
    # On unified memory the engine's share of the one pool the OS lives in too.
    max_gpu_memory_utilization: float = 0.85


@dataclass(frozen=True)
class Guards:
    """What the units of one node carry; ``None`` fields are not rendered."""

    need: dict[str, Any]
    admission_argv: list[str] | None
    reclaim_argv: list[str] | None
    oom_score_adjust: int | None
    memory_high_bytes: int | None
    memory_max_bytes: int | None
    # The RoCE GID index resolved at every start (``_gid_start``; the module sets it from
    # the node's fabric): ExecStartPre of every serving unit, which then reads the index
    # from ``_gid_start.ENV_FILE`` instead of a value frozen in its Environment=.
    gid_argv: list[str] | None = None


def _name(key: str) -> str:
    return f"guards.{key} ({ROLE_VARIABLES[key]})"


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = value.strip().lower() if isinstance(value, str) else None
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise validate.ValidationError(
        _name(key), f"expected true or false, got {validate.shown(value)}", "set a boolean"
    )


def _gib(key: str, value: Any) -> int:
    gib = validate.number(_name(key), value, minimum=0, maximum=MAX_GIB)
    return round(gib * GIB)


def parse_policy(raw: Any) -> Policy:
    """A :class:`Policy` from the module's ``guards`` option; refusals name the role variable."""
    if not isinstance(raw, dict):
        raise validate.ValidationError(
            "guards", f"expected a dict, got {validate.shown(raw)}", "pass the role's guards"
        )
    unknown = sorted(set(raw) - set(ROLE_VARIABLES))
    if unknown:
        raise validate.ValidationError(
            "guards",
            f"unknown key {validate.shown(unknown[0])}",
            f"use {', '.join(ROLE_VARIABLES)}",
        )
    base = Policy()
    values: dict[str, Any] = {}
    for key in ("admission", "unified_memory"):
        if raw.get(key) is not None:
            values[key] = _flag(key, raw[key])
    for key, field in (
        ("reserve_gib", "reserve_bytes"),
        ("overhead_gib", "overhead_bytes"),
        ("memory_high_margin_gib", "memory_high_margin_bytes"),
        ("memory_max_margin_gib", "memory_max_margin_bytes"),
    ):
        if raw.get(key) is not None:
            values[field] = _gib(key, raw[key])
    if raw.get("oom_score_adjust") is not None:
        # -1000 exempts the engine from the OOM killer: a runaway prefill on unified memory
        # would then freeze the host instead of ending the engine.
        values["oom_score_adjust"] = validate.integer(
            _name("oom_score_adjust"), raw["oom_score_adjust"], minimum=-999, maximum=1000
        )
    if raw.get("max_gpu_memory_utilization") is not None:
        key = "max_gpu_memory_utilization"
        values[key] = validate.number(
            _name(key), raw[key], above=0, maximum=1, fix="set a fraction such as 0.85"
        )
    if raw.get("libexec_dir") is not None:
        values["libexec_dir"] = validate.path(_name("libexec_dir"), raw["libexec_dir"])
    policy = Policy(**{**base.__dict__, **values})
    if policy.memory_max_margin_bytes < policy.memory_high_margin_bytes:
        raise validate.ValidationError(
            _name("memory_max_margin_gib"),
            f"{policy.memory_max_margin_bytes / GIB:g} GiB is below the high margin"
            f" ({policy.memory_high_margin_bytes / GIB:g} GiB): MemoryMax would sit under"
            " MemoryHigh",
            "set serve_memory_max_margin_gib at least serve_memory_high_margin_gib",
        )
    return policy


# --- the node's facts ------------------------------------------------------------------------


def weights_on_disk(path: str) -> tuple[int, str]:
    """Bytes of the weight files vLLM loads from the snapshot ``path``, and how they were counted.

    Symbolic links (a Hugging Face snapshot's links into ``blobs/``) are followed and each file
    counted once; only the top level is read (``original/`` holds copies vLLM does not load).
    A missing or unreadable directory counts 0 and says so.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        return 0, f"{path} cannot be read ({exc.strerror}): the weights are not counted"
    if stat.S_ISREG(info.st_mode):
        return info.st_size, f"{path} (one file)"
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        return 0, f"{path} cannot be listed ({exc.strerror}): the weights are not counted"
    for suffixes in WEIGHT_GROUPS:
        seen: set[tuple[int, int]] = set()
        total = 0
        for name in names:
            if not name.endswith(suffixes):
                continue
            try:
                entry = os.stat(os.path.join(path, name))
            except OSError:
                continue  # a dangling link holds nothing vLLM could load
            if stat.S_ISREG(entry.st_mode) and (entry.st_dev, entry.st_ino) not in seen:
                seen.add((entry.st_dev, entry.st_ino))
                total += entry.st_size
        if seen:
            return total, f"{len(seen)} *{suffixes[0]} file(s) in {path}"
    return 0, f"no weight files in {path}: the weights are not counted"


def mem_total_bytes(meminfo: str) -> int:
    """``MemTotal`` of ``/proc/meminfo`` in bytes (preflight's parser); ValueError when there is none."""
    return parse_meminfo(meminfo)["MemTotal"] * 1024


# --- the need ---------------------------------------------------------------------------------


def native_kv_offload(recipe: dict[str, Any]) -> bool:
    """Whether the recipe's engine keeps KV in ``/dev/shm/vllm_offload_*.mmap`` files.

    vLLM's native offload: ``kv_offloading_size`` with ``kv_offloading_backend`` unset or
    ``native``, or a ``kv_transfer_config`` naming the ``OffloadingConnector`` itself.
    """
    if recipe.get("kv_offloading_size") is not None:
        return recipe.get("kv_offloading_backend", "native") in (None, "native")
    config = recipe.get("kv_transfer_config")
    return isinstance(config, dict) and config.get("kv_connector") == "OffloadingConnector"


def workers_on_node(recipe: dict[str, Any], nnodes: int) -> int:
    ranks = int(recipe.get("tensor_parallel_size", 1)) * int(
        recipe.get("pipeline_parallel_size", 1)
    )
    return max(1, math.ceil(ranks / max(1, nnodes)))


def _pinned_kv(recipe: dict[str, Any]) -> tuple[int | None, str]:
    if recipe.get("kv_cache_memory_bytes") is not None:
        return int(recipe["kv_cache_memory_bytes"]), "kv_cache_memory_bytes"
    space = str((recipe.get("env") or {}).get("VLLM_CPU_KVCACHE_SPACE", "")).strip()
    if space.isdigit():
        return int(space) * GIB, "env.VLLM_CPU_KVCACHE_SPACE"
    return None, ""


def node_need(
    recipe: dict[str, Any],
    nnodes: int,
    policy: Policy,
    weights_bytes: int,
    mem_total: int,
) -> dict[str, Any]:
    """This node's memory need in bytes with its parts and one sentence on how it was derived."""
    workers = workers_on_node(recipe, nnodes)
    share = max(1, nnodes)
    overhead = policy.overhead_bytes * workers
    offload = 0
    if native_kv_offload(recipe) and recipe.get("kv_offloading_size") is not None:
        offload = math.ceil(float(recipe["kv_offloading_size"]) * GIB / share)
    pinned, pinned_by = _pinned_kv(recipe)
    weights_total = kv = engine = 0
    if not policy.unified_memory:
        basis = (
            f"discrete GPUs: weights and KV are device memory; {workers} worker(s) x"
            f" {policy.overhead_bytes / GIB:g} GiB overhead"
        )
    elif pinned is not None:
        weights_total = weights_bytes
        kv = pinned * workers
        basis = (
            f"unified memory: 1/{share} of {weights_bytes / GIB:.2f} GiB of weights, {workers} x"
            f" {pinned / GIB:.2f} GiB of KV ({pinned_by}), {workers} x"
            f" {policy.overhead_bytes / GIB:g} GiB overhead"
        )
    else:
        utilization = float(recipe.get("gpu_memory_utilization") or VLLM_DEFAULT_UTILIZATION)
        engine = math.ceil(utilization * mem_total)
        basis = (
            f"unified memory, KV profiled: gpu_memory_utilization {utilization:g} of MemTotal"
            f" {mem_total / GIB:.2f} GiB (weights, KV and activations), {workers} x"
            f" {policy.overhead_bytes / GIB:g} GiB overhead"
        )
    if offload:
        basis += f", {offload / GIB:.2f} GiB of native KV offload in {OFFLOAD_DIRECTORY}"
    total = rank_need_bytes(weights_total, share, kv, overhead + offload + engine)
    return {
        "need_bytes": total,
        "workers": workers,
        "weights_bytes": math.ceil(weights_total / share),
        "kv_bytes": kv,
        "engine_bytes": engine,
        "offload_bytes": offload,
        "overhead_bytes": overhead,
        "unified_memory": policy.unified_memory,
        "basis": basis,
    }


def guards(
    recipe: dict[str, Any],
    host: str,
    nnodes: int,
    policy: Policy,
    weights_bytes: int,
    mem_total: int,
) -> Guards:
    """The guards of one node's units for a normalised recipe."""
    need = node_need(recipe, nnodes, policy, weights_bytes, mem_total)
    admission = None
    if policy.admission:
        admission = [
            f"{policy.libexec_dir}/{ADMISSION_PROGRAM}",
            "--need-bytes",
            str(need["need_bytes"]),
            "--reserve-bytes",
            str(policy.reserve_bytes),
            "--host",
            host,
        ]
        if policy.unified_memory:
            admission.append("--drop-caches")
    reclaim = None
    if native_kv_offload(recipe):
        reclaim = [
            f"{policy.libexec_dir}/{OFFLOAD_PROGRAM}",
            "reclaim",
            "--confirm",
            "--directory",
            OFFLOAD_DIRECTORY,
            "--pattern",
            OFFLOAD_PATTERN,
            "--owner",
            "root",
        ]
    unified = policy.unified_memory
    return Guards(
        need=need,
        admission_argv=admission,
        reclaim_argv=reclaim,
        oom_score_adjust=policy.oom_score_adjust if unified else None,
        memory_high_bytes=need["need_bytes"] + policy.memory_high_margin_bytes if unified else None,
        memory_max_bytes=need["need_bytes"] + policy.memory_max_margin_bytes if unified else None,
    )


# --- the failure path ---------------------------------------------------------------------------


def start_refusals(lines: Iterable[str], limit: int = 3) -> list[str]:
    """The guards' refusal lines in a unit's log (journal prefix cut), last ``limit``, in order.

    A refused unit is retried every ``RestartSec``, so one cause can be logged many times:
    repeats are kept once.
    """
    found: list[str] = []
    for line in lines:
        for marker in (ADMISSION_MARKER, OFFLOAD_MARKER, GID_MARKER):
            at = line.find(marker)
            if at >= 0:
                text = line[at:].strip()
                if text in found:
                    found.remove(text)
                found.append(text)
                break
    return found[-limit:]


def utilization_problems(recipe: dict[str, Any], policy: Policy) -> list[dict[str, Any]]:
    """F4 on unified memory: ``gpu_memory_utilization`` above the profile's cap.

    On GB10 the fraction is of the one pool the OS, the page cache and every other tenant
    share, and vLLM does not hold to it as a hard limit; above the cap a long prefill
    can take the host down with the engine. Discrete GPUs are not capped here.
    """
    asked = recipe.get("gpu_memory_utilization")
    cap = policy.max_gpu_memory_utilization
    if not policy.unified_memory or asked is None or float(asked) <= cap:
        return []
    return [
        finding(
            "F4",
            "error",
            f"vllm_recipe.gpu_memory_utilization {float(asked):g} is above {cap:g}, the cap on"
            " unified memory (serve_max_gpu_memory_utilization): the engine would share the"
            " node's one memory pool with the OS with too little left",
            f"set it to at most {cap:g}, or raise the cap knowingly (docs/failure-catalog.md#f4)",
            blocking=True,
        )
    ]
