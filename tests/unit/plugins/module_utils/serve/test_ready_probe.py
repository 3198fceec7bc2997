# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wait for the first token (module_utils/serve/_ready_probe.py), refused before it starts.

The options are checked and the units' watch set up before any request: a bad timeout, URL
or unit name, or units to watch on a host without systemctl, end the module naming them.
The probe against a stand-in vLLM stream is tests/unit/plugins/modules/test_serving_ready.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _ready_probe
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit


def params(**given) -> dict:
    base = {"url": "http://127.0.0.1:9", "model": "m", "units": [], "timeout": 1, "prompt": "Say OK.",
            "api_key": None, "ca_path": None}
    return {**base, **given}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"timeout": 0}, "timeout must be between 1 and 86400 seconds, got 0"),
        ({"url": "127.0.0.1:8000"}, "url must be http(s)://host:port without spaces, got '127.0.0.1:8000'"),
        ({"url": "http://a b:8000"}, "url must be http(s)://host:port without spaces"),
        ({"units": ["vllm service"]}, "units[0]"),
        ({"units": ["localinference-vllm.service"]},
         "units ['localinference-vllm.service'] given but systemctl is not on this host"),
    ],
    ids=["timeout", "no scheme", "a space", "a unit name with a space", "no systemctl"],
)
def test_a_bad_option_ends_the_module_before_any_request(given, message):
    with pytest.raises(ModuleExit) as caught:
        _ready_probe.run(FakeModule(params(**given)))
    assert caught.value.result["msg"].startswith(message)


def test_the_key_is_sent_only_when_there_is_one():
    assert _ready_probe._headers(None) == {"Content-Type": "application/json"}
    assert _ready_probe._headers("k")["Authorization"] == "Bearer k"


def test_a_server_that_never_answers_health_fails_at_the_deadline():
    with pytest.raises(ModuleExit) as caught:
        _ready_probe.run(FakeModule(params()))
    assert caught.value.result["msg"] == "http://127.0.0.1:9/health did not answer 200 within 1 s"
    assert caught.value.result["unit_state"] == {}
