# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""doctor_facts: bounded, read-only gathering; raw text back, every read problem named."""

from __future__ import annotations

import json
import os

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils import _commands
from ansible_collections.localinference.vllm.plugins.modules import doctor_facts

from tests.unit.module_helper import run_module

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "doctor")
with open(os.path.join(FIXTURES, "lab-units-stopped-by-a-rollout.json")) as _handle:
    STOPPED = json.load(_handle)
SHOW = STOPPED["spark-worker"]["units"]["localinference-vllm.service"]["stdout"]
JOURNAL = STOPPED["spark-worker"]["journal"]["text"]


@pytest.fixture
def commands(monkeypatch):
    """Record every argv; answer systemctl with the recorded worker and journalctl with its log."""
    ran: list[tuple[list[str], float]] = []

    def run_bounded(argv, timeout, environ=None, hint=None):
        ran.append((list(argv), timeout))
        if "show" in argv:
            return 0, SHOW, ""
        if argv[-1] == "slow":
            raise _commands.CommandTimeout(argv, timeout, hint, True)
        return 0, JOURNAL, ""

    monkeypatch.setattr(_commands, "run_bounded", run_bounded)
    monkeypatch.setattr(
        doctor_facts.AnsibleModule,
        "get_bin_path",
        lambda self, name, required=False: f"/bin/{name}",
    )
    return ran


def test_files_are_returned_raw_and_read_problems_are_named(tmp_path, commands):
    good = tmp_path / "plan.json"
    good.write_text('{"schema": 1}')
    binary = tmp_path / "fabric.json"
    binary.write_bytes(b"\xff\xfe\x00")
    files = {
        "plan": str(good),
        "fabric": str(binary),
        "serving": str(tmp_path),  # a directory
        "client": str(tmp_path / "missing.json"),
    }
    out = run_module(doctor_facts, {"files": files}, check_mode=True)
    assert not out.failed and out.result["changed"] is False
    got = out.result["ansible_facts"]["doctor_evidence"]["files"]
    assert got["plan"] == {"path": str(good), "found": True, "text": '{"schema": 1}', "error": None}
    assert "not UTF-8" in got["fabric"]["error"] and got["fabric"]["text"] is None
    assert "is a directory" in got["serving"]["error"]
    assert got["client"]["found"] is False and got["client"]["error"] is None
    assert commands == []


def test_units_and_the_last_boot_since_its_start_with_a_timeout(commands):
    out = run_module(
        doctor_facts,
        {
            "units": ["localinference-vllm.service"],
            "journal_unit": "localinference-vllm.service",
            "journal_lines": 50,
            "timeout": 7,
        },
    )
    evidence = out.result["ansible_facts"]["doctor_evidence"]
    assert evidence["units"]["localinference-vllm.service"] == {"stdout": SHOW, "error": None}
    assert evidence["journal"]["since"] == "Tue 2026-12-01 11:54:26 UTC"
    assert evidence["journal"]["text"] == JOURNAL
    assert evidence["journal"]["truncated"] is True  # more lines than journal_lines: a tail
    (show, t1), (journal, t2) = commands
    assert show[:3] == ["/bin/systemctl", "show", "--no-pager"]
    assert "ActiveState" in show[show.index("-p") + 1] and show[-1] == "localinference-vllm.service"
    assert journal == [
        "/bin/journalctl",
        "-u",
        "localinference-vllm.service",
        "--no-pager",
        "-o",
        "short",
        "-n",
        "50",
        "--since",
        "Tue 2026-12-01 11:54:26 UTC",
    ]
    assert t1 == t2 == 7


def test_a_command_that_runs_over_is_an_error_in_the_evidence_not_a_failure(monkeypatch, commands):
    def hung(argv, timeout, environ=None, hint=None):
        raise _commands.CommandTimeout(argv, timeout, hint, True)

    monkeypatch.setattr(_commands, "run_bounded", hung)
    out = run_module(
        doctor_facts,
        {
            "units": ["localinference-vllm.service"],
            "journal_unit": "localinference-vllm.service",
            "timeout": 3,
        },
    )
    assert not out.failed
    evidence = out.result["ansible_facts"]["doctor_evidence"]
    assert "did not answer within 3 s" in evidence["units"]["localinference-vllm.service"]["error"]
    # No start time could be read: the newest lines are asked for, and that times out too.
    assert evidence["journal"]["since"] is None
    assert "journalctl did not answer within 3 s" in evidence["journal"]["error"]


@pytest.mark.parametrize(
    "args, words",
    [
        ({"units": ["-x.service"]}, "units"),
        ({"journal_unit": "a b"}, "journal_unit"),
        ({"files": {"plan": "relative.json"}}, "files.plan"),
        ({"files": {"plan": "/etc/x\n"}}, "files.plan"),
        ({"timeout": 0}, "timeout"),
        ({"journal_lines": 0}, "journal_lines"),
        ({"max_bytes": 0}, "max_bytes"),
    ],
)
def test_bad_options_are_refused_by_name(args, words, commands):
    out = run_module(doctor_facts, args)
    assert out.failed and words in out.result["msg"], out.result["msg"]
    assert commands == []


def test_links_read_every_interface_mtu_as_text_and_name_what_vanished(tmp_path, monkeypatch):
    # The lab worker's cluster veth after `ip link set dev enp1s0f0np0 mtu 1500` (F19), lo, and
    # an interface removed between the listing and the read (no mtu file any more).
    for name, mtu, state in (("enp1s0f0np0", "1500\n", "up\n"), ("lo", "65536\n", "unknown\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mtu").write_text(mtu)
        (tmp_path / name / "operstate").write_text(state)
    (tmp_path / "veth9").mkdir()
    monkeypatch.setattr(doctor_facts, "SYS_CLASS_NET", str(tmp_path))
    out = run_module(doctor_facts, {"links": True}, check_mode=True)
    links = out.result["ansible_facts"]["doctor_evidence"]["links"]
    assert links["enp1s0f0np0"] == {"mtu": "1500", "operstate": "up", "error": None}
    assert links["lo"]["mtu"] == "65536"
    assert links["veth9"]["mtu"] is None and "veth9/mtu" in links["veth9"]["error"]
    assert run_module(doctor_facts, {}).result["ansible_facts"]["doctor_evidence"]["links"] is None


def test_links_on_this_machines_real_sysfs():
    out = run_module(doctor_facts, {"links": True}, check_mode=True)
    links = out.result["ansible_facts"]["doctor_evidence"]["links"]
    assert links["lo"]["mtu"].isdigit() and links["lo"]["error"] is None
