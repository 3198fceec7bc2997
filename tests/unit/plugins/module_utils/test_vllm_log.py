# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM log parser against every log line the seeds quote, and real CPU-vLLM logs."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils._vllm_log import (
    context_rejection,
    line_rank,
    parse_log,
    to_observations,
)

FIXTURES = Path(__file__).resolve().parents[3] / "unit" / "fixtures" / "vllm-logs"
J = "Aug 04 02:44:21 compute-server grandpa[572062]: "

# (line, expected subset of parse_log(line))
LINES = [
    pytest.param(
        "GPU KV cache size: 47,930 tokens, Maximum concurrency for 24,576 tokens per request: 1.95x",
        {
            "kv_cache_device": "GPU",
            "kv_cache_tokens": 47930,
            "max_concurrency": 1.95,
            "concurrency_max_model_len": 24576,
        },
        id="seed000-one-line",
    ),
    pytest.param(
        J
        + "(EngineCore pid=179) INFO 08-04 02:44:21 [kv_cache_utils.py:2428] GPU KV cache size: 285,336 tokens\n"
        + J
        + "(EngineCore pid=179) INFO 08-04 02:44:21 [kv_cache_utils.py:2429] Maximum concurrency for 262,144 tokens per request: 1.09x",
        {"kv_cache_tokens": 285336, "max_concurrency": 1.09, "concurrency_max_model_len": 262144},
        id="seed002-two-lines",
    ),
    pytest.param(
        "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 4,096 tokens per request: 512.00x",
        {"kv_cache_device": "CPU", "kv_cache_tokens": 2097152, "max_concurrency": 512.0},
        id="lab-cpu",
    ),
    pytest.param(
        J
        + "(Worker_TP0 pid=264) INFO 08-04 02:44:21 [gpu_worker.py:617] Available KV cache memory: 8.59 GiB",
        {"available_kv_gib": [{"rank": 0, "worker": "TP0", "gib": 8.59}]},
        id="seed002-available",
    ),
    pytest.param(
        "(Worker_TP1 pid=265) INFO Available KV cache memory: 7.25 GiB",
        {"available_kv_gib": [{"rank": 1, "worker": "TP1", "gib": 7.25}]},
        id="rank1-available",
    ),
    pytest.param(
        "reserved 14.0 GiB memory for KV Cache as specified by kv_cache_memory_bytes config\n"
        "and skipped memory profiling. This does not respect the gpu_memory_utilization config.",
        {"profiling_skipped": True, "kv_reserved_gib": 14.0},
        id="seed000-skipped-profiling",
    ),
    pytest.param(
        "[rank1]: memory allocation failed with OOM on device 0 while trying to allocate 15032385536 bytes\n"
        "ERROR ... ray_executor_v2.py:514] RayWorkerProc rank=[1] died unexpectedly, shutting down executor.",
        {"oom_rank": 1, "died_ranks": [1]},
        id="seed000-oom",
    ),
    pytest.param(
        "(Worker_TP1 pid=9) ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 22.04 GiB",
        {"oom_rank": 1},
        id="torch-oom",
    ),
    pytest.param(
        "Aug 04 02:44:37 compute-server grandpa[572062]: (EngineCore pid=179) WARNING 08-04 02:44:37 [vllm.py:1758]"
        " max_num_scheduled_tokens is set to 8184 based on the speculative decoding settings. This may lead"
        " to suboptimal performance.",
        {"scheduled_tokens": 8184},
        id="seed002-scheduled",
    ),
    pytest.param(
        "ERROR 07-11 06:23:05 [core.py:390] ValueError: To serve at least one request with the models's max seq"
        " len (118000), (6.30 GiB KV cache is needed, which is larger than the available KV cache memory"
        " (6.11 GiB). Based on the available memory, the estimated maximum model length is 114432. Try"
        " increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
        {
            "kv_insufficient": True,
            "requested_max_model_len": 118000,
            "kv_needed_gib": 6.3,
            "kv_available_gib": 6.11,
            "estimated_max_model_len": 114432,
        },
        id="insufficient-models's",
    ),
    pytest.param(
        "ValueError: To serve at least one request with the model's max seq len (4096), (0.58 GiB KV cache"
        " is needed, which is larger than the available KV cache memory (0.47 GiB). Based on the available"
        " memory, the estimated maximum model length is 3280. Try increasing",
        {"kv_insufficient": True, "requested_max_model_len": 4096, "estimated_max_model_len": 3280},
        id="insufficient-model's",
    ),
    pytest.param(
        "(EngineCore pid=17635) ValueError: Free memory on device cuda:0 (15.32/22.04 GiB) on startup is"
        " less than desired GPU memory utilization (0.88, 19.39 GiB). Decrease GPU",
        {
            "startup_memory": [
                {
                    "rank": 0,
                    "worker": "TP0",
                    "device": "cuda:0",
                    "free_gib": 15.32,
                    "total_gib": 22.04,
                    "requested_utilization": 0.88,
                    "requested_gib": 19.39,
                    "below_requested": True,
                }
            ]
        },
        id="free-memory-below",
    ),
    pytest.param(
        "Running: 1 reqs, Waiting: 1 reqs",
        {"stats": [{"running": 1, "waiting": 1}]},
        id="seed000-serialised",
    ),
    pytest.param(
        "This model's maximum context length is 16384 tokens. However, you requested 8192\n"
        "output tokens and your prompt contains at least 8193 input tokens, for a total of at\n"
        "least 16385 tokens. (parameter=input_tokens, value=8193)",
        {
            "context_errors": [
                {
                    "max_context_length": 16384,
                    "requested_output_tokens": 8192,
                    "prompt_tokens_at_least": 8193,
                    "prompt_tokens_is_lower_bound": True,
                }
            ],
            "context_limits": [16384],
        },
        id="seed000-rejection",
    ),
]


