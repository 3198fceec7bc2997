# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fabric stage with one node: there is no cluster link to make.

A cluster of one host (one machine with two RTX PRO 6000 cards, say) keeps
every rank inside the host: tensor parallel talks over PCIe, NVLink or shared
memory, never over a cluster network. The fabric stage then configures and
verifies nothing, and says so once: its saved result (stage ``fabric``) reads
``link: "single host: no cluster link"`` with the same keys as a linked
node's result, so the rollout, the weights stage and the doctor read it like
any other.

Its ``env`` binds the ranks to loopback (``LOOPBACK_ENV``). Without it vLLM's
ranks bind where the host name resolves: measured in the one-host lab, the two
CPU ranks' gloo sockets listened on the management address (dozens of ports the
ingress stage refuses as ``engine-exposed``); NCCL's bootstrap picks the first
non-loopback interface the same way.

Pure functions, no AnsibleModule; the role calls them through the
``localinference.vllm.fabric_single_host`` filter (``plugins/filter/fabric.py``).
The multi-node judgement is ``_judge.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

SINGLE_HOST_LINK = "single host: no cluster link"
LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo"
# What every rank gets instead of a cluster link's environment (_judge.environment).
LOOPBACK_ENV = {
    "VLLM_HOST_IP": LOOPBACK,
    "NCCL_SOCKET_IFNAME": LOOPBACK_INTERFACE,
    "GLOO_SOCKET_IFNAME": LOOPBACK_INTERFACE,
}


class SingleHostInputError(validate.InputError):
    """A value the single-host verdict cannot use; the message names it."""


def _names(value: Any, what: str) -> list[str]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise SingleHostInputError(f"{what} must be a list of host names, got {value!r}")
    names = [str(name) for name in value]
    if any(not name for name in names):
        raise SingleHostInputError(f"{what} holds an empty host name: {value!r}")
    return names


def is_single_host(nodes: Any) -> bool:
    """True when the cluster (``groups['vllm_cluster']``) holds exactly one host."""
    return len(set(_names(nodes, "the cluster's nodes"))) == 1


def _listed_interfaces(interfaces: Any) -> list[str]:
    """The ``ifname`` of each entry of ``cluster_network_interfaces`` (left untouched here)."""
    if interfaces in (None, ""):
        return []
    if not isinstance(interfaces, Sequence) or isinstance(interfaces, str):
        raise SingleHostInputError(
            f"cluster_network_interfaces must be a list of {{ifname, address}}, got {interfaces!r}"
        )
    return [
        str(entry.get("ifname")) if isinstance(entry, Mapping) else str(entry)
        for entry in interfaces
    ]


def single_host(host: str, nodes: Any, interfaces: Any = None) -> dict[str, Any]:
    """``{inputs, result, message}`` of the fabric stage on the only node of the cluster.

    ``result`` has every key of a linked node's result (``_judge.publish``):
    the ranks' environment binds them to loopback (``LOOPBACK_ENV``; the primary
    address is ``127.0.0.1`` on ``lo``), no HCA, no findings, ``verified`` false
    (nothing was checked), plus ``single_host``, ``nodes`` and ``link``.
    Interfaces listed in ``cluster_network_interfaces`` are named and left
    untouched: they matter once a second node joins.
    """
    cluster = _names(nodes, "the cluster's nodes")
    if not isinstance(host, str) or not host:
        raise SingleHostInputError(f"the host must be a name, got {host!r}")
    if set(cluster) != {host}:
        raise SingleHostInputError(
            f"{host} is not the only node of vllm_cluster ({', '.join(cluster) or 'empty'});"
            " a cluster of several nodes needs the cluster link (cluster_network_interfaces)"
        )
    listed = _listed_interfaces(interfaces)
    message = (
        f"{SINGLE_HOST_LINK}: {host} is the only node of vllm_cluster, so its ranks talk inside"
        " the host over loopback; the fabric stage configured and verified nothing"
    )
    if listed:
        message += (
            f" (cluster_network_interfaces {', '.join(listed)} left untouched until a second"
            " node joins)"
        )
    result = {
        "single_host": True,
        "link": SINGLE_HOST_LINK,
        "nodes": [host],
        "env": dict(LOOPBACK_ENV),
        "primary_ip": LOOPBACK,
        "primary_interface": LOOPBACK_INTERFACE,
        "ib_hcas": [],
        "twins": [],
        "gid_index": None,
        "interfaces": [],
        "findings": [],
        "verified": False,
        "message": message,
    }
    return {"inputs": {"single_host": True, "nodes": [host]}, "result": result, "message": message}
