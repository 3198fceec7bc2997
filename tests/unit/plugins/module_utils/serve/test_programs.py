# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The programs the serve role installs for the units' guards, rendered by Ansible's own
template module from roles/serve/templates/ and run as a node runs them: ``python3 -I``,
without the collection (F4 admission, F13 offload reclaim)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.plugins.modules.test_shm_offload import SHM, Files, process_table

ROOT = Path(__file__).resolve().parents[5]
ANSIBLE = ROOT / ".venv" / "bin" / "ansible"
TEMPLATES = ROOT / "roles" / "serve" / "templates"

# The interpreter of the programs' shebang, as on a node.
PYTHON3 = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(
    not ANSIBLE.exists() or not os.access(PYTHON3, os.X_OK),
    reason="needs the venv's ansible (make bootstrap) and /usr/bin/python3",
)


def install(template: str, dest: Path) -> Path:
    """``ansible.builtin.template`` as the role's staging task runs it (role_path set)."""
    done = subprocess.run(
        [
            str(ANSIBLE), "localhost", "-c", "local", "-i", "localhost,",
            "-m", "ansible.builtin.template",
            "-a", f"src={TEMPLATES / template} dest={dest} mode=0755",
            "-e", f"role_path={ROOT / 'roles' / 'serve'}",
            "-e", f"ansible_python_interpreter={sys.executable}",
        ],
        capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "0"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert dest.read_text().startswith("#!/usr/bin/python3 -I\n")
    return dest


def run(program: Path, *argv: str) -> subprocess.CompletedProcess:
    # The shebang's interpreter: -I ignores PYTHONPATH and the user site, as on a node.
    return subprocess.run(
        [PYTHON3, "-I", str(program), *argv],
        capture_output=True, text=True, timeout=120, check=False, cwd="/",
    )


def test_the_admission_program_admits_and_refuses(tmp_path):
    program = install("admission.j2", tmp_path / "admission")
    admitted = run(program, "--need-bytes", "1", "--reserve-bytes", "0", "--host", "node-a")
    assert admitted.returncode == 0, admitted.stderr
    assert admitted.stdout.startswith("localinference admission: admitted on node-a")
    refused = run(program, "--need-bytes", str(2**60), "--reserve-bytes", "0", "--host", "node-a")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("localinference admission refused the start on node-a: ")
    assert len(refused.stderr.splitlines()) == 1


@pytest.mark.skipif(os.geteuid() != 0 or not SHM.is_dir(), reason="needs root and /dev/shm")
def test_the_offload_program_reclaims_an_orphan_and_refuses_without_confirm(tmp_path):
    program = install("shm_offload.j2", tmp_path / "shm-offload")
    podman = tmp_path / "podman"
    podman.write_text("#!/bin/sh\nexit 0\n")
    podman.chmod(0o755)
    files = Files()
    try:
        orphan = files.make(0)
        table = process_table(tmp_path / "proc")
        argv = ["--pattern", files.pattern, "--settle", "0", "--podman", str(podman)]
        done = run(program, "reclaim", "--confirm", *argv, "--proc-root", table)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("localinference shm-offload: reclaimed 1 orphan(s)")
        assert not orphan.exists()
        refused = run(program, "reclaim", *argv)
        assert refused.returncode == 1
        assert refused.stderr.startswith("localinference shm-offload refused: reclaim deletes")
    finally:
        files.cleanup()


def test_the_embedded_sources_are_the_collections_files_byte_for_byte(tmp_path):
    """The program loads exactly the module_utils files, byte for byte."""
    program = install("shm_offload.j2", tmp_path / "shm-offload")
    probe = (
        "import runpy, sys\n"
        f"namespace = runpy.run_path({str(program)!r}, run_name='probe')\n"
        "for name, encoded in namespace['SOURCES']:\n"
        "    import base64\n"
        "    print(name, base64.b64decode(encoded).decode())\n"
        "    print('\\0')\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    utils = ROOT / "plugins" / "module_utils"
    for chunk in filter(str.strip, done.stdout.split("\0\n")):
        name, _, text = chunk.partition(" ")
        assert text == utils.joinpath(*name.split(".")).with_suffix(".py").read_text() + "\n", name
