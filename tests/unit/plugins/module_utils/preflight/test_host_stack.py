# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host-stack judgements (F21-F26) from the case table host_stack_cases.yml on recorded text,
the real NCCL probe run against a wheel-layout tree, and the wiring through preflight's filters."""

from __future__ import annotations

import os
import subprocess
import sys
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
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._host_stack import (
    GIB,
    HostStackInputError,
    judge_clock,
    judge_cluster_stack,
    judge_disk,
    judge_kernel,
    judge_memlock,
    judge_node,
    judge_versions,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._nccl_probe import (
    PROBE,
    judge_nccl,
    nccl_summary,
)

from .test_judge import THRESHOLDS, node_facts

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[2] / "fixtures"
CASES = yaml.safe_load((HERE / "host_stack_cases.yml").read_text())
F = FilterModule().filters()
OPTIONS = {
    "preflight_rdma": "auto",
    "preflight_max_clock_offset_seconds": 1.0,
    "preflight_weights_reserve_gib": 10,
    "preflight_weights_bytes": 0,
    "preflight_recipe": {},
}


def text(spec: Any) -> str | None:
    """A literal, or ``{fixture: NAME, replace: [old, new]}`` from fixtures/host_stack."""
    if spec is None or isinstance(spec, str):
        return spec
    body = (FIXTURES / "host_stack" / spec["fixture"]).read_text()
    if "replace" in spec:
        old, new = spec["replace"]
        assert old in body
        body = body.replace(old, new)
    return body


def probe_text(spec: Any) -> str:
    """The probe's output: a fixture, or its sections built from recorded lines."""
    if "fixture" in spec:
        return text(spec) or ""
    lines = []
    for section, title in (
        ("pip", "pip"),
        ("files", "files"),
        ("ldconfig", "ldconfig -p"),
        ("dpkg", "dpkg -l"),
    ):
        lines.append(f"# {title}")
        body = spec.get(section, [])
        lines += text(body).splitlines() if isinstance(body, dict) else body
    lines.append("# env")
    env = {"LD_PRELOAD": "", "LD_LIBRARY_PATH": "", "VLLM_NCCL_SO_PATH": ""}
    lines += [f"{k}={v}" for k, v in (env | spec.get("env", {})).items()]
    return "\n".join(lines) + "\n"


def check(found: list[dict[str, Any]], expected: list[dict[str, Any]], host: str) -> None:
    assert [(f["id"], f["severity"], f["check"]) for f in found] == [
        (e["id"], e["severity"], e["check"]) for e in expected
    ], found
    for got, want in zip(found, expected, strict=True):
        assert got["host"] == host
        assert got["fix"] and got["evidence"], got
        assert f"docs/failure-catalog.md#{got['id'].lower()}" in got["fix"]
        whole = " | ".join((got["message"], got["fix"], got["evidence"]))
        for part in want.get("has", []):
            assert part in whole, (part, whole)


def _ids(section: str) -> list[str]:
    return [case["name"] for case in CASES[section]]


@pytest.mark.parametrize("case", CASES["kernel"], ids=_ids("kernel"))
def test_kernel(case):
    found = judge_kernel(
        case["release"], case["machine"], case["cmdline"], text(case["meminfo"]), case["rdma"], "n1"
    )
    check(found, case["expect"], "n1")


@pytest.mark.parametrize("case", CASES["nccl"], ids=_ids("nccl"))
def test_nccl(case):
    output = probe_text(case["probe"])
    loads = nccl_summary(output)["loads"]
    for key, value in case["loads"].items():
        assert loads[key] == value, (key, loads)
    check(judge_nccl(output, case["unified_memory"], "n1"), case["expect"], "n1")


@pytest.mark.parametrize("case", CASES["clock"], ids=_ids("clock"))
def test_clock(case):
    found = judge_clock(text(case.get("timedatectl")), text(case.get("chronyc")), 1.0, "n1")
    check(found, case["expect"], "n1")


@pytest.mark.parametrize("case", CASES["memlock"], ids=_ids("memlock"))
def test_memlock(case):
    found = judge_memlock(
        case["rdma"], case["recipe"], text(case["manager"]), text(case.get("unit")), "n1"
    )
    check(found, case["expect"], "n1")


@pytest.mark.parametrize("case", CASES["disk"], ids=_ids("disk"))
def test_disk(case):
    found = judge_disk(case["disk"], case["total"], int(case["reserve_gib"] * GIB), "n1")
    check(found, case["expect"], "n1")


def _gpu(kind: str) -> dict[str, Any]:
    if kind == "gb10":
        table = parse_table((FIXTURES / "nvidia-smi/gb10-table.txt").read_text())
        return build_facts(table["gpus"], table["driver_version"], table["cuda_version"], None)
    table = parse_table((FIXTURES / "nvidia-smi/h200-table.txt").read_text())
    gpus = parse_query_csv((FIXTURES / "nvidia-smi/h200-query-gpu.csv").read_text())
    return build_facts(gpus, table["driver_version"], table["cuda_version"], None)


def test_versions_from_recorded_nvidia_smi():
    """GB10 (driver 580.173.02, CUDA 13.0) beside the H200 recording (580.159.04)."""
    gb10, h200 = _gpu("gb10"), _gpu("h200")
    stacks = {
        "spark-a": {"driver_version": gb10["driver_version"], "cuda_version": gb10["cuda_version"]},
        "spark-b": {"driver_version": gb10["driver_version"], "cuda_version": gb10["cuda_version"]},
        "odd": {"driver_version": h200["driver_version"], "cuda_version": h200["cuda_version"]},
    }
    found = judge_versions(stacks)
    assert (found[0]["host"], found[0]["check"], found[0]["severity"]) == (
        "odd",
        "driver_version",
        "warning",
    )
    assert (
        "NVIDIA driver 580.159.04 differs from the other nodes' 580.173.02" in found[0]["message"]
    )
    assert "spark-a 580.173.02, spark-b 580.173.02, odd 580.159.04" in found[0]["evidence"]
    assert judge_versions({"a": stacks["spark-a"], "b": stacks["spark-b"]}) == []
    # A tie names the node that differs from the first (the head's).
    tie = judge_versions({"head": {"nccl_version": "2.28.9"}, "worker": {"nccl_version": "2.27.3"}})
    assert [(f["host"], f["check"]) for f in tie] == [("worker", "nccl_version")]


def _tree(root: Path, wheel_real: str | None = None) -> Path:
    """A site-packages in the nvidia-nccl wheel's layout, and a system library beside it."""
    site = root / "lib" / "python3.12" / "site-packages"
    lib = site / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    dist = site / "nvidia_nccl_cu13-2.28.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: 2.28.9\n"
    )
    system = root / "usr" / "lib" / "aarch64-linux-gnu"
    system.mkdir(parents=True)
    (system / "libnccl.so.2.28.9").write_bytes(b"\x7fELF system")
    (system / "libnccl.so.2").symlink_to("libnccl.so.2.28.9")
    if wheel_real:
        (lib / "libnccl.so.2").symlink_to(system / wheel_real)
    else:
        (lib / "libnccl.so.2").write_bytes(b"\x7fELF wheel")
    return site


