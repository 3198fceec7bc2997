# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every pair of nodes on the cluster link, for clusters of 1 to 4 nodes.

The fabric stage's pings run through the real filters (``fabric_ping_targets``,
``fabric_findings``, ``fabric_publish``) on simulated clusters: each node pings
every other node over each interface with a jumbo and a 1472-byte payload, the
saved result lists what each pair answered (``result.pings``), and
``_pairs.missing_pairs`` names any ordered pair whose jumbo ping failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from ansible_collections.localinference.vllm.plugins.filter.fabric import FilterModule
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._pairs import (
    missing_pairs,
    ping_outcomes,
)

F = FilterModule().filters()
TWINS = ("enp1s0f0np0", "enP2p1s0f0np0")


def cluster(nodes: int, twins: int = 1) -> dict[str, list[dict[str, str]]]:
    """``spark-head``, ``spark-worker``, ``spark-worker2``... with one address per twin."""
    names = ["spark-head", "spark-worker"] + [f"spark-worker{i}" for i in range(2, nodes)]
    return {
        name: [{"ifname": TWINS[t], "address": f"10.77.{t}.{11 + n}/24"} for t in range(twins)]
        for n, name in enumerate(names[:nodes])
    }


def settings(interfaces: list[dict[str, str]], mtu: int = 9000) -> dict[str, Any]:
    return {
        "interfaces": interfaces,
        "mtu": mtu,
        "expected_speed_mbps": 10000,
        "connection_prefix": "localinference-",
        "rdma_required": False,
        "rdma_active_mtu": 4096,
        "rdma_sys_root": "/sys",
        "ib_hcas": [],
        "verify": True,
        "reapply_on_drift": False,
    }


Path = tuple[str, str, int]  # (from, to, payload)


def run_stage(
    peers: dict[str, list[dict[str, str]]], answers: Callable[[str, str, int], bool]
) -> dict[str, dict[str, Any]]:
    """Every node's (findings, saved result) as the role computes them; ``answers`` says
    whether a ping from a node to a peer with a payload gets its replies."""
    out = {}
    for host, interfaces in peers.items():
        cfg = settings(interfaces)
        ethtool = {
            i["ifname"]: {"link_detected": True, "speed_mbps": 10000, "mtu": 9000}
            for i in interfaces
        }
        targets = F["fabric_ping_targets"](peers, host, cfg)
        results = [
            {"item": t, "rc": 0 if answers(host, t["peer"], t["size"]) else 1, "stdout": "PING"}
            for t in targets
        ]
        findings = F["fabric_findings"](cfg, host, ethtool, {}, results, None)
        published = F["fabric_publish"](cfg, ethtool, {}, findings, results)
        out[host] = {"targets": targets, "findings": findings, "result": published["result"]}
    return out


@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
@pytest.mark.parametrize("twins", [1, 2])
def test_every_node_pings_every_other_node_both_ways(nodes, twins):
    peers = cluster(nodes, twins)
    stage = run_stage(peers, lambda src, dst, size: True)
    for host, seen in stage.items():
        pinged = {(t["peer"], t["ifname"], t["size"]) for t in seen["targets"]}
        assert pinged == {
            (peer, TWINS[t], size)
            for peer in peers
            if peer != host
            for t in range(twins)
            for size in (8972, 1472)
        }
        assert seen["findings"] == []
        assert len(seen["result"]["pings"]) == (nodes - 1) * twins
        assert all(p["jumbo"] and p["small"] for p in seen["result"]["pings"])
    saved = {host: seen["result"] for host, seen in stage.items()}
    assert missing_pairs(saved) == []
    # Ordered pairs checked: n (n - 1) per interface.
    assert sum(len(r["pings"]) for r in saved.values()) == nodes * (nodes - 1) * twins


