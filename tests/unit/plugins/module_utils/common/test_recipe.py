# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The recipe's schema (module_utils/common/_recipe.py): normalise, check, hash, problems."""

from __future__ import annotations

import copy
import re

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    RecipeError,
    check,
    normalise,
    problems,
    recipe_hash,
)

REV = "5eed0c0ffee0000000000000000000000000000a"
IMAGE = "localhost/localinference-vllm-cpu@sha256:" + "ab" * 32

# A recipe exercising every option the collection documents (seed 000 and 002 settings).
FULL = {
    "model": "deepseek-ai/DeepSeek-V4-Flash",
    "revision": REV,
    "image": IMAGE,
    "served_model_name": "deepseek-v4-flash",
    "tensor_parallel_size": 2,
    "max_model_len": 24576,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 8192,
    "gpu_memory_utilization": 0.85,
    "kv_cache_memory_bytes": 15032385536,
    "kv_cache_dtype": "fp8",
    "reasoning_parser": "deepseek_v4",
    "tool_call_parser": "deepseek_v4",
    "enable_auto_tool_choice": True,
    "speculative_config": {"method": "mtp", "num_speculative_tokens": 5, "parallel_drafting": True},
    "kv_offloading_size": 8,
    "enforce_eager": False,
    "master_port": 29501,
    "extra_args": ["--enable-prefix-caching", "--load-format=safetensors"],
    "env": {"VLLM_CPU_KVCACHE_SPACE": 2},
}


def test_normalise_fills_defaults_and_is_idempotent():
    recipe = normalise({"model": "o/m", "revision": REV.upper(), "image": IMAGE})
    assert recipe["deploy_mode"] == "quadlet"
    assert recipe["executor_backend"] == "mp"
    assert recipe["privileged"] is False
    assert recipe["shm_size"] == "1g"
    assert recipe["served_model_name"] == "o/m"
    assert recipe["revision"] == REV
    assert normalise(recipe) == recipe
    assert recipe_hash(normalise(recipe)) == recipe_hash(recipe)


def test_hash_ignores_key_order_and_sees_every_value():
    recipe = normalise(FULL)
    reordered = normalise(dict(reversed(list(FULL.items()))))
    assert recipe_hash(recipe) == recipe_hash(reordered)
    assert re.fullmatch(r"[0-9a-f]{64}", recipe_hash(recipe))
    for key, value in [("max_model_len", 16384), ("env", {"A": "1"}), ("image", IMAGE[:-1] + "c")]:
        assert recipe_hash(normalise({**FULL, key: value})) != recipe_hash(recipe), key


def test_plan_value_resolves():
    recipe = normalise({**FULL, "max_model_len": "plan"}, plan_max_model_len=20480)
    assert recipe["max_model_len"] == 20480


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": None}, r"vllm_recipe\.model: is required"),
        ({"revision": "main"}, r"vllm_recipe\.revision: 'main' is not a 40-hex commit"),
        ({"image": "vllm/vllm-openai:latest"}, r"vllm_recipe\.image: .*not pinned by digest"),
        (
            {"deploy_mode": "systemd", "vllm_version": None},
            r"vllm_recipe\.vllm_version: is required",
        ),
        ({"deploy_mode": "docker"}, r"vllm_recipe\.deploy_mode: unknown mode"),
        ({"executor_backend": "uni"}, r"vllm_recipe\.executor_backend: unknown backend"),
        (
            {"max_model_len": "plan"},
            r"max_model_len: is 'plan' but no plan result.*--tags plan",
        ),
        ({"max_model_len": "lots"}, r"max_model_len: expected an integer"),
        ({"max_num_seqs": 0}, r"max_num_seqs: 0 is below 1"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization: must be in \(0, 1\]"),
        ({"node_rank": 1}, r"node_rank: is set by the collection"),
        ({"distributed_executor_backend": "ray"}, r"remove it; it follows executor_backend"),
        ({"extra_args": ["--headless"]}, r"extra_args: --headless is set by the collection"),
        ({"speculative_config": "mtp"}, r"speculative_config: expected a dict"),
        ({"env": ["A=1"]}, r"env: expected a dict"),
        ({"Max-Model-Len": 1}, r"not an option name"),
    ],
)
def test_invalid_recipes_name_the_key_and_fix(change, message):
    raw = copy.deepcopy(FULL)
    raw.update(change)
    with pytest.raises(RecipeError, match=message):
        normalise(raw)


