# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse what vLLM reports in its log: KV capacity, memory, errors and stats.

Pure functions, no AnsibleModule: used by the ``vllm_log_facts`` module and
unit-tested on the lines the seed reports quote and on real CPU-vLLM logs.
Lines may carry journald, Podman or Ray prefixes; numbers may carry
thousands separators.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils._log_text import (  # noqa: F401 (re-exported)
    MAX_LINE,
    LogEmptyError,
    LogInputError,
    check_log_text,
    decode_log,
)
from ansible_collections.localinference.vllm.plugins.module_utils._log_text import (
    NotAVllmNumber as _Garbage,
)
from ansible_collections.localinference.vllm.plugins.module_utils._log_text import (
    count as _int,
)
from ansible_collections.localinference.vllm.plugins.module_utils._log_text import (
    number as _flt,
)
from ansible_collections.localinference.vllm.plugins.module_utils._log_text import (
    unwrap as _unwrap,
)

GIB = 1024**3

_NUM = r"[\d,]+"
_FLT = r"[\d.]+"

_VERSION_RES = (
    re.compile(r"vLLM API server version\s+v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"\bvLLM version\s+v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"[\u2580-\u259f]\s+version\s+v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"Initializing a V\d LLM engine \(v(\d+\.\d+[\w.+-]*)\)"),
)
_BOOT_RES = (re.compile(r"non-default args:"),)
_ARG = re.compile(
    r"'(max_model_len|kv_cache_memory_bytes|gpu_memory_utilization|max_num_seqs"
    r"|max_num_batched_tokens|tensor_parallel_size)': ([\d.]+)"
)
_KV_SIZE = re.compile(rf"\b(GPU|CPU|XPU|TPU|HPU|NPU) KV cache size:\s*({_NUM}) tokens")
_CONCURRENCY = re.compile(rf"Maximum concurrency for ({_NUM}) tokens per request:\s*({_FLT})x")
_AVAILABLE_KV = re.compile(
    rf"Available KV cache memory:\s*({_FLT}) GiB"
    rf"|(?:Explicitly|Auto) set \(({_FLT})/{_FLT}\) GiB for KV cache"
)
_SKIPPED = re.compile(
    rf"reserved ({_FLT}) GiB memory for KV Cache as specified by kv_cache_memory_bytes",
    re.IGNORECASE,
)
_FREE_MEM = re.compile(
    rf"Free memory on device(?: (?P<device>[\w:]+))? \((?P<free>{_FLT})/(?P<total>{_FLT}) GiB\)"
    rf" on startup.*?utilization (?:is )?\((?P<util>{_FLT}), (?P<req>{_FLT}) GiB\)"
)
_CPU_KV_MEM = re.compile(
    rf"Available memory on node (?P<device>\d+) \((?P<free>{_FLT})/(?P<total>{_FLT}) GiB\) on kv cache"
    rf" allocation is less than requested memory for kv \((?P<kv>-?{_FLT})/(?P<req>{_FLT}) GiB\)"
)
_USAGE = re.compile(
    rf"Actual usage is ({_FLT}) GiB for weight, ({_FLT}) GiB for peak activation, "
    rf"({_FLT}) GiB for non-torch memory, and ({_FLT}) GiB for CUDAGraph memory"
)
_SUGGEST = re.compile(r"--kv-cache-memory-bytes=(\d+)`? \(([\d.]+) GiB\) to (fit|fully)")
_INSUFFICIENT = re.compile(
    rf"max seq len \(({_NUM})\),? \(?({_FLT}) GiB KV\s+cache is needed, which is larger than"
    rf" the available KV\s+cache\s+memory \(({_FLT}) GiB\)"
)
_INSUFFICIENT_OLD = re.compile(
    r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be"
    r" stored in KV cache \((\d+)\)"
)
_ESTIMATED = re.compile(r"estimated maximum model length is (\d+)")
_NO_KV = re.compile(r"No available memory for the cache blocks")
_RANK_RES = (
    re.compile(r"\[rank(\d+)\]"),
    re.compile(r"\brank=\[?(\d+)\]?"),
    re.compile(r"\((?:\w+?_)?(?:PP\d+_)?TP(\d+)\b"),
    re.compile(r"\bWorker[ _]TP(\d+)\b"),
)
_OOM_BYTES = re.compile(r"OOM on device (\d+) while trying to allocate (\d+) bytes")
_OOM_TORCH = re.compile(rf"out of memory\. Tried to allocate ({_FLT}) (GiB|MiB|KiB)")
_OOM_ANY = re.compile(r"OutOfMemoryError|out of memory|\bOOM\b", re.IGNORECASE)
_DIED = re.compile(r"rank=\[?(\d+)\]? died unexpectedly")
_SCHEDULED = re.compile(
    r"max_num_scheduled_tokens is set to (\d+) based on the speculative decoding settings"
)
_STATS_FIELDS = {
    "prompt_throughput": re.compile(rf"Avg prompt throughput:\s*({_FLT}) tokens/s"),
    "generation_throughput": re.compile(rf"Avg generation throughput:\s*({_FLT}) tokens/s"),
    "running": re.compile(r"Running:\s*(\d+) reqs"),
    "waiting": re.compile(r"(?:Waiting|Pending):\s*(\d+) reqs"),
    "kv_cache_usage_pct": re.compile(rf"(?:GPU|CPU|XPU) KV cache usage:\s*({_FLT})%"),
    "prefix_cache_hit_rate_pct": re.compile(
        rf"(?<!External )(?<!external )Prefix cache hit rate:\s*({_FLT})%"
    ),
    "external_prefix_cache_hit_rate_pct": re.compile(
        rf"External prefix cache hit rate:\s*({_FLT})%"
    ),
}
_SPEC_FIELDS = {
    "mean_acceptance_length": re.compile(rf"Mean acceptance length:\s*({_FLT})"),
    "speculative_depth": re.compile(r"Current speculative depth:\s*(\d+)"),
    "accepted_throughput": re.compile(rf"Accepted throughput:\s*({_FLT}) tokens/s"),
    "drafted_throughput": re.compile(rf"Drafted throughput:\s*({_FLT}) tokens/s"),
    "accepted_tokens": re.compile(r"Accepted:\s*(\d+) tokens"),
    "drafted_tokens": re.compile(r"Drafted:\s*(\d+) tokens"),
    "draft_acceptance_rate_pct": re.compile(rf"Avg Draft acceptance rate:\s*({_FLT})%"),
}
_PER_POSITION = re.compile(r"Per-position acceptance rate:\s*([\d.]+(?:,\s*[\d.]+)*)")
_CONTEXT_ERROR = re.compile(
    r"maximum context length is (\d+) tokens\. However, you requested (\d+) output tokens"
    r" and your prompt contains at least (\d+) input tokens"
)
_CONTEXT_LIMIT = re.compile(r"maximum context length is (\d+)|max_model_len=(\d+)")
_MMAP = re.compile(rf"Created mmap file (/\S+?\.mmap) \(({_FLT}) GB\)")
_TRANSFER = re.compile(r"vllm:(kv_offload_(?:store|load)_(?:bytes|time))=([\d.eE+-]+)")
_HTTP = re.compile(r'"(?:GET|POST|PUT|DELETE) (\S+) HTTP/[\d.]+" (\d{3})')
_INIT_TIME = re.compile(rf"init engine \(profile, create kv cache, warmup model\) took ({_FLT}) s")
_ERROR = re.compile(
    r"(OSError: \[Errno \d+\] [^\n]+|(?<!\w)\w{0,80}Error: [^\n]+|RuntimeError[^\n]*"
    r"|Engine core initialization failed[^\n]*)"
)


def line_rank(line: str) -> int | None:
    """The rank a log line speaks for (``[rank1]``, ``rank=[1]``, ``Worker_TP1``)."""
    for pattern in _RANK_RES:
        match = pattern.search(line)
        if match:
            try:
                return _int(match.group(1))
            except _Garbage:
                return None
    return None


def _new_boot(version: str | None) -> dict[str, Any]:
    return {
        "version": version,
        "kv_cache_device": None,
        "kv_cache_tokens": None,
        "max_concurrency": None,
        "concurrency_max_model_len": None,
        "available_kv_gib": {},
        "startup_memory": {},
        "profiling_skipped": False,
        "kv_reserved_gib": None,
        "insufficient": None,
        "estimated_max_model_len": None,
        "oom": [],
        "died_ranks": [],
        "scheduled_tokens": None,
        "init_seconds": None,
        "kv_cache_memory_bytes_suggested": {},
        "args": {},
    }


def _boot_started(boot: dict[str, Any]) -> bool:
    return bool(
        boot["kv_cache_tokens"] is not None
        or boot["max_concurrency"] is not None
        or boot["available_kv_gib"]
        or boot["insufficient"]
        or boot["oom"]
        or boot["profiling_skipped"]
    )


def _ranked(mapping: dict[int, Any]) -> list[Any]:
    return [mapping[rank] for rank in sorted(mapping)]


def _finish_boot(boot: dict[str, Any]) -> dict[str, Any]:
    out = dict(boot)
    out["available_kv_gib"] = [
        {"rank": rank, "gib": gib} for rank, gib in sorted(boot["available_kv_gib"].items())
    ]
    out["startup_memory"] = _ranked(boot["startup_memory"])
    return out


def _parse_stats(line: str) -> dict[str, Any] | None:
    if "throughput" not in line and "Running:" not in line:
        return None
    if "SpecDecoding metrics" in line or "Accepted throughput" in line:
        return None
    found: dict[str, Any] = {}
    for key, pattern in _STATS_FIELDS.items():
        match = pattern.search(line)
        if match:
            value = match.group(1)
            found[key] = _int(value) if key in ("running", "waiting") else _flt(value)
    return found or None


def _parse_spec(line: str) -> dict[str, Any] | None:
    if "acceptance" not in line and "Drafted" not in line:
        return None
    found: dict[str, Any] = {}
    for key, pattern in _SPEC_FIELDS.items():
        match = pattern.search(line)
        if match:
            value = match.group(1)
            found[key] = _int(value) if key.endswith(("_tokens", "_depth")) else _flt(value)
    match = _PER_POSITION.search(line)
    if match:
        found["per_position_acceptance"] = [_flt(v) for v in match.group(1).split(",")]
    return found or None


def _summarise_stats(stats: list[dict[str, Any]], spec: list[dict[str, Any]]) -> dict[str, Any]:
    def peak(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [row[key] for row in rows if key in row]
        return max(values) if values else None

    def last(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [row[key] for row in rows if key in row]
        return values[-1] if values else None

    single = sorted(
        row["generation_throughput"]
        for row in stats
        if row.get("running") == 1 and row.get("generation_throughput", 0) > 0
    )
    median_single = None
    if single:
        mid = len(single) // 2
        median_single = (
            single[mid] if len(single) % 2 else round((single[mid - 1] + single[mid]) / 2, 2)
        )
    return {
        "samples": len(stats),
        "peak_prompt_throughput": peak(stats, "prompt_throughput"),
        "peak_generation_throughput": peak(stats, "generation_throughput"),
        "median_single_request_generation_throughput": median_single,
        "max_running": peak(stats, "running"),
        "max_waiting": peak(stats, "waiting"),
        "peak_kv_cache_usage_pct": peak(stats, "kv_cache_usage_pct"),
        "last_prefix_cache_hit_rate_pct": last(stats, "prefix_cache_hit_rate_pct"),
        "peak_prefix_cache_hit_rate_pct": peak(stats, "prefix_cache_hit_rate_pct"),
        "spec_decode_samples": len(spec),
        "best_mean_acceptance_length": peak(spec, "mean_acceptance_length"),
        "best_draft_acceptance_rate_pct": peak(spec, "draft_acceptance_rate_pct"),
        "last_draft_acceptance_rate_pct": last(spec, "draft_acceptance_rate_pct"),
    }


def context_rejection(line: str) -> dict[str, Any] | None:
    """A context-length 400 from vLLM, with the prompt count marked as a bound.

    vLLM's "your prompt contains at least N input tokens" is derived from the
    limits (N = max_context - requested_output + 1 when that is what it
    printed), so N is a lower bound on the prompt, not a measurement of it.
    """
    match = _CONTEXT_ERROR.search(line)
    if not match:
        return None
    limit, output, prompt = (_int(g) for g in match.groups())
    return {
        "max_context_length": limit,
        "requested_output_tokens": output,
        "prompt_tokens_at_least": prompt,
        "prompt_tokens_is_lower_bound": prompt == limit - output + 1,
    }


def parse_log(text: str) -> dict[str, Any]:
    """Everything this collection reads from a vLLM log, as one dict.

    KV figures describe the last boot in the log; ``boots`` lists every boot
    found (a new boot starts at a version banner or when a second capacity
    report arrives). Stats, HTTP statuses and errors cover the whole text.
    """
    version: str | None = None
    boots: list[dict[str, Any]] = []
    boot = _new_boot(None)
    stats: list[dict[str, Any]] = []
    spec: list[dict[str, Any]] = []
    context_errors: list[dict[str, Any]] = []
    context_limits: list[int] = []
    mmaps: list[dict[str, Any]] = []
    transfer: dict[str, float] = {}
    http: dict[str, int] = {}
    errors: list[str] = []
    unparsed: list[str] = []

    def new_boot() -> None:
        nonlocal boot
        if _boot_started(boot):
            boots.append(boot)
        boot = _new_boot(version)

    for raw in _unwrap(text):
        line = raw.rstrip()[:MAX_LINE]
        if not line:
            continue
        try:
            rank = line_rank(line)
            for pattern in _VERSION_RES:
                match = pattern.search(line)
                if match:
                    if _boot_started(boot):
                        new_boot()
                    version = match.group(1)
                    boot["version"] = version
                    break
            if any(p.search(line) for p in _BOOT_RES):
                if _boot_started(boot):
                    new_boot()
                for key, value in _ARG.findall(line):
                    boot["args"][key] = _flt(value) if "." in value else _int(value)
                if "kv_cache_memory_bytes" in boot["args"]:
                    # explicit KV bytes: vLLM skips profiling (GPU builds also say so in words)
                    boot["profiling_skipped"] = True
                    boot["kv_reserved_gib"] = round(boot["args"]["kv_cache_memory_bytes"] / GIB, 4)
            match = _KV_SIZE.search(line)
            if match:
                if boot["kv_cache_tokens"] is not None:
                    new_boot()
                boot["kv_cache_device"] = match.group(1)
                boot["kv_cache_tokens"] = _int(match.group(2))
            match = _CONCURRENCY.search(line)
            if match:
                if boot["max_concurrency"] is not None:
                    new_boot()
                boot["concurrency_max_model_len"] = _int(match.group(1))
                boot["max_concurrency"] = _flt(match.group(2))
            match = _AVAILABLE_KV.search(line)
            if match:
                key = rank if rank is not None else 0
                if boot["kv_cache_tokens"] is not None:
                    new_boot()
                boot["available_kv_gib"][key] = _flt(match.group(1) or match.group(2))
            match = _SKIPPED.search(line)
            if match:
                boot["profiling_skipped"] = True
                boot["kv_reserved_gib"] = _flt(match.group(1))
            match = _FREE_MEM.search(line)
            if match:
                entry: dict[str, Any] = {
                    "rank": rank if rank is not None else 0,
                    "device": match.group("device"),
                    "free_gib": _flt(match.group("free")),
                    "total_gib": _flt(match.group("total")),
                    "requested_utilization": _flt(match.group("util")),
                    "requested_gib": _flt(match.group("req")),
                    "below_requested": "is less than desired" in line,
                }
                usage = _USAGE.search(line)
                if usage:
                    entry.update(
                        weights_gib=_flt(usage.group(1)),
                        peak_activation_gib=_flt(usage.group(2)),
                        non_torch_gib=_flt(usage.group(3)),
                        cudagraph_gib=_flt(usage.group(4)),
                    )
                boot["startup_memory"][entry["rank"]] = entry
            match = _CPU_KV_MEM.search(line)
            if match:
                key = rank if rank is not None else 0
                boot["startup_memory"][key] = {
                    "rank": key,
                    "device": f"node {match.group('device')}",
                    "free_gib": _flt(match.group("free")),
                    "total_gib": _flt(match.group("total")),
                    "requested_utilization": None,
                    "requested_gib": _flt(match.group("req")),
                    "requested_kv_gib": _flt(match.group("kv")),
                    "below_requested": True,
                }
            for match in _SUGGEST.finditer(line):
                purpose = "fit_requested" if match.group(3) == "fit" else "fully_utilize"
                boot["kv_cache_memory_bytes_suggested"][purpose] = _int(match.group(1))
            match = _INSUFFICIENT.search(line)
            if match:
                boot["insufficient"] = {
                    "requested_max_model_len": _int(match.group(1)),
                    "kv_needed_gib": _flt(match.group(2)),
                    "kv_available_gib": _flt(match.group(3)),
                }
            match = _INSUFFICIENT_OLD.search(line)
            if match:
                boot["insufficient"] = {
                    "requested_max_model_len": _int(match.group(1)),
                    "kv_needed_gib": None,
                    "kv_available_gib": None,
                }
                boot["estimated_max_model_len"] = _int(match.group(2))
            if _NO_KV.search(line):
                boot["insufficient"] = {
                    "requested_max_model_len": None,
                    "kv_needed_gib": None,
                    "kv_available_gib": 0.0,
                }
            match = _ESTIMATED.search(line)
            if match:
                boot["estimated_max_model_len"] = _int(match.group(1))
            _read_oom(line, rank, boot)
            match = _SCHEDULED.search(line)
            if match:
                boot["scheduled_tokens"] = _int(match.group(1))
            match = _INIT_TIME.search(line)
            if match:
                boot["init_seconds"] = _flt(match.group(1))
            row = _parse_stats(line)
            if row:
                stats.append(row)
            row = _parse_spec(line)
            if row:
                spec.append(row)
            rejection = context_rejection(line)
            if rejection:
                context_errors.append(rejection)
            match = _CONTEXT_LIMIT.search(line)
            if match:
                context_limits.append(_int(match.group(1) or match.group(2)))
            match = _MMAP.search(line)
            if match:
                mmaps.append({"path": match.group(1), "gb": _flt(match.group(2))})
            for key, value in _TRANSFER.findall(line):
                total = transfer.get(key, 0.0) + _flt(value)
                if not math.isfinite(total):
                    raise _Garbage(value)
                transfer[key] = total
            match = _HTTP.search(line)
            if match:
                http[match.group(2)] = http.get(match.group(2), 0) + 1
            message = _error_message(line)
            if message and message not in errors and len(errors) < 20:
                errors.append(message)
        except _Garbage:
            # a vLLM pattern with a number vLLM never prints: count it, do not guess
            unparsed.append(line[:200])

    if _boot_started(boot) or not boots:
        boots.append(boot)
    last = boots[-1]
    insufficient = last["insufficient"] or {}
    finished = [_finish_boot(b) for b in boots]
    result = finished[-1]
    return {
        "version": result["version"] or version,
        "kv_cache_device": result["kv_cache_device"],
        "kv_cache_tokens": result["kv_cache_tokens"],
        "max_concurrency": result["max_concurrency"],
        "concurrency_max_model_len": result["concurrency_max_model_len"],
        "available_kv_gib": result["available_kv_gib"],
        "startup_memory": result["startup_memory"],
        "profiling_skipped": result["profiling_skipped"],
        "kv_reserved_gib": result["kv_reserved_gib"],
        "kv_cache_memory_bytes_suggested": result["kv_cache_memory_bytes_suggested"],
        "kv_insufficient": bool(last["insufficient"]),
        "requested_max_model_len": insufficient.get("requested_max_model_len"),
        "kv_needed_gib": insufficient.get("kv_needed_gib"),
        "kv_available_gib": insufficient.get("kv_available_gib"),
        "estimated_max_model_len": result["estimated_max_model_len"],
        "oom": result["oom"],
        "oom_rank": result["oom"][0]["rank"] if result["oom"] else None,
        "died_ranks": result["died_ranks"],
        "scheduled_tokens": result["scheduled_tokens"],
        "init_seconds": result["init_seconds"],
        "args": result["args"],
        "stats": stats,
        "spec_decode": spec,
        "stats_summary": _summarise_stats(stats, spec),
        "context_errors": context_errors,
        "context_limits": sorted(set(context_limits)),
        "offload_mmaps": mmaps,
        "kv_transfer": transfer,
        "http_status": http,
        "errors": errors,
        "boots": [_boot_summary(b) for b in finished],
        "unparsed_lines": {"count": len(unparsed), "samples": unparsed[:5]},
    }


def _error_message(line: str) -> str | None:
    if any(level in line for level in (" WARNING ", " INFO ", " DEBUG ")):
        return None
    match = _ERROR.search(line)
    if match:
        return match.group(1).strip()
    if " ERROR " in line or "died unexpectedly" in line:
        return line.split("] ", 1)[-1].strip()[-300:]
    return None


def _read_oom(line: str, rank: int | None, boot: dict[str, Any]) -> None:
    match = _DIED.search(line)
    if match and _int(match.group(1)) not in boot["died_ranks"]:
        boot["died_ranks"].append(_int(match.group(1)))
    if not _OOM_ANY.search(line) or "died unexpectedly" in line:
        return
    size: int | None = None
    match = _OOM_BYTES.search(line)
    if match:
        size = _int(match.group(2))
    else:
        match = _OOM_TORCH.search(line)
        if match:
            factor = {"GiB": GIB, "MiB": 1024**2, "KiB": 1024}[match.group(2)]
            size = int(_flt(match.group(1)) * factor)
    if size is None and "OutOfMemoryError" not in line and "allocation failed" not in line:
        return
    if any(o["rank"] == rank and o["bytes"] == size for o in boot["oom"]):
        return
    boot["oom"].append({"rank": rank, "bytes": size, "line": line.strip()[-400:]})


def _boot_summary(boot: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "version",
        "kv_cache_tokens",
        "max_concurrency",
        "concurrency_max_model_len",
        "available_kv_gib",
        "profiling_skipped",
        "kv_reserved_gib",
        "estimated_max_model_len",
    )
    summary = {key: boot[key] for key in keys}
    summary["kv_insufficient"] = bool(boot["insufficient"])
    summary["oom_rank"] = boot["oom"][0]["rank"] if boot["oom"] else None
    return summary


def to_observations(
    parsed: dict[str, Any],
    host: str,
    recorded_at: str,
    recipe_hash: str | None = None,
    kv_memory_gib: float | None = None,
) -> list[dict[str, Any]]:
    """Observation entries (one per rank) for the last boot that reported capacity.

    ``kv_memory_gib`` is the KV memory per rank when the caller knows it (for
    example ``VLLM_CPU_KVCACHE_SPACE`` or explicit ``kv_cache_memory_bytes``);
    otherwise the boot's reserved or available KV memory is used when logged.
    """
    boot = next((b for b in reversed(parsed["boots"]) if b["kv_cache_tokens"] is not None), None)
    if boot is None or boot["concurrency_max_model_len"] is None:
        return []
    per_rank = {entry["rank"]: entry["gib"] for entry in boot["available_kv_gib"]}
    ranks = sorted(per_rank) or [0]
    entries = []
    for rank in ranks:
        memory = kv_memory_gib
        if memory is None:
            memory = boot["kv_reserved_gib"] if boot["profiling_skipped"] else per_rank.get(rank)
        entry: dict[str, Any] = {
            "recorded_at": recorded_at,
            "recipe_hash": recipe_hash,
            "host": host,
            "rank": rank,
            "version": boot["version"],
            "max_model_len": boot["concurrency_max_model_len"],
            "kv_tokens": boot["kv_cache_tokens"],
            "max_concurrency": boot["max_concurrency"],
            "profiling_skipped": boot["profiling_skipped"],
        }
        if rank in per_rank:
            entry["available_kv_gib"] = per_rank[rank]
        if memory is not None:
            entry["kv_memory_gib"] = memory
        entries.append(entry)
    return entries


def recognised(parsed: dict[str, Any]) -> bool:
    """Whether ``parse_log`` found anything vLLM writes (a version, a boot, stats or errors)."""
    return bool(
        parsed["version"]
        or any(b["kv_cache_tokens"] is not None or b["kv_insufficient"] for b in parsed["boots"])
        or parsed["stats"]
        or parsed["spec_decode"]
        or parsed["errors"]
        or parsed["http_status"]
        or parsed["oom"]
        or parsed["context_errors"]
    )
