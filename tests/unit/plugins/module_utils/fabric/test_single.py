# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fabric stage on the only node of the cluster, from case tables.

``test_single.yaml`` holds the cases (host, the cluster's nodes,
``cluster_network_interfaces`` -> saved result and message, or the error). The
result must carry every key a linked node's result carries (``_judge.publish``
on recorded facts), so every reader of ``fabric.json`` reads both. The last test
runs the role itself (``playbooks/fabric.yml --check``) on a one-host inventory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.fabric import FilterModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    canonical_json,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import _judge
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._single import (
    SINGLE_HOST_LINK,
    is_single_host,
    single_host,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[4]
CASES = yaml.safe_load((HERE / "test_single.yaml").read_text())
FABRIC_CASES = yaml.safe_load((HERE / "test_judge.yaml").read_text())
RECORDED = yaml.safe_load((HERE / "recorded_facts.yaml").read_text())
F = FilterModule().filters()


def _ids(table: str) -> list[str]:
    return [case["name"] for case in CASES[table]]


def _linked_result() -> dict[str, Any]:
    """A linked node's result, as _judge.publish makes it from recorded facts."""
    cfg = _judge.config(FABRIC_CASES["configs"]["lab_head"])
    ethtool = {"enp1s0f0np0": RECORDED["ethtool"]["veth_9000"]}
    return _judge.publish(cfg, ethtool, RECORDED["rdma"]["absent"], [])["result"]


@pytest.mark.parametrize("case", CASES["single_host"], ids=_ids("single_host"))
def test_single_host(case):
    verdict = F["fabric_single_host"](case["host"], case["nodes"], case.get("interfaces"))
    assert verdict["message"] == case["message"]
    result = verdict["result"]
    assert result["link"] == SINGLE_HOST_LINK == "single host: no cluster link"
    assert result["message"].startswith(SINGLE_HOST_LINK)
    assert result["single_host"] is True
    assert result["nodes"] == [case["host"]]
    # the ranks bound to loopback, nothing checked, nothing wrong
    assert result["env"] == {
        "VLLM_HOST_IP": "127.0.0.1",
        "NCCL_SOCKET_IFNAME": "lo",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    assert (result["primary_ip"], result["primary_interface"]) == ("127.0.0.1", "lo")
    assert result["interfaces"] == [] and result["ib_hcas"] == [] and result["gid_index"] is None
    assert result["findings"] == [] and result["verified"] is False
    assert verdict["inputs"] == {"single_host": True, "nodes": [case["host"]]}
    # stage_result stores it as canonical JSON: it must serialise
    assert canonical_json(result)


def test_single_host_result_has_every_key_of_a_linked_result():
    single = single_host("rtx-host", ["rtx-host"])["result"]
    assert set(_linked_result()) <= set(single)
    assert set(single) - set(_linked_result()) == {"single_host", "link", "nodes", "message"}


@pytest.mark.parametrize("case", CASES["errors"], ids=_ids("errors"))
def test_errors_name_the_input(case):
    with pytest.raises(AnsibleFilterError) as caught:
        F["fabric_single_host"](case["host"], case["nodes"], case.get("interfaces"))
    assert str(caught.value) == f"fabric_single_host: {case['error']}"


@pytest.mark.parametrize("case", CASES["is_single_host"], ids=lambda c: str(c["nodes"]))
def test_is_single_host(case):
    assert is_single_host(case["nodes"]) is case["single"]
