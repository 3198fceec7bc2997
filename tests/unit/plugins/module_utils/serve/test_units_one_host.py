# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One host, tensor parallel 2 inside it: the units and the ``vllm serve`` line, from a case table.

``test_units_one_host.yaml`` holds the cases (deploy mode x backend, and the
curated ``rtx_pro_6000_pair`` recipe). Whatever the case, a one-node cluster
renders no multi-node flag (``--nnodes``, ``--node-rank``, ``--master-addr``,
``--headless``), no Ray unit and no headless worker; with a Quadlet generator
available (``make bootstrap`` puts one at .lab/tools/quadlet) each container
unit also passes the real generator with the same argv.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    normalise,
    recipe_hash,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._single import (
    single_host,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import make_node
from ansible_collections.localinference.vllm.plugins.module_utils.serve._quadlet import (
    exec_start,
    run_time_conflicts,
    split_dryrun,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._units import render_units
from ansible_collections.localinference.vllm.tests.unit.plugins.module_utils.serve.test_units_quadlet import (
    QUADLET,
    dryrun,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[4]
CASES = yaml.safe_load((HERE / "test_units_one_host.yaml").read_text())["cases"]
REV = "5eed0c0ffee0000000000000000000000000000a"
BASE = {
    "model": "localinference/tiny-deepseek",
    "revision": REV,
    "served_model_name": "localinference/tiny-deepseek",
    "image": "localhost/localinference-vllm-cpu@sha256:" + "ab" * 32,
    "entrypoint": "/opt/vllm/bin/vllm",
    "tensor_parallel_size": 2,
    "max_model_len": "plan",
    "kv_cache_memory_bytes": 33554432,
    "max_num_seqs": 4,
    "enforce_eager": True,
    "reasoning_parser": "deepseek_r1",
    "tool_call_parser": "deepseek_v3",
    "enable_auto_tool_choice": True,
    "host": "127.0.0.1",
}
MULTI_NODE_FLAGS = {"--nnodes", "--node-rank", "--master-addr", "--headless"}
VENV = "/opt/localinference/vllm-0.32.0"


def _recipe(case: dict[str, Any]) -> dict[str, Any]:
    if "recipe_file" in case:
        document = yaml.safe_load((ROOT / "recipes" / f"{case['recipe_file']}.yml").read_text())
        return normalise(document["vllm_recipe"])
    return normalise({**BASE, **case["recipe"]}, plan_max_model_len=65536)


def _node(recipe: dict[str, Any], env: dict[str, str]) -> Any:
    """The only node as serve's context.yml describes it (and serving_state validates it):
    the single-host fabric result's address and environment, then serve_node_env."""
    fabric = single_host("rtx-host", ["rtx-host"])["result"]
    return make_node(
        {
            "host": "rtx-host",
            "rank": 0,
            "nnodes": 1,
            "head_address": fabric["primary_ip"],
            "address": fabric["primary_ip"],
            "env": {**fabric["env"], **env},
            "weights_path": f"/srv/models/hub/models--{recipe['model'].replace('/', '--')}"
            f"/snapshots/{recipe['revision']}",
        }
    )


def _contains(argv: list[str], piece: list[str]) -> bool:
    return any(argv[i : i + len(piece)] == piece for i in range(len(argv) - len(piece) + 1))


def _render(case: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    recipe = _recipe(case)
    digest = recipe_hash(recipe)
    out = render_units(recipe, _node(recipe, case.get("node_env") or {}), digest, VENV)
    return recipe, out, digest


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_one_host_renders_tensor_parallel_inside_the_host(case):
    _, out, digest = _render(case)
    expect = case["expect"]
    assert [unit["name"] for unit in out["units"]] == expect["units"]
    assert out["start_order"] == expect["start_order"]
    assert out["role"] == "head" and out["ray_argv"] is None
    argv = out["server_argv"]
    assert not MULTI_NODE_FLAGS & set(argv), argv
    for piece in expect["argv_has"]:
        assert _contains(argv, [str(p) for p in piece]), (piece, argv)
    for name, value in (expect.get("env") or {}).items():
        assert out["environment"].get(name) == (None if value is None else str(value)), name
    content = out["units"][-1]["content"]
    for line in expect.get("unit_lines") or []:
        assert line.replace("{digest12}", digest[:12]) in content.splitlines(), (line, content)
    assert " rank " not in content.split("Description=", 1)[1].split("\n", 1)[0]
    if "exec" in expect:
        assert exec_start(content)[: len(expect["exec"])] == expect["exec"]
        assert exec_start(content)[1:] == argv


@pytest.mark.skipif(QUADLET is None, reason="no Quadlet generator (Podman >= 4.4) here")
@pytest.mark.parametrize(
    "case",
    [
        case
        for case in CASES
        if case.get("recipe_file") or case["recipe"]["deploy_mode"] == "quadlet"
    ],
    ids=lambda case: case["name"],
)
def test_real_quadlet_generator_accepts_the_one_host_unit(tmp_path, case):
    recipe, out, _ = _render(case)
    rc, stdout, stderr = dryrun(tmp_path, out["units"])
    assert rc == 0, stderr
    services = split_dryrun(stdout)
    assert sorted(services) == ["localinference-vllm.service"]
    argv = exec_start(services["localinference-vllm.service"])
    assert argv[-len(out["server_argv"]) - 1 :] == [recipe["image"], *out["server_argv"]]
    assert run_time_conflicts(argv, allow_privileged=recipe["privileged"]) == []
