# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Claude Code, Codex, Qwen Code and Crush configs from opencode's measured budget
(module_utils/client/_agents.py) as case tables: budget -> each client's own limits or its refusal
with the numbers; rendered file -> the keys each client reads, the key never in a config, a user's
other keys kept."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.clients import FilterModule
from ansible_collections.localinference.vllm.plugins.module_utils.client import _agents as c
from ansible_collections.localinference.vllm.plugins.module_utils.client._toml_write import (
    TomlWriteError,
    dumps,
)

MODEL = "localinference/tiny-deepseek"
URL = "https://127.0.0.1:18080/localinference/tiny-deepseek/v1"
KEY = "sk-lab-0123456789abcdef"
DIR = "/home/op/.config/localinference/clients"
# opencode's budget for a 65,536-token server with output 8,192 (reserved = min(20000, O)).
PLAN = {"context": 65536, "input": 57344, "output": 8192, "reserved": 8192}
FILTERS = FilterModule().filters()


def rendered(client: str, **kw: Any) -> dict[str, Any]:
    args = {"plan": PLAN, "model": MODEL, "base_url": URL, "api_key_env": "LOCALINFERENCE_API_KEY",
            "reasoning_key": "reasoning", "client_dir": f"{DIR}/{client}"}
    args.update(kw)
    return c.render(client, **args)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["opencode"], ["opencode"]),
        (["codex", "opencode", "crush"], ["opencode", "codex", "crush"]),
        (["opencode", "claude_code", "codex", "qwen_code", "crush"],
         ["opencode", "claude_code", "codex", "qwen_code", "crush"]),
        (["opencode", "aider"], "unknown client(s) 'aider'; known: opencode, claude_code"),
        (["opencode", "codex", "codex"], "names codex more than once"),
        (["codex"], "must include opencode"),
        ("opencode", "must be a list of client names"),
        ([1], "must be a list of client names"),
    ],
)
def test_check_clients(value, expected):
    if isinstance(expected, list):
        assert c.check_clients(value) == expected
        assert FILTERS["agent_clients_check"](value) == expected
    else:
        with pytest.raises(c.ClientConfigError, match="agent_client_clients"):
            c.check_clients(value)
        with pytest.raises(AnsibleFilterError) as err:
            FILTERS["agent_clients_check"](value)
        assert expected in str(err.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, {}),
        ({"codex": 9000}, {"codex": 9000}),
        ({"opencode": 9000}, "opencode's floor is measured"),
        ({"crush": 9000}, "not among the other clients"),
        ({"codex": 0}, "positive number of tokens"),
        ({"codex": True}, "positive number of tokens"),
        (["codex"], "must be a dict"),
    ],
)
def test_check_floors(value, expected):
    clients = ["opencode", "codex"]
    if isinstance(expected, dict):
        assert c.check_floors(value, clients) == expected
    else:
        with pytest.raises(c.ClientConfigError, match="agent_client_prompt_floors") as err:
            c.check_floors(value, clients)
        assert expected in str(err.value)