CASES = [
    pytest.param(
        3,
        lambda src, dst, size: (
            not (src == "spark-worker2" and dst == "spark-worker" and size > 1472)
        ),
        [("spark-worker2", "F19", "spark-worker")],
        ["spark-worker2 -> spark-worker over enp1s0f0np0"],
        id="three nodes - one direction of the worker-to-worker pair drops jumbo frames (F19)",
    ),
    pytest.param(
        4,
        lambda src, dst, size: "spark-worker3" not in (src, dst) or size <= 1472,
        [
            ("spark-head", "F19", "spark-worker3"),
            ("spark-worker", "F19", "spark-worker3"),
            ("spark-worker2", "F19", "spark-worker3"),
            ("spark-worker3", "F19", "spark-head"),
            ("spark-worker3", "F19", "spark-worker"),
            ("spark-worker3", "F19", "spark-worker2"),
        ],
        [
            "spark-head -> spark-worker3 over enp1s0f0np0",
            "spark-worker -> spark-worker3 over enp1s0f0np0",
            "spark-worker2 -> spark-worker3 over enp1s0f0np0",
            "spark-worker3 -> spark-head over enp1s0f0np0",
            "spark-worker3 -> spark-worker over enp1s0f0np0",
            "spark-worker3 -> spark-worker2 over enp1s0f0np0",
        ],
        id="four nodes - the fourth node's port is at MTU 1500: every pair with it is F19",
    ),
    pytest.param(
        4,
        lambda src, dst, size: {src, dst} != {"spark-worker", "spark-worker2"},
        [
            ("spark-worker", "reachability", "spark-worker2"),
            ("spark-worker2", "reachability", "spark-worker"),
        ],
        [
            "spark-worker -> spark-worker2 over enp1s0f0np0",
            "spark-worker2 -> spark-worker over enp1s0f0np0",
        ],
        id="four nodes - two workers cannot reach each other (a head-only check would pass)",
    ),
]


@pytest.mark.parametrize(("nodes", "answers", "expected", "missing"), CASES)
def test_a_broken_pair_is_found_and_named(nodes, answers, expected, missing):
    stage = run_stage(cluster(nodes), answers)
    # (node, id, the peer the message names: "... to PEER (address)" / "from PEER (address)")
    named = [
        (host, f["id"], next(p for p in cluster(nodes) if f" {p} (" in f["message"]))
        for host, seen in stage.items()
        for f in seen["findings"]
    ]
    assert sorted(named) == sorted(expected)
    assert missing_pairs({h: s["result"] for h, s in stage.items()}) == missing


def test_outcomes_leave_out_pings_that_could_not_run_and_skipped_items():
    cfg = {"mtu": 9000}
    item = {"ifname": "enp1s0f0np0", "peer": "spark-worker", "peer_address": "10.77.0.12"}
    results = [
        {"item": {**item, "size": 8972}, "rc": 0, "stdout": "ok"},
        {"item": {**item, "size": 1472}, "rc": 0, "stdout": "ok"},
        {
            "item": {**item, "peer": "spark-worker2", "size": 8972},
            "rc": 2,
            "msg": "Error executing command.",
        },
        {"item": {**item, "peer": "spark-worker3", "size": 8972}, "skipped": True},
    ]
    assert ping_outcomes(cfg, results) == [
        {
            "peer": "spark-worker",
            "ifname": "enp1s0f0np0",
            "peer_address": "10.77.0.12",
            "jumbo": True,
            "small": True,
        }
    ]


def test_missing_pairs_with_declared_interfaces_and_no_pings():
    saved = {
        "a": {"pings": [{"peer": "b", "ifname": "x", "jumbo": True, "small": True}]},
        "b": {"pings": []},
    }
    assert missing_pairs(saved, {"a": ["x", "y"], "b": ["x"]}) == ["a -> b over y", "b -> a over x"]
    assert missing_pairs({"a": {"pings": []}}) == []  # one node: no pair
    assert missing_pairs({"a": None, "b": {}}) == [
        "a -> b over (no interface)",
        "b -> a over (no interface)",
    ]
