# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's judge on recorded real evidence: one case per catalog id it can find.

Cases live in ``test_judge.yaml``. Each starts from a recorded lab snapshot
(``tests/unit/fixtures/doctor/``: what ``doctor_facts`` returned on the real
lab hosts, the controller's opencode config and real ``uri`` answers of the
ingress) and changes one thing, preferably with recorded real output: vLLM
logs (``tests/unit/fixtures/vllm-logs/``), ``systemctl show`` of units a
rollout stopped, the messages the stages save. Then it lists the findings the
doctor must print (id, severity, host, words of the message, evidence and fix)
and the ids it must not.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.filter.doctor import (
    doctor_findings,
    doctor_probe_ca,
    doctor_probe_urls,
    doctor_token_targets,
)
from ansible_collections.localinference.vllm.plugins.filter.stage import findings_table
from ansible_collections.localinference.vllm.plugins.module_utils.common._systemctl import (
    parse_show,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._context import (
    CATALOG_IDS,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._judge import (
    CHECKS,
    COLUMNS,
    judge,
)
from ansible_collections.localinference.vllm.plugins.module_utils.ingress._caddy import caddy_base
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._incidents import (
    read_recent,
)

HERE = Path(__file__).parent
FIXTURES = HERE.parents[2] / "fixtures"
CATALOG = HERE.parents[4] / "docs" / "failure-catalog.md"
CASES = yaml.safe_load((HERE / "test_judge.yaml").read_text())
HOSTS = ("spark-head", "spark-worker")
# What serving_state state=verified returns (the keys the playbook keeps) when the node
# runs what the inventory asks.
MATCHING_STATE = {
    "live_matches": True,
    "differences": [],
    "live_findings": [],
    "problems": [],
    "failed": False,
}


def snapshot(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "doctor" / f"{name}.json").read_text())


PROBES = snapshot("lab-ingress-probes")


def _merge(base: Any, patch: Any) -> Any:
    """Deep merge for dicts; ``null`` deletes a key; anything else replaces."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(base.get(key), value)
    return out


def _edit_json(record: dict[str, Any], patch: dict[str, Any]) -> None:
    record["text"] = json.dumps(_merge(json.loads(record["text"]), patch), indent=2)
    record["found"] = True


def _recorded(source: Any) -> Any:
    """A recorded fixture (``{snapshot: NAME, host: H, key: K}``) or the case's own value."""
    if isinstance(source, dict) and "snapshot" in source:
        return copy.deepcopy(snapshot(source["snapshot"])[source["host"]][source["key"]])
    return source


def _text(source: Any) -> str:
    """A fixture file (``vllm-logs/...``) or the lines of a case."""
    if isinstance(source, list):
        return "\n".join(source) + "\n"
    return (FIXTURES / source).read_text()


def _live(spec: Any) -> Any:
    """The head's live reads: ``token`` (a probe record, or recorded), ``incidents`` (a record,
    or ``{fixture, limit}``: a recorded incident log read as the head reads it)."""
    if not isinstance(spec, dict):
        return spec
    live = {key: _recorded(value) for key, value in spec.items()}
    source = spec.get("incidents")
    if isinstance(source, dict) and "fixture" in source:
        path = str(FIXTURES / source["fixture"])
        live["incidents"] = {
            **read_recent(path, source.get("limit", 5)),
            "path": "/var/lib/localinference/incidents.jsonl",
        }
    return live


def build(case: dict[str, Any]) -> Any:
    """The evidence the playbook would hand the judge, after the case's changes."""
    if "evidence" in case:
        return case["evidence"]
    base = snapshot(case.get("base", "lab-healthy-serving"))
    nodes: dict[str, Any] = {}
    for host in HOSTS:
        gathered = copy.deepcopy(base[host])
        for name, patch in case.get("saved", {}).get(host, {}).items():
            record = gathered["files"].setdefault(
                name, {"path": f"/etc/localinference/{name}.json", "error": None}
            )
            if record.get("text") is None:
                record["text"] = json.dumps(
                    {"schema": 1, "stage": name, "inputs_hash": "0" * 64, "result": {}}
                )
            _edit_json(record, patch)
        for name, text in case.get("file_text", {}).get(host, {}).items():
            gathered["files"][name].update(text=text, found=True)
        for name, error in case.get("file_error", {}).get(host, {}).items():
            gathered["files"][name].update(text=None, error=error)
        for name in case.get("missing", {}).get(host, []):
            gathered["files"][name].update(text=None, found=False)
        for unit, source in case.get("units", {}).get(host, {}).items():
            if isinstance(source, dict):  # a unit recorded in another snapshot
                source = snapshot(source["snapshot"])[source["host"]]["units"][unit]["stdout"]
            gathered["units"][unit] = {"stdout": source, "error": None}
        if host in case.get("journal", {}):
            gathered["journal"]["text"] = _text(case["journal"][host])
        if host in case.get("journal_until", {}):
            # The recorded boot as it was before a line: a start still in progress.
            text = gathered["journal"]["text"]
            cut = text.index(case["journal_until"][host])
            gathered["journal"].update(text=text[: text.rindex("\n", 0, cut) + 1], truncated=False)
        if host in case.get("journal_raw", {}):
            gathered["journal"] = case["journal_raw"][host]
        if host in case.get("links", {}):
            gathered["links"] = _recorded(case["links"][host])
        state = case.get("state", {}).get(host, MATCHING_STATE)
        nodes[host] = {"gathered": gathered, "state": state, "unreachable": False}
        for key in ("shm", "quadlet"):
            if host in case.get(key, {}):
                nodes[host][key] = _recorded(case[key][host])
        if host in case.get("live", {}):
            nodes[host]["live"] = _live(case["live"][host])
        if host in case.get("node_raw", {}):
            nodes[host] = case["node_raw"][host]
        if host in case.get("unreachable", []):
            nodes[host] = {
                "unreachable": True,
                "gather_error": "Failed to connect to the host via podman: no such container",
                "gathered": None,
                "state": None,
            }
    client = copy.deepcopy(base["controller-opencode.json"])
    if "client_config" in case:
        _edit_json(client, case["client_config"])
    if "client_config_text" in case:
        client["text"] = case["client_config_text"]
    return {
        "head": "spark-head",
        "recipe": case.get("recipe"),
        "nodes": nodes,
        "ingress_probes": case.get("probes", [PROBES["healthy"]]),
        "client": {"provider": "localinference", "config": client},
    }


def _matches(found: dict[str, Any], want: dict[str, Any]) -> bool:
    if found["id"] != want["id"]:
        return False
    for key in ("severity",):
        if key in want and found[key] != want[key]:
            return False
    if "host" in want and want["host"] not in found["host"].split(", "):
        return False
    return all(
        str(text) in found[key]
        for key in ("message", "evidence", "fix")
        for text in ([want[key]] if isinstance(want.get(key), str) else want.get(key, []))
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_judge(case):
    result = doctor_findings(build(case))
    found = result["findings"]
    shown = "\n".join(findings_table(found, COLUMNS)) if found else "(no findings)"
    for want in case.get("expect", []):
        assert any(_matches(f, want) for f in found), f"missing {want} in:\n{shown}"
    for fid in case.get("absent", []):
        assert all(f["id"] != fid for f in found), f"{fid} should not be found:\n{shown}"
    if "healthy" in case:
        assert result["healthy"] is case["healthy"], f"{result['verdict']}\n{shown}"
    if "verdict" in case:
        assert case["verdict"] in result["verdict"]
    for f in found:
        # Every finding carries evidence and a fix that links the catalog.
        assert f["evidence"] and "docs/failure-catalog.md#" in f["fix"], f
        assert f["doc"].split("#")[1] in ANCHORS, f"{f['doc']} is not an anchor of the catalog"


ANCHORS = {
    line.split('<a id="', 1)[1].split('"', 1)[0]
    for line in CATALOG.read_text().splitlines()
    if '<a id="' in line
} | {"stage-check-ids"}


def test_every_id_the_doctor_checks_has_a_case_and_an_anchor():
    covered = {want["id"] for case in CASES for want in case.get("expect", [])}
    covered |= {row[0] for row in HOST_STACK}
    missing = [fid for fid in CHECKS if fid not in covered]
    assert not missing, f"no case finds {missing}"
    assert set(CHECKS) == set(CATALOG_IDS) - {"F18"}, "F18 has no evidence the doctor can read"
    assert {f"f{n}" for n in range(1, 29)} <= ANCHORS


def test_the_healthy_lab_prints_healthy_and_only_warnings():
    result = judge(build({"name": "healthy"}))
    assert result["healthy"] and result["verdict"].startswith("healthy")
    assert all(f["severity"] == "warning" for f in result["findings"])


def test_one_table_with_evidence_and_fix_columns():
    log = "vllm-logs/real-cpu-insufficient-kv-len32768.log"
    result = judge(build({"name": "F12", "journal": {"spark-head": log}}))
    lines = findings_table(result["findings"], COLUMNS)
    assert lines[0].split() == ["HOST", "ID", "SEVERITY", "MESSAGE", "EVIDENCE", "FIX"]
    assert any("F12" in line and "16256" in line for line in lines[1:])


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        "text",
        3,
        [],
        {"nodes": "x"},
        {"nodes": {"a": "b"}},
        {"nodes": {"a": {"gathered": 7}}},
        {"nodes": {"a": {"gathered": {"files": {"plan": "x"}, "units": [], "journal": 5}}}},
        {"nodes": {"a": {"gathered": {"files": {"plan": {"text": 5}}}, "state": "x"}}},
        {"nodes": {"a": {"gathered": {"units": {"u.service": {"stdout": None}}}}}},
        {"ingress_probes": "x", "client": {"config": {"text": "{"}}, "recipe": 5},
        {"nodes": {"a": {"gathered": {"links": [1]}, "shm": "x", "quadlet": {"findings": 3}}}},
        {"nodes": {"a": {"gathered": {"links": {"e": {"mtu": 5}}}, "shm": {"orphans": [1]}}}},
        {"nodes": {"a": {"gathered": {}, "shm": {"orphans": [{"size": "x"}]}, "quadlet": []}}},
        {"nodes": {"a": {"gathered": {}, "live": "x"}}},
        {"nodes": {"a": {"gathered": {}, "live": {"token": 5, "incidents": []}}}},
        {"nodes": {"a": {"gathered": {}, "live": {"token": {"probes": "x"}, "incidents": {}}}}},
        {"head": "a", "nodes": {"a": {"live": {"token": {"probes": [1, {"ok": "yes"}]}}}}},
        {"nodes": {"a": {"live": {"incidents": {"incidents": [None, {"schema": 1}]}}}}},
        {"nodes": {"a": {"live": {"incidents": {"incidents": [], "problems": "x"}}}}},
    ],
)
def test_garbage_is_a_finding_never_a_traceback(garbage):
    result = judge(garbage)
    assert isinstance(result["healthy"], bool) and isinstance(result["findings"], list)
    assert doctor_probe_urls(garbage) == []


