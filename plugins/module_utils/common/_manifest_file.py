# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The weights manifest as a file: its format, where it lies beside a snapshot, its reader.

The weights stage writes a manifest (``weights/_manifest.py`` makes and verifies one); the
preflight reads it to count the weights already in place, the upgrade to lock the snapshot
it names. Reading it is shared, so it lives here: a stage may import only the stages before
it, and the preflight comes before the weights.

No AnsibleModule here: this file is unit-tested on its own.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

MANIFEST_FORMAT = "localinference.vllm/weights-manifest-v1"
MANIFEST_DIR = "localinference-manifests"
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# A manifest lists a snapshot's files; a larger file is not one.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024


class ManifestError(validate.Error):
    """A manifest cannot be read or a snapshot cannot be listed."""


def default_manifest_path(snapshot: str) -> str:
    """``<repo>/localinference-manifests/<revision>.json`` beside ``snapshots/<revision>``."""
    snapshot = os.path.normpath(snapshot)
    revision = os.path.basename(snapshot)
    repo_dir = os.path.dirname(os.path.dirname(snapshot))
    return os.path.join(repo_dir, MANIFEST_DIR, f"{revision}.json")


def load_manifest(path: str) -> dict[str, Any]:
    try:
        data = json.loads(_files.read_bytes(path, MAX_MANIFEST_BYTES, whole=True))
    except FileNotFoundError:
        raise ManifestError(f"manifest {path} does not exist") from None
    except (OSError, OverflowError, ValueError, RecursionError) as exc:
        raise ManifestError(f"manifest {path} cannot be read: {exc}") from None
    return validate_manifest(data, path)


def validate_manifest(data: Any, origin: str = "manifest") -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{origin} is not a {MANIFEST_FORMAT} document")
    files = data.get("files")
    if not isinstance(files, list):
        raise ManifestError(f"{origin} has no 'files' list")
    seen: set[str] = set()
    for position, entry in enumerate(files):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("path"), str)
            or not _count(entry.get("size"))
            or not _count(entry.get("mtime_ns"))
            or not isinstance(entry.get("sha256"), str)
            or not SHA256_HEX.match(entry["sha256"])
        ):
            raise ManifestError(
                f"{origin} has a malformed file entry files[{position}]: {_shown(entry)}"
                " (needs path, size and mtime_ns as non-negative integers, sha256 as 64 hex digits)"
            )
        rel = entry["path"]
        if (
            not rel
            or rel.startswith("/")
            or os.path.normpath(rel) != rel
            or ".." in rel.split("/")
            or any(not char.isprintable() for char in rel)
        ):
            raise ManifestError(f"{origin} has an unsafe path in files[{position}]: {rel[:200]!r}")
        if rel in seen:
            raise ManifestError(f"{origin} lists {rel!r} twice (files[{position}])")
        seen.add(rel)
    return data


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
