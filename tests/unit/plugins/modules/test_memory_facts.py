# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""memory_facts against this machine's real /proc and /dev/shm."""

from __future__ import annotations

import os
import subprocess
import sys

from ansible_collections.localinference.vllm.plugins.modules import memory_facts
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module


def test_reads_the_real_machine():
    result = run_module(memory_facts, {}, check_mode=True)
    assert not result.failed, result.result
    memory = result.result["ansible_facts"]["memory"]
    assert result.result["changed"] is False
    assert memory["mem_total_bytes"] > memory["mem_available_bytes"] > 0
    assert memory["effective_available_bytes"] <= memory["mem_available_bytes"]
    assert memory["shm"]["path"] == "/dev/shm"
    assert memory["shm"]["size_bytes"] >= memory["shm"]["free_bytes"]
    assert memory["loadavg"]["1m"] >= 0
    assert memory["cpu_count"] >= 1
    assert set(memory["memlock"]) == {"soft_bytes", "hard_bytes"}


def test_sees_another_users_process_by_rss():
    """Start a process as 'nobody' holding ~64 MiB and expect it listed first-class."""
    if os.getuid() != 0:
        return
    code = "b = bytearray(64 * 1024 * 1024); import time; time.sleep(30)"
    proc = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code]
    )
    try:
        import time

        for _ in range(50):
            with open(f"/proc/{proc.pid}/status") as handle:
                if any(
                    line.startswith("VmRSS:") and int(line.split()[1]) > 60000 for line in handle
                ):
                    break
            time.sleep(0.1)
        result = run_module(memory_facts, {"min_uid": 1000, "top_processes": 50})
        others = result.result["ansible_facts"]["memory"]["other_users"]
        mine = [p for p in others["top_processes"] if p["pid"] == proc.pid]
        assert mine and mine[0]["user"] == "nobody"
        assert mine[0]["rss_bytes"] >= 60 * 1024 * 1024
        assert any(entry["user"] == "nobody" for entry in others["by_user"])
        # own_users excludes the account
        result = run_module(memory_facts, {"own_users": ["nobody"]})
        assert all(
            p["pid"] != proc.pid
            for p in result.result["ansible_facts"]["memory"]["other_users"]["top_processes"]
        )
    finally:
        proc.kill()
        proc.wait()


def test_bad_proc_root(tmp_path):
    result = run_module(memory_facts, {"proc_root": str(tmp_path)})
    assert result.failed
    assert "proc_root" in result.result["msg"]