@pytest.mark.parametrize(("text", "expected"), LINES)
def test_lines(text: str, expected: dict) -> None:
    parsed = parse_log(text)
    for key, value in expected.items():
        assert parsed[key] == value, key


def test_seed002_excerpt() -> None:
    parsed = parse_log((FIXTURES / "seed002-rtx-pro-6000.log").read_text())
    assert parsed["version"].startswith("0.11.2.dev280+gilded.gnosis")
    assert (parsed["kv_cache_tokens"], parsed["max_concurrency"]) == (285336, 1.09)
    assert parsed["concurrency_max_model_len"] == 262144
    assert parsed["available_kv_gib"] == [{"rank": 0, "worker": "TP0", "gib": 8.59}]
    memory = parsed["startup_memory"][0]
    assert (memory["free_gib"], memory["total_gib"], memory["requested_utilization"]) == (
        93.73,
        94.97,
        0.975,
    )
    assert memory["weights_gib"] == 81.01
    assert parsed["kv_cache_memory_bytes_suggested"] == {
        "fit_requested": 9288604570,
        "fully_utilize": 10511114752,
    }
    assert parsed["scheduled_tokens"] == 8184
    assert parsed["init_seconds"] == 47.53
    summary = parsed["stats_summary"]
    assert summary["peak_generation_throughput"] == 359.0
    assert summary["peak_prompt_throughput"] == 5790.1
    assert summary["peak_kv_cache_usage_pct"] == 79.4
    assert summary["peak_prefix_cache_hit_rate_pct"] == 97.4
    assert summary["best_mean_acceptance_length"] == 5.9
    assert summary["best_draft_acceptance_rate_pct"] == 98.1
    assert parsed["spec_decode"][1]["per_position_acceptance"] == [
        0.789,
        0.542,
        0.362,
        0.247,
        0.152,
    ]
    assert parsed["stats"][0]["external_prefix_cache_hit_rate_pct"] == 0.8
    assert parsed["stats"][0]["prefix_cache_hit_rate_pct"] == 88.1
    assert parsed["offload_mmaps"][0]["gb"] == 8.59
    assert parsed["kv_transfer"]["kv_offload_load_bytes"] == 185264640
    assert parsed["http_status"] == {"200": 5}
    assert len(parsed["boots"]) == 1


