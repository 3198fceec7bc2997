# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The report's PNG plots, drawn with matplotlib (a controller requirement) without a display.

Each plot is drawn only when its data exists: TTFT and prefill tok/s by context
rung, decode tok/s over time (vLLM's periodic stats), concurrency against
context from the plan, achieved / expected. No AnsibleModule here; without
matplotlib :func:`draw` raises :class:`PlotError` saying how to install it.
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

try:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
except ImportError:  # pragma: no cover - exercised through HAS_MATPLOTLIB
    pyplot = None  # type: ignore[assignment]

HAS_MATPLOTLIB = pyplot is not None


class PlotError(validate.Error, RuntimeError):
    """The plots cannot be drawn; the message says why and the fix."""


def _save(figure: Any, directory: str, name: str) -> str:
    figure.tight_layout()
    figure.savefig(os.path.join(directory, name), dpi=100)
    pyplot.close(figure)
    return name


def _ttft_by_rung(report: dict[str, Any], directory: str) -> str | None:
    rungs = [
        r
        for r in report["figures"].get("ttft_by_rung") or []
        if r.get("outcome") == "accepted" and r.get("ttft_s") is not None
    ]
    if not rungs:
        return None
    figure, axis = pyplot.subplots(figsize=(7, 4))
    tokens = [r["prompt_tokens"] or 0 for r in rungs]
    axis.plot(tokens, [r["ttft_s"] for r in rungs], "o-", color="tab:blue", label="TTFT")
    axis.set_xlabel("prompt tokens")
    axis.set_ylabel("TTFT (s)", color="tab:blue")
    twin = axis.twinx()
    twin.plot(
        tokens,
        [r.get("prefill_tps") or 0 for r in rungs],
        "s--",
        color="tab:orange",
        label="prefill",
    )
    twin.set_ylabel("prefill tok/s", color="tab:orange")
    axis.set_title("TTFT and prefill speed by context rung")
    return _save(figure, directory, "ttft_by_rung.png")


def _decode_over_time(report: dict[str, Any], directory: str) -> str | None:
    series = [
        p
        for p in (report.get("log_windows") or {}).get("series") or []
        if p.get("t") is not None and p.get("decode_tps") is not None
    ]
    if len(series) < 2:
        return None
    figure, axis = pyplot.subplots(figsize=(7, 4))
    axis.plot([p["t"] for p in series], [p["decode_tps"] for p in series], ".-", label="decode")
    axis.plot(
        [p["t"] for p in series],
        [p.get("prompt_tps") or 0 for p in series],
        ".:",
        label="prompt",
        alpha=0.6,
    )
    axis.set_xlabel("seconds (vLLM's stats windows)")
    axis.set_ylabel("tok/s")
    axis.legend()
    axis.set_title("Engine throughput over the qualification")
    return _save(figure, directory, "decode_over_time.png")


def _concurrency_vs_context(report: dict[str, Any], directory: str) -> str | None:
    options = [
        o
        for o in (report.get("plan") or {}).get("options") or []
        if o.get("max_model_len") and o.get("concurrency") is not None
    ]
    if not options:
        return None

    def worst(value: Any) -> float:
        return validate.number("plan option concurrency", value.get("worst", 0.0) if isinstance(value, dict) else value)

    figure, axis = pyplot.subplots(figsize=(7, 4))
    axis.plot(
        [o["max_model_len"] for o in options], [worst(o["concurrency"]) for o in options], "o-"
    )
    chosen = [o for o in options if o.get("chosen")]
    if chosen:
        axis.plot(
            [chosen[0]["max_model_len"]], [worst(chosen[0]["concurrency"])], "r*", markersize=14
        )
    axis.set_xscale("log", base=2)
    axis.set_xlabel("context (tokens)")
    axis.set_ylabel("full-length requests (worst boot)")
    axis.set_title("Concurrency against context (the plan)")
    return _save(figure, directory, "concurrency_vs_context.png")


def _achieved_vs_expected(report: dict[str, Any], directory: str) -> str | None:
    rows = [r for r in report.get("achieved_vs_expected") or [] if r.get("ratio") is not None]
    if not rows:
        return None
    figure, axis = pyplot.subplots(figsize=(7, 4))
    colours = ["tab:green" if r["ok"] else "tab:red" for r in rows]
    axis.bar([r["figure"] for r in rows], [r["ratio"] for r in rows], color=colours)
    axis.axhline(1.0, color="black", linewidth=1)
    axis.set_ylabel("achieved / expected")
    axis.set_title("Achieved against the recipe's expectations")
    return _save(figure, directory, "achieved_vs_expected.png")


def draw(report: dict[str, Any], directory: str) -> list[str]:
    """Write the plots that have data into ``directory``; return their file names."""
    if not HAS_MATPLOTLIB:
        raise PlotError(
            "matplotlib is not installed on the controller: install the controller requirements"
            " (pip install -r requirements.txt), or set qualify_plots: false"
        )
    names = []
    for plot in (_ttft_by_rung, _decode_over_time, _concurrency_vs_context, _achieved_vs_expected):
        name = plot(report, directory)
        if name:
            names.append(name)
    return names
