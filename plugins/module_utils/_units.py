# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit text for a rendered recipe: Podman Quadlet ``.container`` or systemd ``.service``.

Every unit carries the recipe hash three ways (a header comment, the
``LOCALINFERENCE_RECIPE_HASH`` environment variable and, for containers, a
label), so ``verify`` can prove that what runs is what the inventory asked for.
Processes are always started by systemd, never by a backgrounded shell (F11).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils._recipe import (
    Node,
    environment,
    ray_argv,
    serve_argv,
)

SERVER_UNIT = "localinference-vllm"
RAY_UNIT = "localinference-ray"
CONTAINER_MODEL_ROOT = "/models"
CONTAINER_CACHE = "/var/cache/vllm"
RAY_SESSION_DIR = "/run/localinference/ray"
HASH_MARKER = "# localinference.vllm recipe_hash="
_SAFE = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """Quote one argument for ExecStart=/Exec=/Environment= (systemd word rules)."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and _SAFE.match(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _join(argv: list[str]) -> str:
    return " ".join(systemd_quote(a) for a in argv)


def _env_lines(env: dict[str, str]) -> list[str]:
    return [f"Environment={systemd_quote(f'{k}={v}')}" for k, v in env.items()]


def model_location(weights_path: str, revision: str) -> tuple[str, str]:
    """(host directory to mount read-only, model path inside the container).

    A Hugging Face snapshot holds symlinks into ``../../blobs``, so the whole
    ``models--org--name`` directory is mounted and the snapshot addressed inside it.
    """
    path = weights_path.rstrip("/")
    parent, rev = posixpath.split(path)
    repo, snapshots = posixpath.split(parent)
    if snapshots == "snapshots" and rev == revision:
        return repo, f"{CONTAINER_MODEL_ROOT}/snapshots/{revision}"
    return path, CONTAINER_MODEL_ROOT


def _limits(ulimits: list[str]) -> list[str]:
    lines = []
    for item in ulimits:
        name, _, value = item.partition("=")
        soft, _, hard = value.partition(":")
        parts = ["infinity" if v == "-1" else v for v in (soft, hard or soft)]
        lines.append(f"Limit{name.strip().upper()}={parts[0]}:{parts[1]}")
    return lines


def _header(digest: str, what: str) -> list[str]:
    return [
        f"{HASH_MARKER}{digest}",
        "# Managed by localinference.vllm (role serve); edits are replaced by the next rollout.",
        "[Unit]",
        f"Description={what} (recipe {digest[:12]})",
        "Wants=network-online.target",
        "After=network-online.target",
    ]


def _service_tail(recipe: dict[str, Any], extra: list[str] | None = None) -> list[str]:
    return [
        "",
        "[Service]",
        f"ExecStartPre=/usr/bin/mkdir -p {systemd_quote(recipe['cache_dir'])}",
        *(extra or []),
        "Restart=on-failure",
        "RestartSec=30",
        "TimeoutStartSec=900",
        "TimeoutStopSec=120",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]


def _container(
    recipe: dict[str, Any],
    digest: str,
    name: str,
    entrypoint: str,
    argv: list[str],
    env: dict[str, str],
    volumes: list[str],
) -> list[str]:
    lines = [
        "",
        "[Container]",
        f"ContainerName={name}",
        f"Image={recipe['image']}",
        # Air-gapped: the image must already be on the node, never pulled at start.
        "Pull=never",
        "Network=host",
        f"Label=localinference.recipe_hash={digest}",
        f"Entrypoint={entrypoint}",
        *(f"Volume={v}" for v in volumes),
        *(f"AddDevice={d}" for d in recipe["devices"]),
        *(f"Ulimit={u}" for u in recipe["ulimits"]),
    ]
    if recipe.get("shm_size"):
        lines.append(f"ShmSize={recipe['shm_size']}")
    podman_args = list(recipe["podman_args"])
    if recipe["ipc_host"]:
        podman_args.insert(0, "--ipc=host")
    if recipe["privileged"]:
        podman_args.insert(0, "--privileged")
    lines += [f"PodmanArgs={systemd_quote(a)}" for a in podman_args]
    lines += _env_lines(env)
    lines.append(f"Exec={_join(argv)}")
    return lines


def render_units(
    recipe: dict[str, Any], node: Node, digest: str, venv_dir: str = ""
) -> dict[str, Any]:
    """Everything one node runs for a normalised recipe.

    Returns ``{"role", "units": [{"name", "content"}], "server_argv", "ray_argv",
    "environment", "start_order"}``; ``start_order`` lists the systemd service
    names in the order they must start on this node.
    """
    env = environment(recipe, node, digest)
    quadlet = recipe["deploy_mode"] == "quadlet"
    if quadlet:
        mount, model_path = model_location(node.weights_path, recipe["revision"])
        env["VLLM_CACHE_ROOT"] = CONTAINER_CACHE
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", f"{CONTAINER_CACHE}/inductor")
        volumes = [f"{mount}:{CONTAINER_MODEL_ROOT}:ro", f"{recipe['cache_dir']}:{CONTAINER_CACHE}"]
    else:
        model_path = node.weights_path
        env["VLLM_CACHE_ROOT"] = recipe["cache_dir"]
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", f"{recipe['cache_dir']}/inductor")
        volumes = []
    env = dict(sorted(env.items()))
    server = serve_argv(recipe, node, model_path)
    ray = ray_argv(recipe, node)
    units = []
    order = []
    served = recipe["served_model_name"]
    bin_dir = (
        posixpath.dirname(recipe["entrypoint"]) if quadlet else posixpath.join(venv_dir, "bin")
    )

    if ray is not None:
        what = f"Ray {node.role} for {served} on {node.host}"
        ray_env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
        if quadlet:
            lines = _header(digest, what) + _container(
                recipe,
                digest,
                RAY_UNIT,
                posixpath.join(bin_dir, "ray"),
                ray,
                ray_env,
                [*volumes, f"{RAY_SESSION_DIR}:/tmp/ray"],
            )
            pre = [f"ExecStartPre=/usr/bin/mkdir -p {RAY_SESSION_DIR}"]
            units.append(
                {
                    "name": f"{RAY_UNIT}.container",
                    "content": _text(lines + _service_tail(recipe, pre)),
                }
            )
        else:
            lines = [
                *_header(digest, what),
                "",
                "[Service]",
                "Type=exec",
                *_env_lines(ray_env),
                *_limits(recipe["ulimits"]),
                f"ExecStart={_join([posixpath.join(bin_dir, 'ray'), *ray])}",
                f"ExecStop={_join([posixpath.join(bin_dir, 'ray'), 'stop'])}",
            ]
            units.append(
                {"name": f"{RAY_UNIT}.service", "content": _text(lines + _service_tail(recipe)[2:])}
            )
        order.append(f"{RAY_UNIT}.service")

    if server is not None:
        rank = f" rank {node.rank}/{node.nnodes}" if node.nnodes > 1 else ""
        what = f"vLLM {served}{rank} on {node.host}"
        after = [f"Requires={RAY_UNIT}.service", f"After={RAY_UNIT}.service"] if ray else []
        if quadlet:
            if ray:
                volumes = [*volumes, f"{RAY_SESSION_DIR}:/tmp/ray"]
            lines = (
                _header(digest, what)
                + after
                + _container(
                    recipe, digest, SERVER_UNIT, recipe["entrypoint"], server, env, volumes
                )
            )
            units.append(
                {
                    "name": f"{SERVER_UNIT}.container",
                    "content": _text(lines + _service_tail(recipe)),
                }
            )
        else:
            lines = (
                _header(digest, what)
                + after
                + [
                    "",
                    "[Service]",
                    "Type=exec",
                    *_env_lines(env),
                    *_limits(recipe["ulimits"]),
                    f"ExecStart={_join([posixpath.join(bin_dir, 'vllm'), *server])}",
                ]
            )
            units.append(
                {
                    "name": f"{SERVER_UNIT}.service",
                    "content": _text(lines + _service_tail(recipe)[2:]),
                }
            )
        order.append(f"{SERVER_UNIT}.service")

    return {
        "role": node.role,
        "units": units,
        "server_argv": server,
        "ray_argv": ray,
        "environment": env,
        "start_order": order,
        "model_path": model_path,
    }


def _text(lines: list[str]) -> str:
    return "\n".join(lines).rstrip("\n") + "\n"


def unit_hash(content: str) -> str | None:
    """The recipe hash a unit file carries in its header, or None."""
    for line in content.splitlines():
        if line.startswith(HASH_MARKER):
            return line[len(HASH_MARKER) :].strip()
    return None
