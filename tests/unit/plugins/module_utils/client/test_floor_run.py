# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which clients agent_client_floor can measure on this node (module_utils/client/_floor_run.py).

A client's program is the one named in ``programs`` (an absolute path to an executable file)
or the one on PATH; a client without one is skipped with why, and the options are refused by
name before anything runs. A real measurement is tests/unit/plugins/modules/
test_agent_client_floor.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.client._floor import (
    PROGRAMS,
    FloorError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.client._floor_run import (
    installed,
    program_of,
    run,
)
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule, ModuleExit

CLIENT = next(iter(PROGRAMS))


def test_a_client_not_on_path_is_skipped_with_the_variable_that_names_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert program_of(CLIENT, {}) == (
        None, f"{PROGRAMS[CLIENT]} is not on PATH (agent_client_programs.{CLIENT} names it)"
    )
    assert installed([CLIENT], {}, 60, False) == {
        "programs": {}, "versions": {}, "warnings_versions": [],
        "skipped": [{"client": CLIENT, "why": program_of(CLIENT, {})[1]}],
    }


@pytest.mark.parametrize(
    ("given", "message"),
    [("relative/claude", "must be an absolute path"), ("/nonexistent/claude", "is not an executable file")],
    ids=["relative", "missing"],
)
def test_a_named_program_must_be_an_executable_file(given, message):
    with pytest.raises(FloorError, match=message):
        program_of(CLIENT, {CLIENT: given})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"clients": ["vim"]}, "clients: no measurement for ['vim']; known: "),
        ({"measure": ["crush", "codex"], "clients": ["codex"]}, "measure: ['crush'] are not among clients"),
        ({"timeout": 0}, "timeout must be 1-3600 seconds, got 0"),
    ],
    ids=["an unknown client", "measure outside clients", "timeout"],
)
def test_options_are_refused_before_anything_runs(given, message):
    params = {"clients": [CLIENT], "measure": None, "allow_unknown_versions": False, "programs": {},
              "timeout": 120, **given}
    with pytest.raises(ModuleExit) as caught:
        run(FakeModule(params))
    assert caught.value.result["msg"].startswith(message)
