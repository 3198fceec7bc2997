# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_stack_facts against a fake /proc and /sys, stand-in commands printing recorded text
(one of them hanging), a real manifest and the real NCCL probe run with this Python."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible_collections.localinference.vllm.plugins.module_utils.common._manifest_file import (
    MANIFEST_FORMAT,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._host_stack import (
    judge_node,
)
from ansible_collections.localinference.vllm.plugins.modules import host_stack_facts

from ...module_helper import run_module

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
RECORDED = FIXTURES / "host_stack"


def _command(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _node(tmp_path: Path, monkeypatch, hang: str = "") -> dict:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    meminfo = (FIXTURES / "proc" / "meminfo-controller.txt").read_text()
    (proc / "meminfo").write_text(
        meminfo + (RECORDED / "meminfo-cma-7.0.0-1019-nvidia-kho.txt").read_text()
    )
    (proc / "cmdline").write_text("BOOT_IMAGE=/boot/vmlinuz ro quiet\n")
    (proc / "self" / "limits").write_text((FIXTURES / "proc" / "limits-memlock-8m.txt").read_text())
    sys_root = tmp_path / "sys"
    (sys_root / "class" / "infiniband" / "rocep1s0f0").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _command(bin_dir, "timedatectl", f"cat {RECORDED / 'timedatectl-show-lab-unsynced.txt'}")
    _command(
        bin_dir,
        "systemctl",
        'case "$*" in\n'
        "  *LoadState*) echo LoadState=loaded;;\n"
        f"  *DefaultLimitMEMLOCK*) cat {RECORDED / 'systemctl-show-default-memlock-lab.txt'};;\n"
        f"  *) cat {RECORDED / 'systemctl-show-unit-memlock-lab.txt'};;\n"
        "esac",
    )
    if hang:
        _command(bin_dir, hang, "sleep 30")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    repo = tmp_path / "hub" / "models--org--name"
    snapshot = repo / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "localinference-manifests").mkdir()
    files = [
        {"path": "config.json", "size": 2, "mtime_ns": 1, "sha256": "0" * 64},
        {"path": "model.safetensors", "size": 10_000, "mtime_ns": 1, "sha256": "1" * 64},
    ]
    document = {"format": MANIFEST_FORMAT, "files": files}
    (repo / "localinference-manifests" / "abc.json").write_text(json.dumps(document))
    return {
        "proc_root": str(proc),
        "sys_root": str(sys_root),
        "weights_path": str(snapshot),
        "engine_python": sys.executable,
        "timeout": 2,
    }


def test_gathers_recorded_text_and_the_judge_reads_it(tmp_path, monkeypatch):
    args = _node(tmp_path, monkeypatch)
    result = run_module(host_stack_facts, args, check_mode=True)
    assert not result.failed, result.result
    assert result.result["changed"] is False
    stack = result.result["ansible_facts"]["host_stack"]
    assert stack["meminfo_cma"] == "CmaTotal:        0 kB\nCmaFree:    940604 kB"
    assert stack["rdma_devices"] == ["rocep1s0f0"]
    assert "NTPSynchronized=no" in stack["clock"]["timedatectl"]
    assert stack["clock"]["chronyc"] is None and "chronyc not found" in stack["notes"]
    assert "DefaultLimitMEMLOCK=8388608" in stack["memlock"]["manager"]
    assert "LimitMEMLOCKSoft=8388608" in stack["memlock"]["unit"]
    assert stack["memlock"]["process"].startswith("Max locked memory")
    assert stack["engine"]["source"] == "venv" and stack["engine"]["probe"].startswith("# pip")
    disk = stack["disk"]
    assert (disk["manifest_bytes"], disk["present_bytes"]) == (10_002, 2)
    assert disk["free_bytes"] > 0
    options = {
        "preflight_rdma": "auto",
        "preflight_max_clock_offset_seconds": 1.0,
        "preflight_weights_reserve_gib": 10,
        "preflight_weights_bytes": 0,
        "preflight_recipe": {"ulimits": ["nofile=20000:20000"]},
    }
    judged = judge_node(stack | {"kernel_release": "7.0.0-1019-nvidia"}, {}, options, "n1")
    assert [(f["id"], f["check"]) for f in judged["findings"]] == [
        ("F21", "cma"),
        ("F24", "clock"),
        ("F26", "memlock"),
    ]


def test_a_hanging_command_is_a_note_not_a_hang(tmp_path, monkeypatch):
    args = _node(tmp_path, monkeypatch, hang="timedatectl")
    args["timeout"] = 1
    result = run_module(host_stack_facts, args)
    assert not result.failed
    stack = result.result["ansible_facts"]["host_stack"]
    assert stack["clock"]["timedatectl"] is None
    assert any("timedatectl did not answer within 1 s" in note for note in stack["notes"])


def test_an_image_that_is_not_on_the_node_is_not_listed(tmp_path, monkeypatch):
    args = _node(tmp_path, monkeypatch)
    _command(tmp_path / "bin", "podman", "exit 1")
    args |= {"engine_image": "registry.example/vllm:1", "engine_entrypoint": "/opt/vllm/bin/vllm"}
    stack = run_module(host_stack_facts, args).result["ansible_facts"]["host_stack"]
    assert stack["engine"] == {
        "source": "none",
        "where": "registry.example/vllm:1",
        "probe": None,
        "error": "image not on this node",
    }


def test_bad_options_and_a_missing_proc_fail_naming_them(tmp_path, monkeypatch):
    args = _node(tmp_path, monkeypatch)
    result = run_module(host_stack_facts, args | {"timeout": -1})
    assert result.failed and "timeout must be a positive" in result.result["msg"]
    result = run_module(host_stack_facts, args | {"proc_root": str(tmp_path / "nowhere")})
    assert result.failed and "is proc_root=" in result.result["msg"]
