# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""stack_lock end to end: a node made of temporary files and stand-in commands.

``gathered`` reads a serving.json, a weights manifest, a sysfs tree and the
outputs of podman, systemctl, journalctl, nvidia-smi and ethtool (scripts
printing recorded outputs); ``recorded``/``diffed``/``read`` work on a
lockfile in a temporary directory.
"""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from unittest import mock

import pytest
from ansible.module_utils import basic
from ansible_collections.localinference.vllm.plugins.module_utils.common._manifest_file import (
    MANIFEST_FORMAT,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    normalise,
    recipe_hash,
)
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade import _stack_lock as lock
from ansible_collections.localinference.vllm.plugins.modules import stack_lock
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = ROOT / "tests" / "unit" / "fixtures"
REVISION = "5eed0c0ffee0000000000000000000000000000a"
IMAGE = "localhost/localinference-vllm-cpu@sha256:" + "6f" * 32
INVOCATION = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8"
RAW_RECIPE = {
    "model": "localinference/tiny-deepseek",
    "revision": REVISION,
    "served_model_name": "localinference/tiny-deepseek",
    "image": IMAGE,
    "entrypoint": "/opt/vllm/bin/vllm",
    "tensor_parallel_size": 2,
    "max_model_len": "plan",
    "max_num_seqs": 4,
}
ETHTOOL_MLX5 = (
    "driver: mlx5_core\nversion: 24.10-1.1.4\nfirmware-version: 28.45.1020 (MT_0000000910)\n"
    "expansion-rom-version: \nbus-info: 0000:01:00.0\n"
)


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


class Node:
    """A node's files and commands under ``tmp_path``."""

    def __init__(self, tmp_path: Path, max_num_seqs: int = 4) -> None:
        self.root = tmp_path
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.recipe = normalise({**RAW_RECIPE, "max_num_seqs": max_num_seqs}, 65536)
        self.state = tmp_path / "serving.json"
        self.write_state(0)
        repo = tmp_path / "hub" / "models--localinference--tiny-deepseek"
        self.snapshot = repo / "snapshots" / REVISION
        self.snapshot.mkdir(parents=True)
        manifests = repo / "localinference-manifests"
        manifests.mkdir()
        files = [{"path": "config.json", "size": 10, "mtime_ns": 1, "sha256": "ab" * 32}]
        (manifests / f"{REVISION}.json").write_text(
            json.dumps({"format": MANIFEST_FORMAT, "files": files})
        )
        self.sys = tmp_path / "sys"
        (self.sys / "class" / "net" / "enp1s0f0np0").mkdir(parents=True)
        hca = self.sys / "class" / "infiniband" / "rocep1s0f0"
        hca.mkdir(parents=True)
        (hca / "fw_ver").write_text("28.45.1020\n")
        self.calls = tmp_path / "calls"
        bins = tmp_path / "bin"
        bins.mkdir()
        inspect = json.dumps(
            [
                {
                    "Id": "0b" * 32,
                    "Digest": "sha256:" + "6f" * 32,
                    "Config": {"Env": ["NCCL_VERSION=2.21.5-1"]},
                }
            ]
        )
        log = FIXTURES / "vllm-logs" / "real-cpu-tp2-mp-head-kv1g-len4096.log"
        record = f'echo "$(basename "$0") $*" >> {self.calls}\n'
        self.bins = {
            "podman": _script(
                bins / "podman",
                record
                + 'case "$1 $2" in\n'
                + f"  'image inspect') echo '{inspect}' ;;\n"
                + "  'run --rm') echo 'INFO noise'; echo 0.32.0 ;;\n"
                + "  *) exit 9 ;;\nesac\n",
            ),
            "systemctl": _script(bins / "systemctl", record + f"echo {INVOCATION}\n"),
            "journalctl": _script(bins / "journalctl", record + f"cat {log}\n"),
            "nvidia-smi": _script(
                bins / "nvidia-smi", record + f"cat {FIXTURES}/nvidia-smi/gb10-table.txt\n"
            ),
            "ethtool": _script(bins / "ethtool", record + f"printf '{ETHTOOL_MLX5}'\n"),
        }

    def write_state(self, rank: int) -> None:
        document = {
            "schema": 1,
            "recipe_hash": recipe_hash(self.recipe),
            "recipe": self.recipe,
            "node": {"host": "spark-head", "rank": rank},
            "environment": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "NCCL_IB_HCA": "rocep1s0f0"},
        }
        self.state.write_text(json.dumps(document))

    def ran(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def gather(self, check_mode: bool = False, **args):
        params = {
            "state": "gathered",
            "state_path": str(self.state),
            "weights_path": str(self.snapshot),
            "sys_root": str(self.sys),
            **args,
        }
        bins = self.bins

        def get_bin_path(self, name, required=False, opt_dirs=None):
            return bins.get(name)

        warned: list[str] = []
        with (
            mock.patch.object(basic.AnsibleModule, "get_bin_path", get_bin_path),
            mock.patch.object(basic.AnsibleModule, "warn", lambda self, msg: warned.append(msg)),
        ):
            out = run_module(stack_lock, params, check_mode=check_mode)
        out.result["warned"] = warned
        return out


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_gathered_reads_every_part_of_the_stack(node):
    out = node.gather(read_log=True)
    assert not out.failed, out.result
    record = out.result["node"]
    assert out.result["changed"] is False
    assert lock.node_problems(record) == []
    assert record["rank"] == 0 and record["recipe"] == node.recipe
    assert record["recipe_hash"] == recipe_hash(node.recipe)
    assert record["image"] == IMAGE and record["image_digest"] == "sha256:" + "6f" * 32
    assert record["image_id"] == "0b" * 32
    assert record["vllm_version"] == "0.32.0"
    assert out.result["sources"] == {"vllm_version": "journal", "nccl_version": "image env"}
    assert record["nccl_version"] == "2.21.5"
    assert record["driver_version"] == "580.173.02" and record["cuda_version"] == "13.0"
    assert record["gpus"] == ["NVIDIA GB10"]
    assert record["nics"] == {"enp1s0f0np0": "28.45.1020 (MT_0000000910)"}
    assert record["hcas"] == {"rocep1s0f0": "28.45.1020"}
    assert record["model"] == "localinference/tiny-deepseek" and record["revision"] == REVISION
    assert len(record["manifest_digest"]) == 64
    assert (
        f"journalctl --unit localinference-vllm.service _SYSTEMD_INVOCATION_ID={INVOCATION} --output cat --no-pager --lines 20000"
        in node.ran()
    )
    assert not any(call.startswith("podman run") for call in node.ran())


def test_the_boot_log_option_wins_and_no_log_is_read_by_default(node):
    out = node.gather(vllm_version="0.32.0")
    assert out.result["sources"]["vllm_version"] == "boot log"
    assert not any(call.startswith(("journalctl", "systemctl")) for call in node.ran())


def test_the_previous_record_of_the_same_image_is_reused_before_asking_the_image(node):
    first = node.gather(vllm_version="0.31.9").result["node"]
    out = node.gather(previous=first, query_image=True)
    assert out.result["node"]["vllm_version"] == "0.31.9"
    assert out.result["sources"]["vllm_version"] == "last good stack"
    assert not any(call.startswith("podman run") for call in node.ran())


def test_the_image_is_asked_last_and_only_when_allowed(node):
    assert node.gather().result["node"]["vllm_version"] is None
    out = node.gather(query_image=True)
    assert out.result["node"]["vllm_version"] == "0.32.0"
    assert out.result["sources"]["vllm_version"] == "image"
    assert (
        f"podman run --rm --pull=never --network=none --entrypoint /opt/vllm/bin/vllm {IMAGE} --version"
        in node.ran()
    )


def test_a_hung_command_is_cut_short_and_leaves_null(node):
    node.bins["nvidia-smi"] = _script(node.root / "bin" / "slow-smi", "sleep 30\n")
    started = time.monotonic()
    out = node.gather(timeout=0.5)
    assert time.monotonic() - started < 10
    assert not out.failed, out.result
    assert out.result["node"]["driver_version"] is None and out.result["node"]["gpus"] == []
    assert any("did not answer within 0.5 s" in w for w in out.result["warned"])


def test_missing_commands_and_files_leave_nulls(node):
    node.bins = {}
    out = node.gather(weights_path="", sys_root=str(node.root / "nosys"))
    record = out.result["node"]
    assert not out.failed, out.result
    assert record["image_id"] is None and record["driver_version"] is None
    assert record["manifest_digest"] is None and record["nics"] == {} and record["hcas"] == {}
    assert record["image_digest"] == "sha256:" + "6f" * 32  # from the reference itself


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist: nothing serves here"),
        ("{oops", "not valid JSON"),
        (
            '{"schema": 1, "recipe": {"a": 1}, "recipe_hash": "'
            + "0" * 64
            + '", "node": {"rank": 0}}',
            "does not hash",
        ),
        ("[]", "has no recipe"),
    ],
)
def test_a_node_without_a_good_serving_state_is_refused(node, content, message):
    if content is None:
        node.state.unlink()
    else:
        node.state.write_text(content)
    out = node.gather()
    assert out.failed and message in out.result["msg"] and "state_path" in out.result["msg"]
    assert "run the rollout" in out.result["msg"]


