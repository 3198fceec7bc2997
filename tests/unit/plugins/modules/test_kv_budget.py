# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kv_budget end to end: case tables of arguments and what the module returns."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.modules import kv_budget, vllm_log_facts
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

SEED000 = [
    {"max_model_len": 24576, "kv_tokens": 26890},
    {"max_model_len": 16384, "kv_tokens": 33932},
    {"max_model_len": 24576, "kv_tokens": 34887},
    {"max_model_len": 24576, "kv_tokens": 47930},
]
SEED000_RECIPE = {  # seed 000 mid-remediation (its first 8192 was below the prompt floor)
    "max_model_len": 16384,
    "max_num_seqs": 1,
    "max_num_batched_tokens": 8192,
    "kv_cache_memory_bytes": 7516192768,
    "gpu_memory_utilization": 0.75,
    "tool_call_parser": "deepseek_v4",
}
SEED002_RECIPE = {
    "max_model_len": 262144,
    "max_num_seqs": 2,
    "max_num_batched_tokens": 8192,
    "gpu_memory_utilization": 0.975,
    "reasoning_parser": "deepseek_v4",
    "tool_call_parser": "deepseek_v4",
    "speculative_config": {
        "method": "dspark",
        "num_speculative_tokens": 5,
        "parallel_drafting": True,
    },
    "kv_offloading_size": 8,
    "ipc_host": True,
    "privileged": True,
}


def ids(result) -> list[str]:
    return sorted({v["id"] for v in result["violations"]})


def test_seed000_plan_and_lint():
    result = run_module(
        kv_budget,
        {
            "observations": SEED000,
            "granularity": 8192,
            "prompt_floor": 8193,
            "recipe": SEED000_RECIPE,
            "client_limits": {"context": 16384, "output": 8192},
        },
    ).result
    assert result["changed"] is False
    assert result["max_model_len"] == 24576
    assert result["concurrency"]["worst"] == pytest.approx(1.0942, abs=1e-4)
    assert result["calibrated"] is False
    assert ids(result) == ["F1", "F3", "F6", "F8", "F9"]
    assert result["feasible"] is False
    assert result["served_max_model_len"] == 16384
    # 8,193 + 8,192 = 16,385 > 16,384
    assert any("16385 > max_model_len 16384" in v["message"] for v in result["violations"])
    # the served 16384 cannot host a sound client at all: say how much more is needed
    assert result["client"]["ok"] is False
    assert (
        result["client"]["additional_context_needed"]
        == result["client"]["needed_context"] - 16384
        > 0
    )


def test_seed000_192_token_client():
    result = run_module(
        kv_budget,
        {
            "observations": SEED000,
            "prompt_floor": 8193,
            "recipe": {"max_model_len": 16384, "max_num_seqs": 4},
            "client_limits": {"context": 8192, "input": 8192, "output": 4096, "reserved": 8000},
        },
    ).result
    f9 = [v for v in result["violations"] if v["id"] == "F9" and "192" in v["message"]]
    assert f9 and f9[0]["severity"] == "error"


def test_seed000_first_context_below_floor_is_bad_input():
    outcome = run_module(
        kv_budget,
        {"observations": SEED000, "prompt_floor": 8193, "recipe": {"max_model_len": 8192}},
    )
    assert outcome.failed
    assert "recipe.max_model_len 8192 is below prompt_floor 8193" in outcome.result["msg"]


def test_seed000_remediated_is_clean():
    recipe = {
        **SEED000_RECIPE,
        "max_model_len": "plan",
        "max_num_seqs": 4,
        "reasoning_parser": "deepseek_v4",
    }
    del recipe["kv_cache_memory_bytes"]
    result = run_module(
        kv_budget,
        {"observations": SEED000, "granularity": 8192, "prompt_floor": 8193, "recipe": recipe},
    ).result
    assert result["violations"] == []
    assert result["feasible"] is True
    assert result["client"]["working_budget"] == 20480
    assert result["served_max_model_len"] == 24576


def test_seed000_32768_against_best_boot_is_f2():
    recipe = {"max_model_len": 32768, "max_num_seqs": 4}
    result = run_module(
        kv_budget, {"observations": SEED000, "granularity": 8192, "recipe": recipe}
    ).result
    (finding,) = result["violations"]
    assert finding["id"] == "F2" and "recipe.max_model_len=32768" in finding["message"]
    assert "set max_model_len to 24576" in finding["message"]


