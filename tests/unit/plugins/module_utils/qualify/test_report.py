# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The report and the promotion gate, on the check results of a real qualification run
(tests/unit/fixtures/qualify: vLLM 0.32 CPU serving the lab's scripted model)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._report import (
    ReportInputError,
    build,
    markdown,
    regressions,
)
from ansible_collections.localinference.vllm.plugins.modules import qualify_report

from tests.unit.module_helper import run_module

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
RUN = json.loads((FIXTURES / "qualify" / "checks-scripted-cpu.json").read_text())
CHECKS = RUN["checks"]
MODEL = RUN["model"]
METRICS = FIXTURES / "vllm-metrics"
GIB = 1024**3


def report(checks=None, **extra):
    return build(copy.deepcopy(checks or CHECKS), model=MODEL, endpoint="http://x/v1", **extra)


def memory(free_gib: float) -> dict:
    return {"effective_available_bytes": int(free_gib * GIB), "cgroup_limit_bytes": None}


def test_the_recorded_run_promotes():
    got = report()
    assert got["verdict"] == "promote", got["reasons"]
    assert got["summary"] == {"pass": 12, "fail": 0, "not_meaningful": 2}
    assert got["figures"]["concurrent_requests"] == 4
    assert got["figures"]["reasoning_field"] == "reasoning"
    assert got["figures"]["max_context_accepted"] > 7000


def test_a_failed_check_makes_a_challenger_with_its_reason():
    checks = copy.deepcopy(CHECKS)
    concurrency = next(c for c in checks if c["name"] == "concurrency")
    concurrency.update(status="fail", why="vLLM ran at most 2 of 4 requests at once (F3)")
    got = report(checks)
    assert got["verdict"] == "challenger"
    assert got["reasons"] == ["concurrency failed: vLLM ran at most 2 of 4 requests at once (F3)"]


def test_a_recipe_with_half_the_sequences_regresses_against_the_promoted_report():
    """The lab test's planted regression: the same model now runs 2 sequences where 4 ran."""
    promoted = {
        "model": MODEL,
        "figures": report()["figures"],
        "recipe_hash": "a" * 64,
        "at": "then",
    }
    checks = copy.deepcopy(CHECKS)
    concurrency = next(c for c in checks if c["name"] == "concurrency")
    concurrency["evidence"]["peak_requests_running"] = 2.0
    got = report(checks, promoted=promoted)
    assert got["verdict"] == "challenger"
    assert any("requests vLLM ran at once regressed: 2 now, 4" in r for r in got["reasons"])
    assert got["compared_with"]["recipe_hash"] == "a" * 64


def test_rates_regress_only_beyond_the_tolerance():
    base = report()["figures"]
    promoted = {
        "model": MODEL,
        "figures": dict(base, decode_tps_single=base["decode_tps_single"] * 1.05),
    }
    assert report(promoted=promoted)["verdict"] == "promote"
    promoted["figures"]["decode_tps_single"] = base["decode_tps_single"] * 1.5
    got = report(promoted=promoted)
    assert (
        got["verdict"] == "challenger"
        and "decode tok/s of one request regressed" in got["reasons"][0]
    )


def test_noise_is_not_a_regression():
    """Two runs of the same recipe on the lab (2026-12-05): TTFT 0.024 then 0.032 s, the context
    rung's prompt 33,321 then 33,168 tokens. Neither is a regression; a refused rung or 60 ms is."""
    base = report()["figures"]
    promoted = {"model": MODEL, "figures": dict(base, ttft_s=0.0242, max_context_accepted=33321)}
    same = report(promoted=promoted)
    same_figures = dict(same["figures"])
    for ttft, context, verdict in ((0.0322, 33168, "promote"), (0.0842, 33168, "challenger"),
                                   (0.0322, 6670, "challenger")):
        got = regressions(dict(same_figures, ttft_s=ttft, max_context_accepted=context),
                          promoted, MODEL, 0.1)
        assert ("challenger" if got else "promote") == verdict, (ttft, context, got)


def test_another_models_promoted_report_is_not_compared():
    promoted = {"model": "other/model", "figures": {"concurrent_requests": 64}}
    assert report(promoted=promoted)["verdict"] == "promote"


@pytest.mark.parametrize(
    ("nodes", "verdict", "reason"),
    [
        (
            {"spark-head": {"memory": memory(20)}, "spark-worker": {"memory": memory(9)}},
            "promote",
            None,
        ),
        (
            {"spark-head": {"memory": memory(20)}, "spark-worker": {"memory": memory(2.5)}},
            "challenger",
            "F18",
        ),
        ({"spark-head": {}}, "challenger", "free memory unknown"),
    ],
    ids=["both-keep-the-reserve", "worker-below-the-reserve", "no-facts"],
)
def test_free_memory_reserve_after_the_load(nodes, verdict, reason):
    got = report(nodes=nodes, reserve_gib=3)
    assert got["verdict"] == verdict
    if reason:
        assert reason in " ".join(got["reasons"])


def test_per_card_reserve_on_discrete_gpus():
    gpu = {
        "present": True,
        "unified_memory": False,
        "min_free_memory_mib": 2048,
        "count": 2,
        "gpus": [{"name": "NVIDIA RTX PRO 6000"}],
    }
    got = report(nodes={"box": {"memory": memory(500), "gpu": gpu}}, reserve_gib=3)
    assert got["verdict"] == "challenger"
    assert got["reserve"][0]["free_gib"] == 2.0
    assert "least free GPU" in got["reserve"][0]["source"]


