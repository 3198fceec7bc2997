# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every stage before the rollout on a one-host inventory, as a user runs it (check mode).

The case table is ``one_host_stages.yml``: one ``ansible-playbook <stage>.yml --check``
per case against an inventory whose only node is ``rtx-host`` (a ``vllm_head``, no
``vllm_workers``), local connection. Each stage must succeed, say what a single
host means for it once, and run none of the tasks that only several nodes need.
Skipped tasks are not shown (``ANSIBLE_DISPLAY_SKIPPED_HOSTS=false``), so an
excluded task name means the task ran; texts are compared with runs of white
space made one (the callback wraps long messages). The rollout's rendering for one host is
``plugins/module_utils/serve/test_units_one_host.py``; the real thing is the one-host
lab (``make test-onehost``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CASES = yaml.safe_load((HERE / "one_host_stages.yml").read_text())["cases"]
TIMEOUT = 120


def _ansible_playbook() -> str | None:
    venv = ROOT / ".venv" / "bin" / "ansible-playbook"
    return str(venv) if venv.exists() else shutil.which("ansible-playbook")


pytestmark = pytest.mark.skipif(
    _ansible_playbook() is None
    or not (ROOT / ".lab" / "collections" / "ansible_collections" / "localinference").exists(),
    reason="needs ansible-playbook and .lab/collections (make bootstrap)",
)


def _fill(value: Any, directory: Path) -> Any:
    if isinstance(value, str):
        return value.replace("{dir}", str(directory)).replace("{root}", str(ROOT))
    if isinstance(value, list):
        return [_fill(item, directory) for item in value]
    if isinstance(value, dict):
        return {key: _fill(item, directory) for key, item in value.items()}
    return value


def _run(case: dict[str, Any], directory: Path) -> tuple[int, str]:
    for name, content in (case.get("files") or {}).items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(content)
    python = ROOT / ".venv" / "bin" / "python"
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": str(python)
                if python.exists()
                else "/usr/bin/python3",
                **_fill(case.get("vars") or {}, directory),
            },
            "children": {
                "vllm_cluster": {
                    "children": {"vllm_head": {"hosts": {"rtx-host": {}}}, "vllm_workers": {}}
                }
            },
        }
    }
    (directory / "hosts.yml").write_text(yaml.safe_dump(inventory))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "false",
        "ANSIBLE_LOCAL_TEMP": str(directory / "ansible-tmp"),
    }
    for name, value in (case.get("env") or {}).items():
        env[name] = _fill(value, directory).replace("{PATH}", os.environ.get("PATH", ""))
    done = subprocess.run(
        [_ansible_playbook(), "-i", str(directory / "hosts.yml"),
         str(ROOT / "playbooks" / case["playbook"]), "--check"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_stage_on_one_host(tmp_path: Path, case: dict[str, Any]) -> None:
    rc, output = _run(case, tmp_path)
    assert rc == 0, output[-4000:]
    assert "failed=0" in output and "unreachable=0" in output, output[-2000:]
    # Compared with runs of white space made one: the YAML callback wraps long messages.
    flat = " ".join(output.split())
    for text in case.get("once") or []:
        text = " ".join(text.split())
        assert flat.count(text) == 1, f"{text!r} not shown exactly once:\n{output[-4000:]}"
    for text in case.get("include") or []:
        text = " ".join(text.split())
        assert text in flat, f"{text!r} not in the output:\n{output[-4000:]}"
    for text in case.get("exclude") or []:
        text = " ".join(text.split())
        assert text not in flat, f"{text!r} in the output:\n{output[-4000:]}"