def test_seed000_excerpt() -> None:
    parsed = parse_log((FIXTURES / "seed000-dgx-spark.log").read_text())
    assert parsed["kv_cache_tokens"] == 47930
    assert parsed["profiling_skipped"] is True
    assert parsed["oom"][0]["bytes"] == 15032385536
    assert parsed["stats_summary"]["max_waiting"] == 1
    assert any("died unexpectedly" in error for error in parsed["errors"])


def test_every_seed_quote_yields_something() -> None:
    """Each quoted vLLM line in the seed fixtures is recognised by at least one rule."""
    quiet = (
        "quant_config",
        "attention.py",
        "mxfp4.py",
        "b12x_moe",
        "shared_offload_region.py:9",
        "Unlinked",
        "base.py:493",
        "api_utils.py:345]   ",
        "Environment=",
    )
    for name in ("seed000-dgx-spark.log", "seed002-rtx-pro-6000.log"):
        for line in (FIXTURES / name).read_text().splitlines():
            if (
                not line.strip()
                or any(q in line for q in quiet)
                or (line[:1].islower() and "reserved" not in line)
            ):
                continue
            parsed = parse_log(line)
            empty = parse_log("")
            assert parsed != empty, line


def test_boots_are_split() -> None:
    text = "\n".join(
        f"GPU KV cache size: {t:,} tokens, Maximum concurrency for {n:,} tokens per request: {t / n:.2f}x"
        for t, n in ((26890, 24576), (33932, 16384), (34887, 24576), (47930, 24576))
    )
    parsed = parse_log(text)
    assert [b["kv_cache_tokens"] for b in parsed["boots"]] == [26890, 33932, 34887, 47930]
    assert parsed["boots"][1]["max_concurrency"] == 2.07
    assert parsed["kv_cache_tokens"] == 47930


def test_version_banner_starts_a_boot() -> None:
    text = (
        "INFO vLLM API server version 0.31.0\nCPU KV cache size: 100 tokens, Maximum concurrency for 50"
        " tokens per request: 2.00x\nINFO vLLM API server version 0.32.0\nCPU KV cache size: 200 tokens\n"
        "Maximum concurrency for 100 tokens per request: 2.00x\n"
    )
    parsed = parse_log(text)
    assert [(b["version"], b["kv_cache_tokens"]) for b in parsed["boots"]] == [
        ("0.31.0", 100),
        ("0.32.0", 200),
    ]
    assert parsed["version"] == "0.32.0"


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        ("(Worker_TP1 pid=265) INFO", 1),
        ("(Worker_PP0_TP1 pid=3) INFO", 1),
        ("[rank1]: memory allocation failed", 1),
        ("RayWorkerProc rank=[1] died", 1),
        ("(EngineCore_DP0 pid=1) INFO", None),
    ],
)
def test_line_rank(line: str, rank: int | None) -> None:
    assert line_rank(line) == rank


def test_rejection_bound_and_measurement() -> None:
    bound = context_rejection(
        "maximum context length is 16384 tokens. However, you requested 8192 output tokens and your"
        " prompt contains at least 8193 input tokens"
    )
    assert bound["prompt_tokens_is_lower_bound"] is True
    measured = context_rejection(
        "maximum context length is 16384 tokens. However, you requested 100 output tokens and your"
        " prompt contains at least 30000 input tokens"
    )
    assert measured["prompt_tokens_is_lower_bound"] is False


def test_to_observations_per_rank() -> None:
    text = (
        "(Worker_TP0 pid=1) INFO Available KV cache memory: 8.59 GiB\n"
        "(Worker_TP1 pid=2) INFO Available KV cache memory: 8.40 GiB\n"
        "GPU KV cache size: 285,336 tokens, Maximum concurrency for 262,144 tokens per request: 1.09x\n"
    )
    entries = to_observations(parse_log(text), host="h", recorded_at="t", recipe_hash="r")
    assert [(e["rank"], e["kv_memory_gib"], e["kv_tokens"]) for e in entries] == [
        (0, 8.59, 285336),
        (1, 8.40, 285336),
    ]
    assert set(entries[0]) >= {
        "recorded_at",
        "recipe_hash",
        "host",
        "rank",
        "version",
        "max_model_len",
        "kv_tokens",
        "max_concurrency",
        "available_kv_gib",
        "profiling_skipped",
    }
    assert to_observations(parse_log("nothing"), host="h", recorded_at="t") == []


