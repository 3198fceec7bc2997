# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The two endpoints of one cable on a DGX Spark, and an HCA list that names one of them.

A DGX Spark's ConnectX-7 shows each QSFP port as two x4 PCIe endpoints on two
PCIe domains: ``rocep1s0f0`` (domain 0000) and ``roceP2p1s0f0`` (domain 0002)
serve the same cable, as ``rocep1s0f1``/``roceP2p1s0f1`` serve the other port.
They are one adapter (the same ``sys_image_guid`` in ``ibv_devinfo``) and their
names differ only in the ``P<domain>`` part of the kernel's RDMA name
(``tests/unit/fixtures/ibv_devinfo/dgx-spark-cx7-twins-active.txt``). NCCL
reaches the cable's bandwidth only with both in ``NCCL_IB_HCA``: one port of
two at MTU 9000 gave about 13.6 GB/s bus bandwidth where both gave 23.7, and
one at MTU 1500 about 3 (NVIDIA dgx-spark-playbooks issues 102/103).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding

# roce | P<domain> (absent for domain 0) | p<bus>s<slot>f<function>[...]
_RDMA_NAME = re.compile(r"^(?P<kind>roce|ib|rxe|mlx5_)?(?P<domain>P\d+)?(?P<rest>p\d+s\d+.*)$")


def twin_pairs(rdma: Mapping[str, Any]) -> list[list[str]]:
    """Groups (sorted, two or more) of HCAs that are endpoints of one cable."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, device in sorted((rdma.get("devices") or {}).items()):
        match = _RDMA_NAME.match(str(name))
        guid = device.get("sys_image_guid") if isinstance(device, Mapping) else None
        if not match or not guid:
            continue
        groups.setdefault((str(guid), f"{match['kind'] or ''}{match['rest']}"), []).append(name)
    pairs = [sorted(g, key=str.lower) for g in groups.values() if len(g) > 1]
    return sorted(pairs, key=lambda g: g[0].lower())


def _active(rdma: Mapping[str, Any], hca: str) -> bool:
    ports = ((rdma.get("devices") or {}).get(hca) or {}).get("ports") or {}
    return any(isinstance(p, Mapping) and p.get("state") == "PORT_ACTIVE" for p in ports.values())


def half_cable_findings(
    rdma: Mapping[str, Any], hcas: Iterable[str], host: str, source: str
) -> list[dict[str, Any]]:
    """A warning per cable whose active twin ``hcas`` leaves out (``source`` names the list)."""
    listed = list(hcas)
    out = []
    for pair in twin_pairs(rdma):
        named = [h for h in pair if h in listed]
        missing = [h for h in pair if h not in listed and _active(rdma, h)]
        if named and missing:
            out.append(
                finding(
                    "twin",
                    "warning",
                    f"{source} names {', '.join(named)} but not {', '.join(missing)}, the other endpoint"
                    " of the same cable (one adapter, PORT_ACTIVE): one port of two measured about 13.6"
                    " GB/s NCCL bus bandwidth where both reached 23.7 (about 3 at MTU 1500)",
                    f"list both endpoints: add the interface of {', '.join(missing)} (ibdev2netdev) with"
                    " its own subnet to cluster_network_interfaces, or both HCAs to cluster_network_ib_hcas",
                    host=host,
                    interface="all",
                    check="twin",
                )
            )
    return out