# (client, plan, prompt floor) -> (output, compaction point) or the refusal's words.
@pytest.mark.parametrize(
    ("client", "plan", "floor", "expected"),
    [
        # Claude Code: window - min(O, 20000) - 13000.
        ("claude_code", PLAN, None, (8192, 65536 - 8192 - 13000)),
        ("claude_code", PLAN, 20000, (8192, 44344)),
        # O above 33,000 would overflow at the compaction point: lowered to 33,000.
        ("claude_code", {"context": 262144, "output": 65536, "reserved": 20000}, None,
         (33000, 262144 - 33000)),
        # Claude Code's ~20K floor does not fit a 32K server beside its 13K margin.
        ("claude_code", {"context": 32768, "output": 4096, "reserved": 4096}, 20000,
         "compaction point 15672 is below the prompt floor 20000 + 10240 tokens of room to work (F9);"
         " the served context must grow to 47336 (+14568)"),
        # Codex: opencode's B = L - O - R.
        ("codex", PLAN, None, (8192, 65536 - 8192 - 8192)),
        ("codex", PLAN, 30000, (8192, 49152)),
        ("codex", PLAN, 40000, "compaction point 49152 is below the prompt floor 40000"),
        ("codex", {"context": 8192, "output": 4096, "reserved": 8000}, None,
         "compaction point -3904: it would compact after every turn (F9)"),
        ("codex", {"context": 8192, "output": 8192, "reserved": 0}, None,
         "output 8192 is not below the served context 8192 (F8)"),
        # Qwen Code: a share of the window, rounded down to 1/1000.
        ("qwen_code", PLAN, None, (8192, int(0.75 * 65536))),
        ("qwen_code", {"context": 100000, "output": 10000, "reserved": 10001}, None, (10000, 79900)),
        # Crush: 20 % of a window up to 200,000 is kept free, so output is at most that.
        ("crush", PLAN, None, (8192, 65536 - 13107)),
        ("crush", {"context": 16384, "output": 8192, "reserved": 8192}, None, (3276, 16384 - 3276)),
        ("crush", {"context": 262144, "output": 32768, "reserved": 20000}, None, (20000, 242144)),
        ("crush", {"context": 4096, "output": 1024, "reserved": 1024}, None,
         "output 819 is below 1024 tokens"),
    ],
)
def test_client_budget(client, plan, floor, expected):
    if isinstance(expected, tuple):
        got = c.client_budget(client, plan, floor)
        assert (got["output"], got["compact_at"]) == expected
        assert got["compact_at"] + got["output"] <= got["context"]
        assert got["calibrated"] is (floor is not None)
    else:
        with pytest.raises(c.ClientRefused) as err:
            c.client_budget(client, plan, floor)
        assert expected in str(err.value)
        assert str(err.value).startswith(client)


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        ("65536", "must be a dict"),
        ({"context": 0, "output": 0, "reserved": 0}, "context must be positive"),
        ({"context": 65536, "output": None, "reserved": 0}, "output must be a token count"),
        ({"context": 65536, "output": 1024, "reserved": True}, "reserved must be a token count"),
    ],
)
def test_bad_budget(plan, expected):
    with pytest.raises(c.ClientConfigError) as err:
        c.client_budget("codex", plan)
    assert expected in str(err.value)


def test_claude_code_settings():
    got = rendered("claude_code", ca_file="/home/op/.lab/ingress/ca.crt")
    env = json.loads(got["config"])["env"]
    assert env["ANTHROPIC_BASE_URL"] == "https://127.0.0.1:18080/localinference/tiny-deepseek"
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == MODEL
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "65536"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert got["config_path"] == f"{DIR}/claude_code/settings.json"
    assert got["key_env"] == "ANTHROPIC_AUTH_TOKEN"
    assert got["env"] == {"CLAUDE_CONFIG_DIR": f"{DIR}/claude_code",
                          "NODE_EXTRA_CA_CERTS": "/home/op/.lab/ingress/ca.crt"}


def test_codex_config_toml():
    got = rendered("codex", ca_file="/home/op/ca.crt")
    doc = tomllib.loads(got["config"])
    assert doc["model"] == MODEL and doc["model_provider"] == "localinference"
    assert (doc["model_context_window"], doc["model_auto_compact_token_limit"]) == (65536, 49152)
    # Codex 0.169.0 warns that it ignores model_max_output_tokens: not written.
    assert "model_max_output_tokens" not in doc
    assert doc["model_providers"]["localinference"] == {
        "name": "localinference", "base_url": URL, "env_key": "LOCALINFERENCE_API_KEY",
        "wire_api": "responses", "requires_openai_auth": False}
    # No shell snapshot of the environment (it holds the key) and no key in the agent's commands.
    assert doc["features"] == {"shell_snapshot": False}
    assert doc["shell_environment_policy"] == {"exclude": ["LOCALINFERENCE_API_KEY"]}
    # Codex is not a Node program: the CA through SSL_CERT_FILE, not NODE_EXTRA_CA_CERTS.
    assert got["env"] == {"CODEX_HOME": f"{DIR}/codex", "SSL_CERT_FILE": "/home/op/ca.crt"}
    assert rendered("codex")["env"] == {"CODEX_HOME": f"{DIR}/codex"}


