# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""serving_state with the memory guards (F4, F13): the node's need from its weight files, the
slice unit beside the units, the need in the document, idempotence and the refusals."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest
from ansible.module_utils import basic
from ansible_collections.localinference.vllm.plugins.modules import serving_state

from tests.unit.module_helper import run_module
from tests.unit.plugins.modules.test_serving_state import HELP, RECIPE, REV

GIB = 1024**3
UNIFIED = {"unified_memory": True, "reserve_gib": 2, "overhead_gib": 4}


@pytest.fixture
def paths(tmp_path):
    snapshot = tmp_path / "hub" / "snapshots" / REV
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_bytes(b"\0" * 4096)
    return {
        "path": str(tmp_path / "etc" / "serving.json"),
        "staging_dir": str(tmp_path / "etc" / "staging"),
        "unit_dir": str(tmp_path / "units"),
        "slice_dir": str(tmp_path / "system"),
        "weights": str(snapshot),
    }


def args(paths, state, guards=None, **recipe):
    return {
        "recipe": {**RECIPE, "kv_cache_memory_bytes": 32 * 1024 * 1024, **recipe},
        "plan_max_model_len": 4096,
        "node": {
            "host": "spark-worker",
            "rank": 1,
            "nnodes": 2,
            "head_address": "10.77.0.11",
            "address": "10.77.0.12",
            "weights_path": paths["weights"],
        },
        "state": state,
        "help_text": str(HELP),
        "guards": UNIFIED if guards is None else guards,
        **{k: v for k, v in paths.items() if k != "weights"},
    }


def test_staged_renders_the_need_from_the_weights_and_the_slice_beside_the_units(paths):
    out = run_module(serving_state, args(paths, "staged"))
    assert not out.failed, out.result
    memory = out.result["memory"]
    assert memory["weights_bytes"] == 2048  # 4096 bytes of weights over 2 nodes
    assert memory["kv_bytes"] == 32 * 1024 * 1024
    assert memory["need_bytes"] == 2048 + 32 * 1024 * 1024 + 4 * GIB
    assert memory["weights_found"].startswith("1 *.safetensors file(s)")
    units = {u["name"]: u for u in out.result["units"]}
    assert units["localinference.slice"]["path"] == f"{paths['slice_dir']}/localinference.slice"
    assert f"--need-bytes {memory['need_bytes']}" in units["localinference-vllm.container"]["content"]
    staged = Path(paths["staging_dir"], "units")
    assert sorted(p.name for p in staged.iterdir()) == [
        "localinference-vllm.container",
        "localinference.slice",
    ]
    assert out.result["document"]["memory"]["need_bytes"] == memory["need_bytes"]


def test_present_verified_and_a_second_run_changes_nothing(paths):
    first = run_module(serving_state, args(paths, "present"))
    assert first.result["changed"] is True
    slice_file = Path(paths["slice_dir"], "localinference.slice")
    assert "MemoryMax=" in slice_file.read_text()
    document = json.loads(Path(paths["path"]).read_text())
    assert {u["path"] for u in document["units"]} == {
        f"{paths['unit_dir']}/localinference-vllm.container",
        str(slice_file),
    }
    assert run_module(serving_state, args(paths, "verified")).failed is False
    again = run_module(serving_state, args(paths, "present"))
    assert again.result["changed"] is False
    assert run_module(serving_state, args(paths, "staged")).result["live_matches"] is True


def test_an_edited_slice_is_caught_by_verify(paths):
    run_module(serving_state, args(paths, "present"))
    slice_file = Path(paths["slice_dir"], "localinference.slice")
    slice_file.write_text(slice_file.read_text().replace("MemoryMax=", "MemoryMax=1"))
    out = run_module(serving_state, args(paths, "verified"))
    assert out.failed and "localinference.slice: edited on the node" in out.result["msg"]


