# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node checks serving_state runs around its writes (module_utils/serve/_state_checks.py).

A refusal from a check ends the module with the result so far (and the Quadlet generator's
findings); a rendered flag the targeted vLLM release does not have ends it naming the flag.
The judgements are test_stage_checks.py's; the checks on a real staging are
tests/unit/plugins/modules/test_serving_state_checks.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandTimeout,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._quadlet import (
    QuadletCheckError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._stage_checks import (
    StageCheckError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state_checks import (
    check_help,
    node_checks,
    refused_or,
)
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit

HELP = Path(__file__).parents[3] / "fixtures" / "vllm-0.32.0" / "serve-help-all.txt"


def refuse(error):
    def step(*_args):
        raise error

    return step


@pytest.mark.parametrize(
    ("error", "extra"),
    [
        (StageCheckError("spark-worker: load 9.1 per CPU is above 4"), {}),
        (CommandTimeout(["ip", "-o", "addr", "show"], 60, None, True), {}),
        (QuadletCheckError("the Quadlet generator rejected the units", stderr="bad", rc=1),
         {"quadlet": {"findings": [], "stderr": "bad", "rc": 1}}),
    ],
    ids=["a refused check", "a command that did not finish", "the Quadlet generator"],
)
def test_a_refusal_ends_the_module_with_the_result_so_far(error, extra):
    with pytest.raises(ModuleExit) as caught:
        refused_or(FakeModule({}), {"changed": False}, refuse(error))
    assert caught.value.result == {"changed": False, **extra, "msg": str(error), "failed": True}


def test_a_step_that_passes_returns_its_value():
    assert refused_or(FakeModule({}), {}, lambda a, b: a + b, 2, 3) == 5


def test_no_node_check_asked_reads_nothing():
    checks = {"max_load_per_cpu": None, "cluster_address": False}
    assert node_checks(checks, None, None) == {}


def test_a_flag_the_release_does_not_have_ends_the_module_naming_it():
    module = FakeModule({"state": "staged"})
    result = {"document": {"server_argv": ["vllm", "serve", "m", "--no-such-flag"]}}
    inputs = {"recipe": {"extra_args": ["--tensor-parallel-size", "2"], "deploy_mode": "quadlet"},
              "help_path": str(HELP)}
    with pytest.raises(ModuleExit) as caught:
        check_help(module, None, result, inputs, None)
    assert caught.value.result["unknown_flags"] == ["--no-such-flag"]
    assert caught.value.result["msg"].startswith(
        "vllm_recipe renders flags this vLLM release does not have: --no-such-flag; remove or rename"
    )


def test_a_missing_help_text_is_named():
    module = FakeModule({"state": "present"})
    inputs = {"recipe": {"extra_args": []}, "help_path": "/nonexistent/help.txt"}
    with pytest.raises(ModuleExit) as caught:
        check_help(module, None, {"document": {}}, inputs, None)
    assert caught.value.result["msg"] == "help_text /nonexistent/help.txt does not exist"
