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

from ansible_collections.localinference.vllm.plugins.module_utils.common._log_text import (  # noqa: F401 (re-exported)
    MAX_LINE,
    LogEmptyError,
    LogInputError,
    check_log_text,
    decode_log,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._log_text import (
    NotAVllmNumber as _Garbage,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._log_text import (
    count as _int,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._log_text import (
    number as _flt,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._log_text import (
    unwrap as _unwrap,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_boot import (
    DEFAULT_BLOCK_SIZE,
    learn_rank,
    line_worker,
    new_start,
    read_block_size,
    read_blocks,
    read_costs,
    read_engine_config,
    read_kv_memory,
    to_observations,  # noqa: F401 (re-exported)
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_stats import (
    parse_spec,
    parse_stats,
    summarise_stats,
)

GIB = 1024**3

_NUM = r"[\d,]+"
_FLT = r"[\d.]+"

_VERSION_RES = (
    re.compile(r"vLLM API server version\s+v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"\bvLLM version\s+v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"[\u2580-\u259f]\s+version\s+v?(\d+\.\d+[\w.+-]*)"),
    re.compile(r"Initializing an? (?:V\d )?LLM engine \(v(\d+\.\d+[\w.+-]*)\)"),
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
_STAMP = re.compile(r"\b\d\d-\d\d \d\d:\d\d:\d\d\b")
_OOM_BYTES = re.compile(r"OOM on device (\d+) while trying to allocate (\d+) bytes")
_OOM_TORCH = re.compile(rf"out of memory\. Tried to allocate ({_FLT}) (GiB|MiB|KiB)")
_OOM_ANY = re.compile(r"OutOfMemoryError|out of memory|\bOOM\b", re.IGNORECASE)
_DIED = re.compile(r"rank=\[?(\d+)\]? died unexpectedly")
# The step's token budget the engine settled on (its default when the recipe sets none).
_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
_SCHEDULED = re.compile(
    r"max_num_scheduled_tokens is set to (\d+) based on the speculative decoding settings"
)
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
    """The rank a log line states (``[rank1]``, ``rank=[1]``, ``Worker_TP1``, ``VllmWorker TP1``)."""
    try:
        return line_worker(line, {})[0]
    except _Garbage:
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
        "max_num_batched_tokens": None,
        "init_seconds": None,
        "kv_cache_memory_bytes_suggested": {},
        "args": {},
        "ranks": {},
        "kv_stamp": None,
        "kv_cache_reports": 0,
        "kv_cache_blocks": None,
        "block_size": None,
        "kv_report": None,
        "kv_capacity_tokens": None,
        "engine_config": {},
        "start": new_start(),
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


def _by_worker(boot: dict[str, Any], mapping: dict[str, Any]) -> list[tuple[str, Any]]:
    """Entries in rank order; processes whose rank was never logged last."""

    def order(label: str) -> tuple[bool, int, str]:
        rank = boot["ranks"].get(label)
        return rank is None, rank if rank is not None else 0, label

    return [(label, mapping[label]) for label in sorted(mapping, key=order)]


def _finish_boot(boot: dict[str, Any]) -> dict[str, Any]:
    out = dict(boot)
    if boot["kv_cache_blocks"] is not None:
        out["kv_cache_tokens"] = boot["kv_cache_blocks"] * (
            boot["block_size"] or DEFAULT_BLOCK_SIZE
        )
    out["block_size_source"] = (
        None if boot["kv_cache_blocks"] is None else ("log" if boot["block_size"] else "default")
    )
    out["available_kv_gib"] = [
        {"rank": boot["ranks"].get(label), "worker": label, "gib": gib}
        for label, gib in _by_worker(boot, boot["available_kv_gib"])
    ]
    out["startup_memory"] = [entry for _, entry in _by_worker(boot, boot["startup_memory"])]
    out["constant_per_token"] = boot["kv_report"] == "blocks" or bool(boot["kv_capacity_tokens"])
    out["start_costs"] = {
        **boot["start"],
        "init_seconds": boot["init_seconds"],
        "profiling_skipped": boot["profiling_skipped"],
    }
    return out


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


def _read_capacity(line: str, boot: dict[str, Any]) -> bool:
    """Read a capacity report into ``boot``; True (and nothing read) when it starts a new boot.

    A second report is a new boot, unless it carries the first one's timestamp:
    then the engine printed one per rank or KV group (Ray with pipeline
    parallelism does), and the smallest is the boot's capacity.
    """
    size = _KV_SIZE.search(line)
    blocks = None if size else read_blocks(line)
    concurrency = _CONCURRENCY.search(line)
    if not (size or blocks or concurrency):
        return False
    stamp_match = _STAMP.search(line)
    stamp = stamp_match.group(0) if stamp_match else None
    same = stamp is not None and stamp == boot["kv_stamp"]
    known = boot["kv_cache_tokens"] is not None or boot["kv_cache_blocks"] is not None
    if not same and (
        ((size or blocks) and known) or (concurrency and boot["max_concurrency"] is not None)
    ):
        return True
    if size:
        boot["kv_cache_device"] = size.group(1)
        boot["kv_cache_tokens"] = _smallest(boot["kv_cache_tokens"], _int(size.group(2)))
        boot["kv_report"] = boot["kv_report"] or "tokens"
    if blocks:
        boot["kv_cache_device"] = blocks[0]
        boot["kv_cache_blocks"] = _smallest(boot["kv_cache_blocks"], blocks[1])
        boot["kv_cache_tokens"] = boot["kv_cache_blocks"] * (
            boot["block_size"] or DEFAULT_BLOCK_SIZE
        )
        boot["kv_report"] = "blocks"
    if size or blocks:
        boot["kv_cache_reports"] += 1
    if concurrency:
        boot["concurrency_max_model_len"] = _int(concurrency.group(1))
        boot["max_concurrency"] = _smallest(boot["max_concurrency"], _flt(concurrency.group(2)))
    boot["kv_stamp"] = boot["kv_stamp"] or stamp
    return False


def _smallest(current: Any, value: Any) -> Any:
    return value if current is None else min(current, value)


class _LogReader:
    """The running state of ``parse_log``: the boot being read, the boots before it, and
    what covers the whole text (stats, HTTP statuses, errors)."""

    def __init__(self) -> None:
        self.version: str | None = None
        self.boots: list[dict[str, Any]] = []
        self.boot = _new_boot(None)
        self.stats: list[dict[str, Any]] = []
        self.spec: list[dict[str, Any]] = []
        self.context_errors: list[dict[str, Any]] = []
        self.context_limits: list[int] = []
        self.mmaps: list[dict[str, Any]] = []
        self.transfer: dict[str, float] = {}
        self.http: dict[str, int] = {}
        self.errors: list[str] = []
        self.unparsed: list[str] = []
        self.pid_ranks: dict[str, int] = {}

    def new_boot(self) -> None:
        if _boot_started(self.boot):
            self.boots.append(self.boot)
        self.boot = _new_boot(self.version)

    def read(self, line: str) -> None:
        """One line; a vLLM pattern with a number vLLM never prints is counted, not guessed."""
        try:
            learn_rank(line, self.pid_ranks)
            rank, worker = line_worker(line, self.pid_ranks)
            if worker is None:
                rank, worker = 0, "TP0"
            self.boot["ranks"].setdefault(worker, rank)
            self._boot_start(line)
            self._kv_cache(line, rank, worker)
            _read_startup_memory(line, self.boot, rank, worker)
            _read_shortfall(line, self.boot)
            _read_oom(line, rank, self.boot)
            _read_timings(line, self.boot)
            self._traffic(line)
        except _Garbage:
            self.unparsed.append(line[:200])

    def _boot_start(self, line: str) -> None:
        """A version banner or the engine's arguments: a new boot when one was already read."""
        for pattern in _VERSION_RES:
            match = pattern.search(line)
            if match:
                if _boot_started(self.boot):
                    self.new_boot()
                self.version = match.group(1)
                self.boot["version"] = self.version
                break
        if any(p.search(line) for p in _BOOT_RES):
            if _boot_started(self.boot):
                self.new_boot()
            boot = self.boot
            for key, value in _ARG.findall(line):
                boot["args"][key] = _flt(value) if "." in value else _int(value)
            if "kv_cache_memory_bytes" in boot["args"]:
                # explicit KV bytes: vLLM skips profiling (GPU builds also say so in words)
                boot["profiling_skipped"] = True
                boot["kv_reserved_gib"] = round(boot["args"]["kv_cache_memory_bytes"] / GIB, 4)
        for key, value in read_engine_config(line).items():
            self.boot["engine_config"].setdefault(key, value)
        size = read_block_size(line)
        if size:
            self.boot["block_size"] = size

    def _kv_cache(self, line: str, rank: int | None, worker: str) -> None:
        """Capacity and KV memory reports; a second report of either starts a new boot."""
        if _read_capacity(line, self.boot):
            self.new_boot()
            _read_capacity(line, self.boot)
        match = _AVAILABLE_KV.search(line)
        memory = _flt(match.group(1) or match.group(2)) if match else read_kv_memory(line)
        if memory is not None:
            if self.boot["kv_cache_tokens"] is not None or self.boot["kv_cache_blocks"] is not None:
                self.new_boot()
                self.boot["ranks"][worker] = rank
            self.boot["available_kv_gib"][worker] = memory
        read_costs(line, self.boot["start"])
        match = _SKIPPED.search(line)
        if match:
            self.boot["profiling_skipped"] = True
            self.boot["kv_reserved_gib"] = _flt(match.group(1))

    def _traffic(self, line: str) -> None:
        """What covers the whole text: stats, rejected contexts, offload, HTTP, errors."""
        row = parse_stats(line)
        if row:
            self.stats.append(row)
        row = parse_spec(line)
        if row:
            self.spec.append(row)
        rejection = context_rejection(line)
        if rejection:
            self.context_errors.append(rejection)
        match = _CONTEXT_LIMIT.search(line)
        if match:
            self.context_limits.append(_int(match.group(1) or match.group(2)))
        match = _MMAP.search(line)
        if match:
            self.mmaps.append({"path": match.group(1), "gb": _flt(match.group(2))})
        for key, value in _TRANSFER.findall(line):
            total = self.transfer.get(key, 0.0) + _flt(value)
            if not math.isfinite(total):
                raise _Garbage(value)
            self.transfer[key] = total
        match = _HTTP.search(line)
        if match:
            self.http[match.group(2)] = self.http.get(match.group(2), 0) + 1
        message = _error_message(line)
        if message and message not in self.errors and len(self.errors) < 20:
            self.errors.append(message)


def _read_startup_memory(line: str, boot: dict[str, Any], rank: int | None, worker: str) -> None:
    """A worker's free memory at start (GPU, or a CPU KV cache node) against what was asked."""
    match = _FREE_MEM.search(line)
    if match:
        entry: dict[str, Any] = {
            "rank": rank,
            "worker": worker,
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
        boot["startup_memory"][worker] = entry
    match = _CPU_KV_MEM.search(line)
    if match:
        boot["startup_memory"][worker] = {
            "rank": rank,
            "worker": worker,
            "device": f"node {match.group('device')}",
            "free_gib": _flt(match.group("free")),
            "total_gib": _flt(match.group("total")),
            "requested_utilization": None,
            "requested_gib": _flt(match.group("req")),
            "requested_kv_gib": _flt(match.group("kv")),
            "below_requested": True,
        }


def _read_shortfall(line: str, boot: dict[str, Any]) -> None:
    """vLLM's refusals for too little KV memory, its estimate and its suggested bytes."""
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
        boot["kv_capacity_tokens"] = _int(match.group(2))
    if _NO_KV.search(line):
        boot["insufficient"] = {
            "requested_max_model_len": None,
            "kv_needed_gib": None,
            "kv_available_gib": 0.0,
        }
    match = _ESTIMATED.search(line)
    if match:
        boot["estimated_max_model_len"] = _int(match.group(1))


def _read_timings(line: str, boot: dict[str, Any]) -> None:
    match = _SCHEDULED.search(line)
    if match:
        boot["scheduled_tokens"] = _int(match.group(1))
    match = _CHUNKED.search(line)
    if match:
        boot["max_num_batched_tokens"] = _int(match.group(1))
    match = _INIT_TIME.search(line)
    if match:
        boot["init_seconds"] = _flt(match.group(1))


def parse_log(text: str) -> dict[str, Any]:
    """Everything this collection reads from a vLLM log, as one dict.

    KV figures describe the last boot in the log; ``boots`` lists every boot
    found (a new boot starts at a version banner or when a second capacity
    report arrives). Stats, HTTP statuses and errors cover the whole text.
    """
    reader = _LogReader()
    for raw in _unwrap(text):
        line = raw.rstrip()[:MAX_LINE]
        if line:
            reader.read(line)
    if _boot_started(reader.boot) or not reader.boots:
        reader.boots.append(reader.boot)
    return _log_result(reader)


def _log_result(reader: _LogReader) -> dict[str, Any]:
    """The last boot's figures at the top level, then the whole text's, then every boot."""
    last = reader.boots[-1]
    insufficient = last["insufficient"] or {}
    finished = [_finish_boot(b) for b in reader.boots]
    result = finished[-1]
    return {
        "version": result["version"] or reader.version,
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
        # Said once per engine start, before the capacity reports that may open a new boot.
        "max_num_batched_tokens": result["max_num_batched_tokens"]
        or next((b["max_num_batched_tokens"] for b in reversed(finished) if b["max_num_batched_tokens"]), None),
        "init_seconds": result["init_seconds"],
        "args": result["args"],
        "engine_config": result["engine_config"],
        "kv_report": result["kv_report"],
        "kv_cache_blocks": result["kv_cache_blocks"],
        "block_size": result["block_size"]
        or (DEFAULT_BLOCK_SIZE if result["kv_cache_blocks"] else None),
        "block_size_source": result["block_size_source"],
        "kv_cache_reports": result["kv_cache_reports"],
        "kv_capacity_tokens": result["kv_capacity_tokens"],
        "constant_per_token": result["constant_per_token"],
        "start_costs": result["start_costs"],
        "stats": reader.stats,
        "spec_decode": reader.spec,
        "stats_summary": summarise_stats(reader.stats, reader.spec),
        "context_errors": reader.context_errors,
        "context_limits": sorted(set(reader.context_limits)),
        "offload_mmaps": reader.mmaps,
        "kv_transfer": reader.transfer,
        "http_status": reader.http,
        "errors": reader.errors,
        "boots": [_boot_summary(b) for b in finished],
        "unparsed_lines": {"count": len(reader.unparsed), "samples": reader.unparsed[:5]},
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
        "kv_capacity_tokens",
        "kv_report",
        "constant_per_token",
    )
    summary = {key: boot[key] for key in keys}
    insufficient = boot["insufficient"] or {}
    summary["kv_insufficient"] = bool(insufficient)
    for key in ("requested_max_model_len", "kv_needed_gib", "kv_available_gib"):
        summary[key] = insufficient.get(key)
    summary["max_model_len"] = (
        boot["concurrency_max_model_len"]
        or boot["args"].get("max_model_len")
        or boot["engine_config"].get("max_model_len")
    )
    summary["oom_rank"] = boot["oom"][0]["rank"] if boot["oom"] else None
    return summary


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
