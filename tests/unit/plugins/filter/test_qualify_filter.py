# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The qualify filter: the check parameters that measure a recipe's expected: figures, and an
unknown key as a filter error naming qualify_expected and expected.<key>."""

from __future__ import annotations

import base64

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.qualify import FilterModule

CHECK_PARAMS = FilterModule().filters()["qualify_check_params"]


def test_the_declared_streams_and_sizes_become_check_parameters():
    expected = {"decode_tps_at_6_streams": {"value": 191.2, "unit": "tok/s aggregate"},
                "ttft_s_at_4096_tokens": 0.5}  # fmt: skip
    got = CHECK_PARAMS(expected, 8192, {"concurrency": {"requests": 4}}, {})
    assert got == {
        "concurrency": {"requests": 6},
        "context_ladder": {"fractions": [0.25, 0.5, 0.9, 1.1]},
    }


def test_an_unknown_key_is_a_filter_error_naming_it():
    with pytest.raises(
        AnsibleFilterError, match=r"^qualify_expected: expected\.ttft is not a figure"
    ):
        CHECK_PARAMS({"ttft": {"value": 3}}, 8192, {}, {})


@pytest.mark.parametrize(
    ("slurped", "other"),
    [
        ({"content": base64.b64encode(b"2000 \n").decode()}, True),  # a rollout's, not run out
        ({"content": base64.b64encode(b"2000\n").decode()}, True),
        ({"content": base64.b64encode(b"500\n").decode()}, False),  # run out
        ({"content": base64.b64encode(b"2000 qualify\n").decode()}, False),  # our own, left behind
        ({"content": base64.b64encode(b"not a deadline").decode()}, False),
        ({"failed": True, "msg": "file not found"}, False),
        ({"skipped": True}, False),
        (None, False),
    ],
)
def test_qualify_other_hold(slurped, other):
    """The qualification leaves a rollout's hold alone (neither overwrites nor releases it)."""
    assert FilterModule().filters()["qualify_other_hold"](slurped, 1000.0) is other
