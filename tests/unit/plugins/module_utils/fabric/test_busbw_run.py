# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The commands of the collective bandwidth gate, and the filters that wire it.

The exact argv each node runs (nccl: the head's mpirun, nothing on the others;
gloo: one rank per node, in the engine's image or on the node), every one under
``timeout``; bad settings named; rank 0's registered result judged (a deadline,
a failed run, a stand-in table).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.fabric import FilterModule
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._busbw import (
    parse_all_reduce,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._busbw_run import (
    GLOO_PROGRAM,
)

HERE = Path(__file__).resolve().parent
F = FilterModule().filters()
NODES = ["spark-a", "spark-b"]
ADDRESSES = {"spark-a": "192.168.100.10", "spark-b": "192.168.100.11"}
ENV = {
    "VLLM_HOST_IP": "192.168.100.10",
    "NCCL_SOCKET_IFNAME": "enp1s0f0np0",
    "GLOO_SOCKET_IFNAME": "enp1s0f0np0",
    "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0",
    "NCCL_IB_GID_INDEX": "3",
}
NCCL = {
    "backend": "nccl",
    "sizes": [4294967296, 1073741824],
    "iters": 20,
    "warmup": 5,
    "timeout": 180,
    "port": 29599,
    "nccl_tests": "/opt/nccl-tests/build/all_reduce_perf",
    "python": "/opt/vllm/bin/python",
    "image": "",
    "min_gbps": None,
    "enabled": True,
}
GLOO = {
    **NCCL,
    "backend": "gloo",
    "sizes": [262144, 4194304],
    "iters": 5,
    "warmup": 2,
    "timeout": 90,
    "image": "localhost/vllm@sha256:abc",
    "min_gbps": 0.02,
}
SETTINGS = yaml.safe_load((HERE / "test_judge.yaml").read_text())["configs"]["lab_head"]


def test_nccl_runs_on_the_head_only_with_the_units_nccl_variables():
    head = F["fabric_busbw_command"](NCCL, "spark-a", NODES, ADDRESSES, "enp1s0f0np0", ENV)
    assert head == [
        "timeout", "-k", "5", "180",
        "mpirun", "--allow-run-as-root", "-np", "2", "-H", "192.168.100.10:1,192.168.100.11:1",
        "--mca", "btl_tcp_if_include", "enp1s0f0np0",
        "-x", "NCCL_IB_GID_INDEX=3", "-x", "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0",
        "-x", "NCCL_SOCKET_IFNAME=enp1s0f0np0",
        "/opt/nccl-tests/build/all_reduce_perf", "-b", "1073741824", "-e", "4294967296",
        "-f", "2", "-g", "1", "-n", "20", "-w", "5",
    ]  # fmt: skip
    assert F["fabric_busbw_command"](NCCL, "spark-b", NODES, ADDRESSES, "enp1s0f0np0", ENV) == []


@pytest.mark.parametrize(("host", "rank"), [("spark-a", "0"), ("spark-b", "1")])
def test_gloo_runs_a_rank_per_node_in_the_image(host, rank):
    argv = F["fabric_busbw_command"](GLOO, host, NODES, ADDRESSES, "enp1s0f0np0", ENV)
    assert argv[:16] == [
        "timeout", "-k", "5", "90", "podman", "run", "--rm", "--network=host", "--pull=never",
        "-e", "GLOO_SOCKET_IFNAME=enp1s0f0np0", "--entrypoint", "/opt/vllm/bin/python",
        "localhost/vllm@sha256:abc", "-c", GLOO_PROGRAM,
    ]  # fmt: skip
    assert argv[16:] == [
        "--rank", rank, "--world", "2", "--master", "192.168.100.10", "--port", "29599",
        "--sizes", "262144", "4194304", "--iters", "5", "--warmup", "2", "--timeout", "90",
    ]  # fmt: skip


def test_gloo_without_an_image_runs_the_nodes_python():
    argv = F["fabric_busbw_command"]({**GLOO, "image": ""}, "spark-b", NODES, ADDRESSES, "eth1")
    assert argv[:8] == ["timeout", "-k", "5", "90", "env", "GLOO_SOCKET_IFNAME=eth1",
                        "/opt/vllm/bin/python", "-c"]  # fmt: skip


@pytest.mark.parametrize(
    ("busbw", "nodes"),
    [({**GLOO, "enabled": False}, NODES), (GLOO, ["spark-a"]), (GLOO, ["spark-b", "other"])],
    ids=["gate off", "one node", "not a rank"],
)
def test_nothing_to_run(busbw, nodes):
    assert F["fabric_busbw_command"](busbw, "spark-a", nodes, ADDRESSES, "eth1") == []


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"sizes": []}, "cluster_network_busbw_sizes must list message sizes"),
        ({"sizes": ["big"]}, "cluster_network_busbw_sizes must hold integers"),
        ({"sizes": [2]}, "4 bytes or more"),
        ({"min_gbps": 0}, "cluster_network_min_busbw_gbps must be a positive number"),
        ({"min_gbps": "fast"}, "cluster_network_min_busbw_gbps must be a positive number"),
        ({"min_gbps": True}, "cluster_network_min_busbw_gbps must be a positive number"),
        ({"backend": "mpi"}, "cluster_network_busbw_backend must be one of"),
    ],
)
def test_bad_settings_are_named(change, words):
    with pytest.raises(AnsibleFilterError, match=words):
        F["fabric_busbw_command"]({**GLOO, **change}, "spark-a", NODES, ADDRESSES, "eth1")


