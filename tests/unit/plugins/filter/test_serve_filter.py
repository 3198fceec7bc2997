# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve role's filter: the guards' refusal lines of a failed start's journal."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.serve import FilterModule

start_refusals = FilterModule().filters()["start_refusals"]

LINE = "localinference admission refused the start on spark-worker: ... (docs/failure-catalog.md#f4)"


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        ([], []),
        ("Started x.\n" + LINE + "\n", [LINE]),
        (["Starting...", LINE, "Failed with result 'exit-code'.", LINE], [LINE]),
        (["localinference shm-offload refused: 1 possible orphan(s) x", LINE],
         ["localinference shm-offload refused: 1 possible orphan(s) x", LINE]),
    ],
    ids=["empty", "text", "lines, repeated", "both guards"],
)
def test_start_refusals(log, expected):
    assert start_refusals(log) == expected


def test_start_refusals_refuses_what_is_not_a_log():
    with pytest.raises(AnsibleFilterError, match="text or a list of lines"):
        start_refusals({"stdout": LINE})
