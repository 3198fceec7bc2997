# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""stage_result state=converged: a saved result that still holds makes the stage do nothing."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _stage_file
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    StageResultError,
    check_document,
    inputs_hash,
    judge_converged,
    live_record,
)
from ansible_collections.localinference.vllm.plugins.modules import stage_result

from tests.unit.module_helper import run_module

H = inputs_hash("fingerprint")
SHA_A = "a" * 64
SHA_B = "b" * 64
ACTIVE = {"caddy.service": {"Id": "caddy.service", "ActiveState": "active", "UnitFileState": "enabled"}}
SAVED = {
    "schema": 1,
    "stage": "ingress",
    "inputs_hash": H,
    "result": {},
    "live": {"files": {"/etc/caddy/Caddyfile": SHA_A, "/etc/x": None}, "units": {"caddy.service": "enabled"}},
}
FILES = {"/etc/caddy/Caddyfile": SHA_A, "/etc/x": None}


@pytest.mark.parametrize(
    ("doc", "want", "files", "units", "secrets", "reason"),
    [
        (SAVED, H, FILES, ACTIVE, [], None),
        (None, H, FILES, ACTIVE, [], "no saved result"),
        (SAVED, inputs_hash("other"), FILES, ACTIVE, [], "its inputs changed"),
        ({**SAVED, "live": None}, H, FILES, ACTIVE, [], "records no live state"),
        ({k: v for k, v in SAVED.items() if k != "live"}, H, FILES, ACTIVE, [], "records no live state"),
        (SAVED, H, {"/etc/caddy/Caddyfile": SHA_A}, ACTIVE, [], "other files, units or commands"),
        (SAVED, H, FILES, {}, [], "other files, units or commands"),
        (SAVED, H, {**FILES, "/etc/caddy/Caddyfile": SHA_B}, ACTIVE, [], "/etc/caddy/Caddyfile changed"),
        (SAVED, H, {**FILES, "/etc/caddy/Caddyfile": None}, ACTIVE, [], "/etc/caddy/Caddyfile is missing"),
        (SAVED, H, {**FILES, "/etc/x": SHA_A}, ACTIVE, [], "/etc/x changed"),
        (
            SAVED,
            H,
            FILES,
            {"caddy.service": {**ACTIVE["caddy.service"], "ActiveState": "failed"}},
            [],
            "caddy.service is failed, not active",
        ),
        (
            SAVED,
            H,
            FILES,
            {"caddy.service": {**ACTIVE["caddy.service"], "UnitFileState": "disabled"}},
            [],
            "caddy.service is disabled (was enabled)",
        ),
        (SAVED, H, FILES, {"caddy.service": {}}, [], "caddy.service is unknown, not active"),
        (SAVED, H, FILES, ACTIVE, ["/etc/key.env"], "/etc/key.env does not hold this run's secret"),
    ],
)
def test_judge_converged(doc, want, files, units, secrets, reason):
    got = judge_converged(doc, want, files, units, secrets)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_live_record_sorts_and_keeps_only_the_enablement():
    assert live_record({"/b": None, "/a": SHA_A}, ACTIVE) == {
        "files": {"/a": SHA_A, "/b": None},
        "units": {"caddy.service": "enabled"},
    }


@pytest.mark.parametrize(
    "live",
    [
        [],
        {"files": {}},
        {"files": {"/a": "nothex"}, "units": {}},
        {"files": {"/a": SHA_A}, "units": {"x.service": 1}},
        {"files": [], "units": {}},
        {"files": {}, "units": {}, "commands": {"ip -j addr": "nothex"}},
        {"files": {}, "units": {}, "fingerprint": "short"},
        {"files": {}, "units": {}, "other": 1},
    ],
)
def test_a_saved_live_record_is_schema_checked(live):
    doc = {"schema": 1, "stage": "ingress", "inputs_hash": H, "result": {}, "live": live}
    with pytest.raises(StageResultError, match="live"):
        check_document(json.dumps(doc), "ingress", "ingress.json")


class FakeRunner:
    """systemctl show as the lab head answers it (properties in systemd's own order)."""

    states: ClassVar[dict[str, tuple[str, str]]] = {"caddy.service": ("active", "enabled")}
    calls: ClassVar[list[list[str]]] = []

    def __init__(self, timeout):
        self.timeout = timeout

    def run(self, argv, hint=None, timeout=None):
        FakeRunner.calls.append(list(argv))
        blocks = []
        for unit in argv[argv.index("--") + 1 :]:
            active, enabled = self.states.get(unit, ("inactive", ""))
            blocks.append(f"Id={unit}\nActiveState={active}\nUnitFileState={enabled}")
        return 0, "\n\n".join(blocks) + "\n", ""


