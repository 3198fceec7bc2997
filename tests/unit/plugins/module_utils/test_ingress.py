# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ingress (module_utils/_ingress.py, filter ingress.py) from case tables in test_ingress.yaml."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.ingress import FilterModule
from ansible_collections.localinference.vllm.plugins.module_utils import _ingress
from ansible_collections.localinference.vllm.plugins.module_utils._validate import (
    ValidationError,
)

HERE = Path(__file__).resolve().parent
CASES = yaml.safe_load((HERE / "test_ingress.yaml").read_text())
FILTERS = FilterModule().filters()
MODEL = "localinference/tiny-deepseek"
BASE: dict[str, Any] = {
    "models": [{"name": MODEL, "upstream": {"host": "0.0.0.0", "port": 8000}}],
    "listen_address": "",
    "port": 8080,
    "public_url": "http://127.0.0.1:18080",
    "head": "spark-head",
    "unit": "localinference-vllm.service",
    "upstream_timeout": 3600,
    "dial_timeout": 10,
    "key_path": "/etc/localinference/ingress/api-key.env",
}


def spec(**patch: Any) -> dict[str, Any]:
    return {**copy.deepcopy(BASE), **patch}


def test_routes_a_served_name_with_a_slash_by_path():
    result = _ingress.config(spec())["result"]
    (route,) = result["routes"]
    assert route["prefix"] == "/localinference/tiny-deepseek"
    assert route["base_url"] == "http://127.0.0.1:18080/localinference/tiny-deepseek/v1"
    assert route["upstream"] == "127.0.0.1:8000"  # 0.0.0.0 is reached on loopback
    assert result["endpoint"] == route["base_url"]
    assert result["health_url"] == "http://127.0.0.1:18080/health"
    assert result["key_file"] == BASE["key_path"]


def test_the_caddyfile_holds_what_the_issue_asks():
    text = _ingress.config(spec())["caddyfile"]
    # Caddy 2.6 ends a stream whose handler says flush_interval -1 when its config is
    # reloaded (a key rotation): SSE is flushed token by token without it.
    assert "flush_interval -1" not in text
    assert "response_header_timeout 3600s" in text and "read_timeout 3600s" in text
    assert "header_up -Authorization" in text
    assert (
        "@route_0 path /localinference/tiny-deepseek/v1 /localinference/tiny-deepseek/v1/*" in text
    )
    assert "uri strip_prefix /localinference/tiny-deepseek" in text
    # No key in the file: Caddy takes it from its environment when it loads the file
    # (start and reload), so a reload takes a new key.
    assert '"Bearer {$LOCALINFERENCE_INGRESS_API_KEY}"' in text
    assert '"{$LOCALINFERENCE_INGRESS_API_KEY}" != ""' in text  # an unset key refuses everything
    # During a rotation the next key is accepted too, only while it is set.
    assert '"{$LOCALINFERENCE_INGRESS_API_KEY_NEXT}" != "" && ' in text
    assert "{env." not in text
    # The 502 body names the unit and how to read its log.
    assert "journalctl -u localinference-vllm.service" in text
    assert "on spark-head" in text
    # The key check comes before every model route.
    assert text.index("respond @denied") < text.index("@route_0 path")


def test_the_key_never_reaches_the_caddyfile_or_the_result():
    key = "k" * 40
    built = _ingress.config(spec())
    assert key not in built["caddyfile"] and key not in json.dumps(built["result"])
    assert _ingress.env_file("ingress_api_key", key) == f"LOCALINFERENCE_INGRESS_API_KEY={key}\n"


def test_a_rotation_file_holds_the_key_in_use_first_and_the_next_one():
    old, new = "o" * 40, "n" * 48
    text = FILTERS["ingress_key_env_file"](old, next_key=new)
    assert text == (
        f"LOCALINFERENCE_INGRESS_API_KEY={old}\nLOCALINFERENCE_INGRESS_API_KEY_NEXT={new}\n"
    )
    # Every reader of the key file (watchdog, doctor) keeps the key in use until the last step.
    assert _ingress.key_from_env_file(text, "api-key.env") == old
    with pytest.raises(AnsibleFilterError) as err:
        FILTERS["ingress_key_env_file"](old, next_key="short")
    assert "is 5 characters long" in str(err.value) and "short" not in str(err.value)


