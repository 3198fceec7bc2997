# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node-side checks of staging, judged pure: load (F5), the cluster address, ports, units.

Staging runs them in the same module call that renders the recipe
(``serving_state state=staged``, option ``checks``): one round trip per node
instead of a dozen. The readers take the node's raw text (``/proc/loadavg``,
``ip -o addr show``, ``systemctl show``) so the judgement is tested on recorded
output; nothing here runs a command except :func:`read_unit_states` and
:func:`capture_help`, which take the module's bounded runner.
"""

from __future__ import annotations

import hashlib
import os

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._systemctl import (
    parse_unit_show,
)

# systemctl show prints one block per unit, properties as KEY=VALUE.
_SHOW_PROPERTIES = "Id,ActiveState,LoadState"


class StageCheckError(validate.Error):
    """A node refuses the rollout; the message names the node, the cause and the fix."""


def judge_load(loadavg: str, ncpu: int, limit: float, host: str) -> dict[str, float]:
    """The node's 1-minute load per CPU from ``/proc/loadavg``; F5 when above ``limit``."""
    try:  # 'nan' would compare as below any limit: validate.number refuses it
        load = validate.number("/proc/loadavg", (loadavg.split() or [""])[0], minimum=0)
    except validate.ValidationError:
        raise StageCheckError(
            f"{host}: /proc/loadavg is unreadable ({loadavg[:80]!r}); the node's load cannot be judged"
        ) from None
    if ncpu < 1:
        raise StageCheckError(f"{host}: the node reports {ncpu} online CPUs; its load cannot be judged")
    per_cpu = load / ncpu
    if per_cpu > limit:
        raise StageCheckError(
            f"F5: {host} is saturated, not down: load {loadavg.split()[0]} on {ncpu} CPUs "
            f"({per_cpu:.1f} per CPU, limit {limit:g}). Nothing was changed on any node; wait for "
            "the load to fall (or raise serve_max_load_per_cpu) and run the rollout again."
        )
    return {"load1": load, "ncpu": ncpu, "per_cpu": round(per_cpu, 3)}


def holds_address(ip_addr: str, address: str) -> bool:
    """Whether ``ip -o addr show`` output lists ``address`` on an interface."""
    return any(f" {address}/" in line for line in ip_addr.splitlines())


def judge_address(ip_addr: str, address: str, host: str) -> None:
    """Refuse a node without its cluster address: its ranks would wait forever for a peer."""
    if address and not holds_address(ip_addr, address):
        raise StageCheckError(
            f"{host} does not hold its cluster address \"{address}\" (serve_cluster_address, else the "
            "fabric stage's primary_ip; after a reboot or a container restart NetworkManager may not "
            "have brought the cluster link up). Nothing was changed; run the fabric stage: "
            "--tags fabric,rollout."
        )


def stage_ports(recipe: dict, document: dict, rank: int, nnodes: int) -> list[int]:
    """The TCP ports the head's units bind: the API, the torch store (mp across nodes), Ray's GCS."""
    if rank != 0:
        return []
    ports = []
    if document.get("server_argv"):
        ports.append(int(recipe["port"]))
    if recipe.get("executor_backend") == "ray":
        ports.append(int(recipe["ray_port"]))
    elif nnodes > 1:
        ports.append(int(recipe.get("master_port") or 29501))
    return ports


def all_active(units: list[str], states: dict[str, dict[str, str]]) -> bool:
    """Whether the node runs ``units`` (the live document's) and every one is active."""
    return bool(units) and all(states.get(unit, {}).get("ActiveState") == "active" for unit in units)


def not_loaded(units: list[str], states: dict[str, dict[str, str]]) -> list[str]:
    """Units systemd has not loaded (``UNIT (LoadState)``): Quadlet made no service of them."""
    return [
        f"{unit} ({states.get(unit, {}).get('LoadState') or 'unknown'})"
        for unit in units
        if states.get(unit, {}).get("LoadState") != "loaded"
    ]


def read_unit_states(runner, units: list[str]) -> dict[str, dict[str, str]]:
    """The Id, ActiveState and LoadState of each unit, in one ``systemctl show`` call."""
    if not units:
        return {}
    rc, out, err = runner.run(["systemctl", "show", "-p", _SHOW_PROPERTIES, "--", *units])
    if rc != 0:
        raise StageCheckError(f"systemctl show {' '.join(units)} failed (rc {rc}): {err.strip()[:300]}")
    states = parse_unit_show(out)
    missing = [unit for unit in units if unit not in states]
    if missing:
        raise StageCheckError(f"systemctl show did not describe {', '.join(missing)}: {out[:300]!r}")
    return states


def help_cache_file(cache_dir: str, image: str) -> str:
    """Where the image's ``vllm serve --help=all`` is cached on the node (one file per image)."""
    return os.path.join(cache_dir, hashlib.sha256(image.encode("utf-8")).hexdigest() + ".txt")


def help_argv(recipe: dict) -> list[str]:
    """Ask the image itself for its option list (no network, removed afterwards)."""
    return [
        "podman", "run", "--rm", "--network=none",
        "--entrypoint", recipe.get("entrypoint") or "vllm",
        recipe["image"], "serve", "--help=all",
    ]


def capture_help(runner, recipe: dict) -> str:
    """The image's ``vllm serve --help=all``; a refusal names the image and the fix."""
    rc, out, err = runner.run(
        help_argv(recipe), hint="the image may still be pulling; pull it ahead or raise checks.timeout"
    )
    if rc != 0 or not out.strip():
        raise StageCheckError(
            f"vllm_recipe.image {recipe['image']} did not print `vllm serve --help=all` (rc {rc}): "
            f"{err.strip()[-400:] or 'no output'}; pull the image on the node, or set serve_help_check: false"
        )
    return out.rstrip("\n") + "\n"


def _mount_digests(path: str) -> dict[str, str]:
    """sha256 and md5 of a file, or of a directory's files (names and bytes, sorted)."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    files = [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names)
    for name in files:
        if name != path:
            sha.update(os.path.relpath(name, path).encode() + b"\0")
        _files.hash_into(name, sha, md5)
    return {"sha256": sha.hexdigest(), "md5": md5.hexdigest()}


def check_mounts(recipe: dict, host: str) -> list[dict[str, str]]:
    """Every ``vllm_recipe.mounts`` source on this node, measured; a missing or changed one refuses.

    Returns ``[{src, dest, sha256}]`` for the record. A pin (``sha256``, or the publisher's
    ``md5``) that the node's bytes do not match stops the rollout before anything starts.
    """
    measured = []
    for index, mount in enumerate(recipe.get("mounts", [])):
        key = f"vllm_recipe.mounts[{index}]"
        try:
            digests = _mount_digests(mount["src"])
        except OSError as exc:
            raise StageCheckError(
                f"{host}: {key}.src {mount['src']} cannot be read ({exc.strerror or exc}): put the file there "
                "on every node before the rollout (nothing was changed)"
            ) from None
        for kind in ("sha256", "md5"):
            if mount.get(kind) and mount[kind] != digests[kind]:
                raise StageCheckError(
                    f"{host}: {key}.{kind}: {mount['src']} has {kind} {digests[kind]}, not the pinned "
                    f"{mount[kind]}: copy the reviewed file to every node (nothing was changed)"
                )
        measured.append({"src": mount["src"], "dest": mount["dest"], "sha256": digests["sha256"]})
    return measured