def test_printed_under_the_table_what_the_token_probe_saw_and_the_last_incidents():
    case = {
        "name": "x",
        "live": {
            "spark-head": {
                "token": {"snapshot": "lab-token-probes", "host": "spark-head", "key": "serving"},
                "incidents": {"fixture": "doctor/lab-incidents.jsonl", "limit": 3},
            }
        },
    }
    lines = judge(build(case))["live"]
    assert lines[0].startswith("TOKEN: ingress http://127.0.0.1:8080/localinference/tiny-deepseek")
    assert "first token in" in lines[0] and "/health 200" in lines[0]
    assert lines[1] == (
        "INCIDENTS: the last 3 in spark-head:/var/lib/localinference/incidents.jsonl"
    )
    assert lines[2].split() == [
        "TIME", "VERDICT", "ACTION", "OUTCOME", "DETECT_S", "RECOVER_S", "EVIDENCE"
    ]  # fmt: skip
    assert lines[3].split()[:6] == [
        "2026-12-03T12:04:06Z",
        "down",
        "restart",
        "recovered",
        "9.5",
        "56.4",
    ]
    assert lines[5].split()[:6] == [
        "2026-12-03T12:04:58Z",
        "down",
        "page",
        "budget-spent",
        "49.5",
        "-",
    ]
    assert len(lines) == 6


