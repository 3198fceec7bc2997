# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The derived image on the build host: the I/O behind ``image_build`` (one call, :func:`run`).

In this order, so that a refusal leaves nothing half-done: the base is looked up; every
input is hashed and checked against its pin; an image with the inputs' label ends the
work (nothing to build); the patches' files are copied out of the base and patched in
memory (a hunk that does not apply stops here); only then is a context written and
``podman build`` run, and the built image's environment checked against ``env_prepend``.
The pure parts are ``_derived_image`` and ``common/_build_recipe``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import _build_recipe
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._files import read_bytes
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _derived_image
from ansible_collections.localinference.vllm.plugins.module_utils.weights._file_hash import (
    file_sha256,
)

BUILD = "vllm_recipe.build"
# Largest file a patch may change (vLLM's biggest Python module is about 300 kB).
MAX_PATCHED = 16 * 1024 * 1024


class BuildError(validate.Error):
    """A build step that failed on the node; the message says which and why."""


def _run(runner: Runner, p: dict[str, Any], *args: str, what: str) -> tuple[int, str, str]:
    """``podman ARGS`` with the module's deadline; one that cannot run or finish is a BuildError."""
    try:
        return runner.run([p["podman"], *args])
    except CommandError as exc:
        raise BuildError(f"{what}: {exc}") from None


def _podman(runner: Runner, p: dict[str, Any], *args: str, what: str) -> str:
    rc, out, err = _run(runner, p, *args, what=what)
    if rc != 0:
        raise BuildError(f"{what} failed (rc {rc}): {(err or out).strip()[-600:]}")
    return out


def _inspect(runner: Runner, p: dict[str, Any], ref: str) -> dict[str, Any] | None:
    rc, out, _ = _run(runner, p, "image", "inspect", ref, what=f"podman image inspect {ref}")
    if rc != 0:
        return None
    data = json.loads(out or "[]")
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None


def _source_paths(p: dict[str, Any], build: dict[str, Any]) -> dict[str, str]:
    """Where each src's bytes are on this node: the role's copies, or the checkpoint's file."""
    copied = {str(s.get("src")): str(s.get("on_host")) for s in p["sources"]}
    paths = {}
    for key in ("files", "patches"):
        for index, entry in enumerate(build.get(key, [])):
            name = f"{BUILD}.{key}[{index}].src"
            src = _build_recipe.source(name, entry["src"])
            if src["kind"] == "model":
                if not p["model_dir"]:
                    raise ValidationError(
                        name,
                        "names a checkpoint file but no snapshot is known",
                        "run the weights stage first",
                    )
                paths[entry["src"]] = os.path.join(p["model_dir"], src["path"])
            elif entry["src"] in copied:
                paths[entry["src"]] = copied[entry["src"]]
            else:
                raise ValidationError(
                    name,
                    f"{entry['src']} was not copied to the build host",
                    "run the serve role's build step",
                )
    return paths


def _measure(build: dict[str, Any], paths: dict[str, str], check_mode: bool) -> dict[str, str]:
    """The sha256 of every source; a pinned one that differs is refused naming its key.

    Under --check a pinned source the role would copy first is taken by its pin.
    """
    measured = {}
    for key in ("files", "patches"):
        for index, entry in enumerate(build.get(key, [])):
            path = paths[entry["src"]]
            if check_mode and entry.get("sha256") and not os.path.exists(path):
                measured[entry["src"]] = entry["sha256"]
                continue
            try:
                digest = file_sha256(path).sha256
            except OSError as exc:
                raise ValidationError(
                    f"{BUILD}.{key}[{index}].src",
                    f"{entry['src']} cannot be read ({path}: {exc.strerror or exc})",
                    "fix the path",
                ) from None
            pinned = entry.get("sha256")
            if pinned and pinned != digest:
                raise ValidationError(
                    f"{BUILD}.{key}[{index}].sha256",
                    f"{entry['src']} has sha256 {digest}, not the pinned {pinned}",
                    "pin the bytes you reviewed (sha256sum FILE), or restore the file",
                )
            measured[entry["src"]] = digest
    return measured


def _base_file(
    runner: Runner, p: dict[str, Any], container: str, path: str, scratch: str
) -> str | None:
    """The text of ``path`` in the base (via ``podman cp``), or None when the base has none."""
    target = os.path.join(scratch, "base-" + str(len(os.listdir(scratch))))
    rc, _, _ = _run(runner, p, "cp", f"{container}:{path}", target, what=f"podman cp of {path}")
    if rc != 0 or not os.path.isfile(target):
        return None
    return read_bytes(target, MAX_PATCHED).decode("utf-8", errors="surrogateescape")


def _patched(
    runner, p, base: str, build: dict[str, Any], paths: dict[str, str], scratch: str
) -> list[tuple[str, str]]:
    """``[(absolute destination, new text)]`` of every file the patches change, in order."""
    patches = build.get("patches", [])
    if not patches:
        return []
    container = _podman(
        runner,
        p,
        "create",
        "--pull=never",
        "--entrypoint=/bin/true",
        base,
        what=f"podman create {base}",
    ).strip()
    try:
        results: dict[str, str] = {}
        for index, entry in enumerate(patches):
            name = f"{BUILD}.patches[{index}] ({entry['src']})"
            if not os.path.exists(paths[entry["src"]]):  # --check before the role's copy
                continue
            text = read_bytes(paths[entry["src"]], MAX_PATCHED).decode(
                "utf-8", errors="surrogateescape"
            )
            for file_patch in _derived_image.parse_patch(name, text, entry["strip"]):
                dest = validate.path(f"{name} file", os.path.join(entry["root"], file_patch.path))
                original = (
                    results[dest]
                    if dest in results
                    else _base_file(runner, p, container, dest, scratch)
                )
                results[dest] = _derived_image.apply_patch(name, file_patch, original)
        return list(results.items())
    finally:
        _run(runner, p, "rm", "-f", container, what=f"podman rm of {container}")