@pytest.fixture
def node(tmp_path, monkeypatch):
    monkeypatch.setattr(_stage_file, "Runner", FakeRunner)
    FakeRunner.states = {"caddy.service": ("active", "enabled")}
    FakeRunner.calls = []
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(":8080 {\n}\n")
    key = tmp_path / "key.env"
    key.write_text("KEY=Zq7sEcr3tV4lue\n")
    return tmp_path


def args(node, state, **extra):
    return {
        "stage": "ingress",
        "state": state,
        "path": str(node / "ingress.json"),
        "inputs": "fingerprint",
        "watch_files": [str(node / "Caddyfile"), str(node / "absent")],
        "watch_units": ["caddy.service"],
        **extra,
    }


def converged(node, **extra):
    secrets = [{"path": str(node / "key.env"), "content": "KEY=Zq7sEcr3tV4lue\n"}]
    return run_module(stage_result, args(node, "converged", watch_secrets=secrets, **extra)).result


def test_save_records_the_live_state_and_a_later_run_is_converged(node):
    saved = run_module(stage_result, args(node, "present", result={"endpoint": "x"})).result
    assert saved["changed"]
    doc = json.loads((node / "ingress.json").read_text())
    assert doc["live"]["files"][str(node / "absent")] is None
    assert doc["live"]["units"] == {"caddy.service": "enabled"}
    out = converged(node, required_keys=["endpoint"])
    assert out["converged"] and out["reason"] is None and out["result"] == {"endpoint": "x"}
    assert not out["changed"]
    assert FakeRunner.calls[-1][:4] == ["systemctl", "show", "-p", "Id,ActiveState,UnitFileState"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda n: (n / "Caddyfile").write_text("other\n"), "Caddyfile changed"),
        (lambda n: (n / "absent").write_text("now here\n"), "absent changed"),
        (lambda n: (n / "key.env").write_text("KEY=old\n"), "key.env does not hold this run's secret"),
        (lambda n: (n / "key.env").unlink(), "key.env does not hold this run's secret"),
        (lambda n: setattr(FakeRunner, "states", {"caddy.service": ("failed", "enabled")}), "is failed"),
        (lambda n: (n / "ingress.json").unlink(), "no saved result"),
    ],
)
def test_any_drift_on_the_node_makes_the_stage_run(node, change, reason):
    run_module(stage_result, args(node, "present", result={"endpoint": "x"}))
    change(node)
    out = converged(node)
    assert not out["converged"] and reason in out["reason"]


def test_new_inputs_or_a_result_from_another_version_make_the_stage_run(node):
    run_module(stage_result, args(node, "present", result={"endpoint": "x"}))
    assert "inputs changed" in converged(node, inputs="other")["reason"]
    out = converged(node, required_keys=["routes"])
    assert not out["converged"] and not out["found"] and "another version" in out["reason"]


def test_the_secret_is_in_no_output_and_not_in_the_saved_document(node):
    run_module(stage_result, args(node, "present", result={}))
    out = converged(node)
    assert "Zq7sEcr3tV4lue" not in json.dumps(out)
    assert "Zq7sEcr3tV4lue" not in (node / "ingress.json").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"watch_files": ["relative/path"]}, "not an absolute path"),
        ({"watch_units": ["caddy.service\nExecStart=/bin/sh"]}, "not a systemd unit name"),
        ({"watch_units": ["--now"]}, "not a systemd unit name"),
        ({"timeout": 0}, "positive"),
    ],
)
def test_bad_watch_values_are_refused_with_the_option_named(node, extra, message):
    out = run_module(stage_result, args(node, "converged", **extra))
    assert out.failed and message in out.result["msg"]


@pytest.mark.parametrize("text", ["{not json", '{"schema": 1, "stage": "fabric"}', "[]"])
def test_a_corrupt_saved_document_makes_the_stage_run_and_write_it_again(node, text):
    (node / "ingress.json").write_text(text)
    out = run_module(stage_result, args(node, "converged"))
    assert not out.failed and not out.result["converged"] and not out.result["found"]
    assert out.result["reason"].startswith("the saved result cannot be trusted")
    run_module(stage_result, args(node, "present", result={}))
    assert converged(node)["converged"]