@pytest.mark.parametrize(
    "incidents, said",
    [
        ({"path": "/i", "exists": False, "incidents": [], "problems": []},
         "INCIDENTS: none (spark-head:/i does not exist: no watchdog has recorded one)"),
        ({"path": "/i", "exists": True, "incidents": [], "problems": []},
         "INCIDENTS: none recorded in spark-head:/i"),
    ],
)  # fmt: skip
def test_no_incident_is_one_line(incidents, said):
    assert judge(build({"name": "x", "live": {"spark-head": {"incidents": incidents}}}))[
        "live"
    ] == [said]


def test_token_targets_come_from_the_heads_ingress_result_and_serving_json():
    head = snapshot("lab-healthy-serving")["spark-head"]
    got = doctor_token_targets(head, "/etc/other.env")
    assert got["key_path"] == "/etc/localinference/ingress/api-key.env"  # what ingress.json records
    assert [(t["name"], t["base_url"], t["health_url"], t["auth"]) for t in got["targets"]] == [
        ("ingress", "http://127.0.0.1:8080/localinference/tiny-deepseek/v1",
         "http://127.0.0.1:8080/localinference/tiny-deepseek/health", True),
        ("engine", "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/health", False),
    ]  # fmt: skip
    assert {t["model"] for t in got["targets"]} == {"localinference/tiny-deepseek"}
    assert doctor_token_targets({}, "/etc/k.env") == {"targets": [], "key_path": "/etc/k.env"}
    assert doctor_token_targets("garbage") == {
        "targets": [],
        "key_path": "/etc/localinference/ingress/api-key.env",
    }


