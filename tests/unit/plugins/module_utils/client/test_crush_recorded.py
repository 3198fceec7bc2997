# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Crush cannot be installed offline (its npm postinstall downloads the binary), so the
crush.json we render (module_utils/client/_agents.py) is checked against Crush's own
schema.json and against a chat-completions request Crush's test suite recorded from a
live OpenAI-compatible server (tests/unit/fixtures/crush/, sources in its README.md).

``crush_request`` is the request Crush builds from a crush.json, written out from Crush's
source (github.com/charmbracelet/crush 37f36e93824e, charm.land/fantasy v0.41.2,
github.com/openai/openai-go v3.50.0; file and line at each step). It is first shown to
reproduce the recorded request from the recording's own settings, then applied to ours."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.client import _agents as c

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "crush"
SCHEMA = json.loads((FIXTURES / "schema.json").read_text(encoding="utf-8"))
RECORDED = json.loads((FIXTURES / "simple_test-request.json").read_text(encoding="utf-8"))

MODEL = "localinference/tiny-deepseek"
URL = "https://127.0.0.1:18080/localinference/tiny-deepseek/v1"
KEY_ENV = "LOCALINFERENCE_API_KEY"
KEY = "sk-lab-0123456789abcdef"
DIR = "/home/op/.config/localinference/clients"
# opencode's budget for a 65,536-token server with output 8,192 (as in test_agents.py).
PLAN = {"context": 65536, "input": 57344, "output": 8192, "reserved": 8192}


def rendered(**kw: Any) -> dict[str, Any]:
    args = {
        "plan": PLAN,
        "model": MODEL,
        "base_url": URL,
        "api_key_env": KEY_ENV,
        "reasoning_key": "reasoning",
        "client_dir": f"{DIR}/crush",
    }
    args.update(kw)
    return c.render("crush", **args)


def is_reasoning_model(model_id: str) -> bool:
    # fantasy providers/openai/language_model.go:587-593 (isReasoningModel)
    return (
        model_id.startswith(("o1", "o3", "o4", "oss"))
        or "-o1" in model_id
        or "-o3" in model_id
        or "-o4" in model_id
        or "-oss" in model_id
        or "gpt-5" in model_id.lower()
    )


