# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GID index resolved at every start in the rendered units (_units with Guards.gid_argv).

Every serving unit of every topology starts with gid-start and reads NCCL_IB_GID_INDEX from the
file it writes, never from Environment=; without an index (no RDMA, single host) nothing of it
is rendered. Quadlet units go through the real generator when one is here: ``EnvironmentFile=``
of ``[Container]`` becomes ``podman run --env-file``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    normalise,
    recipe_hash,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric import _gid_start as gs
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _memory as sm
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import Node
from ansible_collections.localinference.vllm.plugins.module_utils.serve._units import (
    render_units,
    unit_problems,
)

from tests.unit.plugins.module_utils.serve.test_units_guards import GIB, LIB, RECIPE, TOPOLOGY
from tests.unit.plugins.module_utils.serve.test_units_quadlet import QUADLET, needs_quadlet

ENV = {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0",
       "NCCL_SOCKET_IFNAME": "enp1s0f0np0", "VLLM_HOST_IP": "10.77.0.12"}
SOURCE = {"hca": "rocep1s0f0", "port": 1, "sys_root": "/sys"}
GID_PRE = (f"ExecStartPre={LIB}/gid-start --sys-root /sys --hca rocep1s0f0 --port 1 --ipv4 10.77.0.12"
           f" --netdev enp1s0f0np0 --expect 3 --env-file {gs.ENV_FILE}")


def render(mode: str, backend: str, rank: int, with_gid: bool = True):
    recipe = normalise({**RECIPE, "deploy_mode": mode, "executor_backend": backend})
    node = Node(f"spark-{rank}", rank, 2, "10.77.0.11", "10.77.0.12", dict(ENV), "/srv/models/x",
                rdma=dict(SOURCE))
    guards = sm.guards(recipe, node.host, 2, sm.Policy(), 2 * 1024 * 1024, 128 * GIB)
    argv = gs.start_argv(LIB, node.rdma, node.address, node.env)
    if with_gid:
        guards = dataclasses.replace(guards, gid_argv=argv)
    return render_units(recipe, node, recipe_hash(recipe), "/opt/localinference/v", guards)


@pytest.mark.parametrize("topology", TOPOLOGY, ids=[f"{t[0]}-{t[1]}-{t[2]}" for t in TOPOLOGY])
def test_every_serving_unit_resolves_the_index_at_start(topology):
    mode, backend, rank, names, *_ = topology
    out = render(mode, backend, rank)
    assert "NCCL_IB_GID_INDEX" not in out["environment"]
    assert out["environment"]["NCCL_IB_HCA"] == ENV["NCCL_IB_HCA"]
    for unit in out["units"]:
        lines = unit["content"].splitlines()
        pre = [line for line in lines if line.startswith("ExecStartPre=")]
        # after the directories are made, the first guard: before the admission and any reclaim
        assert pre[0].startswith("ExecStartPre=/usr/bin/mkdir -p ")
        assert next(p for p in pre if LIB in p) == GID_PRE, unit["name"]
        assert not any("NCCL_IB_GID_INDEX" in line for line in lines if line.startswith("Environment="))
        wanted = f"EnvironmentFile={gs.ENV_FILE}" if mode == "quadlet" else f"EnvironmentFile=-{gs.ENV_FILE}"
        assert lines.count(wanted) == 1, unit["name"]
        section = lines[: lines.index(wanted)]
        last = max(i for i, line in enumerate(section) if line.startswith("["))
        assert section[last] == ("[Container]" if mode == "quadlet" else "[Service]")
        assert unit_problems(unit["content"]) == []
    assert [u["name"] for u in out["units"]] == names


def test_without_an_index_the_units_keep_their_environment():
    out = render("quadlet", "mp", 1, with_gid=False)
    assert out["environment"]["NCCL_IB_GID_INDEX"] == "3"
    (unit,) = out["units"]
    assert "gid-start" not in unit["content"] and "EnvironmentFile" not in unit["content"]
    assert 'Environment=NCCL_IB_GID_INDEX=3' in unit["content"]


@needs_quadlet
def test_quadlet_reads_the_file_as_podman_env_file(tmp_path: Path):
    (unit,) = render("quadlet", "mp", 1)["units"]
    (tmp_path / unit["name"]).write_text(unit["content"])
    proc = subprocess.run(
        [QUADLET, "-dryrun"],
        env={"LC_ALL": "C", "QUADLET_UNIT_DIRS": str(tmp_path), "PATH": os.environ["PATH"]},
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"--env-file {gs.ENV_FILE}" in proc.stdout
    assert GID_PRE in proc.stdout
