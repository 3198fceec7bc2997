# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one node's serving stack is made of, from what the node can tell.

The ``stack_lock`` module (``state=gathered``) runs the bounded commands and
reads the files; these functions turn their output into one node record of
the lockfile (``_stack_lock.NODE_FIELDS``). Each value comes from the best
source there is, in order:

- ``vllm_version``: this boot's log (the rollout read it, or the unit's
  current journal), then the same image's value in the last good stack, then
  the venv's ``vllm-*.dist-info`` (systemd mode) or ``vllm --version`` run in
  the image (quadlet mode, the head only);
- ``nccl_version``: this boot's log (``vLLM is using nccl==``, ``NCCL
  version``), then the same image's last value, then the image's environment
  (``NCCL_VERSION``) or the venv's ``nvidia_nccl_cu*`` dist-info.

Taking the last good stack's value before the slower or coarser sources keeps
a rollout that changes nothing from recording a different stack.
No AnsibleModule here: unit-tested on its own.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.upgrade._stack_lock import (
    canonical_json,
    node_problems,
    same_image,
)

VERSION = re.compile(r"v?(\d+\.\d+(?:\.\d+)?(?:[.+-][0-9A-Za-z.+-]{0,60})?)")
NCCL = re.compile(r"(\d+\.\d+\.\d+)")
_LOG_NCCL = (
    re.compile(r"vLLM is using nccl==\s*([0-9][0-9A-Za-z.+-]*)"),
    re.compile(r"\bNCCL version\s+([0-9][0-9A-Za-z.+-]*)"),
)
_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")
_HEX = re.compile(r"(?:sha256:)?([0-9a-f]{64})")
_INVOCATION = re.compile(r"[0-9a-f]{32}")
_DEVICE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,14}")
_HCA = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
NCCL_ENV = ("NCCL_VERSION", "NV_LIBNCCL_PACKAGE_VERSION", "NV_LIBNCCL_DEV_PACKAGE_VERSION")
MAX_ENV = 4096


class StackFactsError(validate.InputError):
    """Output that is not what the command prints; the message says what was expected."""


def image_digest(reference: Any) -> str | None:
    """``name@sha256:<hex>`` -> ``sha256:<hex>``; None for a reference without a digest."""
    if not isinstance(reference, str):
        return None
    match = _DIGEST.search(reference)
    return match.group(1) if match else None


def normalise_version(text: Any) -> str | None:
    """``v0.32.0`` / ``0.32.0`` -> ``0.32.0``; anything else -> None."""
    if not isinstance(text, str):
        return None
    match = VERSION.fullmatch(text.strip())
    return match.group(1) if match else None


def normalise_nccl(text: Any) -> str | None:
    """``2.21.5``, ``2.21.5-1``, ``2.21.5+cuda12.4`` -> ``2.21.5``: one spelling for every source."""
    if not isinstance(text, str):
        return None
    match = NCCL.match(text.strip())
    return match.group(1) if match else None


def version_from_output(text: str) -> str | None:
    """The version ``vllm --version`` printed: its last line that is a version alone."""
    for line in reversed(text.splitlines()):
        version = normalise_version(line)
        if version:
            return version
    return None


def nccl_from_log(text: str) -> str | None:
    """The last NCCL version a boot log reports (vLLM's pynccl line or NCCL's own banner)."""
    found = None
    for line in text.splitlines():
        for pattern in _LOG_NCCL:
            match = pattern.search(line)
            if match:
                found = normalise_nccl(match.group(1)) or found
    return found


def nccl_from_env(env: Mapping[str, str]) -> str | None:
    for name in NCCL_ENV:
        version = normalise_nccl(env.get(name))
        if version:
            return version
    return None