def test_a_changed_reserve_is_a_difference_and_absent_removes_the_slice(paths):
    run_module(serving_state, args(paths, "present"))
    staged = run_module(serving_state, args(paths, "staged", guards={**UNIFIED, "reserve_gib": 3}))
    assert staged.result["live_matches"] is False
    assert any("units" in line for line in staged.result["differences"])
    out = run_module(serving_state, args(paths, "absent"))
    assert out.result["changed"] is True
    assert not Path(paths["slice_dir"], "localinference.slice").exists()


def test_discrete_gpus_render_no_slice_and_no_weights(paths):
    out = run_module(serving_state, args(paths, "staged", guards={"unified_memory": False}))
    assert not out.failed, out.result
    assert [u["name"] for u in out.result["units"]] == ["localinference-vllm.container"]
    assert out.result["memory"]["need_bytes"] == 4 * GIB


def test_without_guards_nothing_changes(paths):
    out = run_module(serving_state, {**args(paths, "staged"), "guards": None})
    assert out.result["memory"] is None
    assert "admission" not in out.result["units"][0]["content"]
    assert "memory" not in out.result["document"]


@pytest.mark.parametrize(
    ("guards", "named"),
    [
        ({"reserve_gib": -2}, "serve_admission_reserve_gib"),
        ({"oom_score_adjust": -1000}, "serve_oom_score_adjust"),
        ({"libexec_dir": "../bin"}, "serve_libexec_dir"),
        ({"memory_high_margin_gib": 9, "memory_max_margin_gib": 1}, "serve_memory_max_margin_gib"),
    ],
)
def test_bad_knobs_fail_naming_the_role_variable(paths, guards, named):
    out = run_module(serving_state, args(paths, "staged", guards=guards))
    assert out.failed and named in out.result["msg"]
    assert not Path(paths["staging_dir"]).exists()


def test_missing_weights_on_unified_memory_warn(paths):
    given = args(paths, "staged")
    given["node"] = {**given["node"], "weights_path": "/nonexistent/w"}
    warned: list[str] = []
    with mock.patch.object(basic.AnsibleModule, "warn", lambda self, msg: warned.append(msg)):
        out = run_module(serving_state, given)
    assert not out.failed, out.result
    assert out.result["memory"]["weights_bytes"] == 0
    assert any("counts no weights: /nonexistent/w cannot be read" in w for w in warned), warned


GID_ENV = {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "rocep1s0f0", "NCCL_SOCKET_IFNAME": "enp1s0f0np0"}


def test_a_node_with_an_rdma_port_resolves_the_gid_index_at_every_start(paths):
    """node.rdma + the fabric's NCCL_IB_GID_INDEX: gid-start first, the index from its file."""
    base = args(paths, "staged")
    base["node"] = {**base["node"], "env": GID_ENV,
                    "rdma": {"hca": "rocep1s0f0", "port": 1, "sys_root": "/opt/localinference-standins/sys"}}
    out = run_module(serving_state, base)
    assert not out.failed, out.result
    content = {u["name"]: u for u in out.result["units"]}["localinference-vllm.container"]["content"]
    assert ("ExecStartPre=/usr/local/libexec/localinference/gid-start --sys-root"
            " /opt/localinference-standins/sys --hca rocep1s0f0 --port 1 --ipv4 10.77.0.12"
            " --netdev enp1s0f0np0 --expect 3 --env-file /run/localinference/nccl-gid.env") in content
    assert "EnvironmentFile=/run/localinference/nccl-gid.env" in content
    assert "NCCL_IB_GID_INDEX" not in out.result["document"]["environment"]
    # without the port (no RDMA resolved) the frozen environment stays as it was
    base["node"]["rdma"] = {}
    plain = run_module(serving_state, base)
    assert plain.result["document"]["environment"]["NCCL_IB_GID_INDEX"] == "3"


def test_a_bad_rdma_port_is_refused_by_name(paths):
    base = args(paths, "staged")
    base["node"] = {**base["node"], "env": GID_ENV, "rdma": {"hca": "roce/../x"}}
    out = run_module(serving_state, base)
    assert out.failed and "node.rdma.hca" in out.result["msg"], out.result
    assert "serve_rdma_sys_root" in out.result["msg"]
