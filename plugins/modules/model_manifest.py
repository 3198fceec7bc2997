#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: model_manifest
short_description: Create or verify a sha256 manifest of a model snapshot
version_added: 0.2.0
description:
  - With O(mode=create), records every regular file of a model snapshot (relative path, size,
    modification time, sha256) in a JSON manifest beside the snapshot, and checks the header of every
    C(.safetensors) file (header length, JSON, dtypes, shapes, and that the tensors cover the data
    section exactly, so a truncated file is caught).
  - With O(mode=verify), checks a node's copy against a manifest and reports each missing, truncated or
    corrupted file in RV(mismatched). It does not fail on a mismatch; the caller decides (the
    P(localinference.vllm.model_weights#role) role re-syncs and verifies again).
  - Fast path. A file whose size and modification time equal the manifest's is trusted and not read,
    so a re-run over an unchanged snapshot hashes nothing (RV(hashed) is V(0)). O(full=true) hashes
    every file; only that catches a byte changed in place with size and mtime kept.
  - Files are hashed in parallel threads (sha256 releases the interpreter lock while it digests).
  - When a snapshot file is a link into a Hugging Face cache blob named by its sha256, O(mode=create)
    also checks the content against that name.
  - Fails closed on an incomplete snapshot. A dangling link (a shard never downloaded, a blob deleted)
    or a link loop is reported once in RV(mismatched) with its path, and RV(ok) is V(false), in both
    modes; a directory link that leads back above itself is never entered.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes.CHANGES
options:
  path:
    description:
      - The snapshot directory, for example V(/srv/models/hub/models--org--name/snapshots/<revision>).
    type: path
    required: true
  mode:
    description:
      - V(create) writes (or refreshes) the manifest from the files in O(path).
      - V(verify) checks the files in O(path) against the manifest and changes nothing, except restoring
        the recorded modification time of a file whose content was hashed and matched.
    type: str
    choices: [create, verify]
    required: true
  manifest:
    description:
      - Path of the manifest file.
      - Defaults to C(<repo>/localinference-manifests/<revision>.json), where C(<repo>) is the
        directory that holds C(snapshots/).
    type: path
  manifest_content:
    description:
      - The manifest itself (as returned in RV(manifest_content) by O(mode=create) on another node), for
        O(mode=verify) on a node that has no copy of the file yet. Takes precedence over O(manifest).
    type: dict
  full:
    description:
      - Hash every file instead of trusting size and modification time.
    type: bool
    default: false
  paths:
    description:
      - With O(mode=verify), check only these relative paths (for example the files just repaired).
    type: list
    elements: str
  workers:
    description:
      - Files hashed at once, at most 256. V(0) uses one thread per CPU (at most 16).
    type: int
    default: 0
  drop_cache:
    description:
      - Release each file's pages from the page cache after hashing it, so a verification of a large
        checkpoint does not crowd out memory (on unified-memory nodes the page cache competes with GPU
        allocations).
    type: bool
    default: true
  model:
    description:
      - Model id recorded in a created manifest.
    type: str
  revision:
    description:
      - Revision recorded in a created manifest.
    type: str
notes:
  - Hidden files (names starting with a dot, such as rsync's temporary files) are not part of a snapshot.
  - A manifest read from a file or from O(manifest_content) is schema-checked (paths relative and
    normalised, sizes and times non-negative integers, sha256 as 64 hex digits, no path twice).
seealso:
  - name: safetensors format
    description: The header layout checked by this module.
    link: https://huggingface.co/docs/safetensors/index
"""

EXAMPLES = r"""
- name: Record the head's snapshot
  localinference.vllm.model_manifest:
    path: /srv/models/hub/models--org--name/snapshots/5eed0c0ffee0000000000000000000000000000a
    mode: create
    model: org/name
    revision: 5eed0c0ffee0000000000000000000000000000a
  register: head_manifest

- name: Check a worker's copy against the head's manifest (fast path)
  localinference.vllm.model_manifest:
    path: /srv/models/hub/models--org--name/snapshots/5eed0c0ffee0000000000000000000000000000a
    mode: verify
    manifest_content: "{{ hostvars[groups['vllm_head'][0]].head_manifest.manifest_content }}"
  register: worker_copy

- name: Hash everything
  localinference.vllm.model_manifest:
    path: /srv/models/hub/models--org--name/snapshots/5eed0c0ffee0000000000000000000000000000a
    mode: verify
    full: true
"""

RETURN = r"""
ok:
  description: True when no file is missing, truncated, corrupted, malformed, a dangling link or a link loop.
  returned: always
  type: bool
msg:
  description: One line naming the mismatched files and why (the first ten), when RV(ok) is false.
  returned: when RV(ok) is false
  type: str
  sample: "1 file(s) do not match: model-00002.safetensors (dangling symlink to ../../blobs/ab12...)"
mismatched:
  description: Files that do not match, sorted by path.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Path relative to O(path).
      type: str
    reason:
      description: Why, for example C(missing), C(size 10 differs from 20), C(sha256 ... differs from ...).
      type: str
    size:
      description: Size the manifest records (bytes to copy to repair it); absent in O(mode=create).
      type: int
  sample: [{"path": "model.safetensors", "reason": "missing", "size": 1048576}]
hashed:
  description: How many files were read and hashed in this run; V(0) when the fast path trusted all.
  returned: always
  type: int
hashed_bytes:
  description: Bytes read and hashed in this run.
  returned: always
  type: int
files:
  description: Files in the manifest.
  returned: always
  type: int
total_bytes:
  description: Bytes of all files in the manifest.
  returned: always
  type: int
missing_bytes:
  description: Bytes of the mismatched files, that is what a repair has to copy.
  returned: always
  type: int
disk_free_bytes:
  description: Free bytes on the filesystem that holds (or would hold) O(path).
  returned: always
  type: int
extra:
  description: With O(mode=verify), files present in O(path) that the manifest does not list.
  returned: always
  type: list
  elements: str
manifest:
  description: Path of the manifest file.
  returned: always
  type: str
manifest_content:
  description: The manifest document (format, model, revision, file_count, total_bytes, files).
  returned: when O(mode=create) and RV(ok), or O(mode=verify)
  type: dict
elapsed_seconds:
  description: Wall time spent listing and hashing.
  returned: always
  type: float
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    MAX_PATH,
    ValidationError,
    text,
)
from ansible_collections.localinference.vllm.plugins.module_utils.weights._manifest import (
    ManifestError,
    create,
    default_manifest_path,
    disk_free_bytes,
    load_manifest,
    manifest_document,
    restore_mtimes,
    summary_lines,
    validate_manifest,
    verify,
    write_manifest,
)


def _previous(manifest_path: str) -> dict | None:
    if not os.path.exists(manifest_path):
        return None
    return load_manifest(manifest_path)


def run_create(module: AnsibleModule, manifest_path: str) -> dict:
    params = module.params
    previous = _previous(manifest_path)
    outcome = create(
        params["path"],
        previous,
        full=params["full"],
        workers=params["workers"],
        drop_cache=params["drop_cache"],
    )
    result: dict = {"hashed": outcome.hashed, "hashed_bytes": outcome.hashed_bytes, "extra": []}
    result["mismatched"] = outcome.mismatched
    result["ok"] = outcome.ok
    if not outcome.ok:
        # Never bless a damaged snapshot: the old manifest stays as it is.
        document = previous or manifest_document(
            outcome.records, params["model"], params["revision"]
        )
        result.update(changed=False, manifest_content=previous)
        return _totals(result, document, outcome.mismatched)
    model = params["model"] if params["model"] is not None else (previous or {}).get("model")
    revision = (
        params["revision"] if params["revision"] is not None else (previous or {}).get("revision")
    )
    document = manifest_document(outcome.records, model, revision)
    changed = document != previous
    if changed and not module.check_mode:
        write_manifest(manifest_path, document)
    result.update(changed=changed, manifest_content=document)
    if module._diff:
        result["diff"] = {
            "before_header": manifest_path,
            "after_header": manifest_path,
            "before": summary_lines(previous),
            "after": summary_lines(document),
        }
    return _totals(result, document, [])


def run_verify(module: AnsibleModule, manifest_path: str) -> dict:
    params = module.params
    if params["manifest_content"] is not None:
        document = validate_manifest(params["manifest_content"], "manifest_content")
    else:
        document = load_manifest(manifest_path)
    outcome = verify(
        params["path"],
        document,
        full=params["full"],
        paths=params["paths"],
        workers=params["workers"],
        drop_cache=params["drop_cache"],
    )
    changed = bool(outcome.touch)
    if changed and not module.check_mode:
        restore_mtimes(params["path"], outcome.touch)
    result: dict = {
        "changed": changed,
        "ok": outcome.ok,
        "mismatched": outcome.mismatched,
        "extra": outcome.extra,
        "hashed": outcome.hashed,
        "hashed_bytes": outcome.hashed_bytes,
        "manifest_content": document,
    }
    if module._diff and changed:
        result["diff"] = {
            "before": "".join(
                f"{p}: modification time differs, content matches\n" for p in sorted(outcome.touch)
            ),
            "after": "".join(
                f"{p}: modification time restored from the manifest\n"
                for p in sorted(outcome.touch)
            ),
        }
    return _totals(result, document, outcome.mismatched)


def _totals(result: dict, document: dict, mismatched: list[dict]) -> dict:
    result["files"] = len(document.get("files", []))
    result["total_bytes"] = sum(e["size"] for e in document.get("files", []))
    result["missing_bytes"] = sum(m.get("size", 0) for m in mismatched)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "mode": {"type": "str", "choices": ["create", "verify"], "required": True},
            "manifest": {"type": "path"},
            "manifest_content": {"type": "dict"},
            "full": {"type": "bool", "default": False},
            "paths": {"type": "list", "elements": "str"},
            "workers": {"type": "int", "default": 0},
            "drop_cache": {"type": "bool", "default": True},
            "model": {"type": "str"},
            "revision": {"type": "str"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        text("path", params["path"], max_length=MAX_PATH)
        if params["manifest"] is not None:
            text("manifest", params["manifest"], max_length=MAX_PATH)
        for position, rel in enumerate(params["paths"] or []):
            text(f"paths[{position}]", rel, max_length=MAX_PATH)
    except ValidationError as exc:
        module.fail_json(msg=str(exc))
    manifest_path = params["manifest"] or default_manifest_path(params["path"])
    if params["mode"] == "create" and params["manifest_content"] is not None:
        module.fail_json(
            msg="manifest_content is only for mode=verify; mode=create builds the manifest from path"
        )
    if params["mode"] == "create" and params["paths"] is not None:
        module.fail_json(
            msg="paths is only for mode=verify; mode=create always records the whole snapshot"
        )
    if not 0 <= params["workers"] <= 256:
        module.fail_json(msg=f"workers must be 0 (one per CPU) to 256, got {params['workers']}")
    if params["mode"] == "create" and not os.path.isdir(params["path"]):
        module.fail_json(
            msg=f"path {params['path']} is not a directory: stage the snapshot there first "
            "(source hub downloads it, source path expects it already on the node)"
        )
    started = time.monotonic()
    try:
        if params["mode"] == "create":
            result = run_create(module, manifest_path)
        else:
            result = run_verify(module, manifest_path)
    except ManifestError as exc:
        module.fail_json(
            msg=f"{exc}; run mode=create on the source node first or pass manifest_content"
        )
    result["manifest"] = manifest_path
    if not result["ok"]:
        shown = "; ".join(f"{m['path']} ({m['reason']})" for m in result["mismatched"][:10])
        more = len(result["mismatched"]) - 10
        result["msg"] = f"{len(result['mismatched'])} file(s) do not match: {shown}" + (
            f"; and {more} more" if more > 0 else ""
        )
    result["disk_free_bytes"] = disk_free_bytes(params["path"])
    result["elapsed_seconds"] = round(time.monotonic() - started, 3)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
