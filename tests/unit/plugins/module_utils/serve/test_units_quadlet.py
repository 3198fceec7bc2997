# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit text, checked with the real Quadlet generator when one is available.

The generator is Podman's own ``quadlet`` binary (Podman >= 4.4). Debian
bookworm has none; ``make bootstrap`` puts trixie's at .lab/tools/quadlet, or
point LOCALINFERENCE_QUADLET at one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    normalise,
    recipe_hash,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import Node
from ansible_collections.localinference.vllm.plugins.module_utils.serve._quadlet import (
    exec_start,
    podman_options,
    run_time_conflicts,
    split_dryrun,
    systemd_split,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._units import (
    HASH_MARKER,
    UnitRenderError,
    model_location,
    render_units,
    systemd_quote,
    unit_hash,
    unit_problems,
)

ROOT = Path(__file__).parents[5]
REV = "5eed0c0ffee0000000000000000000000000000a"
IMAGE = "localhost/localinference-vllm-cpu@sha256:" + "ab" * 32
WEIGHTS = "/srv/models/hub/models--localinference--tiny-deepseek/snapshots/" + REV
RECIPE = {
    "model": "localinference/tiny-deepseek",
    "revision": REV,
    "image": IMAGE,
    "entrypoint": "/opt/vllm/bin/vllm",
    "tensor_parallel_size": 2,
    "max_model_len": 4096,
    "reasoning_parser": "deepseek_r1",
    "tool_call_parser": "deepseek_v3",
    "enable_auto_tool_choice": True,
    "speculative_config": {"method": "mtp", "num_speculative_tokens": 5},
    "ulimits": ["nofile=20000:20000"],
    "env": {"ODD": 'a b "c" $HOME 50%'},
}


def quadlet_binary() -> str | None:
    for candidate in (
        os.environ.get("LOCALINFERENCE_QUADLET", ""),
        "/usr/libexec/podman/quadlet",
        str(ROOT / ".lab" / "tools" / "quadlet"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


QUADLET = quadlet_binary()
needs_quadlet = pytest.mark.skipif(
    QUADLET is None, reason="no Quadlet generator (Podman >= 4.4) here"
)


def node(rank: int, nnodes: int = 2) -> Node:
    address = f"10.77.0.1{rank + 1}"
    return Node(
        f"spark-{rank}", rank, nnodes, "10.77.0.11", address, {"VLLM_HOST_IP": address}, WEIGHTS
    )


def dryrun(tmp_path: Path, units: list[dict]) -> tuple[int, str, str]:
    for unit in units:
        (tmp_path / unit["name"]).write_text(unit["content"])
    proc = subprocess.run(
        [QUADLET, "-dryrun"],
        env={"LC_ALL": "C", "QUADLET_UNIT_DIRS": str(tmp_path), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_model_location_mounts_the_repo_for_snapshot_symlinks():
    assert model_location(WEIGHTS, REV) == (
        "/srv/models/hub/models--localinference--tiny-deepseek",
        "/models/snapshots/" + REV,
    )
    assert model_location("/data/plain-model", REV) == ("/data/plain-model", "/models")


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("--port", "--port"),
        ("a b", '"a b"'),
        ('{"k":1}', '"{\\"k\\":1}"'),
        ("50%", '"50%%"'),
        ("$X", '"$$X"'),
    ],
)
def test_systemd_quote_round_trip(arg, quoted):
    assert systemd_quote(arg) == quoted
    assert systemd_split(quoted) == [arg]


@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_every_unit_carries_the_hash(backend):
    recipe = normalise({**RECIPE, "executor_backend": backend})
    digest = recipe_hash(recipe)
    for rank in (0, 1):
        for unit in render_units(recipe, node(rank), digest)["units"]:
            assert unit_hash(unit["content"]) == digest
            assert f"LOCALINFERENCE_RECIPE_HASH={digest}" in unit["content"]


def test_start_order_ray_before_server_and_mp_single_unit():
    ray = normalise({**RECIPE, "executor_backend": "ray"})
    assert render_units(ray, node(0), "h")["start_order"] == [
        "localinference-ray.service",
        "localinference-vllm.service",
    ]
    assert render_units(ray, node(1), "h")["start_order"] == ["localinference-ray.service"]
    mp = normalise(RECIPE)
    assert render_units(mp, node(1), "h")["start_order"] == ["localinference-vllm.service"]


def test_systemd_mode_service_runs_the_venv_with_the_same_argv():
    recipe = normalise(
        {**RECIPE, "image": None, "deploy_mode": "systemd", "vllm_version": "0.32.0"}
    )
    out = render_units(recipe, node(1), recipe_hash(recipe), "/opt/localinference/vllm-0.32.0")
    (unit,) = out["units"]
    assert unit["name"] == "localinference-vllm.service"
    assert exec_start(unit["content"]) == [
        "/opt/localinference/vllm-0.32.0/bin/vllm",
        *out["server_argv"],
    ]
    assert out["server_argv"][1] == WEIGHTS  # host path, no container mount
    assert "LimitNOFILE=20000:20000" in unit["content"]
    assert "Restart=always" in unit["content"]  # F11: an engine that exits 0 comes back too


@pytest.mark.parametrize("mode", ["quadlet", "systemd"])
def test_only_a_headless_rank_is_killed_after_a_short_grace(mode):
    """Its worker ignores the shutdown and SIGTERM (vLLM 0.32 in the lab): without this every
    cluster restart waited podman's 10 s stop timeout on the worker."""
    recipe = normalise({**RECIPE, "deploy_mode": mode, "vllm_version": "0.32.0"})
    venv = "/opt/localinference/vllm-0.32.0"
    head, worker = (render_units(recipe, node(rank), recipe_hash(recipe), venv) for rank in (0, 1))
    (head_unit,), (worker_unit,) = head["units"], worker["units"]
    assert "--headless" in worker["server_argv"] and "--headless" not in head["server_argv"]
    if mode == "quadlet":
        assert "PodmanArgs=--stop-timeout=3" in worker_unit["content"].splitlines()
        assert "--stop-timeout" not in head_unit["content"]
    else:
        assert "TimeoutStopSec=3" in worker_unit["content"].splitlines()
    assert "TimeoutStopSec=120" in head_unit["content"].splitlines()


@needs_quadlet
def test_the_generator_puts_the_headless_stop_timeout_on_podman_run(tmp_path):
    recipe = normalise(RECIPE)
    out = render_units(recipe, node(1), recipe_hash(recipe))
    rc, stdout, stderr = dryrun(tmp_path, out["units"])
    assert rc == 0, stderr
    argv = exec_start(split_dryrun(stdout)["localinference-vllm.service"])
    assert "--stop-timeout=3" in argv[: argv.index(IMAGE)]


@needs_quadlet
@pytest.mark.parametrize("backend", ["mp", "ray"])
@pytest.mark.parametrize("rank", [0, 1])
def test_real_quadlet_generator_accepts_units_and_keeps_argv(tmp_path, backend, rank):
    recipe = normalise({**RECIPE, "executor_backend": backend})
    out = render_units(recipe, node(rank), recipe_hash(recipe))
    rc, stdout, stderr = dryrun(tmp_path, out["units"])
    assert rc == 0, stderr
    services = split_dryrun(stdout)
    assert sorted(services) == sorted(out["start_order"])
    if out["server_argv"]:
        argv = exec_start(services["localinference-vllm.service"])
        assert argv[-len(out["server_argv"]) - 1 :] == [IMAGE, *out["server_argv"]]
        assert "--entrypoint" in argv and "/opt/vllm/bin/vllm" in argv
        assert f"ODD={RECIPE['env']['ODD']}" in argv
        assert run_time_conflicts(argv) == []
    if out["ray_argv"]:
        argv = exec_start(services["localinference-ray.service"])
        assert argv[-len(out["ray_argv"]) :] == out["ray_argv"]


@needs_quadlet
def test_real_generator_rejects_unknown_key(tmp_path):
    recipe = normalise(RECIPE)
    (unit,) = render_units(recipe, node(0), "h")["units"]
    unit = {**unit, "content": unit["content"].replace("[Container]\n", "[Container]\nIpc=host\n")}
    rc, _, stderr = dryrun(tmp_path, [unit])
    assert rc == 1
    assert "unsupported key 'Ipc'" in stderr


@needs_quadlet
@pytest.mark.parametrize(
    ("change", "ids"),
    [
        ({"ipc_host": True}, []),
        (
            {"ipc_host": True, "shm_size": "1g"},
            [("F14", True)],
        ),  # the generator accepts it: we must not
        ({"podman_args": ["--ipc=host"]}, [("F14", True)]),
        ({"privileged": True}, [("F17", False)]),
        ({"podman_args": ["--privileged"]}, [("F17", True)]),
    ],
)
def test_f14_f17_found_on_the_generated_command(tmp_path, change, ids):
    recipe = normalise({**RECIPE, **change})
    (unit,) = render_units(recipe, node(0), "h")["units"]
    rc, stdout, stderr = dryrun(tmp_path, [unit])
    assert rc == 0, stderr
    argv = exec_start(split_dryrun(stdout)["localinference-vllm.service"])
    found = run_time_conflicts(argv, allow_privileged=recipe["privileged"])
    assert [(f["id"], f["blocking"]) for f in found] == ids


def test_flags_after_the_image_belong_to_vllm():
    argv = [
        "/usr/bin/podman",
        "run",
        "--name",
        "x",
        "--shm-size",
        "1g",
        "img@sha256:1",
        "serve",
        "--privileged",
    ]
    assert podman_options(argv) == argv[:6]
    assert run_time_conflicts(argv) == []


def test_service_environment_keeps_dollar_and_doubles_percent():
    """systemd expands %-specifiers in Environment= but not $VAR; Quadlet copies the
    assignment into the podman command line, where $ must be doubled."""
    service = normalise({**RECIPE, "image": None, "deploy_mode": "systemd", "vllm_version": "0.32"})
    (unit,) = render_units(service, node(0), "h", "/opt/v")["units"]
    assert 'Environment="ODD=a b \\"c\\" $HOME 50%%"' in unit["content"]
    (container,) = render_units(normalise(RECIPE), node(0), "h")["units"]
    assert 'Environment="ODD=a b \\"c\\" $$HOME 50%%"' in container["content"]


def test_description_doubles_percent_of_a_served_name():
    recipe = normalise({**RECIPE, "served_model_name": "tiny-50%"})
    (unit,) = render_units(recipe, node(0), "h")["units"]
    assert "Description=vLLM tiny-50%% rank 0/2 on spark-0" in unit["content"]
    assert unit_problems(unit["content"]) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        # Values that escaped validation (normalise bypassed): the renderer still refuses.
        ({"served_model_name": "m\n[Service]\nExecStartPre=/bin/touch /tmp/pwned"}, "line break"),
        ({"image": "x@sha256:0\nExecStartPre=/bin/sh"}, "line break"),
        ({"shm_size": "1g\\"}, "ends in a backslash"),
        ({"devices": ["a\rb"]}, "holds '\\r'"),
    ],
)
def test_rendered_units_are_checked_after_rendering(change, problem):
    recipe = {**normalise(RECIPE), **change}
    with pytest.raises(UnitRenderError) as caught:
        render_units(recipe, node(0), "h")
    message = str(caught.value)
    assert message.startswith("localinference-vllm.container: "), message
    assert problem in message and "nothing was written" in message


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (
            lambda t: t.replace("[Install]", "[Install]\nExecStartPre=/bin/sh"),
            "template writes in [Install]",
        ),
        (
            lambda t: t.replace("Pull=never", "Pull=never\nPodmanArgs=--privileged\n[X-Evil]"),
            "[X-Evil]",
        ),
        (lambda t: t.replace("Pull=never", "# a comment"), "not a comment the template writes"),
        (
            lambda t: t.replace("Pull=never", "Pull=never\n" + HASH_MARKER + "0"),
            "2 recipe hash headers",
        ),
        (lambda t: t.replace("[Unit]", "Description=before any section\n[Unit]"), "in [-]"),
    ],
)
def test_unit_problems_finds_lines_the_template_does_not_write(edit, problem):
    (unit,) = render_units(normalise(RECIPE), node(0), "h")["units"]
    assert unit_problems(unit["content"]) == []
    found = unit_problems(edit(unit["content"]))
    assert found and any(problem in line for line in found), found


