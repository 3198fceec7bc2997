# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The converged one-host lab, checked from outside (molecule -s onehost verify). Read-only.

One systemd host, ``rtx-host`` (molecule/onehost, inventories/lab-onehost),
stands in for one machine with two RTX PRO 6000 cards: the fabric stage saved
that there is no cluster link, the endpoint streams a token through the ingress,
and the one vLLM unit runs tensor parallel 2 inside the host with no multi-node
flag. Nothing here touches the default lab (spark-head, spark-worker, .lab/endpoint).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from lab.harness import (
    FABRIC_RESULT,
    LAB_DIR,
    MODEL,
    PREFLIGHT_RESULT,
    SERVING_STATE,
    VLLM_UNIT,
    exec_on,
    first_token,
    read_json,
    served_models,
)

HOST = "rtx-host"
ONEHOST_DIR = LAB_DIR / "onehost"
ENDPOINT_FILE = ONEHOST_DIR / "endpoint"
API_KEY_FILE = ONEHOST_DIR / "ingress" / "api-key"
MULTI_NODE_FLAGS = {"--nnodes", "--node-rank", "--master-addr", "--headless"}

pytestmark = pytest.mark.lab


def _host_up() -> bool:
    if shutil.which("podman") is None:
        return False
    done = subprocess.run(
        ["podman", "ps", "--format", "{{.Names}}"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return HOST in done.stdout.split()


@pytest.fixture(scope="module", autouse=True)
def onehost(monkeypatch_module: pytest.MonkeyPatch, require_lab) -> None:
    """rtx-host is up; the harness talks to this lab's endpoint with this lab's key."""
    require_lab(_host_up(), f"needs the one-host lab ({HOST}) running: make test-onehost")
    assert ENDPOINT_FILE.is_file(), f"the serve role wrote no {ENDPOINT_FILE}"
    monkeypatch_module.setenv("LOCALINFERENCE_LAB_ENDPOINT", ENDPOINT_FILE.read_text().strip())
    monkeypatch_module.setenv("LOCALINFERENCE_LAB_API_KEY", API_KEY_FILE.read_text().split()[0])


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_the_fabric_result_says_single_host():
    saved = read_json(HOST, FABRIC_RESULT)
    result = saved["result"]
    assert saved["stage"] == "fabric"
    assert result["single_host"] is True
    assert result["link"] == "single host: no cluster link"
    assert result["nodes"] == [HOST]
    assert result["findings"] == [] and result["interfaces"] == []
    # the ranks bound to loopback (their gloo sockets listened on the management address without)
    assert result["env"] == {
        "VLLM_HOST_IP": "127.0.0.1",
        "NCCL_SOCKET_IFNAME": "lo",
        "GLOO_SOCKET_IFNAME": "lo",
    }


def test_the_endpoint_streams_a_token_through_the_ingress():
    assert ENDPOINT_FILE.read_text().strip() == (
        "https://127.0.0.1:18082/localinference/tiny-deepseek/v1"
    )
    assert MODEL in [model["id"] for model in served_models()]
    token = first_token(timeout=120)
    assert token["text"], token


def test_one_unit_serves_tensor_parallel_2_inside_the_host():
    state = exec_on(HOST, "systemctl", "is-active", VLLM_UNIT, check=False).stdout.strip()
    assert state == "active", f"{HOST}: {VLLM_UNIT} is {state}"
    serving = read_json(HOST, SERVING_STATE)
    argv = serving["server_argv"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "mp"
    assert not MULTI_NODE_FLAGS & set(argv), argv
    assert serving["node"]["nnodes"] == 1 and serving["node"]["rank"] == 0
    assert [unit["name"] for unit in serving["units"]] == ["localinference-vllm.container"]
    assert serving["environment"]["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert serving["environment"]["VLLM_HOST_IP"] == "127.0.0.1"
    assert serving["environment"]["GLOO_SOCKET_IFNAME"] == "lo"
    # nothing of the engine listens beyond loopback (the ingress stage judged it; here from outside)
    listening = exec_on(HOST, "ss", "-Hltn").stdout.split("\n")
    exposed = [line for line in listening if " 10.84.0.21:" in line]
    assert exposed == [], exposed


def test_preflight_sized_the_weakest_rank_by_the_least_free_of_the_two_cards():
    weakest = read_json(HOST, PREFLIGHT_RESULT)["result"]["weakest_rank"]
    assert weakest["host"] == HOST and weakest["gpu"] == 1, weakest
    assert "least free GPU 1 (2 x NVIDIA RTX PRO 6000 Blackwell Max-Q" in weakest["source"]