def test_a_bad_timeout_is_named():
    out = run_module(stack_lock, {"state": "read", "timeout": -1})
    assert out.failed and "timeout must be a positive" in out.result["msg"]


# --------------------------------------------------------------------------- the lockfile


def two_nodes(node: Node, **changes) -> dict:
    head = node.gather(vllm_version="0.32.0").result["node"]
    worker = {**head, "rank": 1, "vllm_version": None, **changes}
    return {"spark-head": head, "spark-worker": worker}


def call(path: Path, state: str, check_mode: bool = False, **args):
    return run_module(
        stack_lock, {"state": state, "path": str(path), **args}, check_mode=check_mode
    )


def test_record_twice_is_one_entry_and_no_change(node):
    path = node.root / "etc" / "stack.lock.json"
    stack = two_nodes(node)
    first = call(path, "recorded", nodes=stack)
    assert first.result["changed"] and path.exists()
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert first.result["changes"] == [] and first.result["last_good"] is None
    assert first.result["entry"]["nodes"]["spark-worker"]["vllm_version"] == "0.32.0"
    text = path.read_text()
    again = call(path, "recorded", nodes=stack)
    assert not again.result["changed"] and path.read_text() == text
    assert len(json.loads(text)["entries"]) == 1


def test_a_changed_stack_prints_what_changed_and_read_offers_the_revert(tmp_path):
    old, new = Node(tmp_path / "a"), Node(tmp_path / "b", max_num_seqs=8)
    path = tmp_path / "stack.lock.json"
    call(path, "recorded", nodes=two_nodes(old))
    out = call(path, "recorded", nodes=two_nodes(new))
    assert out.result["changed"]
    assert "recipe.max_num_seqs: 4 -> 8" in out.result["changes"]
    assert out.result["last_good"]["nodes"]["spark-head"]["recipe"] == old.recipe
    read = call(path, "read")
    assert read.result["found"] and len(read.result["entries"]) == 2
    assert "recipe.max_num_seqs: 4 -> 8" in read.result["changes"]
    revert = read.result["revert"]
    assert revert["possible"] and revert["recipe"] == old.recipe
    assert revert["recipe_hash"] == recipe_hash(old.recipe)
    assert "recipe.max_num_seqs: 8 -> 4" in revert["changes"]


