# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit text for a rendered recipe: Podman Quadlet ``.container`` or systemd ``.service``.

Every unit carries the recipe hash three ways (a header comment, the
``LOCALINFERENCE_RECIPE_HASH`` environment variable and, for containers, a
label), so ``verify`` can prove that what runs is what the inventory asked for.
Processes are always started by systemd, never by a backgrounded shell (F11).

Inputs arrive validated (``common/_recipe.normalise``, ``_argv.make_node``); the
rendered text is checked once more before it is returned (:func:`unit_problems`):
every line must be one the template writes, so no value can smuggle in a
section or a setting (``ExecStartPre=`` after a newline in a model name).

The memory guards (``_memory.Guards``, optional) add the admission check as
``ExecStartPre=`` of the unit that starts first on the node for the engine (the server where
there is one, else the Ray worker), the offload reclaim as ``ExecStartPre=``/``ExecStopPost=``
of the unit whose processes hold the engine's workers (the Ray unit under Ray, else the
server), and on unified memory ``OOMScoreAdjust=`` and ``Slice=`` on every serving unit plus the
``localinference.slice`` unit itself. Quadlet copies ``[Service]`` keys into the service it
generates, so both deploy modes carry the same lines. Where the node's fabric resolved a RoCE
GID index, every serving unit starts with ``ExecStartPre=`` gid-start (``_gid_start``) and reads
``NCCL_IB_GID_INDEX`` from the file it writes (``EnvironmentFile=``), not from ``Environment=``.
"""

from __future__ import annotations

import posixpath
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._gid_start import (
    ENV_FILE as GID_ENV_FILE,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._gid_start import (
    VARIABLE as GID_VARIABLE,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import (
    Node,
    environment,
    ray_argv,
    serve_argv,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    SLICE,
    Guards,
)

SERVER_UNIT = "localinference-vllm"
RAY_UNIT = "localinference-ray"
CONTAINER_MODEL_ROOT = "/models"
CONTAINER_CACHE = "/var/cache/vllm"
# The JIT and compile caches vLLM and its kernels keep under the user's home unless told
# otherwise (DeepGEMM's follows VLLM_CACHE_ROOT already, vllm/utils/deep_gemm.py):
# (variable, directory under the cache mount). Sources: torch's TORCHINDUCTOR_CACHE_DIR
# (/tmp/torchinductor_USER), Triton's TRITON_CACHE_DIR (~/.triton/cache), FlashInfer's
# FLASHINFER_WORKSPACE_BASE (flashinfer/jit/env.py: BASE/.cache/flashinfer, BASE = home),
# TileLang's TILELANG_CACHE_DIR (~/.tilelang/cache), CUTLASS 4.3.2's CUTE_DSL_CACHE_DIR (CuTe
# DSL's compiled kernels), and the CUDA driver's CUDA_CACHE_PATH (the PTX/NVRTC JIT cache,
# ~/.nv/ComputeCache; CUDA programming guide, "CUDA Environment Variables").
# XDG_CACHE_HOME is left alone: it would also move Hugging Face's cache and every other
# library's, not only compiled kernels.
# torch's precompiled C++ headers ignore TORCHINDUCTOR_CACHE_DIR: "We explicitly use
# default_cache_dir here because these headers need to be global" (torch/_inductor/codecache.py,
# _HEADER_DIR = tempfile.gettempdir()/torchinductor_<user>/precompiled_headers). In a container
# that is a fresh /tmp at every start, so each restart compiled them again before its first
# token (the lab's CPU engine: two g++ runs, 20-130 s). The cache mount is mounted there as
# well (root, the image's user): the headers land in <cache_dir>/precompiled_headers.
CONTAINER_TORCH_TMP = "/tmp/torchinductor_root"
JIT_CACHES = (
    ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
    ("TRITON_CACHE_DIR", "triton"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("TILELANG_CACHE_DIR", "tilelang"),
    ("CUTE_DSL_CACHE_DIR", "cute_dsl"),
    ("CUDA_CACHE_PATH", "cuda"),
)
RAY_SESSION_DIR = "/run/localinference/ray"
HASH_MARKER = "# localinference.vllm recipe_hash="
MANAGED_COMMENT = (
    "# Managed by localinference.vllm (role serve); edits are replaced by the next rollout."
)
_SAFE = re.compile(r"[A-Za-z0-9_@+=:,./-]+")

# Every section and key the templates below write; anything else in a rendered
# unit is refused (see unit_problems).
_LIMITS = "AS CORE CPU DATA FSIZE LOCKS MEMLOCK MSGQUEUE NICE NOFILE NPROC RSS RTPRIO RTTIME"
LIMIT_KEYS = frozenset(f"Limit{name}" for name in [*_LIMITS.split(), "SIGPENDING", "STACK"])
_CONTAINER_KEYS = """ContainerName Image Pull Network Label Entrypoint Volume AddDevice Ulimit
ShmSize PodmanArgs Environment EnvironmentFile Exec"""
_SERVICE_KEYS = """ExecStartPre Restart RestartSec TimeoutStartSec TimeoutStopSec Type Environment
EnvironmentFile
ExecStart ExecStop ExecStopPost OOMScoreAdjust Slice"""
SECTION_KEYS: dict[str, frozenset[str]] = {
    "Unit": frozenset({"Description", "Wants", "After", "Requires"}),
    "Container": frozenset(_CONTAINER_KEYS.split()),
    "Service": frozenset(_SERVICE_KEYS.split()) | LIMIT_KEYS,
    "Install": frozenset({"WantedBy"}),
    "Slice": frozenset({"MemoryHigh", "MemoryMax"}),
}


class UnitRenderError(ValidationError):
    """A rendered unit holds a line its template did not write; it is never written."""


def systemd_quote(arg: str, dollar: bool = True) -> str:
    """Quote one argument for ExecStart=/Exec=/Environment= (systemd word rules).

    ``%`` is doubled (specifiers); ``$`` is doubled for command lines, where
    systemd expands ``$VAR`` (``dollar=False`` for a service's ``Environment=``,
    where it does not).
    """
    arg = arg.replace("%", "%%")
    if dollar:
        arg = arg.replace("$", "$$")
    if arg and _SAFE.fullmatch(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _join(argv: list[str]) -> str:
    return " ".join(systemd_quote(a) for a in argv)


def _env_lines(env: dict[str, str], dollar: bool = True) -> list[str]:
    """``Environment=`` lines; Quadlet copies them into the command line, so ``$`` is
    escaped there (``dollar=True``), not in a plain service."""
    return [f"Environment={systemd_quote(f'{k}={v}', dollar)}" for k, v in env.items()]


def _description(text: str) -> str:
    """Free text for ``Description=``: systemd expands specifiers there, so ``%`` is doubled."""
    return text.replace("%", "%%")


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
        MANAGED_COMMENT,
        "[Unit]",
        f"Description={_description(what)} (recipe {digest[:12]})",
        "Wants=network-online.target",
        "After=network-online.target",
    ]


def _guard_lines(guards: Guards | None, *, admission: bool, engine: bool) -> list[str]:
    """The guards' ``[Service]`` lines of one unit (see the module docstring for which)."""
    if guards is None:
        return []
    lines = []
    if guards.gid_argv:
        # First: every unit that runs NCCL reads the index this start resolves (_gid_start).
        lines.append(f"ExecStartPre={_join(guards.gid_argv)}")
    if engine and guards.reclaim_argv:
        lines.append(f"ExecStartPre={_join(guards.reclaim_argv)}")
    if admission and guards.admission_argv:
        lines.append(f"ExecStartPre={_join(guards.admission_argv)}")
    if engine and guards.reclaim_argv:
        # No "-" prefix: orphans that cannot be proven unused leave the unit "failed" (systemctl
        # --failed, the doctor's unit states) with the reason in its journal. The stop itself
        # is done by then, and the next start's ExecStartPre proves it again before any load;
        # "-" would hide that orphans were left behind.
        lines.append(f"ExecStopPost={_join(guards.reclaim_argv)}")
    if guards.oom_score_adjust is not None:
        lines.append(f"OOMScoreAdjust={int(guards.oom_score_adjust)}")
    if guards.memory_max_bytes is not None:
        lines.append(f"Slice={SLICE}")
    return lines


