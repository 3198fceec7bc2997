# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The served recipe's execute-model timeout reaches the watchdog's config and bounds a
compile's hold (issue 37, item 6): the role reads the head's ``serving.json``, the filter
``watchdog_config`` puts ``env.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` (vLLM's 300 s when unset)
into ``watchdog.json`` as ``execute_model_timeout_s``, the judge holds a compiling engine that
long."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.watchdog import watchdog_config
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._config import (
    ConfigError,
    build,
    check,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._judge import (
    judge,
)

from .test_judge import TABLE, merge
from .test_program import INGRESS, NODES, OPTS


def serving(env: dict[str, str] | None) -> dict[str, Any]:
    """The part of a saved serving.json the watchdog reads (plugins/module_utils/serve/_state.py)."""
    return {"schema": 1, "recipe": {"model": "org/m", "env": env or {}}, "environment": {}}


@pytest.mark.parametrize(("document", "want"), [
    (None, 300.0),                                                    # nothing rolled out yet
    ({}, 300.0),
    (serving(None), 300.0),                                           # vLLM's default
    (serving({"HF_HUB_OFFLINE": "1"}), 300.0),
    (serving({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800"}), 1800.0),  # the two-Spark fix
    ({"recipe": "not a recipe"}, 300.0),
])
def test_the_config_carries_the_served_recipes_timeout(document: Any, want: float) -> None:
    cfg = build(OPTS, NODES, INGRESS, document)
    assert cfg["execute_model_timeout_s"] == want
    assert check(json.loads(json.dumps(cfg)))["execute_model_timeout_s"] == want


@pytest.mark.parametrize("value", ["0", "-5", "soon", "1e9", "nan"])
def test_a_timeout_the_hold_cannot_use_is_refused_naming_the_recipe(value: str) -> None:
    with pytest.raises(ConfigError, match=r"vllm_recipe\.env\.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"):
        build(OPTS, NODES, INGRESS, serving({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": value}))


def test_a_config_written_before_the_key_existed_holds_vllms_default() -> None:
    cfg = json.loads(json.dumps(build(OPTS, NODES, INGRESS)))
    del cfg["execute_model_timeout_s"]
    assert check(cfg)["execute_model_timeout_s"] == 300.0
    cfg["execute_model_timeout_s"] = True
    with pytest.raises(ConfigError, match="VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"):
        check(cfg)


def test_the_filter_reads_serving_json_as_slurped() -> None:
    text = json.dumps(serving({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "900"}))
    assert watchdog_config(OPTS, NODES, INGRESS, text)["execute_model_timeout_s"] == 900.0
    assert watchdog_config(OPTS, NODES, INGRESS, None)["execute_model_timeout_s"] == 300.0
    with pytest.raises(AnsibleFilterError, match=r"serving\.json is not JSON"):
        watchdog_config(OPTS, NODES, INGRESS, "{not json")
    with pytest.raises(AnsibleFilterError, match="VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"):
        watchdog_config(OPTS, NODES, INGRESS, json.dumps(serving({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "0"})))


@pytest.mark.parametrize(("env", "verdict", "action"), [
    ({}, "wedged", "restart"),                                        # 350 s > vLLM's 300 s
    ({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800"}, "degraded", "hold"),
])
def test_the_judge_holds_a_compile_as_long_as_the_served_recipe_says(
        env: dict[str, str], verdict: str, action: str) -> None:
    """350 s of silence while a node's log shows a compile: held only under the raised timeout."""
    cfg = build(OPTS, NODES, INGRESS, serving(env))
    look = merge(TABLE["base"]["look"], {
        "token": {"ok": False, "timeout": True, "error": "no token within 10 s", "deadline_s": 10},
        "engine": {"health": 200},
        "nodes": {"spark-worker": {"engine_log": {"compiling": True, "what": "TileLang kernel", "line": "x"}}},
    })
    judged_cfg = merge(TABLE["base"]["cfg"], {"execute_model_timeout_s": cfg["execute_model_timeout_s"]})
    result = judge(look, {"bad_looks": 5, "first_bad_at": 680.0, "last_good_at": 650.0}, judged_cfg)
    assert (result["verdict"], result["action"]) == (verdict, action), result["evidence"]
