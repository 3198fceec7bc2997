# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's /metrics and its periodic log lines, from recorded real text (tests/unit/fixtures/vllm-metrics)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.engine import _metrics
from ansible_collections.localinference.vllm.plugins.module_utils.engine._metrics import (
    MetricsError,
    delta,
    log_windows,
    quartiles,
    summarise,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
METRICS = FIXTURES / "vllm-metrics"
TINY = "localinference/tiny-deepseek"


def text(name: str) -> str:
    return (METRICS / name).read_text()


# (fixture, model, expected subset of summarise(); ttft compared on its own keys)
SUMMARIES = [
    pytest.param(
        "real-cpu-0.32.0-after-4-requests.prom",
        TINY,
        {
            "requests_running": 0.0,
            "prompt_tokens": 30.0,
            "generation_tokens": 112.0,
            "requests_finished": 4.0,
            "requests_finished_by_reason": {
                "stop": 0.0,
                "length": 4.0,
                "abort": 0.0,
                "error": 0.0,
                "repetition": 0.0,
            },
            "prefix_cache_queries": 30.0,
            "prefix_cache_hits": 0.0,
            "prefix_cache_hit_rate": 0.0,
            "ttft": {"count": 4, "p50": 0.01},
            "spec_decode": None,
        },
        id="real-0.32-cpu",
    ),
    pytest.param(
        "real-cpu-0.32.0-ngram3-boot.prom",
        None,
        {
            "prompt_tokens": 0.0,
            "requests_finished": 0.0,
            "prefix_cache_hit_rate": None,
            "spec_decode": {
                "drafts": 0.0,
                "draft_tokens": 0.0,
                "accepted_tokens": 0.0,
                "mean_acceptance_length": None,
                "draft_acceptance_rate": None,
                "per_position_acceptance": [None, None, None],
                "per_position_accepted": [0.0, 0.0, 0.0],
            },
        },
        id="real-0.32-cpu-ngram-boot",
    ),
    pytest.param(
        "real-cpu-0.32.0-ngram3-after-load.prom",
        TINY,
        {
            "spec_decode": {
                "drafts": 10431.0,
                "draft_tokens": 31293.0,
                "accepted_tokens": 14086.0,
                # vLLM's definitions: 1 + accepted/drafts, accepted/drafted, per position /drafts
                "mean_acceptance_length": round(1 + 14086 / 10431, 4),
                "draft_acceptance_rate": round(14086 / 31293, 6),
                "per_position_acceptance": [
                    round(5276 / 10431, 4),
                    round(4415 / 10431, 4),
                    round(4395 / 10431, 4),
                ],
                "per_position_accepted": [5276.0, 4415.0, 4395.0],
            },
        },
        id="real-0.32-cpu-ngram-after-load",
    ),
    pytest.param(
        "public-v0.10.0-glm45-deprecated-gpu-prefix.prom",
        None,
        # the new name wins over its deprecated gpu_ twin; hits only under the old name
        {
            "prefix_cache_queries": 32.0,
            "prefix_cache_hits": 0.0,
            "kv_cache_usage_perc": 9.75010481363281e-06,
        },
        id="public-0.10-deprecated-names",
    ),
    pytest.param(
        "public-v0-qwen-coder-gpu-cache-names.prom",
        None,
        {
            "requests_running": 0.0,
            "requests_waiting": 0.0,
            "kv_cache_usage_perc": 0.0,
            "prefix_cache_queries": None,
        },
        id="public-v0-gpu-cache-usage",
    ),
    pytest.param(
        "public-v0-lora-two-models-ttft.prom",
        "sql-lora",
        {"ttft": {"count": 1, "mean": None}},
        id="public-lora-adapter-only",
    ),
    pytest.param(
        "public-v0-lora-two-models-ttft.prom",
        "meta-llama/Llama-2-7b-hf",
        # the paste ends at le=0.25: no +Inf bucket, so no count; quantiles from what is there
        {"ttft": {"count": None, "p50": 0.03}},
        id="public-lora-base-model-cut-paste",
    ),
]


@pytest.mark.parametrize(("fixture", "model", "expected"), SUMMARIES)
def test_summarise_recorded_metrics(fixture, model, expected):
    got = summarise(text(fixture), model)
    for key, value in expected.items():
        if key == "ttft":
            for sub, want in value.items():
                assert got["ttft"][sub] == want, (sub, got["ttft"])
        else:
            assert got[key] == value, key


def test_cache_config_is_published_by_0_32():
    config = summarise(text("real-cpu-0.32.0-after-4-requests.prom"), TINY)["cache_config"]
    assert config["block_size"] == "128"
    assert config["kv_cache_size_tokens"] == "2097152"
    assert "model_name" not in config


def test_delta_of_two_real_snapshots_is_the_window():
    before = summarise(text("real-cpu-0.32.0-ngram3-boot.prom"), TINY)
    after = summarise(text("real-cpu-0.32.0-ngram3-after-load.prom"), TINY)
    window = delta(before, after)
    assert window["restarted"] is False
    assert window["prompt_tokens"] == after["prompt_tokens"]
    assert window["spec_decode"]["drafts"] == 10431.0
    assert window["ttft"]["count"] == after["ttft"]["count"]
    assert window["prefix_cache_hit_rate"] == after["prefix_cache_hit_rate"]


def test_delta_backwards_is_a_restart_not_negative_counters():
    before = summarise(text("real-cpu-0.32.0-ngram3-after-load.prom"), TINY)
    after = summarise(text("real-cpu-0.32.0-ngram3-boot.prom"), TINY)
    window = delta(before, after)
    assert window["restarted"] is True
    assert window["prompt_tokens"] is None
    assert window["ttft"] is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("", "is empty"),
        ("<html><body>502 Bad Gateway</body></html>", "not Prometheus text"),
        ('{"error": {"message": "missing or wrong API key"}}', "not Prometheus text"),
        (
            "# HELP process_open_fds x\n# TYPE process_open_fds gauge\nprocess_open_fds 3.0\n",
            "no vllm: sample",
        ),
    ],
    ids=["empty", "html", "json", "not-vllm"],
)
def test_unreadable_metrics_say_what_and_the_fix(body, message):
    with pytest.raises(MetricsError, match=message):
        summarise(body)