def crush_request(doc: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """What Crush sends for the large model of crush.json ``doc`` (no body beyond the budget's keys)."""
    selected = doc["models"]["large"]
    provider = doc["providers"][selected["provider"]]
    # internal/agent/coordinator.go:1142 (case openaicompat.Name): an "openai-compat" provider is
    # built by buildOpenaiCompatProvider (:969-973, openaicompat.WithBaseURL / WithAPIKey).
    assert provider["type"] == "openai-compat"
    # internal/config/config.go:724-731 (GetModel): the model's entry in the provider's list is
    # the CatwalkCfg (internal/agent/coordinator.go:880).
    (catwalk,) = [m for m in provider["models"] if m["id"] == selected["model"]]

    # internal/agent/coordinator.go:1114-1115: api_key and base_url through the shell resolver
    # (internal/config/resolve.go:88); we write only "$NAME", which it reads from the environment.
    def resolve(value: str) -> str:
        return env[value[1:]] if value.startswith("$") else value

    # internal/config/load.go:809-813: the selected model's max_tokens, else the model's
    # default_max_tokens; internal/agent/coordinator.go:254-257: CatwalkCfg.DefaultMaxTokens unless
    # ModelCfg.MaxTokens is set; :302 passes it as MaxOutputTokens, agent.go:791-795 only when > 0.
    max_tokens = selected.get("max_tokens") or catwalk["default_max_tokens"]
    # fantasy providers/openai/language_model.go:148-149: MaxOutputTokens -> max_tokens, moved to
    # max_completion_tokens for the ids it takes for OpenAI reasoning models (:164, :200-206).
    field = "max_completion_tokens" if is_reasoning_model(selected["model"]) else "max_tokens"
    body = {"model": selected["model"], "stream": True}
    if max_tokens > 0:
        body[field] = max_tokens
    # openai-go option/requestoption.go:30-34 (WithBaseURL adds "/" to the path),
    # chatcompletion.go:107 (path "chat/completions", JSON "stream": true),
    # internal/requestconfig/requestconfig.go:893 ("authorization: Bearer <APIKey>").
    return {
        "method": "POST",
        "url": resolve(provider["base_url"]).rstrip("/") + "/chat/completions",
        "authorization": "Bearer " + resolve(provider["api_key"]),
        "body": body,
    }


def the_recordings_config() -> dict[str, Any]:
    # The settings the cassette was recorded with: internal/agent/common_test.go:50-56 (base URL,
    # key from CRUSH_HYPER_API_KEY, model deepseek-v4-pro-0813), :98-112 (DefaultMaxTokens 10000);
    # internal/agent/agent_test.go:71 (MaxOutputTokens 10000). The provider's name is not "hyper":
    # the test builds openaicompat directly, without coordinator.go's hyper special case. The test
    # passes MaxOutputTokens itself (the coordinator's derivation, coordinator.go:254-257, is read
    # from the source, not recorded); the recording shows that value arrives as "max_tokens".
    model = {
        "id": "deepseek-v4-pro-0813",
        "name": "deepseek-v4-pro-0813",
        "cost_per_1m_in": 0,
        "cost_per_1m_out": 0,
        "cost_per_1m_in_cached": 0,
        "cost_per_1m_out_cached": 0,
        "context_window": 200000,
        "default_max_tokens": 10000,
        "can_reason": False,
        "supports_attachments": False,
    }
    return {
        "providers": {
            "recorded": {
                "type": "openai-compat",
                "base_url": "https://hyper.charm.land/v1",
                "api_key": "$CRUSH_HYPER_API_KEY",
                "models": [model],
            }
        },
        "models": {"large": {"model": "deepseek-v4-pro-0813", "provider": "recorded"}},
    }


def test_the_fixture_is_the_recorded_request():
    # The pretty-printed body is the recorded string again, byte for byte (content_length).
    compact = json.dumps(RECORDED["body"], separators=(",", ":"), ensure_ascii=False)
    assert len(compact.encode("utf-8")) == RECORDED["content_length"] == 37371
    assert (RECORDED["method"], RECORDED["url"]) == (
        "POST",
        "https://hyper.charm.land/v1/chat/completions",
    )
    # charm.land/x/vcr keeps Accept, Content-Type and User-Agent only: no key was recorded.
    assert set(RECORDED["headers"]) == {"Accept", "Content-Type", "User-Agent"}
    assert RECORDED["headers"]["User-Agent"][0].startswith("Charm-Crush/")


def test_the_recorded_body_has_the_fields_we_budget():
    body = RECORDED["body"]
    assert (body["model"], body["max_tokens"], body["stream"]) == (
        "deepseek-v4-pro-0813",
        10000,
        True,
    )
    assert "max_completion_tokens" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user", "user"]
    assert body["messages"][-1]["content"] == "Hello"
    assert body["tool_choice"] == "auto"
    assert body["tools"] and all(t["type"] == "function" for t in body["tools"])
    names = [t["function"]["name"] for t in body["tools"]]
    assert names[:2] == ["bash", "download"] and "view" in names and len(names) == 11
    assert all(t["function"]["parameters"]["type"] == "object" for t in body["tools"])


def test_crush_request_reproduces_the_recording():
    got = crush_request(the_recordings_config(), {"CRUSH_HYPER_API_KEY": "recorded-key"})
    assert (got["method"], got["url"]) == (RECORDED["method"], RECORDED["url"])
    for name, value in got["body"].items():
        assert RECORDED["body"][name] == value, name
    assert got["authorization"] == "Bearer recorded-key"


@pytest.mark.parametrize("reasoning", ["reasoning", "none"])
@pytest.mark.parametrize(
    "plan",
    [
        PLAN,
        {"context": 16384, "output": 8192, "reserved": 8192},
        {"context": 262144, "output": 32768, "reserved": 20000},
    ],
)
def test_our_config_is_valid_under_crushs_schema(plan, reasoning):
    doc = json.loads(rendered(plan=plan, reasoning_key=reasoning)["config"])
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)


