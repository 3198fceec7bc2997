# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one vocabulary of a recipe's ``expected:`` block, and the gate's comparison with it.

``VOCABULARY`` is the table every recipe (``recipes/*.yml``), ``qualify_expected`` and the
qualification gate share. A key names a figure and, where the figure depends on it, its
condition in the key itself (``decode_tps_at_6_streams``, ``ttft_s_at_131072_tokens``), so a
recipe can state the same figure at several conditions and the report reads without a legend.

An entry is a recipe's provenance mapping (``value``, ``unit``, ``at``, ``source``, ``quote``;
see ``recipes/README.md``) or, in ``qualify_expected``, a plain number. ``value`` is a number,
a ``[low, high]`` range (the lenient end is held), or null when the publisher does not publish
the figure (shown, not judged).

:func:`parse` checks a block (every refusal names ``expected.<key>``); :func:`params` says how
the checks must run to measure the declared conditions (streams, prompt sizes);
:func:`compare` puts each declared figure beside what the checks achieved. Pure functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)


@dataclass(frozen=True)
class Figure:
    key: str  # as documented; <N> is the condition
    what: str
    unit: str
    higher_is_better: bool
    condition: str | None  # "streams", "prompt_tokens" or None

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile("^" + re.escape(self.key).replace("<N>", "([1-9][0-9]{0,8})") + "$")


VOCABULARY: tuple[Figure, ...] = (
    Figure("decode_tps_single_stream", "decode tok/s of one request alone", "tok/s", True, None),
    Figure(
        "decode_tps_at_<N>_streams",
        "decode tok/s summed over N requests running together",
        "tok/s aggregate",
        True,
        "streams",
    ),
    Figure(
        "ttft_s_at_<N>_tokens",
        "time to first token of an N-token prompt",
        "s",
        False,
        "prompt_tokens",
    ),
    Figure(
        "prefill_tps_at_<N>_tokens",
        "prefill tok/s of an N-token prompt",
        "tok/s",
        True,
        "prompt_tokens",
    ),
    Figure("max_context", "longest context the engine accepts", "tokens", True, None),
    Figure("concurrent_requests", "requests vLLM ran at once", "requests", True, None),
)
KNOWN = ", ".join(f.key for f in VOCABULARY)
# A ladder rung measures a declared prompt size when its prompt is within this share of it.
PROMPT_TOLERANCE = 0.10
DEFAULT_FRACTIONS = (0.25, 0.5, 0.9, 1.1)
PROVENANCE = ("unit", "at", "source", "quote")


class ExpectedError(validate.InputError):
    """An ``expected:`` block the gate cannot use; the message names the key."""


@dataclass(frozen=True)
class Expectation:
    key: str
    figure: Figure
    condition: int | None
    value: float | tuple[float, float] | None
    provenance: dict[str, Any]

    @property
    def held(self) -> float | None:
        """The value the achieved figure is held to (a range's lenient end)."""
        if isinstance(self.value, tuple):
            return self.value[0] if self.figure.higher_is_better else self.value[1]
        return self.value


def _figure(key: str) -> tuple[Figure, int | None]:
    for figure in VOCABULARY:
        match = figure.pattern.match(key)
        if match:
            return figure, int(match.group(1)) if figure.condition else None
    raise ExpectedError(
        f"expected.{key} is not a figure the gate knows; the vocabulary"
        f" (plugins/module_utils/qualify/_expected.py, recipes/README.md) is: {KNOWN}"
    )


def _value(key: str, raw: Any) -> float | tuple[float, float] | None:
    # A positive, finite number (YAML's ``.inf`` and ``.nan`` are no published figure).
    if raw is None or validate.finite(raw, above=0) is not None:
        return raw
    if (
        isinstance(raw, list)
        and len(raw) == 2
        and all(validate.finite(v, above=0) is not None for v in raw)
        and raw[0] <= raw[1]
    ):
        return (raw[0], raw[1])
    raise ExpectedError(
        f"expected.{key}: value must be a positive number, a [low, high] range or null"
        f" (not published), got {raw!r}"
    )


def parse(expected: Any) -> list[Expectation]:
    """The declared figures, checked against :data:`VOCABULARY`; ``{}`` or None declares none."""
    if not expected:
        return []
    if not isinstance(expected, dict):
        raise ExpectedError(f"expected must be a mapping of figure: value, got {expected!r}")
    out = []
    for key, entry in expected.items():
        figure, condition = _figure(str(key))
        if figure.condition == "streams" and condition == 1:
            raise ExpectedError(f"expected.{key}: one stream is decode_tps_single_stream")
        if isinstance(entry, dict):
            if "value" not in entry:
                raise ExpectedError(f"expected.{key} has no value (null when not published)")
            unknown = sorted(set(entry) - {"value", *PROVENANCE})
            if unknown:
                raise ExpectedError(
                    f"expected.{key}: unknown field(s) {', '.join(map(str, unknown))}"
                    f" (an entry has value, {', '.join(PROVENANCE)})"
                )
            if "unit" in entry and entry["unit"] != figure.unit:
                raise ExpectedError(
                    f"expected.{key}.unit is {entry['unit']!r}; this figure is in {figure.unit!r}"
                )
            value = _value(str(key), entry["value"])
            provenance = {k: entry[k] for k in PROVENANCE if k in entry}
        else:
            value, provenance = _value(str(key), entry), {}
        out.append(Expectation(str(key), figure, condition, value, provenance))
    return out


def params(expectations: list[Expectation], served_limit: int | None) -> dict[str, Any]:
    """Check parameters that measure the declared conditions: the concurrency check at the
    declared stream count (the largest, when several are declared), and a context-ladder rung
    at every declared prompt size below the served limit, beside the default rungs."""
    out: dict[str, Any] = {}
    streams = [e.condition for e in expectations if e.figure.condition == "streams" and e.held]
    if streams:
        out["concurrency"] = {"requests": max(streams)}
    sizes = sorted(
        {e.condition for e in expectations if e.figure.condition == "prompt_tokens" and e.held}
    )
    if sizes and served_limit:
        extra = [round(n / served_limit, 6) for n in sizes if n < served_limit]
        if extra:
            out["context_ladder"] = {"fractions": sorted({*DEFAULT_FRACTIONS, *extra})}
    return out


def check_params(
    expected: Any, served_limit: Any, defaults: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    """The qualify role's per-check parameters: ``defaults``, then what measures the declared
    figures (:func:`params`), then the user's ``overrides`` (``qualify_params``), which win -
    except that the declared prompt sizes' rungs join the user's own ladder fractions."""
    limit = served_limit if isinstance(served_limit, int) and served_limit > 0 else None
    declared = params(parse(expected), limit)
    out: dict[str, dict[str, Any]] = {}
    for layer in (defaults, declared, overrides):
        for check, values in (layer or {}).items():
            out[check] = {**out.get(check, {}), **(values or {})}
    user_fractions = ((overrides or {}).get("context_ladder") or {}).get("fractions")
    declared_fractions = (declared.get("context_ladder") or {}).get("fractions")
    if isinstance(user_fractions, list) and declared_fractions:
        extra = set(declared_fractions) - set(DEFAULT_FRACTIONS)
        out["context_ladder"]["fractions"] = sorted({*user_fractions, *extra})
    return out


def _by_name(checks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in checks}


def _rung(checks: list[dict[str, Any]], tokens: int) -> tuple[dict[str, Any] | None, str]:
    ladder = _by_name(checks).get("context_ladder")
    rungs = [
        r
        for r in ((ladder or {}).get("evidence") or {}).get("rungs") or []
        if r.get("outcome") == "accepted" and isinstance(r.get("prompt_tokens"), int)
    ]
    near = [r for r in rungs if abs(r["prompt_tokens"] - tokens) <= PROMPT_TOLERANCE * tokens]
    if near:
        return min(near, key=lambda r: abs(r["prompt_tokens"] - tokens)), ""
    sizes = ", ".join(f"{r['prompt_tokens']:,}" for r in rungs) or "none"
    return None, (
        f"no accepted context-ladder rung within {PROMPT_TOLERANCE:.0%} of {tokens:,} tokens"
        f" (accepted: {sizes})"
    )


def _decode_at(checks: list[dict[str, Any]], streams: int) -> tuple[float | None, str, str]:
    concurrency = _by_name(checks).get("concurrency")
    if not concurrency:
        return None, "", "the concurrency check did not run"
    evidence, timings = concurrency.get("evidence") or {}, concurrency.get("timings") or {}
    ran, tokens, wall = evidence.get("requests"), evidence.get("max_tokens"), timings.get("wall_s")
    if ran != streams:
        return None, "", f"the concurrency check ran {ran} streams, not {streams}"
    if concurrency.get("status") != "pass" or not tokens or not wall:
        return None, "", f"the concurrency check at {streams} streams did not pass"
    return round(streams * tokens / wall, 1), f"{streams} streams x {tokens} tokens", ""


def _context(checks: list[dict[str, Any]], got: dict[str, Any]) -> tuple[Any, str, str]:
    """The limit the engine enforces, when the ladder passed and a refusal named it (every
    shorter rung accepted, as predicted); else the longest prompt accepted."""
    ladder = _by_name(checks).get("context_ladder") or {}
    rungs = (ladder.get("evidence") or {}).get("rungs") or []
    named = [r["refused_at"] for r in rungs if isinstance(r.get("refused_at"), int)]
    if ladder.get("status") == "pass" and named:
        return min(named), "limit named by the ladder's refusal", ""
    value = got.get("max_context_accepted")
    if value is None:
        return None, "", "the context ladder accepted no prompt"
    return value, "longest prompt accepted", ""


def _achieved(
    expectation: Expectation, checks: list[dict[str, Any]], got: dict[str, Any]
) -> tuple[Any, str, str]:
    """(achieved, measured at, why not measured)."""
    key = expectation.figure.key
    if key == "decode_tps_single_stream":
        value = got.get("decode_tps_single")
        return (
            value,
            "one request",
            "" if value is not None else "the concurrency check did not run",
        )
    if key == "decode_tps_at_<N>_streams":
        return _decode_at(checks, expectation.condition or 0)
    if key in ("ttft_s_at_<N>_tokens", "prefill_tps_at_<N>_tokens"):
        rung, why = _rung(checks, expectation.condition or 0)
        if rung is None:
            return None, "", why
        field = "ttft_s" if key.startswith("ttft") else "prefill_tps"
        return rung.get(field), f"{rung['prompt_tokens']:,} tokens", ""
    if key == "max_context":
        return _context(checks, got)
    value = got.get("concurrent_requests")
    return value, "peak running", "" if value is not None else "the concurrency check did not pass"


def compare(
    expectations: list[Expectation], checks: list[dict[str, Any]], got: dict[str, Any]
) -> list[dict[str, Any]]:
    """One row per declared figure: expected, achieved, where it was measured, met or not."""
    rows = []
    for e in expectations:
        achieved, measured_at, why = _achieved(e, checks, got)
        held = e.held
        if held is None:
            ok = None
        elif achieved is None:
            ok = False
        else:
            ok = achieved >= held if e.figure.higher_is_better else achieved <= held
        rows.append(
            {
                "figure": e.key,
                "what": e.figure.what,
                "unit": e.figure.unit,
                "expected": list(e.value) if isinstance(e.value, tuple) else e.value,
                "achieved": achieved,
                "measured_at": measured_at,
                "ratio": round(achieved / held, 3) if achieved is not None and held else None,
                "ok": ok,
                "why": why if achieved is None else "",
                **{k: e.provenance[k] for k in ("source", "at") if k in e.provenance},
            }
        )
    return rows


def reasons(rows: list[dict[str, Any]]) -> list[str]:
    """An unmet or unmeasured declared figure, said in one line each (null values are not judged)."""
    out = []
    for row in rows:
        if row["ok"] is not False:
            continue
        want = row["expected"]
        shown = f"{want[0]:g}-{want[1]:g}" if isinstance(want, list) else f"{want:g}"
        if row["achieved"] is None:
            out.append(
                f"expected {row['figure']} {shown} {row['unit']}: not measured ({row['why']})"
            )
        else:
            out.append(
                f"expected {row['figure']} {shown} {row['unit']}, achieved {row['achieved']:g}"
                f" at {row['measured_at']} (ratio {row['ratio']:g})"
            )
    return out
