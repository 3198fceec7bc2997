# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Past two nodes: the parallel layout (F27) and the command lines of 1 to 4 nodes.

``test_recipe_parallel.yaml`` is the case table of ``lint_parallel``; the
rendering tests check every rank's ``vllm serve`` (mp) and ``ray start`` (ray)
for clusters of 1, 2, 3 and 4 nodes against the recorded ``vllm serve
--help=all`` of vLLM 0.32.0, as the recipe tests do for two.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import normalise
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    RecipeInputError,
    gpus_in_devices,
    lint_parallel,
    model_geometry,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import (
    Node,
    parse_help_flags,
    ray_argv,
    serve_argv,
    unknown_flags,
)
from ansible_collections.localinference.vllm.plugins.modules import kv_budget, serving_state
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

HERE = Path(__file__).resolve().parent
HELP = (HERE.parents[2] / "fixtures" / "vllm-0.32.0" / "serve-help-all.txt").read_text()
FLAGS = parse_help_flags(HELP)
TABLE = yaml.safe_load((HERE / "test_recipe_parallel.yaml").read_text())
REV = "5eed0c0ffee0000000000000000000000000000a"
RECIPE = {
    "model": "localinference/tiny-deepseek",
    "revision": REV,
    "image": "localhost/localinference-vllm-cpu@sha256:" + "ab" * 32,
    "max_model_len": 4096,
    "max_num_seqs": 4,
    "reasoning_parser": "deepseek_r1",
}
HOSTS = ["spark-head", "spark-worker", "spark-worker2", "spark-worker3"]


def node(rank: int, nnodes: int) -> Node:
    return Node(
        host=HOSTS[rank],
        rank=rank,
        nnodes=nnodes,
        head_address="10.77.0.11",
        address=f"10.77.0.{11 + rank}",
        env={"VLLM_HOST_IP": f"10.77.0.{11 + rank}", "GLOO_SOCKET_IFNAME": "enp1s0f0np0"},
        weights_path="/srv/models/hub/models--x--y/snapshots/" + REV,
    )


@pytest.mark.parametrize("case", TABLE["cases"], ids=[c["name"] for c in TABLE["cases"]])
def test_layout(case):
    geometry = case.get("geometry")
    if isinstance(geometry, str):
        geometry = TABLE["geometries"][geometry]
    found = lint_parallel(case["recipe"], case["nodes"], case.get("gpus_per_node"), geometry)
    assert [[f["id"], f["severity"]] for f in found] == case["expected"], found
    for finding, phrases in zip(found, case.get("messages") or [[]] * len(found), strict=True):
        assert finding["message"].startswith("vllm_recipe."), finding["message"]
        for phrase in phrases:
            assert phrase in finding["message"], finding["message"]


@pytest.mark.parametrize(
    ("recipe", "nodes", "gpus", "message"),
    [
        ({}, 0, None, "nodes must be the number of hosts in vllm_cluster, got 0"),
        ({}, "3", None, "nodes must be the number of hosts in vllm_cluster, got '3'"),
        ({}, True, None, "nodes must be"),
        ({}, 2, 0, "gpus_per_node must be a positive integer, got 0"),
        (
            {"tensor_parallel_size": 0},
            2,
            None,
            "recipe.tensor_parallel_size must be 1 or more, got 0",
        ),
        (
            {"pipeline_parallel_size": "three"},
            3,
            None,
            "recipe.pipeline_parallel_size: expected a number, got 'three'; set a whole number",
        ),
    ],
)
def test_bad_input_is_named(recipe, nodes, gpus, message):
    with pytest.raises(RecipeInputError, match=message.replace("(", r"\(")):
        lint_parallel(recipe, nodes, gpus)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2},
            {"attention_heads": 4, "kv_heads": 2, "layers": 2},
        ),
        (  # multimodal: the language model's sizes win
            {
                "num_hidden_layers": 27,
                "text_config": {"num_attention_heads": 32, "num_hidden_layers": 48},
            },
            {"attention_heads": 32, "layers": 48},
        ),
        ({"num_attention_heads": True, "num_hidden_layers": 0, "num_key_value_heads": "8"}, {}),
        ("not a mapping", {}),
        (None, {}),
    ],
)
def test_model_geometry(config, expected):
    assert model_geometry(config) == expected


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        (["nvidia.com/gpu=0"], 1),
        (["nvidia.com/gpu=0", "nvidia.com/gpu=1"], 2),
        (["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"], 2),
        (["nvidia.com/gpu=all"], None),
        (["nvidia.com/gpu=0", "nvidia.com/gpu=all"], None),
        ([], None),
        (None, None),
    ],
)
def test_gpus_in_devices(devices, expected):
    assert gpus_in_devices(devices) == expected