def test_qwen_code_settings():
    doc = json.loads(rendered("qwen_code")["config"])
    entry = doc["modelProviders"]["openai"][0]
    assert (entry["id"], entry["baseUrl"], entry["envKey"]) == (MODEL, URL, "LOCALINFERENCE_API_KEY")
    assert entry["generationConfig"] == {"contextWindowSize": 65536, "samplingParams": {"max_tokens": 8192}}
    # 0.24.4 reads context.autoCompactThreshold; model.chatCompression.contextPercentageThreshold is gone.
    assert doc["context"] == {"autoCompactThreshold": 0.75}
    assert doc["model"] == {"name": MODEL}
    assert doc["security"]["auth"]["selectedType"] == "openai"


# Required fields of crush.json's Model and SelectedModel, from the schema.json of
# https://github.com/charmbracelet/crush at commit 02c270a4c5ed.
CRUSH_MODEL_REQUIRED = {"id", "name", "cost_per_1m_in", "cost_per_1m_out", "cost_per_1m_in_cached",
                        "cost_per_1m_out_cached", "context_window", "default_max_tokens", "can_reason",
                        "supports_attachments"}
CRUSH_PROVIDER_KEYS = {"id", "name", "base_url", "type", "api_key", "oauth", "disable", "system_prompt_prefix",
                       "extra_headers", "extra_body", "provider_options", "aws_auth_refresh", "flat_rate",
                       "discover_models", "models"}


@pytest.mark.parametrize(("reasoning", "can_reason"), [("reasoning", True), ("none", False)])
def test_crush_json(reasoning, can_reason):
    doc = json.loads(rendered("crush", reasoning_key=reasoning)["config"])
    provider = doc["providers"]["localinference"]
    assert set(provider) <= CRUSH_PROVIDER_KEYS
    assert (provider["type"], provider["api_key"]) == ("openai-compat", "$LOCALINFERENCE_API_KEY")
    (model,) = provider["models"]
    assert set(model) == CRUSH_MODEL_REQUIRED
    assert (model["context_window"], model["default_max_tokens"], model["can_reason"]) == (65536, 8192, can_reason)
    assert doc["models"]["large"] == {"model": MODEL, "provider": "localinference", "max_tokens": 8192}


@pytest.mark.parametrize("client", ["claude_code", "codex", "qwen_code", "crush"])
def test_the_key_is_only_in_the_env_file(client):
    got = rendered(client)
    assert KEY not in got["config"]
    text = c.env_text(got, KEY)
    assert text.splitlines()[-1] == f"{got['key_env']}={KEY}"
    assert KEY not in c.env_text(got, None)


@pytest.mark.parametrize(
    ("client", "existing", "kept"),
    [
        ("claude_code", '{"permissions": {"allow": ["Bash(ls)"]}, "env": {"FOO": "1"}}',
         lambda d: d["permissions"] == {"allow": ["Bash(ls)"]} and d["env"]["FOO"] == "1"),
        ("codex", 'approval_policy = "never"\n[model_providers.other]\nbase_url = "http://x/v1"\n',
         lambda d: d["approval_policy"] == "never" and d["model_providers"]["other"]["base_url"] == "http://x/v1"),
        ("crush", '{"lsp": {"go": {"command": "gopls"}}}', lambda d: d["lsp"]["go"]["command"] == "gopls"),
        # the user's own exclusions and features kept beside the collection's
        ("codex", '[features]\nweb_search_request = true\n[shell_environment_policy]\nexclude = ["AWS_*"]\n',
         lambda d: d["shell_environment_policy"]["exclude"] == ["AWS_*", "LOCALINFERENCE_API_KEY"]
         and d["features"] == {"web_search_request": True, "shell_snapshot": False}),
        ("codex", '[shell_environment_policy]\nexclude = ["LOCALINFERENCE_API_KEY"]\n',
         lambda d: d["shell_environment_policy"]["exclude"] == ["LOCALINFERENCE_API_KEY"]),
    ],
)
def test_a_users_other_keys_are_kept(client, existing, kept):
    text = rendered(client, existing=existing)["config"]
    doc = tomllib.loads(text) if client == "codex" else json.loads(text)
    assert kept(doc)


