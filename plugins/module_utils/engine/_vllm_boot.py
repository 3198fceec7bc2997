# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a vLLM boot reports besides the KV cache size: who speaks, the engine's
configuration, the older reports (V0 blocks and memory lines) and what the start cost.

Pure functions used by ``_vllm_log.parse_log``; no AnsibleModule. Every pattern
here was read off real logs pasted into public issues
(``tests/unit/fixtures/vllm-logs/public-*``).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._log_text import (
    count as _int,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._log_text import (
    number as _flt,
)

_FLT = r"[\d.]+"
# vLLM's block size when the log does not state it (CacheConfig.block_size).
DEFAULT_BLOCK_SIZE = 16

# Who speaks: a rank in the prefix, in every era's spelling, else the process.
_TP = re.compile(r"\((?:\w*?_)?(?:DP(\d+)_)?(?:PP(\d+)_)?TP(\d+)\b|\(\w+ TP(\d+) pid=")
_RANK_WORDS = (
    re.compile(r"\[rank(\d+)\]"),
    re.compile(r"\brank=\[?(\d+)\]?"),
    re.compile(r"\bWorker[ _]TP(\d+)\b"),
)
_PID_PREFIX = re.compile(r"\((\w+)(?: [^()]{0,40}?)? ?pid=(\d+)(?:, ip=([^)\s]{1,64}))?\)")
# processes that are not a rank: the API server, the engine core, Ray's bare "(pid=…)"
_NOT_A_RANK = re.compile(r"^(?:APIServer|ApiServer|EngineCore\w*|LLMRayActor|raylet)$")
_ASSIGNED = re.compile(r"\brank (\d+) in world size \d+ is assigned as")

# V0 and early V1: capacity in blocks ("#" is sometimes lost in a paste).
_BLOCKS = re.compile(
    r"(?:#\s*)?\b(GPU|CUDA|XPU|NPU|HPU|TPU|CPU|Neuron) blocks:\s*([\d,]+)"
    r"(?:,\s*#?\s*CPU blocks:\s*([\d,]+))?",
    re.IGNORECASE,
)
_BLOCK_SIZE = re.compile(r"(?:\bblock_size=|'block_size': |--block-size[ =])(\d+)")
# V0 memory lines, per worker.
_KV_CACHE_SIZE = re.compile(rf"\bkv_cache_size=(-?{_FLT})\s*GiB")
_REST_RESERVED = re.compile(rf"the rest of the memory reserved for KV Cache is (-?{_FLT})\s*GiB")
# The engine's configuration line (V0 and V1) and the resolved context.
_ENGINE_CONFIG = re.compile(r"Initializing an? (?:V\d )?LLM engine \([^)]*\) with config:")
_CONFIG_KEYS = re.compile(
    r"\b(max_seq_len|max_model_len|tensor_parallel_size|pipeline_parallel_size)=(\d+)"
)
_USING_MAX_LEN = re.compile(r"Using max model len (\d+)")

# What the start cost: weights, load, compile, graph capture, profiling.
_COSTS = (
    ("weights_gib", re.compile(rf"(?:Model loading took|Loading model weights took) ({_FLT}) ?G")),
    ("weights_gib", re.compile(rf"\bmodel weights take ({_FLT}) ?GiB")),
    ("load_seconds", re.compile(rf"Model loading took {_FLT} ?Gi?B(?: memory)? and ({_FLT}) sec")),
    ("weights_load_seconds", re.compile(rf"Loading weights took ({_FLT}) seconds")),
    ("dynamo_seconds", re.compile(rf"Dynamo bytecode transform time: ({_FLT}) s")),
    ("graph_compile_seconds", re.compile(rf"Compiling a graph for general shape takes ({_FLT}) s")),
    (
        "compiled_graph_cache_seconds",
        re.compile(rf"Directly load the compiled graph\(s\).{{0,120}}? took ({_FLT}) s"),
    ),
    ("compile_seconds", re.compile(rf"torch\.compile takes ({_FLT}) s in total")),
    ("graph_capture_seconds", re.compile(rf"Graph capturing finished in ({_FLT}) secs?")),
    (
        "graph_capture_gib",
        re.compile(rf"Graph capturing finished in {_FLT} secs?, took ({_FLT}) GiB"),
    ),
    ("profiling_seconds", re.compile(rf"Memory profiling takes ({_FLT}) seconds")),
)
COST_KEYS = tuple(dict.fromkeys(key for key, _ in _COSTS))
_NOTES = (
    (
        re.compile(r"skipped memory profiling|as specified by kv_cache_memory_bytes", re.I),
        "profiling skipped: the KV size was given (kv_cache_memory_bytes), gpu_memory_utilization"
        " not applied",
    ),
    (
        re.compile(r"Directly load the compiled graph"),
        "compiled graphs loaded from vLLM's torch.compile cache (a cold cache compiles longer)",
    ),
    (
        re.compile(r"enforce_eager(?:=|': )True|Cudagraph is disabled under eager mode"),
        "eager mode: no CUDA graphs captured",
    ),
)


def line_worker(line: str, pid_ranks: dict[str, int]) -> tuple[int | None, str | None]:
    """The rank a line speaks for and a label that keeps two ranks apart.

    ``(Worker_TP1 pid=…)``, ``(VllmWorker TP1 pid=…)``, ``(Worker_PP1_TP0 …)``,
    ``[rank1]``, ``rank=[1]``: the rank is stated. ``(RayWorkerWrapper pid=…, ip=…)``,
    ``(VllmWorkerProcess pid=…)``, ``(Worker pid=…)``: only the process is; it is the
    rank vLLM assigned it (``rank N in world size M is assigned as``) when that was
    logged, else a rank of its own, never merged with another. Lines of the API
    server or engine core, or without a prefix, return ``(None, None)``.
    """
    match = _TP.search(line)
    if match:
        pp = match.group(2)
        tp = _int(match.group(3) or match.group(4))
        return tp, (f"PP{pp}_TP{tp}" if pp and pp != "0" else f"TP{tp}")
    prefixes = [m for m in _PID_PREFIX.finditer(line[:400]) if not _NOT_A_RANK.match(m.group(1))]
    if prefixes:
        last = prefixes[-1]
        label = f"pid={last.group(2)}" + (f"@{last.group(3)}" if last.group(3) else "")
        rank = pid_ranks.get(label)
        if rank is not None:
            return rank, f"TP{rank}"
        return None, label
    for pattern in _RANK_WORDS:
        match = pattern.search(line)
        if match:
            rank = _int(match.group(1))
            return rank, f"TP{rank}"
    return None, None


def learn_rank(line: str, pid_ranks: dict[str, int]) -> None:
    """Remember which rank a process was assigned (``rank 1 in world size 8 …``)."""
    match = _ASSIGNED.search(line)
    if not match:
        return
    _, label = line_worker(line, {})
    if label and label.startswith("pid="):
        pid_ranks[label] = _int(match.group(1))


def new_start() -> dict[str, Any]:
    return {**dict.fromkeys(COST_KEYS), "notes": []}


def read_costs(line: str, start: dict[str, Any]) -> None:
    """Load and start costs; per key the largest over the ranks (the slowest rank gates)."""
    for key, pattern in _COSTS:
        match = pattern.search(line)
        if match:
            value = _flt(match.group(1))
            if start[key] is None or value > start[key]:
                start[key] = value
    for pattern, note in _NOTES:
        if note not in start["notes"] and pattern.search(line):
            start["notes"].append(note)


def read_blocks(line: str) -> tuple[str, int] | None:
    """``# GPU blocks: N, # CPU blocks: M`` (V0, early V1): the device and N."""
    match = _BLOCKS.search(line)
    if not match:
        return None
    device = match.group(1).upper()
    return ("GPU" if device == "CUDA" else device), _int(match.group(2))


def read_block_size(line: str) -> int | None:
    match = _BLOCK_SIZE.search(line)
    return _int(match.group(1)) if match else None


def read_kv_memory(line: str) -> float | None:
    """V0's KV memory of the worker that printed the line (may be negative: nothing left)."""
    match = _REST_RESERVED.search(line) or _KV_CACHE_SIZE.search(line)
    if not match:
        return None
    text = match.group(1)
    return -_flt(text[1:]) if text.startswith("-") else _flt(text)


def read_engine_config(line: str) -> dict[str, int]:
    """``max_seq_len=``, ``tensor_parallel_size=``… of the engine's config line."""
    found: dict[str, int] = {}
    if _ENGINE_CONFIG.search(line):
        for key, value in _CONFIG_KEYS.findall(line):
            name = "max_model_len" if key == "max_seq_len" else key
            found.setdefault(name, _int(value))
    match = _USING_MAX_LEN.search(line)
    if match:
        found["max_model_len"] = _int(match.group(1))
    return found


# vLLM prints these GiB figures with two decimals (0.005 GiB either way); a printed figure
# calibrates only when that is within 2 % of it (from 0.25 GiB up).
PRINTED_GIB_ERROR = 0.005
PRINTED_GIB_TOLERANCE = 0.02


def _pinned_error_points(
    common: dict[str, Any], requested: int, estimate: int, needed: float | None, kv_gib: float
) -> list[dict[str, Any]]:
    """The error's points when the caller knows the KV memory exactly (a pinned KV size).

    vLLM's estimate is the longest length that memory holds: that point is exact. The
    needed memory at the requested length is kept only when its printed figure is
    precise enough (a 4 MiB pin prints as 0.00 GiB available and 0.01 GiB needed).
    """
    points = []
    if needed and needed > kv_gib and PRINTED_GIB_ERROR / needed <= PRINTED_GIB_TOLERANCE:
        points.append(
            {
                **common,
                "max_model_len": requested,
                "kv_tokens": requested,
                "kv_memory_gib": needed,
                "memory_observed": False,
                "error_point": "needed",
            }
        )
    points.append(
        {
            **common,
            "max_model_len": estimate,
            "kv_tokens": estimate,
            "kv_memory_gib": kv_gib,
            "available_kv_gib": kv_gib,
            "error_point": "available",
        }
    )
    return points


def error_observations(
    boot: dict[str, Any], base: dict[str, Any], kv_memory_gib: float | None
) -> list[dict[str, Any]]:
    """Calibration points from a start that failed for lack of KV (``source: error_report``).

    ``boot`` is a boot summary of ``parse_log``. V1 says the requested length
    needs X GiB and estimates the longest length the available Y GiB holds: two
    points of ``a + b*L``, each one full-length request in that memory
    (``kv_tokens = max_model_len``). The needed memory is vLLM's computation, not
    memory any rank had (``memory_observed: false``). With ``kv_memory_gib`` (a pinned KV
    size, exact) the available point uses it (:func:`_pinned_error_points`). V0 states the capacity in
    tokens, which does not depend on the length: one point with
    ``constant_per_token``.
    """
    requested = boot["requested_max_model_len"]
    estimate = boot["estimated_max_model_len"]
    needed, available = boot["kv_needed_gib"], boot["kv_available_gib"]
    common = {**base, "source": "error_report", "max_concurrency": 1.0}
    if requested and estimate and kv_memory_gib is not None and kv_memory_gib > 0:
        return _pinned_error_points(common, requested, estimate, needed, kv_memory_gib)
    if requested and estimate and needed and available and needed > available > 0:
        return [
            {
                **common,
                "max_model_len": requested,
                "kv_tokens": requested,
                "kv_memory_gib": needed,
                "memory_observed": False,
                "error_point": "needed",
            },
            {
                **common,
                "max_model_len": estimate,
                "kv_tokens": estimate,
                "kv_memory_gib": available,
                "available_kv_gib": available,
                "error_point": "available",
            },
        ]
    capacity = boot["kv_capacity_tokens"]
    if requested and capacity:
        entry = {
            **common,
            "max_model_len": requested,
            "kv_tokens": capacity,
            "max_concurrency": round(capacity / requested, 4),
            "constant_per_token": True,
            "error_point": "capacity",
        }
        memories = [e["gib"] for e in boot["available_kv_gib"] if e["gib"] > 0]
        memory = kv_memory_gib if kv_memory_gib is not None else min(memories, default=None)
        if memory is not None:
            entry["kv_memory_gib"] = memory
        return [entry]
    return []


def to_observations(
    parsed: dict[str, Any],
    host: str,
    recorded_at: str,
    recipe_hash: str | None = None,
    kv_memory_gib: float | None = None,
) -> list[dict[str, Any]]:
    """Observation entries for the last boot that reported capacity or failed for lack of KV.

    A boot that started gives one entry per rank (``source: boot``). A start that
    failed for KV gives the calibration points of its error (``source:
    error_report``, see ``_vllm_boot.error_observations``); a V0 failure that
    logged its capacity gives that capacity. ``kv_memory_gib`` is the KV memory
    per rank when the caller knows it (for example ``VLLM_CPU_KVCACHE_SPACE`` or
    explicit ``kv_cache_memory_bytes``); otherwise the boot's reserved or
    available KV memory is used when logged. Entries of V0-style reports (blocks,
    capacity in tokens) carry ``constant_per_token: true``: their token count
    does not depend on ``max_model_len``.
    """
    boot = next(
        (
            b
            for b in reversed(parsed["boots"])
            if b["kv_cache_tokens"] is not None or b["kv_insufficient"]
        ),
        None,
    )
    if boot is None:
        return []
    base = {
        "recorded_at": recorded_at,
        "recipe_hash": recipe_hash,
        "host": host,
        "rank": None,
        "version": boot["version"],
        "profiling_skipped": boot["profiling_skipped"],
    }
    if boot["kv_cache_tokens"] is None:
        return error_observations(boot, base, kv_memory_gib)
    if boot["max_model_len"] is None:
        return []
    per_worker = {entry["worker"]: entry for entry in boot["available_kv_gib"]}
    entries = []
    for worker in per_worker or [None]:
        logged = per_worker.get(worker)
        memory = kv_memory_gib
        if memory is None:
            memory = boot["kv_reserved_gib"] if boot["profiling_skipped"] else None
            memory = memory if memory is not None else (logged or {}).get("gib")
        entry: dict[str, Any] = {
            **base,
            "rank": logged["rank"] if logged else 0,
            "max_model_len": boot["max_model_len"],
            "kv_tokens": boot["kv_cache_tokens"],
            "max_concurrency": boot["max_concurrency"],
            "source": "error_report" if boot["kv_insufficient"] else "boot",
        }
        if logged and logged["worker"] != f"TP{logged['rank']}":
            entry["worker"] = logged["worker"]
        if boot["constant_per_token"]:
            entry["constant_per_token"] = True
        if logged and logged["gib"] > 0:
            entry["available_kv_gib"] = logged["gib"]
        if memory is not None and memory > 0:
            entry["kv_memory_gib"] = memory
        entries.append(entry)
    return entries
