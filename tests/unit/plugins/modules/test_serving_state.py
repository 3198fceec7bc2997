# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.modules import serving_state
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

HELP = Path(__file__).parents[2] / "fixtures" / "vllm-0.32.0" / "serve-help-all.txt"
REV = "5eed0c0ffee0000000000000000000000000000a"
RECIPE = {
    "model": "localinference/tiny-deepseek",
    "revision": REV,
    "image": "localhost/localinference-vllm-cpu@sha256:" + "ab" * 32,
    "tensor_parallel_size": 2,
    "max_model_len": "plan",
    "reasoning_parser": "deepseek_r1",
}


def args(paths, state, rank=1, **recipe):
    return {
        "recipe": {**RECIPE, **recipe},
        "plan_max_model_len": 4096,
        "node": {
            "host": "spark-worker",
            "rank": rank,
            "nnodes": 2,
            "head_address": "10.77.0.11",
            "address": "10.77.0.12",
            "env": {"VLLM_HOST_IP": "10.77.0.12", "GLOO_SOCKET_IFNAME": "enp1s0f0np0"},
            "weights_path": f"/srv/models/hub/models--localinference--tiny-deepseek/snapshots/{REV}",
        },
        "state": state,
        "help_text": str(HELP),
        **paths,
    }


def test_staged_writes_only_staging_and_reports_live_mismatch(paths):
    out = run_module(serving_state, args(paths, "staged"))
    assert not out.failed, out.result
    assert out.result["changed"] is True
    assert out.result["live_matches"] is False
    assert out.result["differences"] == [
        "serving.json: missing on the node (never rolled out, or removed)"
    ]
    assert Path(paths["staging_dir"], "units", "localinference-vllm.container").exists()
    assert not Path(paths["path"]).exists() and not Path(paths["unit_dir"]).exists()
    assert out.result["recipe"]["max_model_len"] == 4096
    assert out.result["server_argv"][-1] == "--headless"
    again = run_module(serving_state, args(paths, "staged"))
    assert again.result["changed"] is False


def test_present_then_verified_then_noop(paths):
    first = run_module(serving_state, args(paths, "present"))
    assert first.result["changed"] is True
    doc = json.loads(Path(paths["path"]).read_text())
    assert doc["recipe_hash"] == first.result["recipe_hash"]
    unit = Path(paths["unit_dir"], "localinference-vllm.container").read_text()
    assert first.result["recipe_hash"] in unit
    assert run_module(serving_state, args(paths, "verified")).failed is False
    assert run_module(serving_state, args(paths, "present")).result["changed"] is False
    staged = run_module(serving_state, args(paths, "staged"))
    assert staged.result["live_matches"] is True


def test_check_mode_predicts_without_writing(paths):
    out = run_module(serving_state, args(paths, "present"), check_mode=True)
    assert out.result["changed"] is True
    assert not Path(paths["path"]).exists()


def test_edited_state_file_is_caught_by_verify_f10(paths):
    run_module(serving_state, args(paths, "present"))
    doc = json.loads(Path(paths["path"]).read_text())
    doc["recipe"]["max_model_len"] = 8192  # someone edited the reconciled registry by hand
    Path(paths["path"]).write_text(json.dumps(doc))
    out = run_module(serving_state, args(paths, "verified"))
    assert out.failed
    assert "F10" in out.result["msg"]
    assert "recipe.max_model_len: node has 8192, inventory asks 4096" in out.result["msg"]


def test_inventory_change_is_caught_by_verify_before_update(paths):
    run_module(serving_state, args(paths, "present"))
    out = run_module(serving_state, args(paths, "verified", max_num_seqs=4))
    assert out.failed
    assert 'recipe.max_num_seqs: node has "<absent>", inventory asks 4' in out.result["msg"]


def test_edited_unit_file_is_caught(paths):
    run_module(serving_state, args(paths, "present"))
    unit = Path(paths["unit_dir"], "localinference-vllm.container")
    unit.write_text(unit.read_text().replace("--max-model-len 4096", "--max-model-len 8192"))
    out = run_module(serving_state, args(paths, "verified"))
    assert out.failed
    assert "edited on the node" in out.result["msg"]


