# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fabric stage against the real lab: NetworkManager, veth at MTU 9000, real
jumbo pings; RDMA from the stand-ins (lab/standins).

1. A clean run passes and a second run changes nothing (community.general.nmcli
   MTU idempotence).
2. F19: the worker's cluster MTU is set to 1500 behind the collection's back
   (``ip link set``); the fabric run fails with "1472 passes while 8972 fails".
   Afterwards the profile is re-activated and a run passes again.
3. The collective bandwidth gate: the clean run saves the gloo stand-in's
   figure (verdict pass); a gate far above what the veth carries makes the
   stage refuse with the measured figure and the gate, saved as ``below``.
4. F20: the worker's RoCE v2 GID for its address moves from index 3 to 7; the
   run passes and publishes NCCL_IB_GID_INDEX 7 for the worker, 3 for the head,
   and the worker's saved fabric.json says 7 (3 again after the restoring run).
"""

from __future__ import annotations

import json

import pytest

from lab.harness import (
    CLUSTER_ADDRESSES,
    CLUSTER_IF,
    CLUSTER_PROFILE,
    FABRIC_RESULT,
    HEAD,
    HOSTS,
    STANDINS,
    WORKER,
    PlaybookRun,
    exec_on,
    read_json,
    run_playbook,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

F19 = "1472 passes while 8972 fails"


def fabric() -> PlaybookRun:
    return run_playbook("fabric.yml", timeout=600)


def mtu(host: str) -> int:
    return json.loads(exec_on(host, "ip", "-j", "link", "show", "dev", CLUSTER_IF).stdout)[0]["mtu"]


def nmcli_field(host: str, field: str) -> str:
    return exec_on(host, "nmcli", "-g", field, "connection", "show", CLUSTER_PROFILE).stdout.strip()


def test_clean_run_is_idempotent():
    first = fabric()
    assert first.rc == 0, first.tail()
    # the collective bandwidth gate: gloo over the veth (the CPU stand-in), saved on every node
    for host in HOSTS:
        collective = read_json(host, FABRIC_RESULT)["result"]["collective"]
        assert collective["verdict"] == "pass", collective
        assert collective["stand_in"] is True and "CPU stand-in" in collective["note"], collective
        assert collective["busbw_gbps"] >= collective["min_busbw_gbps"] == 0.02, collective
        assert collective["size_bytes"] == 4194304 and collective["rank0"] == HEAD, collective
    second = fabric()
    assert second.rc == 0, second.tail()
    counts = second.recap
    assert counts[HEAD]["changed"] == 0 and counts[WORKER]["changed"] == 0, second.tail()
    # seen from outside: NetworkManager owns the link at MTU 9000 on both ends
    for host in HOSTS:
        assert nmcli_field(host, "802-3-ethernet.mtu") == "9000"
        assert nmcli_field(host, "ipv4.never-default") == "yes"
        assert mtu(host) == 9000


def test_f19_mtu_changed_behind_the_collections_back():
    exec_on(WORKER, "ip", "link", "set", "dev", CLUSTER_IF, "mtu", "1500")
    try:
        result = fabric()
        assert result.rc != 0
        assert F19 in result.stdout, result.tail()
        assert "running MTU 1500, expected 9000" in result.stdout
        # the role reported the drift and did not hide it by re-applying
        assert mtu(WORKER) == 1500
    finally:
        exec_on(WORKER, "nmcli", "connection", "up", CLUSTER_PROFILE)
    assert mtu(WORKER) == 9000
    again = fabric()
    assert again.rc == 0, again.tail()


def test_busbw_gate_refuses_a_link_below_it():
    # the same measurement (a few seconds of traffic) judged against a gate no veth reaches
    result = run_playbook("fabric.yml", extra_vars={"cluster_network_min_busbw_gbps": 1000}, timeout=600)
    assert result.rc != 0, result.tail()
    said = " ".join(result.stdout.split())  # the report's lines as one, however the callback wraps them
    assert "is below the gate of 1000 GB/s" in said, result.tail()
    assert "gloo (CPU stand-in) bus bandwidth" in said
    saved = read_json(HEAD, FABRIC_RESULT)["result"]["collective"]
    assert saved["verdict"] == "below" and saved["min_busbw_gbps"] == 1000, saved
    # the saved errors are what a later stage refuses (the rollout reads fabric.json)
    errors = [f for f in read_json(HEAD, FABRIC_RESULT)["result"]["findings"] if f["severity"] == "error"]
    assert [f["id"] for f in errors] == ["busbw"], errors
    assert f"{saved['busbw_gbps']:g} GB/s" in said
    # a run with the profile's gate passes again (and leaves a clean saved result)
    again = fabric()
    assert again.rc == 0, again.tail()
    assert read_json(WORKER, FABRIC_RESULT)["result"]["collective"]["verdict"] == "pass"


def test_f20_gid_index_differs_per_node():
    tree = [
        f"{STANDINS}/bin/make-rdma-sysfs",
        "--root",
        f"{STANDINS}/sys",
        "--port",
        f"rocep1s0f0={CLUSTER_IF}={CLUSTER_ADDRESSES[WORKER]}",
        "--port",
        "roceP2p1s0f0=enP2p1s0f0np0",
    ]
    exec_on(WORKER, *tree, "--ipv4-first-index", "6")
    try:
        result = fabric()
        assert result.rc == 0, result.tail()
        env_lines = result.stdout.replace("''", "'").replace("\n        ", " ")
        assert f"spark-worker: {{'VLLM_HOST_IP': '{CLUSTER_ADDRESSES[WORKER]}'" in env_lines
        assert "'NCCL_IB_GID_INDEX': '7'" in env_lines.split("spark-worker: {")[1].split("}")[0]
        assert "'NCCL_IB_GID_INDEX': '3'" in env_lines.split("spark-head: {")[1].split("}")[0]
        # the saved result (what --tags rollout reads) carries the node's own index
        assert read_json(WORKER, FABRIC_RESULT)["result"]["env"]["NCCL_IB_GID_INDEX"] == "7"
    finally:
        exec_on(WORKER, *tree)
    # re-run so the saved result is not left with the moved index
    again = fabric()
    assert again.rc == 0, again.tail()
    assert read_json(WORKER, FABRIC_RESULT)["result"]["gid_index"] == 3
