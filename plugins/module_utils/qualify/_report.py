# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The qualification report and the promotion gate (issue 12 points 3 and 4).

:func:`build` turns the checks' results, the engine's metrics (two ``/metrics``
snapshots) and its periodic log lines into one report: ``checks`` (one entry
per check), ``figures`` (what was measured, comparable run to run), achieved /
expected for every figure the recipe declares (``expected:``), and the
``verdict``: ``promote`` or ``challenger`` with the reasons (the offload qualification report):

- every check passed or was not meaningful (with why);
- every declared expectation is met;
- every node keeps the free-memory reserve after the load (F18), per card on
  discrete GPUs, MemAvailable on unified memory (``preflight._judge.free_memory``);
- no figure regressed against the last promoted report of the same model
  (decode speed, TTFT, concurrent sequences, context).

:func:`markdown` renders it. Pure functions; no AnsibleModule, no I/O.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._metrics import (
    MetricsError,
    delta,
    log_windows,
    summarise,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._judge import (
    free_memory,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._expected import (
    ExpectedError,
    compare,
    parse,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._expected import (
    reasons as expected_reasons,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._judge import (
    FAIL,
    NOT_MEANINGFUL,
    PASS,
    STATUSES,
)

SCHEMA = 1
GIB = 1024**3
# figure: (higher is better, what it is). Regressions compare these.
FIGURES = {
    "decode_tps_single": (True, "decode tok/s of one request"),
    "ttft_s": (False, "time to first token of a short request, s"),
    "concurrent_requests": (True, "requests vLLM ran at once"),
    "max_context_accepted": (True, "longest prompt accepted, tokens"),
    "prefill_tps_longest": (True, "prefill tok/s of the longest accepted rung"),
    "prefix_cache_hit_rate": (True, "prefix-cache hit rate of the shared-prefix batch"),
}

# A latency must also be worse by more than this to regress: the lab's short-request TTFT moves
# by 10-30 ms between two runs of the same recipe (0.024 s then 0.032 s, 2026-12-05).
NOISE_FLOOR_S = {"ttft_s": 0.05}
# Counted, not measured: any loss is a regression. (max_context_accepted is measured: the rung's
# prompt at a fixed fraction of the context varies by about 0.5 % with its text, and a real loss
# is a rung refused, far beyond the tolerance.)
EXACT = ("concurrent_requests",)


class ReportInputError(validate.InputError):
    """Input the report cannot use; the message names it."""


def _check_results(checks: Any) -> list[dict[str, Any]]:
    if not isinstance(checks, list) or not checks:
        raise ReportInputError("checks must be a non-empty list of qualify_check results")
    out = []
    for index, check in enumerate(checks):
        if (
            not isinstance(check, dict)
            or check.get("status") not in STATUSES
            or not check.get("name")
        ):
            raise ReportInputError(
                f"checks[{index}] is not a qualify_check result (name and status pass, fail or"
                f" not_meaningful): {str(check)[:200]}"
            )
        out.append(
            {
                "name": check["name"],
                "status": check["status"],
                "why": check.get("why") or "",
                "timings": check.get("timings") or {},
                "evidence": check.get("evidence") or {},
                **({"runs": check["runs"]} if check.get("runs") else {}),
            }
        )
    return out


def figures(checks: list[dict[str, Any]], windows: dict[str, Any] | None) -> dict[str, Any]:
    """What the checks and the engine measured, comparable from run to run (None: not measured)."""
    by_name = {c["name"]: c for c in checks}
    out: dict[str, Any] = dict.fromkeys(FIGURES)
    smoke = by_name.get("smoke")
    if smoke and smoke["status"] == PASS:
        out["ttft_s"] = smoke["timings"].get("ttft_s")
    concurrency = by_name.get("concurrency")
    if concurrency:
        # one request alone, max_tokens tokens without EOS: the decode speed of one stream
        alone = concurrency["timings"].get("one_request_s")
        tokens = concurrency["evidence"].get("max_tokens")
        if alone and tokens:
            out["decode_tps_single"] = round(tokens / alone, 1)
    if concurrency and concurrency["status"] == PASS:
        evidence = concurrency["evidence"]
        out["concurrent_requests"] = evidence.get("peak_requests_running") or evidence.get(
            "requests"
        )
    single = (windows or {}).get("decode_tps_single_request") or {}
    out["decode_tps_windows_single_median"] = single.get("median")
    ladder = by_name.get("context_ladder")
    if ladder:
        accepted = [
            r for r in ladder["evidence"].get("rungs") or [] if r.get("outcome") == "accepted"
        ]
        if accepted:
            longest = max(accepted, key=lambda r: r.get("prompt_tokens") or 0)
            out["max_context_accepted"] = longest.get("prompt_tokens")
            out["prefill_tps_longest"] = longest.get("prefill_tps")
        out["ttft_by_rung"] = [
            {k: r.get(k) for k in ("fraction", "prompt_tokens", "ttft_s", "prefill_tps", "outcome")}
            for r in ladder["evidence"].get("rungs") or []
        ]
    shared = by_name.get("shared_prefix")
    if shared and shared["status"] == PASS:
        out["prefix_cache_hit_rate"] = shared["evidence"].get("hit_rate")
    hol = by_name.get("head_of_line")
    if hol:
        out["head_of_line_stall_s"] = hol["evidence"].get("stall_s")
    reasoning = by_name.get("reasoning_split")
    if reasoning:
        out["reasoning_field"] = reasoning["evidence"].get("reasoning_key")
    return out


def achieved_vs_expected(
    expected: Any, checks: list[dict[str, Any]], got: dict[str, Any]
) -> list[dict[str, Any]]:
    """Each figure the recipe declares (``_expected.VOCABULARY``) beside what was achieved."""
    try:
        return compare(parse(expected), checks, got)
    except ExpectedError as err:
        raise ReportInputError(str(err)) from None


def cpu_only(nodes: Any) -> bool:
    """Every node's gpu_facts say no GPU: the figures are vLLM's CPU build's (the lab)."""
    gpus = [(facts or {}).get("gpu") for facts in (nodes or {}).values()]
    return bool(gpus) and all(isinstance(g, dict) and g.get("present") is False for g in gpus)


def reserve_rows(nodes: Any, reserve_gib: float) -> list[dict[str, Any]]:
    """Free memory per node after the load (least free card, or MemAvailable) against the reserve."""
    rows = []
    for host, facts in sorted((nodes or {}).items()):
        memory = (facts or {}).get("memory")
        if not isinstance(memory, dict) or "effective_available_bytes" not in memory:
            rows.append({"host": host, "free_gib": None, "source": "no memory facts", "ok": None})
            continue
        free, source = free_memory(memory, (facts or {}).get("gpu"))
        rows.append(
            {
                "host": host,
                "free_gib": round(free / GIB, 2),
                "source": source,
                "reserve_gib": reserve_gib,
                "ok": free / GIB >= reserve_gib,
            }
        )
    return rows


def regressions(got: dict[str, Any], promoted: Any, model: str, tolerance: float) -> list[str]:
    """Figures worse than the last promoted report of the same model by more than ``tolerance``."""
    if not isinstance(promoted, dict) or promoted.get("model") != model:
        return []
    before = promoted.get("figures") or {}
    found = []
    for figure, (higher, what) in FIGURES.items():
        old, new = before.get(figure), got.get(figure)
        if not isinstance(old, (int, float)) or not isinstance(new, (int, float)) or old <= 0:
            continue
        slack = 0.0 if figure in EXACT else tolerance
        worse = new < old * (1 - slack) if higher else new > old * (1 + slack)
        worse = worse and abs(new - old) > NOISE_FLOOR_S.get(figure, 0.0)
        if worse:
            recipe = promoted.get("recipe_hash")
            found.append(
                f"{what} regressed: {new:g} now, {old:g} in the report promoted"
                f" {promoted.get('at') or ''}" + (f" (recipe {recipe[:12]})" if recipe else "")
            )
    return found


def build(
    checks: Any,
    *,
    model: str,
    endpoint: str,
    recipe_hash: str | None = None,
    expected: Any = None,
    metrics_before: str | None = None,
    metrics_after: str | None = None,
    log_text: str | None = None,
    nodes: Any = None,
    reserve_gib: float = 0.0,
    promoted: Any = None,
    tolerance: float = 0.10,
    plan: Any = None,
) -> dict[str, Any]:
    results = _check_results(checks)
    metrics: dict[str, Any] = {}
    for key, text in (("before", metrics_before), ("after", metrics_after)):
        if text:
            try:
                summary = summarise(text, model)
                summary.pop("ttft_histogram", None)
                metrics[key] = summary
            except MetricsError as err:
                metrics[f"{key}_error"] = str(err)
    if metrics_before and metrics_after and "before" in metrics and "after" in metrics:
        metrics["window"] = delta(summarise(metrics_before, model), summarise(metrics_after, model))
    windows = log_windows(log_text) if log_text else None
    got = figures(results, windows)
    rows = achieved_vs_expected(expected, results, got)
    reserve = reserve_rows(nodes, reserve_gib) if nodes else []
    reasons = [f"{c['name']} failed: {c['why']}" for c in results if c["status"] == FAIL]
    reasons += expected_reasons(rows)
    reasons += [
        f"{r['host']} keeps {r['free_gib']} GiB free ({r['source']}), below the reserve"
        f" of {reserve_gib:g} GiB (F18)"
        if r["ok"] is False
        else f"{r['host']}: free memory unknown after the load ({r['source']})"
        for r in reserve
        if r["ok"] is not True
    ]
    reasons += regressions(got, promoted, model, tolerance)
    counts = {status: sum(c["status"] == status for c in results) for status in STATUSES}
    return {
        "schema": SCHEMA,
        "model": model,
        "endpoint": endpoint,
        "recipe_hash": recipe_hash,
        "checks": results,
        "summary": counts,
        "verdict": "challenger" if reasons else "promote",
        "reasons": reasons,
        "figures": got,
        "achieved_vs_expected": rows,
        "cpu_only": cpu_only(nodes),
        "reserve": reserve,
        "metrics": metrics,
        "log_windows": windows,
        "plan": _plan_part(plan),
        "compared_with": {k: (promoted or {}).get(k) for k in ("at", "recipe_hash", "model")}
        if isinstance(promoted, dict)
        else None,
    }


def _plan_part(plan: Any) -> dict[str, Any] | None:
    if not isinstance(plan, dict):
        return None
    return {
        "max_model_len": plan.get("served_max_model_len") or plan.get("max_model_len"),
        "concurrency": plan.get("concurrency"),
        "options": [
            {k: o.get(k) for k in ("max_model_len", "concurrency", "chosen")}
            for o in plan.get("options") or []
            if isinstance(o, dict)
        ],
        "active_sequences": plan.get("active_sequences"),
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return str(value).replace("|", "\\|").replace("\n", " ")


CPU_NOTE = (
    "No node has a GPU: every figure below is vLLM's CPU build's (the lab), not comparable"
    " with a recipe's published figures."
)


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return f"{_cell(value[0])}-{_cell(value[1])}"
    return _cell(value) if value is not None else "not published"


def _expected_lines(report: dict[str, Any]) -> list[str]:
    lines = [CPU_NOTE, ""] if report.get("cpu_only") else []
    lines += [
        "| figure | unit | expected | achieved | measured at | achieved / expected | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["achieved_vs_expected"]:
        met = {True: "yes", False: "**no**", None: "not judged"}[r["ok"]]
        achieved = (
            _cell(r["achieved"]) if r["achieved"] is not None else f"not measured: {r['why']}"
        )
        lines.append(
            f"| {r['figure']} | {r['unit']} | {_shown(r['expected'])} | {_cell(achieved)} |"
            f" {_cell(r['measured_at'] or None)} | {_cell(r['ratio'])} | {met} |"
        )
    sources = [r for r in report["achieved_vs_expected"] if r.get("at") or r.get("source")]
    if sources:
        lines += [""] + [
            f"- `{r['figure']}`: {_cell(r.get('at'))}"
            + (f" ({r['source']})" if r.get("source") else "")
            for r in sources
        ]
    return lines


def markdown(report: dict[str, Any], plots: list[str]) -> str:
    lines = [
        f"# Qualification of `{report['model']}`",
        "",
        f"Endpoint `{report['endpoint']}`"
        + (f", recipe `{report['recipe_hash'][:12]}`" if report.get("recipe_hash") else "")
        + ".",
        "",
        f"**Verdict: {report['verdict']}**"
        + (" — " + "; ".join(report["reasons"]) if report["reasons"] else ""),
        "",
        "| check | status | why | seconds |",
        "|---|---|---|---|",
    ]
    for check in report["checks"]:
        runs = check.get("runs")
        status = check["status"] + (
            f" ({sum(r['status'] == PASS for r in runs)}/{len(runs)} runs)" if runs else ""
        )
        lines.append(
            f"| {check['name']} | {status} | {_cell(check['why'][:300])} |"
            f" {_cell(check['timings'].get('check_s'))} |"
        )
    lines += ["", "## Figures", ""]
    if report.get("cpu_only"):
        lines += [CPU_NOTE, ""]
    lines += ["| figure | value |", "|---|---|"]
    for key, value in report["figures"].items():
        if key != "ttft_by_rung":
            lines.append(f"| {key} | {_cell(value)} |")
    rungs = report["figures"].get("ttft_by_rung") or []
    if rungs:
        lines += [
            "",
            "| rung | prompt tokens | TTFT s | prefill tok/s | outcome |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {_cell(r['fraction'])} | {_cell(r['prompt_tokens'])} | {_cell(r['ttft_s'])} |"
            f" {_cell(r['prefill_tps'])} | {r['outcome']} |"
            for r in rungs
        ]
    if report["achieved_vs_expected"]:
        lines += ["", "## Achieved / expected", "", *_expected_lines(report)]
    if report["reserve"]:
        lines += [
            "",
            "## Free memory after the load (F18)",
            "",
            "| host | free GiB | source | ok |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['host']} | {_cell(r['free_gib'])} | {r['source']} | {_cell(r['ok'])} |"
            for r in report["reserve"]
        ]
    windows = report.get("log_windows") or {}
    decode = windows.get("decode_tps") or {}
    if decode:
        lines += [
            "",
            "## Engine windows (vLLM's periodic stats)",
            "",
            f"{windows['windows']} windows; decode tok/s median {_cell(decode['median'])},"
            f" IQR {_cell(decode['iqr'][0])} to {_cell(decode['iqr'][1])}, peak {_cell(decode['peak'])}.",
        ]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    statuses = ", ".join(f"{report['summary'][s]} {s}" for s in (PASS, FAIL, NOT_MEANINGFUL))
    lines += ["", f"Checks: {statuses}. The whole report: `report.json`.", ""]
    return "\n".join(lines)
