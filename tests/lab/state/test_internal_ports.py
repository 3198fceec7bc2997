# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stack's internal ports in the converged lab, probed from outside. Read-only.

The head's torch store still binds every address (PyTorch's TCPStore), but the
serve role's nftables table (``table inet localinference``, loaded by
localinference-firewall.service) lets only loopback and the cluster's addresses
reach it: the controller, a third address on the management network, is
refused; so is the worker from its management address; the worker's cluster
address connects. The ingress's exposure audit, which the doctor reads, no
longer warns about the store. A few seconds in all.
"""

from __future__ import annotations

import socket

import pytest

from lab.harness import CLUSTER_ADDRESSES, HEAD, STATE_DIR, WORKER, exec_on, module_utils, read_json

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

STORE_PORT = 29501
# The lab's management network (molecule/default/vars.yml); the controller is 10.76.0.1 on it.
MGMT_ADDRESSES = {HEAD: "10.76.0.11", WORKER: "10.76.0.12"}
UNIT = "localinference-firewall.service"
RULES = f"{STATE_DIR}/firewall.nft"

CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()\n"
    "    print('connected')\n"
    "except OSError as err:\n"
    "    print(type(err).__name__)\n"
)


def connect_from(host: str, address: str, port: int) -> str:
    """``connected`` or the error's name, from ``host``'s own network namespace."""
    return exec_on(host, "python3", "-c", CONNECT, address, str(port)).stdout.strip()


def test_the_store_still_binds_every_address_of_the_head():
    """The reason for the table: the listener itself cannot be narrowed."""
    sockets = module_utils("ingress._caddy").parse_listening(exec_on(HEAD, "ss", "-Hltnp").stdout)
    store = {s["address"] for s in sockets if s["port"] == STORE_PORT}
    assert store & {"*", "0.0.0.0", "::"}, store


def test_the_table_is_loaded_by_its_unit_and_confines_the_store():
    assert exec_on(HEAD, "systemctl", "is-active", UNIT).stdout.strip() == "active"
    assert exec_on(HEAD, "systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"
    live = exec_on(HEAD, "nft", "-j", "list", "table", "inet", "localinference").stdout
    assert module_utils("serve._firewall").confined_ports(live) == [STORE_PORT]
    rules = exec_on(HEAD, "cat", RULES).stdout
    assert f"elements = {{ {CLUSTER_ADDRESSES[HEAD]}, {CLUSTER_ADDRESSES[WORKER]} }}" in rules
    # The worker runs no store (a headless rank): no table, no unit.
    assert exec_on(WORKER, "test", "-e", RULES, check=False).returncode != 0


def test_an_address_outside_the_cluster_is_refused():
    """The controller (10.76.0.1) probes the head's management address: a reset, at once."""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((MGMT_ADDRESSES[HEAD], STORE_PORT), timeout=5).close()
    # Only the internal ports are confined: sshd on the same address still answers.
    socket.create_connection((MGMT_ADDRESSES[HEAD], 22), timeout=5).close()


def test_the_worker_connects_from_its_cluster_address_only():
    assert connect_from(WORKER, CLUSTER_ADDRESSES[HEAD], STORE_PORT) == "connected"
    # The same worker through the management network is outside the cluster's addresses.
    assert connect_from(WORKER, MGMT_ADDRESSES[HEAD], STORE_PORT) == "ConnectionRefusedError"
    # Loopback on the head itself.
    assert connect_from(HEAD, "127.0.0.1", STORE_PORT) == "connected"


def test_the_doctor_no_longer_warns_about_the_store():
    """The exposure audit the doctor reads (ingress.json) passes for the confined store."""
    exposure = read_json(HEAD, f"{STATE_DIR}/ingress.json")["result"]["exposure"]
    assert [f for f in exposure if f["id"] == "torch-store-wildcard"] == [], exposure
