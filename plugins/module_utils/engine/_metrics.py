# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What vLLM says about its own work: ``/metrics`` and its periodic log lines.

``/metrics`` is Prometheus text, parsed with ``prometheus_client``'s own text
parser (never regexes) into one summary: requests running and waiting, prompt
and generation token counters, prefix-cache queries and hits, the
time-to-first-token histogram (count, mean, bucket quantiles), speculative
decoding (drafts, acceptance, per position) when the engine drafts, and the
cache configuration vLLM publishes. Two summaries of the same server subtract
(:func:`delta`): what one qualification check did, whatever ran before it.

vLLM also logs, every few seconds while it works, a line such as
``Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput:
359.0 tokens/s, Running: 1 reqs, ... Prefix cache hit rate: 88.1%`` and, when it
drafts, ``SpecDecoding metrics: Mean acceptance length: 5.90, ...``.
:func:`log_windows` summarises those windows as the RTX PRO 6000 field report did: median, Tukey IQR
and peak of decode throughput (all non-idle windows, and the windows with one
running request), peak prompt throughput, prefix-cache hit rate, KV usage, and
acceptance length / draft acceptance / per-position acceptance. The line parsers
are ``_vllm_stats``'s (one home for them).

No AnsibleModule here. ``prometheus_client`` is a controller requirement
(requirements.txt); without it :func:`summarise` raises :class:`MetricsError`
saying so, and this file still imports.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._log_text import (
    clean_line,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_stats import (
    parse_spec,
    parse_stats,
)

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # pragma: no cover - exercised through HAS_PROMETHEUS_CLIENT
    text_string_to_metric_families = None  # type: ignore[assignment]

HAS_PROMETHEUS_CLIENT = text_string_to_metric_families is not None

# Sample names, newest first where vLLM renamed one (0.10 deprecated the gpu_ ones).
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
REQUEST_SUCCESS = ("vllm:request_success_total",)
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
# V0 published only a rate (a gauge, 0..1).
PREFIX_HIT_RATE_V0 = ("vllm:gpu_prefix_cache_hit_rate",)
TTFT = "vllm:time_to_first_token_seconds"
SPEC_DRAFTS = ("vllm:spec_decode_num_drafts_total",)
SPEC_DRAFT_TOKENS = ("vllm:spec_decode_num_draft_tokens_total",)
SPEC_ACCEPTED = ("vllm:spec_decode_num_accepted_tokens_total",)
SPEC_PER_POS = ("vllm:spec_decode_num_accepted_tokens_per_pos_total",)
CACHE_CONFIG = "vllm:cache_config_info"

COUNTER_KEYS = (
    "prompt_tokens",
    "generation_tokens",
    "requests_finished",
    "prefix_cache_queries",
    "prefix_cache_hits",
)


class MetricsError(validate.InputError):
    """``/metrics`` text that cannot be read; the message says what and the fix."""


# --- /metrics ----------------------------------------------------------------


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    if not HAS_PROMETHEUS_CLIENT:
        raise MetricsError(
            "prometheus_client is not installed on the controller: install the controller"
            " requirements (pip install -r requirements.txt, prometheus-client)"
        )
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str) or not text.strip():
        raise MetricsError(
            "the /metrics text is empty: point metrics_url at vLLM's /metrics"
            " (through the ingress: <public url>/<served name>/metrics)"
        )
    try:
        return [
            (sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except (ValueError, TypeError, IndexError, KeyError) as err:
        raise MetricsError(
            f"the /metrics text is not Prometheus text ({err}); is metrics_url vLLM's"
            " /metrics and not an HTML or JSON page?"
        ) from None


def _select(
    samples: list[tuple[str, dict[str, str], float]], model: str | None
) -> list[tuple[str, dict[str, str], float]]:
    if not model:
        return samples
    return [s for s in samples if s[1].get("model_name", model) == model]


def _total(samples: list[tuple[str, dict[str, str], float]], names: Iterable[str]) -> float | None:
    """Sum over every label set (engines, finish reasons) of the first name present."""
    for name in names:
        values = [value for sample, _, value in samples if sample == name]
        if values:
            return sum(v for v in values if math.isfinite(v))
    return None


def _peak(samples: list[tuple[str, dict[str, str], float]], names: Iterable[str]) -> float | None:
    for name in names:
        values = [value for sample, _, value in samples if sample == name and math.isfinite(value)]
        if values:
            return max(values)
    return None


def _histogram(
    samples: list[tuple[str, dict[str, str], float]], name: str
) -> dict[str, Any] | None:
    buckets: dict[float, float] = {}
    count = total = None
    for sample, labels, value in samples:
        if sample == f"{name}_bucket" and "le" in labels:
            bound = float(labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + value
        elif sample == f"{name}_count":
            count = (count or 0.0) + value
        elif sample == f"{name}_sum":
            total = (total or 0.0) + value
    if count is None and not buckets:
        return None
    ordered = [[bound, buckets[bound]] for bound in sorted(buckets)]
    if count is None:  # a paste without its _count line: the +Inf bucket counts them all
        count = ordered[-1][1] if ordered and math.isinf(ordered[-1][0]) else None
    return {"count": count, "sum": total, "buckets": ordered}


def histogram_stats(hist: dict[str, Any] | None) -> dict[str, Any] | None:
    """Count, mean and the 0.5/0.9/0.99 quantiles as Prometheus' histogram_quantile estimates them."""
    if not hist:
        return None
    count, total = hist.get("count"), hist.get("sum")
    out: dict[str, Any] = {
        "count": int(count) if count is not None else None,
        "mean": round(total / count, 6) if count and total is not None else None,
    }
    for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        out[key] = _quantile(hist["buckets"], q)
    return out


def _quantile(buckets: list[list[float]], q: float) -> float | None:
    """Linear interpolation inside the bucket holding rank q·count (histogram_quantile)."""
    if not buckets:
        return None
    count = buckets[-1][1]
    if count <= 0:
        return None
    rank = q * count
    lower_bound, lower_count = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower_bound  # beyond the last finite bucket: its bound is all we know
            width = cumulative - lower_count
            share = (rank - lower_count) / width if width else 1.0
            return round(lower_bound + (bound - lower_bound) * share, 6)
        lower_bound, lower_count = bound, cumulative
    return lower_bound


def _per_position(samples: list[tuple[str, dict[str, str], float]]) -> dict[int, float]:
    positions: dict[int, float] = {}
    for sample, labels, value in samples:
        if sample in SPEC_PER_POS and str(labels.get("position", "")).isdigit():
            position = int(labels["position"])
            positions[position] = positions.get(position, 0.0) + value
    return positions


def summarise(text: str | bytes, model: str | None = None) -> dict[str, Any]:
    """One summary of vLLM's ``/metrics``; ``model`` keeps one served model's samples.

    Counters are summed over engines (data parallel) and finish reasons. Keys
    whose metric this vLLM does not publish are ``None``; ``spec_decode`` is
    ``None`` when the engine does not draft.
    """
    everything = _samples(text)
    samples = _select(everything, model)
    names = sorted({labels["model_name"] for _, labels, _ in everything if "model_name" in labels})
    if model and names and model not in names:
        raise MetricsError(
            f"the /metrics text has no sample for model {model!r} (it serves {names}):"
            " is the served model name right?"
        )
    if not any(name.startswith("vllm:") for name, _, _ in samples):
        raise MetricsError(
            "the /metrics text has no vllm: sample"
            + (f" for model {model!r}" if model else "")
            + ": is metrics_url this vLLM's /metrics (and the served model name right)?"
        )
    finished: dict[str, float] = {}
    for name, labels, value in samples:
        if name in REQUEST_SUCCESS:
            reason = labels.get("finished_reason", "unknown")
            finished[reason] = finished.get(reason, 0.0) + value
    queries = _total(samples, PREFIX_QUERIES)
    hits = _total(samples, PREFIX_HITS)
    v0_rate = _peak(samples, PREFIX_HIT_RATE_V0)
    cache_config = next((labels for name, labels, _ in samples if name == CACHE_CONFIG), None)
    ttft = _histogram(samples, TTFT)
    return {
        "requests_running": _total(samples, RUNNING),
        "requests_waiting": _total(samples, WAITING),
        "kv_cache_usage_perc": _peak(samples, KV_USAGE),
        "prompt_tokens": _total(samples, PROMPT_TOKENS),
        "generation_tokens": _total(samples, GENERATION_TOKENS),
        "requests_finished": sum(finished.values()) if finished else None,
        "requests_finished_by_reason": finished,
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": _rate(hits, queries) if queries is not None else v0_rate,
        "ttft_histogram": ttft,
        "ttft": histogram_stats(ttft),
        "spec_decode": _spec(samples),
        "cache_config": {k: v for k, v in (cache_config or {}).items() if k != "model_name"}
        or None,
    }


def _rate(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return round(part / whole, 6)


def _spec(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, Any] | None:
    drafts = _total(samples, SPEC_DRAFTS)
    if drafts is None:
        return None
    return _spec_figures(
        drafts,
        _total(samples, SPEC_DRAFT_TOKENS),
        _total(samples, SPEC_ACCEPTED),
        _per_position(samples),
    )


def _spec_figures(
    drafts: float, draft_tokens: float | None, accepted: float | None, positions: dict[int, float]
) -> dict[str, Any]:
    """vLLM's own definitions: mean acceptance length 1 + accepted/drafts, rate accepted/drafted."""
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "mean_acceptance_length": round(1 + accepted / drafts, 4)
        if drafts and accepted is not None
        else None,
        "draft_acceptance_rate": _rate(accepted, draft_tokens),
        "per_position_acceptance": [
            round(positions[p] / drafts, 4) if drafts else None for p in sorted(positions)
        ],
        "per_position_accepted": [positions[p] for p in sorted(positions)],
    }


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two summaries of one server: counters and TTFT in the window.

    A counter that went down means the server restarted in between; the
    window is then reported as ``restarted`` and its counters as ``None``.
    """
    out: dict[str, Any] = {"restarted": False}
    for key in COUNTER_KEYS:
        b, a = before.get(key), after.get(key)
        if b is None or a is None:
            out[key] = None
        elif a < b:
            out["restarted"] = True
            out[key] = None
        else:
            out[key] = a - b
    out["prefix_cache_hit_rate"] = _rate(out["prefix_cache_hits"], out["prefix_cache_queries"])
    out["ttft"] = histogram_stats(
        _histogram_delta(before.get("ttft_histogram"), after.get("ttft_histogram"))
    )
    spec_b, spec_a = before.get("spec_decode"), after.get("spec_decode")
    out["spec_decode"] = None
    if spec_a and spec_b and spec_a["drafts"] >= spec_b["drafts"]:
        positions_a = spec_a.get("per_position_accepted") or []
        positions_b = spec_b.get("per_position_accepted") or []
        positions = {
            i: value - (positions_b[i] if i < len(positions_b) else 0.0)
            for i, value in enumerate(positions_a)
        }
        out["spec_decode"] = _spec_figures(
            spec_a["drafts"] - spec_b["drafts"],
            _sub(spec_a.get("draft_tokens"), spec_b.get("draft_tokens")),
            _sub(spec_a.get("accepted_tokens"), spec_b.get("accepted_tokens")),
            positions,
        )
    return out


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _histogram_delta(
    before: dict[str, Any] | None, after: dict[str, Any] | None
) -> dict[str, Any] | None:
    if not after:
        return None
    if not before:
        return after
    earlier = {bound: count for bound, count in before["buckets"]}
    if None in (after["count"], before["count"], after["sum"], before["sum"]):
        return None
    if after["count"] < before["count"]:  # the server restarted in between
        return None
    return {
        "count": after["count"] - before["count"],
        "sum": after["sum"] - before["sum"],
        "buckets": [[bound, count - earlier.get(bound, 0.0)] for bound, count in after["buckets"]],
    }


# --- the periodic log lines ---------------------------------------------------

# "INFO 08-04 02:46:09 [loggers.py:314]": vLLM's own stamp (no year).
_VLLM_STAMP = re.compile(r"\b(?:INFO|WARNING|DEBUG|ERROR)\s+(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")
# "2026-05-12T08:01:39.331095044Z" (podman/kubectl --timestamps) or "2026-05-12 08:01:39".
_ISO_STAMP = re.compile(r"\b(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)")


def _stamp(line: str) -> datetime | None:
    match = _VLLM_STAMP.search(line)
    try:
        if match:
            month, day, hour, minute, second = (int(g) for g in match.groups())
            return datetime(2000, month, day, hour, minute, second)  # a leap year: 02-29 parses
        match = _ISO_STAMP.search(line)
        if match:
            return datetime(*(int(g) for g in match.groups()))
    except ValueError:
        return None
    return None


def quartiles(values: list[float]) -> tuple[float, float, float] | None:
    """Tukey's hinges: the medians of the lower and upper halves (the median in both when odd)."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return None
    half = (n + 1) // 2
    return _median(ordered[:half]), _median(ordered), _median(ordered[n - half :])


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _spread(values: list[float]) -> dict[str, Any] | None:
    q = quartiles(values)
    if q is None:
        return None
    return {
        "windows": len(values),
        "median": round(q[1], 3),
        "iqr": [round(q[0], 3), round(q[2], 3)],
        "peak": round(max(values), 3),
        "mean": round(sum(values) / len(values), 3),
        "min": round(min(values), 3),
    }


def log_windows(text: str | Iterable[str]) -> dict[str, Any]:
    """The RTX PRO 6000 field report's window summary of vLLM's periodic stats and speculative-decoding lines.

    ``series`` keeps each stats window (seconds since the first stamped one,
    decode and prompt tok/s, running requests) for plots.
    """
    lines = text.splitlines() if isinstance(text, str) else list(text)
    stats: list[dict[str, Any]] = []
    spec: list[dict[str, Any]] = []
    previous: datetime | None = None
    for raw in lines:
        line = clean_line(raw)
        row = parse_stats(line)
        kind = "stats"
        if row is None:
            row, kind = parse_spec(line), "spec"
        if row is None:
            continue
        stamp = _stamp(line)
        if stamp is not None:
            if previous is not None and (previous - stamp).days > 180:
                # vLLM's own stamp has no year: 12-31 is followed by 01-01
                stamp = stamp.replace(year=previous.year + 1)
            previous = stamp
            row["stamp"] = stamp
        (stats if kind == "stats" else spec).append(row)
    stamps = [row["stamp"] for row in stats + spec if "stamp" in row]
    for row in stats + spec:
        if "stamp" in row:
            row["t"] = round((row.pop("stamp") - min(stamps)).total_seconds(), 3)
    return summarise_windows(stats, spec)


def summarise_windows(stats: list[dict[str, Any]], spec: list[dict[str, Any]]) -> dict[str, Any]:
    def values(rows: list[dict[str, Any]], key: str, keep=lambda row: True) -> list[float]:
        return [row[key] for row in rows if key in row and keep(row)]

    decode_all = values(stats, "generation_throughput", lambda r: r["generation_throughput"] > 0)
    decode_single = values(
        stats,
        "generation_throughput",
        lambda r: r.get("running") == 1 and r["generation_throughput"] > 0,
    )
    prompt = values(stats, "prompt_throughput", lambda r: r["prompt_throughput"] > 0)
    positions: dict[int, list[float]] = {}
    for row in spec:
        for index, rate in enumerate(row.get("per_position_acceptance") or []):
            positions.setdefault(index, []).append(rate)
    return {
        "windows": len(stats),
        "spec_windows": len(spec),
        "decode_tps": _spread(decode_all),
        "decode_tps_single_request": _spread(decode_single),
        "prompt_tps": _spread(prompt),
        "prefix_cache_hit_rate_pct": _spread(values(stats, "prefix_cache_hit_rate_pct")),
        "external_prefix_cache_hit_rate_pct": _spread(
            values(stats, "external_prefix_cache_hit_rate_pct")
        ),
        "kv_cache_usage_pct": _spread(values(stats, "kv_cache_usage_pct")),
        "running": _spread([float(v) for v in values(stats, "running")]),
        "waiting": _spread([float(v) for v in values(stats, "waiting")]),
        "acceptance_length": _spread(values(spec, "mean_acceptance_length")),
        "draft_acceptance_rate_pct": _spread(values(spec, "draft_acceptance_rate_pct")),
        "accepted_tps": _spread(values(spec, "accepted_throughput")),
        "per_position_acceptance_median": [
            round(_median(sorted(positions[p])), 4) for p in sorted(positions)
        ],
        "series": sorted(
            (
                {
                    "t": row.get("t"),
                    "decode_tps": row.get("generation_throughput"),
                    "prompt_tps": row.get("prompt_throughput"),
                    "running": row.get("running"),
                }
                for row in stats
            ),
            key=lambda point: (point["t"] is None, point["t"] or 0),
        ),
    }
