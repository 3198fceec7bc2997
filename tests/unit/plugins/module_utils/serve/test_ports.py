# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _ports
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit

# /proc/net/tcp and tcp6 as a Debian 12 kernel prints them (header + LISTEN + ESTABLISHED).
TCP = "\n".join(
    [
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
        "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41213 1"
        " 0000000000000000 100 0 0 10 0",
        "   1: 00000000:7339 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41299 1"
        " 0000000000000000 100 0 0 10 0",
        "   2: 0100007F:1F40 0100007F:B5F2 01 00000000:00000000 00:00000000 00000000     0        0 51210 1"
        " 0000000000000000 20 4 30 10 -1",
        "   3: garbage",
    ]
)
TCP6 = "\n".join(
    [
        "  sl  local_address                         remote_address                        st tx_queue"
        " rx_queue tr tm->when retrnsmt   uid  timeout inode",
        "   0: 00000000000000000000000001000000:1F40 00000000000000000000000000000000:0000 0A"
        " 00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 100 0 0 10 0",
    ]
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (TCP, [(8000, "127.0.0.1", 41213), (29497, "0.0.0.0", 41299)]),
        (TCP6, [(8000, "0000:0000:0000:0000:0000:0000:0000:0001", 77)]),
        ("", []),
        ("header only\n", []),
    ],
)
def test_parse_proc_net_tcp(text, expected):
    assert _ports.parse_proc_net_tcp(text) == expected


CASES = [
    ("ours through the Quadlet payload cgroup", "0::/system.slice/localinference-vllm.service/libpod-payload-ab12", []),
    ("a stray python server", "0::/user.slice/session-3.scope", [8000]),
    ("a unit whose name merely contains ours", "0::/system.slice/notlocalinference-vllm.service.d", [8000]),
    ("a drop-in directory of the same name", "0::/system.slice/localinference-vllm.service.d", [8000]),
    ("a process /proc does not show", "", [8000]),
]


@pytest.mark.parametrize(("case", "cgroup", "foreign_ports"), CASES, ids=[c[0] for c in CASES])
def test_foreign(case, cgroup, foreign_ports):
    found = [_ports.Listener(8000, "127.0.0.1", 1, 42 if cgroup else None, "python3 -m http.server", cgroup)]
    assert [item.port for item in _ports.foreign(found, ["localinference-vllm.service"])] == foreign_ports


def test_describe_names_the_process():
    item = _ports.Listener(8000, "0.0.0.0", 1, 4242, "python3 -m http.server 8000", "0::/user.slice")
    assert _ports.describe(item) == "port 8000 on 0.0.0.0 is held by pid 4242 (python3 -m http.server 8000)"


def test_a_real_listener_is_found_with_its_process():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        found = _ports.listeners([port])
    assert [(f.port, f.address, f.pid) for f in found] == [(port, "127.0.0.1", os.getpid())]
    assert "pytest" in found[0].command or "python" in found[0].command


def test_a_listener_of_another_process(tmp_path: Path):
    child = subprocess.Popen(
        [sys.executable, "-c", "import socket,time;s=socket.socket();s.bind(('127.0.0.1',0));s.listen();"
         "print(s.getsockname()[1],flush=True);time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        port = int(child.stdout.readline())
        deadline = time.monotonic() + 5
        while not (found := _ports.listeners([port])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [f.pid for f in found] == [child.pid]
        assert _ports.foreign(found, ["localinference-vllm.service"]) == found
    finally:
        child.kill()
        child.wait()


def test_port_listeners_refuses_a_foreign_listener_with_what_it_found():
    # port_listeners' one call (_ports.run): a bad port, then a port held by this test's process
    with pytest.raises(ModuleExit) as caught:
        _ports.run(FakeModule({"ports": [0, 8000], "units": [], "fail_on_foreign": True}))
    assert caught.value.result["msg"] == "ports: [0] are not TCP ports (1-65535)"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        params = {"ports": [port], "units": ["localinference-vllm.service"], "fail_on_foreign": True}
        with pytest.raises(ModuleExit) as caught:
            _ports.run(FakeModule(params))
        reported = _ports.run(FakeModule({**params, "fail_on_foreign": False}))
    assert caught.value.result["msg"].startswith(f"port {port} on 127.0.0.1 is held by pid {os.getpid()}")
    assert [item["port"] for item in caught.value.result["foreign"]] == [port]
    assert reported["changed"] is False and reported["foreign"] == reported["listeners"]
