# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ingress's footprint for site.yml's "nothing to do?" (roles/ingress/tasks/footprint.yml), rendered.

The key file's content it hands to ``stage_result watch_secrets`` (``no_log``) must be
the env file's line without its newline: Ansible masks a ``no_log`` value only where
the module's invocation log holds it verbatim, and that log escapes a newline, so a
trailing newline put the key in the head's journal (tests/lab/state/test_ingress.py
caught it in CI). The key comes from the controller's key file, as in the lab.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_one_host_stages import ROOT, _ansible_playbook, pytestmark  # noqa: F401

# A valid key (48 characters); it ends in "n", which a stray rstrip of backslashes and n's would cut.
KEY = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKn"
PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.import_role:
        name: localinference.vllm.ingress
        tasks_from: footprint
    - ansible.builtin.copy:
        content: "{{ {'secrets': __site_secrets, 'api_key': __site_api_key} | to_json }}"
        dest: "{{ out }}"
        mode: "0600"
      no_log: true
"""


def footprint(tmp_path: Path, key_line: str) -> dict:
    (tmp_path / "api-key").write_text(key_line)
    (tmp_path / "play.yml").write_text(PLAY)
    python = ROOT / ".venv" / "bin" / "python"
    interpreter = str(python) if python.exists() else "/usr/bin/python3"
    local = {"ansible_connection": "local", "ansible_python_interpreter": interpreter}
    inventory = {"all": {"hosts": {"localhost": local}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    out = tmp_path / "out.json"
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
    }
    done = subprocess.run(
        [_ansible_playbook(), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
         "-e", json.dumps({"ingress_api_key_file": str(tmp_path / "api-key"), "out": str(out),
                           "ingress_endpoint_file": str(tmp_path / "endpoint")})],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert KEY not in done.stdout + done.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("key_line", [KEY + "\n", KEY, KEY + "\n\n"], ids=["newline", "none", "blank-line"])
def test_the_key_file_content_is_handed_on_without_its_newline(tmp_path, key_line):
    found = footprint(tmp_path, key_line)
    assert found["secrets"] == [
        {"path": "/etc/localinference/ingress/api-key.env", "content": f"LOCALINFERENCE_INGRESS_API_KEY={KEY}"}
    ]
    assert found["api_key"] == KEY


def test_a_bad_key_matches_nothing(tmp_path):
    found = footprint(tmp_path, "short key\n")
    assert found["secrets"][0]["content"] == ""
