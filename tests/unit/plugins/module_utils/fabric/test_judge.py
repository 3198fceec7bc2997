# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fabric stage's judgement (module_utils/fabric/_judge.py) from case tables.

``test_judge.yaml`` holds the cases: input facts and ping outcomes -> expected
findings, environments, ping targets and drift verdicts. The facts are the real
shapes: ``recorded_facts.yaml`` is what ``ethtool_facts`` and ``rdma_facts``
return for the recorded command outputs in ``tests/unit/fixtures`` (and the lab's
sysfs GID tree); ``test_recorded_facts_are_what_the_modules_return`` re-runs the
modules and fails when they drift (``LOCALINFERENCE_RECORD=1`` rewrites the file).
"""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.fabric import FilterModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    canonical_json,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import (
    _judge,
    _rdma_gather,
)
from ansible_collections.localinference.vllm.plugins.modules import ethtool_facts, rdma_facts
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[4]
FIXTURES = ROOT / "tests" / "unit" / "fixtures"
STANDINS = ROOT / "lab" / "standins" / "bin"
CASES = yaml.safe_load((HERE / "test_judge.yaml").read_text())
RECORDED_PATH = HERE / "recorded_facts.yaml"
RECORDED = yaml.safe_load(RECORDED_PATH.read_text())
F = FilterModule().filters()


# --------------------------------------------------------------------------- case helpers


def patched(value: dict[str, Any], patches: dict[str, Any] | None) -> dict[str, Any]:
    """A deep copy with ``{"a.b.c": v}`` set (``null`` deletes the key)."""
    out = copy.deepcopy(value)
    for path, new in (patches or {}).items():
        *parents, last = path.split(".")
        node = out
        for key in parents:
            node = node[key]
        if new is None and last in node:
            del node[last]
        else:
            node[last] = new
    return out


def settings(case: dict[str, Any]) -> dict[str, Any]:
    return patched(CASES["configs"][case["config"]], case.get("config_patch"))


def facts(case: dict[str, Any]) -> dict[str, Any]:
    ethtool = {
        ifname: copy.deepcopy(RECORDED["ethtool"][name])
        for ifname, name in (case.get("ethtool") or {}).items()
    }
    rdma = copy.deepcopy(RECORDED["rdma"][case.get("rdma", "absent")])
    return patched({"ethtool": ethtool, "rdma": rdma}, case.get("patch"))


def ping_results(pings: list[Any]) -> list[dict[str, Any]]:
    """``[ifname, peer, address, size, rc]`` -> a registered ping result; dicts pass as given."""
    out = []
    for ping in pings or []:
        if isinstance(ping, dict):
            out.append(ping)
            continue
        ifname, peer, address, size, rc = ping
        out.append(
            {
                "item": {"ifname": ifname, "peer": peer, "peer_address": address, "size": size},
                "rc": rc,
                "stdout": f"PING {address} ({address}) from ... {ifname}: {size}({size + 28}) bytes",
                "stderr": "",
                "changed": False,
                "failed": False,
                "msg": "" if rc == 0 else "non-zero return code",
            }
        )
    return out


def ids(table: str) -> list[str]:
    return [case["name"] for case in CASES[table]]


def expected_findings(case: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"host": case["host"], "severity": "error", **f} for f in case.get("findings") or []]


def comparable(found: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[dict]:
    """Each found finding restricted to the keys its expected counterpart spells out."""
    out = []
    for index, f in enumerate(found):
        keys = expected[index].keys() if index < len(expected) else f.keys()
        out.append({k: v for k, v in f.items() if k in keys})
    return out


# --------------------------------------------------------------------------- tables


@pytest.mark.parametrize("case", CASES["findings"], ids=ids("findings"))
def test_findings(case):
    node = facts(case)
    drifted = (
        _judge.drift(
            _judge.config(settings(case)),
            case["host"],
            case["running"],
            case.get("profiles") or [],
        )
        if case.get("running")
        else None
    )
    found = F["fabric_findings"](
        settings(case),
        case["host"],
        node["ethtool"],
        node["rdma"],
        ping_results(case.get("pings")),
        drifted,
    )
    expected = expected_findings(case)
    assert comparable(found, expected) == expected
    for f in found:
        assert set(f) >= {"id", "severity", "message", "fix", "host", "interface"}
        assert f["fix"], f


@pytest.mark.parametrize("case", CASES["environment"], ids=ids("environment"))
def test_environment(case):
    node = facts(case)
    published = F["fabric_publish"](settings(case), node["ethtool"], node["rdma"], [])
    result = published["result"]
    assert result["env"] == case["env"]
    # the order a rank reads in the play's output: the host address first
    assert list(result["env"])[:4] == [
        "VLLM_HOST_IP",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "UCX_NET_DEVICES",
    ]
    for key, value in (case.get("result") or {}).items():
        assert result[key] == value, key
    # every value is a string: exactly what a rank's environment holds
    assert all(isinstance(v, str) for v in result["env"].values())


@pytest.mark.parametrize("case", CASES["ping_targets"], ids=ids("ping_targets"))
def test_ping_targets(case):
    targets = F["fabric_ping_targets"](case["peers"], case["host"], settings(case))
    assert [[t["ifname"], t["peer"], t["peer_address"], t["size"]] for t in targets] == case[
        "targets"
    ]


@pytest.mark.parametrize("case", CASES["drift"], ids=ids("drift"))
def test_drift(case):
    verdict = F["fabric_drift"](
        case["running"], case.get("profiles") or [], settings(case), case["host"]
    )
    assert verdict["drift"] == case["drift"]
    assert verdict["activate"] == case["activate"]
    assert [f["id"] for f in verdict["findings"]] == case.get("finding_ids", [])


@pytest.mark.parametrize("case", CASES["config_errors"], ids=ids("config_errors"))
def test_config_errors_name_the_variable(case):
    with pytest.raises(AnsibleFilterError) as caught:
        F["fabric_config"](settings(case))
    assert case["error"] in str(caught.value)


# --------------------------------------------------------------------------- whole stage


def test_n_nodes_ping_every_pair_both_ways():
    """Every node pings every other: the union of all nodes' targets covers each ordered pair."""
    case = CASES["n_nodes"]
    pairs = set()
    for host, interfaces in case["peers"].items():
        cfg = patched(CASES["configs"][case["config"]], {"interfaces": interfaces})
        for target in F["fabric_ping_targets"](case["peers"], host, cfg):
            pairs.add((host, target["peer"], target["ifname"], target["size"]))
    hosts = list(case["peers"])
    expected = {
        (a, b, iface["ifname"], size)
        for a in hosts
        for b in hosts
        if a != b
        for iface in case["peers"][a]
        for size in (8972, 1472)
    }
    assert pairs == expected
    assert len(pairs) == 3 * 2 * 2 * 2