def _probe(site: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], **env},
        check=True,
    )
    return done.stdout


def test_the_real_probe_on_a_wheel_tree_is_read_by_the_judge(tmp_path):
    site = _tree(tmp_path)
    system = tmp_path / "usr" / "lib" / "aarch64-linux-gnu"
    output = _probe(site, {"LD_LIBRARY_PATH": ""})
    assert "nvidia-nccl-cu13==2.28.9" in output
    wheel_lib = str(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    assert wheel_lib in output.splitlines()
    summary = nccl_summary(output)
    assert summary["loads"] == {
        "kind": "wheel",
        "path": wheel_lib,
        "version": "2.28.9",
        "exists": True,
    }
    # The system library is found through LD_LIBRARY_PATH, which RUNPATH yields to.
    output = _probe(site, {"LD_LIBRARY_PATH": str(system)})
    loads = nccl_summary(output)["loads"]
    assert loads["kind"] == "LD_LIBRARY_PATH"
    assert loads["path"] == str(system / "libnccl.so.2")
    assert loads["version"] == "2.28.9"
    # A named override that does not exist is surely broken.
    output = _probe(site, {"LD_PRELOAD": str(system / "libnccl.so.9")})
    found = judge_nccl(output, True, "n1")
    assert [(f["id"], f["severity"]) for f in found] == [("F22", "error")]


def test_the_real_probe_sees_the_system_library_linked_over_the_wheel(tmp_path):
    site = _tree(tmp_path, wheel_real="libnccl.so.2.28.9")
    output = _probe(site, {})
    loads = nccl_summary(output)["loads"]
    assert loads["kind"] == "system linked over the wheel"
    assert judge_nccl(output, True, "n1") == []


def _stack(**overrides: Any) -> dict[str, Any]:
    stack = {
        "kernel_release": "7.0.0-1019-nvidia",
        "machine": "aarch64",
        "cmdline": "ro quiet",
        "meminfo_cma": text({"fixture": "meminfo-cma-7.0.0-1019-nvidia-kho.txt"}),
        "rdma_devices": ["rocep1s0f0", "roceP2p1s0f0"],
        "clock": {
            "timedatectl": text({"fixture": "timedatectl-show-lab-unsynced.txt"}),
            "chronyc": None,
        },
        "memlock": {
            "manager": text({"fixture": "systemctl-show-default-memlock-lab.txt"}),
            "unit": None,
            "process": None,
        },
        "engine": {
            "source": "image",
            "where": "img",
            "probe": None,
            "error": "image not on this node",
        },
        "disk": {
            "path": "/srv/x",
            "measured_at": "/srv",
            "free_bytes": 100 * GIB,
            "present_bytes": 0,
            "manifest": None,
            "manifest_bytes": None,
        },
        "notes": [],
    }
    return stack | overrides


def test_node_through_the_filter_adds_host_stack_findings_after_the_memory_ones():
    memory, gpu = node_facts({"gpu": "gb10"})
    rank = F["preflight_rank"](memory, gpu, THRESHOLDS, "spark-a", _stack(), OPTIONS)
    assert [(f["id"], f["severity"], f["check"]) for f in rank["findings"]] == [
        ("F21", "error", "cma"),
        ("F24", "warning", "clock"),
    ]
    summary = rank["host_stack"]
    assert summary["rdma"] is True
    assert (summary["cma_total_kib"], summary["cma_free_kib"]) == (0, 940604)
    assert summary["driver_version"] == "580.173.02"
    assert "probe" not in summary["engine"]
    # Without host-stack facts the filter is what it was.
    assert "host_stack" not in F["preflight_rank"](memory, gpu, THRESHOLDS, "spark-a")
    with pytest.raises(AnsibleFilterError, match="preflight_rdma must be auto, required or unused"):
        F["preflight_rank"](
            memory, gpu, THRESHOLDS, "n", _stack(), OPTIONS | {"preflight_rdma": "yes"}
        )
    with pytest.raises(
        AnsibleFilterError,
        match=r"options lack preflight_max_clock_offset_seconds, .*preflight_recipe",
    ):
        F["preflight_rank"](memory, gpu, THRESHOLDS, "n", _stack(), {"preflight_rdma": "auto"})
    with pytest.raises(HostStackInputError, match="host_stack_facts first"):
        judge_node(None, gpu, OPTIONS, "n")


def test_cluster_table_fails_on_the_cma_error_and_prints_warnings_marked():
    memory, gpu = node_facts({"gpu": "gb10"})
    sane = {"meminfo_cma": "CmaTotal: 0 kB\nCmaFree: 0 kB\n", "cmdline": "ro kho=off"}
    head = F["preflight_rank"](memory, gpu, THRESHOLDS, "spark-head", _stack(**sane), OPTIONS)
    worker_disk = {
        "path": "/srv/x",
        "measured_at": "/srv",
        "free_bytes": 5 * GIB,
        "present_bytes": 0,
    }
    head["host_stack"]["disk"] |= {"manifest_bytes": 20 * GIB}
    worker = F["preflight_rank"](
        memory, gpu, THRESHOLDS, "spark-worker", _stack(disk=worker_disk), OPTIONS
    )
    hostvars = {"spark-head": {"preflight_rank": head}, "spark-worker": {"preflight_rank": worker}}
    cluster = F["preflight_cluster"](hostvars, ["spark-head", "spark-worker"])
    assert cluster["failing"] == ["spark-worker"]
    ids = [(f["host"], f["id"], f["severity"]) for f in cluster["findings"]]
    assert ("spark-worker", "F25", "error") in ids  # the head's manifest sizes the worker
    assert ("spark-worker", "F21", "error") in ids
    assert ("spark-head", "F24", "warning") in ids
    lines = "\n".join(cluster["lines"])
    assert "Preflight failed on spark-worker." in lines
    assert "spark-head: the system clock is not synchronised" in lines
    assert "[F24 warning]" in lines and "[F21]" in lines


def test_cluster_stack_uses_preflight_weights_bytes_over_manifests():
    stacks = {
        "a": {
            "weights_bytes": 50 * GIB,
            "weights_reserve_bytes": 0,
            "disk": {"free_bytes": 40 * GIB, "present_bytes": 0, "manifest_bytes": 1},
        },
    }
    assert [f["id"] for f in judge_cluster_stack(stacks)["a"]] == ["F25"]