# --------------------------------------------------------------------------- command lines


@pytest.mark.parametrize(
    ("nnodes", "tp", "pp"),
    [
        (1, 1, 1),
        (1, 2, 1),
        (2, 2, 1),
        (2, 1, 2),
        (3, 1, 3),
        (3, 3, 1),
        (4, 4, 1),
        (4, 2, 2),
        (4, 1, 4),
    ],
)
def test_every_rank_of_an_mp_cluster(nnodes, tp, pp):
    recipe = normalise({**RECIPE, "tensor_parallel_size": tp, "pipeline_parallel_size": pp})
    assert lint_parallel(recipe, nnodes) == []
    lines = [serve_argv(recipe, node(rank, nnodes), "/m") for rank in range(nnodes)]
    for rank, argv in enumerate(lines):
        assert unknown_flags(argv, FLAGS) == []
        assert argv[argv.index("--tensor-parallel-size") + 1] == str(tp)
        assert argv[argv.index("--pipeline-parallel-size") + 1] == str(pp)
        if nnodes == 1:
            assert not {"--nnodes", "--node-rank", "--master-addr", "--headless"} & set(argv)
            continue
        assert argv[argv.index("--nnodes") + 1] == str(nnodes)
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--master-addr") + 1] == "10.77.0.11"  # every rank meets the head
        assert ("--headless" in argv) == (rank > 0)
    # The engine options are the same on every rank; only the rank's place differs.
    engine = {tuple(argv[: argv.index("--distributed-executor-backend")]) for argv in lines}
    assert len(engine) == 1


@pytest.mark.parametrize("nnodes", [2, 3, 4])
def test_every_node_of_a_ray_cluster(nnodes):
    recipe = normalise(
        {
            **RECIPE,
            "executor_backend": "ray",
            "tensor_parallel_size": 1,
            "pipeline_parallel_size": nnodes,
        }
    )
    head = serve_argv(recipe, node(0, nnodes), "/m")
    assert unknown_flags(head, FLAGS) == []
    assert head[-2:] == ["--distributed-executor-backend", "ray"]
    assert head[head.index("--pipeline-parallel-size") + 1] == str(nnodes)
    assert ray_argv(recipe, node(0, nnodes))[-3:] == ["--head", "--port", "6379"]
    for rank in range(1, nnodes):
        assert serve_argv(recipe, node(rank, nnodes), "/m") is None  # workers run Ray only
        worker = ray_argv(recipe, node(rank, nnodes))
        assert worker[-2:] == ["--address", "10.77.0.11:6379"]
        assert worker[worker.index("--node-ip-address") + 1] == f"10.77.0.{11 + rank}"


def test_pipeline_parallel_size_is_a_choice_free_integer_flag_of_vllm_0_32_0():
    line = next(x for x in HELP.splitlines() if x.startswith("  --pipeline-parallel-size"))
    assert "PIPELINE_PARALLEL_SIZE" in line
    assert {"--pipeline-parallel-size", "--nnodes", "--node-rank", "--headless"} <= FLAGS


# --------------------------------------------------------------------------- the serve stage refuses