def test_saved_result_is_stable_and_round_trips_to_the_facts():
    """fabric.json's result is what the facts hold, byte-identical from run to run."""
    case = CASES["environment"][0]
    node = facts(case)
    first = F["fabric_publish"](settings(case), node["ethtool"], node["rdma"], [])
    again = F["fabric_publish"](settings(case), copy.deepcopy(node["ethtool"]), node["rdma"], [])
    assert canonical_json(first) == canonical_json(again)
    saved = json.loads(json.dumps(first["result"], sort_keys=True))
    assert saved == first["result"]
    assert saved["env"] == first["result"]["env"]
    assert set(saved) >= {
        "env",
        "primary_ip",
        "primary_interface",
        "ib_hcas",
        "gid_index",
        "interfaces",
        "findings",
    }
    assert saved["interfaces"][0] == {
        "ifname": "enp1s0f0np0",
        "address": "10.77.0.11/24",
        "mtu": 9000,
        "hca": "rocep1s0f0",
    }


def test_inputs_cover_the_configuration_not_the_run_switches():
    cfg = CASES["configs"]["twins_head"]
    base = F["fabric_publish"](cfg, {}, RECORDED["rdma"]["absent"], [])["inputs"]
    switched = patched(cfg, {"verify": False, "reapply_on_drift": True})
    assert F["fabric_publish"](switched, {}, RECORDED["rdma"]["absent"], [])["inputs"] == base
    # a string from -e hashes like the integer from the inventory
    assert F["fabric_publish"](patched(cfg, {"mtu": "9000"}), {}, {}, [])["inputs"] == base
    assert F["fabric_publish"](patched(cfg, {"mtu": 1500}), {}, {}, [])["inputs"] != base