def _slice_lines(digest: str, host: str, guards: Guards) -> list[str]:
    return [
        f"{HASH_MARKER}{digest}",
        MANAGED_COMMENT,
        "[Unit]",
        f"Description={_description(f'localinference.vllm serving units on {host}')}"
        f" (recipe {digest[:12]})",
        "",
        "[Slice]",
        f"MemoryHigh={int(guards.memory_high_bytes or 0)}",
        f"MemoryMax={int(guards.memory_max_bytes or 0)}",
    ]


# A headless rank (nodes other than the head, vLLM's mp backend) serves no request and
# keeps nothing worth a graceful stop, but its worker does not exit on the shutdown
# request or on SIGTERM while its peers go away: vLLM waits
# VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5 s), sends SIGTERM, waits 4 s more and kills it,
# and podman's default 10 s stop timeout kills the container at the same moment
# (journal of the lab's rank: "workers still running after SIGTERM; sending SIGKILL",
# then "StopSignal SIGTERM failed to stop container ... in 10 seconds"). Every restart
# of the cluster waited those 10 s; the rank is killed after this grace instead.
HEADLESS_STOP_SECONDS = 3


def _service_tail(
    recipe: dict[str, Any], extra: list[str] | None = None, stop_seconds: int = 120
) -> list[str]:
    return [
        "",
        "[Service]",
        f"ExecStartPre=/usr/bin/mkdir -p {systemd_quote(recipe['cache_dir'])}",
        *(extra or []),
        # F11: an engine whose launcher went away exits 0 and left the proxy
        # answering 502; "always" restarts that too (systemctl stop still stops).
        "Restart=always",
        "RestartSec=10",
        "TimeoutStartSec=900",
        f"TimeoutStopSec={stop_seconds}",
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
    stop_seconds: int | None = None,
    env_file: str | None = None,
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
    if stop_seconds is not None:
        # PodmanArgs, not Quadlet's StopTimeout= (Podman 5.0 and newer only).
        podman_args.insert(0, f"--stop-timeout={stop_seconds}")
    if recipe["ipc_host"]:
        podman_args.insert(0, "--ipc=host")
    if recipe["privileged"]:
        podman_args.insert(0, "--privileged")
    lines += [f"PodmanArgs={systemd_quote(a)}" for a in podman_args]
    lines += _env_lines(env)
    if env_file:
        # podman run --env-file: read when ExecStart runs, after the ExecStartPre that wrote it.
        lines.append(f"EnvironmentFile={env_file}")
    lines.append(f"Exec={_join(argv)}")
    return lines


@dataclass
class _NodeUnits:
    """What every unit of one node shares: the recipe, the node, the environment and paths."""

    recipe: dict[str, Any]
    node: Node
    digest: str
    guards: Guards | None
    env: dict[str, str]
    volumes: list[str]
    gid_file: str | None
    bin_dir: str

    @property
    def quadlet(self) -> bool:
        return self.recipe["deploy_mode"] == "quadlet"

    @property
    def service_env_file(self) -> list[str]:
        # systemd loads EnvironmentFile= before every command, ExecStartPre included: "-" lets
        # the first start's gid-start run before the file exists (it fails the start itself).
        return [f"EnvironmentFile=-{self.gid_file}"] if self.gid_file else []


def _jit_caches(env: dict[str, str], cache: str) -> None:
    """Every JIT and compile cache the engine writes outside ``VLLM_CACHE_ROOT`` by default, put
    on the cache mount so a restart reuses it (a container's home is gone at its next start);
    a recipe's own value wins."""
    for name, sub in JIT_CACHES:
        env.setdefault(name, f"{cache}/{sub}")


def _runtime_paths(
    recipe: dict[str, Any], node: Node, digest: str
) -> tuple[dict[str, str], list[str], str]:
    """``(environment, volumes, model path)``: inside the container for Quadlet, on the host
    otherwise."""
    env = environment(recipe, node, digest)
    if recipe["deploy_mode"] == "quadlet":
        mount, model_path = model_location(node.weights_path, recipe["revision"])
        env["VLLM_CACHE_ROOT"] = CONTAINER_CACHE
        _jit_caches(env, CONTAINER_CACHE)
        volumes = [f"{mount}:{CONTAINER_MODEL_ROOT}:ro", f"{recipe['cache_dir']}:{CONTAINER_CACHE}",
                   f"{recipe['cache_dir']}:{CONTAINER_TORCH_TMP}"]
        # vllm_recipe.mounts: a publisher's files mounted instead of baked, read-only.
        volumes += [f"{m['src']}:{m['dest']}:ro" for m in recipe.get("mounts", [])]
    else:
        model_path = node.weights_path
        env["VLLM_CACHE_ROOT"] = recipe["cache_dir"]
        _jit_caches(env, recipe["cache_dir"])
        volumes = []
    return dict(sorted(env.items())), volumes, model_path


def render_units(
    recipe: dict[str, Any],
    node: Node,
    digest: str,
    venv_dir: str = "",
    guards: Guards | None = None,
) -> dict[str, Any]:
    """Everything one node runs for a normalised recipe.

    Returns ``{"role", "units": [{"name", "content"}], "server_argv", "ray_argv",
    "environment", "start_order"}``; ``start_order`` lists the systemd service
    names in the order they must start on this node. With ``guards`` on unified memory
    the units end with ``localinference.slice`` (never in ``start_order``).
    """
    env, volumes, model_path = _runtime_paths(recipe, node, digest)
    # The GID index is resolved at every start (ExecStartPre gid-start writes GID_ENV_FILE),
    # never frozen in the unit: Environment= would also win over --env-file in Podman.
    gid_file = None
    if guards is not None and guards.gid_argv:
        env.pop(GID_VARIABLE, None)
        gid_file = GID_ENV_FILE
    server = serve_argv(recipe, node, model_path)
    ray = ray_argv(recipe, node)
    quadlet = recipe["deploy_mode"] == "quadlet"
    bin_dir = (
        posixpath.dirname(recipe["entrypoint"]) if quadlet else posixpath.join(venv_dir, "bin")
    )
    shared = _NodeUnits(recipe, node, digest, guards, env, volumes, gid_file, bin_dir)
    units = []
    order = []
    if ray is not None:
        units.append(_ray_unit(shared, ray, admission=server is None))
        order.append(f"{RAY_UNIT}.service")
    if server is not None:
        units.append(_server_unit(shared, server, ray))
        order.append(f"{SERVER_UNIT}.service")
    if guards is not None and guards.memory_max_bytes is not None:
        units.append(
            {"name": SLICE, "content": _text(SLICE, _slice_lines(digest, node.host, guards))}
        )
    return {
        "role": node.role,
        "units": units,
        "server_argv": server,
        "ray_argv": ray,
        "environment": env,
        "start_order": order,
        "model_path": model_path,
    }


def _ray_unit(shared: _NodeUnits, ray: list[str], admission: bool) -> dict[str, str]:
    """The Ray head or worker; it carries the admission check when no server runs here."""
    recipe, digest = shared.recipe, shared.digest
    ray_guards = _guard_lines(shared.guards, admission=admission, engine=True)
    what = f"Ray {shared.node.role} for {recipe['served_model_name']} on {shared.node.host}"
    ray_env = {k: v for k, v in shared.env.items() if k != "RAY_ADDRESS"}
    if shared.quadlet:
        lines = _header(digest, what) + _container(
            recipe,
            digest,
            RAY_UNIT,
            posixpath.join(shared.bin_dir, "ray"),
            ray,
            ray_env,
            [*shared.volumes, f"{RAY_SESSION_DIR}:/tmp/ray"],
            env_file=shared.gid_file,
        )
        pre = [f"ExecStartPre=/usr/bin/mkdir -p {RAY_SESSION_DIR}", *ray_guards]
        return {
            "name": f"{RAY_UNIT}.container",
            "content": _text(f"{RAY_UNIT}.container", lines + _service_tail(recipe, pre)),
        }
    lines = [
        *_header(digest, what),
        "",
        "[Service]",
        "Type=exec",
        *_env_lines(ray_env, dollar=False),
        *shared.service_env_file,
        *_limits(recipe["ulimits"]),
        f"ExecStart={_join([posixpath.join(shared.bin_dir, 'ray'), *ray])}",
        f"ExecStop={_join([posixpath.join(shared.bin_dir, 'ray'), 'stop'])}",
    ]
    return {
        "name": f"{RAY_UNIT}.service",
        "content": _text(f"{RAY_UNIT}.service", lines + _service_tail(recipe, ray_guards)[2:]),
    }


def _server_unit(shared: _NodeUnits, server: list[str], ray: list[str] | None) -> dict[str, str]:
    """The vLLM server (or a headless rank); after Ray when Ray runs here."""
    recipe, digest, node = shared.recipe, shared.digest, shared.node
    server_guards = _guard_lines(shared.guards, admission=True, engine=ray is None)
    rank = f" rank {node.rank}/{node.nnodes}" if node.nnodes > 1 else ""
    what = f"vLLM {recipe['served_model_name']}{rank} on {node.host}"
    after = [f"Requires={RAY_UNIT}.service", f"After={RAY_UNIT}.service"] if ray else []
    headless = "--headless" in server
    if shared.quadlet:
        volumes = [*shared.volumes, f"{RAY_SESSION_DIR}:/tmp/ray"] if ray else shared.volumes
        lines = (
            _header(digest, what)
            + after
            + _container(
                recipe,
                digest,
                SERVER_UNIT,
                recipe["entrypoint"],
                server,
                shared.env,
                volumes,
                HEADLESS_STOP_SECONDS if headless else None,
                env_file=shared.gid_file,
            )
        )
        return {
            "name": f"{SERVER_UNIT}.container",
            "content": _text(
                f"{SERVER_UNIT}.container", lines + _service_tail(recipe, server_guards)
            ),
        }
    lines = (
        _header(digest, what)
        + after
        + [
            "",
            "[Service]",
            "Type=exec",
            *_env_lines(shared.env, dollar=False),
            *shared.service_env_file,
            *_limits(recipe["ulimits"]),
            f"ExecStart={_join([posixpath.join(shared.bin_dir, 'vllm'), *server])}",
        ]
    )
    tail = _service_tail(recipe, server_guards, HEADLESS_STOP_SECONDS if headless else 120)[2:]
    return {"name": f"{SERVER_UNIT}.service", "content": _text(f"{SERVER_UNIT}.service", lines + tail)}


def _text(name: str, lines: list[str]) -> str:
    """The unit file for ``lines``, refused unless it reads back as exactly those lines."""
    content = "\n".join(lines).rstrip("\n") + "\n"
    found = unit_problems(content, lines)
    if found:
        raise UnitRenderError(
            name,
            "; ".join(found[:3]) + (f" (and {len(found) - 3} more)" if len(found) > 3 else ""),
            "nothing was written: a value escaped validation; report this with the recipe",
        )
    return content


def unit_problems(content: str, lines: list[str] | None = None) -> list[str]:
    """Lines of a rendered unit that its template does not write, read as systemd reads them.

    Each line must be empty, one of the two header comments, a known section
    header or ``Key=value`` with a key that section's template writes; no line
    may hold a control character or end in a backslash (a continuation). With
    ``lines``, the text must split back into exactly those lines.
    """
    found = []
    read = content.split("\n")
    if read and read[-1] == "":
        read.pop()
    if lines is not None:
        expected = list(lines)
        while expected and expected[-1] == "":
            expected.pop()
        if read != expected:
            found.append(
                f"renders {len(read)} lines where the template wrote {len(expected)} "
                "(a value holds a line break)"
            )
    section = ""
    markers = 0
    for number, line in enumerate(read, 1):
        where = f"line {number} {line[:80]!r}"
        bad = next((c for c in line if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
        if bad is not None:
            found.append(f"{where} holds {bad!r}")
            continue
        if line.endswith("\\"):
            found.append(f"{where} ends in a backslash (systemd joins the next line to it)")
        if not line:
            continue
        if line.startswith("#"):
            markers += line.startswith(HASH_MARKER)
            if not (line.startswith(HASH_MARKER) or line == MANAGED_COMMENT) or number > 2:
                found.append(f"{where} is not a comment the template writes")
            continue
        if line.startswith("["):
            section = line[1:-1] if line.endswith("]") else ""
            if section not in SECTION_KEYS:
                found.append(f"{where} is not a section the template writes")
            continue
        key, equals, _ = line.partition("=")
        if not equals or key not in SECTION_KEYS.get(section, ()):
            found.append(f"{where} is not a setting the template writes in [{section or '-'}]")
    if markers != 1:
        found.append(f"carries {markers} recipe hash headers (expected 1)")
    return found


def unit_hash(content: str) -> str | None:
    """The recipe hash a unit file carries in its header, or None."""
    for line in content.splitlines():
        if line.startswith(HASH_MARKER):
            return line[len(HASH_MARKER) :].strip()
    return None
