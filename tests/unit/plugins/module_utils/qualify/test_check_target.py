# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a qualification check runs against (module_utils/qualify/_check_target.py).

The engine's /metrics beside its OpenAI base URL, the served model asked of the endpoint when
none is given (a stand-in server), and the options refused before anything is sent. The checks
themselves are test_checks.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._check_target import (
    default_metrics_url,
    run,
    served_model,
)
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._http import (
    Client,
    HttpError,
)
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit

from .fake_vllm import FakeServer, as_json


@pytest.mark.parametrize(
    ("base", "metrics"),
    [
        (
            "http://127.0.0.1:18080/localinference/tiny-deepseek/v1",
            "http://127.0.0.1:18080/localinference/tiny-deepseek/metrics",
        ),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/metrics"),
    ],
)
def test_default_metrics_url(base, metrics):
    assert default_metrics_url(base) == metrics


def test_the_served_model_is_the_first_the_endpoint_lists():
    models = {"object": "list", "data": [{"id": "localinference/tiny-deepseek"}, {"id": "other"}]}
    with FakeServer(lambda method, path, body: as_json(models)) as server:
        assert served_model(Client(server.base_url, None, 5)) == "localinference/tiny-deepseek"


def test_an_endpoint_without_a_model_says_what_to_give():
    with (
        FakeServer(lambda method, path, body: as_json({"data": []})) as server,
        pytest.raises(HttpError, match=r"without a model .*: give model, or check base_url and api_key"),
    ):
        served_model(Client(server.base_url, None, 5))


@pytest.mark.parametrize(
    ("given", "message"),
    [({"repeat": 0}, "repeat must be at least 1, got 0"),
     ({"max_model_len": 0}, "max_model_len must be positive, got 0")],
    ids=["repeat", "max_model_len"],
)
def test_options_are_refused_before_anything_is_sent(given, message):
    params = {"check": "smoke", "base_url": "http://127.0.0.1:9/v1", "api_key": None, "ca_path": None,
              "model": None, "max_model_len": None, "timeout": 1, "metrics_url": None,
              "model_limitation": "", "repeat": 1, "params": {}, **given}
    with pytest.raises(ModuleExit) as caught:
        run(FakeModule(params))
    assert caught.value.result["msg"] == message