def test_longer_routes_come_first():
    models = [
        {"name": "org", "upstream": {"port": 8000}},
        {"name": "org/big", "upstream": {"port": 8001}},
    ]
    text = _ingress.config(spec(models=models))["caddyfile"]
    assert text.index("path /org/big/v1 ") < text.index("path /org/v1 ")


def test_every_rendered_line_is_one_the_renderer_wrote():
    """Structure check: braces balance and no line comes from a value."""
    text = _ingress.config(spec())["caddyfile"]
    depth = 0
    for line in text.splitlines():
        bare = re.sub(r"`[^`]*`", "", line.split("#", 1)[0])
        depth += bare.count("{") - bare.count("}")
        assert depth >= 0, line
    assert depth == 0


@pytest.mark.parametrize("case", CASES["spec_errors"], ids=lambda c: c["case"])
def test_bad_specs_are_refused_naming_the_input(case):
    patch = dict(case.get("patch") or {})
    if "models" in case:
        patch["models"] = case["models"]
    with pytest.raises(ValidationError) as err:
        _ingress.config(spec(**patch))
    assert err.value.name.startswith(case["name"]), str(err.value)
    for text in case["says"]:
        assert text in str(err.value), str(err.value)
    with pytest.raises(AnsibleFilterError, match=re.escape(case["name"])):
        FILTERS["ingress_config"](spec(**patch))


@pytest.mark.parametrize("case", CASES["key_errors"], ids=lambda c: c["case"])
def test_bad_keys_are_refused_without_showing_them(case):
    with pytest.raises(AnsibleFilterError) as err:
        FILTERS["ingress_key_env_file"](case["key"])
    message = str(err.value)
    assert message.startswith("ingress_api_key: ")
    for text in case["says"]:
        assert text in message, message
    if isinstance(case["key"], str) and len(case["key"]) > 3:
        assert case["key"] not in message
        assert case["key"][:8] not in message


@pytest.mark.parametrize("case", CASES["key_errors"], ids=lambda c: c["case"])
def test_a_bad_key_is_not_valid_and_raises_nothing(case):
    """site.yml's "nothing to do?" asks first, so a bad key makes the stages run (and the ingress say why)."""
    assert FILTERS["ingress_key_valid"](case["key"]) is False


def test_a_good_key_is_valid():
    assert FILTERS["ingress_key_valid"]("Zq7sEcr3tV4lue-kEy_0123456789abcdef") is True
    assert FILTERS["ingress_key_valid"]("Zq7sEcr3tV4lue-kEy_0123456789abcdef\n") is True


@pytest.mark.parametrize("case", CASES["sockets"], ids=lambda c: c["case"])
def test_exposure_audit(case):
    sockets = FILTERS["ingress_listening"](case["ss"])
    found = FILTERS["ingress_exposure"](sockets, "spark-head", [8000], ["10.77.0.11"])
    assert [{k: f[k] for k in ("id", "severity", "port")} for f in found] == case["expected"]
    for f in found:
        assert f["message"] and f["fix"] and f["host"] == "spark-head"


def test_models_from_the_head_serving_state():
    state = {"recipe": {"served_model_name": MODEL, "host": "127.0.0.1", "port": 8000}}
    models = FILTERS["ingress_models_from_state"](json.dumps(state))
    assert models == [{"name": MODEL, "upstream": {"host": "127.0.0.1", "port": 8000}}]
    several = {"recipe": {"served_model_name": ["a", "b"], "port": 9000}}
    assert [m["name"] for m in FILTERS["ingress_models_from_state"](several)] == ["a", "b"]


@pytest.mark.parametrize(
    "text",
    ["not json", "[1, 2]", '{"recipe": "x"}', "null"],
    ids=["not json", "a list", "recipe not a mapping", "null"],
)
def test_a_bad_serving_state_is_an_error_not_a_traceback(text):
    with pytest.raises(AnsibleFilterError, match=r"serving\.json.*(rollout|ingress_models)"):
        FILTERS["ingress_models_from_state"](text)


def test_a_bad_served_name_in_the_state_is_refused_at_config():
    state = {"recipe": {"served_model_name": "x\n}", "port": 8000}}
    models = FILTERS["ingress_models_from_state"](state)
    with pytest.raises(AnsibleFilterError, match=r"ingress_models\[0\]\.name"):
        FILTERS["ingress_config"](spec(models=models))
