# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""opencode's budget as 1.18.33 computes it, on seed 000's cases."""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.plan._client_budget import (
    WORK_ROOM,
    ClientInputError,
    check_client_limits,
    needed_context,
    plan_client,
    rejection_prompt_bound,
    working_budget,
)


@pytest.mark.parametrize(
    ("context", "output", "input_limit", "reserved", "expected"),
    [
        (8192, 4096, 8192, 8000, 192),  # seed 000: 192 usable tokens
        (8192, 8192, None, None, 0),  # output equal to context
        (8192, 4096, None, 8000, 4096),  # without limit.input, reserved is ignored
        (200000, 64000, None, None, 168000),  # output counted up to 32000
        (24576, 4096, 20480, None, 16384),  # reserved defaults to min(20000, output)
        (131072, 32768, 98304, None, 78304),
    ],
)
def test_working_budget(context, output, input_limit, reserved, expected):
    assert working_budget(context, output, input_limit, reserved) == expected


def test_seed000_192_tokens_compacts_forever():
    found = check_client_limits(
        {"context": 8192, "input": 8192, "output": 4096, "reserved": 8000}, 8192, 8193
    )
    ids = {(f["id"], f["severity"]) for f in found}
    assert ("F9", "error") in ids
    assert any("working budget is 192" in f["message"] for f in found)


def test_seed000_one_token_overflow():
    """8,193 + 8,192 = 16,385 > 16,384: F8."""
    found = check_client_limits({"context": 16384, "output": 8192}, 16384, 8193)
    f8 = [f for f in found if f["id"] == "F8"]
    assert f8 and "16385 > max_model_len 16384" in " ".join(f["message"] for f in f8)


def test_8193_is_a_bound_not_a_measurement():
    # vLLM's "at least 8193" is L - O + 1 for L=16384, O=8192: it only proves the
    # prompt did not fit beside the output; the real prompt may be far larger.
    assert rejection_prompt_bound(16384, 8192) == 8193
    assert rejection_prompt_bound(16384, 4096) == 12289


def test_seed000_final_budget():
    """At 24,576 with the 8,193-token floor the plan leaves 20,480 tokens of input room."""
    client = plan_client(24576, 8193)
    assert client["ok"] is True
    assert (client["context"], client["output"], client["reserved"]) == (24576, 2048, 2048)
    assert client["input"] == 22528
    assert client["working_budget"] == 20480
    assert client["working_budget"] >= 8193 + WORK_ROOM
    assert client["input"] + client["output"] == client["context"]


def test_opencode_1_18_33_floor():
    """opencode 1.18.33 sends about 30 KB (10 tools) before the user speaks."""
    client = plan_client(65536, 9000, output_tokens=8192)
    assert client["ok"] is True
    assert client["working_budget"] == 65536 - 8192 - 8192
    assert (
        working_budget(client["context"], client["output"], client["input"], client["reserved"])
        == client["working_budget"]
    )


def test_impossible_says_how_much_more():
    client = plan_client(16384, 8193, output_tokens=4096)
    assert client["ok"] is False
    assert client["needed_context"] == 8193 + WORK_ROOM + 4096 + 4096
    assert client["additional_context_needed"] == client["needed_context"] - 16384
    assert "F9" in client["reason"]


def test_output_must_stay_below_context():
    client = plan_client(8192, 100, output_tokens=8192)
    assert client["ok"] is False and "below the context" in client["reason"]


def test_without_floor_no_verdict():
    client = plan_client(32768, None)
    assert client["ok"] is None and "prompt_floor" in client["reason"]


def test_needed_context_matches_plan():
    for floor in (8193, 12000, 30000):
        need = needed_context(floor, 2048)
        assert plan_client(need, floor, output_tokens=2048)["ok"] is True
        assert plan_client(need - 1, floor, output_tokens=2048)["ok"] is False


def test_bad_input():
    with pytest.raises(ClientInputError, match="prompt_floor"):
        plan_client(1000, -1)
    with pytest.raises(ClientInputError, match="client_limits needs context and output"):
        check_client_limits({"input": 5}, 1000, None)
