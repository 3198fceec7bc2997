# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``model_manifest`` on one node: record a snapshot's manifest, or verify the snapshot against it.

mode=create hashes the snapshot (only what changed since the last manifest, unless ``full``)
and writes the manifest, outside check mode, never over a damaged snapshot; mode=verify
hashes against a manifest (the node's, or the source node's ``manifest_content``) and
restores the modification times of files whose content matches. The hashing, the document
and its checks are ``_manifest``'s; here the options are checked and the outcome totalled.

No AnsibleModule here: ``module`` is the caller's (``params``, ``check_mode``, ``_diff``,
``fail_json``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._manifest_file import (
    ManifestError,
    default_manifest_path,
    load_manifest,
    validate_manifest,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    MAX_PATH,
    ValidationError,
    integer,
    path,
    text,
)
from ansible_collections.localinference.vllm.plugins.module_utils.weights._manifest import (
    create,
    disk_free_bytes,
    manifest_document,
    restore_mtimes,
    summary_lines,
    verify,
    write_manifest,
)


def _previous(manifest_path: str) -> dict | None:
    if not os.path.exists(manifest_path):
        return None
    return load_manifest(manifest_path)


def _create(module: Any, manifest_path: str) -> dict:
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


def _verify(module: Any, manifest_path: str) -> dict:
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


def run(module: Any) -> dict[str, Any]:
    """The module's result for its ``mode`` (create or verify); a bad option or manifest ends the module."""
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
            result = _create(module, manifest_path)
        else:
            result = _verify(module, manifest_path)
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
    return result


def reverify_reason(reverify: Any, check_mode: bool = False) -> tuple[str | None, list[str]]:
    """The site's re-verify on a node with nothing to do: why its weights no longer hold, or None.

    ``reverify`` comes from the node's own record of the last whole run (``{path, manifest,
    workers}``, the weights stage's footprint) and is checked before use. As mode=verify, a file
    whose content matches but whose modification time does not gets the manifest's back (outside
    check mode); those paths are returned beside the reason.
    """
    fix = "the stages run and the weights stage verifies them"
    try:
        if not isinstance(reverify, dict) or set(reverify) != {"path", "manifest", "workers"}:
            raise ValidationError("result.reverify", "is not a mapping of path, manifest and workers", fix)
        root = path("result.reverify.path", reverify["path"])
        manifest_path = path("result.reverify.manifest", reverify["manifest"])
        workers = integer("result.reverify.workers", reverify["workers"], minimum=0, maximum=256)
        outcome = verify(root, load_manifest(manifest_path), workers=workers, drop_cache=True)
    except (ValidationError, ManifestError) as exc:
        return f"its weights cannot be re-verified: {exc}", []
    if outcome.mismatched:
        first = outcome.mismatched[0]
        return (f"its weights do not match their manifest: {len(outcome.mismatched)} file(s), the first"
                f" {first['path']} ({first['reason']})"), []
    if outcome.extra:
        return f"its weights hold {len(outcome.extra)} file(s) their manifest does not list, the first {outcome.extra[0]}", []
    if outcome.touch and not check_mode:
        restore_mtimes(root, outcome.touch)
    return None, sorted(outcome.touch)