@pytest.mark.parametrize(
    ("path", "key"),
    [
        (("providers", "localinference", "models", 0), "max_output_tokens"),
        (("providers", "localinference"), "apiKey"),
        (("models", "large"), "maxTokens"),
        ((), "provider"),
    ],
)
def test_the_schema_refuses_a_key_crush_does_not_read(path, key):
    # Crush's schema allows no other keys (additionalProperties false), so the validation above
    # would catch a misspelt field, which Crush itself ignores when it loads the file.
    doc = json.loads(rendered()["config"])
    node = doc
    for step in path:
        node = node[step]
    node[key] = 1
    with pytest.raises(jsonschema.ValidationError, match="Additional properties are not allowed"):
        jsonschema.Draft202012Validator(SCHEMA).validate(doc)


def test_the_schema_holds_the_type_and_fields_we_write():
    defs = SCHEMA["$defs"]
    assert "openai-compat" in defs["ProviderConfig"]["properties"]["type"]["enum"]
    assert {"context_window", "default_max_tokens", "can_reason"} <= set(defs["Model"]["required"])
    assert defs["SelectedModel"]["properties"]["max_tokens"]["maximum"] == 200000
    assert {"disable_provider_auto_update", "disable_metrics"} <= set(defs["Options"]["properties"])


@pytest.mark.parametrize(
    "plan",
    [
        PLAN,
        {"context": 16384, "output": 8192, "reserved": 8192},
        {"context": 262144, "output": 32768, "reserved": 20000},
    ],
)
def test_the_request_from_our_config_carries_our_budget(plan):
    got = rendered(plan=plan)
    doc = json.loads(got["config"])
    env = {**got["env"], KEY_ENV: KEY}
    request = crush_request(doc, env)
    (model,) = doc["providers"]["localinference"]["models"]
    # the output budget is what Crush asks the server for, under the recorded field's name
    assert request["body"]["max_tokens"] == model["default_max_tokens"] == got["budget"]["output"]
    assert doc["models"]["large"]["max_tokens"] == model["default_max_tokens"]
    assert request["body"]["model"] == MODEL
    assert set(request["body"]) <= set(RECORDED["body"])
    # the URL has the recorded request's shape: base_url + "/chat/completions"
    assert request["url"] == URL + "/chat/completions"
    assert RECORDED["url"] == "https://hyper.charm.land/v1" + "/chat/completions"
    # the key comes from the environment at request time; it is never in the file
    assert request["authorization"] == f"Bearer {KEY}"
    assert KEY not in got["config"]
    assert doc["providers"]["localinference"]["api_key"] == f"${KEY_ENV}"
    # the window is the server's context, the compaction point leaves the output room
    assert model["context_window"] == plan["context"]
    assert got["budget"]["compact_at"] + request["body"]["max_tokens"] <= plan["context"]


def test_no_reasoning_effort_is_sent_for_our_model():
    # internal/agent/coordinator.go:343-356, 408-411: reasoning_effort goes into the body only
    # when the model lists reasoning_levels; ours lists none, even with can_reason on.
    doc = json.loads(rendered(reasoning_key="reasoning")["config"])
    (model,) = doc["providers"]["localinference"]["models"]
    assert model["can_reason"] is True
    assert "reasoning_levels" not in model and "default_reasoning_effort" not in model
    assert not is_reasoning_model(MODEL)


def test_the_helper_follows_fantasys_reasoning_rule():
    # the ids fantasy sends max_completion_tokens for, and ids it does not
    assert crush_request_field("openai/gpt-oss-120b") == "max_completion_tokens"
    assert crush_request_field("o3-mini") == "max_completion_tokens"
    assert crush_request_field(MODEL) == "max_tokens"
    assert crush_request_field("Qwen/Qwen3-Coder-30B-A3B-Instruct") == "max_tokens"


def crush_request_field(model_id: str) -> str:
    doc = json.loads(rendered(model=model_id)["config"])
    body = crush_request(doc, {KEY_ENV: KEY})["body"]
    (field,) = {"max_tokens", "max_completion_tokens"} & set(body)
    return field


def test_crush_finds_its_config_through_the_env_file():
    # internal/config/load.go:1181-1185: CRUSH_GLOBAL_CONFIG is the directory of crush.json
    got = rendered()
    assert got["env"]["CRUSH_GLOBAL_CONFIG"] == os.path.dirname(got["config_path"])
    assert os.path.basename(got["config_path"]) == "crush.json"
