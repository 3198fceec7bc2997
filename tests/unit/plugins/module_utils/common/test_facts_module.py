# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The facts modules' one runner (``common/_facts_module.run_facts``) from a case table."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    Absent,
    WhenAbsent,
    find_binary,
    run_facts,
)


class Ended(Exception):
    """What exit_json/fail_json do to a real module: nothing after them runs."""


class Module:
    """The three things run_facts uses of an AnsibleModule."""

    def __init__(self, **params: Any) -> None:
        self.params = params
        self.ended: dict[str, Any] = {}

    def exit_json(self, **result: Any) -> None:
        self.ended = {"failed": False, **result}
        raise Ended

    def fail_json(self, **result: Any) -> None:
        self.ended = {"failed": True, **result}
        raise Ended


def facts(runner):
    return {"timeout": runner.timeout}


def command_fails(runner):
    runner.ran.append(["nvidia-smi", "-q"])
    raise CommandError("nvidia-smi did not answer within 2 s")


def not_here(_runner):
    raise Absent("ibv_devinfo not found in PATH")


WHEN_ABSENT = WhenAbsent("rdma_facts", "Install rdma-core.", lambda why: {"present": False, "why": why})

CASES = [
    ("facts-under-one-key", {"timeout": 2.0}, facts, {},
     {"failed": False, "changed": False, "ansible_facts": {"key": {"timeout": 2.0}}}),
    ("bad-timeout", {"timeout": -1}, facts, {},
     {"failed": True, "msg": "timeout must be a positive, finite number of seconds, got -1"}),
    ("every-timeout-checked", {"timeout": 2.0, "engine_timeout": 0}, facts,
     {"timeouts": ("timeout", "engine_timeout")},
     {"failed": True, "msg": "engine_timeout must be a positive, finite number of seconds, got 0"}),
    ("no-timeout-no-runner", {}, lambda runner: {"runner": runner}, {"timeouts": ()},
     {"failed": False, "changed": False, "ansible_facts": {"key": {"runner": None}}}),
    ("a-command-that-failed-is-named", {"timeout": 2.0}, command_fails, {},
     {"failed": True, "msg": "nvidia-smi did not answer within 2 s", "cmd": ["nvidia-smi", "-q"]}),
    ("absent-not-required", {"timeout": 2.0, "required": False}, not_here, {"absent": WHEN_ABSENT},
     {"failed": False, "changed": False,
      "ansible_facts": {"key": {"present": False, "why": "ibv_devinfo not found in PATH"}}}),
    ("absent-required", {"timeout": 2.0, "required": True}, not_here, {"absent": WHEN_ABSENT},
     {"failed": True,
      "msg": "ibv_devinfo not found in PATH; rdma_facts was called with required=true. Install rdma-core."}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("params", "gather", "options", "ended"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_run_facts(params, gather, options, ended) -> None:
    module = Module(**params)
    with pytest.raises(Ended):
        run_facts(module, "key", gather, **options)
    assert module.ended == ended


def test_absent_without_a_when_absent_is_a_programming_error() -> None:
    with pytest.raises(Absent):
        run_facts(Module(timeout=2.0), "key", not_here)


class _Module:
    """get_bin_path as AnsibleModule's: a bare name looked up in PATH, None when absent."""

    def __init__(self, found: dict[str, str]) -> None:
        self.found = found

    def get_bin_path(self, name: str) -> str | None:
        return self.found.get(name)


@pytest.mark.parametrize(
    ("binary", "found", "want"),
    [
        ("ibv_devinfo", {"ibv_devinfo": "/usr/bin/ibv_devinfo"}, "/usr/bin/ibv_devinfo"),
        ("ibv_devinfo", {}, Absent),
        ("/bin/sh", {}, "/bin/sh"),  # a path as given, PATH not asked
        ("/nonexistent/nvidia-smi", {"nvidia-smi": "/usr/bin/nvidia-smi"}, Absent),
        ("{tmp}/nvidia-smi", {}, Absent),  # there, but not executable (mode 0644)
    ],
)
def test_find_binary(tmp_path, binary: str, found: dict[str, str], want: object) -> None:
    plain = tmp_path / "nvidia-smi"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    binary = binary.format(tmp=tmp_path)
    if want is Absent:
        with pytest.raises(Absent, match=f"^{binary} not found in PATH$"):
            find_binary(_Module(found), binary)
    else:
        assert find_binary(_Module(found), binary) == want