def _args(tmp_path: Path, rank: int, nnodes: int, config: dict | None, **recipe) -> dict:
    weights = tmp_path / "snapshot"
    weights.mkdir(exist_ok=True)
    if config is not None:
        (weights / "config.json").write_text(json.dumps(config))
    return {
        "recipe": {**RECIPE, **recipe},
        "node": {
            "host": HOSTS[rank],
            "rank": rank,
            "nnodes": nnodes,
            "head_address": "10.77.0.11",
            "address": f"10.77.0.{11 + rank}",
            "weights_path": str(weights),
        },
        "state": "staged",
        "path": str(tmp_path / "etc" / "serving.json"),
        "staging_dir": str(tmp_path / "etc" / "staging"),
        "unit_dir": str(tmp_path / "units"),
    }


TINY = {"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}


@pytest.mark.parametrize(
    ("nnodes", "config", "recipe", "refused"),
    [
        (3, {**TINY, "num_hidden_layers": 3}, {"pipeline_parallel_size": 3}, None),
        (3, TINY, {"pipeline_parallel_size": 3}, "exceeds the model's 2 layers"),
        (3, TINY, {"tensor_parallel_size": 3}, "does not divide the model's 4 attention heads"),
        (3, None, {"tensor_parallel_size": 3}, None),  # no config.json: heads unknown, not guessed
        (3, TINY, {"tensor_parallel_size": 2}, "cannot be spread evenly over the 3 nodes"),
        (4, TINY, {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, None),
        (
            2,
            TINY,
            {
                "tensor_parallel_size": 2,
                "pipeline_parallel_size": 2,
                "devices": ["nvidia.com/gpu=0"],
            },
            "the extra ranks find no GPU",
        ),
    ],
)
def test_serving_state_refuses_a_layout_that_cannot_start(
    tmp_path, nnodes, config, recipe, refused
):
    out = run_module(serving_state, _args(tmp_path, nnodes - 1, nnodes, config, **recipe))
    f27 = [p for p in out.result.get("problems", []) if p["id"] == "F27"]
    if refused is None:
        assert not out.failed, out.result["msg"]
        assert f27 == []
        return
    assert out.failed
    assert refused in out.result["msg"] and out.result["msg"].startswith("F27: vllm_recipe.")
    assert f27 and f27[0]["blocking"] is True
    assert not (tmp_path / "etc" / "staging").exists()  # nothing staged


def test_serving_state_reads_a_garbage_config_as_unknown(tmp_path):
    args = _args(tmp_path, 2, 3, None, tensor_parallel_size=3)
    Path(args["node"]["weights_path"], "config.json").write_text("{not json")
    assert not run_module(serving_state, args).failed


# --------------------------------------------------------------------------- the plan lints it too


@pytest.mark.parametrize(
    ("nodes", "recipe", "expected"),
    [
        (None, {"tensor_parallel_size": 2}, []),  # the node count unknown: not linted
        (2, {"tensor_parallel_size": 2}, []),
        (3, {"tensor_parallel_size": 2}, [("F27", "error")]),
        (3, {"tensor_parallel_size": 1, "pipeline_parallel_size": 3}, []),
        (4, {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, []),
    ],
)
def test_the_plan_lints_the_layout_against_the_node_count(nodes, recipe, expected):
    args = {
        "recipe": {**RECIPE, **recipe, "max_model_len": "plan"},
        "observations": [
            {
                "max_model_len": 4096,
                "kv_tokens": 4194304,
                "kv_memory_gib": 1.0,
                "host": "spark-head",
            }
        ],
        "min_concurrency": 2,
    }
    if nodes is not None:
        args["nodes"] = nodes
    out = run_module(kv_budget, args)
    assert not out.failed, out.result
    found = [(v["id"], v["severity"]) for v in out.result["violations"] if v["id"] == "F27"]
    assert found == expected
    assert out.result["feasible"] is (not expected)
