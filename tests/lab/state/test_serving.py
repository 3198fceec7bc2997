# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The converged lab serves, checked from outside (molecule verify). Read-only.

The endpoint the serve role wrote to .lab/endpoint lists the model and streams
a first token; both nodes run the vLLM unit and record the same recipe.
"""

from __future__ import annotations

import pytest

from lab.harness import (
    ENDPOINT_FILE,
    HOSTS,
    MODEL,
    SERVING_STATE,
    VLLM_UNIT,
    endpoint,
    exec_on,
    first_token,
    read_json,
    served_models,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]


def test_endpoint_file_names_an_endpoint_serving_the_model():
    assert ENDPOINT_FILE.is_file(), f"the serve role wrote no {ENDPOINT_FILE}"
    assert ENDPOINT_FILE.read_text().strip().endswith("/v1")
    assert MODEL in [model["id"] for model in served_models(endpoint())]


def test_endpoint_streams_a_first_token():
    token = first_token()
    assert token["text"], token


def test_every_node_runs_the_server_unit_for_the_same_recipe():
    hashes = {}
    for host in HOSTS:
        state = exec_on(host, "systemctl", "is-active", VLLM_UNIT, check=False).stdout.strip()
        assert state == "active", f"{host}: {VLLM_UNIT} is {state}"
        hashes[host] = read_json(host, SERVING_STATE)["recipe_hash"]
    assert len(set(hashes.values())) == 1, hashes
