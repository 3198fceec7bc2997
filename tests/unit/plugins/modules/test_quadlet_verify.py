# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""quadlet_verify against the real Quadlet generator (skipped where none exists)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.modules import quadlet_verify
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module
from ansible_collections.localinference.vllm.tests.unit.plugins.module_utils.serve.test_units_quadlet import (
    QUADLET,
)

pytestmark = pytest.mark.skipif(QUADLET is None, reason="no Quadlet generator (Podman >= 4.4) here")

UNIT = """[Container]
Image=localhost/x@sha256:{digest}
ContainerName=localinference-vllm
{extra}
Exec=serve /models --privileged-looking-arg
"""


def write(tmp_path: Path, extra: str) -> str:
    (tmp_path / "localinference-vllm.container").write_text(
        UNIT.format(digest="0" * 64, extra=extra)
    )
    return str(tmp_path)


@pytest.mark.parametrize(
    ("extra", "allow", "failed", "ids", "message"),
    [
        ("ShmSize=1g", False, False, [], None),
        ("PodmanArgs=--ipc=host", False, False, [], None),
        ("ShmSize=1g\nPodmanArgs=--ipc=host", False, True, ["F14"], "--ipc=host and --shm-size"),
        ("PodmanArgs=--privileged", False, True, ["F17"], "runs --privileged"),
        ("PodmanArgs=--privileged", True, False, ["F17"], None),
        ("Ipc=host", False, True, [], "unsupported key 'Ipc'"),
    ],
)
def test_cases(tmp_path, extra, allow, failed, ids, message):
    out = run_module(
        quadlet_verify,
        {"unit_dir": write(tmp_path, extra), "quadlet": QUADLET, "allow_privileged": allow},
    )
    assert out.failed is failed, out.result
    assert [f["id"] for f in out.result["findings"]] == ids
    if message:
        assert message in out.result["msg"]
    if not failed:
        argv = out.result["services"]["localinference-vllm.service"]["exec_start"]
        assert argv[-3:] == ["serve", "/models", "--privileged-looking-arg"]


def test_missing_generator_names_the_fix(tmp_path):
    out = run_module(quadlet_verify, {"unit_dir": str(tmp_path), "quadlet": str(tmp_path / "nope")})
    assert out.failed
    assert "Podman 4.4" in out.result["msg"] and "deploy_mode: systemd" in out.result["msg"]
