# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ray head and worker units, for real, in the lab (make lab first).

vLLM's CPU build cannot run the Ray executor (`current platform cpu does not
support ray`), so this proves the Ray half of the serve role: deploy_mode
systemd installs a venv on each host from a local wheelhouse (Ray 2.60 for the
hosts' Python 3.13, made with `pip download` on the controller), the units
`localinference-ray.service` form a two-node cluster over the cluster link, and
`ray status` on the head shows both nodes. The vLLM server is not started
(serve_start_server: false); the Ray-mode vLLM command line is checked by the
unit tests. Afterwards the inventory's recipe (TP=2 over mp) is rolled out again.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_rollout_faults import ROOT, first_token, inventory_recipe, lab_up, podman, rollout

pytestmark = pytest.mark.lab

WHEELHOUSE = ROOT / ".lab" / "ray-wheelhouse"
RAY = "ray==2.60.0"


def ensure_wheelhouse() -> None:
    if any(WHEELHOUSE.glob("ray-2.60.0-cp313-*.whl")):
        return
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    pip = str(ROOT / ".venv" / "bin" / "pip")
    platforms = ["--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64"]
    cmd = [pip, "download", "--quiet", RAY, "--python-version", "3.13", "--implementation", "cp"]
    subprocess.run(
        [*cmd, "--only-binary=:all:", *platforms, "-d", str(WHEELHOUSE)],
        check=True,
    )


def test_ray_head_and_worker_units_form_a_two_node_cluster(tmp_path):
    if not lab_up():
        pytest.skip("the lab is not up (make lab)")
    ensure_wheelhouse()
    base = inventory_recipe()
    recipe = {k: v for k, v in base.items() if k not in ("image", "entrypoint", "ulimits")}
    recipe.update({"deploy_mode": "systemd", "vllm_version": "0.32.0", "executor_backend": "ray"})
    extra = tmp_path / "ray.json"
    extra.write_text(
        json.dumps(
            {
                "vllm_recipe": recipe,
                "serve_start_server": False,
                "serve_venv_packages": [RAY],
                "serve_wheelhouse": str(WHEELHOUSE),
            }
        )
    )
    try:
        proc = rollout(tags="fabric,rollout", extra=str(extra))
        assert proc.returncode == 0, proc.stdout[-3000:]
        venv = "/opt/localinference/vllm-0.32.0"
        status = podman(
            "exec", "spark-head", f"{venv}/bin/ray", "status", "--address", "10.77.0.11:6379"
        ).stdout
        nodes = re.findall(r"(?m)^\s*1 node_[0-9a-f]+", status)
        assert len(nodes) == 2, status
        for host in ("spark-head", "spark-worker"):
            unit = podman(
                "exec",
                host,
                "systemctl",
                "show",
                "-p",
                "ActiveState",
                "--value",
                "localinference-ray.service",
            )
            assert unit.stdout.strip() == "active"
            text = podman(
                "exec", host, "cat", "/etc/systemd/system/localinference-ray.service"
            ).stdout
            assert "ExecStart=/opt/localinference/vllm-0.32.0/bin/ray start --block" in text
            assert "RAY_memory_monitor_refresh_ms=0" in text
    finally:
        back = rollout()
        assert back.returncode == 0, back.stdout[-3000:]
        first_token()
