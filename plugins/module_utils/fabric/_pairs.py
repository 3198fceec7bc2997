# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every pair of nodes answered on the cluster link, for the saved fabric result.

Each node pings every other node over each cluster interface with a jumbo and a
classic payload (``_judge.ping_targets``); ``_judge.ping_findings`` judges the
outcomes. This keeps them: one record per (peer, interface) in the node's
``fabric.json`` (``result.pings``), so a cluster of any size can be checked pair
by pair afterwards (:func:`missing_pairs`), also by a later run or a test.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.fabric._judge import (
    _not_run,
    payloads,
)


def ping_outcomes(
    cfg: Mapping[str, Any], results: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``{peer, ifname, peer_address, jumbo, small}`` per pair this node pinged, sorted.

    ``jumbo``/``small`` are True when the MTU-sized / 1500-byte ping with the
    don't-fragment bit got its replies. Pings that could not run at all are left
    out (``ping_findings`` reports them).
    """
    jumbo, small = payloads(cfg["mtu"])
    outcomes: dict[tuple[str, str, str], dict[int, bool]] = {}
    for result in results:
        item = result.get("item")
        if result.get("skipped") or not isinstance(item, Mapping) or _not_run(result):
            continue
        key = (str(item["peer"]), str(item["ifname"]), str(item["peer_address"]))
        outcomes.setdefault(key, {})[int(item["size"])] = result["rc"] == 0
    return [
        {
            "peer": peer,
            "ifname": ifname,
            "peer_address": address,
            "jumbo": sizes.get(jumbo, False),
            "small": sizes.get(small, False),
        }
        for (peer, ifname, address), sizes in sorted(outcomes.items())
    ]


def missing_pairs(
    saved: Mapping[str, Any], interfaces: Mapping[str, Sequence[str]] | None = None
) -> list[str]:
    """Every ordered pair (node -> peer, interface) whose jumbo ping did not pass.

    ``saved`` maps each node to its saved fabric result (``result.pings``);
    ``interfaces`` optionally maps a node to the interface names it must ping
    from (default: every interface its pings name, at least one). Returns
    ``"a -> b over IF"`` lines; empty when every pair of nodes passed both ways.
    """
    out = []
    hosts = sorted(saved)
    for host in hosts:
        pings = [p for p in (saved[host] or {}).get("pings") or [] if isinstance(p, Mapping)]
        names = list((interfaces or {}).get(host) or sorted({str(p.get("ifname")) for p in pings}))
        for peer in hosts:
            if peer == host:
                continue
            for ifname in names or ["(no interface)"]:
                passed = any(
                    p.get("peer") == peer and p.get("ifname") == ifname and p.get("jumbo") is True
                    for p in pings
                )
                if not passed:
                    out.append(f"{host} -> {peer} over {ifname}")
    return out
