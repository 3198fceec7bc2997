# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``container_image`` on one node: the recipe's image there, pinned by digest, and its copy on the head.

The reference is checked by the plan's rule (``_recipe.image``), then by ``state``:
``facts`` only reads what Podman holds; ``present`` loads the image from an OCI archive or
pulls it, then proves the digest it names is the one the node has; ``exported`` writes the
head's copy for the nodes without a registry (``podman save`` when the digest survives it,
else ``skopeo copy --preserve-digests``). A tag alone is resolved to its digest first
(pulled, never in check mode). The argv and the judgement are ``_image``'s; here they run.

No AnsibleModule here: ``module`` is the caller's (``params``, ``check_mode``,
``get_bin_path``, ``warn``, ``fail_json``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import _recipe
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    CommandTimeout,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _image


class ImageError(validate.Error):
    """A podman or skopeo step failed, or left the node without the pinned digest; says which."""


def _copy(runner: Runner, podman: str, reference: str) -> dict:
    rc, out, _ = runner.run(_image.inspect_argv(podman, reference))
    try:
        return _image.node_copy(json.loads(out) if rc == 0 else [])
    except ValueError:
        return _image.node_copy([])


def _must(runner: Runner, argv: list[str], what: str) -> None:
    rc, out, err = runner.run(argv)
    if rc != 0:
        raise ImageError(f"{what} failed (rc {rc}): {(err or out).strip()[-600:] or 'no output'}")


def _checked(p: dict) -> tuple[str, str, bool]:
    """The reference's name and digest (the plan's rule, ``common/_recipe.image``); an archive checked first.

    A tag alone (``allow_unpinned``, the third value) has no digest, or with an archive the archive's.
    """
    reference = _recipe.image(p["image"], allow_unpinned=p["allow_unpinned"], name=p["image_name"])
    name, digest = _image.split_reference(reference)
    if p["archive"]:
        p["archive"] = validate.path(p["archive_name"], p["archive"])
        if digest:
            _image.check_archive(p["archive_name"], p["archive"], digest, p["image_name"])
        else:
            digest = _image.archive_digest(p["archive_name"], p["archive"])
    p["cache_dir"] = validate.path("cache_dir", p["cache_dir"])
    return name, digest, "@" not in reference


def _resolve(module: Any, runner: Runner, p: dict, tag: str) -> tuple[str, str]:
    """``(digest, action)`` of a tag alone: pulled first for state present (never in check mode).

    A ``localhost/`` name is Podman's for an image made on the node: there is nothing to pull.
    """
    before = _copy(runner, p["podman"], tag)
    local = _image.local_only(tag)
    if p["state"] != "present" or module.check_mode or local:
        if not before["present"] and p["state"] == "present":
            why = (
                "a localhost/ image is made on the node, never pulled"
                if local
                else "check mode pulls nothing"
            )
            raise ImageError(
                f"{p['image_name']}: {tag} is not on {p['host']} and {why}, so the digest it names is"
                f" unknown; get it there first (podman pull, podman load or {p['archive_name']}),"
                f" or pin it as {tag}@sha256:<64 hex>"
            )
        return before["digest"], "none"
    _must(
        runner,
        _image.pull_argv(p["podman"], tag),
        f"podman pull of {tag} (no registry? set {p['archive_name']} to an OCI archive of it)",
    )
    after = _copy(runner, p["podman"], tag)
    if not after["digest"]:
        raise ImageError(f"{p['image_name']}: podman pull of {tag} left no image with a digest")
    return after["digest"], "none" if after["digest"] == before["digest"] else "pulled"


def _present(module: Any, runner: Runner, p: dict, reference: str, digest: str, pinned: dict) -> str:
    if _image.has_digest(pinned, digest):
        return "none"
    action = "loaded" if p["archive"] else "pulled"
    if module.check_mode:
        return action
    if p["archive"]:
        _must(runner, _image.load_argv(p["podman"], p["archive"]), f"podman load of {p['archive']}")
    else:
        _must(
            runner,
            _image.pull_argv(p["podman"], reference),
            f"podman pull of {reference} (no registry? set {p['archive_name']} to an OCI archive of it)",
        )
    after = _copy(runner, p["podman"], reference)
    if not _image.has_digest(after, digest):
        raise ImageError(
            f"{p['image_name']}: after {action.replace('ed', '')} the node has {reference} with "
            f"digest {after.get('digest') or 'none'}, not {digest}; pin the digest the image really has"
        )
    return action