@pytest.mark.parametrize(
    "listen, base",
    [
        (":8080", "http://127.0.0.1:8080"),
        ("0.0.0.0:8080", "http://127.0.0.1:8080"),
        ("10.0.0.5:443", "http://10.0.0.5:443"),
        ("[::1]:8080", "http://[::1]:8080"),
        ("[::]:8080", "http://127.0.0.1:8080"),
        ("8080", None),
        (":http", None),
        (":70000", None),
        (None, None),
    ],
)
def test_the_head_reaches_its_own_caddy_at_its_listen_address(listen, base):
    assert caddy_base(listen) == base


def test_probe_urls_come_from_the_heads_saved_ingress_result():
    assert doctor_probe_urls(build({"name": "x"})) == [PROBES["healthy"]["url"]]


TLS = {"mode": "internal", "ca_file": "/var/lib/caddy/.local/share/caddy/pki/authorities/local/root.crt",
       "client_ca_file": "/home/op/.lab/ingress/ca.crt"}


def test_over_tls_the_doctor_trusts_the_ingress_ca_on_each_side():
    """Issue 27: the controller's probes trust the controller's copy, the head's stream the head's."""
    evidence = build({"name": "tls", "result": {"result": {"tls": TLS}},
                      "saved": {"spark-head": {"ingress": {"result": {"tls": TLS}}}}})
    assert doctor_probe_ca(evidence) == TLS["client_ca_file"]
    assert doctor_probe_ca(build({"name": "plain"})) == ""  # a result from before TLS: plain HTTP
    assert doctor_probe_ca("garbage") == ""
    head = copy.deepcopy(snapshot("lab-healthy-serving")["spark-head"])
    _edit_json(head["files"]["ingress"], {"result": {"tls": TLS}})
    ingress, engine = doctor_token_targets(head)["targets"]
    assert ingress["base_url"] == "https://127.0.0.1:8080/localinference/tiny-deepseek/v1"
    assert ingress["ca_file"] == TLS["ca_file"]
    assert engine["base_url"] == "http://127.0.0.1:8000/v1" and "ca_file" not in engine


