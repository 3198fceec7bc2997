# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's checks of what the nodes show now, beside what the stages saved.

A stage's saved result says what was true when it ran; these checks read the
node as it is during the doctor's run:

- F19: the running MTU of each cluster interface the fabric stage saved
  (``fabric.json`` ``interfaces``), read from ``/sys/class/net`` by
  ``doctor_facts links=true``. Ends that disagree drop the larger frames (F19);
  every end off the fabric stage's value alike is the stage's ``mtu`` check.
- F13: KV-offload files in ``/dev/shm`` that no live process maps or holds
  (``shm_offload state=status``): a killed engine's orphans.
- F14, F17: the ``podman run`` command the node's Quadlet generator makes of
  the unit files on the node (``quadlet_verify``), which is what the next start
  runs whatever ``serving.json`` records.

No AnsibleModule here: unit-tested through tests/unit/plugins/module_utils/doctor/test_judge.py.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.doctor._context import (
    Doctor,
)

GIB = 1024**3
# The podman options that show F14 and F17 in a generated command line.
SHOWN_OPTIONS = ("--ipc", "--shm-size", "--privileged")


def _cluster_links(d: Doctor) -> list[tuple[str, str, int | None, dict[str, Any] | None]]:
    """``(host, ifname, mtu the fabric stage set, running link or None)`` of every node read live."""
    rows = []
    for host, node in d.nodes.items():
        if node.links is None:
            continue
        for item in (node.saved.get("fabric") or {}).get("interfaces") or []:
            if not isinstance(item, dict) or not isinstance(item.get("ifname"), str):
                continue
            mtu = item.get("mtu")
            expected = mtu if isinstance(mtu, int) and not isinstance(mtu, bool) else None
            rows.append((host, item["ifname"], expected, node.links.get(item["ifname"])))
    return rows


def check_links(d: Doctor) -> None:
    """F19 (the ends disagree), ``mtu`` (every end drifted alike), ``link`` (gone or down)."""
    rows = _cluster_links(d)
    running = {(h, i): link["mtu"] for h, i, _, link in rows if link and link["mtu"] is not None}
    for host, ifname, expected, link in rows:
        where = f"/sys/class/net/{ifname}"
        fabric = f"{host}:{d.nodes[host].paths.get('fabric')}"
        if link is None or link["mtu"] is None:
            d.add(
                "link",
                "error",
                host,
                f"the cluster interface {ifname} the fabric stage set up is gone",
                f"{where}: {link['error'] if link and link['error'] else 'not present'}",
                f"check the NIC and the cable of {host}, then run --tags fabric",
            )
            continue
        if link["operstate"] == "down":
            d.add(
                "link",
                "error",
                host,
                f"the cluster interface {ifname} is down",
                f"{where}/operstate: down",
                f"check the cable and the peer port, then nmcli connection up on {host} "
                "and --tags fabric",
            )
        if expected is None or link["mtu"] == expected:
            continue
        peers = sorted(
            (h, mtu) for (h, i), mtu in running.items() if h != host and mtu != link["mtu"]
        )
        reapply = (
            f"nmcli connection up localinference-{ifname} on {host} (or --tags fabric with "
            "cluster_network_reapply_on_drift=true), then --tags fabric to ping the link again"
        )
        if peers:
            peer, peer_mtu = peers[0]
            d.add(
                "F19",
                "error",
                host,
                f"{ifname} runs MTU {link['mtu']} while the fabric stage set {expected} and "
                f"{peer} runs {peer_mtu}: frames above {min(link['mtu'], peer_mtu)} bytes "
                "between them are dropped (NCCL slow or hung, small packets pass)",
                f"{where}/mtu: {link['mtu']}; {peer} {peer_mtu}; {fabric} mtu {expected}",
                reapply,
            )
        else:
            d.add(
                "mtu",
                "error",
                host,
                f"{ifname} runs MTU {link['mtu']}, the fabric stage set {expected} "
                "(changed behind NetworkManager)",
                f"{where}/mtu: {link['mtu']}; {fabric} mtu {expected}",
                reapply,
            )


def check_orphans(d: Doctor) -> None:
    """F13: offload files no live process maps or holds (or that could not be proven so)."""
    for host, node in d.nodes.items():
        shm = node.shm
        if shm is None:
            continue
        orphans = shm["orphans"]
        if orphans:
            held = sum(_count(o.get("allocated")) or _count(o.get("size")) for o in orphans)
            first = orphans[0]
            d.add(
                "F13",
                "error",
                host,
                f"{len(orphans)} KV-offload file{'s' if len(orphans) > 1 else ''} in /dev/shm "
                f"mapped and held by no live process ({held / GIB:.2f} GiB): a killed engine's "
                "orphans; tmpfs never frees them and the next native-offload start fails once "
                "they fill /dev/shm",
                f"{first.get('path')}: {_count(first.get('size'))} bytes, uid {first.get('uid')}, "
                "no /proc/*/maps or fd names it (shm_offload state=status)",
                f"reclaim them on {host}: localinference.vllm.shm_offload state=reclaimed "
                "confirm=true (it deletes only files no live process maps)",
            )
        if shm["unproven"]:
            d.add(
                "F13",
                "warning",
                host,
                f"{len(shm['unproven'])} KV-offload file(s) in /dev/shm look orphaned, but not "
                "every process could be read to prove it",
                f"{shm['unproven'][0].get('path')}: {'; '.join(shm['refusals'][:2]) or 'unproven'}",
                "run the doctor as root (become) so every /proc entry can be read",
            )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _shown(argv: list[str]) -> str:
    """The podman options of a generated command line that show F14/F17."""
    picked = []
    for index, token in enumerate(argv):
        if token.startswith(SHOWN_OPTIONS):
            value = argv[index + 1] if "=" not in token and token != "--privileged" else ""
            picked.append(f"{token} {value}".strip())
    return " ".join(picked)


def check_units(d: Doctor, fid: str) -> None:
    """F14 / F17 in what the node's Quadlet generator makes of the unit files on the node."""
    for host, node in d.nodes.items():
        if node.quadlet is None:
            continue
        asked = bool(node.serving and (node.serving["recipe"] or {}).get("privileged"))
        for item in node.quadlet["findings"]:
            if item.get("id") != fid:
                continue
            service = str(item.get("service") or "the serving unit")
            severity = "warning" if fid == "F17" and asked else "error"
            argv = node.quadlet["exec_start"].get(service, [])
            d.add(
                fid,
                severity,
                host,
                f"the unit on the node ({service}, as Quadlet generates it now): "
                f"{item.get('message')}",
                f"quadlet -dryrun: {service}: podman run {_shown(argv) or '...'}",
                "roll out again (--tags rollout): it rewrites the unit files from vllm_recipe; "
                "a unit edited by hand is also F10 (--tags verify shows it)",
            )


def check_f17(d: Doctor) -> None:
    """F17: the plan's and the running recipe's lint, and the unit files on the node."""
    d.saved_findings("F17")
    d.live_lint("F17")
    check_units(d, "F17")


def check_f19(d: Doctor) -> None:
    """F19: the fabric stage's saved pings, and the running MTU of the cluster link now."""
    d.saved_findings("F19")
    check_links(d)
