# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stack lockfile's judgement (module_utils/upgrade/_stack_lock.py) from case tables.

``test_stack_lock.yaml`` holds the cases: two stacks -> the human diff lines; a
lockfile read back -> the entries kept and the findings; a sequence of records
-> the history after rotation; a history -> what ``--tags revert`` does.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import recipe_hash
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade import _stack_lock as lock

HERE = Path(__file__).resolve().parent
CASES = yaml.safe_load((HERE / "test_stack_lock.yaml").read_text())
WHERE = "/etc/localinference/stack.lock.json"


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path; None deletes the key, the string ``(null)`` sets None."""
    *parents, last = path.split(".")
    node = tree
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    elif value == "(null)":
        node[last] = None
    elif value is None and last in node:
        del node[last]
    else:
        node[last] = value


def nodes(patch: dict[str, Any] | None = None) -> dict[str, Any]:
    """The base stack with dotted-path changes; every recipe hash follows its recipe."""
    out = copy.deepcopy(CASES["base"])
    for path, value in (patch or {}).items():
        if isinstance(value, dict) and "copy" in value:
            value = {
                **copy.deepcopy(out[value["copy"]]),
                **{k: v for k, v in value.items() if k != "copy"},
            }
        _set(out, path, value)
    for record in out.values():
        record["recipe_hash"] = recipe_hash(record["recipe"])
    return out


def entry(patch: dict[str, Any] | None = None, at: int = 0) -> dict[str, Any]:
    return lock.build_entry(nodes(patch), f"2025-11-29T11:{at:02d}:00Z")


# --------------------------------------------------------------------------- diff lines


@pytest.mark.parametrize("case", CASES["diff"], ids=[c["name"] for c in CASES["diff"]])
def test_diff_lines(case):
    lines = lock.diff_entries(entry(case.get("old")), entry(case["new"]))
    if "lines" in case:
        assert lines == case["lines"]
    else:
        assert len(lines) == len(case["lines_match"]), lines
        for line, pattern in zip(lines, case["lines_match"], strict=True):
            assert re.search(pattern, line), (pattern, line)


def test_diff_of_one_node_names_no_node():
    old = entry({"spark-worker": None})
    new = entry({"spark-worker": None, "spark-head.kernel": "6.9"})
    assert lock.diff_entries(old, new) == ["kernel: 6.8.0-49-generic -> 6.9"]


def test_diff_is_capped():
    old = entry()
    patch = {f"spark-head.recipe.key_{i:03d}": i for i in range(100)}
    patch.update({f"spark-worker.recipe.key_{i:03d}": i for i in range(100)})
    lines = lock.diff_entries(old, entry(patch))
    assert len(lines) == lock.MAX_LINES
    assert lines[-1] == f"... and {101 - lock.MAX_LINES + 1} more differences"


# --------------------------------------------------------------------------- schema


def _good_text() -> str:
    return lock.render([entry({"spark-worker.kernel": "6.9"}, 1), entry({}, 0)])


@pytest.mark.parametrize("case", CASES["schema"], ids=[c["name"] for c in CASES["schema"]])
def test_schema_check(case):
    if "bytes_hex" in case:
        text: str | bytes = bytes.fromhex(case["bytes_hex"])
    elif "text" in case:
        text = case["text"]
    else:
        document = json.loads(_good_text()) if case["document"] == "good" else case["document"]
        for path, value in (case.get("patch") or {}).items():
            _set(document, path, value)
        text = json.dumps(document)
    entries, findings = lock.check_document(text, WHERE)
    assert len(entries) == case["entries_kept"]
    messages = " | ".join(f["message"] for f in findings)
    for expected in case["findings"]:
        assert expected in messages, messages
    if not case["findings"]:
        assert findings == []
    for item in findings:
        assert item["id"] == "stack_lock" and item["severity"] == "error"
        assert WHERE in item["message"] and "move" in item["fix"]


def test_missing_file_has_no_entries_and_no_finding():
    assert lock.check_document(None, WHERE) == ([], [])


def test_render_reads_back_unchanged():
    text = _good_text()
    entries, findings = lock.check_document(text, WHERE)
    assert findings == [] and lock.render(entries) == text


# --------------------------------------------------------------------------- history


@pytest.mark.parametrize("case", CASES["history"], ids=[c["name"] for c in CASES["history"]])
def test_history_rotation_and_same_stack(case):
    stacks = [entry(patch, at) for at, patch in enumerate(case["history"])]
    entries: list[dict[str, Any]] = []
    added = []
    for stack in stacks:
        result = lock.record(entries, stack, case["keep"])
        entries = result["entries"]
        added.append(result["added"])
        if not result["added"]:
            assert result["changes"] == [] and result["entry"] is entries[0]
    assert added == case["added"]
    assert [e["recorded_at"] for e in entries] == [
        stacks[i]["recorded_at"] for i in case["expected"]
    ]


def test_record_reports_changes_and_last_good():
    first, second = entry({}, 0), entry({"spark-worker.kernel": "6.9"}, 1)
    result = lock.record([first], second)
    assert result["added"] and result["last_good"] is first
    assert result["changes"] == ["spark-worker kernel: 6.8.0-49-generic -> 6.9"]
    again = lock.record(result["entries"], entry({"spark-worker.kernel": "6.9"}, 2))
    assert not again["added"] and again["entry"]["recorded_at"] == second["recorded_at"]
    assert again["last_good"] is first


def test_same_stack_renders_the_same_bytes():
    entries = lock.record([], entry({}, 0))["entries"]
    again = lock.record(entries, entry({}, 5))["entries"]
    assert lock.render(again) == lock.render(entries)


@pytest.mark.parametrize("keep", [0, -1, lock.MAX_KEEP + 1, True, "3"])
def test_keep_is_checked(keep):
    with pytest.raises(lock.StackLockError, match="keep must be an integer"):
        lock.record([], entry(), keep)


# --------------------------------------------------------------------------- build_entry


def test_stack_hash_ignores_the_timestamp():
    assert entry({}, 0)["stack_hash"] == entry({}, 9)["stack_hash"]
    assert entry({}, 0)["stack_hash"] != entry({"spark-head.kernel": "x"}, 0)["stack_hash"]


def test_a_node_without_the_version_takes_it_from_a_node_with_the_same_image():
    stack = nodes({"spark-worker.vllm_version": "(null)"})
    stack["spark-head"]["nccl_version"] = "2.21.5"
    built = lock.build_entry(stack, "t")
    assert built["nodes"]["spark-worker"]["vllm_version"] == "0.32.0"
    assert built["nodes"]["spark-worker"]["nccl_version"] == "2.21.5"


def test_a_node_with_another_image_borrows_nothing():
    other = "localhost/other@sha256:" + "b" * 64
    stack = nodes(
        {
            "spark-worker.vllm_version": "(null)",
            "spark-worker.image": other,
            "spark-worker.image_digest": "sha256:" + "b" * 64,
        }
    )
    assert lock.build_entry(stack, "t")["nodes"]["spark-worker"]["vllm_version"] is None


BAD_NODES = [
    ("not a mapping", [], "nodes must map"),
    ("empty", {}, "nodes must map"),
    ("bad host", {"a b": {}}, "is not an inventory host name"),
    ("missing keys", {"h": {"rank": 0}}, "nodes.h lacks deploy_mode"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD_NODES, ids=[b[0] for b in BAD_NODES])
def test_build_entry_refuses_bad_records(name, value, message):
    with pytest.raises(lock.StackLockError, match=re.escape(message)):
        lock.build_entry(value, "t")


def test_two_nodes_with_one_rank_are_refused():
    stack = nodes({"spark-worker.rank": 0})
    with pytest.raises(lock.StackLockError, match="same rank"):
        lock.build_entry(stack, "t")


# --------------------------------------------------------------------------- revert


@pytest.mark.parametrize("case", CASES["revert"], ids=[c["name"] for c in CASES["revert"]])
def test_revert(case):
    stacks = [entry(patch, at) for at, patch in enumerate(case["history"])]
    entries: list[dict[str, Any]] = []
    for stack in stacks:
        entries = lock.record(entries, stack)["entries"]
    findings = [
        lock.finding("stack_lock", "error", f"{WHERE} {message}", "move it")
        for message in case.get("findings", [])
    ]
    plan = lock.revert_plan(entries, findings, WHERE)
    assert plan["possible"] is case["possible"], plan["reason"]
    if case["possible"]:
        target = stacks[case["target"]]
        head = target["nodes"]["spark-head"]
        assert plan["recipe"] == head["recipe"] and plan["recipe_hash"] == head["recipe_hash"]
        assert plan["recorded_at"] == target["recorded_at"]
        for line, pattern in zip(plan["changes"], case["changes_match"], strict=True):
            assert re.search(pattern, line), (pattern, line)
    else:
        assert case["reason"] in plan["reason"] and plan["recipe"] is None
        if "reason_also" in case:
            assert case["reason_also"] in plan["reason"]