def _write_context(directory: str, build, paths, patched, text: str) -> None:
    os.makedirs(os.path.join(directory, "files"), exist_ok=True)
    os.makedirs(os.path.join(directory, "patched"), exist_ok=True)
    for index, entry in enumerate(build.get("files", [])):
        shutil.copyfile(paths[entry["src"]], os.path.join(directory, "files", str(index)))
    for index, (_, content) in enumerate(patched):
        with open(
            os.path.join(directory, "patched", str(index)),
            "w",
            encoding="utf-8",
            errors="surrogateescape",
        ) as handle:
            handle.write(content)
    with open(os.path.join(directory, "Containerfile"), "w", encoding="utf-8") as handle:
        handle.write(text)


def _build(runner: Runner, p, inputs: str, build, paths, patched, text: str) -> dict[str, Any]:
    os.makedirs(p["context_dir"], mode=0o700, exist_ok=True)
    directory = tempfile.mkdtemp(prefix=f"{inputs[:16]}.", dir=p["context_dir"])
    try:
        _write_context(directory, build, paths, patched, text)
        tag = _derived_image.reference(inputs)
        _podman(
            runner, p, "build", "--pull=never", "--network=none", "--layers=false", "-f",
            os.path.join(directory, "Containerfile"), "-t", tag, directory, what=f"podman build of {tag}",
        )  # fmt: skip
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    built = _inspect(runner, p, tag)
    if built is None or not str(built.get("Digest", "")).startswith("sha256:"):
        raise BuildError(f"podman build of {tag} left no image with a digest")
    return built


def _present(runner: Runner, p: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    base = validate.image_reference("vllm_recipe.image", p["base"], require_digest=True)
    build = _build_recipe.build(p["build"])
    build.pop("base", None)
    if _inspect(runner, p, base) is None:
        raise BuildError(
            f"vllm_recipe.image: the base {base} is not on this node; the image step gets it first"
        )
    paths = _source_paths(p, build)
    measured = _measure(build, paths, check_mode)
    inputs = _derived_image.inputs_hash(base, build, measured)
    files = [{**entry, "sha256": measured[entry["src"]]} for entry in build.get("files", [])]
    canonical = {**build, **({"files": files} if files else {}), "base": base}
    result: dict[str, Any] = {
        "inputs_hash": inputs,
        "build": canonical,
        "changed": False,
        "built": False,
    }
    existing = _inspect(runner, p, _derived_image.reference(inputs))
    if existing and (existing.get("Labels") or {}).get(_derived_image.LABEL_INPUTS) == inputs:
        digest = str(existing.get("Digest", ""))
        return {**result, "digest": digest, "reference": _derived_image.reference(inputs, digest)}
    scratch = tempfile.mkdtemp(prefix="patch.")
    try:
        patched = _patched(runner, p, base, build, paths, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = _derived_image.containerfile(base, build, inputs, [dest for dest, _ in patched])
    result.update(changed=True, built=True, containerfile=text, diff={"before": "", "after": text})
    if check_mode:  # no digest before a build: the inputs hash stands in for it (RETURN)
        return {
            **result,
            "reference": _derived_image.reference(inputs, "sha256:" + inputs),
            "digest": "",
        }
    built = _build(runner, p, inputs, build, paths, patched, text)
    problems = _derived_image.env_problems(build, (built.get("Config") or {}).get("Env") or [])
    if problems:
        raise BuildError(
            f"{BUILD}.env_prepend: the built image's environment differs: {'; '.join(problems)}"
        )
    return {
        **result,
        "digest": built["Digest"],
        "reference": _derived_image.reference(inputs, built["Digest"]),
    }


def _pruned(runner: Runner, p: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    keep = validate.integer("serve_image_keep", p["keep"], minimum=1, maximum=100)
    out = _podman(
        runner, p, "images", "--filter", f"label={_derived_image.LABEL_INPUTS}", "--format", "json",
        what="podman images",
    )  # fmt: skip
    images = sorted(json.loads(out or "[]"), key=lambda i: i.get("Created", 0), reverse=True)
    protected = {ref.partition("@")[2] for ref in p["protect"]} - {""}
    removed = []
    for image in images[keep:]:
        if image.get("Digest") in protected:
            continue
        ident = str(image.get("Id", ""))
        removed.append(ident)
        if not check_mode:
            _run(runner, p, "rmi", ident, what=f"podman rmi {ident}")
    return {"changed": bool(removed), "removed": removed}


def run(p: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    """The module's one call: ``state`` present (build when needed) or pruned."""
    runner = Runner(timeout=float(p["timeout"]))
    if p["state"] == "pruned":
        return _pruned(runner, p, check_mode)
    return _present(runner, p, check_mode)