def test_seed002():
    obs = [
        {
            "recorded_at": "2026-08-04T02:44:21",
            "rank": 0,
            "max_model_len": 262144,
            "kv_tokens": 285336,
            "available_kv_gib": 8.59,
        }
    ]
    result = run_module(
        kv_budget, {"observations": obs, "recipe": SEED002_RECIPE, "granularity": 65536}
    ).result
    assert result["scheduled_tokens"] == 8184
    assert result["max_model_len"] == 262144
    assert round(result["concurrency"]["worst"], 2) == 1.09
    assert ids(result) == ["F15", "F16", "F17"]
    sequences = {row["sequences"]: row["tokens_per_sequence"] for row in result["active_sequences"]}
    assert sequences == {1: 262144, 2: 142336, 4: 70656}


def test_seed002_options_override_recipe():
    obs = [{"max_model_len": 262144, "kv_tokens": 285336}]
    result = run_module(
        kv_budget,
        {
            "observations": obs,
            "max_num_batched_tokens": 8192,
            "max_num_seqs": 2,
            "speculative_tokens": 5,
            "parallel_drafting": True,
        },
    ).result
    assert result["scheduled_tokens"] == 8184


def test_pinned_kv_bytes_plan_from_memory_fit():
    obs = [{"max_model_len": 16384, "kv_tokens": 18272, "kv_memory_gib": 7.0}]
    recipe = {"kv_cache_memory_bytes": 15032385536, "max_num_seqs": 4}
    result = run_module(kv_budget, {"observations": obs, "recipe": recipe}).result
    assert result["memory_source"] == "recipe.kv_cache_memory_bytes"
    assert result["kv_tokens"]["worst"] == pytest.approx(36544, abs=50)
    assert ids(result) == ["F1"]


def test_check_mode_is_the_same():
    args = {"observations": SEED000, "granularity": 8192}
    assert run_module(kv_budget, args, check_mode=True).result == run_module(kv_budget, args).result


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"available_kv_gib": 8.0}, "available_kv_gib needs a per-token cost"),
        (
            {"available_kv_gib": -3.0, "per_token_kib": 400.0},
            "available_kv_gib: -3.0 is not above 0; set more than 0",
        ),
        (
            {"observations": SEED000, "prompt_floor": 30000, "recipe": {"max_model_len": 16384}},
            "recipe.max_model_len 16384 is below prompt_floor 30000",
        ),
        ({"observations": SEED000, "prompt_floor": -5}, "prompt_floor must not be negative"),
        ({"observations": [{"kv_tokens": 1}]}, "observations[0].max_model_len is missing"),
        ({"observations": SEED000, "recipe": {"max_num_seqs": "x"}}, "recipe.max_num_seqs"),
        # The recipe's keys are checked as the rollout checks them (_recipe.check).
        (
            {"observations": SEED000, "recipe": {"served_model_name": "tiny\n[Service]"}},
            "vllm_recipe.served_model_name: contains '\\n' (a line break) at position 4",
        ),
        (
            {"observations": SEED000, "recipe": {"gpu_memory_utilization": float("nan")}},
            "vllm_recipe.gpu_memory_utilization: nan is not a finite number",
        ),
        (
            {"observations": SEED000, "recipe": {"devices": ["/dev/../etc/shadow"]}},
            "vllm_recipe.devices[0]: '/dev/../etc/shadow' is not normalised (contains '..')",
        ),
        # vLLM reads 64m as 64,000,000 bytes, the plan's sizes as 64 MiB: bytes only.
        (
            {"observations": SEED000, "recipe": {"kv_cache_memory_bytes": "64m"}},
            "vllm_recipe.kv_cache_memory_bytes: expected an integer, got '64m'",
        ),
        (
            {"observations": SEED000, "recipe": {"max_model_len": "Plan"}},
            "vllm_recipe.max_model_len: expected an integer, got 'Plan'",
        ),
        (
            {
                "observations": SEED000,
                "recipe": {"kv_offloading_size": 1},
                "host_limits": {"shm_free_bytes": float("nan")},
            },
            "host_limits.shm_free_bytes: nan is not a finite number",
        ),
    ],
)
def test_bad_input_fails_naming_the_option(args, message):
    outcome = run_module(kv_budget, args)
    assert outcome.failed
    assert message in outcome.result["msg"]


def test_nothing_fits_is_f12():
    result = run_module(
        kv_budget, {"observations": [{"max_model_len": 4096, "kv_tokens": 500}]}
    ).result
    assert result["max_model_len"] == 0
    assert ids(result) == ["F12"]
    assert result["feasible"] is False


