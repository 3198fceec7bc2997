# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kv_budget's result computed without Ansible (module_utils/plan/_kv_budget.compute).

compute() takes the module's options as a dict and is pure but for ``observations_path``, so
the plan is checked here as a function: the same answer as the module (whose case tables are
tests/unit/plugins/modules/test_kv_budget.py), the lint-only plan before a first boot, and the
input errors named.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_budget import compute
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_model import KvInputError
from ansible_collections.localinference.vllm.plugins.modules import kv_budget
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

SEED000 = [
    {"max_model_len": 24576, "kv_tokens": 26890},
    {"max_model_len": 16384, "kv_tokens": 33932},
]


def options(**given) -> dict:
    """The options as AnsibleModule hands them over: every key, defaults filled in."""
    params = {name: spec.get("default") for name, spec in kv_budget.ARGUMENT_SPEC.items()}
    return {**params, **given}


def test_compute_is_what_the_module_returns():
    given = {"observations": SEED000, "granularity": 8192, "recipe": {"max_model_len": 16384}}
    module = run_module(kv_budget, given).result
    assert module.pop("changed") is False
    assert compute(options(**given)) == module


def test_without_a_boot_the_recipe_is_only_linted():
    result = compute(options(recipe={"max_model_len": 4096, "max_num_seqs": 1}))
    assert result["model"]["mode"] == "none" and result["max_model_len"] == 0
    assert result["served_max_model_len"] == 4096 and result["boots"] == []
    assert "no boot observed yet" in result["model"]["notes"][0]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"prompt_floor": -1}, "prompt_floor must not be negative, got -1"),
        ({"recipe": {"max_model_len": 4096}, "prompt_floor": 8192},
         "recipe.max_model_len 4096 is below prompt_floor 8192"),
    ],
    ids=["a negative floor", "a context below the floor"],
)
def test_bad_input_is_refused_naming_the_option(given, message):
    with pytest.raises(KvInputError, match=message):
        compute(options(**given))