def test_report_is_one_table_headed_by_the_failed_nodes():
    found = [
        _judge.finding(
            "F19",
            "error",
            "F19 MTU mismatch",
            "set MTU 9000",
            host="spark-worker",
            interface="enp1s0f0np0",
        ),
        _judge.finding(
            "mtu",
            "error",
            "running MTU 1500, expected 9000",
            "nmcli connection up",
            host="spark-worker",
            interface="enp1s0f0np0",
        ),
    ]
    lines = F["fabric_report"](found)
    assert lines[0] == "Cluster link verification failed on spark-worker:"
    assert lines[2].split() == ["HOST", "INTERFACE", "ID", "FINDING", "FIX"]
    assert lines[3].startswith("spark-worker  enp1s0f0np0  F19  F19 MTU mismatch")
    assert F["fabric_report"]([]) == []


# --------------------------------------------------------------------------- recordings


def _ethtool_recordings(tmp: Path) -> dict[str, Any]:
    sources = {  # recording: (interface name, ethtool IF, ethtool -i IF)
        "veth_9000": ("veth9000", "veth-mtu9000.txt", "veth-mtu9000-i.txt"),
        "veth_peer_down": ("vethdown", "veth-peer-down.txt", "veth-mtu9000-i.txt"),
        "virtio_speed_unknown": (
            "virtio",
            "virtio-speed-unknown.txt",
            "virtio-speed-unknown-i.txt",
        ),
    }
    script = ["#!/bin/sh", 'case "$*" in']
    for name, settings_file, driver_file in sources.values():
        net = tmp / "sys" / "class" / "net" / name
        net.mkdir(parents=True)
        (net / "mtu").write_text("9000\n")
        (net / "operstate").write_text("up\n")
        (net / "address").write_text("5e:3c:11:a0:42:07\n")
        script.append(f'  "{name}") cat {FIXTURES}/ethtool/{settings_file} ;;')
        script.append(f'  "-i {name}") cat {FIXTURES}/ethtool/{driver_file} ;;')
    script += ['  *) echo "unexpected argv: $*" >&2; exit 9 ;;', "esac", ""]
    ethtool = tmp / "ethtool"
    ethtool.write_text("\n".join(script))
    ethtool.chmod(ethtool.stat().st_mode | stat.S_IXUSR)
    names = [name for name, _, _ in sources.values()]
    args = {"interfaces": names, "sys_root": str(tmp / "sys"), "ethtool": str(ethtool)}
    result = run_module(ethtool_facts, args)
    assert not result.failed, result.result
    found = result.result["ansible_facts"]["ethtool"]
    return {recording: found[name] for recording, (name, _, _) in sources.items()}


def _rdma_recording(
    tmp: Path,
    monkeypatch,
    name: str,
    addresses: list[str],
    gid_addresses: bool,
    first_index: int = 2,
    ibv_devinfo: str | None = None,
) -> dict[str, Any]:
    table = dict(zip(["enp1s0f0np0", "enP2p1s0f0np0"], [[a] for a in addresses], strict=True))
    monkeypatch.setattr(_rdma_gather, "_ipv4_addresses", lambda *args: table.get(args[-1], []))
    root = tmp / name
    ports = ["rocep1s0f0=enp1s0f0np0", "roceP2p1s0f0=enP2p1s0f0np0"]
    if gid_addresses:
        ports = [f"{port}={address}" for port, address in zip(ports, addresses, strict=True)]
    argv = [str(STANDINS / "make-rdma-sysfs"), "--root", str(root)]
    argv += ["--ipv4-first-index", str(first_index)]
    for port in ports:
        argv += ["--port", port]
    subprocess.run(argv, check=True, capture_output=True)
    binary = STANDINS / "ibv_devinfo"
    if ibv_devinfo:
        binary = tmp / f"ibv_devinfo-{name}"
        binary.write_text(f"#!/bin/sh\ncat {FIXTURES}/ibv_devinfo/{ibv_devinfo}\n")
        binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    result = run_module(rdma_facts, {"ibv_devinfo": str(binary), "sys_root": str(root)})
    assert not result.failed, result.result
    return result.result["ansible_facts"]["rdma"]