STAND_IN_TABLE = """# CPU stand-in: torch.distributed gloo over enp1s0f0np0
# nThread 1 nGpus 0 minBytes 65536 maxBytes 4194304 warmup iters: 2 iters: 5 validation: 1
#       size         count      type   redop    root     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)
       65536         16384     float     sum      -1   10679.2   0.006   0.006       0
     1048576        262144     float     sum      -1   22508.7   0.047   0.047       0
     4194304       1048576     float     sum      -1   13069.5   0.321   0.321       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.12455
"""


def _judge(run, busbw=GLOO, why_not=""):
    return F["fabric_busbw_judge"](run, busbw, SETTINGS, "spark-a", {}, ENV, why_not)


def test_the_stand_in_run_of_the_lab_passes_and_says_so():
    # the head's output of the first lab run (tests/lab/faults/test_fabric_faults.py measures it live)
    verdict = _judge({"rc": 0, "stdout": STAND_IN_TABLE, "stderr": ""})
    assert verdict["findings"] == []
    result = verdict["result"]
    assert (result["verdict"], result["busbw_gbps"], result["size_bytes"]) == (
        "pass",
        0.321,
        4194304,
    )
    assert result["stand_in"] is True and result["backend"] == "gloo (CPU stand-in)"
    assert "CPU stand-in" in result["note"]


def test_a_deadline_is_a_blocking_finding():
    verdict = _judge({"rc": 124, "stdout": "", "stderr": ""})
    assert verdict["result"]["verdict"] == "failed"
    assert "deadline of 90 s" in verdict["findings"][0]["message"]


def test_a_failed_command_names_its_last_error_line():
    run = {"rc": 125, "stdout": "", "stderr": "Error: localhost/vllm: image not known"}
    verdict = _judge(run)
    assert verdict["findings"][0]["severity"] == "error"
    assert "image not known" in verdict["findings"][0]["message"]


def test_not_run_says_why_and_blocks_nothing():
    verdict = _judge({"skipped": True}, why_not="the link checks of a node failed (see the table)")
    assert verdict["findings"] == []
    assert verdict["result"]["verdict"] == "not_run"
    assert verdict["result"]["note"] == "the link checks of a node failed (see the table)"


def test_the_gloo_program_prints_a_table_the_parser_reads():
    """The stand-in's own output, when torch is here (the lab image has it; the unit venv may not)."""
    pytest.importorskip("torch.distributed")
    done = subprocess.run(
        [sys.executable, "-c", GLOO_PROGRAM, "--rank", "0", "--world", "1", "--master", "127.0.0.1",
         "--port", "29598", "--sizes", "1024", "65536", "--iters", "2", "--warmup", "1",
         "--timeout", "30"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    parsed = parse_all_reduce(done.stdout)
    assert parsed["stand_in"] is True
    assert parsed["size_bytes"] == 65536
    assert parsed["complete"] is True
