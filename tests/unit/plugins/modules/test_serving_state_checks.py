# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""serving_state's checks: staging's node-side checks in the call that renders the recipe.

Stand-in ``ip``, ``systemctl`` and ``podman`` commands (tests/unit/fixtures/stage: what the
lab head printed) stand first on PATH: this machine runs no lab units. The Quadlet check
runs the real generator where one exists (make test-unit extracts it from the lab image).
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve._stage_checks import (
    help_cache_file,
)
from ansible_collections.localinference.vllm.plugins.modules import serving_state
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module
from ansible_collections.localinference.vllm.tests.unit.plugins.module_utils.serve.test_units_quadlet import (
    QUADLET,
)
from ansible_collections.localinference.vllm.tests.unit.plugins.modules.test_serving_state import (
    HELP,
    RECIPE,
    args,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "stage"
SERVER = "localinference-vllm.service"


def executable(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def node_bin(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "ip", f"cat '{FIXTURES / 'ip-o-addr-head.txt'}'\n")
    executable(bin_dir / "systemctl", f"cat '{FIXTURES / 'systemctl-show-head.txt'}'\n")
    executable(bin_dir / "podman", f"cat '{HELP}'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def staged(paths, checks, rank=0, nnodes=2, address="10.77.0.11", **recipe):
    arguments = args(paths, "staged", rank=rank, **recipe)
    arguments["node"].update(nnodes=nnodes, address=address)
    arguments["checks"] = checks
    return arguments


def test_a_saturated_node_is_refused_before_anything_is_written(paths, node_bin):
    out = run_module(serving_state, staged(paths, {"max_load_per_cpu": -1.0}))
    assert out.failed
    assert out.result["msg"].startswith("F5: spark-worker is saturated, not down: load ")
    assert "Nothing was changed on any node" in out.result["msg"]
    assert not Path(paths["staging_dir"]).exists()
    fine = run_module(serving_state, staged(paths, {"max_load_per_cpu": 1e9}))
    assert not fine.failed, fine.result
    assert set(fine.result["node_load"]) == {"load1", "ncpu", "per_cpu"}


def test_a_node_without_its_cluster_address_is_refused(paths, node_bin):
    out = run_module(serving_state, staged(paths, {}, address="10.77.0.12"))
    assert out.failed
    assert 'spark-worker does not hold its cluster address "10.77.0.12"' in out.result["msg"]
    assert not Path(paths["staging_dir"]).exists()
    assert not run_module(serving_state, staged(paths, {"cluster_address": False}, address="10.77.0.12")).failed


def test_the_guard_programs_are_installed_last_and_once(paths, node_bin, tmp_path):
    libexec = tmp_path / "libexec"
    checks = {"programs_dir": str(libexec), "programs": [{"name": "admission", "content": "#!/bin/sh\nexit 0\n"}]}
    dry = run_module(serving_state, staged(paths, checks), check_mode=True)
    assert dry.result["changed"] is True and dry.result["programs"] == [str(libexec / "admission")]
    assert not libexec.exists()
    first = run_module(serving_state, staged(paths, checks))
    assert first.result["programs"] == [str(libexec / "admission")]
    assert stat.S_IMODE((libexec / "admission").stat().st_mode) == 0o755
    again = run_module(serving_state, staged(paths, checks))
    assert again.result["changed"] is False and again.result["programs"] == []


@pytest.mark.parametrize(
    ("checks", "message"),
    [
        ({"programs": [{"name": "x", "content": ""}]}, "checks.programs_dir: is not set but checks.programs is"),
        ({"programs_dir": "/usr/local/libexec/x", "programs": [{"name": "../x", "content": ""}]}, "checks.programs[0].name: '../x' is not a file name"),
        ({"timeout": 0}, "checks.timeout: 0.0 is not a number of seconds above 0"),
        ({"help_timeout": float("inf")}, "checks.help_timeout: inf is not a number"),
        ({"quadlet": "relative/quadlet"}, "checks.quadlet: 'relative/quadlet' is not an absolute path"),
    ],
)
def test_bad_checks_are_refused_before_anything_runs(paths, checks, message):
    out = run_module(serving_state, staged(paths, checks))
    assert out.failed and out.result["msg"].startswith(message), out.result["msg"]
    assert not Path(paths["staging_dir"]).exists()


def test_checks_belong_to_staging_and_verification(paths):
    arguments = args(paths, "present")
    arguments["checks"] = {}
    out = run_module(serving_state, arguments)
    assert out.failed and "checks: only with state=staged or verified" in out.result["msg"]


def test_a_port_another_process_holds_is_refused_on_the_head(paths, node_bin):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = run_module(serving_state, staged(paths, {"ports": True}, nnodes=1, address="", port=port))
        worker = run_module(serving_state, staged(paths, {"ports": True}, rank=1, port=port))
    assert out.failed
    assert f"port {port} on 127.0.0.1 is held by pid {os.getpid()}" in out.result["msg"]
    assert "so nothing was changed" in out.result["msg"]
    assert not worker.failed and worker.result["listeners"] == []


def test_the_running_units_are_read_in_the_same_call(paths, node_bin):
    run_module(serving_state, {**args(paths, "present", rank=0), "help_text": str(HELP)})
    out = run_module(serving_state, staged(paths, {"unit_states": True}))
    assert out.result["live_start_order"] == [SERVER]
    assert out.result["live_active"] == {SERVER: "active"}
    assert out.result["live_running"] is True
    fresh = run_module(serving_state, staged({**paths, "path": paths["path"] + ".none"}, {"unit_states": True}))
    assert fresh.result["live_active"] == {} and fresh.result["live_running"] is False


def test_the_images_help_is_asked_once_and_checks_the_flags(paths, node_bin, tmp_path):
    cache = tmp_path / "help"
    arguments = staged(paths, {"help_cache_dir": str(cache)})
    del arguments["help_text"]
    cached = Path(help_cache_file(str(cache), RECIPE["image"]))
    dry = run_module(serving_state, arguments, check_mode=True)
    assert not dry.failed and not cached.exists()  # check mode asks no image
    out = run_module(serving_state, arguments)
    assert not out.failed, out.result
    assert cached.read_text() == HELP.read_text().rstrip("\n") + "\n"
    os.unlink(node_bin / "podman")  # the cache answers from now on
    bad = staged(paths, {"help_cache_dir": str(cache)}, extra_args=["--no-such-flag"])
    del bad["help_text"]
    refused = run_module(serving_state, bad)
    assert refused.failed and "flags this vLLM release does not have: --no-such-flag" in refused.result["msg"]


@pytest.mark.skipif(QUADLET is None, reason="no Quadlet generator (Podman >= 4.4) here")
def test_the_staged_units_pass_the_generator_even_in_check_mode(paths, node_bin, tmp_path):
    quadlet = tmp_path / "quadlet"
    shutil.copy(QUADLET, quadlet)
    dry = run_module(serving_state, staged(paths, {"quadlet": str(quadlet)}), check_mode=True)
    assert not dry.failed, dry.result
    assert "localinference-vllm.service" in dry.result["quadlet"]["services"]
    assert not Path(paths["staging_dir"]).exists()
    out = run_module(serving_state, staged(paths, {"quadlet": str(quadlet)}, privileged=False,
                                           podman_args=["--privileged"]))
    assert out.failed and "F17" in out.result["msg"], out.result["msg"]


def test_verified_checks_the_loaded_services(paths, node_bin):
    run_module(serving_state, args(paths, "present", rank=0))
    arguments = args(paths, "verified", rank=0)
    arguments["checks"] = {"unit_states": True}
    assert not run_module(serving_state, arguments).failed
    executable(node_bin / "systemctl", f"sed s/LoadState=loaded/LoadState=not-found/ '{FIXTURES / 'systemctl-show-head.txt'}'\n")
    out = run_module(serving_state, arguments)
    assert out.failed
    assert f"systemd has no loaded service for {SERVER} (not-found)" in out.result["msg"]


def test_present_stops_the_running_units_then_writes_and_reloads_once(paths, node_bin, tmp_path):
    calls = tmp_path / "calls"
    executable(
        node_bin / "systemctl",
        f"echo \"$@\" >> '{calls}'\n"
        f"case \"$1\" in show) cat '{FIXTURES / 'systemctl-show-head.txt'}';; esac\n",
    )
    first = {**args(paths, "present", rank=0), "stop_live": True, "daemon_reload": True}
    out = run_module(serving_state, first)
    assert out.result["stopped"] == [] and out.result["reloaded"] is True
    assert calls.read_text().splitlines() == ["daemon-reload"]  # nothing lived there before
    calls.unlink()
    changed = {**args(paths, "present", rank=0, max_num_seqs=8), "stop_live": True, "daemon_reload": True}
    dry = run_module(serving_state, changed, check_mode=True)
    assert dry.result["stopped"] == [SERVER] and dry.result["reloaded"] is False
    assert calls.read_text().splitlines() == [f"show -p Id,ActiveState,LoadState -- {SERVER}"]
    calls.unlink()
    out = run_module(serving_state, changed)
    assert out.result["changed"] and out.result["stopped"] == [SERVER] and out.result["reloaded"]
    assert calls.read_text().splitlines() == [
        f"show -p Id,ActiveState,LoadState -- {SERVER}",
        f"stop -- {SERVER}",
        "daemon-reload",
    ]
    calls.unlink()
    executable(node_bin / "systemctl", f"echo \"$@\" >> '{calls}'\nsed s/=active/=inactive/ '{FIXTURES / 'systemctl-show-head.txt'}'\n")
    again = run_module(serving_state, changed)
    assert again.result["changed"] is False and again.result["stopped"] == [] and not again.result["reloaded"]


def test_a_unit_that_will_not_stop_fails_the_step_before_anything_is_written(paths, node_bin):
    run_module(serving_state, args(paths, "present", rank=0))
    executable(
        node_bin / "systemctl",
        f"case \"$1\" in show) cat '{FIXTURES / 'systemctl-show-head.txt'}';; "
        "stop) echo 'Job for x failed' >&2; exit 1;; esac\n",
    )
    before = Path(paths["path"]).read_text()
    out = run_module(serving_state, {**args(paths, "present", rank=0, max_num_seqs=8), "stop_live": True})
    assert out.failed and f"systemctl stop {SERVER} failed (rc 1): Job for x failed" in out.result["msg"]
    assert Path(paths["path"]).read_text() == before
    bad = run_module(serving_state, {**args(paths, "verified", rank=0), "stop_live": True})
    assert bad.failed and "stop_live and daemon_reload: only with state=present" in bad.result["msg"]
