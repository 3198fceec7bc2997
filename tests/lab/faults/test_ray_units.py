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

import re

import pytest

from lab.harness import (
    BIN,
    CLUSTER_ADDRESSES,
    HEAD,
    HOSTS,
    LAB_DIR,
    exec_on,
    first_token,
    inventory_recipe,
    rollout,
    run,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

WHEELHOUSE = LAB_DIR / "ray-wheelhouse"
RAY = "ray==2.60.0"
VENV = "/opt/localinference/vllm-0.32.0"


def ensure_wheelhouse() -> None:
    if any(WHEELHOUSE.glob("ray-2.60.0-cp313-*.whl")):
        return
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    platforms = ["--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64"]
    cmd = [str(BIN / "pip"), "download", "--quiet", RAY, "--python-version", "3.13"]
    run(
        [*cmd, "--implementation", "cp", "--only-binary=:all:", *platforms, "-d", str(WHEELHOUSE)],
        timeout=900,
    )


# A Ray cluster from the units and back to mp: 288 s in the clean-clone CI of 0cd4aaa
# (make test-lab-extended).
@pytest.mark.extended
def test_ray_head_and_worker_units_form_a_two_node_cluster():
    ensure_wheelhouse()
    base = inventory_recipe()
    recipe = {k: v for k, v in base.items() if k not in ("image", "entrypoint", "ulimits")}
    recipe.update({"deploy_mode": "systemd", "vllm_version": "0.32.0", "executor_backend": "ray"})
    extra = {
        "serve_start_server": False,
        "serve_venv_packages": [RAY],
        "serve_wheelhouse": str(WHEELHOUSE),
    }
    try:
        proc = rollout(recipe, extra_vars=extra)
        assert proc.rc == 0, proc.tail()
        status = exec_on(
            HEAD, f"{VENV}/bin/ray", "status", "--address", f"{CLUSTER_ADDRESSES[HEAD]}:6379"
        ).stdout
        nodes = re.findall(r"(?m)^\s*1 node_[0-9a-f]+", status)
        assert len(nodes) == 2, status
        for host in HOSTS:
            unit = exec_on(
                host,
                "systemctl",
                "show",
                "-p",
                "ActiveState",
                "--value",
                "localinference-ray.service",
            )
            assert unit.stdout.strip() == "active"
            text = exec_on(host, "cat", "/etc/systemd/system/localinference-ray.service").stdout
            assert f"ExecStart={VENV}/bin/ray start --block" in text
            assert "RAY_memory_monitor_refresh_ms=0" in text
    finally:
        back = rollout()
        assert back.rc == 0, back.tail()
        first_token()