def parse_image_inspect(text: str) -> dict[str, Any]:
    """``podman image inspect IMAGE`` -> ``{id, digest, env}``."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise StackFactsError(f"podman image inspect printed no JSON ({exc})") from None
    if isinstance(data, list):
        data = data[0] if len(data) == 1 else None
    if not isinstance(data, dict):
        raise StackFactsError("podman image inspect printed no single image")
    image_id = data.get("Id")
    digest = data.get("Digest")
    config = data.get("Config") if isinstance(data.get("Config"), dict) else {}
    env: dict[str, str] = {}
    raw_env = config.get("Env") if isinstance(config.get("Env"), list) else []
    for item in raw_env[:MAX_ENV]:
        if isinstance(item, str) and "=" in item:
            name, _, value = item.partition("=")
            env[name] = value
    id_match = _HEX.fullmatch(image_id) if isinstance(image_id, str) else None
    return {
        "id": id_match.group(1) if id_match else None,
        "digest": digest if isinstance(digest, str) and _HEX.fullmatch(digest) else None,
        "env": env,
    }


def invocation_id(text: str) -> str | None:
    """``systemctl show -p InvocationID --value UNIT`` -> the 32-hex id, or None (not running)."""
    value = text.strip()
    return value if _INVOCATION.fullmatch(value) else None


def dist_info_version(names: Iterable[str], project: str) -> str | None:
    """``vllm-0.32.0.dist-info`` among ``names`` -> ``0.32.0`` (``project`` may end in ``*``)."""
    prefix = project.rstrip("*").replace("-", "_").lower()
    wildcard = project.endswith("*")
    found = []
    for name in names:
        if not name.endswith(".dist-info"):
            continue
        stem, sep, version = name[: -len(".dist-info")].rpartition("-")
        stem = stem.replace("-", "_").lower()
        if sep and (stem == prefix or (wildcard and stem.startswith(prefix))):
            found.append(version)
    return sorted(found)[-1] if found else None


def _device_list(value: str | None) -> list[str]:
    """``^docker,lo`` (exclusions) -> []; ``=mlx5_0:1,mlx5_1`` -> [mlx5_0, mlx5_1]."""
    if not value or value.startswith("^"):
        return []
    return [item.split(":", 1)[0] for item in value.lstrip("=").split(",") if item.strip()]


def cluster_devices(environment: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The cluster NICs and RDMA devices the ranks use, from their environment.

    ``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME`` and the plain entries of
    ``UCX_NET_DEVICES`` name interfaces; ``NCCL_IB_HCA`` and UCX's
    ``device:port`` entries name RDMA devices. Exclusion lists (``^lo``) and
    names that are not device names are ignored, and so is loopback (a single
    host's ranks talk over ``lo``: no NIC, no firmware).
    """
    env = {k: v for k, v in environment.items() if isinstance(v, str)}
    interfaces: list[str] = []
    hcas: list[str] = []
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        interfaces += _device_list(env.get(name))
    for item in (env.get("UCX_NET_DEVICES") or "").split(","):
        item = item.strip()
        if not item or item == "all":
            continue
        (hcas if ":" in item else interfaces).append(item.split(":", 1)[0])
    hcas += _device_list(env.get("NCCL_IB_HCA"))
    return (
        sorted({i for i in interfaces if _DEVICE.fullmatch(i) and i != "lo"}),
        sorted({h for h in hcas if _HCA.fullmatch(h)}),
    )


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the weights' content as the manifest lists it: path, size and sha256 per file.

    Modification times are left out, so a copy of the same weights (a worker
    keeps the head's manifest) has the same digest.
    """
    files = sorted(
        ([f["path"], f["size"], f["sha256"]] for f in manifest["files"]), key=lambda f: f[0]
    )
    return hashlib.sha256(canonical_json(files).encode("utf-8")).hexdigest()


def _first(candidates: Sequence[tuple[str, Any]]) -> tuple[Any, str | None]:
    for source, value in candidates:
        if value is not None:
            return value, source
    return None, None


def node_record(
    *,
    rank: int,
    recipe: Mapping[str, Any],
    recipe_hash: str,
    facts: Mapping[str, Any],
    fresh: Mapping[str, Sequence[tuple[str, Any]]],
    fallback: Mapping[str, Sequence[tuple[str, Any]]],
    previous: Any,
) -> tuple[dict[str, Any], dict[str, str | None], list[str]]:
    """``(record, sources, warnings)`` for one node.

    ``facts`` holds what was read directly (``image_id``, ``image_digest``
    from the image store, ``kernel``, ``driver_version``, ``cuda_version``,
    ``gpus``, ``nics``, ``hcas``, ``manifest_digest``). ``fresh`` and
    ``fallback`` list ``(source, value)`` candidates for the image properties
    (``vllm_version``, ``nccl_version``); ``previous`` is this node's record in
    the last good stack, used between the two when it ran the same image.
    """
    warnings: list[str] = []
    mode = recipe.get("deploy_mode", "quadlet")
    image = recipe.get("image") if mode == "quadlet" else None
    record: dict[str, Any] = {
        "rank": rank,
        "deploy_mode": mode,
        "image": image,
        "image_digest": (image_digest(image) or facts.get("image_digest")) if image else None,
        "image_id": facts.get("image_id") if image else None,
        "vllm_version": None,
        "recipe_hash": recipe_hash,
        "recipe": dict(recipe),
        "model": recipe.get("model"),
        "revision": recipe.get("revision"),
        "manifest_digest": facts.get("manifest_digest"),
        "kernel": facts.get("kernel"),
        "driver_version": facts.get("driver_version"),
        "cuda_version": facts.get("cuda_version"),
        "gpus": list(facts.get("gpus") or []),
        "nccl_version": None,
        "nics": dict(facts.get("nics") or {}),
        "hcas": dict(facts.get("hcas") or {}),
    }
    if previous and node_problems(previous):
        warnings.append(
            "the last good stack's record of this node is malformed; its values are not reused"
        )
        previous = None
    inherited = previous if same_image(previous, record) else None
    sources: dict[str, str | None] = {}
    for key, normalise in (("vllm_version", normalise_version), ("nccl_version", normalise_nccl)):
        candidates = [(source, normalise(value)) for source, value in fresh.get(key, ())]
        if inherited is not None:
            candidates.append(("last good stack", inherited.get(key)))
        candidates += [(source, normalise(value)) for source, value in fallback.get(key, ())]
        record[key], sources[key] = _first(candidates)
    return record, sources, warnings
