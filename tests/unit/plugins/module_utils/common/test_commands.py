# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bounded commands: real processes, a C locale, a deadline that kills the process group."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common import _commands
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    CommandTimeout,
    Runner,
    run_bounded,
    timeout_error,
)


def test_runs_with_c_locale_and_returns_text():
    rc, out, err = run_bounded(
        [sys.executable, "-c", "import os,sys; print(os.environ['LC_ALL']); sys.stderr.write('e')"],
        timeout=10,
    )
    assert (rc, out, err) == (0, "C\n", "e")


def test_undecodable_output_never_raises():
    rc, out, _ = run_bounded(
        [sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'\\xff\\xfe ok')"], timeout=10
    )
    assert rc == 0 and out.endswith(" ok") and "\ufffd" in out


def test_timeout_kills_the_process_group_and_names_the_command(tmp_path: Path):
    marker = tmp_path / "child-survived"
    script = tmp_path / "nvidia-smi"
    # A child that would outlive its parent if only the parent were killed.
    script.write_text(f"#!/bin/sh\n(sleep 3; touch {marker}) &\nsleep 60\n")
    script.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as caught:
        run_bounded([str(script)], timeout=0.5, hint="the GPU driver may be wedged")
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert message.startswith("nvidia-smi did not answer within 0.5 s")
    assert "the GPU driver may be wedged" in message and str(script) in message
    assert caught.value.killed is True
    assert elapsed < 5, elapsed
    time.sleep(3.5)
    assert not marker.exists(), "the process group was not killed"


def test_a_process_that_survives_sigkill_is_left_behind_and_said_so():
    proc = mock.Mock(pid=999999999)
    proc.wait.side_effect = subprocess.TimeoutExpired("x", 2)
    assert _commands._stop(proc) is False
    error = CommandTimeout(["/usr/bin/nvidia-smi"], 30, None, killed=False)
    assert "survived SIGKILL" in str(error)


def test_missing_executable_is_a_command_error(tmp_path: Path):
    with pytest.raises(CommandError, match=r"cannot run .*no-such-binary"):
        run_bounded([str(tmp_path / "no-such-binary")], timeout=5)


def test_runner_records_what_it_ran():
    runner = Runner(5)
    runner.run(["true"])
    assert runner.ran == [["true"]]
    assert runner.environ["LC_ALL"] == "C"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "positive, finite"),
        (-1, "positive, finite"),
        (float("inf"), "positive, finite"),
        (float("nan"), "positive, finite"),
        (10**6, "at most 86400"),
        ("30", "must be a number"),
        (True, "must be a number"),
    ],
)
def test_timeout_values(value, message):
    assert message in timeout_error(value)


def test_good_timeout():
    assert timeout_error(30) is None and timeout_error(0.5) is None
