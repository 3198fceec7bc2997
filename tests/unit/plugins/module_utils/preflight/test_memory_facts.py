# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    ProcParseError,
    memory_summary,
    other_users_processes,
    parse_cgroup_limit,
    parse_loadavg,
    parse_meminfo,
    parse_memlock,
    parse_psi,
    parse_status,
    shm_summary,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "proc"
GIB = 1024**3


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_meminfo_recorded():
    info = parse_meminfo(fixture("meminfo-controller.txt"))
    assert info["MemTotal"] == 24683652
    assert info["MemAvailable"] == 24039792
    assert "SwapTotal" in info
    assert "Hugepagesize" in info


def test_meminfo_rejects_other_files():
    with pytest.raises(ProcParseError):
        parse_meminfo(fixture("loadavg.txt"))


def test_psi_recorded_idle():
    psi = parse_psi(fixture("pressure-memory-idle.txt"))
    assert psi["some"] == {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total": 0}
    assert psi["full"]["avg10"] == 0.0


def test_psi_busy_line():
    psi = parse_psi(
        "some avg10=12.50 avg60=3.10 avg300=0.80 total=123456\nfull avg10=4.00 avg60=1.00 avg300=0.20 total=5000\n"
    )
    assert psi["some"]["avg10"] == 12.5
    assert psi["full"]["total"] == 5000


def test_loadavg_recorded():
    load = parse_loadavg(fixture("loadavg.txt"))
    assert set(load) == {"1m", "5m", "15m", "runnable", "tasks"}
    assert load["tasks"] >= load["runnable"] >= 0


def test_loadavg_seed_saturation_value():
    assert parse_loadavg("278.12 201.40 90.03 300/2100 99999\n")["1m"] == 278.12


def test_memlock_recorded():
    assert parse_memlock(fixture("limits-memlock-8m.txt")) == {
        "soft_bytes": 8388608,
        "hard_bytes": 8388608,
    }


def test_memlock_unlimited():
    text = (
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max locked memory         unlimited            unlimited            bytes\n"
    )
    assert parse_memlock(text) == {"soft_bytes": None, "hard_bytes": None}


def test_status_recorded_pid1():
    status = parse_status(fixture("status-pid1.txt"))
    assert status["uid"] == 0
    assert status["rss_kib"] > 0


KTHREAD = "Name:\tkthreadd\nUmask:\t0000\nState:\tS (sleeping)\nPid:\t2\nPPid:\t0\nUid:\t0\t0\t0\t0\n"
ZOMBIE = "Name:\tworker\nState:\tZ (zombie)\nPid:\t4242\nUid:\t1001\t1001\t1001\t1001\nThreads:\t1\n"


@pytest.mark.parametrize("text", [KTHREAD, ZOMBIE], ids=["kernel-thread", "zombie"])
def test_status_without_an_address_space_has_no_rss(text):
    """Kernel threads and zombies have no Vm* lines: RSS 0, not an error."""
    status = parse_status(text)
    assert (status["rss_kib"], status["swap_kib"]) == (0, 0)


def test_status_name_cannot_add_a_field():
    """A process names itself; only \\n is escaped, so lines end at \\n and nowhere else."""
    text = fixture("status-pid1.txt").replace("Name:\tprocess_api", "Name:\tx\x1cVmRSS:\tzz\u2028Uid:")
    status = parse_status(text)
    assert (status["uid"], status["rss_kib"]) == (0, 12272)
    assert status["name"].startswith("x\x1cVmRSS")


RECORDED = fixture("status-pid1.txt")


# (case id, /proc/<pid>/status text, what the error says): issue 39, these were skipped in silence
@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("\x7fELF\x02\x01\x01\x00" + "".join(map(chr, range(256))), r"NUL byte \(binary content\)"),
        ("not a status file at all\n", r"no Uid line"),
        ("", r"no Uid line"),
        ("Uid:\t1000\t1000\t1000\t1000\n", r"no Name, State, Pid line"),
        (RECORDED.replace("VmRSS:\t   12272 kB\n", ""), r"Vm\* lines without a VmRSS line"),
        (RECORDED.replace("12272 kB", "lots kB"), r"status VmRSS: 'lots' is not a number"),
        (RECORDED.replace("12272 kB", "12272"), r"status VmRSS: '12272' is not '<number> kB'"),
        (RECORDED.replace("12272 kB", "12272 MB"), r"status VmRSS: '12272 MB' is not '<number> kB'"),
        (RECORDED.replace("VmRSS:\t   12272 kB", "VmRSS:"), r"status VmRSS: '' is not '<number> kB'"),
        (RECORDED.replace("VmRSS:\t   12272 kB", "VmRSS:\t" + "9" * 40 + " kB"), r"status VmRSS: 9{19}.*40 digits"),
        (RECORDED.replace("VmSwap:\t       0 kB", "VmSwap:\t-1 kB"), r"status VmSwap: '-1' is not a number"),
        (RECORDED.replace("Uid:\t0", "Uid:\tnobody"), r"status Uid: 'nobody' is not a number"),
    ],
    ids=["binary", "text", "empty", "only-uid", "vm-without-rss", "rss-words", "rss-no-unit", "rss-mb",
         "rss-empty", "rss-huge", "swap-negative", "uid-name"],
)
def test_status_that_the_kernel_did_not_write(text, pattern):
    with pytest.raises(ProcParseError, match=pattern):
        parse_status(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("max\n", None),
        ("9223372036854771712\n", None),
        ("6442450944\n", 6442450944),
        (None, None),
        ("", None),
    ],
)
def test_cgroup_limit(value, expected):
    assert parse_cgroup_limit(value) == expected


