# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Staging's node-side judgement (module_utils/serve/_stage_checks.py) on recorded lab output."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import Runner
from ansible_collections.localinference.vllm.plugins.module_utils.serve._stage_checks import (
    StageCheckError,
    all_active,
    capture_help,
    help_cache_file,
    holds_address,
    judge_address,
    judge_load,
    not_loaded,
    parse_unit_show,
    read_unit_states,
    stage_ports,
)

FIXTURES = Path(__file__).parents[3] / "fixtures" / "stage"
SHOW = (FIXTURES / "systemctl-show-head.txt").read_text()
IP_ADDR = (FIXTURES / "ip-o-addr-head.txt").read_text()
SERVER = "localinference-vllm.service"
RAY = "localinference-ray.service"


@pytest.mark.parametrize(
    ("loadavg", "ncpu", "limit", "per_cpu", "refusal"),
    [
        ("3.95 5.53 3.77 10/283 2069\n", 2, 4.0, 1.975, None),  # the lab head, mid-boot
        ("8.00 1.00 1.00 1/1 1\n", 2, 4.0, 4.0, None),  # at the limit is not above it
        ("278.41 270.02 260.00 900/4000 77\n", 20, 4.0, None, "F5: n1 is saturated, not down: load 278.41 on 20 CPUs (13.9 per CPU, limit 4)"),
        ("", 2, 4.0, None, "/proc/loadavg is unreadable"),
        ("busy 1 1\n", 2, 4.0, None, "/proc/loadavg is unreadable"),
        ("1.0 1.0 1.0 1/1 1\n", 0, 4.0, None, "reports 0 online CPUs"),
    ],
)
def test_judge_load(loadavg, ncpu, limit, per_cpu, refusal):
    if refusal is None:
        assert judge_load(loadavg, ncpu, limit, "n1")["per_cpu"] == per_cpu
        return
    with pytest.raises(StageCheckError, match=re.escape(refusal)):
        judge_load(loadavg, ncpu, limit, "n1")


@pytest.mark.parametrize(
    ("address", "held"),
    [
        ("10.77.0.11", True),  # the cluster link
        ("10.76.0.11", True),  # the management network
        ("10.77.0.1", False),  # a prefix of a held address is not held
        ("10.77.0.111", False),
        ("10.77.0.12", False),  # the worker's address
        ("::1", True),
    ],
)
def test_holds_address_on_the_lab_heads_interfaces(address, held):
    assert holds_address(IP_ADDR, address) is held


def test_judge_address_names_the_fix():
    judge_address(IP_ADDR, "10.77.0.11", "spark-head")
    judge_address(IP_ADDR, "", "spark-head")  # one node: no cluster address to hold
    with pytest.raises(StageCheckError, match=r'spark-head does not hold its cluster address "10.77.0.12".*--tags fabric,rollout'):
        judge_address(IP_ADDR, "10.77.0.12", "spark-head")


MP = {"port": 8000, "executor_backend": "mp", "master_port": None}
RAY_RECIPE = {"port": 8000, "executor_backend": "ray", "ray_port": 6379}


@pytest.mark.parametrize(
    ("recipe", "server", "rank", "nnodes", "ports"),
    [
        (MP, True, 0, 2, [8000, 29501]),  # head of an mp cluster: API and torch store
        ({**MP, "master_port": 29600}, True, 0, 2, [8000, 29600]),
        (MP, True, 0, 1, [8000]),  # one host: no torch store across nodes
        (MP, True, 1, 2, []),  # a worker binds nothing the head's staging checks
        (RAY_RECIPE, True, 0, 2, [8000, 6379]),
        (RAY_RECIPE, False, 0, 2, [6379]),  # Ray head without a server (serve_start_server off)
    ],
)
def test_stage_ports(recipe, server, rank, nnodes, ports):
    document = {"server_argv": ["serve"] if server else None}
    assert stage_ports(recipe, document, rank, nnodes) == ports


def test_unit_states_from_the_lab_head():
    states = parse_unit_show(SHOW)
    assert states[SERVER] == {"Id": SERVER, "LoadState": "loaded", "ActiveState": "active"}
    assert states[RAY]["LoadState"] == "not-found"
    assert all_active([SERVER], states)
    assert not all_active([SERVER, RAY], states)
    assert not all_active([], states)  # nothing live: the node must start
    assert not_loaded([SERVER], states) == []
    assert not_loaded([SERVER, RAY, "x.service"], states) == [f"{RAY} (not-found)", "x.service (unknown)"]
    failed = parse_unit_show(SHOW.replace("ActiveState=active", "ActiveState=failed"))
    assert not all_active([SERVER], failed)


def executable(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """Stand-in commands (systemctl, podman) first on PATH: this machine runs no lab units."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_read_unit_states_in_one_call(on_path):
    executable(on_path / "systemctl", f"cat <<'EOF'\n{SHOW}EOF\n")
    assert set(read_unit_states(Runner(5), [SERVER, RAY])) == {SERVER, RAY}
    assert read_unit_states(Runner(5), []) == {}
    with pytest.raises(StageCheckError, match=r"did not describe other\.service"):
        read_unit_states(Runner(5), [SERVER, "other.service"])
    executable(on_path / "systemctl", "echo 'System has not been booted with systemd' >&2; exit 1\n")
    with pytest.raises(StageCheckError, match=r"rc 1.*not been booted"):
        read_unit_states(Runner(5), [SERVER])


def test_help_is_cached_by_the_images_sha256_as_before():
    image = "localhost/localinference-vllm-cpu@sha256:" + "ab" * 32
    name = hashlib.sha256(image.encode()).hexdigest() + ".txt"
    assert help_cache_file("/var/lib/localinference/vllm-help", image) == f"/var/lib/localinference/vllm-help/{name}"


def test_capture_help_asks_the_image_and_refuses_silence(on_path):
    recipe = {"image": "localhost/x@sha256:" + "0" * 64, "entrypoint": "/opt/venv/bin/vllm"}
    executable(on_path / "podman", 'echo "$@"\n')
    assert capture_help(Runner(5), recipe) == (
        "run --rm --network=none --entrypoint /opt/venv/bin/vllm "
        f"{recipe['image']} serve --help=all\n"
    )
    executable(on_path / "podman", "echo 'Error: image not known' >&2; exit 125\n")
    with pytest.raises(StageCheckError, match=r"did not print .*\(rc 125\): Error: image not known; pull the image"):
        capture_help(Runner(5), recipe)
