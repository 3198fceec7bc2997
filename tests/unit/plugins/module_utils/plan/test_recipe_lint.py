# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Failure-catalog lint: each case is a recipe and the ids it must raise."""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    RecipeInputError,
    lint_context,
    lint_offload,
    lint_scheduling,
    lint_static,
    parse_size,
)

GOOD = {
    "model": "deepseek-ai/DeepSeek-V4-Flash",
    "max_model_len": "plan",
    "max_num_seqs": 4,
    "gpu_memory_utilization": 0.85,
    "reasoning_parser": "deepseek_v4",
    "tool_call_parser": "deepseek_v4",
    "enable_auto_tool_choice": True,
}

STATIC = [
    pytest.param({}, [], id="good"),
    pytest.param(
        {"kv_cache_memory_bytes": 7516192768}, [("F1", "error")], id="F1-inert-utilization"
    ),
    pytest.param(
        {"kv_cache_memory_bytes": 7516192768, "gpu_memory_utilization": None},
        [("F1", "warning")],
        id="F1-explicit-bytes",
    ),
    pytest.param({"max_num_seqs": 1}, [("F3", "error")], id="F3"),
    pytest.param({"reasoning_parser": None}, [("F6", "error")], id="F6"),
    pytest.param({"ipc_host": True, "shm_size": "1g"}, [("F14", "error")], id="F14"),
    pytest.param({"ipc_host": True}, [], id="ipc-host-alone"),
    pytest.param({"privileged": True}, [("F17", "warning")], id="F17"),
]


@pytest.mark.parametrize(("change", "expected"), STATIC)
def test_static(change, expected):
    recipe = {**GOOD, **change}
    found = lint_static(recipe)
    assert [(f["id"], f["severity"]) for f in found] == expected
    for finding in found:
        assert "recipe." in finding["message"]


def test_f1_message_names_the_fix():
    (finding,) = lint_static({**GOOD, "kv_cache_memory_bytes": 7516192768})
    assert "remove kv_cache_memory_bytes" in finding["message"]
    assert "gpu_memory_utilization (0.85) is inert" in finding["message"]


def test_f15_seed002():
    recipe = {
        **GOOD,
        "max_num_seqs": 2,
        "max_num_batched_tokens": 8192,
        "speculative_config": {
            "method": "dspark",
            "num_speculative_tokens": 5,
            "parallel_drafting": True,
        },
    }
    (finding,) = lint_scheduling(recipe, 8184)
    assert finding["id"] == "F15"
    assert "schedules 8184 tokens" in finding["message"]
    assert "raise max_num_batched_tokens to 8200" in finding["message"]
    assert (
        lint_scheduling({**recipe, "speculative_config": {"num_speculative_tokens": 5}}, 8192) == []
    )


@pytest.mark.parametrize(
    ("recipe", "limits", "expected"),
    [
        ({"kv_offloading_size": 8}, None, [("F16", "warning")]),
        (
            {"kv_offloading_size": 8, "ipc_host": True},
            {
                "shm_size_bytes": 31 * 1024**3,
                "shm_free_bytes": 1 * 1024**3,
                "memlock_bytes": "unlimited",
            },
            [("F16", "error")],
        ),  # seed 004: orphans filled /dev/shm
        (
            {"kv_offloading_size": 8, "ipc_host": True},
            {
                "shm_size_bytes": 64 * 1024**3,
                "shm_free_bytes": 64 * 1024**3,
                "memlock_bytes": 65536,
            },
            [("F16", "error")],
        ),
        (
            {"kv_offloading_size": 8, "ipc_host": True},
            {
                "shm_size_bytes": 64 * 1024**3,
                "shm_free_bytes": 64 * 1024**3,
                "memlock_bytes": -1,
                "mem_available_bytes": 700 * 1024**3,
            },
            [],
        ),
        (
            {"kv_offloading_size": 8, "shm_size": "1g"},
            {"shm_size_bytes": 64 * 1024**3},
            [("F16", "error")],
        ),  # container /dev/shm too small
        (
            {"kv_offloading_size": 512, "ipc_host": True},
            {"mem_available_bytes": 300 * 1024**3},
            [("F16", "error")],
        ),
        ({}, None, []),
    ],
)
def test_f16(recipe, limits, expected):
    found = lint_offload(recipe, limits)
    assert [(f["id"], f["severity"]) for f in found] == expected
    for finding in found:
        assert "kv_offloading_size" in finding["message"]


@pytest.mark.parametrize(
    ("length", "fits", "expected"),
    [
        ("plan", {"worst": 0.5, "median": 1, "best": 2}, []),
        (32768, {"worst": 0.82, "median": 1.05, "best": 1.46}, [("F2", "error")]),
        (24576, {"worst": 1.09, "median": 1.4, "best": 1.95}, []),
        (65536, {"worst": 0.41, "median": 0.52, "best": 0.73}, [("F12", "error")]),
    ],
)
def test_context(length, fits, expected):
    found = lint_context({"max_model_len": length}, fits, 24576, 1.0)
    assert [(f["id"], f["severity"]) for f in found] == expected
    for finding in found:
        assert "set max_model_len to 24576" in finding["message"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1g", 1024**3), ("512m", 512 * 1024**2), ("8GiB", 8 * 1024**3), (4096, 4096), ("64k", 65536)],
)
def test_parse_size(value, expected):
    assert parse_size(value, "x") == expected


def test_bad_recipe_values_name_the_key():
    with pytest.raises(RecipeInputError, match=r"recipe\.max_num_seqs"):
        lint_static({"max_num_seqs": "many"})
    with pytest.raises(RecipeInputError, match=r"recipe\.shm_size"):
        lint_offload({"kv_offloading_size": 1, "shm_size": "lots"}, None)
    with pytest.raises(RecipeInputError, match=r"recipe\.kv_offloading_size"):
        lint_offload({"kv_offloading_size": "big"}, None)
