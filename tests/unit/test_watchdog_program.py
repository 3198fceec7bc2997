# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog program the role installs: every module_utils file it imports is embedded,
each after what it imports, and the rendered program runs its node verb parser and refuses
bad input without a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ansible_collections.localinference.vllm.plugins.module_utils.common import _embed

ROOT = Path(__file__).resolve().parents[2]


def render(tmp_path: Path) -> Path:
    """The program as the template renders it (common/_embed.py, without Ansible)."""
    program = tmp_path / "watchdog"
    program.write_text(_embed.program("watchdog._program", []))
    return program


def test_the_template_embeds_the_watchdog_and_what_it_imports() -> None:
    template = (ROOT / "roles/watchdog/templates/watchdog.j2").read_text()
    assert "'watchdog._program' | localinference.vllm.embedded_program(" in template
    sources = _embed.closure("watchdog._program")
    assert sources[-1] == "watchdog._program"
    assert {"serve._restart", "engine._token_probe", "common._validate"} <= set(sources)


def test_the_program_refuses_a_bad_node_command(tmp_path: Path) -> None:
    program = render(tmp_path)
    for command in ("bash -i", "probe; reboot", "start sshd.service"):
        done = subprocess.run([sys.executable, "-I", str(program), "node"], capture_output=True, text=True,
                              timeout=60, env={"SSH_ORIGINAL_COMMAND": command})
        assert done.returncode == 1 and "refused" in done.stdout and "Traceback" not in done.stderr


def test_the_program_refuses_a_bad_config(tmp_path: Path) -> None:
    program = render(tmp_path)
    config = tmp_path / "watchdog.json"
    config.write_text('{"schema": 1, "interval_s": 30, "token_deadline_s": 45}')
    done = subprocess.run([sys.executable, "-I", str(program), "once", "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "watchdog_probe_timeout_s" in done.stderr or "watchdog_token_deadline_s" in done.stderr
