# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""opencode_config and its judgement (module_utils/client/_opencode.py) from the case tables in
``test_opencode_config.yaml``: configs -> findings with their numbers; module
arguments and an existing file -> the file written, its mode, or the failure."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.client import _opencode
from ansible_collections.localinference.vllm.plugins.modules import opencode_config

from tests.unit.module_helper import run_module

CASES = yaml.safe_load((Path(__file__).with_suffix(".yaml")).read_text())
BASE_ARGS = {
    "provider": "lab",
    "model": "m",
    "base_url": "http://127.0.0.1:18000/v1",
    "api_key_env": "LOCALINFERENCE_API_KEY",
}


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [case["name"] for case in cases]


def _dig(doc: dict[str, Any], dotted: str) -> Any:
    # Model ids contain no dots in these tables; provider.lab.models.m.limit.input
    value: Any = doc
    for part in dotted.split("."):
        value = value[part]
    return value


@pytest.mark.parametrize("case", CASES["judge"], ids=_ids(CASES["judge"]))
def test_judge(case: dict[str, Any]) -> None:
    server = dict(case["server"])
    reads = server.pop("client_reads", None)
    version = str(server.pop("client_version", _opencode.DEFAULT_CLIENT_VERSION))
    found, numbers = _opencode.judge(
        case["config"], provider="lab", model="m", client_version=version, reads=reads, **server
    )
    got = [(f["id"], f["severity"]) for f in found]
    assert got == [(f["id"], f["severity"]) for f in case["findings"]], found
    for expected, actual in zip(case["findings"], found, strict=True):
        for fragment in expected["message"]:
            assert fragment in actual["message"] + " " + actual["fix"], actual
    for absent in case.get("absent", []):
        assert absent not in [f["id"] for f in found]
    assert numbers["server_context"] == server["max_model_len"]


@pytest.mark.parametrize("case", CASES["judge_errors"], ids=_ids(CASES["judge_errors"]))
def test_judge_rejects_unusable_configs(case: dict[str, Any]) -> None:
    with pytest.raises(_opencode.OpencodeConfigError, match=case["message"]):
        _opencode.judge(
            case["config"],
            provider="lab",
            model="m",
            max_model_len=65536,
            prompt_floor=1,
            reasoning_key="none",
        )


@pytest.mark.parametrize("case", CASES["present"], ids=_ids(CASES["present"]))
def test_present(case: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "opencode" / "opencode.json"
    if "existing" in case or "existing_text" in case:
        path.parent.mkdir()
        path.write_text(case.get("existing_text") or json.dumps(case["existing"], indent=4))
        os.chmod(path, 0o640)
    before = path.read_text() if path.exists() else None
    out = run_module(opencode_config, {**BASE_ARGS, "path": str(path), **case["args"]})
    if "failed" in case:
        assert out.failed, out.result
        for fragment in case["failed"]:
            assert fragment in out.result["msg"], out.result["msg"]
        assert (path.read_text() if path.exists() else None) == before
        return
    assert not out.failed, out.result.get("msg")
    assert out.result["changed"] is case["changed"]
    written = json.loads(path.read_text())
    for dotted, value in case.get("expect", {}).items():
        assert _dig(written, dotted) == value, dotted
    if "mode" in case:
        assert oct(path.stat().st_mode & 0o777) == case["mode"]
    if "warning" in case:
        assert any(case["warning"] in w for w in out.result["warnings_list"])
    # A second run with the same inputs changes nothing; state=checked passes it.
    again = run_module(opencode_config, {**BASE_ARGS, "path": str(path), **case["args"]})
    assert not again.failed and again.result["changed"] is False
    checked = run_module(
        opencode_config, {**BASE_ARGS, "path": str(path), "state": "checked", **case["args"]}
    )
    assert not checked.failed, checked.result.get("msg")


def test_check_mode_and_diff_write_nothing(tmp_path: Path) -> None:
    path = tmp_path / "opencode.json"
    path.write_text('{"theme": "dark"}\n')
    args = {
        **BASE_ARGS,
        "path": str(path),
        "max_model_len": 65536,
        "prompt_floor": 10000,
        "reasoning_key": "reasoning",
        "_ansible_diff": True,
    }
    out = run_module(opencode_config, args, check_mode=True)
    assert out.result["changed"] and path.read_text() == '{"theme": "dark"}\n'
    assert out.result["diff"]["before"] == '{"theme": "dark"}\n'
    after = json.loads(out.result["diff"]["after"])
    assert (
        after["theme"] == "dark"
        and after["provider"]["lab"]["models"]["m"]["limit"]["context"] == 65536
    )


def test_same_content_in_another_layout_is_no_change(tmp_path: Path) -> None:
    path = tmp_path / "opencode.json"
    args = {
        **BASE_ARGS,
        "path": str(path),
        "max_model_len": 65536,
        "prompt_floor": 10000,
        "reasoning_key": "none",
    }
    run_module(opencode_config, args)
    path.write_text(json.dumps(json.loads(path.read_text()), indent=8, sort_keys=True))
    layout = path.read_text()
    out = run_module(opencode_config, args)
    assert out.result["changed"] is False and path.read_text() == layout


def test_checked_catches_seed_000_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "opencode.jsonc"
    text = (
        '{\n  // seed 000\'s first client config\n  "provider": {"lab": {"npm": "@ai-sdk/openai-compatible",'
        ' "models": {"m": {"limit": {"context": 8192, "input": 8192, "output": 4096,},}}}},\n'
        '  "compaction": {"reserved": 8000}\n}\n'
    )
    path.write_text(text)
    out = run_module(
        opencode_config,
        {
            **BASE_ARGS,
            "path": str(path),
            "state": "checked",
            "max_model_len": 16384,
            "prompt_floor": 8193,
            "reasoning_key": "reasoning",
        },
    )
    assert (
        out.failed
        and "[F9 error]" in out.result["msg"]
        and "working budget is 192 tokens" in out.result["msg"]
    )
    assert out.result["limits"]["working_budget"] == 192
    assert path.read_text() == text


def test_checked_without_a_file_says_how_to_write_one(tmp_path: Path) -> None:
    out = run_module(
        opencode_config,
        {
            **BASE_ARGS,
            "path": str(tmp_path / "none.json"),
            "state": "checked",
            "max_model_len": 65536,
            "prompt_floor": 1,
            "reasoning_key": "none",
        },
    )
    assert out.failed and "state=present" in out.result["msg"]


def test_base_url_is_required_for_a_new_provider(tmp_path: Path) -> None:
    args = {
        **BASE_ARGS,
        "path": str(tmp_path / "c.json"),
        "max_model_len": 65536,
        "prompt_floor": 1,
        "reasoning_key": "none",
    }
    del args["base_url"]
    out = run_module(opencode_config, args)
    assert out.failed and "base_url is required" in out.result["msg"]


@pytest.mark.parametrize(
    ("text", "expected", "had"),
    [
        ('{"a": "// not a comment", "b": [1, 2,],}', {"a": "// not a comment", "b": [1, 2]}, True),
        ('{"a": "x\\"/*y"} /* c */', {"a": 'x"/*y'}, True),
        ('{"a": 1}', {"a": 1}, False),
    ],
)
def test_strip_jsonc(text: str, expected: dict[str, Any], had: bool) -> None:
    stripped, found = _opencode.strip_jsonc(text)
    assert json.loads(stripped) == expected and found is had
