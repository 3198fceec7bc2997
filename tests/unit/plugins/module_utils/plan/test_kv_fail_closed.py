# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KV plan fails closed: recipes are separate calibrations, the worst boot bounds the plan."""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.plan._client_budget import (
    ClientInputError,
    check_client_limits,
    plan_client,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_model import (
    KvInputError,
    plan_kv,
)

# Two recipes with the same 10 GiB of KV memory per rank: recipe "a" holds
# 100,000 tokens at 4096, recipe "b" (say an fp16 KV cache instead of fp8)
# only 50,000 at 8192. Fitted together, least squares refits through the
# origin and promises about 55,500 tokens: a plan above the worst boot (F12).
# Both are plain attention (constant_per_token), so one boot each plans beyond its length.
RECIPE_A = {"recipe_hash": "a" * 64, "recorded_at": "t1", "max_model_len": 4096,
            "kv_tokens": 100_000, "kv_memory_gib": 10.0}  # fmt: skip
RECIPE_B = {"recipe_hash": "b" * 64, "recorded_at": "t2", "max_model_len": 8192,
            "kv_tokens": 50_000, "kv_memory_gib": 10.0}  # fmt: skip


def test_two_recipes_are_never_averaged_and_the_worst_wins():
    plan = plan_kv([RECIPE_A, RECIPE_B], granularity=1024, constant_per_token=True)
    assert plan["max_model_len"] == 49152  # recipe b's own plan: 50,000 tokens, floored
    assert plan["calibration_recipe_hash"] == "b" * 64
    assert [c["max_model_len"] for c in plan["calibrations"]] == [99328, 49152]
    assert [c["chosen"] for c in plan["calibrations"]] == [False, True]
    assert any("each is its own calibration" in note for note in plan["model"]["notes"])
    assert plan["kv_tokens"]["worst"] <= 50_000


def test_the_recipe_being_planned_uses_its_own_observations():
    plan = plan_kv(
        [RECIPE_A, RECIPE_B], granularity=1024, recipe_hash="a" * 64, constant_per_token=True
    )
    assert plan["max_model_len"] == 99328 and plan["calibration_recipe_hash"] == "a" * 64
    assert any(
        "1 observation(s) of other recipes were left out" in n for n in plan["model"]["notes"]
    )


def test_a_recipe_without_observations_is_planned_against_the_worst_recorded_one():
    plan = plan_kv(
        [RECIPE_A, RECIPE_B], granularity=1024, recipe_hash="c" * 64, constant_per_token=True
    )
    assert plan["max_model_len"] == 49152
    assert any("no observation of recipe cccccccccccc yet" in n for n in plan["model"]["notes"])


def test_the_worst_boot_bounds_the_plan_even_without_recipe_hashes():
    """The same disagreement with no recipe_hash: one calibration, but still bounded."""
    strip = [{k: v for k, v in o.items() if k != "recipe_hash"} for o in (RECIPE_A, RECIPE_B)]
    plan = plan_kv(strip, granularity=1024)
    assert plan["worst_boot_bound"] < 1.0
    assert plan["kv_tokens"]["worst"] <= 50_000
    assert plan["max_model_len"] <= 50_000
    assert any("so no boot is planned above what it held" in n for n in plan["model"]["notes"])


def test_consistent_boots_are_not_bounded():
    same = [dict(RECIPE_A, recorded_at="t1"), dict(RECIPE_A, recorded_at="t3")]
    assert plan_kv(same, granularity=1024)["worst_boot_bound"] == 1.0


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"model_max_len": 512}, "model_max_len 512 is below granularity 1024"),
        ({"model_max_len": 0}, "model_max_len 0 is below granularity 1024"),
        (
            {"available_kv_gib": float("inf"), "per_token_kib": 1.0},
            "available_kv_gib: inf is not a finite number",
        ),
        (
            {"available_kv_gib": float("nan"), "per_token_kib": 1.0},
            "available_kv_gib: nan is not a finite number",
        ),
        (
            {"available_kv_gib": 8.0, "per_token_kib": float("inf")},
            "per_token_kib: inf is not a finite number",
        ),
        ({"min_concurrency": float("inf")}, "min_concurrency: inf is not a finite number"),
        ({"min_concurrency": float("nan")}, "min_concurrency: nan is not a finite number"),
        ({"preferred_concurrency": float("nan")}, "preferred_concurrency: nan is not a finite number"),
        ({"granularity": 1.5}, "granularity must be a positive integer"),
        ({"granularity": True}, "granularity must be a positive integer"),
    ],
)
def test_bad_plan_options_are_named(kwargs, named):
    with pytest.raises(KvInputError) as caught:
        plan_kv([RECIPE_A], **kwargs)
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"kv_memory_gib": float("inf")}, "observations[0].kv_memory_gib: inf is not a finite number"),
        ({"kv_memory_gib": float("nan")}, "observations[0].kv_memory_gib: nan is not a finite number"),
        ({"available_kv_gib": "inf"}, "observations[0].available_kv_gib: 'inf' is not a finite number"),
        ({"kv_tokens": float("inf")}, "observations[0].kv_tokens: inf is not a finite number"),
        ({"kv_tokens": 10**400}, "is 2**53 or more, too large for a count"),
        ({"kv_tokens": 1.5}, "observations[0].kv_tokens: 1.5 is not a whole number; set a whole number"),
        ({"max_model_len": "1e400"}, "observations[0].max_model_len: '1e400' is not a finite number"),
        ({"max_model_len": 2**60}, "observations[0].max_model_len: 1152921504606846976 is 2**53 or more"),
        ({"recipe_hash": 7}, "observations[0].recipe_hash must be a non-empty string"),
    ],
)
def test_non_finite_observations_never_land(change, named):
    with pytest.raises(KvInputError) as caught:
        plan_kv([dict(RECIPE_A, **change)])
    assert named in str(caught.value)


@pytest.mark.parametrize("floor", [None, 20000])
@pytest.mark.parametrize("output", [32768, 40000])
def test_output_at_or_above_the_context_is_never_ok(floor, output):
    client = plan_client(32768, floor, output)
    assert client["ok"] is False
    assert f"output_tokens {output} must be below the context 32768" in client["reason"]
    assert client["input"] >= 0


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ({"context": "abc", "output": 1}, "client_limits.context: expected a number, got 'abc'; set a whole number of tokens"),
        ({"context": 4096, "output": -1}, "client_limits.output: -1 is below 0; set a whole number of tokens"),
        ({"context": 4096, "output": 1, "input": float("nan")}, "client_limits.input"),
        ({"context": 4096, "output": 1, "reserved": True}, "client_limits.reserved"),
        ({"context": 4096}, "client_limits needs context and output"),
    ],
)
def test_bad_client_limits_are_named(limits, named):
    with pytest.raises(ClientInputError) as caught:
        check_client_limits(limits, 4096, None)
    assert named in str(caught.value)
