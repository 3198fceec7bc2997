# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's periodic engine stats and speculative-decoding metrics, read line by line.

Pure functions used by ``_vllm_log.parse_log``; no AnsibleModule.
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
    "draft_acceptance_rate_pct": re.compile(rf"(?:Avg )?Draft acceptance rate:\s*({_FLT})%"),
}
_PER_POSITION = re.compile(r"Per-position acceptance rate:\s*([\d.]+(?:,\s*[\d.]+)*)")


def parse_stats(line: str) -> dict[str, Any] | None:
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


def parse_spec(line: str) -> dict[str, Any] | None:
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


def summarise_stats(stats: list[dict[str, Any]], spec: list[dict[str, Any]]) -> dict[str, Any]:
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
