# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""stage_result watch_recorded and prove_commands: the site's one call per node (playbooks/site.yml).

A whole run records what every stage left on the node (files, commands) with
``watch_recorded``; the next run, which knows only its fingerprint, checks the
recorded lists and proves the link with commands that must exit 0. The
commands here run for real (cat, sh).
"""

from __future__ import annotations

import json

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    StageResultError,
    merge_watch,
    recorded_watch,
)
from ansible_collections.localinference.vllm.plugins.modules import stage_result

from tests.unit.module_helper import run_module


@pytest.fixture
def node(tmp_path):
    (tmp_path / "plan.json").write_text('{"max_model_len": 65536}\n')
    (tmp_path / "profile").write_text("mtu=9000\n")
    return tmp_path


def site(node, state, **extra):
    """stage_result for the site's record at ``node``: every call gives only its fingerprint."""
    args = {"stage": "site", "state": state, "path": str(node / "site.json"), "fingerprint": "run-1"}
    return run_module(stage_result, {**args, "watch_recorded": True, **extra}).result


def record(node, **extra):
    """A whole run: what it left (a file, a command) and its result."""
    return site(
        node,
        "present",
        watch_files=[str(node / "plan.json")],
        watch_commands=[["cat", str(node / "profile")]],
        result={"routes": ["/v1"]},
        **extra,
    )


def check(node, **extra):
    """The next run: only its fingerprint; the lists come from the record."""
    return site(node, "converged", **extra)


def test_the_record_names_its_watch_lists_and_the_next_run_checks_them(node):
    saved = record(node)
    assert saved["changed"]
    doc = json.loads((node / "site.json").read_text())
    assert doc["stage"] == "site"
    assert doc["result"]["watch"] == {
        "files": [str(node / "plan.json")],
        "units": [],
        "commands": [["cat", str(node / "profile")]],
    }
    assert doc["result"]["routes"] == ["/v1"]
    out = check(node)
    assert out["converged"] and out["reason"] is None
    assert not record(node)["changed"], "a second record of the same state changes nothing"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda n: (n / "plan.json").write_text("{}\n"),
            "plan.json changed since the stage last ran",
        ),
        (lambda n: (n / "plan.json").unlink(), "plan.json is missing"),
        (lambda n: (n / "profile").write_text("mtu=1500\n"), "profile answers otherwise"),
        (lambda n: (n / "site.json").unlink(), "no saved result"),
    ],
)
def test_anything_a_stage_left_that_changed_makes_the_whole_run_go_on(node, change, reason):
    record(node)
    change(node)
    out = check(node)
    assert not out["converged"] and reason in out["reason"]


def test_other_inputs_make_the_whole_run_go_on(node):
    record(node)
    out = check(node, fingerprint="run-2")
    assert not out["converged"] and "inputs changed" in out["reason"]


def test_a_record_whose_watch_lists_were_tampered_with_cannot_be_trusted(node):
    record(node)
    doc = json.loads((node / "site.json").read_text())
    doc["result"]["watch"]["files"] = ["relative"]
    (node / "site.json").write_text(json.dumps(doc))
    out = check(node)
    assert not out["converged"] and not out["found"]
    assert "cannot be trusted" in out["reason"] and "result.watch.files" in out["reason"]


def test_prove_commands_must_exit_0_and_run_only_when_everything_else_holds(node):
    record(node)
    marker = node / "proved"
    prove = [["sh", "-c", f"echo ran >> {marker}"]]
    assert check(node, prove_commands=prove)["converged"]
    assert marker.read_text() == "ran\n"
    out = check(
        node,
        prove_commands=[
            ["sh", "-c", "echo 'ping: local error: message too long, mtu=1500' >&2; exit 1"]
        ],
    )
    assert not out["converged"]
    assert (
        out["reason"]
        == "sh -c echo 'ping: local error: message too long, mtu=1500' >&2; exit 1 failed (rc 1): "
        "ping: local error: message too long, mtu=1500"
    )
    (node / "plan.json").write_text("{}\n")
    assert not check(node, prove_commands=prove)["converged"]
    assert marker.read_text() == "ran\n", "a prove command ran although the record no longer held"


def test_a_prove_command_that_hangs_is_bounded_and_reported(node):
    record(node)
    out = check(node, prove_commands=[["sleep", "30"]], timeout=0.5)
    assert not out["converged"] and "did not answer within 0.5 s" in out["reason"]


@pytest.mark.parametrize("argv", [[], ["ping", ""], ["ping", "a\nb"]])
def test_a_prove_command_that_is_not_a_list_of_words_is_refused(node, argv):
    out = run_module(
        stage_result,
        {
            "stage": "site",
            "state": "converged",
            "path": str(node / "site.json"),
            "prove_commands": [argv],
        },
    )
    assert out.failed and "prove_commands" in out.result["msg"]


@pytest.mark.parametrize(
    ("watch", "field"),
    [
        (None, "result.watch is not"),
        ({"files": [], "units": []}, "result.watch is not"),
        ({"files": ["/a"], "units": [1], "commands": []}, "result.watch.units"),
        ({"files": ["/a"], "units": [], "commands": [[]]}, "result.watch.commands"),
        ({"files": ["/a"], "units": [], "commands": ["cat /a"]}, "result.watch.commands"),
        ({"files": ["/a\n/b"], "units": [], "commands": []}, "result.watch.files"),
    ],
)
def test_recorded_watch_is_schema_checked(watch, field):
    with pytest.raises(StageResultError, match=field.replace(".", r"\.")):
        recorded_watch({"watch": watch} if watch is not None else {}, "site.json")


def test_merge_watch_keeps_the_first_of_each():
    assert merge_watch(["/a", "/b"], ["/b", "/c"]) == ["/a", "/b", "/c"]
    assert merge_watch([["ip", "-j", "addr"]], [["ip", "-j", "addr"], ["nmcli"]]) == [
        ["ip", "-j", "addr"],
        ["nmcli"],
    ]