def test_a_secret_given_without_its_final_newline_matches(node):
    run_module(stage_result, args(node, "present", result={}))
    secrets = [{"path": str(node / "key.env"), "content": "KEY=Zq7sEcr3tV4lue"}]
    assert run_module(stage_result, args(node, "converged", watch_secrets=secrets)).result["converged"]


def test_a_fingerprint_is_saved_beside_the_inputs_and_compared_alone(node):
    """The client: inputs_hash covers what was measured, the fingerprint what the next run can know first."""
    saved = args(node, "present", inputs={"opencode_version": "1.18.33"}, result={}, fingerprint="run-1")
    run_module(stage_result, saved)
    doc = json.loads((node / "ingress.json").read_text())
    assert doc["inputs_hash"] == inputs_hash({"opencode_version": "1.18.33"})
    assert doc["live"]["fingerprint"] == inputs_hash("run-1")
    check = {k: v for k, v in args(node, "converged").items() if k != "inputs"}
    assert run_module(stage_result, {**check, "fingerprint": "run-1"}).result["converged"]
    out = run_module(stage_result, {**check, "fingerprint": "run-2"}).result
    assert not out["converged"] and "inputs changed" in out["reason"]


def test_judge_compares_the_fingerprint_when_given():
    doc = {**SAVED, "live": {**SAVED["live"], "fingerprint": SHA_A}}
    assert judge_converged(doc, None, FILES, ACTIVE, (), SHA_A) is None
    assert "inputs changed" in judge_converged(doc, None, FILES, ACTIVE, (), SHA_B)
    assert "inputs changed" in judge_converged(SAVED, None, FILES, ACTIVE, (), SHA_A)


def test_judge_compares_the_watched_commands():
    doc = {**SAVED, "live": {**SAVED["live"], "commands": {"nmcli -g ipv4.addresses connection show x": SHA_A}}}
    same = {"nmcli -g ipv4.addresses connection show x": SHA_A}
    assert judge_converged(doc, H, FILES, ACTIVE, (), None, same) is None
    other = {"nmcli -g ipv4.addresses connection show x": SHA_B}
    assert "answers otherwise" in judge_converged(doc, H, FILES, ACTIVE, (), None, other)
    assert "other files, units or commands" in judge_converged(doc, H, FILES, ACTIVE, (), None, {})
    assert "other files, units or commands" in judge_converged(SAVED, H, FILES, ACTIVE, (), None, same)


def test_a_watched_command_runs_for_real_and_its_answer_is_compared(tmp_path):
    profile = tmp_path / "profile"
    profile.write_text("mtu=9000\n")
    base = {
        "stage": "fabric",
        "path": str(tmp_path / "fabric.json"),
        "inputs": "fingerprint",
        "watch_commands": [["cat", str(profile)], ["cat", str(tmp_path / "absent")]],
    }
    run_module(stage_result, {**base, "state": "present", "result": {}})
    doc = json.loads((tmp_path / "fabric.json").read_text())
    assert sorted(doc["live"]["commands"]) == [f"cat {tmp_path / 'absent'}", f"cat {profile}"]
    assert run_module(stage_result, {**base, "state": "converged"}).result["converged"]
    profile.write_text("mtu=1500\n")
    out = run_module(stage_result, {**base, "state": "converged"}).result
    assert not out["converged"] and out["reason"] == f"cat {profile} answers otherwise than when the stage last ran"
    (tmp_path / "absent").write_text("")  # an exit status counts as well as the output
    profile.write_text("mtu=9000\n")
    assert "absent answers otherwise" in run_module(stage_result, {**base, "state": "converged"}).result["reason"]


@pytest.mark.parametrize("argv", [[], ["nmcli", ""], ["echo", "a\nb"], ["sh", 1]])
def test_a_watched_command_that_is_not_a_list_of_words_is_refused(tmp_path, argv):
    args = {"stage": "fabric", "state": "converged", "path": str(tmp_path / "f.json"), "watch_commands": [argv]}
    out = run_module(stage_result, args)
    assert out.failed and "watch_commands" in out.result["msg"]


def test_a_watched_command_that_hangs_is_bounded(tmp_path):
    args = {
        "stage": "fabric",
        "state": "converged",
        "path": str(tmp_path / "f.json"),
        "watch_commands": [["sleep", "30"]],
        "timeout": 0.5,
    }
    out = run_module(stage_result, args)
    assert out.failed and "did not answer within 0.5 s" in out.result["msg"]
