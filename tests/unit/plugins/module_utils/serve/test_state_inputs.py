# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""serving_state's options checked before the node is read (module_utils/serve/_state_inputs.py).

A case table of bad options and the refusal each gets, naming the option (and, for a node
value, where the serve role takes it from), with a stand-in module instead of Ansible; the
whole module is tests/unit/plugins/modules/test_serving_state*.py.
"""

from __future__ import annotations

import math
import re

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _state_inputs
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit

REV = "5eed0c0ffee0000000000000000000000000000a"
RECIPE = {
    "model": "localinference/tiny-deepseek",
    "revision": REV,
    "image": "localhost/localinference-vllm-cpu@sha256:" + "ab" * 32,
    "tensor_parallel_size": 2,
    "max_model_len": "plan",
}
CHECKS = {  # CHECKS_SPEC's defaults
    "max_load_per_cpu": None, "cluster_address": True, "help_cache_dir": None, "help_timeout": 1800.0,
    "quadlet": None, "ports": False, "programs": [], "programs_dir": None, "unit_states": False,
    "timeout": 60.0,
}


def params(**given):
    node = {"host": "spark-worker", "rank": 1, "nnodes": 2, "head_address": "10.77.0.11",
            "address": "10.77.0.12", "env": {}, "weights_path": "/srv/models/x", "weights_digest": "",
            "rdma": {}}
    base = {
        "recipe": RECIPE, "plan_max_model_len": 4096, "node": node, "state": "present",
        "path": "/etc/localinference/serving.json", "staging_dir": "/etc/localinference/staging",
        "unit_dir": None, "venv_dir": None, "help_text": None, "guards": None, "slice_dir": None,
        "checks": None, "stop_live": False, "stop_timeout": 300.0, "daemon_reload": False,
    }
    for key, value in given.items():
        if key.startswith("node_"):
            base["node"] = {**node, key[len("node_"):]: value}
        else:
            base[key] = value
    return base


def test_good_options_give_the_recipe_node_and_paths():
    found = _state_inputs.inputs(FakeModule(params()))
    assert found["recipe"]["max_model_len"] == 4096
    assert found["node"].rank == 1 and found["unit_dir"] == "/etc/containers/systemd"
    assert found["venv_dir"].startswith("/opt/localinference/vllm-")
    assert found["help_path"] is None


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"checks": CHECKS}, "checks: only with state=staged or verified (state is present); remove checks"),
        ({"path": "relative/serving.json"}, "path: 'relative/serving.json' is not an absolute path; start it with /"),
        ({"node_rank": 2}, "node.rank 2 is outside 0..1; the head is rank 0"),
        ({"state": "staged", "stop_live": True},
         "stop_live and daemon_reload: only with state=present (state is staged)"),
        ({"stop_timeout": math.nan}, "stop_timeout: nan is not a number of seconds above 0"),
        ({"node_weights_path": "relative"}, "(the serve role takes it from serve_weights_path, else model_weights_path)"),
        ({"state": "staged", "checks": {**CHECKS, "timeout": 0}}, "checks.timeout: 0 is not a number of seconds"),
        ({"state": "staged", "checks": {**CHECKS, "max_load_per_cpu": math.inf}},
         "(the serve role takes it from serve_max_load_per_cpu)"),
        ({"state": "staged", "checks": {**CHECKS, "programs": [{"name": "a", "content": ""}]}},
         "checks.programs_dir: is not set but checks.programs is; name the directory"),
        ({"state": "staged", "checks": {**CHECKS, "programs_dir": "/x", "programs": [{"name": "../a", "content": ""}]}},
         "checks.programs[0].name: '../a' is not a file name; give a plain name"),
    ],
    ids=["checks with present", "relative path", "rank outside the nodes", "stop_live when staging",
         "NaN stop_timeout", "a node value names its source", "checks.timeout", "infinite load limit",
         "programs without a directory", "a program name with a slash"],
)
def test_a_bad_option_ends_the_module_naming_it(given, message):
    with pytest.raises(ModuleExit) as caught:
        _state_inputs.inputs(FakeModule(params(**given)))
    assert caught.value.failed and message in caught.value.result["msg"]


def test_absolute_refuses_a_relative_path_by_name():
    assert _state_inputs.absolute("help_text", "/srv/help.txt") == "/srv/help.txt"
    with pytest.raises(ValidationError, match=re.escape("help_text: 'help.txt' is not an absolute path")):
        _state_inputs.absolute("help_text", "help.txt")


def test_without_guards_the_slice_directory_follows_the_deploy_mode():
    module = FakeModule(params())
    found = _state_inputs.inputs(module)
    recipe, node = found["recipe"], found["node"]
    slice_dir, guards, need, capped = _state_inputs.memory(module, recipe, node, "/etc/containers/systemd")
    assert (slice_dir, guards, need, capped) == ("/etc/systemd/system", None, None, [])
    assert module.warnings == []


def test_an_unreadable_config_json_leaves_the_geometry_out(tmp_path):
    # no guess: a garbled config.json judges the layout as no config.json does
    found = _state_inputs.inputs(FakeModule(params(node_weights_path=str(tmp_path))))
    without = _state_inputs.layout_problems(found["recipe"], found["node"])
    (tmp_path / "config.json").write_text("{not json")
    assert _state_inputs.layout_problems(found["recipe"], found["node"]) == without
    assert all(p["blocking"] == (p["severity"] == "error") for p in without)
