# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kv filters call the same model as kv_budget."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.kv import FilterModule

F = FilterModule().filters()
SEED000 = [
    {"max_model_len": 24576, "kv_tokens": 26890},
    {"max_model_len": 16384, "kv_tokens": 33932},
    {"max_model_len": 24576, "kv_tokens": 34887},
    {"max_model_len": 24576, "kv_tokens": 47930},
]


def test_names():
    assert set(F) == {
        "kv_tokens_for",
        "kv_concurrency",
        "client_budget",
        "opencode_working_budget",
        "kv_scheduled_tokens",
        "kv_calibration",
    }


def test_kv_calibration_names_what_decides_the_bytes_per_token():
    recipe = {"model": "m", "tensor_parallel_size": 2, "max_model_len": 4096, "port": 8000}
    assert F["kv_calibration"](recipe) == (
        "model=m tensor_parallel_size=2 pipeline_parallel_size=1 kv_cache_dtype=auto dtype=auto"
        " quantization=none"
    )
    assert F["kv_calibration"]({**recipe, "max_model_len": 65536}) == F["kv_calibration"](recipe)
    assert F["kv_calibration"]({}) is None


@pytest.mark.parametrize(
    ("level", "expected"), [("worst", 1.0942), ("median", 1.4001), ("best", 1.9503)]
)
def test_concurrency(level, expected):
    assert F["kv_concurrency"](SEED000, 24576, level) == expected


def test_tokens_with_memory():
    obs = [{"max_model_len": 262144, "kv_tokens": 285336, "kv_memory_gib": 8.59}]
    assert F["kv_tokens_for"](obs, 262144) == 285336
    assert F["kv_tokens_for"](obs, 262144, memory_gib=17.18) == pytest.approx(570672, abs=2)


def test_client_and_budget():
    client = F["client_budget"](24576, 8193)
    assert client["working_budget"] == 20480
    assert (
        F["opencode_working_budget"](
            {"context": 8192, "input": 8192, "output": 4096, "reserved": 8000}
        )
        == 192
    )
    assert F["kv_scheduled_tokens"](8192, 2, 5) == 8184


def test_errors():
    with pytest.raises(AnsibleFilterError, match="level"):
        F["kv_concurrency"](SEED000, 1024, "typical")
    with pytest.raises(AnsibleFilterError, match="observations is empty"):
        F["kv_tokens_for"]([], 1024)
    with pytest.raises(AnsibleFilterError, match="memory_gib needs observations"):
        F["kv_tokens_for"](SEED000, 1024, memory_gib=3)
