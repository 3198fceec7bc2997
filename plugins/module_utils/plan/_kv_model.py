# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KV model: what one request costs and how many fit, from vLLM's own reports.

vLLM reports ``T`` tokens of KV cache and a concurrency ``C = T / L`` for a
``max_model_len`` of ``L``. One full-length request costs ``m(L) = a + b*L``
GiB per rank (``a = 0`` for plain attention; a hybrid cache such as DeepSeek
V4's has a fixed part), so a rank with ``M`` GiB of KV memory holds
``C = M / (a + b*L)`` requests and ``T = C * L`` tokens.

Observations are per rank and per boot. A boot is as strong as its weakest
rank (vLLM uses the smallest block count across ranks), and a plan is as safe
as its worst boot. Without ``kv_memory_gib`` the model works in tokens: each
boot keeps its token count at any L (``a = 0``, one token unit per token),
which is exact for plain attention and is said to be an assumption otherwise.

Fail closed on evidence that disagrees. Observations of different recipes
(their ``recipe_hash``) are separate calibrations and are never fitted
together: with a ``recipe_hash`` to plan for, only that recipe's boots are
used (when it has any); otherwise every recipe is planned on its own and the
worst plan wins. Within a calibration the worst observed boot bounds the
plan: when the fitted cost predicts more tokens for a boot than that boot
reported, the memory is scaled down until it does not.

This is the one home of the arithmetic: the kv_budget module, the kv filters
and the calibration benchmark call it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_calibration import (  # noqa: F401 (re-exported)
    CALIBRATION_KEYS,
    calibration_key,
    calibrations,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_input import (  # noqa: F401 (re-exported)
    SOURCES,
    KvInputError,
    _shown,
    normalise_observations,
)

GIB = 1024**3


# How a plan's per-request cost a + b*L was found (model.calibration):
#   two_points          boots at two or more max_model_len with KV memory: a and b fitted
#   error_report        a not-enough-KV error's two points (needed at the requested length,
#                       available at vLLM's estimate) separate a from b
#   single_boot_bounded one max_model_len with memory: a and b inseparable; no context above
#                       the longest observed to hold the concurrency at that memory
#   tokens_only         no KV memory in the observations: tokens per boot, bounded the same way
#   constant_per_token  the cost per token is known constant (plain attention, V0 block
#                       reports, or constant_per_token: true): a = 0, extrapolation is exact
#   per_token_kib       no observation; the cost per token given by per_token_kib
CALIBRATIONS = (
    "two_points",
    "error_report",
    "single_boot_bounded",
    "tokens_only",
    "constant_per_token",
    "per_token_kib",
)


@dataclass
class Boot:
    """One boot: the weakest rank's memory and the engine's token count."""

    key: str
    max_model_len: int
    kv_tokens: int
    memory_gib: float | None
    weakest_rank: int | None
    host: str | None
    version: str | None
    profiling_skipped: bool
    source: str = "boot"
    constant_per_token: bool = False
    # False for an error report's "needed" point: memory vLLM computed, no rank had it
    memory_observed: bool = True


@dataclass
class Fit:
    """Per-request memory ``a + b*L``; in token mode memory is counted in tokens."""

    mode: str  # "memory" (GiB per rank) or "tokens"
    a: float
    b: float
    calibrated: bool
    points: int
    distinct_lengths: int
    fit_error: float  # largest relative error of predicted tokens over the observations
    notes: list[str] = field(default_factory=list)
    # how a and b were found (see CALIBRATIONS); "bounded" plans never extrapolate
    calibration: str = "tokens_only"
    bounded: bool = False
    sources: dict[str, int] = field(default_factory=dict)

    def per_request(self, length: int) -> float:
        return self.a + self.b * length

    def as_dict(self) -> dict[str, Any]:
        unit = "GiB" if self.mode == "memory" else "tokens"
        out: dict[str, Any] = {
            "mode": self.mode,
            "unit": unit,
            "a": round(self.a, 6),
            "b": self.b,
            "calibrated": self.calibrated,
            "points": self.points,
            "distinct_lengths": self.distinct_lengths,
            "fit_error": round(self.fit_error, 6),
            "calibration": self.calibration,
            # How many boots of each source (boot, error_report) the fit stands on.
            "sources": dict(sorted(self.sources.items())),
            "notes": list(self.notes),
        }
        if self.mode == "memory" and self.b > 0:
            out["tokens_per_gib"] = round(1.0 / self.b, 1)
            out["kib_per_token"] = round(self.b * 1024 * 1024, 3)
        return out


def group_boots(observations: list[dict[str, Any]]) -> list[Boot]:
    """Group per-rank entries into boots; each boot keeps its weakest rank.

    Entries of one boot share ``recorded_at`` (and ``recipe_hash``); entries
    without ``recorded_at`` are boots of their own.
    """
    grouped: dict[str, list[dict[str, Any]]] = {}
    for index, entry in enumerate(observations):
        stamp = entry.get("recorded_at")
        key = (
            f"{stamp}|{entry.get('recipe_hash')}|{entry['max_model_len']}|{entry.get('error_point')}"
            if stamp
            else f"#{index}"
        )
        grouped.setdefault(key, []).append(entry)
    boots = []
    for key, ranks in grouped.items():
        memories = [
            (r.get("kv_memory_gib", r.get("available_kv_gib")), r.get("rank"), r.get("host"))
            for r in ranks
        ]
        known = [m for m in memories if m[0] is not None]
        weakest = min(known, key=lambda m: m[0]) if known else (None, ranks[0].get("rank"), None)
        boots.append(
            Boot(
                key=key,
                max_model_len=ranks[0]["max_model_len"],
                kv_tokens=min(r["kv_tokens"] for r in ranks),
                memory_gib=weakest[0],
                weakest_rank=weakest[1],
                host=weakest[2] or ranks[0].get("host"),
                version=ranks[0].get("version"),
                profiling_skipped=any(bool(r.get("profiling_skipped")) for r in ranks),
                source=ranks[0].get("source") or "boot",
                constant_per_token=any(r.get("constant_per_token") is True for r in ranks),
                memory_observed=all(r.get("memory_observed") is not False for r in ranks),
            )
        )
    return boots


def _relative_error(fit: Fit, points: list[tuple[int, float, int]]) -> float:
    worst = 0.0
    for length, memory, tokens in points:
        predicted = predict_tokens(fit, memory, length)
        worst = max(worst, abs(predicted - tokens) / tokens)
    return worst


def _sources(boots: list[Boot]) -> dict[str, int]:
    """Boots per source (``boot``, ``error_report``: a refused start's points)."""
    counts: dict[str, int] = {}
    for boot in boots:
        counts[boot.source] = counts.get(boot.source, 0) + 1
    return counts


def fit_boots(boots: list[Boot], constant_per_token: bool = False) -> Fit:
    """Least-squares fit of ``m(L) = a + b*L`` over boots that report memory.

    ``constant_per_token`` (or every boot marked so, as V0 block reports are)
    says the model's cost per token does not depend on the length: one boot is
    then enough to go beyond its length. Otherwise evidence that cannot
    separate ``a`` from ``b`` gives a bounded fit (:func:`extrapolation_cap`).
    """
    constant = constant_per_token or bool(boots and all(b.constant_per_token for b in boots))
    points = [(b.max_model_len, b.memory_gib, b.kv_tokens) for b in boots if b.memory_gib]
    if not points:
        notes = [
            "no observation carries kv_memory_gib: planning in tokens, assuming each boot's"
            " token count does not depend on max_model_len (exact for plain attention; a hybrid"
            " cache such as DeepSeek V4's holds fewer tokens at a shorter context)"
        ]
        fit = Fit(
            "tokens", 0.0, 1.0, False, len(boots), len({b.max_model_len for b in boots}), 0.0, notes
        )
        fit.calibration, fit.bounded = (
            ("constant_per_token", False) if constant else ("tokens_only", True)
        )
        fit.sources = _sources(boots)
        return fit
    # per-request memory at each boot's own L: m = M / C = M * L / T
    lengths = [float(p[0]) for p in points]
    costs = [p[1] * p[0] / p[2] for p in points]
    distinct = len(set(lengths))
    notes: list[str] = []
    if distinct >= 2:
        mean_l = statistics.fmean(lengths)
        mean_m = statistics.fmean(costs)
        sxx = sum((x - mean_l) ** 2 for x in lengths)
        sxy = sum((x - mean_l) * (y - mean_m) for x, y in zip(lengths, costs, strict=True))
        b = sxy / sxx
        a = mean_m - b * mean_l
        if a < 0 or b <= 0:
            notes.append(
                f"least squares gave a={a:.4g}, b={b:.4g}; refitted through the origin (a=0)"
            )
            b = sum(x * y for x, y in zip(lengths, costs, strict=True)) / sum(
                x * x for x in lengths
            )
            a = 0.0
        calibrated = True
        booted = {b.max_model_len for b in boots if b.memory_gib and b.source != "error_report"}
        calibration = "two_points" if len(booted) >= 2 else "error_report"
    else:
        a = 0.0
        b = statistics.fmean(c / x for c, x in zip(costs, lengths, strict=True))
        calibrated = False
        calibration = "constant_per_token" if constant else "single_boot_bounded"
        notes.append(
            "one distinct max_model_len observed: the cost per token is known constant (a=0)"
            if constant
            else "one distinct max_model_len observed: a fixed per-request cost cannot be told"
            " apart from the per-token cost; no context above the longest observed is offered"
        )
    fit = Fit("memory", a, b, calibrated, len(points), distinct, 0.0, notes)
    fit.calibration, fit.bounded = calibration, calibration == "single_boot_bounded"
    fit.sources = _sources([b for b in boots if b.memory_gib])
    fit.fit_error = _relative_error(fit, points)
    return fit


EVIDENCE_NEEDED = (
    "one boot at a second max_model_len with its KV memory logged, a not-enough-KV error"
    " report of this model (vllm_log_facts records its two points), or constant_per_token:"
    " true when the model is plain attention"
)


def extrapolation_cap(fit: Fit, boots: list[Boot], memory: float, concurrency: float) -> int | None:
    """For a bounded fit: the longest length observed to hold ``concurrency`` requests in ``memory``.

    A boot at length ``L`` whose ``T`` tokens fitted in ``M`` shows one request of
    ``L`` costs ``M * L / T``; it holds ``concurrency`` requests in ``memory`` when
    ``concurrency * M * L / T <= memory``. Without a second length nothing says
    what a longer (or, with a fixed part, a shorter) request costs beyond that.
    None when the fit is not bounded; 0 when no boot qualifies.
    """
    if not fit.bounded:
        return None
    fitting = [
        b.max_model_len
        for b in boots
        if b.memory_observed
        and concurrency * boot_memory(fit, b) * b.max_model_len / b.kv_tokens <= memory * (1 + 1e-9)
    ]
    return max(fitting, default=0)


def boot_memory(fit: Fit, boot: Boot) -> float:
    """The boot's KV memory in the fit's unit (inferred from tokens when not logged)."""
    if fit.mode == "tokens":
        return float(boot.kv_tokens)
    if boot.memory_gib:
        return boot.memory_gib
    return boot.kv_tokens * fit.per_request(boot.max_model_len) / boot.max_model_len


def predict_concurrency(fit: Fit, memory: float, length: int) -> float:
    """Full-length requests of ``length`` tokens that ``memory`` holds."""
    return memory / fit.per_request(length)


def predict_tokens(fit: Fit, memory: float, length: int) -> int:
    """vLLM's reported KV cache size for ``memory`` at ``max_model_len = length``."""
    return int(predict_concurrency(fit, memory, length) * length)


def max_length_for(fit: Fit, memory: float, concurrency: float, granularity: int) -> int:
    """Largest multiple of ``granularity`` at which ``memory`` holds ``concurrency`` requests."""
    budget = memory / concurrency - fit.a
    if budget <= 0:
        return 0
    limit = budget / fit.b
    length = int(limit // granularity) * granularity
    # guard the float edge: the chosen length must really meet the concurrency
    while length > 0 and predict_concurrency(fit, memory, length) < concurrency - 1e-12:
        length -= granularity
    return length


def sequence_tokens(fit: Fit, memory: float, sequences: int) -> float:
    """Tokens each of ``sequences`` concurrent sequences may hold in ``memory``."""
    budget = memory / sequences - fit.a
    return budget / fit.b if budget > 0 else 0.0


def spread(values: list[float]) -> dict[str, float]:
    """Worst, median and best of per-boot values."""
    return {
        "worst": min(values),
        "median": statistics.median(values),
        "best": max(values),
    }


def scheduled_tokens(
    max_num_batched_tokens: int, max_num_seqs: int, speculative_tokens: int, parallel_drafting: bool
) -> int:
    """Tokens the scheduler may schedule per step.

    With parallel drafting vLLM reserves ``K - 1`` extra slots per sequence
    (the RTX PRO 6000 field report: 8192 - 4 * 2 = 8184 with K = 5 and two sequences).
    """
    if not parallel_drafting or speculative_tokens <= 1:
        return max_num_batched_tokens
    return max_num_batched_tokens - (speculative_tokens - 1) * max_num_seqs


_LADDER = (
    4096,
    8192,
    16384,
    24576,
    32768,
    49152,
    65536,
    98304,
    131072,
    196608,
    262144,
    393216,
    524288,
    786432,
    1048576,
)


def context_options(chosen: int, granularity: int, extra: tuple[int, ...] = ()) -> list[int]:
    """Context lengths worth showing around the chosen one."""
    low, high = max(granularity, chosen // 4), max(chosen * 2, granularity * 2)
    values = {n for n in _LADDER if low <= n <= high and n % granularity == 0}
    values.update(n for n in extra if n > 0)
    if chosen > 0:
        values.add(chosen)
    return sorted(values)


def _floor(value: float, granularity: int) -> int:
    return int(value // granularity) * granularity


def worst_boot_bound(fit: Fit, boots: list[Boot]) -> tuple[float, Boot | None]:
    """Factor (<= 1) that keeps the fit from promising any boot more tokens than it reported."""
    factor, bounding = 1.0, None
    for boot in boots:
        memory = boot_memory(fit, boot)
        predicted = predict_concurrency(fit, memory, boot.max_model_len) * boot.max_model_len
        if predicted > boot.kv_tokens and boot.kv_tokens / predicted < factor:
            factor, bounding = boot.kv_tokens / predicted, boot
    return factor, bounding


def _check_plan_options(
    min_concurrency: float,
    preferred_concurrency: float | None,
    granularity: int,
    model_max_len: int | None,
    available_kv_gib: float | None,
    per_token_kib: float | None,
    min_length: int,
    memory_source: str,
) -> None:
    """Refuse options no plan can be made from, each by its name."""
    validate.number("min_concurrency", min_concurrency, above=0, error=KvInputError)
    if preferred_concurrency is not None:
        validate.number(
            "preferred_concurrency", preferred_concurrency, above=0, error=KvInputError
        )
    if isinstance(granularity, bool) or not isinstance(granularity, int) or granularity < 1:
        raise KvInputError(f"granularity must be a positive integer, got {_shown(granularity)}")
    if model_max_len is not None:
        validate.whole("model_max_len", model_max_len, minimum=0, error=KvInputError)
        if model_max_len < granularity:
            raise KvInputError(
                f"model_max_len {model_max_len} is below granularity {granularity}: no context"
                " that is a multiple of the granularity fits the model; lower granularity or"
                " check model_max_len (max_position_embeddings)"
            )
    if available_kv_gib is not None:
        validate.number(memory_source, available_kv_gib, above=0, error=KvInputError)
    if per_token_kib is not None:
        validate.number("per_token_kib", per_token_kib, above=0, error=KvInputError)
    validate.number("min_length", min_length, minimum=0, error=KvInputError)


def plan_kv(
    observations: list[Any] | None,
    available_kv_gib: float | None = None,
    per_token_kib: float | None = None,
    min_concurrency: float = 1.0,
    preferred_concurrency: float | None = None,
    granularity: int = 1024,
    model_max_len: int | None = None,
    min_length: int = 0,
    memory_source: str = "available_kv_gib",
    recipe_hash: str | None = None,
    constant_per_token: bool = False,
) -> dict[str, Any]:
    """The context plan: the largest ``max_model_len`` the worst boot holds.

    ``min_length`` is the shortest context the client needs; a preferred
    concurrency is only honoured when it leaves at least that much.
    ``recipe_hash`` is the recipe being planned (see :func:`calibrations`).
    ``constant_per_token`` says the model's KV cost per token is constant (plain
    attention): a plan from one length may then go beyond it.
    """
    _check_plan_options(
        min_concurrency, preferred_concurrency, granularity, model_max_len,
        available_kv_gib, per_token_kib, min_length, memory_source,
    )
    entries = normalise_observations(observations or [])
    if not entries and available_kv_gib is None:
        raise KvInputError(
            "no observations and no available_kv_gib: pass observations (vllm_log_facts after a"
            " boot, or inventory kv_observations) or available_kv_gib with per_token_kib"
        )
    groups, notes = calibrations(entries, recipe_hash)
    args = (
        available_kv_gib,
        per_token_kib,
        float(min_concurrency),
        preferred_concurrency,
        granularity,
        model_max_len,
        min_length,
        memory_source,
        bool(constant_per_token),
    )
    groups = groups or [(None, [])]
    plans = [(key, _plan_calibration(group, *args)) for key, group in groups]
    key, plan = min(
        plans, key=lambda item: (item[1]["max_model_len"], item[1]["guaranteed_max_model_len"])
    )
    length = plan["max_model_len"]
    if len(plans) > 1 and length > 0:
        # at the shortest plan's length, the calibration that holds the fewest requests speaks
        # for the plan (a recipe held short by its evidence may still promise more tokens)
        index = min(range(len(plans)), key=lambda i: concurrency_at(plans[i][1], length)["worst"])
        if plans[index][1] is not plan:
            key = plans[index][0]
            capped = (*args[:5], min(model_max_len or length, length), *args[6:])
            plan = _plan_calibration(groups[index][1], *capped)
            plans[index] = (key, plan)
    plan["model"]["notes"].extend(notes)
    plan["calibration_recipe_hash"] = key
    plan["calibrations"] = [_calibration_row(other_key, other, plan) for other_key, other in plans]
    return plan


def _calibration_row(key: str | None, other: dict[str, Any], chosen: dict[str, Any]) -> dict[str, Any]:
    return {
        "recipe_hash": key,
        "boots": len(other["boots"]),
        "max_model_len": other["max_model_len"],
        "guaranteed_max_model_len": other["guaranteed_max_model_len"],
        "calibrated": other["calibrated"],
        "worst_memory": other["memory"]["worst"],
        "unit": other["model"]["unit"],
        "chosen": other is chosen,
    }


def _calibration_fit(
    boots: list[Any],
    available_kv_gib: float | None,
    per_token_kib: float | None,
    memory_source: str,
    constant_per_token: bool,
) -> Fit:
    """The fit of one calibration's boots; a given memory needs a per-token cost in memory."""
    fit = (
        fit_boots(boots, constant_per_token)
        if boots
        else Fit("tokens", 0.0, 1.0, False, 0, 0, 0.0, [])
    )
    if available_kv_gib is not None and fit.mode == "tokens":
        if per_token_kib is None:
            raise KvInputError(
                f"{memory_source} needs a per-token cost: pass per_token_kib, or observations"
                " that carry kv_memory_gib"
            )
        fit = Fit(
            "memory",
            0.0,
            per_token_kib / (1024 * 1024),
            False,
            0,
            0,
            0.0,
            ["per-token cost from per_token_kib, assuming no fixed per-request cost (a=0)"],
            calibration="per_token_kib",
        )
    return fit


def _plan_memories(
    fit: Fit, boots: list[Any], available_kv_gib: float | None, memory_source: str
) -> tuple[list[float], str, float]:
    """``(memory per boot, its source, worst-boot factor)``: scaled so no boot is planned
    above what it held."""
    if available_kv_gib is not None:
        memories = [float(available_kv_gib)]
        source = memory_source
    else:
        # an error report's "needed" memory is vLLM's arithmetic, not memory a rank had
        observed = [boot for boot in boots if boot.memory_observed] or boots
        memories = [boot_memory(fit, boot) for boot in observed]
        source = "observations"
    factor, bounding = worst_boot_bound(fit, boots)
    if bounding is not None and factor < 1.0:
        memories = [memory * factor for memory in memories]
        fit.notes.append(
            f"the fit promised the boot at max_model_len {bounding.max_model_len}"
            f" ({bounding.host or 'unknown host'}) more than its {bounding.kv_tokens} tokens:"
            f" memory scaled by {factor:.4f} so no boot is planned above what it held"
        )
    return memories, source, factor


def _at(fit: Fit, levels: dict[str, float], length: int) -> dict[str, Any]:
    """Concurrency and KV tokens at each memory level for one context length."""
    conc = {k: round(predict_concurrency(fit, m, length), 4) for k, m in levels.items()}
    tokens = {k: predict_tokens(fit, m, length) for k, m in levels.items()}
    return {"max_model_len": length, "concurrency": conc, "kv_tokens": tokens}


def _active_sequences(fit: Fit, worst: float, chosen: int, granularity: int) -> list[dict[str, int]]:
    """How long 1, 2 and 4 requests at once may each be at the chosen context."""
    sequences = []
    step = min(granularity, 1024)
    if chosen > 0:
        for count in (1, 2, 4):
            each = min(chosen, _floor(sequence_tokens(fit, worst, count), step))
            sequences.append(
                {"sequences": count, "tokens_per_sequence": each, "total_tokens": each * count}
            )
    return sequences


def _boot_rows(fit: Fit, boots: list[Any]) -> list[dict[str, Any]]:
    """The boots behind the plan, smallest memory first."""
    return [
        {
            "max_model_len": b.max_model_len,
            "kv_tokens": b.kv_tokens,
            "memory": round(boot_memory(fit, b), 4),
            "memory_logged": b.memory_gib is not None,
            "weakest_rank": b.weakest_rank,
            "host": b.host,
            "version": b.version,
            "profiling_skipped": b.profiling_skipped,
            "source": b.source,
            "memory_observed": b.memory_observed,
        }
        for b in sorted(boots, key=lambda b: boot_memory(fit, b))
    ]


def _option(
    fit: Fit,
    levels: dict[str, float],
    boots: list[Any],
    length: int,
    chosen: int,
    min_concurrency: float,
    preferred_concurrency: float | None,
) -> dict[str, Any]:
    """One context the operator may pick instead, with what it keeps and what it gives up."""
    row = _at(fit, levels, length)
    row["meets_min_concurrency"] = row["concurrency"]["worst"] >= min_concurrency
    row["meets_preferred_concurrency"] = (
        None
        if preferred_concurrency is None
        else row["concurrency"]["worst"] >= preferred_concurrency
    )
    row["chosen"] = length == chosen
    row["within_evidence"] = not fit.bounded or length <= max(
        (b.max_model_len for b in boots), default=0
    )
    return row


def _plan_calibration(
    entries: list[dict[str, Any]],
    available_kv_gib: float | None,
    per_token_kib: float | None,
    min_concurrency: float,
    preferred_concurrency: float | None,
    granularity: int,
    model_max_len: int | None,
    min_length: int,
    memory_source: str,
    constant_per_token: bool,
) -> dict[str, Any]:
    """The plan for one calibration (the observations of one recipe)."""
    boots = group_boots(entries)
    fit = _calibration_fit(boots, available_kv_gib, per_token_kib, memory_source, constant_per_token)
    memories, source, factor = _plan_memories(fit, boots, available_kv_gib, memory_source)
    worst = min(memories)
    levels = spread(memories)
    cap = _floor(model_max_len, granularity) if model_max_len else None

    bounds: dict[float, int] = {}

    def longest(concurrency: float) -> int:
        length = max_length_for(fit, worst, concurrency, granularity)
        length = min(length, cap) if cap else length
        evidence = extrapolation_cap(fit, boots, worst, concurrency)
        if evidence is not None and _floor(evidence, granularity) < length:
            bounds[concurrency] = evidence
            length = _floor(evidence, granularity)
        return length

    guaranteed = longest(min_concurrency)
    chosen, preferred_met = guaranteed, None
    preferred_len = None
    if preferred_concurrency is not None:
        preferred_len = longest(preferred_concurrency)
        preferred_met = preferred_len >= max(min_length, granularity)
        if preferred_met:
            chosen = min(guaranteed, preferred_len)

    options = [
        _option(fit, levels, boots, length, chosen, min_concurrency, preferred_concurrency)
        for length in context_options(chosen, granularity, (guaranteed, preferred_len or 0))
    ]
    if bounds:
        concurrency, evidence = min(bounds.items(), key=lambda item: item[1])
        fit.notes.append(
            f"uncalibrated ({fit.calibration}): no context above {evidence}, the longest observed"
            f" to hold {concurrency:g} request(s) in {worst:.4g} {fit.as_dict()['unit']} per rank;"
            f" to go further: {EVIDENCE_NEEDED}"
        )
    return {
        "max_model_len": chosen,
        "guaranteed_max_model_len": guaranteed,
        "preferred_max_model_len": preferred_len,
        "preferred_met": preferred_met,
        "calibrated": fit.calibrated,
        "model": {
            **fit.as_dict(),
            "bounded_by_evidence": min(bounds.values()) if bounds else None,
            "evidence_needed": EVIDENCE_NEEDED if fit.bounded else None,
        },
        "memory_source": source,
        "memory": {k: round(v, 4) for k, v in levels.items()},
        "worst_boot_bound": round(factor, 6),
        "concurrency": _at(fit, levels, chosen)["concurrency"] if chosen else {},
        "kv_tokens": _at(fit, levels, chosen)["kv_tokens"] if chosen else {},
        "active_sequences": _active_sequences(fit, worst, chosen, granularity),
        "options": options,
        "boots": _boot_rows(fit, boots),
        "_fit": fit,
        "_levels": levels,
    }


def concurrency_at(plan: dict[str, Any], length: int) -> dict[str, float]:
    """Worst/median/best concurrency of a plan at another context length."""
    fit: Fit = plan["_fit"]
    return {k: predict_concurrency(fit, m, length) for k, m in plan["_levels"].items()}
