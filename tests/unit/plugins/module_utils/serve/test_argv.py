# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The command lines of a node (module_utils/serve/_argv.py) against vLLM 0.32.0's own flags."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import normalise
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import (
    Node,
    make_node,
    option_flags,
    parse_help_flags,
    ray_argv,
    serve_argv,
    unknown_flags,
)

from ..common.test_recipe import FULL, REV

HELP = (Path(__file__).parents[3] / "fixtures" / "vllm-0.32.0" / "serve-help-all.txt").read_text()
FLAGS = parse_help_flags(HELP)


def node(rank: int, nnodes: int = 2) -> Node:
    return Node(
        host=f"spark-{rank}",
        rank=rank,
        nnodes=nnodes,
        head_address="10.77.0.11",
        address=f"10.77.0.1{rank + 1}",
        env={"VLLM_HOST_IP": f"10.77.0.1{rank + 1}", "GLOO_SOCKET_IFNAME": "enp1s0f0np0"},
        weights_path="/srv/models/hub/models--x--y/snapshots/" + REV,
    )


def test_help_fixture_parses_known_flags():
    assert {
        "--max-model-len",
        "--headless",
        "--nnodes",
        "--no-enforce-eager",
        "--master-addr",
    } <= FLAGS
    assert "--json-arg" not in FLAGS  # footer examples are not options


@pytest.mark.parametrize("backend", ["mp", "ray"])
@pytest.mark.parametrize("nnodes", [1, 2])
def test_every_rendered_flag_exists_in_vllm_0_32_0(backend, nnodes):
    recipe = normalise({**FULL, "executor_backend": backend})
    for rank in range(nnodes):
        argv = serve_argv(recipe, node(rank, nnodes), "/models/snapshots/" + REV)
        if argv is None:
            assert backend == "ray" and rank > 0
            continue
        assert unknown_flags(argv, FLAGS) == []


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--tool-call-parser", "deepseek_v4"),
        ("--kv-cache-dtype", "fp8"),
        ("--distributed-executor-backend", "'ray'"),
    ],
)
def test_rendered_choice_values_exist(flag, value):
    line = next(line for line in HELP.splitlines() if line.startswith(f"  {flag} "))
    assert value in re.split(r"[{},\[\] ]+", line)


def test_mp_command_lines_head_and_headless_worker():
    recipe = normalise({**FULL, "extra_args": [], "executor_backend": "mp"})
    head = serve_argv(recipe, node(0), "/m")
    worker = serve_argv(recipe, node(1), "/m")
    tail = ["--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank"]
    assert head[:2] == ["serve", "/m"]
    assert head[-8:] == [*tail, "0", "--master-addr", "10.77.0.11"]
    assert worker[-9:] == [*tail, "1", "--master-addr", "10.77.0.11", "--headless"]
    assert "--headless" not in head
    assert head[: len(head) - 8] == worker[: len(worker) - 9]  # same engine options on every rank
    assert ray_argv(recipe, node(0)) is None


def test_ray_command_lines():
    recipe = normalise({**FULL, "executor_backend": "ray", "extra_args": []})
    head = serve_argv(recipe, node(0), "/m")
    assert head[-2:] == ["--distributed-executor-backend", "ray"]
    assert "--nnodes" not in head and "--master-addr" not in head
    assert serve_argv(recipe, node(1), "/m") is None  # workers run Ray only
    assert ray_argv(recipe, node(0)) == [
        "start", "--block", "--disable-usage-stats", "--node-ip-address", "10.77.0.11", "--head", "--port", "6379",
    ]  # fmt: skip
    assert ray_argv(recipe, node(1))[-2:] == ["--address", "10.77.0.11:6379"]
    assert ray_argv(recipe, node(0, nnodes=1)) is None


def test_single_node_mp_has_no_multinode_flags():
    argv = serve_argv(normalise(FULL), node(0, nnodes=1), "/m")
    assert not {"--nnodes", "--node-rank", "--master-addr", "--headless"} & set(argv)


def test_option_flags_forms():
    assert option_flags({"enable_auto_tool_choice": True, "enforce_eager": False}) == [
        "--enable-auto-tool-choice",
        "--no-enforce-eager",
    ]
    assert option_flags({"speculative_config": {"num_speculative_tokens": 5, "method": "mtp"}}) == [
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":5}',
    ]
    assert option_flags({"served_model_name": ["a", "b"]}) == ["--served-model-name", "a", "b"]


def test_unknown_flag_is_reported():
    recipe = normalise({**FULL, "kv_cache_memory": 4, "extra_args": ["--no-such-flag=1"]})
    argv = serve_argv(recipe, node(0), "/m")
    assert unknown_flags(argv, FLAGS) == ["--kv-cache-memory", "--no-such-flag"]


def test_make_node_validates_every_field():
    made = make_node(
        {
            "host": "spark-head",
            "rank": "1",
            "nnodes": 2,
            "head_address": "10.77.0.11",
            "address": "",
            "env": {
                "VLLM_HOST_IP": "10.77.0.12",
                "EMPTY": "",
                "NONE": None,
                "NCCL_IB_HCA": "mlx5_0,mlx5_1",
            },
            "weights_path": "/srv/models/hub/models--x--y/snapshots/" + REV + "/",
        }
    )
    assert made == Node(
        "spark-head", 1, 2, "10.77.0.11", "",
        {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "VLLM_HOST_IP": "10.77.0.12"},
        "/srv/models/hub/models--x--y/snapshots/" + REV,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"host": "a\nb"}, r"^node\.host: contains '\\n' \(a line break\) at position 1"),
        ({"weights_path": "/srv/../etc"}, r"^node\.weights_path: .*contains '\.\.'"),
        ({"env": {"A": "1\n2"}}, r"^node\.env\.A: contains '\\n'"),
        ({"env": "A=1"}, r"^node\.env: expected a dict"),
        ({"nnodes": 0}, r"^node\.nnodes: 0 is below 1"),
        ({"head_address": None}, r"^node\.head_address: expected text, got NoneType"),
    ],
)
def test_make_node_refusals_name_the_field(change, message):
    params = {
        "host": "h", "rank": 0, "nnodes": 1, "head_address": "10.0.0.1", "weights_path": "/m",
    }  # fmt: skip
    with pytest.raises(ValidationError, match=message):
        make_node({**params, **change})
