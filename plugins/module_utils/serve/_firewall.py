# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The internal ports of the stack, confined to loopback and the cluster's addresses.

PyTorch's TCPStore (the TP ranks' rendezvous, ``master_port``, 29501) binds every
address of the head whatever MASTER_ADDR says, and Ray's head binds its GCS and
client ports the same way: nothing but a firewall narrows them. The serve role
gives every node an nftables table of its own (``table inet localinference``)
whose input chain lets loopback and the cluster's addresses reach these ports and
answers everyone else with a TCP reset. Nothing else is filtered: the table's
chain accepts every other packet, and another table's drop still applies.

- ``internal_ports``: the ports of one node, derived from the normalised recipe.
- ``ruleset``: the validated data the rules file is rendered from (the serve
  role's ``firewall.nft.j2``); every string that reaches the file passed a check
  here first (addresses, networks, ports, interface names).
- ``confined_ports``: the ports the live table confines, from ``nft -j list table
  inet localinference`` (the ingress's exposure audit and the doctor read them).

Pure functions: no AnsibleModule, unit-tested on their own.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
    integer,
    interface_name,
    port,
)

TABLE = "localinference"
PORTS_SET = "internal_ports"
STORE_PORT = 29501
# Ray's head: the client server (ray start --ray-client-server-port) and the
# dashboard; the GCS is the recipe's ray_port.
RAY_CLIENT_PORT = 10001
RAY_DASHBOARD_PORT = 8265
# nft quotes interface names; keep to what an interface is called in practice,
# so no quote or backslash can end the string.
_NFT_IFNAME = re.compile(r"[A-Za-z0-9_.@+-]+")
_LOOPBACK_HOSTS = ("localhost",)


def _loopback(host: str) -> bool:
    if host in _LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def internal_ports(
    recipe: dict[str, Any], rank: Any, nnodes: Any, behind_ingress: bool = False
) -> list[dict[str, Any]]:
    """``[{port, what}]`` a node must confine, sorted by port.

    - the head's torch store (``master_port``, mp across nodes);
    - the Ray head's GCS (``ray_port``), client server and dashboard (ray across nodes);
    - vLLM's API where the node runs a server, the recipe's ``host`` is not loopback
      and the ingress fronts it (without the ingress the API is the endpoint itself).
    """
    rank = integer("rank", rank, minimum=0)
    nnodes = integer("nnodes", nnodes, minimum=1)
    backend = recipe.get("executor_backend", "mp")
    ports: dict[int, str] = {}
    if rank == 0 and nnodes > 1 and backend == "ray":
        gcs = port("vllm_recipe.ray_port", recipe.get("ray_port", 6379))
        ports[gcs] = "Ray's GCS (ray_port)"
        ports.setdefault(RAY_CLIENT_PORT, "Ray's client server")
        ports.setdefault(RAY_DASHBOARD_PORT, "Ray's dashboard")
    elif rank == 0 and nnodes > 1:
        store = port("vllm_recipe.master_port", recipe.get("master_port") or STORE_PORT)
        ports[store] = "torch's distributed store of the TP ranks (master_port)"
    host = str(recipe.get("host", "0.0.0.0"))
    if behind_ingress and rank == 0 and not _loopback(host):
        api = port("vllm_recipe.port", recipe.get("port", 8000))
        ports.setdefault(api, f"vLLM's API (host {host}, behind the ingress)")
    return [{"port": p, "what": ports[p]} for p in sorted(ports)]


def _network(name: str, value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(
            name,
            f"expected an address or a network, got {value!r}",
            "give an IP address such as 10.77.0.12 or a network such as 10.77.0.0/24",
        )
    try:
        return ipaddress.ip_network(value.strip(), strict=True)
    except ValueError as exc:
        raise ValidationError(
            name,
            f"{value!r} is not an IP address or network ({exc})",
            "give an IP address such as 10.77.0.12 or a network such as 10.77.0.0/24 "
            "(host bits zero); host names are not resolved",
        ) from None


def _element(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    full = net.prefixlen == net.max_prefixlen
    return str(net.network_address) if full else str(net)


def _interface(name: str, value: Any) -> str:
    value = interface_name(name, value)
    if not _NFT_IFNAME.fullmatch(value):
        raise ValidationError(
            name,
            f"{value!r} has a character the rules file cannot carry",
            "use the interface's name of letters, digits and _ . @ + - (`ip -o link`)",
        )
    return value


def ruleset(spec: dict[str, Any]) -> dict[str, Any]:
    """The validated content of the rules file: ``{table, ports, ipv4, ipv6, interfaces, state}``.

    ``spec``: ``ports`` (``internal_ports``' list, or plain numbers), ``nodes``
    (every node's cluster address by inventory name: all must be known once a port
    is confined, or a peer would be refused), ``sources`` (networks or addresses the
    operator adds) and ``interfaces`` (empty: the cluster's addresses are accepted on
    every interface). ``state`` is ``absent`` when the node has no port to confine.
    """
    if not isinstance(spec, dict):
        raise ValidationError(
            "serve firewall", f"expected a mapping, got {type(spec).__name__}", ""
        )
    for key in ("ports", "sources", "interfaces"):
        if not isinstance(spec.get(key, []), list):
            raise ValidationError(
                f"serve firewall {key}", f"expected a list, got {spec.get(key)!r}", "give a list"
            )
    nodes = spec.get("nodes", {})
    if not isinstance(nodes, dict):
        raise ValidationError(
            "serve firewall nodes", f"expected a mapping, got {nodes!r}", "give {host: address}"
        )
    confining = bool(spec.get("ports"))
    node_nets = []
    for host, address in sorted(nodes.items(), key=lambda item: str(item[0])):
        if not address and not confining:
            continue
        if not address:
            raise ValidationError(
                f"the cluster address of {host}",
                "is not known in this run, so the firewall would refuse it",
                "run the rollout on every node of the cluster (no --limit), after the fabric "
                "stage (--tags fabric,rollout), or set serve_cluster_address",
            )
        node_nets.append(
            _network(f"the cluster address of {host} (serve_cluster_address)", address)
        )
    ports = sorted(
        {
            port(f"serve firewall ports[{i}]", item.get("port") if isinstance(item, dict) else item)
            for i, item in enumerate(spec.get("ports", []))
        }
    )
    nets = node_nets + [
        _network(f"serve_firewall_allowed[{i}]", v) for i, v in enumerate(spec.get("sources", []))
    ]
    nets = list(ipaddress.collapse_addresses([n for n in nets if n.version == 4])) + list(
        ipaddress.collapse_addresses([n for n in nets if n.version == 6])
    )
    interfaces = sorted(
        {
            _interface(f"serve_firewall_interfaces[{i}]", v)
            for i, v in enumerate(spec.get("interfaces", []))
        }
    )
    return {
        "state": "present" if ports else "absent",
        "table": TABLE,
        "ports_set": PORTS_SET,
        "ports": ports,
        "ipv4": [_element(n) for n in nets if n.version == 4],
        "ipv6": [_element(n) for n in nets if n.version == 6],
        "interfaces": interfaces,
    }


def _port_elements(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value] if 0 < value < 65536 else []
    if isinstance(value, dict):
        if "range" in value and isinstance(value["range"], list) and len(value["range"]) == 2:
            low, high = value["range"]
            if isinstance(low, int) and isinstance(high, int) and 0 < low <= high < 65536:
                return list(range(low, high + 1)) if high - low < 65536 else []
        if "elem" in value:
            return _port_elements(
                value["elem"].get("val") if isinstance(value["elem"], dict) else None
            )
    return []


def confined_ports(text: Any) -> list[int]:
    """The ports of the live table's ``internal_ports`` set (``nft -j list table inet localinference``).

    Text that is not nft's JSON (no table: nft's error, an empty output) confines nothing.
    """
    try:
        document = json.loads(text) if isinstance(text, (str, bytes)) else text
    except ValueError:
        return []
    items = document.get("nftables") if isinstance(document, dict) else None
    ports: set[int] = set()
    for item in items if isinstance(items, list) else []:
        nft_set = item.get("set") if isinstance(item, dict) else None
        if not isinstance(nft_set, dict) or nft_set.get("table") != TABLE:
            continue
        if nft_set.get("name") != PORTS_SET or nft_set.get("family") != "inet":
            continue
        elements = nft_set.get("elem", [])
        for element in elements if isinstance(elements, list) else [elements]:
            ports.update(_port_elements(element))
    return sorted(ports)