def test_to_observations_explicit_memory_wins() -> None:
    text = (
        "reserved 7.0 GiB memory for KV Cache as specified by kv_cache_memory_bytes config\n"
        "GPU KV cache size: 18,272 tokens, Maximum concurrency for 16,384 tokens per request: 1.12x"
    )
    entries = to_observations(parse_log(text), host="h", recorded_at="t")
    assert entries[0]["kv_memory_gib"] == 7.0 and entries[0]["profiling_skipped"] is True
    entries = to_observations(parse_log(text), host="h", recorded_at="t", kv_memory_gib=6.5)
    assert entries[0]["kv_memory_gib"] == 6.5


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*cpu-*.log")), ids=lambda p: p.name)
def test_real_cpu_logs(path: Path) -> None:
    """Logs produced by the real CPU vLLM 0.32.0 in the lab: a boot, or a start error."""
    parsed = parse_log(path.read_text())
    if "--headless" in path.read_text() or "-worker-" in path.name:
        # a headless rank logs its own KV memory; the engine's capacity is on the head
        assert parsed["kv_cache_tokens"] is None and parsed["errors"] == []
        assert parsed["available_kv_gib"] and parsed["available_kv_gib"][0]["rank"] > 0
        return
    assert parsed["version"] == "0.32.0"
    if parsed["kv_insufficient"]:
        assert parsed["estimated_max_model_len"] < parsed["requested_max_model_len"]
        assert parsed["kv_needed_gib"] > parsed["kv_available_gib"]
    elif parsed["kv_cache_tokens"] is None:
        assert parsed["errors"]
        assert any(m["below_requested"] for m in parsed["startup_memory"])
    else:
        assert parsed["kv_cache_device"] == "CPU"
        assert parsed["available_kv_gib"]
        tokens = parsed["max_concurrency"] * parsed["concurrency_max_model_len"]
        assert abs(tokens - parsed["kv_cache_tokens"]) <= parsed["concurrency_max_model_len"] * 0.01


def test_real_cpu_insufficient_kv():
    parsed = parse_log((FIXTURES / "cpu-insufficient-kv-32768.log").read_text())
    assert parsed["kv_insufficient"] is True
    assert (parsed["requested_max_model_len"], parsed["estimated_max_model_len"]) == (32768, 17024)
    assert (parsed["kv_needed_gib"], parsed["kv_available_gib"]) == (0.02, 0.01)
    assert parsed["kv_cache_tokens"] is None


def test_real_cpu_calibration_boot():
    parsed = parse_log((FIXTURES / "cpu-calibration-2g-8192.log").read_text())
    assert (parsed["kv_cache_tokens"], parsed["max_concurrency"]) == (4194304, 512.0)
    assert parsed["available_kv_gib"] == [{"rank": 0, "worker": "TP0", "gib": 2.0}]
    assert parsed["errors"] == []


def test_warnings_are_not_errors():
    line = (
        "(APIServer pid=1) WARNING 11-29 11:06:09 [system_utils.py:255] Found ulimit of 20000 and failed"
        " to automatically increase with error current limit exceeds maximum limit. This can cause fd"
        " limit errors like `OSError: [Errno 24] Too many open files`."
    )
    assert parse_log(line)["errors"] == []
    assert parse_log("OSError: [Errno 14] Bad address")["errors"] == [
        "OSError: [Errno 14] Bad address"
    ]


def test_real_tp2_head_and_worker():
    head = FIXTURES / "real-cpu-tp2-mp-head-kv1g-len4096.log"
    worker = FIXTURES / "real-cpu-tp2-mp-worker-kv1g-len4096.log"
    on_head = parse_log(head.read_text())
    assert (on_head["kv_cache_tokens"], on_head["max_concurrency"]) == (4194304, 1024.0)
    assert on_head["available_kv_gib"] == [{"rank": 0, "worker": "TP0", "gib": 1.0}]
    assert parse_log(worker.read_text())["available_kv_gib"] == [{"rank": 1, "worker": "TP1", "gib": 1.0}]