def test_wrong_model_name_is_named():
    with pytest.raises(MetricsError, match="for model 'other'"):
        summarise(text("real-cpu-0.32.0-after-4-requests.prom"), "other")


def test_without_prometheus_client_the_fix_is_named(monkeypatch):
    monkeypatch.setattr(_metrics, "HAS_PROMETHEUS_CLIENT", False)
    with pytest.raises(MetricsError, match=r"pip install -r requirements\.txt"):
        summarise(text("real-cpu-0.32.0-after-4-requests.prom"))


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0], (1.0, 1.0, 1.0)),
        ([1.0, 2.0], (1.0, 1.5, 2.0)),
        ([1.0, 2.0, 3.0, 4.0, 5.0], (2.0, 3.0, 4.0)),  # Tukey: the median in both halves
        ([6.0, 1.0, 3.0, 2.0], (1.5, 2.5, 4.5)),
        ([], None),
    ],
)
def test_quartiles_are_tukeys_hinges(values, expected):
    assert quartiles(values) == expected


def test_seed002_windows_match_its_published_figures():
    """Seed 002 published peak/best figures of the windows whose lines it quotes."""
    windows = log_windows((FIXTURES / "vllm-logs" / "seed002-rtx-pro-6000.log").read_text())
    assert windows["windows"] == 6 and windows["spec_windows"] == 2
    assert windows["decode_tps"]["peak"] == 359.0  # "Peak generation throughput 359.0 tok/s"
    assert windows["prompt_tps"]["peak"] == 5790.1  # "Peak prompt throughput 5,790.1 tok/s"
    assert windows["kv_cache_usage_pct"]["peak"] == 79.4  # "Peak GPU KV usage 79.4%"
    assert windows["prefix_cache_hit_rate_pct"]["peak"] == 97.4  # "reached 97.4%"
    assert windows["external_prefix_cache_hit_rate_pct"]["peak"] == 11.4  # "reached 11.4%"
    assert windows["acceptance_length"]["peak"] == 5.9  # "best 5.90"
    assert windows["draft_acceptance_rate_pct"]["peak"] == 98.1  # "best 98.1%"
    assert windows["draft_acceptance_rate_pct"]["min"] == 41.9  # "range 41.9-98.1%"
    # its quoted lines are out of time order (02:49:49 before 02:49:29): the series is sorted
    assert [p["t"] for p in windows["series"]] == [0.0, 110.0, 200.0, 210.0, 220.0, 270.0]


def test_real_cpu_ngram_windows():
    windows = log_windows(text("real-cpu-0.32.0-ngram3-stats.log"))
    assert windows["windows"] == 12 and windows["spec_windows"] == 8
    assert windows["decode_tps"]["peak"] == 742.3
    assert windows["running"]["peak"] == 5.0
    assert windows["acceptance_length"]["peak"] == 4.0
    assert windows["draft_acceptance_rate_pct"]["min"] == 5.7
    assert len(windows["per_position_acceptance_median"]) == 3


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        (
            "public-stats-windows.log",
            {"windows": 5, "decode": (1055.3, [734.9, 1226.3], 1242.7), "waiting_peak": 43.0},
        ),
        (
            "public-stats-podman-timestamps.log",
            {"windows": 4, "decode": (6.45, [5.25, 7.2], 7.2), "waiting_peak": 1.0},
        ),
    ],
)
def test_public_stats_windows(fixture, expected):
    windows = log_windows(text(fixture))
    assert windows["windows"] == expected["windows"]
    decode = windows["decode_tps"]
    assert (decode["median"], decode["iqr"], decode["peak"]) == expected["decode"]
    assert windows["waiting"]["peak"] == expected["waiting_peak"]
    assert [p["t"] for p in windows["series"]] == [10.0 * i for i in range(expected["windows"])]


def test_public_spec_lines_of_three_eras():
    windows = log_windows(text("public-spec-decoding-lines.log"))
    assert windows["spec_windows"] == 5
    # the 0.10-era line puts "Draft acceptance rate" first, without "Avg"
    assert windows["draft_acceptance_rate_pct"]["windows"] == 5
    assert windows["draft_acceptance_rate_pct"]["peak"] == 88.8
    assert windows["acceptance_length"]["peak"] == 5.44
    assert len(windows["per_position_acceptance_median"]) == 15


def test_no_stats_lines_is_an_empty_summary_not_an_error():
    windows = log_windows('INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n')
    assert windows["windows"] == 0 and windows["decode_tps"] is None and windows["series"] == []