# The lab's two real CPU boots of the tiny model (1 GiB of KV per rank: 512 B/token).
LAB_BOOTS = [
    {"max_model_len": 4096, "kv_tokens": 2097152, "kv_memory_gib": 1.0},
    {"max_model_len": 16384, "kv_tokens": 2097152, "kv_memory_gib": 1.0},
]
PINNED = [
    # (recipe, expected memory source, expected context at min_concurrency 2)
    (
        {"max_model_len": "plan", "kv_cache_memory_bytes": 64 * 1024**2},
        "recipe.kv_cache_memory_bytes",
        65536,
    ),
    (
        {"max_model_len": "plan", "kv_cache_memory_bytes": 32 * 1024**2},
        "recipe.kv_cache_memory_bytes",
        32768,
    ),
    (
        {"max_model_len": "plan", "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
        "recipe.env.VLLM_CPU_KVCACHE_SPACE",
        131072,
    ),
]


@pytest.mark.parametrize(("recipe", "source", "length"), PINNED)
def test_a_pinned_kv_size_drives_the_plan(recipe, source, length):
    result = run_module(
        kv_budget,
        {
            "observations": LAB_BOOTS,
            "recipe": recipe,
            "min_concurrency": 2.0,
            "model_max_len": 131072,
        },
    ).result
    assert result["memory_source"] == source
    assert result["max_model_len"] == result["served_max_model_len"] == length


def test_observations_path_adds_the_heads_file_and_refuses_garbage(tmp_path):
    path = tmp_path / "observations.json"
    path.write_text('[{"max_model_len": 8192, "kv_tokens": 1048576, "kv_memory_gib": 0.5}]')
    result = run_module(
        kv_budget, {"observations": LAB_BOOTS, "observations_path": str(path)}
    ).result
    assert len(result["boots"]) == 3
    absent = {"observations": LAB_BOOTS, "observations_path": str(tmp_path / "absent.json")}
    assert len(run_module(kv_budget, absent).result["boots"]) == 2
    for content, expected in (
        ('{"a": 1}', "holds a dict"),
        ("[1", "not a JSON list"),
        ('[{"max_model_len": 1}]', "kv_tokens is missing"),
        ('[{"max_model_len": 4096, "kv_tokens": NaN}]', "not a JSON list"),
    ):
        path.write_text(content)
        out = run_module(kv_budget, {"observations_path": str(path)})
        assert out.failed and str(path) in out.result["msg"] and expected in out.result["msg"], (
            out.result
        )


WEAKEST = [
    # (weakest rank, recipe, fits, F4 expected)
    (
        {"host": "spark-worker", "free_gib": 7.5},
        {"kv_cache_memory_bytes": 64 * 1024**2},
        True,
        False,
    ),
    (
        {"host": "spark-worker", "free_bytes": 32 * 1024**2},
        {"kv_cache_memory_bytes": 64 * 1024**2},
        False,
        True,
    ),
    (
        {"host": "spark-worker", "free_gib": 0.5},
        {"env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
        False,
        True,
    ),
    ({"host": "spark-worker", "free_gib": 90.0}, {}, None, False),
]


@pytest.mark.parametrize(("weakest", "recipe", "fits", "f4"), WEAKEST)
def test_the_weakest_rank_bounds_a_pinned_kv_size(weakest, recipe, fits, f4):
    result = run_module(
        kv_budget, {"observations": LAB_BOOTS, "recipe": recipe, "weakest_rank": weakest}
    ).result
    assert result["weakest_rank"] == {"host": "spark-worker", "fits": fits}
    assert ("F4" in ids(result)) is f4
    if f4:
        message = next(v["message"] for v in result["violations"] if v["id"] == "F4")
        assert "spark-worker" in message and not result["feasible"]


def test_a_fractional_cpu_kvcache_space_is_refused_naming_the_key():
    out = run_module(
        kv_budget, {"observations": LAB_BOOTS, "recipe": {"env": {"VLLM_CPU_KVCACHE_SPACE": "0.5"}}}
    )
    assert (
        out.failed
        and "VLLM_CPU_KVCACHE_SPACE" in out.result["msg"]
        and "kv_cache_memory_bytes" in out.result["msg"]
    )


BEYOND_ANY_NODE = [
    # (arguments beside LAB_BOOTS, what the refusal names)
    (
        {"weakest_rank": {"host": "w", "free_bytes": "lots"}},
        "weakest_rank.free_bytes: expected a number",
    ),
    ({"weakest_rank": {"host": "w", "free_bytes": -5}}, "weakest_rank.free_bytes: -5 is below 0"),
    ({"weakest_rank": {"host": "w", "free_gib": -1.5}}, "weakest_rank.free_gib: -1.5 is below 0"),
    ({"weakest_rank": {"host": "w", "free_gib": 10**30}}, "weakest_rank.free_gib: "),
    (
        {"recipe": {"env": {"VLLM_CPU_KVCACHE_SPACE": "9" * 5000}}},
        "recipe.env.VLLM_CPU_KVCACHE_SPACE: expected an integer",
    ),
    (
        {"recipe": {"env": {"VLLM_CPU_KVCACHE_SPACE": "-1"}}},
        "VLLM_CPU_KVCACHE_SPACE: -1 is below 0",
    ),
    (
        {"recipe": {"kv_offloading_size": 1}, "host_limits": {"shm_size_bytes": "9" * 5000}},
        "host_limits.shm_size_bytes must be a size such as 1g",
    ),
    (
        {"recipe": {"kv_offloading_size": 1}, "host_limits": {"shm_size_bytes": 10**30}},
        "host_limits.shm_size_bytes must be a size from 0 to",
    ),
    (
        {"recipe": {"kv_offloading_size": 1}, "host_limits": {"mem_available_bytes": -4096}},
        "host_limits.mem_available_bytes must be a size from 0 to",
    ),
    (
        {"recipe": {"kv_offloading_size": 1}, "host_limits": {"memlock_bytes": "-5"}},
        "host_limits.memlock_bytes must be a size",
    ),
]


@pytest.mark.parametrize(("args", "message"), BEYOND_ANY_NODE)
def test_a_size_no_node_holds_is_refused_naming_it(args, message):
    out = run_module(kv_budget, {"observations": LAB_BOOTS, **args})
    assert out.failed and message in out.result["msg"], out.result


def test_without_any_boot_the_plan_lints_and_asks_for_a_first_boot():
    explicit = run_module(kv_budget, {"recipe": {"max_model_len": 4096, "max_num_seqs": 1}}).result
    assert explicit["max_model_len"] == 0 and explicit["served_max_model_len"] == 4096
    assert ids(explicit) == ["F3"] and not explicit["feasible"]
    assert "no boot observed yet" in explicit["model"]["notes"][0]
    planned = run_module(kv_budget, {"recipe": {"max_model_len": "plan", "max_num_seqs": 4}}).result
    assert (
        ids(planned) == ["F12"]
        and "explicit vllm_recipe.max_model_len" in planned["violations"][0]["message"]
    )
    assert not planned["feasible"]


CAL = (
    "model=m tensor_parallel_size=2 pipeline_parallel_size=1 kv_cache_dtype=auto dtype=auto"
    " quantization=none"
)


def test_boots_of_one_calibration_calibrate_together_across_kv_sizes_and_lengths():
    """The lab's loop: boots of the same model and split at other lengths and KV sizes (their
    recipe hashes differ) are one calibration; a boot of another split (TP 1) is left out."""
    boots = [
        {
            "recorded_at": "a",
            "max_model_len": 4096,
            "kv_tokens": 4194304,
            "kv_memory_gib": 1.0,
            "calibration": CAL,
            "recipe_hash": "h1",
        },
        {
            "recorded_at": "b",
            "max_model_len": 65536,
            "kv_tokens": 262144,
            "kv_memory_gib": 0.0625,
            "calibration": CAL,
            "recipe_hash": "h2",
        },
        {
            "recorded_at": "c",
            "max_model_len": 4096,
            "kv_tokens": 2097152,
            "kv_memory_gib": 1.0,
            "calibration": CAL.replace("tensor_parallel_size=2", "tensor_parallel_size=1"),
        },
    ]
    recipe = {
        "model": "m",
        "tensor_parallel_size": 2,
        "max_model_len": "plan",
        "kv_cache_memory_bytes": 32 * 1024**2,
    }
    result = run_module(
        kv_budget,
        {"observations": boots, "recipe": recipe, "min_concurrency": 2.0, "model_max_len": 131072},
    ).result
    assert result["calibrated"] and result["calibration_recipe_hash"] == CAL
    assert result["model"]["calibration"] == "two_points"
    assert result["max_model_len"] == 65536
    assert any("left out" in note for note in result["model"]["notes"])


# A failed start calibrates: the log of a start vLLM refused for lack of KV, read by
# vllm_log_facts, plans at that memory no more than vLLM's own estimate and no less
# than 95% of it. (fixture, granularity, vLLM's estimate, calibration)
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-logs"
FAILED_STARTS = [
    # DeepSeek-V4-Flash at TP 2 (vllm#44376): 30,000 need 6.66 GiB, 5.44 GiB hold 13,528
    ("public-v1-deepseek-v4-flash-tp2-not-enough-kv.log", 1024, 13528, "error_report"),
    # the lab's real CPU vLLM 0.32, plain attention; vLLM rounds these tiny sizes to 0.01 GiB
    ("real-cpu-insufficient-kv-len32768.log", 256, 16256, "error_report"),
    ("cpu-insufficient-kv-32768.log", 256, 17024, "error_report"),
    # V0 states the capacity in tokens (23,648 in 2.89 GiB) and in blocks
    (
        "public-v0-memory-profiling-len29000-stored-in-kv-cache.log",
        1024,
        23648,
        "constant_per_token",
    ),
    # V0 in docker compose, pasted in backticks: capacity in tokens only
    ("public-v0-compose-backticks-stored-in-kv-cache.log", 1024, 16832, "constant_per_token"),
]


@pytest.mark.parametrize(("fixture", "granularity", "estimate", "calibration"), FAILED_STARTS)
def test_a_start_refused_for_kv_plans_within_5_percent_below_vllms_estimate(
    fixture, granularity, estimate, calibration
):
    facts = run_module(vllm_log_facts, {"path": str(FIXTURES / fixture), "host": "h"}).result
    observations = facts["ansible_facts"]["vllm_log"]["observations"]
    assert observations and all(o["source"] == "error_report" for o in observations)
    result = run_module(
        kv_budget, {"observations": observations, "granularity": granularity}
    ).result
    assert 0.95 * estimate <= result["max_model_len"] <= estimate, result["model"]
    assert result["model"]["calibration"] == calibration
    assert result["feasible"] is True


def test_one_point_of_the_deepseek_report_alone_offers_nothing_beyond_the_evidence():
    """As a per-token cost (a = 0) the 30,000 / 6.66 GiB point offers 24,504 tokens at 5.44 GiB,
    81% more than vLLM accepts; bounded by evidence the plan offers nothing and says what is missing."""
    needed = {"max_model_len": 30000, "kv_tokens": 30000, "kv_memory_gib": 6.66}
    result = run_module(kv_budget, {"observations": [needed], "available_kv_gib": 5.44}).result
    assert result["model"]["calibration"] == "single_boot_bounded"
    assert result["max_model_len"] == 0 and result["feasible"] is False
    assert "second max_model_len" in result["model"]["evidence_needed"]
    plain = run_module(
        kv_budget,
        {"observations": [needed], "available_kv_gib": 5.44, "constant_per_token": True},
    ).result
    assert plain["max_model_len"] == 24504 // 1024 * 1024


def test_one_boot_is_held_to_its_length_and_says_so():
    boot = {"max_model_len": 16384, "kv_tokens": 65536, "kv_memory_gib": 1.0}
    result = run_module(kv_budget, {"observations": [boot], "min_concurrency": 2.0}).result
    assert result["max_model_len"] == 16384 and result["model"]["bounded_by_evidence"] == 16384
    assert any("to go further" in note for note in result["model"]["notes"])
    free = run_module(
        kv_budget, {"observations": [boot], "min_concurrency": 2.0, "constant_per_token": True}
    ).result
    assert free["max_model_len"] == 32768 and free["model"]["calibration"] == "constant_per_token"


def test_the_plan_from_a_refused_start_is_what_the_next_boot_reports():
    """benchmarks/kv_calibration.py on the real CPU vLLM 0.32: 8 MiB pinned, 32,768 refused; the
    error-calibrated plan (16,128) booted and vLLM reported 16,384 KV tokens (predicted 16,254)."""
    refused = FIXTURES / "cpu-error-calibration-kvbytes8m-32768.log"
    booted = FIXTURES / "cpu-error-calibration-kvbytes8m-16128.log"
    facts = run_module(vllm_log_facts, {"path": str(refused), "host": "h"}).result
    observations = facts["ansible_facts"]["vllm_log"]["observations"]
    plan = run_module(kv_budget, {"observations": observations, "granularity": 256}).result
    reported = run_module(vllm_log_facts, {"path": str(booted)}).result["ansible_facts"]["vllm_log"]
    assert plan["max_model_len"] == reported["concurrency_max_model_len"] == 16128
    assert abs(plan["kv_tokens"]["worst"] - reported["kv_cache_tokens"]) / 16384 < 0.01
