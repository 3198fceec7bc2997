# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The judgement of the fabric stage (role ``cluster_network``).

Pure functions over what the role gathers: the role's configuration, the
``ethtool_facts`` and ``rdma_facts`` of the node, ``ip -j addr show dev IF``
and the return codes of the DF pings. They decide

- which peer addresses each node pings, with which payloads (every pair of
  nodes, every cluster interface, so both directions are covered);
- whether the running state drifted from the NetworkManager profile, and
  which profiles to (re-)activate;
- the findings: link, speed, running MTU, reachability, jumbo frames (F19),
  RDMA port state / active MTU / link layer, the RoCE v2 GID index (F20);
- the environment each rank gets and the saved result of the stage.

The filters in ``plugins/filter/fabric.py`` expose them to the role; nothing
here imports AnsibleModule, so each verdict is unit-tested on its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import (
    errors,
    finding,
    text_table,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import _twins

# ICMP payload that fills a classic 1500-byte frame: 1500 - 20 (IPv4) - 8 (ICMP).
SMALL_PAYLOAD = 1472
IPV4_ICMP_HEADERS = 28
PORT_ACTIVE = "PORT_ACTIVE"
ROCE_LINK_LAYER = "Ethernet"

# What the saved result is computed from: the configuration of the link.
# verify and reapply_on_drift change what a run does, not what it configures.
INPUT_KEYS = (
    "interfaces",
    "mtu",
    "expected_speed_mbps",
    "connection_prefix",
    "rdma_required",
    "rdma_active_mtu",
    "rdma_sys_root",
    "ib_hcas",
)


class FabricInputError(validate.InputError):
    """A configuration value the judgement cannot use; the message names the variable."""


# --------------------------------------------------------------------------- configuration


def _flag(settings: Mapping[str, Any], key: str, default: bool) -> bool:
    value = settings.get(key, default)
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise FabricInputError(
            f"cluster_network_{key} must be true or false, got {value!r}"
        ) from None


def _interfaces(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise FabricInputError(
            f"cluster_network_interfaces must list at least one {{ifname, address}} (got {value!r})"
        )
    out = []
    for index, entry in enumerate(value):
        ifname = entry.get("ifname") if isinstance(entry, Mapping) else None
        address = entry.get("address") if isinstance(entry, Mapping) else None
        if not isinstance(ifname, str) or not ifname or not isinstance(address, str) or not address:
            raise FabricInputError(
                f"cluster_network_interfaces[{index}] must be {{ifname, address}} with"
                f" non-empty strings (got {entry!r})"
            )
        out.append({"ifname": ifname, "address": address})
    return out


def config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The role's variables (without the ``cluster_network_`` prefix), typed and checked."""
    if not isinstance(settings, Mapping):
        raise FabricInputError(f"the fabric configuration must be a mapping, got {settings!r}")
    hcas = settings.get("ib_hcas") or []
    if isinstance(hcas, str) or not all(isinstance(h, str) and h for h in hcas):
        raise FabricInputError(f"cluster_network_ib_hcas must be a list of HCA names, got {hcas!r}")
    return {
        "interfaces": _interfaces(settings.get("interfaces")),
        "mtu": validate.integer("cluster_network_mtu", settings.get("mtu"), error=FabricInputError),
        "expected_speed_mbps": validate.integer("cluster_network_expected_speed_mbps", settings.get("expected_speed_mbps"), error=FabricInputError),
        "connection_prefix": str(settings.get("connection_prefix") or ""),
        "rdma_required": _flag(settings, "rdma_required", True),
        "rdma_active_mtu": validate.integer("cluster_network_rdma_active_mtu", settings.get("rdma_active_mtu"), error=FabricInputError),
        "rdma_sys_root": str(settings.get("rdma_sys_root") or "/sys"),
        "ib_hcas": list(hcas),
        "verify": _flag(settings, "verify", True),
        "reapply_on_drift": _flag(settings, "reapply_on_drift", False),
    }


def inputs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What the saved result's ``inputs_hash`` covers."""
    return {key: cfg[key] for key in INPUT_KEYS}


def _error(
    id_: str, message: str, fix: str, host: str, interface: str, check: str | None = None
) -> dict[str, Any]:
    """A finding that stops the stage, with its node, interface and check."""
    return finding(id_, "error", message, fix, host=host, interface=interface, check=check or id_)


def ip_of(address: str) -> str:
    """``10.77.0.11/24`` -> ``10.77.0.11``."""
    return str(address).split("/", 1)[0]


def _profile(cfg: Mapping[str, Any], ifname: str) -> str:
    return f"{cfg['connection_prefix']}{ifname}"


def _unique(values: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if value not in out:
            out.append(value)
    return out


# --------------------------------------------------------------------------- pings


def payloads(mtu: int) -> tuple[int, int]:
    """(jumbo, small): ICMP payloads that fill an MTU-sized and a 1500-byte frame.

    Below an MTU of 1500 the small payload shrinks with it, so a small link is
    never reported unreachable for refusing 1472 bytes with DF set.
    """
    jumbo = mtu - IPV4_ICMP_HEADERS
    return jumbo, min(SMALL_PAYLOAD, jumbo)


def ping_targets(
    cfg: Mapping[str, Any], host: str, peers: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """One ``{ifname, peer, peer_address, size}`` per ping this node sends.

    ``peers`` maps every host of the play to its ``cluster_network_interfaces``;
    entry N of this node talks to entry N of every other node.
    """
    jumbo, small = payloads(cfg["mtu"])
    sizes = _unique([jumbo, small])
    out = []
    for peer, theirs in peers.items():
        if peer == host or not isinstance(theirs, Sequence) or isinstance(theirs, str):
            continue
        for index, iface in enumerate(cfg["interfaces"]):
            if index >= len(theirs) or not isinstance(theirs[index], Mapping):
                continue
            address = theirs[index].get("address")
            if not isinstance(address, str) or not address:
                raise FabricInputError(
                    f"cluster_network_interfaces[{index}] of {peer} has no address"
                    f" (got {theirs[index]!r}); fix its host_vars"
                )
            for size in sizes:
                out.append(
                    {
                        "ifname": iface["ifname"],
                        "peer": peer,
                        "peer_address": ip_of(address),
                        "size": size,
                    }
                )
    return out


def jumbo_pings(
    cfg: Mapping[str, Any], host: str, peers: Mapping[str, Any], timeout: int | float
) -> list[list[str]]:
    """One ``ping`` argv per peer and interface with a full-MTU payload and DF set.

    What a run that skips the fabric stage (the site's record, playbooks/site.yml)
    runs to prove the link still holds jumbo frames: each must exit 0.
    """
    jumbo, _ = payloads(cfg["mtu"])
    return [
        ["ping", "-M", "do", "-s", str(jumbo), "-c", "1", "-W", str(timeout), "-I", t["ifname"], t["peer_address"]]
        for t in ping_targets(cfg, host, peers)
        if t["size"] == jumbo
    ]


def _not_run(result: Mapping[str, Any]) -> str | None:
    """Why a ping result is not a ping at all (missing binary, exec error), else None.

    ``run_command`` reports an exec failure with empty output and ``Error executing
    command.`` (rc is the errno); a ping that ran always prints something.
    """
    rc = result.get("rc")
    if rc is not None and (rc in (0, 1) or result.get("stdout") or result.get("stderr")):
        return None
    return f"{result.get('msg') or 'no output'} rc={rc}"


def ping_findings(
    cfg: Mapping[str, Any], host: str, results: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Jumbo-vs-small outcomes per (interface, peer) -> F19 or reachability findings.

    ``results`` are the registered loop results of the ping task (``item`` is a
    ping target, ``rc`` the return code; one without output or ``rc`` is a
    ping that could not run, reported once per node).
    """
    jumbo, small = payloads(cfg["mtu"])
    outcomes: dict[tuple[str, str, str], dict[int, bool]] = {}
    not_run: list[str] = []
    for result in results:
        item = result.get("item")
        if result.get("skipped") or not isinstance(item, Mapping):
            continue
        reason = _not_run(result)
        if reason:
            not_run.append(reason)
            continue
        key = (str(item["ifname"]), str(item["peer"]), str(item["peer_address"]))
        outcomes.setdefault(key, {})[int(item["size"])] = result["rc"] == 0
    out = []
    if not_run:
        out.append(
            _error(
                "reachability",
                f"ping could not run on {host}: {not_run[0]}",
                "install ping (iputils-ping): the link check sends DF pings with ping -M do",
                host,
                "all",
                check="ping",
            )
        )
    for (ifname, peer, address), sizes in outcomes.items():
        jumbo_ok = sizes.get(jumbo, False)
        small_ok = sizes.get(small, False)
        if small_ok and not jumbo_ok:
            out.append(
                _error(
                    "F19",
                    f"F19 MTU mismatch on the cluster link: {small} passes while {jumbo} fails"
                    f" from {host} to {peer} ({address}); jumbo frames are dropped on the path",
                    f"set MTU {cfg['mtu']} on both ends and on any switch in between",
                    host,
                    ifname,
                    check="jumbo",
                )
            )
        elif not small_ok:
            out.append(
                _error(
                    "reachability",
                    f"no reply from {peer} ({address}) even at {small} bytes",
                    "check addresses, subnets and the cable",
                    host,
                    ifname,
                )
            )
    return out


# --------------------------------------------------------------------------- link


def link_findings(
    cfg: Mapping[str, Any], host: str, ethtool: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Link detected, negotiated speed and running MTU per cluster interface."""
    out = []
    expected = cfg["expected_speed_mbps"]
    for iface in cfg["interfaces"]:
        ifname = iface["ifname"]
        eth = ethtool.get(ifname) or {}
        if not eth.get("link_detected"):
            out.append(
                _error(
                    "link",
                    "no link (ethtool: Link detected: no)",
                    "check the cable and the peer port",
                    host,
                    ifname,
                )
            )
        if (eth.get("speed_mbps") or 0) < expected:
            out.append(
                _error(
                    "speed",
                    f"speed {eth.get('speed_raw') or 'unknown'} is below"
                    f" cluster_network_expected_speed_mbps={expected}",
                    "reseat the cable, reboot with the cable attached, or correct the expectation",
                    host,
                    ifname,
                )
            )
        running = eth.get("mtu")
        if running is None or int(running) != cfg["mtu"]:
            profile = _profile(cfg, ifname)
            out.append(
                _error(
                    "mtu",
                    f"running MTU {running}, expected {cfg['mtu']} (profile {profile} says"
                    f" {cfg['mtu']}); something changed it behind NetworkManager",
                    f"run nmcli connection up {profile} or re-run with"
                    " cluster_network_reapply_on_drift=true",
                    host,
                    ifname,
                )
            )
    return out


# --------------------------------------------------------------------------- RDMA


def rdma_ports(cfg: Mapping[str, Any], rdma: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each cluster interface with the RDMA port behind it (``hca``/``port`` None if none)."""
    netdev_to_hca = rdma.get("netdev_to_hca") or {}
    devices = rdma.get("devices") or {}
    out = []
    for iface in cfg["interfaces"]:
        ref = netdev_to_hca.get(iface["ifname"])
        hca = ref.get("hca") if isinstance(ref, Mapping) else None
        number = str(ref.get("port")) if isinstance(ref, Mapping) else None
        device = devices.get(hca) if hca else None
        port = (device.get("ports") or {}).get(number) if isinstance(device, Mapping) else None
        out.append(
            {
                "ifname": iface["ifname"],
                "address": ip_of(iface["address"]),
                "hca": hca if isinstance(port, Mapping) else None,
                "port_number": number if isinstance(port, Mapping) else None,
                "port": port if isinstance(port, Mapping) else None,
            }
        )
    return out


def _gid_indexes(ports: Iterable[Mapping[str, Any]]) -> list[int]:
    return _unique(
        p["port"]["roce_v2_gid_index"]
        for p in ports
        if p["port"] is not None and p["port"].get("roce_v2_gid_index") is not None
    )


def _port_findings(
    cfg: Mapping[str, Any], host: str, rdma: Mapping[str, Any], entry: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """One interface's RDMA port: present, active, at the MTU, RoCE, with a RoCE v2 GID."""
    out: list[dict[str, Any]] = []
    ifname, hca, port = entry["ifname"], entry["hca"], entry["port"]
    if port is None:
        if cfg["rdma_required"]:
            seen = rdma.get("absent_reason") or (
                "devices: " + ", ".join(rdma.get("devices") or {})
            )
            out.append(
                _error(
                    "rdma",
                    f"no RDMA port behind {ifname} ({seen})",
                    "list the ConnectX interfaces (ibdev2netdev) in cluster_network_interfaces,"
                    " or set cluster_network_rdma_required=false for a link without RoCE",
                    host,
                    ifname,
                    check="rdma",
                )
            )
        return out
    if port.get("state") != PORT_ACTIVE:
        out.append(
            _error(
                "rdma state",
                f"{hca} port is {port.get('state')}, expected {PORT_ACTIVE}",
                "check the cable and the peer's port (ibv_devinfo -d " + str(hca) + ")",
                host,
                ifname,
            )
        )
    if port.get("active_mtu") != cfg["rdma_active_mtu"]:
        out.append(
            _error(
                "rdma mtu",
                f"{hca} active_mtu {port.get('active_mtu')}, expected {cfg['rdma_active_mtu']}"
                " (needs an Ethernet MTU above 4200 on both ends)",
                f"set cluster_network_mtu {cfg['mtu']} on both nodes and bring the port up",
                host,
                ifname,
            )
        )
    if port.get("link_layer") != ROCE_LINK_LAYER:
        out.append(
            _error(
                "rdma link layer",
                f"{hca} link_layer {port.get('link_layer')}, expected {ROCE_LINK_LAYER} (RoCE)",
                "put the port in Ethernet mode or list the RoCE interface instead",
                host,
                ifname,
            )
        )
    if port.get("roce_v2_gid_index") is None:
        seen = ", ".join(port.get("ipv4_addresses") or []) or "none"
        out.append(
            _error(
                "F20",
                f"F20 no RoCE v2 GID on {hca} carries {entry['address']} (addresses seen:"
                f" {seen}); NCCL_IB_GID_INDEX cannot be resolved",
                f"bring the profile {_profile(cfg, ifname)} up so {entry['address']} is"
                " assigned, then check the GID table (show_gids)",
                host,
                ifname,
                check="gid",
            )
        )
    return out


def rdma_findings(
    cfg: Mapping[str, Any], host: str, rdma: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Port state, active MTU, link layer and RoCE v2 GID index behind each interface."""
    out = []
    ports = rdma_ports(cfg, rdma)
    for entry in ports:
        out += _port_findings(cfg, host, rdma, entry)
    indexes = _gid_indexes(ports)
    if len(indexes) > 1:
        out.append(
            _error(
                "F20",
                "F20 the RoCE v2 GID index differs between this node's HCAs"
                f" ({', '.join(str(i) for i in indexes)})",
                "NCCL_IB_GID_INDEX takes one value: rebuild the addresses so the twins agree",
                host,
                "all",
                check="gid",
            )
        )
    present = list(rdma.get("devices") or {})
    missing = [hca for hca in cfg["ib_hcas"] if hca not in present]
    if missing:
        # NCCL_IB_HCA naming a device the node lacks: NCCL skips it without a word, or
        # finds no device at all and falls back to sockets.
        out.append(
            _error(
                "ib_hcas",
                f"cluster_network_ib_hcas names {', '.join(missing)}, which this node does not"
                f" have (RDMA devices: {', '.join(present) or 'none'})",
                "list only devices that 'rdma link' or 'ibv_devices' shows on every node, or leave"
                " cluster_network_ib_hcas empty (the HCAs behind cluster_network_interfaces)",
                host,
                "all",
            )
        )
    return out


# --------------------------------------------------------------------------- drift


def running_state(result: Mapping[str, Any]) -> tuple[int | None, list[str]]:
    """(MTU, IPv4 addresses) from a registered ``ip -j addr show dev IF`` result."""
    if result.get("rc") != 0:
        return None, []
    try:
        links = json.loads(result.get("stdout") or "[]")
    except ValueError:
        return None, []
    if not isinstance(links, list) or not links or not isinstance(links[0], Mapping):
        return None, []
    link = links[0]
    addresses = [
        str(info.get("local"))
        for info in link.get("addr_info") or []
        if isinstance(info, Mapping) and info.get("family") == "inet"
    ]
    mtu = link.get("mtu")
    return (int(mtu) if isinstance(mtu, int) else None), addresses


def drift(
    cfg: Mapping[str, Any],
    host: str,
    running: Iterable[Mapping[str, Any]],
    profiles: Iterable[Mapping[str, Any]],
) -> dict[str, Any]:
    """Compare the running state with the profile; decide which profiles to activate.

    A changed profile is activated so the change takes effect. An unchanged one
    whose running state drifted is activated only when it carries no IPv4 address
    at all (never brought up) or when ``reapply_on_drift`` is set, so that a change
    made behind the collection's back is reported, not hidden. The running MTU is
    judged after activation from ethtool (``link_findings``); an address left
    drifted is a finding here.
    """
    changed = {
        str(r["item"]["ifname"])
        for r in profiles
        if isinstance(r.get("item"), Mapping) and r.get("changed")
    }
    by_name = {str(r["item"]["ifname"]): r for r in running if isinstance(r.get("item"), Mapping)}
    problems: dict[str, list[str]] = {}
    activate: list[str] = []
    out = []
    for iface in cfg["interfaces"]:
        ifname = iface["ifname"]
        mtu, addresses = running_state(by_name.get(ifname, {}))
        want = ip_of(iface["address"])
        found = []
        if mtu != cfg["mtu"]:
            found.append(f"MTU {mtu}")
        if want not in addresses:
            found.append("address " + (",".join(addresses) or "none"))
        if found:
            problems[ifname] = found
        never_up = not addresses
        if ifname in changed or (found and (never_up or cfg["reapply_on_drift"])):
            activate.append(ifname)
        elif want not in addresses:
            profile = _profile(cfg, ifname)
            out.append(
                _error(
                    "address",
                    f"running address {', '.join(addresses)}, expected {want} (profile {profile}"
                    f" says {iface['address']}); something changed it behind NetworkManager",
                    f"run nmcli connection up {profile} or re-run with"
                    " cluster_network_reapply_on_drift=true",
                    host,
                    ifname,
                )
            )
    return {"drift": problems, "activate": activate, "findings": out}


# --------------------------------------------------------------------------- converged?

# The profile settings the role sets (community.general.nmcli), as nmcli names them.
PROFILE_FIELDS = (
    "connection.id",
    "connection.interface-name",
    "connection.autoconnect",
    "802-3-ethernet.mtu",
    "ipv4.method",
    "ipv4.addresses",
    "ipv4.never-default",
    "ipv4.ignore-auto-dns",
    "ipv4.ignore-auto-routes",
    "ipv6.method",
)


def watch_commands(cfg: Mapping[str, Any]) -> list[list[str]]:
    """The read-only commands whose answers a clean run records and the next run compares.

    Per cluster interface: NetworkManager's device state (managed or not), the
    profile's settings (wherever NetworkManager stores it: a keyfile, or netplan
    YAML on Ubuntu), and the running MTU and addresses. Volatile fields
    (``connection.timestamp``) are left out, so an unchanged node answers the same.
    """
    commands = []
    for iface in cfg["interfaces"]:
        ifname = iface["ifname"]
        commands += [
            ["nmcli", "-g", "GENERAL.STATE", "device", "show", ifname],
            ["nmcli", "-g", ",".join(PROFILE_FIELDS), "connection", "show", _profile(cfg, ifname)],
            ["ip", "-j", "addr", "show", "dev", ifname],
        ]
    return commands


# --------------------------------------------------------------------------- verdict


def findings(
    cfg: Mapping[str, Any],
    host: str,
    ethtool: Mapping[str, Any],
    rdma: Mapping[str, Any],
    pings: Iterable[Mapping[str, Any]] = (),
    drifted: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Every finding of this node: drift left unrepaired, then (when verifying)
    link, pings and RDMA."""
    out = list((drifted or {}).get("findings") or [])
    if cfg["verify"]:
        out += link_findings(cfg, host, ethtool)
        out += ping_findings(cfg, host, pings)
        out += rdma_findings(cfg, host, rdma)
        out += _twins.half_cable_findings(
            rdma,
            environment(cfg, rdma)["ib_hcas"],
            host,
            "cluster_network_ib_hcas"
            if cfg["ib_hcas"]
            else "NCCL_IB_HCA (the HCAs behind cluster_network_interfaces)",
        )
    return out


def environment(cfg: Mapping[str, Any], rdma: Mapping[str, Any]) -> dict[str, Any]:
    """The distributed environment of this node and what it is made of.

    ``NCCL_IB_HCA`` lists ``cluster_network_ib_hcas`` or else every HCA behind a
    cluster interface (both twins on a DGX Spark); ``NCCL_IB_GID_INDEX`` is this
    node's own RoCE v2 index (it can differ per node: F20). Both are left out when
    RDMA did not resolve, so NCCL falls back to sockets instead of a wrong device.
    """
    primary = cfg["interfaces"][0]
    ports = rdma_ports(cfg, rdma)
    hcas = list(cfg["ib_hcas"]) or _unique(p["hca"] for p in ports if p["hca"])
    indexes = _gid_indexes(ports)
    gid_index = indexes[0] if indexes else None
    ip = ip_of(primary["address"])
    env = {
        "VLLM_HOST_IP": ip,
        "NCCL_SOCKET_IFNAME": primary["ifname"],
        "GLOO_SOCKET_IFNAME": primary["ifname"],
        "UCX_NET_DEVICES": primary["ifname"],
    }
    if hcas and gid_index is not None:
        env["NCCL_IB_HCA"] = ",".join(hcas)
        env["NCCL_IB_GID_INDEX"] = str(gid_index)
    return {
        "env": env,
        "primary_ip": ip,
        "primary_interface": primary["ifname"],
        "ib_hcas": hcas,
        "gid_index": gid_index,
    }


def publish(
    cfg: Mapping[str, Any],
    ethtool: Mapping[str, Any],
    rdma: Mapping[str, Any],
    found: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """``{inputs, result}`` for ``localinference.vllm.stage_result`` (stage ``fabric``)."""
    result = environment(cfg, rdma)
    hca_of = {p["ifname"]: p["hca"] for p in rdma_ports(cfg, rdma)}
    result["interfaces"] = [
        {
            "ifname": iface["ifname"],
            "address": iface["address"],
            "mtu": (ethtool.get(iface["ifname"]) or {}).get("mtu"),
            "hca": hca_of.get(iface["ifname"]),
        }
        for iface in cfg["interfaces"]
    ]
    result["twins"] = _twins.twin_pairs(rdma)
    result["findings"] = [dict(f) for f in found]
    result["verified"] = cfg["verify"]
    return {"inputs": inputs(cfg), "result": result}


def report(found: Iterable[Mapping[str, Any]]) -> list[str]:
    """All nodes' findings as one table, headed by the nodes with errors."""
    found = list(found)
    if not found:
        return []
    failed = _unique(f.get("host") for f in errors(found))
    title = (
        f"Cluster link verification failed on {', '.join(str(h) for h in failed)}:"
        if failed
        else "Cluster link warnings:"
    )
    rows = (
        [f.get("host"), f.get("interface"), f.get("id"), f.get("message"), f.get("fix")]
        for f in found
    )
    return [title, "", *text_table(["HOST", "INTERFACE", "ID", "FINDING", "FIX"], rows)]
