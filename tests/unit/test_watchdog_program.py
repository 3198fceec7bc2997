# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog program the role installs: every module_utils file it imports is embedded,
each after what it imports, and the rendered program runs its node verb parser and refuses
bad input without a traceback."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
UTILS = ROOT / "plugins" / "module_utils"
PACKAGE = "ansible_collections.localinference.vllm.plugins.module_utils"


def imports(name: str) -> list[str]:
    tree = ast.parse((UTILS / f"{name}.py").read_text())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            out += [a.name for a in node.names] if node.module == PACKAGE else [node.module.rsplit(".", 1)[1]]
    return out


def test_sources_are_the_import_closure_in_order() -> None:
    sources = yaml.safe_load((ROOT / "roles/watchdog/vars/main.yml").read_text())["__watchdog_sources"]
    assert sources[-1] == "_watchdog"
    for index, name in enumerate(sources):
        for needed in imports(name):
            assert needed in sources[:index], f"{name} imports {needed}, which is not embedded before it"
    needed = {"_watchdog"}
    todo = ["_watchdog"]
    while todo:
        for dep in imports(todo.pop()):
            if dep not in needed:
                needed.add(dep)
                todo.append(dep)
    assert set(sources) == needed


def render(tmp_path: Path) -> Path:
    """The program as the template renders it (the same embedding, without Ansible)."""
    import base64

    sources = yaml.safe_load((ROOT / "roles/watchdog/vars/main.yml").read_text())["__watchdog_sources"]
    template = (ROOT / "roles/watchdog/templates/watchdog.j2").read_text()
    head, _, rest = template.partition("{% for name in __watchdog_sources %}")
    _, _, tail = rest.partition("{% endfor %}\n")
    lines = "".join(
        f'    ("{n}", "{base64.b64encode((UTILS / f"{n}.py").read_bytes()).decode()}"),\n' for n in sources)
    text = head.split("#}\n", 1)[1].replace("{{ '#!/usr/bin/python3 -I' }}", "#!/usr/bin/python3 -I") + lines + tail
    program = tmp_path / "watchdog"
    program.write_text(text)
    return program


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