def test_check_mode_writes_nothing_and_diff_shows_the_file(node):
    path = node.root / "stack.lock.json"
    out = run_module(
        stack_lock,
        {"state": "recorded", "path": str(path), "nodes": two_nodes(node), "_ansible_diff": True},
        check_mode=True,
    )
    assert out.result["changed"] and not path.exists()
    assert '"stack_hash"' in out.result["diff"]["after"]


def test_diffed_changes_nothing(tmp_path):
    old, new = Node(tmp_path / "a"), Node(tmp_path / "b", max_num_seqs=8)
    path = tmp_path / "stack.lock.json"
    call(path, "recorded", nodes=two_nodes(old))
    text = path.read_text()
    out = call(path, "diffed", nodes=two_nodes(new))
    assert not out.result["changed"] and path.read_text() == text
    assert "recipe.max_num_seqs: 4 -> 8" in out.result["changes"]
    assert call(path, "diffed").result["changes"] == []


def test_a_malformed_lockfile_is_a_finding_kept_aside_and_replaced(node):
    path = node.root / "stack.lock.json"
    path.write_text("{oops")
    read = call(path, "read")
    assert not read.failed
    assert read.result["findings"][0]["id"] == "stack_lock"
    assert "not valid JSON" in read.result["findings"][0]["message"]
    assert not read.result["revert"]["possible"]
    assert "refusing to revert" in read.result["revert"]["reason"]
    out = call(path, "recorded", nodes=two_nodes(node))
    assert out.result["changed"] and out.result["findings"]
    assert (node.root / "stack.lock.json.malformed").read_text() == "{oops"
    assert lock.check_document(path.read_text(), str(path))[1] == []


def test_a_directory_where_the_lockfile_belongs_is_a_finding(tmp_path):
    path = tmp_path / "stack.lock.json"
    path.mkdir()
    out = call(path, "read")
    assert not out.failed and "is a directory" in out.result["findings"][0]["message"]


def test_no_lockfile_reads_empty_and_refuses_the_revert(tmp_path):
    out = call(tmp_path / "none.json", "read")
    assert not out.failed and out.result["found"] is False and out.result["entry"] is None
    assert "nothing to revert to" in out.result["revert"]["reason"]


def test_recorded_needs_nodes_and_names_bad_ones(tmp_path):
    out = call(tmp_path / "l.json", "recorded")
    assert out.failed and "nodes is required" in out.result["msg"]
    out = call(tmp_path / "l.json", "recorded", nodes={"spark-head": {"rank": 0}})
    assert out.failed and "nodes.spark-head lacks" in out.result["msg"]


def test_keep_rotates(tmp_path):
    path = tmp_path / "stack.lock.json"
    for seqs in (1, 2, 3):
        call(
            path, "recorded", nodes=two_nodes(Node(tmp_path / str(seqs), max_num_seqs=seqs)), keep=2
        )
    entries = json.loads(path.read_text())["entries"]
    assert [e["nodes"]["spark-head"]["recipe"]["max_num_seqs"] for e in entries] == [3, 2]
