"""The lab connection's checks that decide between nsenter and "unreachable" (lab/connection_plugins)."""

from __future__ import annotations

import os

import pytest

from lab.connection_plugins.lab_podman import freezer_file, frozen, start_time

V1 = """12:freezer:/machine.slice/libpod-4f2c.scope
11:pids:/machine.slice/libpod-4f2c.scope
1:name=systemd:/machine.slice/libpod-4f2c.scope/init.scope
0::/machine.slice/libpod-4f2c.scope/init.scope
"""
V2 = "0::/machine.slice/libpod-4f2c.scope/init.scope\n"


def test_the_v1_freezer_hierarchy_wins():
    assert freezer_file(V1) == "/sys/fs/cgroup/freezer/machine.slice/libpod-4f2c.scope/freezer.state"


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified/machine.slice/libpod-4f2c.scope/init.scope/cgroup.freeze"),
        ("/sys/fs/cgroup", "/sys/fs/cgroup/machine.slice/libpod-4f2c.scope/init.scope/cgroup.freeze"),
        ("/nowhere", None),
    ],
)
def test_unified_only_takes_the_mounted_root(present, expected):
    assert freezer_file(V2, exists=lambda path: path.startswith(present + "/machine.slice")) == expected


def test_garbage_names_no_file():
    assert freezer_file("not a cgroup file\n") is None


@pytest.mark.parametrize(("text", "expected"), [("FROZEN\n", True), ("FREEZING", True), ("1\n", True), ("THAWED\n", False), ("0\n", False)])
def test_frozen_reads_both_formats(tmp_path, text, expected):
    state = tmp_path / "freezer.state"
    state.write_text(text)
    assert frozen(str(state)) is expected


def test_a_missing_freezer_file_is_not_frozen(tmp_path):
    assert frozen(str(tmp_path / "gone")) is False
    assert frozen(None) is False


def test_start_time_is_stable_for_a_live_process_and_none_for_a_gone_one():
    assert start_time(os.getpid()) == start_time(os.getpid()) is not None
    assert start_time(2**22 + 1) is None