def test_parse_show_reads_the_recorded_systemctl_output():
    stopped = snapshot("lab-units-stopped-by-a-rollout")
    worker = parse_show(stopped["spark-worker"]["units"]["localinference-vllm.service"]["stdout"])
    assert worker["ActiveState"] == "failed" and worker["ExecMainStatus"] == "137"
    assert parse_show("garbage\n=x\nA B=c\n") == {}


# --- F21-F26: preflight's own judges on recorded evidence, read back by the doctor -----------
# Each row: the id, where preflight saves it (the node's own `rank` findings, or the cluster's on
# the head), the test_host_stack case whose recorded evidence makes it, and a word of the
# evidence the doctor must quote from the saved finding.
HOST_STACK = [
    ("F21", "rank", "kernel", "7.0.0-1019-nvidia with KHO on", "CmaFree: 940604 kB"),
    ("F22", "rank", "nccl", "DGX Spark - the pip wheel 2.28.9 shadows", "nvidia/nccl/lib"),
    ("F23", "cluster", "versions", "recorded GB10 and H200 nvidia-smi", "580.159.04"),
    ("F24", "rank", "clock", "the lab host - systemd says the clock", "NTPSynchronized=no"),
    ("F25", "cluster", "disk", "the head's manifest sizes a worker", "/srv/models"),
    ("F26", "rank", "memlock", "the lab recipe's ulimits replace the default", "LimitMEMLOCK"),
]


def _host_stack_findings(section: str, name: str, host: str) -> list[dict[str, Any]]:
    """What preflight's judge says on the recorded evidence of one test_host_stack case."""
    from ansible_collections.localinference.vllm.plugins.module_utils.preflight import _host_stack
    from ansible_collections.localinference.vllm.plugins.module_utils.preflight._gpu_facts import (
        parse_table,
    )
    from ansible_collections.localinference.vllm.plugins.module_utils.preflight._nccl_probe import (
        judge_nccl,
    )

    from tests.unit.plugins.module_utils.preflight.test_host_stack import CASES as STACK_CASES
    from tests.unit.plugins.module_utils.preflight.test_host_stack import probe_text, text

    if section == "versions":
        gb10 = parse_table((FIXTURES / "nvidia-smi/gb10-table.txt").read_text())
        h200 = parse_table((FIXTURES / "nvidia-smi/h200-table.txt").read_text())
        stacks = {
            "spark-head": {k: gb10[k] for k in ("driver_version", "cuda_version")},
            host: {k: h200[k] for k in ("driver_version", "cuda_version")},
        }
        return _host_stack.judge_versions(stacks)
    case = next(c for c in STACK_CASES[section] if c["name"].startswith(name))
    if section == "kernel":
        return _host_stack.judge_kernel(
            case["release"], case["machine"], case["cmdline"], text(case["meminfo"]),
            case["rdma"], host,
        )  # fmt: skip
    if section == "nccl":
        return judge_nccl(probe_text(case["probe"]), case["unified_memory"], host)
    if section == "clock":
        return _host_stack.judge_clock(
            text(case.get("timedatectl")), text(case.get("chronyc")), 1.0, host
        )
    if section == "disk":
        reserve = int(case["reserve_gib"] * _host_stack.GIB)
        return _host_stack.judge_disk(case["disk"], case["total"], reserve, host)
    return _host_stack.judge_memlock(
        case["rdma"], case["recipe"], text(case["manager"]), text(case.get("unit")), host
    )