# (MemAvailable GiB, cgroup limit GiB, cgroup usage GiB) -> effective GiB
@pytest.mark.parametrize(
    ("available", "limit", "usage", "effective"),
    [
        (100, None, None, 100),
        (100, 6, 2, 4),
        (3, 6, 2, 3),
        (100, 6, 7, 0),
    ],
)
def test_effective_available_honours_cgroup(available, limit, usage, effective):
    meminfo = {"MemTotal": 128 * 1024 * 1024, "MemAvailable": available * 1024 * 1024}
    summary = memory_summary(meminfo, limit and limit * GIB, usage and usage * GIB)
    assert summary["effective_available_bytes"] == effective * GIB


def test_seed_000_swap_nearly_exhausted():
    # seed 000 §3.3: swap at 13-14 of 15 GB on the worker
    meminfo = {
        "MemTotal": 124 * 1024 * 1024,
        "MemAvailable": 88 * 1024 * 1024,
        "SwapTotal": 15 * 1024 * 1024,
        "SwapFree": 1 * 1024 * 1024,
    }
    summary = memory_summary(meminfo)
    assert summary["swap_used_bytes"] == 14 * GIB
    assert summary["swap_used_percent"] == 93.3


def test_no_swap_is_zero_percent():
    assert memory_summary({"MemTotal": 1024, "MemAvailable": 512})["swap_used_percent"] == 0.0


def test_shm_summary():
    assert shm_summary("/dev/shm", 4096, 524288, 262144) == {
        "path": "/dev/shm",
        "size_bytes": 2 * GIB,
        "free_bytes": GIB,
        "used_bytes": GIB,
    }


def _proc(pid, uid, user, rss_mib, name="opencode"):
    return {
        "pid": pid,
        "uid": uid,
        "user": user,
        "name": name,
        "rss_kib": rss_mib * 1024,
        "cmdline": name,
    }


def test_other_users_ranked_by_rss_and_summed_per_user():
    processes = [
        _proc(1, 0, "root", 500, "systemd"),  # system account: not "other"
        _proc(10, 1000, "vllm", 9000, "python3"),  # our own service account
        _proc(20, 1001, "alice", 900),
        _proc(21, 1001, "alice", 1200),
        _proc(30, 1002, "bob", 1000, "node"),
        _proc(31, 1002, "bob", 0, "sleep"),  # no RSS: ignored
    ]
    result = other_users_processes(processes, own_uids={1000}, min_uid=1000, top=2)
    assert [p["pid"] for p in result["top_processes"]] == [21, 30]
    assert result["process_count"] == 3
    assert result["by_user"][0] == {
        "user": "alice",
        "uid": 1001,
        "processes": 2,
        "rss_bytes": 2100 * 1024 * 1024,
    }
    assert result["total_rss_bytes"] == 3100 * 1024 * 1024


def test_no_other_users():
    result = other_users_processes([_proc(1, 0, "root", 5)], own_uids={0}, min_uid=1000, top=10)
    assert result == {"total_rss_bytes": 0, "process_count": 0, "by_user": [], "top_processes": []}
