# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's last check: one real opencode turn (a tool round trip) through the new stack.

``make lab`` ends with the client stage (playbooks/client.yml): opencode in
.lab/opencode-cli, its config in .lab/opencode/opencode.json, the key's env file
in .lab/opencode/env, the client result on the head. Then:

1. A rollout that starts the server (the head's server unit was stopped) ends
   with the turn: the lab's scripted model calls opencode's ``read`` tool and
   answers after the result; the play output says the turn passed. The time the
   turn adds to a rollout is printed (ansible.posix.profile_tasks).
2. A rollout that starts nothing says in one line that it skipped the turn,
   and reports changed=0.
3. A fault, for real: the key's env file holds a key the ingress refuses. The
   served model answers (the rollout's own first-token check passed), but the
   agent cannot work: the rollout's final check fails with opencode's own
   error, and neither key is printed.
"""

from __future__ import annotations

import os
import re

import pytest

from lab.harness import (
    HEAD,
    LAB_DIR,
    VLLM_UNIT,
    api_key,
    exec_on,
    rollout,
    streams_a_token,
    wait_for,
)
from lab.tiny_model import ANSWER

# Three rollouts, 2 min 35 s to 2 min 56 s: make test-lab-extended (CI's hour; make lab's
# whole site.yml runs the turn after its start).
pytestmark = [pytest.mark.lab, pytest.mark.extended, pytest.mark.usefixtures("lab_hosts")]

OPENCODE = LAB_DIR / "opencode-cli" / "node_modules" / ".bin" / "opencode"
CONFIG = LAB_DIR / "opencode" / "opencode.json"
PROFILED = {
    "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
    "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
}
# The harness's rollout() turns the turn off for the other fault tests; these ask for the default.
STARTED = {"agent_client_rollout_turn": "started"}
# profile_tasks' recap line: "Task name ---- 9.12s".
RECAP_ROW = re.compile(r"^(?P<task>.+?) -+ (?P<seconds>\d+\.\d+)s$")


@pytest.fixture(scope="module")
def opencode_set_up() -> None:
    if not (OPENCODE.exists() and CONFIG.is_file()):
        reason = (
            f"needs opencode ({OPENCODE}) and the client stage's config ({CONFIG}): run make lab"
        )
        if os.environ.get("LOCALINFERENCE_LAB_REQUIRED") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def _turn_seconds(stdout: str) -> float:
    """Seconds of the agent turn's tasks in profile_tasks' recap."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("TASKS RECAP")]
    total = 0.0
    for line in lines[starts[-1] + 1 :] if starts else []:
        match = RECAP_ROW.match(line.strip())
        if match and (
            "Agent client |" in match.group("task") or "Rollout | Agent turn" in match.group("task")
        ):
            total += float(match.group("seconds"))
    return total


def test_a_rollout_that_starts_the_server_ends_with_a_passing_turn(opencode_set_up) -> None:
    exec_on(HEAD, "systemctl", "stop", VLLM_UNIT)
    try:
        proc = rollout(tags="rollout", env=PROFILED, extra_vars=STARTED)
    finally:
        # Whatever happened, the lab is left serving.
        if not streams_a_token():
            exec_on(HEAD, "systemctl", "start", VLLM_UNIT, check=False)
            wait_for("the endpoint to stream again", streams_a_token, timeout=300)
    assert proc.rc == 0, proc.tail()
    flat = proc.flat
    assert "Agent turn passed in" in flat, proc.tail()
    assert "opencode completed a turn with a tool round trip (read)" in flat, proc.tail()
    assert ANSWER in flat, proc.tail()
    assert "Skipped the agent turn" not in flat, proc.tail()
    seconds = _turn_seconds(proc.stdout)
    delta = re.search(r"Agent turn passed in (\d+:\d+:[\d.]+)", flat)
    print(
        f"\nagent turn: {seconds:.1f} s of the rollout's {proc.seconds:.0f} s (opencode itself {delta and delta.group(1)})"
    )
    assert 0 < seconds < 120, seconds


def test_a_rollout_that_starts_nothing_skips_the_turn_in_one_line(opencode_set_up) -> None:
    wait_for("the endpoint to stream", streams_a_token, timeout=300)
    proc = rollout(tags="rollout", env=PROFILED, extra_vars=STARTED)
    assert proc.rc == 0, proc.tail()
    print(
        f"\nskipped agent turn: {_turn_seconds(proc.stdout):.1f} s of the rollout's {proc.seconds:.0f} s"
    )
    skipped = [line for line in proc.stdout.splitlines() if "Skipped the agent turn" in line]
    assert len(skipped) == 1, proc.tail()
    assert "this rollout started nothing" in proc.flat, proc.tail()
    assert "Agent turn passed" not in proc.flat, proc.tail()
    assert proc.changed() == 0, proc.tail()


def test_a_refused_key_fails_the_rollouts_final_check_with_opencodes_error(
    opencode_set_up, tmp_path
) -> None:
    wait_for("the endpoint to stream", streams_a_token, timeout=300)
    wrong = "wrongwrongwrongwrongwrongwrongwrongwrong"
    # The client stage's env file with only the key replaced (its other lines, such as
    # NODE_EXTRA_CA_CERTS for an https route, stay as they are).
    lines = (LAB_DIR / "opencode" / "env").read_text().splitlines()
    env_file = tmp_path / "env"
    env_file.write_text(
        "".join(
            (
                f"LOCALINFERENCE_API_KEY={wrong}"
                if line.startswith("LOCALINFERENCE_API_KEY=")
                else line
            )
            + "\n"
            for line in lines
        )
    )
    env_file.chmod(0o600)
    proc = rollout(
        tags="rollout",
        extra_vars={"agent_client_rollout_turn": "always", "agent_client_env_file": str(env_file)},
    )
    flat = proc.flat
    assert proc.rc != 0, proc.tail()
    assert (
        "The rollout's final check failed: opencode's turn through the new stack failed" in flat
    ), proc.tail()
    # opencode's own words: its error events or its stderr say what the ingress answered.
    assert re.search(r"its errors: \S+|last lines of its stderr: \S+", flat), proc.tail()
    print(
        "\nthe rollout's final check:",
        re.search(r"The rollout's final check failed: .{0,900}", flat).group(0),
    )
    assert "Agent turn passed" not in flat, proc.tail()
    assert wrong not in proc.stdout + proc.stderr
    key = api_key()
    assert not key or key not in proc.stdout + proc.stderr
    # A check, not a change: the stack itself was left as it was.
    assert proc.changed() == 0, proc.tail()
    assert streams_a_token()
