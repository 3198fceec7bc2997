# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight's judgement from the case table judge_cases.yml: facts -> findings and verdicts.

Node facts are built by the collection's own parsers from the recorded
fixtures, so the shapes are the ones memory_facts and gpu_facts return.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.preflight import FilterModule
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._gpu_facts import (
    build_facts,
    parse_query_csv,
    parse_table,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._judge import (
    PreflightInputError,
    judge_cluster,
    rank_summary,
    read_load,
    silent_verdict,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    memory_summary,
    other_users_processes,
    parse_loadavg,
    parse_meminfo,
    parse_memlock,
    parse_psi,
    shm_summary,
)

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[2] / "fixtures"
ROOT = HERE.parents[4]
CASES = yaml.safe_load((HERE / "judge_cases.yml").read_text())
DEFAULTS = yaml.safe_load((ROOT / "roles" / "preflight" / "defaults" / "main.yml").read_text())
THRESHOLDS = {
    name: DEFAULTS[name]
    for name in (
        "preflight_min_free_memory_gib",
        "preflight_max_swap_used_percent",
        "preflight_max_psi_some_avg10",
        "preflight_min_shm_free_gib",
        "preflight_max_load_per_cpu",
    )
}
GIB = 1024**3
F = FilterModule().filters()


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def _set(facts: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        facts = facts[key]
    facts[last] = value


def node_facts(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(ansible_facts.memory, ansible_facts.gpu)`` of a case's node (see the YAML header)."""
    meminfo = parse_meminfo(_fixture("proc/meminfo-controller.txt")) | spec.get("meminfo", {})
    memory = memory_summary(meminfo, *spec.get("cgroup", [None, None]))
    memory["psi"] = parse_psi(_fixture("proc/pressure-memory-idle.txt"))
    memory["loadavg"] = parse_loadavg(_fixture("proc/loadavg.txt"))
    memory["memlock"] = parse_memlock(_fixture("proc/limits-memlock-8m.txt"))
    memory["shm"] = shm_summary("/dev/shm", 4096, 2 * GIB // 4096, 2 * GIB // 4096)
    memory["cpu_count"] = 2
    memory["other_users"] = other_users_processes(spec.get("processes", []), {0}, 1000, 5)
    for dotted, value in spec.get("set", {}).items():
        _set(memory, dotted, value)
    gpu_spec = spec.get("gpu", "none")
    if gpu_spec == "h200":
        table = parse_table(_fixture("nvidia-smi/h200-table.txt"))
        gpus = parse_query_csv(_fixture("nvidia-smi/h200-query-gpu.csv"))
        gpu = build_facts(gpus, table["driver_version"], table["cuda_version"], None)
    elif gpu_spec == "rtx_pro_6000_pair":
        table = parse_table(_fixture("nvidia-smi/rtx-pro-6000-maxq-x2-table.txt"))
        names = parse_query_csv(
            _fixture("nvidia-smi/rtx-pro-6000-maxq-x2-query-name-compute_cap.csv"),
            ("name", "compute_cap"),
        )
        gpus = [
            row | {"name": named["name"]} for row, named in zip(table["gpus"], names, strict=True)
        ]
        gpu = build_facts(gpus, table["driver_version"], table["cuda_version"], None)
    elif gpu_spec == "gb10":
        table = parse_table(_fixture("nvidia-smi/gb10-table.txt"))
        gpu = build_facts(table["gpus"], table["driver_version"], table["cuda_version"], meminfo)
    elif gpu_spec == "none":
        gpu = build_facts([], None, None, None) | {"absent_reason": "nvidia-smi not found in PATH"}
    else:
        gpu = build_facts(parse_query_csv(gpu_spec["csv"]), "580.159.04", "13.0", None)
    return memory, gpu


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [case["name"] for case in cases]


def _check_findings(found: list[dict[str, Any]], expected: list[dict[str, Any]], host: str) -> None:
    assert [(f["id"], f["check"]) for f in found] == [(e["id"], e["check"]) for e in expected]
    for got, want in zip(found, expected, strict=True):
        assert got["severity"] == want.get("severity", "error")
        assert got["host"] == host
        assert got["fix"], got
        if "message" in want:
            assert got["message"] == want["message"]


@pytest.mark.parametrize("case", CASES["rank"], ids=_ids(CASES["rank"]))
def test_rank(case):
    memory, gpu = node_facts(case["node"])
    rank = rank_summary(memory, gpu, THRESHOLDS | case.get("thresholds", {}), "node-1")
    expect = dict(case["expect"])
    _check_findings(rank["findings"], expect.pop("findings"), "node-1")
    for key, value in expect.items():
        assert rank[key] == value, key
    assert set(rank) == {
        "free_bytes",
        "free_gib",
        "source",
        "swap_used_percent",
        "psi_some_avg10",
        "shm_free_bytes",
        "shm_size_bytes",
        "mem_available_bytes",
        "memlock_soft_bytes",
        "load_1m",
        "cpu_count",
        "other_users",
        "gpus",
        "findings",
    }


def table_rows(lines: list[str]) -> dict[str, str]:
    """Host -> (mark, verdict), read the way tests/lab/test_preflight_faults.py reads them."""
    rows = {}
    for line in lines:
        if line[:4].strip() in ("", "*") and "GiB" not in line and len(line) > 4:
            host = line[4:].split(" ", 1)[0]
            if host and not line.startswith(" " * 5):
                rows[host] = line
    return rows


@pytest.mark.parametrize("case", CASES["cluster"], ids=_ids(CASES["cluster"]))
def test_cluster(case):
    hostvars: dict[str, dict[str, Any]] = {}
    for host, spec in case.get("nodes", {}).items():
        memory, gpu = node_facts(spec)
        hostvars[host] = {"preflight_rank": rank_summary(memory, gpu, THRESHOLDS, host)}
    for host, evidence in case.get("silent", {}).items():
        hostvars[host] = {"preflight_unresponsive": silent_verdict(evidence, 10, host)}
    hosts = case.get("hosts") or list(hostvars)
    before = copy.deepcopy(hostvars)
    result = judge_cluster(hostvars, hosts, case.get("active"))
    assert hostvars == before, "the judgement must not change its input"
    expect = case["expect"]
    assert set(result) == {
        "nodes",
        "weakest_rank",
        "unresponsive",
        "cluster_limits",
        "findings",
        "failing",
        "lines",
    }
    if "weakest_rank" in expect:
        if expect["weakest_rank"] is None:
            assert result["weakest_rank"] is None
        else:
            for key, value in expect["weakest_rank"].items():
                assert result["weakest_rank"][key] == value, key
    if "failing" in expect:
        assert result["failing"] == expect["failing"]
        assert result["lines"][0] == (
            f"Preflight failed on {', '.join(expect['failing'])}."
            if expect["failing"]
            else "Preflight passed."
        )
    if "cluster_limits" in expect:
        if expect["cluster_limits"]:
            for key, value in expect["cluster_limits"].items():
                assert result["cluster_limits"][key] == value, key
        else:
            assert result["cluster_limits"] == {}
    for host, kind in expect.get("classes", {}).items():
        assert result["unresponsive"][host]["class"] == kind
        assert host not in result["nodes"]
    if "finding_ids" in expect:
        assert [f["id"] for f in result["findings"]] == expect["finding_ids"]
    rows = table_rows(result["lines"])
    for host, verdict in expect.get("rows", {}).items():
        assert rows[host].rstrip().endswith(verdict), rows[host]
        assert rows[host][4:].startswith(host + " ")
    if "marked" in expect:
        assert [host for host, line in rows.items() if line.startswith("*")] == [expect["marked"]]
    for text in expect.get("lines_include", []):
        assert text in result["lines"], "\n".join(result["lines"])
    for text in expect.get("lines_exclude", []):
        assert not any(text in line for line in result["lines"])


@pytest.mark.parametrize("case", CASES["silent"], ids=_ids(CASES["silent"]))
def test_silent(case):
    verdict = silent_verdict(case["evidence"], case.get("banner_timeout", 10), "spark-worker")
    expect = case["expect"]
    assert verdict["class"] == expect["class"]
    assert set(verdict) == {"class", "evidence", "load_1m", "advice", "findings"}
    (only,) = verdict["findings"]
    assert only["host"] == "spark-worker"
    assert only["severity"] == "error"
    assert only["check"] == "silent"
    assert only["evidence"] == verdict["evidence"]
    assert f"{only['message']} {only['fix']}" == verdict["advice"]
    assert only["id"] == expect.get("id", "F5" if expect["class"] == "saturated" else "unreachable")
    if "load_1m" in expect:
        assert verdict["load_1m"] == expect["load_1m"]
    if "advice" in expect:
        assert verdict["advice"] == expect["advice"]
    if expect["class"] == "saturated":
        assert verdict["advice"].startswith("SATURATED, not down")
        assert "Do not reboot" in verdict["advice"]
    if "evidence" in expect:
        assert verdict["evidence"] == expect["evidence"]
    for line in expect.get("evidence_include", []):
        assert line in verdict["evidence"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.16 0.60 0.24 1/94 21630\n2\n", (1.16, 2)),
        ("1.16 0.60 0.24 1/94 21630\r\n2\r\n", (1.16, 2)),
        ("1.16 0.60 0.24 1/94 21630\n", (None, None)),
        ("1.16 0.60 0.24 1/94 21630\n0\n", (None, None)),
        ("1.16 0.60 0.24 1/94 21630\nfour\n", (None, None)),
        ("-1 0.60 0.24 1/94 21630\n2\n", (None, None)),
        ("inf 0.60 0.24 1/94 21630\n2\n", (None, None)),
        ("", (None, None)),
    ],
)
def test_read_load(text, expected):
    assert read_load(text) == expected


def test_thresholds_are_named_when_wrong():
    memory, gpu = node_facts({"gpu": "gb10"})
    with pytest.raises(
        PreflightInputError, match=r"^preflight_min_shm_free_gib: expected a number, got 'lots'"
    ):
        rank_summary(memory, gpu, THRESHOLDS | {"preflight_min_shm_free_gib": "lots"}, "n")
    with pytest.raises(PreflightInputError, match="thresholds lack preflight_max_load_per_cpu"):
        rank_summary(memory, gpu, {k: v for k, v in THRESHOLDS.items() if "load" not in k}, "n")
    with pytest.raises(PreflightInputError, match="expected a number, got True"):
        rank_summary(memory, gpu, THRESHOLDS | {"preflight_max_load_per_cpu": True}, "n")


def test_thresholds_given_as_strings_are_shown_as_written():
    """``-e preflight_min_shm_free_gib=1`` arrives as a string."""
    memory, gpu = node_facts({"gpu": "gb10", "set": {"shm.free_bytes": 0}})
    rank = rank_summary(memory, gpu, THRESHOLDS | {"preflight_min_shm_free_gib": "1.5"}, "n")
    assert rank["findings"][0]["message"].endswith("below preflight_min_shm_free_gib=1.5")


def test_memory_facts_from_elsewhere_are_refused():
    with pytest.raises(PreflightInputError, match=r"run localinference\.vllm\.memory_facts"):
        rank_summary(None, {}, THRESHOLDS, "n")
    memory, gpu = node_facts({"gpu": "gb10"})
    del memory["shm"]
    with pytest.raises(PreflightInputError, match="lacks shm"):
        rank_summary(memory, gpu, THRESHOLDS, "n")


def test_filters():
    assert set(F) == {"preflight_rank", "preflight_silent_verdict", "preflight_cluster"}
    memory, gpu = node_facts({"gpu": "gb10"})
    rank = F["preflight_rank"](memory, gpu, THRESHOLDS, "spark-head")
    assert rank["findings"] == []
    with pytest.raises(AnsibleFilterError, match="preflight_rank: preflight_max_load_per_cpu"):
        F["preflight_rank"](memory, gpu, THRESHOLDS | {"preflight_max_load_per_cpu": "x"}, "n")
    verdict = F["preflight_silent_verdict"]({"icmp_peer": {"rc": 0}}, 10, "spark-worker")
    assert verdict["class"] == "saturated"
    with pytest.raises(AnsibleFilterError, match="mapping of probe results"):
        F["preflight_silent_verdict"]("not evidence")
    hostvars = {"spark-head": {"preflight_rank": rank}, "spark-worker": {}}
    cluster = F["preflight_cluster"](hostvars, ["spark-head", "spark-worker"])
    assert cluster["weakest_rank"]["host"] == "spark-head"
    assert cluster["unresponsive"]["spark-worker"]["class"] == "incomplete"
    broken = {"spark-head": {"preflight_rank": {"findings": []}}}
    with pytest.raises(AnsibleFilterError, match="malformed"):
        F["preflight_cluster"](broken, ["spark-head"])
