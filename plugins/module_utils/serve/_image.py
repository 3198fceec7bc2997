# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving image, like the weights: pinned by digest, one copy from the head, verified everywhere.

Pure functions: the reference's parts, an OCI archive's manifest digest (read from
its ``index.json``, no container tool), what ``podman image inspect`` says about a
node's copy, the argv of every command, and the judgement of the cluster's copies
(a node whose image is missing or has another digest is named, with the fix).

Why an OCI archive and not ``podman save`` alone: Podman's store keeps layers
uncompressed, and a plain ``podman save`` compresses them again, which writes a
new manifest with a new digest (measured with Podman 4.3). ``podman save
--uncompressed --format oci-archive`` keeps the digest of an image whose layers
were never compressed (one built or imported locally, the lab's); a pulled
image keeps its digest only through ``skopeo copy --preserve-digests
docker://REF oci-archive:FILE`` or an archive made that way
(``serve_image_archive``). The archive's digest is checked before any node
loads it, and every node's copy after.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections.abc import Mapping
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# The members every OCI image layout has (image-spec, image-layout.md).
OCI_MEMBERS = ("oci-layout", "index.json")


def split_reference(reference: str) -> tuple[str, str]:
    """``(name[:tag], digest)`` of a reference; the digest is empty when it has none."""
    name, _, digest = reference.partition("@")
    return name, digest


def local_only(reference: str) -> bool:
    """A ``localhost/`` name: Podman's for an image built or loaded on the node, never pulled."""
    return reference.startswith("localhost/")


def archive_file(cache_dir: str, digest: str) -> str:
    """Where the head keeps the OCI archive it copies to the other nodes (one per digest)."""
    return os.path.join(cache_dir, digest.replace(":", "-") + ".oci.tar")


def index_digest(name: str, index: Any) -> str:
    """The one manifest digest of an OCI ``index.json``; a refusal names ``name``."""
    manifests = index.get("manifests") if isinstance(index, Mapping) else None
    if (
        not isinstance(manifests, list)
        or len(manifests) != 1
        or not isinstance(manifests[0], Mapping)
    ):
        count = len(manifests) if isinstance(manifests, list) else "no"
        raise ValidationError(
            name,
            f"its index.json lists {count} manifests, not one image",
            "make the archive of one image: skopeo copy --preserve-digests docker://REF@sha256:... oci-archive:FILE",
        )
    digest = str(manifests[0].get("digest", ""))
    if not _DIGEST.fullmatch(digest):
        raise ValidationError(
            name, f"its index.json names no sha256 manifest ({digest!r})", "make the archive again"
        )
    return digest


def archive_digest(name: str, path: str) -> str:
    """The manifest digest of the OCI archive at ``path``; anything else is refused naming ``name``."""
    fix = (
        "give an OCI archive (a tar with oci-layout and index.json): skopeo copy --preserve-digests "
        "docker://REF@sha256:... oci-archive:FILE, or podman save --format oci-archive --uncompressed"
    )
    if not os.path.isfile(path):
        raise ValidationError(
            name, f"{path} is not a file on the head", "copy the archive to the head first"
        )
    try:
        with tarfile.open(path, "r:*") as tar:
            members = {m.name.lstrip("./"): m for m in tar.getmembers() if m.isfile()}
            missing = [m for m in OCI_MEMBERS if m not in members]
            if missing:
                raise ValidationError(
                    name, f"{path} is a tar but not an OCI archive (no {', '.join(missing)})", fix
                )
            handle = tar.extractfile(members["index.json"])
            index = json.loads(handle.read(1 << 20)) if handle else None
    except ValidationError:
        raise
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ValidationError(name, f"{path} is not an OCI archive ({exc})", fix) from None
    except ValueError:
        raise ValidationError(name, f"{path}: its index.json is not JSON", fix) from None
    return index_digest(name, index)


def check_archive(name: str, path: str, digest: str, image_name: str) -> None:
    """Refuse an archive whose image is not the pinned one (both variables named)."""
    found = archive_digest(name, path)
    if found != digest:
        raise ValidationError(
            name,
            f"{path} holds the image {found}, but {image_name} pins {digest}",
            f"give the archive of {image_name}, or pin {image_name} to the archive's digest",
        )


def node_copy(inspected: Any) -> dict[str, Any]:
    """What ``podman image inspect --format json`` says about one image (an empty list: none)."""
    items = inspected if isinstance(inspected, list) else []
    if not items or not isinstance(items[0], Mapping):
        return {"present": False, "id": "", "digest": "", "digests": []}
    item = items[0]
    digests = {str(item.get("Digest") or "")}
    for repo_digest in item.get("RepoDigests") or []:
        digests.add(str(repo_digest).rpartition("@")[2])
    return {
        "present": True,
        "id": str(item.get("Id", "")),
        "digest": str(item.get("Digest") or ""),
        "digests": sorted(d for d in digests if d),
        "tags": [str(t) for t in item.get("RepoTags") or []],
    }


def has_digest(copy: Mapping[str, Any], digest: str) -> bool:
    return bool(copy.get("present")) and digest in copy.get("digests", [])


def judge(
    copies: Mapping[str, Mapping[str, Any]], reference: str, image_name: str
) -> list[dict[str, Any]]:
    """One error per node whose copy of the pinned image is missing or has another digest.

    ``copies`` maps a host to ``{"pinned": node_copy(...), "named": node_copy(...)}``:
    what the node has under the pinned reference and under its name alone.
    """
    digest = split_reference(reference)[1]
    findings = []
    for host in sorted(copies):
        pinned = copies[host].get("pinned", {})
        if has_digest(pinned, digest):
            continue
        named = copies[host].get("named", {})
        if named.get("present"):
            what = f"has {split_reference(reference)[0]} with digest {named.get('digest') or 'none'}, not {digest}"
        else:
            what = f"has no image {reference}"
        findings.append(
            finding(
                "image_digest",
                "error",
                f"{host} {what}",
                f"let the rollout copy the head's image (serve_image_distribute: true), or load {image_name} "
                f"by digest there (podman load of the OCI archive); no node was changed",
                host=host,
            )
        )
    return findings


def inspect_argv(podman: str, reference: str) -> list[str]:
    return [podman, "image", "inspect", "--format", "json", reference]


def load_argv(podman: str, archive: str) -> list[str]:
    return [podman, "load", "--quiet", "--input", archive]


def pull_argv(podman: str, reference: str) -> list[str]:
    return [podman, "pull", "--quiet", reference]


def save_argv(podman: str, reference: str, path: str) -> list[str]:
    # --uncompressed keeps the digest of an image whose layers were never compressed.
    return [
        podman,
        "save",
        "--quiet",
        "--uncompressed",
        "--format",
        "oci-archive",
        "--output",
        path,
        reference,
    ]


def skopeo_argv(skopeo: str, reference: str, path: str) -> list[str]:
    return [skopeo, "copy", "--preserve-digests", f"docker://{reference}", f"oci-archive:{path}"]
