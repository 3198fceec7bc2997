# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``vllm serve`` and ``ray start`` command lines of one node, and vLLM's own flag list.

The serve stage renders them into the units (``_units.py``) from a recipe that
``common/_recipe.py`` normalised and a :class:`Node` (where one rank runs, checked
by :func:`make_node`). ``parse_help_flags`` reads ``vllm serve --help=all`` so a
rendered flag the targeted release does not define is caught before a start
(``unknown_flags``). Pure: no AnsibleModule, no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    vllm_options,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._gid_start import (
    parse_source as parse_gid_source,
)


def option_flags(options: dict[str, Any]) -> list[str]:
    """Render vLLM options as CLI arguments, in sorted key order.

    ``True`` gives ``--flag``, ``False`` gives ``--no-flag`` (vLLM's boolean
    options accept both); dicts become compact JSON; lists become nargs.
    """
    argv: list[str] = []
    for key in sorted(options):
        value = options[key]
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, list):
            argv += [flag, *(str(item) for item in value)]
        else:
            argv += [flag, str(value)]
    return argv


@dataclass
class Node:
    """Where one rank runs: its place in the cluster and its fabric environment."""

    host: str
    rank: int
    nnodes: int
    head_address: str
    address: str = ""
    env: dict[str, str] = field(default_factory=dict)
    weights_path: str = ""
    weights_digest: str = ""
    # The RDMA port whose GID table the units read at every start (``_gid_start``):
    # ``{hca, port, sys_root}``, empty where the fabric resolved none.
    rdma: dict[str, Any] = field(default_factory=dict)

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


# More nodes than any cluster this collection deploys; bounds the rank arithmetic.
MAX_NODES = 1024


def make_node(params: dict[str, Any], name: str = "node") -> Node:
    """A validated :class:`Node` from the module's ``node`` option (the other boundary).

    Host names and addresses, the environment and the weights path reach unit
    files and command lines; each is checked here, once, and a refusal names
    ``node.<key>``.  The rank range is the caller's check (it knows the message).
    """
    if not isinstance(params, dict):
        raise ValidationError(
            name, f"expected a dict, got {validate.shown(params)}", "describe the node"
        )
    env_raw = params.get("env") or {}
    if not isinstance(env_raw, dict):
        raise ValidationError(f"{name}.env", "expected a dict", "write it as NAME: value pairs")
    env = {}
    for key, value in env_raw.items():
        key = validate.env_name(f"{name}.env key {validate.shown(key)}", key)
        if value not in (None, ""):
            env[key] = validate.env_value(f"{name}.env.{key}", value)
    return Node(
        host=validate.host(f"{name}.host", params.get("host")),
        rank=validate.integer(f"{name}.rank", params.get("rank"), minimum=0, maximum=MAX_NODES),
        nnodes=validate.integer(
            f"{name}.nnodes", params.get("nnodes"), minimum=1, maximum=MAX_NODES
        ),
        head_address=validate.host(f"{name}.head_address", params.get("head_address")),
        address=validate.host(f"{name}.address", params.get("address"), allow_empty=True),
        env=dict(sorted(env.items())),
        weights_path=validate.path(f"{name}.weights_path", params.get("weights_path")),
        weights_digest=_weights_digest(f"{name}.weights_digest", params.get("weights_digest")),
        rdma=parse_gid_source(f"{name}.rdma", params.get("rdma")),
    )


def _weights_digest(name: str, value: Any) -> str:
    """Empty, or the 64 lower-case hex digits of a sha256 (the weights stage's content digest)."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValidationError(
            name,
            f"{validate.shown(value)} is not a sha256",
            "leave it empty or re-run the weights stage",
        )
    return value


def serve_argv(recipe: dict[str, Any], node: Node, model_path: str) -> list[str] | None:
    """The ``vllm serve`` arguments (after the ``vllm`` executable) for one node.

    mp: every rank runs ``vllm serve`` with ``--nnodes/--node-rank/--master-addr``;
    ranks other than 0 add ``--headless``.  ray: only the head runs ``vllm serve``
    with ``--distributed-executor-backend ray`` once the Ray cluster has formed;
    workers run no server (``None``).
    """
    backend = recipe["executor_backend"]
    if backend == "ray" and node.rank != 0:
        return None
    argv = ["serve", model_path, *option_flags(vllm_options(recipe))]
    argv += ["--distributed-executor-backend", backend]
    if backend == "mp" and node.nnodes > 1:
        argv += ["--nnodes", str(node.nnodes), "--node-rank", str(node.rank)]
        argv += ["--master-addr", node.head_address]
        if node.rank != 0:
            argv.append("--headless")
    return argv + list(recipe["extra_args"])


def ray_argv(recipe: dict[str, Any], node: Node) -> list[str] | None:
    """``ray start`` arguments for the Ray head or worker unit (ray backend, >1 node)."""
    if recipe["executor_backend"] != "ray" or node.nnodes < 2:
        return None
    port = str(recipe["ray_port"])
    argv = ["start", "--block", "--disable-usage-stats"]
    if node.address:
        argv += ["--node-ip-address", node.address]
    if node.rank == 0:
        return [*argv, "--head", "--port", port]
    return [*argv, "--address", f"{node.head_address}:{port}"]


def environment(recipe: dict[str, Any], node: Node, digest: str) -> dict[str, str]:
    """Per-node environment: fabric variables, then the recipe's ``env``, then the hash."""
    env = {str(k): str(v) for k, v in node.env.items() if v not in (None, "")}
    env.update(recipe["env"])
    if recipe["executor_backend"] == "ray":
        # Ray's memory monitor mistakes page cache for pressure on unified memory.
        env.setdefault("RAY_memory_monitor_refresh_ms", "0")
        if node.rank == 0 and node.nnodes > 1:
            env.setdefault("RAY_ADDRESS", f"{node.head_address}:{recipe['ray_port']}")
    env["LOCALINFERENCE_RECIPE_HASH"] = digest
    return dict(sorted(env.items()))


def parse_help_flags(help_text: str) -> set[str]:
    """Every ``--flag`` that ``vllm serve --help=all`` defines."""
    flags: set[str] = set()
    for line in help_text.splitlines():
        if not line.startswith("  -"):
            continue
        spec = re.split(r"\s{2,}", line[2:], maxsplit=1)[0]
        flags.update(re.findall(r"--[a-zA-Z0-9][a-zA-Z0-9-]*", spec))
    return flags


def unknown_flags(argv: list[str], flags: set[str]) -> list[str]:
    """Flags in ``argv`` that the targeted vLLM release does not define."""
    unknown = []
    for token in argv:
        if token.startswith("--"):
            name = token.split("=", 1)[0]
            if name not in flags and name not in unknown:
                unknown.append(name)
    return unknown
