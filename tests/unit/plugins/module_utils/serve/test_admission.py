# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Admission at start (F4): recorded /proc and cgroup text in a fake /proc tree, the decision
as a case table, the standalone program's exit codes and stderr line, and the real /proc."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _embed
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    parse_meminfo,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._admission import (
    GIB,
    AdmissionError,
    check,
    decide,
    main,
    mem_available,
    rank_need_bytes,
    tenants,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
RECORDED = FIXTURES / "admission"
MEMINFO = (FIXTURES / "proc" / "meminfo-controller.txt").read_text()
STATUS = (FIXTURES / "proc" / "status-pid1.txt").read_text()
# The lab worker's container and its serving unit (recorded, see fixtures/README.md).
CONTAINER = "/libpod_parent/libpod-14cdfd840d28e808b763deabbc571498db2b8feeaf982ffb5ce3ed220d29f95f"
UNIT = (
    (RECORDED / "systemctl-show-controlgroup-lab.txt").read_text().split("ControlGroup=")[1].strip()
)
MEM_AVAILABLE = 24039792 * 1024  # the recorded meminfo


def test_parsing_is_memory_facts_on_the_recorded_files(tmp_path):
    """One meminfo and one /proc/<pid>/status parser: preflight's memory facts."""
    assert mem_available(MEMINFO) == parse_meminfo(MEMINFO)["MemAvailable"] * 1024
    with pytest.raises(AdmissionError, match="no MemAvailable"):
        mem_available("MemTotal: 1 kB\n")
    with pytest.raises(AdmissionError, match=r"^/proc/meminfo: no MemTotal line"):
        mem_available("garbage\n")
    for pid, text in ((10, STATUS), (11, "Name: x\n"), (12, STATUS.replace("VmRSS:", "VmRSS:\tlots"))):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(text)
    # the recorded file is a tenant; a file the kernel did not write is skipped, not a traceback
    assert [(t["pid"], t["name"], t["uid"], t["rss_bytes"]) for t in tenants(str(tmp_path))] == [
        (10, "process_api", 0, 12272 * 1024)
    ]


def _status(name: str, uid: int, rss_kib: int) -> str:
    return (
        STATUS.replace("Name:\tprocess_api", f"Name:\t{name}")
        .replace("Uid:\t0\t0\t0\t0", f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}")
        .replace("VmRSS:\t   12272 kB", f"VmRSS:\t{rss_kib:8d} kB")
    )


def lab_tree(
    tmp_path: Path, limit: int, usage: int, inactive: int, unit_limit: int | None = None
) -> Path:
    """A /proc and cgroup v1 tree from the lab worker's recorded files, rooted in tmp_path."""
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "self" / "cgroup").write_text((RECORDED / "cgroup-lab-exec-hybrid.txt").read_text())
    mounts = (RECORDED / "mountinfo-lab-cgroup-lines.txt").read_text()
    (proc / "self" / "mountinfo").write_text(mounts.replace(" /sys/fs/cgroup", f" {cgroup}"))
    memory = cgroup / "memory"
    unit_dir = memory / UNIT.lstrip("/")
    unit_dir.mkdir(parents=True)
    (memory / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (memory / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (memory / "memory.stat").write_text(f"inactive_file 1\ntotal_inactive_file {inactive}\n")
    for level in (unit_dir, unit_dir.parent):
        (level / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    if unit_limit is not None:
        (unit_dir / "memory.limit_in_bytes").write_text(f"{unit_limit}\n")
        (unit_dir / "memory.usage_in_bytes").write_text(f"{usage // 2}\n")
    processes = [
        (4242, "alice-hog", 1001, 6 * 1024 * 1024, f"4:memory:{CONTAINER}/user.slice\n"),
        (77, "python3", 0, 3 * 1024 * 1024, f"4:memory:{UNIT}\n0::{UNIT}\n"),
        (901, "opencode", 1002, 900 * 1024, f"4:memory:{CONTAINER}/user.slice\n"),
        (2, "kthreadd", 0, 0, "4:memory:/\n"),
    ]
    for pid, name, uid, rss, cgroup_text in processes:
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "status").write_text(_status(name, uid, rss))
        (proc / str(pid) / "cgroup").write_text(cgroup_text)
        (proc / str(pid) / "cmdline").write_text(f"{name}\0--serve\0")
    return proc


def test_the_lab_containers_limit_wins_over_memavailable(tmp_path):
    """Recorded: 10 GiB limit, 615,256,064 bytes used, 119,767,040 of it inactive file cache."""
    proc = lab_tree(tmp_path, 10737418240, 615256064, 119767040)
    decision = check(4 * GIB, GIB, str(proc))
    assert decision["admitted"] is True
    assert decision["available_bytes"] == 10737418240 - (615256064 - 119767040)
    assert decision["mem_available_bytes"] == MEM_AVAILABLE
    assert decision["source"].startswith("cgroup ") and "limit 10.00 GiB" in decision["source"]
    assert decision["cgroup"] == CONTAINER
    assert decision["tenants"] == []  # only named when refused
    # A unit that is not running has no cgroup yet: its nearest existing parent is judged.
    stopped = check(4 * GIB, GIB, str(proc), cgroup=f"{CONTAINER}/system.slice/stopped.service")
    assert stopped["available_bytes"] == decision["available_bytes"]
    assert [level["path"] for level in stopped["cgroup_levels"]] == [f"{tmp_path}/cgroup/memory"]


def test_a_hog_after_preflight_is_refused_naming_it_not_the_engine(tmp_path):
    proc = lab_tree(tmp_path, 10737418240, 9 * GIB, 0)
    decision = check(2 * GIB, GIB // 2, str(proc), cgroup=UNIT)
    assert decision["admitted"] is False
    assert decision["available_bytes"] == GIB
    assert [t["pid"] for t in decision["tenants"]] == [4242, 901]  # pid 77 is in the unit
    assert decision["tenants"][0]["rss_bytes"] == 6 * GIB
    message = decision["message"]
    assert "refused the start" in message
    assert (
        "1.00 GiB available" in message
        and "below 2.50 GiB (2.00 GiB for this rank + 0.50 GiB" in message
    )
    assert "pid 4242 alice-hog 6.00 GiB" in message
    assert "docs/failure-catalog.md#f4" in message
    assert "\n" not in message


def test_the_units_own_lower_limit_wins(tmp_path):
    proc = lab_tree(tmp_path, 10737418240, 2 * GIB, 0, unit_limit=3 * GIB)
    decision = check(2 * GIB, 0, str(proc), cgroup=UNIT)
    assert decision["available_bytes"] == 2 * GIB  # 3 GiB limit - 1 GiB used
    assert decision["source"].startswith(f"cgroup {tmp_path}/cgroup/memory{UNIT}")
    assert [level["limit_bytes"] for level in decision["cgroup_levels"]] == [3 * GIB, 10737418240]


def test_cgroup_v2_with_a_slice_limit(tmp_path):
    proc, root = tmp_path / "proc", tmp_path / "unified"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "self" / "cgroup").write_text("0::/system.slice/localinference-vllm.service\n")
    (proc / "self" / "mountinfo").write_text(
        f"35 24 0:30 / {root} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    unit = root / "system.slice" / "localinference-vllm.service"
    unit.mkdir(parents=True)
    (unit / "memory.max").write_text("max\n")
    (unit / "memory.current").write_text("0\n")
    (root / "system.slice" / "memory.max").write_text(f"{8 * GIB}\n")
    (root / "system.slice" / "memory.high").write_text(f"{6 * GIB}\n")
    (root / "system.slice" / "memory.current").write_text(f"{3 * GIB}\n")
    (root / "system.slice" / "memory.stat").write_text(f"anon 1\ninactive_file {GIB}\n")
    decision = check(5 * GIB, 0, str(proc))
    assert decision["admitted"] is False
    assert decision["available_bytes"] == 4 * GIB  # MemoryHigh 6 GiB - (3 - 1) GiB
    assert decision["cgroup"] == "/system.slice/localinference-vllm.service"


DECISIONS: list[dict[str, Any]] = [
    {
        "name": "MemAvailable covers need + reserve",
        "mem": 20,
        "levels": [],
        "need": 16,
        "reserve": 2,
        "admitted": True,
        "available": 20,
    },
    {
        "name": "exactly enough is enough",
        "mem": 18,
        "levels": [],
        "need": 16,
        "reserve": 2,
        "admitted": True,
        "available": 18,
    },
    {
        "name": "the reserve tips it over",
        "mem": 17,
        "levels": [],
        "need": 16,
        "reserve": 2,
        "admitted": False,
        "available": 17,
    },
    {
        "name": "a cgroup headroom below MemAvailable wins",
        "mem": 100,
        "levels": [[16, 2]],
        "need": 16,
        "reserve": 0,
        "admitted": False,
        "available": 14,
    },
    {
        "name": "the lowest of several levels wins",
        "mem": 100,
        "levels": [[64, 10], [40, 30], [120, 0]],
        "need": 8,
        "reserve": 1,
        "admitted": True,
        "available": 10,
    },
    {
        "name": "a cgroup above MemAvailable does not raise it",
        "mem": 12,
        "levels": [[64, 0]],
        "need": 16,
        "reserve": 0,
        "admitted": False,
        "available": 12,
    },
    {
        "name": "nothing needed is always admitted",
        "mem": 0,
        "levels": [],
        "need": 0,
        "reserve": 0,
        "admitted": True,
        "available": 0,
    },
]


@pytest.mark.parametrize("case", DECISIONS, ids=[c["name"] for c in DECISIONS])
def test_decide(case):
    levels = [
        {
            "path": f"/l{i}",
            "limit_bytes": lim * GIB,
            "usage_bytes": use * GIB,
            "headroom_bytes": max(lim - use, 0) * GIB,
        }
        for i, (lim, use) in enumerate(case["levels"])
    ]
    decision = decide(case["mem"] * GIB, levels, case["need"] * GIB, case["reserve"] * GIB)
    assert decision["admitted"] is case["admitted"]
    assert decision["available_bytes"] == case["available"] * GIB
    assert decision["need_bytes"] == (case["need"] + case["reserve"]) * GIB


def test_bad_needs_and_rank_need():
    with pytest.raises(AdmissionError, match="must be 0 or more"):
        decide(GIB, [], -1, 0)
    # DeepSeek-V4-Flash on two Sparks: ~160 GiB of weights over 2 ranks, 30 GiB of KV, 4 GiB overhead.
    assert rank_need_bytes(160 * GIB, 2, 30 * GIB, 4 * GIB) == 114 * GIB
    assert rank_need_bytes(3, 2, 0) == 2  # a rank holds the larger half
    with pytest.raises(AdmissionError, match="ranks must be 1 or more"):
        rank_need_bytes(1, 0, 0)


def test_the_program_exits_1_with_one_line_on_stderr(tmp_path, capsys):
    proc = lab_tree(tmp_path, 10737418240, 9 * GIB, 0)
    assert (
        main(
            [
                "--need-gib",
                "2",
                "--reserve-gib",
                "0.5",
                "--proc-root",
                str(proc),
                "--cgroup",
                UNIT,
                "--host",
                "spark-worker",
            ]
        )
        == 1
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "localinference admission refused the start on spark-worker"
    )
    assert main(["--need-bytes", str(GIB // 2), "--proc-root", str(proc), "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("localinference admission: admitted")
    assert '"admitted": true' in out[0]


def test_missing_evidence_refuses(tmp_path, capsys):
    assert main(["--need-gib", "1", "--proc-root", str(tmp_path / "nowhere")]) == 1
    assert "fail closed" in capsys.readouterr().err
    proc = lab_tree(tmp_path, 10737418240, 0, 0)
    (tmp_path / "cgroup" / "memory" / "memory.usage_in_bytes").unlink()
    assert main(["--need-gib", "1", "--proc-root", str(proc)]) == 1
    assert "memory.usage_in_bytes cannot be read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["--reserve-gib", "1"])
    assert usage.value.code == 2


def test_the_file_runs_as_a_standalone_program_on_this_machines_real_proc(tmp_path):
    """What the serve role installs: the module and what it imports, a Python without the collection."""
    program = tmp_path / "admission"
    program.write_text(_embed.program("serve._admission", ["admission"]))
    program.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-I", str(program), "--need-bytes", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "localinference admission: admitted" in done.stdout
    refused = subprocess.run(
        [sys.executable, "-I", str(program), "--need-gib", "100000"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("localinference admission refused the start")
    assert "largest processes by RSS: " in refused.stderr