def record(tmp: Path, monkeypatch) -> dict[str, Any]:
    head = ["10.77.0.11", "10.77.1.11"]
    worker = ["10.77.0.12", "10.77.1.12"]
    absent = run_module(rdma_facts, {"ibv_devinfo": str(tmp / "no-ibv_devinfo")})
    return {
        "ethtool": _ethtool_recordings(tmp / "ethtool"),
        "rdma": {
            "twins_gid3": _rdma_recording(tmp, monkeypatch, "twins_gid3", head, True),
            "twins_gid7": _rdma_recording(tmp, monkeypatch, "twins_gid7", worker, True, 6),
            "twins_no_ipv4_gid": _rdma_recording(
                tmp, monkeypatch, "twins_no_ipv4_gid", head, False
            ),
            "port0_down": _rdma_recording(
                tmp,
                monkeypatch,
                "port0_down",
                head,
                True,
                ibv_devinfo="dgx-spark-cx7-port0-down.txt",
            ),
            "absent": absent.result["ansible_facts"]["rdma"],
        },
    }


def test_recorded_facts_are_what_the_modules_return(tmp_path, monkeypatch):
    fresh = json.loads(json.dumps(record(tmp_path, monkeypatch)).replace(str(tmp_path), "TMP"))
    if os.environ.get("LOCALINFERENCE_RECORD") == "1":
        header = RECORDED_PATH.read_text().split("\n---\n", 1)[0]
        body = yaml.safe_dump(fresh, sort_keys=False, width=100)
        RECORDED_PATH.write_text(f"{header}\n---\n{body}")
    assert fresh == RECORDED, (
        "ethtool_facts/rdma_facts return another shape than recorded_facts.yaml records:"
        " check the fabric judgement against the new shape, then re-record with"
        " LOCALINFERENCE_RECORD=1"
    )


def test_watch_commands_read_the_device_the_profile_and_the_running_state_of_each_interface():
    cfg = CASES["configs"]["twins_head"]
    commands = F["fabric_watch_commands"](cfg)
    ifnames = [iface["ifname"] for iface in cfg["interfaces"]]
    assert len(commands) == 3 * len(ifnames)
    for ifname, (device, profile, running) in zip(ifnames, zip(*[iter(commands)] * 3, strict=True), strict=True):
        assert device == ["nmcli", "-g", "GENERAL.STATE", "device", "show", ifname]
        assert profile[:2] == ["nmcli", "-g"] and profile[3:] == ["connection", "show", f"localinference-{ifname}"]
        assert "802-3-ethernet.mtu" in profile[2] and "connection.timestamp" not in profile[2]
        assert running == ["ip", "-j", "addr", "show", "dev", ifname]


@pytest.mark.parametrize("case", CASES["ping_targets"], ids=ids("ping_targets"))
def test_jumbo_pings_are_one_full_payload_ping_per_peer_and_interface_with_df_set(case):
    """What site.yml's "nothing to do?" runs instead of the fabric stage (prove_commands)."""
    cfg = settings(case)
    jumbo = int(cfg["mtu"]) - 28
    argvs = F["fabric_jumbo_pings"](case["peers"], case["host"], cfg, 3)
    want = [[ifname, address] for ifname, _, address, size in case["targets"] if size == jumbo]
    assert [[a[-2], a[-1]] for a in argvs] == want
    for argv in argvs:
        assert argv[:10] == ["ping", "-M", "do", "-s", str(jumbo), "-c", "1", "-W", "3", "-I"]