def test_check_of_part_of_a_recipe_adds_nothing_and_keeps_plan():
    part = {"max_model_len": "plan", "max_num_seqs": "4", "gpu_memory_utilization": "0.9"}
    assert check(part) == {"max_model_len": "plan", "max_num_seqs": 4, "gpu_memory_utilization": 0.9}
    assert check({}) == {}
    assert check(FULL) == {k: v for k, v in normalise(FULL).items() if k in FULL}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"served_model_name": "m\nx"}, r"vllm_recipe\.served_model_name: contains '\\n'"),
        ({"gpu_memory_utilization": float("nan")}, r"gpu_memory_utilization: nan is not a finite"),
        ({"devices": ["/dev/../etc"]}, r"vllm_recipe\.devices\[0\]: '/dev/\.\./etc' is not normalised"),
        ({"image": "vllm/vllm-openai:latest"}, r"vllm_recipe\.image: .*not pinned by digest"),
        ({"max_model_len": "Plan"}, r"max_model_len: expected an integer, got 'Plan'"),
        ({"node_rank": 1}, r"node_rank: is set by the collection"),
    ],
)
def test_check_refuses_what_normalise_refuses(change, message):
    """A key the plan lints is refused as the rollout would refuse it, without needing the rest."""
    with pytest.raises(RecipeError, match=message):
        check(change)
    with pytest.raises(RecipeError, match=message):
        normalise({**FULL, **change})


def test_systemd_mode_needs_no_image():
    recipe = normalise({**FULL, "image": None, "deploy_mode": "systemd", "vllm_version": "0.32.0"})
    assert recipe["deploy_mode"] == "systemd"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, []),
        ({"ipc_host": True}, []),
        ({"ipc_host": True, "shm_size": "1g"}, [("F14", True)]),
        ({"podman_args": ["--ipc=host"]}, [("F14", True)]),
        ({"privileged": True}, [("F17", False)]),
        ({"podman_args": ["--privileged"]}, [("F17", True)]),
    ],
)
def test_deployment_problems_f14_f17(change, expected):
    found = problems(normalise({**FULL, **change}))
    assert [(p["id"], p["blocking"]) for p in found] == expected
    # Findings like every stage's: an error blocks, each with the fix beside its message.
    assert all(p["blocking"] is (p["severity"] == "error") and p["fix"] for p in found), found


def test_normalise_canonicalises_validated_values_and_stays_idempotent():
    recipe = normalise(
        {
            **FULL,
            "cache_dir": "/var/cache/x/",
            "shm_size": 1073741824,
            "port": "8001",
            "served_model_name": ["a", "b"],
            "ulimits": ["nofile=-1", "memlock=-1:-1"],
        }
    )
    assert recipe["cache_dir"] == "/var/cache/x"
    assert recipe["shm_size"] == "1073741824"
    assert recipe["port"] == 8001
    assert recipe["served_model_name"] == ["a", "b"]
    assert normalise(recipe) == recipe


def test_lab_recipe_passes_validation():
    """The lab inventory's recipe (inventories/lab/group_vars/all.yml) stays valid."""
    recipe = normalise(
        {
            "model": "localinference/tiny-deepseek",
            "revision": REV,
            "served_model_name": "localinference/tiny-deepseek",
            "deploy_mode": "quadlet",
            "image": IMAGE,
            "entrypoint": "/opt/vllm/bin/vllm",
            "executor_backend": "mp",
            "tensor_parallel_size": 2,
            "max_model_len": "plan",
            "max_num_seqs": 4,
            "enforce_eager": True,
            "reasoning_parser": "deepseek_r1",
            "tool_call_parser": "deepseek_v3",
            "enable_auto_tool_choice": True,
            "shm_size": "1g",
            "ulimits": ["nofile=20000:20000"],
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        },
        plan_max_model_len=4096,
    )
    assert recipe["max_model_len"] == 4096