def _exported(
    module: Any, runner: Runner, p: dict, reference: str, digest: str, pinned: dict
) -> tuple[str, str]:
    if p["archive"]:
        return "none", p["archive"]
    path = _image.archive_file(p["cache_dir"], digest)
    if os.path.isfile(path):
        try:
            if _image.archive_digest(path, path) == digest:
                return "none", path
        except ValidationError:
            pass
    if module.check_mode:
        return "saved", path
    os.makedirs(p["cache_dir"], mode=0o755, exist_ok=True)
    partial = path + ".partial"
    if os.path.exists(partial):
        os.unlink(partial)
    if _image.has_digest(pinned, digest):
        _must(
            runner, _image.save_argv(p["podman"], reference, partial), f"podman save of {reference}"
        )
        if _image.archive_digest(partial, partial) == digest:
            os.replace(partial, path)
            return "saved", path
        os.unlink(partial)
    skopeo = module.get_bin_path(p["skopeo"]) if not os.path.isabs(p["skopeo"]) else p["skopeo"]
    if not skopeo or not os.path.exists(skopeo):
        raise ImageError(
            f"{p['image_name']}: the head's copy of {reference} cannot be written with its digest (Podman "
            f"keeps a pulled image's layers uncompressed and compresses them anew), and skopeo is not "
            f"installed: install skopeo on the head, or set {p['archive_name']} to an OCI archive of it "
            f"(skopeo copy --preserve-digests docker://{reference} oci-archive:FILE)"
        )
    _must(runner, _image.skopeo_argv(skopeo, reference, partial), f"skopeo copy of {reference}")
    found = _image.archive_digest(partial, partial)
    if found != digest:
        os.unlink(partial)
        raise ImageError(
            f"{p['image_name']}: the registry's {reference} came as {found}, not {digest}"
        )
    os.replace(partial, path)
    return "fetched", path


def _work(module: Any, runner: Runner, p: dict, name: str, digest: str, unpinned: bool, result: dict) -> dict:
    """Resolve a tag alone, then do ``state``'s work on ``name@digest``; returns the pinned copy."""
    if not digest:
        digest, result["action"] = _resolve(module, runner, p, name)
    if unpinned:
        resolved = f"{name}@{digest}" if digest else ""
        result["findings"] = [_recipe.unpinned_image(name, resolved, p["host"])]
    reference = f"{name}@{digest}" if digest else name
    result["resolved"] = reference if digest else ""
    pinned = _copy(runner, p["podman"], reference) if digest else _image.node_copy([])
    result["named"] = _copy(runner, p["podman"], name)
    if p["state"] == "present":
        action = _present(module, runner, p, reference, digest, pinned)
        result["action"] = action if action != "none" else result["action"]
        if action != "none" and not module.check_mode:
            pinned = _copy(runner, p["podman"], reference)
        if (
            p["remove_archive"]
            and p["archive"]
            and not module.check_mode
            and _image.has_digest(pinned, digest)
        ):
            os.unlink(p["archive"])
    elif p["state"] == "exported":
        result["action"], result["path"] = _exported(module, runner, p, reference, digest, pinned)
    return pinned


def run(module: Any) -> dict[str, Any]:
    """The module's result for its ``state`` (facts, present or exported); a failure ends the module."""
    p = module.params
    try:
        name, digest, unpinned = _checked(p)
    except ValidationError as exc:
        module.fail_json(msg=str(exc))
    runner = Runner(timeout=max(1, p["timeout"]))
    result: dict = {"changed": False, "action": "none", "resolved": "", "findings": []}
    try:
        pinned = _work(module, runner, p, name, digest, unpinned, result)
    except (ImageError, ValidationError, CommandError, CommandTimeout, OSError) as exc:
        module.fail_json(msg=str(exc), **result)
    for found in result["findings"]:
        module.warn(f"{found['message']}; {found['fix']}")
    result["pinned"] = pinned
    result["changed"] = result["action"] != "none"
    pending = module.check_mode and result["action"] in ("loaded", "pulled")
    reference = result["resolved"] or name
    if p["require"] and not pending:
        refused = _image.judge(
            {p["host"]: {"pinned": pinned, "named": result["named"]}}, reference, p["image_name"]
        )
        if refused:
            module.fail_json(
                msg=f"{p['image_name']}: {refused[0]['message']}; {refused[0]['fix']}",
                findings=result.pop("findings") + refused,
                **result,
            )
    return result