def test_expected_figures():
    met = report(expected={"concurrent_requests": 4, "max_context": 8192})
    assert met["verdict"] == "promote", met["reasons"]
    assert [r["ok"] for r in met["achieved_vs_expected"]] == [True, True]
    unmet = report(expected={"decode_tps_single_stream": {"value": 10**6, "unit": "tok/s"}})
    assert unmet["verdict"] == "challenger"
    assert unmet["reasons"][0].startswith("expected decode_tps_single_stream 1e+06 tok/s, achieved")


def test_report_md_shows_achieved_over_expected_and_says_the_figures_are_the_cpu_builds():
    nodes = {
        host: {"memory": memory(20), "gpu": {"present": False}}
        for host in ("spark-head", "spark-worker")
    }
    got = report(
        expected={
            "decode_tps_at_4_streams": {
                "value": 10**6,
                "unit": "tok/s aggregate",
                "at": "x",
                "source": "s",
            },
            "max_context": 8192,
        },
        nodes=nodes,
        reserve_gib=3,
    )
    assert got["cpu_only"] is True
    assert got["verdict"] == "challenger"
    assert any(
        r.startswith("expected decode_tps_at_4_streams 1e+06 tok/s aggregate")
        for r in got["reasons"]
    )
    text = markdown(got, [])
    assert (
        "| figure | unit | expected | achieved | measured at | achieved / expected | met |" in text
    )
    assert (
        "| max_context | tokens | 8192 | 8192 | limit named by the ladder's refusal | 1 | yes |"
        in text
    )
    assert (
        "| decode_tps_at_4_streams | tok/s aggregate | 1000000 |" in text and "| **no** |" in text
    )
    assert text.count("vLLM's CPU build's") == 2  # above the figures and above achieved / expected
    assert "vLLM's CPU build's" not in markdown(report(), [])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"checks": []}, "checks must be a non-empty list"),
        (
            {"checks": [{"name": "smoke", "status": "ok"}]},
            r"checks\[0\] is not a qualify_check result",
        ),
        (
            {"expected": {"tokens_per_joule": 1}},
            r"expected\.tokens_per_joule is not a figure the gate knows; .*: decode_tps_single_stream,",
        ),
        (
            {"expected": {"max_context": "long"}},
            r"expected\.max_context: value must be a positive number",
        ),
    ],
)
def test_bad_input_is_named(kwargs, message):
    checks = kwargs.pop("checks", CHECKS)
    with pytest.raises(ReportInputError, match=message):
        build(checks, model=MODEL, endpoint="http://x/v1", **kwargs)


def test_metrics_and_log_windows_join_the_report():
    got = report(
        metrics_before=(METRICS / "real-cpu-0.32.0-ngram3-boot.prom").read_text(),
        metrics_after=(METRICS / "real-cpu-0.32.0-ngram3-after-load.prom").read_text(),
        log_text=(METRICS / "real-cpu-0.32.0-ngram3-stats.log").read_text(),
    )
    assert got["metrics"]["window"]["spec_decode"]["drafts"] == 10431.0
    assert got["log_windows"]["acceptance_length"]["peak"] == 4.0
    assert "ttft_histogram" not in got["metrics"]["after"]


def test_unreadable_metrics_are_reported_not_fatal():
    got = report(metrics_before="<html>502</html>")
    assert "not Prometheus text" in got["metrics"]["before_error"]
    assert got["verdict"] == "promote"


def test_markdown_lists_every_check_and_the_verdict():
    got = report()
    text = markdown(got, ["ttft_by_rung.png"])
    assert "**Verdict: promote**" in text
    assert all(f"| {c['name']} |" in text for c in CHECKS)
    assert "![ttft_by_rung.png](ttft_by_rung.png)" in text


def test_the_module_writes_the_report_and_plots(tmp_path):
    args = {
        "checks": CHECKS,
        "dest": str(tmp_path / "qualify"),
        "model": MODEL,
        "endpoint": "http://x/v1",
        "log_text": (METRICS / "real-cpu-0.32.0-ngram3-stats.log").read_text(),
        "plan": {
            "served_max_model_len": 65536,
            "options": [
                {"max_model_len": 32768, "concurrency": {"worst": 8.0}, "chosen": False},
                {"max_model_len": 65536, "concurrency": {"worst": 4.0}, "chosen": True},
            ],
        },
        "expected": {"concurrent_requests": 4},
    }
    done = run_module(qualify_report, args)
    assert not done.failed, done.result
    written = sorted(p.name for p in (tmp_path / "qualify").iterdir())
    assert written == [
        "achieved_vs_expected.png",
        "concurrency_vs_context.png",
        "decode_over_time.png",
        "report.json",
        "report.md",
        "ttft_by_rung.png",
    ]
    saved = json.loads((tmp_path / "qualify" / "report.json").read_text())
    assert saved["verdict"] == done.result["verdict"] == "promote"
    assert {c["name"] for c in saved["checks"]} == {c["name"] for c in CHECKS}


def test_the_module_writes_nothing_in_check_mode(tmp_path):
    args = {
        "checks": CHECKS,
        "dest": str(tmp_path / "q"),
        "model": MODEL,
        "endpoint": "http://x/v1",
    }
    done = run_module(qualify_report, args, check_mode=True)
    assert done.result["verdict"] == "promote" and done.result["files"] == []
    assert not (tmp_path / "q").exists()
