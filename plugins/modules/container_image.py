#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: container_image
short_description: The serving image on a node, by digest - looked at, loaded, pulled or exported as an OCI archive
version_added: 0.2.0
description:
  - The serve role's image step (roles/serve/tasks/image.yml). The image is pinned by digest; the
    head gets it once (from O(archive), an OCI archive for air-gapped sites, or pulled), writes an OCI
    archive that keeps the digest, and every other node loads that archive, copied over the cluster
    link. Each node's copy is then verified by digest.
  - O(state=facts) only looks (RV(pinned), RV(named)). O(state=present) loads O(archive) or pulls
    when the node has no image with the digest, then checks the digest. O(state=exported) makes sure
    an OCI archive with the pinned digest exists on the node (RV(path)).
  - Every refusal names the variable (O(image_name), O(archive_name)) and the fix; an archive is
    checked (an OCI archive of the pinned digest) before anything is loaded.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
options:
  image:
    description:
      - The image, C(NAME[:TAG]@sha256:<64 hex>).
      - A tag alone only with O(allow_unpinned=true).
    type: str
    required: true
  allow_unpinned:
    description:
      - Accept O(image) without a digest (the serve role's C(serve_allow_unpinned_image)) and resolve it
        here to the digest it names - the digest of O(archive) when given; else, for O(state=present),
        the tag is pulled (every run, as it may have moved) and the node's copy read; for O(state=facts) the
        node's copy is read. From there on the module works with RV(resolved), as with a pinned image.
      - The result says so in RV(findings), a warning C(image_unpinned) with the digest to pin. In check
        mode nothing is pulled, so a tag the node does not have yet is refused (its digest is unknown).
      - V(false) refuses a tag alone, naming O(image_name) and C(serve_allow_unpinned_image).
    type: bool
    default: false
  image_name:
    description: The variable the image came from, for messages.
    type: str
    default: vllm_recipe.image
  state:
    description: C(facts), C(present) or C(exported).
    type: str
    default: facts
    choices: [facts, present, exported]
  archive:
    description:
      - An OCI archive of the image on this node. O(state=present) loads it when the image is
        missing; O(state=exported) returns it as RV(path). Checked first either way.
    type: path
  archive_name:
    description: The variable the archive came from, for messages.
    type: str
    default: serve_image_archive
  remove_archive:
    description: Delete O(archive) once it is loaded (a copy made for this node).
    type: bool
    default: false
  cache_dir:
    description: Where O(state=exported) writes the archive (one file per digest).
    type: path
    default: /var/lib/localinference/images
  podman:
    description: The podman binary.
    type: str
    default: podman
  skopeo:
    description: >-
      The skopeo binary: O(state=exported) fetches a pulled image's original layers with it when
      C(podman save) cannot keep the digest (absent: that case is refused with the fix).
    type: str
    default: skopeo
  timeout:
    description: Seconds each pull, load, save or copy may take.
    type: int
    default: 3600
  require:
    description: >-
      Fail, naming O(host), when the node has no image with the pinned digest (after O(state)'s
      work; in check mode a load or pull that would happen counts as done).
    type: bool
    default: false
  host:
    description: The node's name in messages.
    type: str
    default: this node
"""

EXAMPLES = r"""
- name: Resolve a tag once on the head and serve the digest it names now
  localinference.vllm.container_image:
    image: docker.io/vllm/vllm-openai:v0.32.0
    allow_unpinned: true
    state: present
  register: head_image
  # head_image.resolved: docker.io/vllm/vllm-openai:v0.32.0@sha256:...

- name: Load the image the head copied here, then check its digest
  localinference.vllm.container_image:
    image: registry.example/vllm/vllm-openai@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    state: present
    archive: /var/lib/localinference/images/sha256-0123....oci.tar
    remove_archive: true
"""

RETURN = r"""
pinned:
  description: The node's image under the pinned reference (present, id, digest, digests, tags).
  type: dict
  returned: always
named:
  description: The node's image under the reference's name alone (another digest shows here).
  type: dict
  returned: always
action:
  description: What was done or would be done (none, loaded, pulled, saved, fetched).
  type: str
  returned: always
path:
  description: The OCI archive with the pinned digest (O(state=exported)).
  type: str
  returned: when state is exported
resolved:
  description: >-
    The reference by digest the module worked with, C(NAME[:TAG]@sha256:<64 hex>): O(image) itself, or
    with O(allow_unpinned) the digest its tag resolved to (empty when the node has no copy to read).
  type: str
  returned: always
findings:
  description: With O(allow_unpinned) and a tag alone, the warning C(image_unpinned) (id, severity, message, fix).
  type: list
  elements: dict
  returned: always
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
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


class ImageError(Exception):
    pass


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


def _resolve(module, runner, p, tag: str) -> tuple[str, str]:
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


def _present(module, runner, p, reference, digest, pinned) -> str:
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


def _exported(module, runner, p, reference, digest, pinned) -> tuple[str, str]:
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


def _work(module, runner, p, name: str, digest: str, unpinned: bool, result: dict) -> dict:
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


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            image=dict(type="str", required=True),
            image_name=dict(type="str", default="vllm_recipe.image"),
            allow_unpinned=dict(type="bool", default=False),
            state=dict(type="str", default="facts", choices=["facts", "present", "exported"]),
            archive=dict(type="path"),
            archive_name=dict(type="str", default="serve_image_archive"),
            remove_archive=dict(type="bool", default=False),
            cache_dir=dict(type="path", default="/var/lib/localinference/images"),
            podman=dict(type="str", default="podman"),
            skopeo=dict(type="str", default="skopeo"),
            timeout=dict(type="int", default=3600),
            require=dict(type="bool", default=False),
            host=dict(type="str", default="this node"),
        ),
        supports_check_mode=True,
    )
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
    module.exit_json(**result)


if __name__ == "__main__":
    main()