JIT_CACHE_LINES = (
    "TORCHINDUCTOR_CACHE_DIR={cache}/inductor",
    "TRITON_CACHE_DIR={cache}/triton",
    "FLASHINFER_WORKSPACE_BASE={cache}/flashinfer",
    "TILELANG_CACHE_DIR={cache}/tilelang",
    "CUTE_DSL_CACHE_DIR={cache}/cute_dsl",
    "CUDA_CACHE_PATH={cache}/cuda",
)


@pytest.mark.parametrize(
    ("mode", "cache"),
    [("quadlet", "/var/cache/vllm"), ("systemd", "/var/cache/localinference/vllm")],
)
def test_every_jit_cache_is_on_the_cache_mount(mode, cache):
    """A compile's results outlive the engine: the container's home is new at every start,
    so a cache left there is compiled again after each restart (issue 37, item 6)."""
    recipe = normalise({**RECIPE, "deploy_mode": mode, "vllm_version": "0.32.0",
                        **({"image": None} if mode == "systemd" else {})})
    assert recipe["cache_dir"] == "/var/cache/localinference/vllm"
    (unit,) = render_units(recipe, node(0), "h", "/opt/v")["units"]
    lines = unit["content"].splitlines()
    assert f"Environment=VLLM_CACHE_ROOT={cache}" in lines
    for line in JIT_CACHE_LINES:
        assert "Environment=" + line.format(cache=cache) in lines
    if mode == "quadlet":
        assert "Volume=/var/cache/localinference/vllm:/var/cache/vllm" in lines
        # torch's precompiled headers ignore TORCHINDUCTOR_CACHE_DIR (a fresh /tmp each start)
        assert "Volume=/var/cache/localinference/vllm:/tmp/torchinductor_root" in lines


def test_a_recipes_own_cache_directory_wins():
    recipe = normalise({**RECIPE, "env": {"TRITON_CACHE_DIR": "/var/cache/vllm/own-triton",
                                          "CUDA_CACHE_PATH": "/scratch/nv"}})
    out = render_units(recipe, node(0), "h")
    lines = out["units"][0]["content"].splitlines()
    assert "Environment=TRITON_CACHE_DIR=/var/cache/vllm/own-triton" in lines
    assert "Environment=CUDA_CACHE_PATH=/scratch/nv" in lines
    assert "Environment=TRITON_CACHE_DIR=/var/cache/vllm/triton" not in lines
    assert out["environment"]["FLASHINFER_WORKSPACE_BASE"] == "/var/cache/vllm/flashinfer"
