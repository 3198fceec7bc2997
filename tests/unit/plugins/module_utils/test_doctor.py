# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's judge on recorded real evidence: one case per catalog id it can find.

Cases live in ``test_doctor.yaml``. Each starts from a recorded lab snapshot
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
    doctor_probe_urls,
)
from ansible_collections.localinference.vllm.plugins.filter.stage import findings_table
from ansible_collections.localinference.vllm.plugins.module_utils._doctor import (
    CHECKS,
    COLUMNS,
    judge,
)
from ansible_collections.localinference.vllm.plugins.module_utils._doctor_context import (
    CATALOG_IDS,
)
from ansible_collections.localinference.vllm.plugins.module_utils._doctor_evidence import (
    parse_show,
)

HERE = Path(__file__).parent
FIXTURES = HERE.parents[1] / "fixtures"
CATALOG = HERE.parents[3] / "docs" / "failure-catalog.md"
CASES = yaml.safe_load((HERE / "test_doctor.yaml").read_text())
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


def _text(source: Any) -> str:
    """A fixture file (``vllm-logs/...``) or the lines of a case."""
    if isinstance(source, list):
        return "\n".join(source) + "\n"
    return (FIXTURES / source).read_text()


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
        state = case.get("state", {}).get(host, MATCHING_STATE)
        nodes[host] = {"gathered": gathered, "state": state, "unreachable": False}
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
    missing = [fid for fid in CHECKS if fid not in covered]
    assert not missing, f"no case finds {missing}"
    assert set(CHECKS) == set(CATALOG_IDS) - {"F18"}, "F18 has no evidence the doctor can read"
    assert {f"f{n}" for n in range(1, 21)} <= ANCHORS


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
    ],
)
def test_garbage_is_a_finding_never_a_traceback(garbage):
    result = judge(garbage)
    assert isinstance(result["healthy"], bool) and isinstance(result["findings"], list)
    assert doctor_probe_urls(garbage) == []


def test_probe_urls_come_from_the_heads_saved_ingress_result():
    assert doctor_probe_urls(build({"name": "x"})) == [PROBES["healthy"]["url"]]


def test_parse_show_reads_the_recorded_systemctl_output():
    stopped = snapshot("lab-units-stopped-by-a-rollout")
    worker = parse_show(stopped["spark-worker"]["units"]["localinference-vllm.service"]["stdout"])
    assert worker["ActiveState"] == "failed" and worker["ExecMainStatus"] == "137"
    assert parse_show("garbage\n=x\nA B=c\n") == {}