def test_update_keeps_previous_recipe_for_rollback_and_prunes_units(paths):
    first = run_module(serving_state, args(paths, "present", executor_backend="ray", rank=0))
    assert Path(paths["unit_dir"], "localinference-ray.container").exists()
    second = run_module(serving_state, args(paths, "present", max_model_len=2048, rank=0))
    assert second.result["previous_hash"] == first.result["recipe_hash"]
    assert second.result["previous_recipe"]["executor_backend"] == "ray"
    assert not Path(paths["unit_dir"], "localinference-ray.container").exists()
    rollback = run_module(
        serving_state,
        {**args(paths, "present", rank=0), "recipe": second.result["previous_recipe"]},
    )
    assert rollback.result["recipe_hash"] == first.result["recipe_hash"]


def test_absent_removes_units_keeps_document(paths):
    run_module(serving_state, args(paths, "present"))
    out = run_module(serving_state, args(paths, "absent"))
    assert out.result["changed"] is True
    assert not Path(paths["unit_dir"], "localinference-vllm.container").exists()
    assert Path(paths["path"]).exists()
    assert run_module(serving_state, args(paths, "absent")).result["changed"] is False


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        (
            {"extra_args": ["--kv-cache-memory=4"]},
            "flags this vLLM release does not have: --kv-cache-memory",
        ),
        ({"ipc_host": True, "shm_size": "1g"}, "F14: ipc_host with shm_size"),
        ({"podman_args": ["--privileged"]}, "F17: --privileged"),
        ({"revision": "main"}, "vllm_recipe.revision"),
    ],
)
def test_refusals(paths, recipe, message):
    out = run_module(serving_state, args(paths, "staged", **recipe))
    assert out.failed
    assert message in out.result["msg"]
    assert not Path(paths["staging_dir"]).exists()


def test_rank_outside_cluster(paths):
    out = run_module(serving_state, args(paths, "staged", rank=2))
    assert out.failed and "node.rank 2" in out.result["msg"]


def test_clean_node_has_no_findings_and_a_diff(paths):
    run_module(serving_state, args(paths, "present"))
    out = run_module(serving_state, {**args(paths, "staged"), "_ansible_diff": True})
    assert out.result["live_findings"] == []
    assert out.result["live_matches"] is True
    assert out.result["diff"]["before"] == out.result["diff"]["after"]


def test_malformed_state_document_is_an_f10_difference_not_a_traceback(paths):
    Path(paths["path"]).parent.mkdir(parents=True)
    Path(paths["path"]).write_text('{"units": "all of /etc"}')
    out = run_module(serving_state, args(paths, "verified"))
    assert out.failed and "F10" in out.result["msg"]
    assert (
        "serving.json: units: a string where a list of unit records was expected"
        in (out.result["differences"])
    )
    assert [f["id"] for f in out.result["live_findings"]] == ["F10"] * len(
        out.result["live_findings"]
    )


def with_weights(arguments: dict, digest: str) -> dict:
    return {**arguments, "node": {**arguments["node"], "weights_digest": digest}}


def test_new_weights_under_the_same_path_are_a_difference(paths):
    old, new = "a" * 64, "b" * 64
    run_module(serving_state, with_weights(args(paths, "present"), old))
    same = run_module(serving_state, with_weights(args(paths, "staged"), old))
    assert same.result["live_matches"] is True
    staged = run_module(serving_state, with_weights(args(paths, "staged"), new))
    assert staged.result["live_matches"] is False
    assert staged.result["differences"] == [f'node.weights_digest: node has "{old}", inventory asks "{new}"']


@pytest.mark.parametrize("digest", ["abc", "A" * 64, "a" * 63 + "\n", 7])
def test_a_weights_digest_that_is_not_a_sha256_is_refused(paths, digest):
    out = run_module(serving_state, with_weights(args(paths, "staged"), digest))
    assert out.failed
    assert "node.weights_digest" in out.result["msg"], out.result["msg"]