@pytest.mark.parametrize(
    "fid, where, section, name, word", HOST_STACK, ids=[r[0] for r in HOST_STACK]
)
def test_host_stack_defects_preflight_saved_are_named_with_their_catalog_entry(
    fid, where, section, name, word
):
    found = _host_stack_findings(section, name, "spark-worker")
    assert [f["id"] for f in found] == [fid], found
    saved = (
        {"spark-worker": {"preflight": {"result": {"rank": {"findings": found}}}}}
        if where == "rank"
        else {"spark-head": {"preflight": {"result": {"findings": found}}}}
    )
    result = judge(build({"name": fid, "saved": saved}))
    named = [f for f in result["findings"] if f["id"] == fid]
    assert named, result["findings"]
    assert named[0]["host"] == "spark-worker" and named[0]["severity"] == found[0]["severity"]
    assert named[0]["message"] == found[0]["message"]
    assert named[0]["doc"] == f"docs/failure-catalog.md#{fid.lower()}"
    assert "preflight.json findings" in named[0]["evidence"] and word in named[0]["evidence"]
    assert result["healthy"] is (found[0]["severity"] != "error")


def test_f2_the_plans_own_verdict_on_seed_000s_boots_is_named():
    """F2 cannot happen on the lab (its KV bytes are pinned: every boot holds the same cache):
    kv_budget on seed 000's recorded boots (26,890 to 47,930 tokens) saves it, the doctor reads it."""
    from ansible_collections.localinference.vllm.plugins.modules import kv_budget

    from tests.unit.module_helper import run_module
    from tests.unit.plugins.modules.test_kv_budget import SEED000

    plan = run_module(
        kv_budget,
        {"observations": SEED000, "granularity": 8192, "recipe": {"max_model_len": 32768}},
    ).result
    assert [v["id"] for v in plan["violations"]] == ["F2"]
    saved = {"spark-head": {"plan": {"result": {"violations": plan["violations"]}}}}
    (f2,) = [f for f in judge(build({"name": "F2", "saved": saved}))["findings"] if f["id"] == "F2"]
    assert f2["host"] == "spark-head" and "plan.json violations" in f2["evidence"]
    assert "recipe.max_model_len=32768" in f2["message"] and "24576" in f2["message"]
    assert f2["doc"] == "docs/failure-catalog.md#f2"


def test_f20_the_fabric_judge_on_the_recorded_gid_table_is_named():
    """F20 needs RDMA (the lab's RoCE ports are stand-ins): the fabric stage's judge on the recorded
    DGX Spark GID tree without an IPv4 GID (fabric/test_judge.yaml), saved in fabric.json, read back."""
    from tests.unit.plugins.module_utils.fabric.test_judge import CASES as FABRIC_CASES
    from tests.unit.plugins.module_utils.fabric.test_judge import F as FABRIC
    from tests.unit.plugins.module_utils.fabric.test_judge import facts, ping_results, settings

    case = next(c for c in FABRIC_CASES["findings"] if c["name"].startswith("F20 address assigned"))
    node = facts(case)
    found = FABRIC["fabric_findings"](
        settings(case), case["host"], node["ethtool"], node["rdma"], ping_results([]), None
    )
    assert {f["id"] for f in found} == {"F20"}
    saved = {"spark-head": {"fabric": {"result": {"findings": found}}}}
    result = judge(build({"name": "F20", "saved": saved}))
    named = [f for f in result["findings"] if f["id"] == "F20"]
    assert len(named) == 2 and all(f["severity"] == "error" for f in named), named
    assert "no RoCE v2 GID on rocep1s0f0 carries 10.77.0.11" in named[0]["message"]
    assert named[0]["host"] == "spark-head" and "fabric.json findings" in named[0]["evidence"]
    assert not result["healthy"]