@pytest.mark.parametrize(
    ("client", "kw", "expected"),
    [
        ("codex", {"existing": "model = ["}, "codex/config.toml exists and is not valid TOML"),
        ("crush", {"existing": "[1, 2]"}, "holds a list, not a config object"),
        ("claude_code", {"model": "claude-sonnet"}, "starts with 'claude'"),
        ("codex", {"client_dir": "relative/dir"}, "agent_client_dir must give an absolute path"),
        ("codex", {"client_dir": "/home/op/my clients"}, "agent_client_dir must give an absolute path"),
        ("codex", {"api_key_env": "MY-KEY"}, "agent_client_api_key_env"),
        ("codex", {"base_url": "127.0.0.1:8000/v1"}, "agent_client_base_url"),
        ("codex", {"model": ""}, "agent_client_model"),
        ("aider", {}, "agent_client_clients: no config rules for 'aider'"),
    ],
)
def test_bad_input_names_the_variable(client, kw, expected):
    with pytest.raises(c.ClientConfigError) as err:
        rendered(client, **kw)
    assert expected in str(err.value)


def test_the_filter_refuses_every_client_at_once_before_writing():
    small = {"context": 16384, "output": 1024, "reserved": 1024}
    with pytest.raises(AnsibleFilterError) as err:
        FILTERS["agent_clients_render"](
            small, ["opencode", "claude_code", "codex", "crush"], MODEL, URL, "LOCALINFERENCE_API_KEY",
            "reasoning", DIR, {"claude_code": 15000, "codex": 13000, "crush": 1000})
    text = str(err.value)
    assert text.startswith("no client config was written: ")
    assert "claude_code (" in text and "codex (" in text and "crush (" not in text


def test_the_filter_renders_each_client_in_its_folder():
    got = FILTERS["agent_clients_render"](
        PLAN, ["crush", "opencode", "codex"], MODEL, URL, "LOCALINFERENCE_API_KEY", "reasoning", DIR + "/",
        existing={"codex": 'approval_policy = "never"\n'})
    assert [(r["client"], r["config_path"], r["env_path"]) for r in got] == [
        ("crush", f"{DIR}/crush/crush.json", f"{DIR}/crush/env"),
        ("codex", f"{DIR}/codex/config.toml", f"{DIR}/codex/env"),
    ]
    assert 'approval_policy = "never"' in got[1]["config"]
    assert FILTERS["agent_client_env_text"](got[1], KEY).endswith(f"LOCALINFERENCE_API_KEY={KEY}\n")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"a": 1, "t": {"b": "x\"y", "c": [1, 2], "d": True}},
         'a = 1\n\n[t]\nb = "x\\"y"\nc = [1, 2]\nd = true\n'),
        ({"t": {"u": {"v": 0.5}}, "k": "z"}, 'k = "z"\n\n[t.u]\nv = 0.5\n'),
        ({"odd key": "line\nbreak"}, '"odd key" = "line\\nbreak"\n'),
    ],
)
def test_toml_writer(doc, expected):
    assert dumps(doc) == expected
    assert tomllib.loads(dumps(doc)) == doc


@pytest.mark.parametrize("value", [float("nan"), {1, 2}, None.__class__])
def test_toml_writer_refuses(value):
    with pytest.raises(TomlWriteError):
        dumps({"k": value})
