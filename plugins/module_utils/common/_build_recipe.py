# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The recipe's derived image and extra mounts: ``vllm_recipe.build`` and ``vllm_recipe.mounts``.

A publisher's launcher often changes the image before ``exec vllm serve`` (copies a
file of the checkpoint over vLLM's, patches a mapping) or bind-mounts patch files
and a library over it. The recipe says the same thing in two keys, checked here
once, so that no value reaches a Containerfile, a unit file or a path unchecked:

``build`` (an image derived from the recipe's pinned ``image``, built on the head)::

    files:       [{src, dest, sha256?, mode?}]   copied into the image at dest
    patches:     [{src, sha256?, root, strip?}]  unified diffs against the base's files
    commands:    [text]                         RUN, one shell line each, no network
    env_prepend: {NAME: [path, ...]}            ENV NAME=path:...:${NAME} (PATH, LD_LIBRARY_PATH)
    base:        NAME@sha256:...                set by the collection: the image it derived from

``mounts`` (host files a publisher mounts instead of baking)::

    [{src, dest, sha256? | md5?}]               Volume=src:dest:ro, checked on every node

A ``src`` says where the bytes come from: ``collection:PATH`` (the collection's
``files/`` directory), ``inventory:PATH`` (beside the inventory), ``model:PATH`` (a
file of the pinned checkpoint, read on the build host) or an absolute path on the
controller (only below ``serve_build_roots``). Every source but ``model:`` carries
its sha256: the digest of its bytes is part of the image's identity. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)

SHA256 = re.compile(r"[0-9a-f]{64}")
MD5 = re.compile(r"[0-9a-f]{32}")
MODE = re.compile(r"0?[0-7]{3}")
SOURCE_KINDS = ("collection", "inventory", "model")
# What a recipe value starting with this is (recipes/README.md): a placeholder to fill in.
PLACEHOLDER = "REQUIRED"
BUILD_KEYS = ("files", "patches", "commands", "env_prepend", "base")
MOUNT_KEYS = ("src", "dest", "sha256", "md5")
MAX_ITEMS = 64
# Where a build may not write: the collection's own mounts and the kernel's trees.
RESERVED_DESTS = ("/proc", "/sys", "/dev", "/models", "/var/cache/vllm")


def _mapping(name: str, value: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(
            name, f"expected a mapping, got {validate.shown(value)}", "write it as YAML keys"
        )
    unknown = sorted(str(k) for k in value if k not in keys)
    if unknown:
        raise ValidationError(
            name, f"unknown key {validate.shown(unknown[0])}", f"use only {', '.join(keys)}"
        )
    return {k: v for k, v in value.items() if v is not None}


def _items(name: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValidationError(
            name, f"expected a list, got {validate.shown(value)}", "write a YAML list"
        )
    if len(value) > MAX_ITEMS:
        raise ValidationError(name, f"has {len(value)} entries (at most {MAX_ITEMS})", "merge them")
    return value


def _relative(name: str, value: str) -> str:
    """A relative path that stays where it is put (no ``..``, no absolute part)."""
    parts = value.split("/")
    if not value or value.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValidationError(
            name,
            f"{value!r} is not a plain relative path",
            "write DIR/FILE without '..', '//' or a leading /",
        )
    validate.path(name, "/" + value)  # the characters a path may hold
    return value


def source(name: str, value: Any) -> dict[str, str]:
    """``{kind, path, text}`` of a ``src``: a kind prefix and a relative path, or an absolute path."""
    text = validate.text(name, value, max_length=validate.MAX_PATH)
    if text.startswith(PLACEHOLDER):
        raise ValidationError(
            name, f"is the placeholder {text!r}", "set the real path before serving"
        )
    kind, sep, rest = text.partition(":")
    if sep and kind in SOURCE_KINDS:
        return {"kind": kind, "path": _relative(name, rest), "text": text}
    if text.startswith("/"):
        return {"kind": "controller", "path": validate.path(name, text), "text": text}
    raise ValidationError(
        name,
        f"{text!r} names no source",
        "write collection:PATH, inventory:PATH, model:PATH or an absolute path on the controller",
    )


def _digest(name: str, value: Any, pattern: re.Pattern[str], what: str) -> str:
    text = validate.text(name, value).lower()
    if text.startswith(PLACEHOLDER.lower()) or not pattern.fullmatch(text):
        raise ValidationError(
            name,
            f"{value!r} is not {what}",
            f"write the file's {what} ({what.split()[-1]}sum FILE)",
        )
    return text


def _pinned(name: str, entry: dict[str, Any], src: dict[str, str]) -> dict[str, Any]:
    """The entry's sha256, required unless the bytes come from the pinned checkpoint."""
    out: dict[str, Any] = {"src": src["text"]}
    if "sha256" in entry:
        out["sha256"] = _digest(f"{name}.sha256", entry["sha256"], SHA256, "a 64-hex sha256")
    elif src["kind"] != "model":
        raise ValidationError(
            f"{name}.sha256",
            f"is missing for {src['text']}",
            "pin the bytes: sha256sum FILE (a model: source is pinned by vllm_recipe.revision)",
        )
    return out


def _dest(name: str, value: Any) -> str:
    dest = validate.path(name, value)
    for root in RESERVED_DESTS:
        if validate.is_under(dest, (root,)):
            raise ValidationError(
                name, f"{dest} is under {root}, which the collection mounts", "choose another path"
            )
    if dest == "/":
        raise ValidationError(name, "is /", "name a file")
    return dest


def _file(name: str, value: Any) -> dict[str, Any]:
    entry = _mapping(name, value, ("src", "dest", "sha256", "mode"))
    out = _pinned(name, entry, source(f"{name}.src", entry.get("src")))
    out["dest"] = _dest(f"{name}.dest", entry.get("dest"))
    mode = validate.text(f"{name}.mode", entry.get("mode", "0644"))
    if not MODE.fullmatch(mode):
        raise ValidationError(
            f"{name}.mode", f"{mode!r} is not an octal mode", "write e.g. 0644 or 0755"
        )
    out["mode"] = mode.rjust(4, "0")
    return out


def _patch(name: str, value: Any) -> dict[str, Any]:
    entry = _mapping(name, value, ("src", "sha256", "root", "strip"))
    src = source(f"{name}.src", entry.get("src"))
    if src["kind"] == "model":
        raise ValidationError(
            f"{name}.src",
            "a patch is the recipe's, not the checkpoint's",
            "keep it in the collection or the inventory",
        )
    out = _pinned(name, entry, src)
    out["root"] = validate.path(f"{name}.root", entry.get("root", "/"))
    out["strip"] = validate.integer(f"{name}.strip", entry.get("strip", 1), minimum=0, maximum=16)
    return out


def _env_prepend(name: str, value: Any) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        raise ValidationError(
            name, "expected NAME: [path, ...]", "write it as a YAML mapping of lists"
        )
    out = {}
    for key, paths in value.items():
        var = validate.env_name(f"{name} key {validate.shown(key)}", key)
        out[var] = [
            validate.path(f"{name}.{var}[{i}]", p)
            for i, p in enumerate(_items(f"{name}.{var}", paths))
        ]
        if not out[var]:
            raise ValidationError(
                f"{name}.{var}", "is empty", "list the directories to prepend or drop the key"
            )
    return dict(sorted(out.items()))


def build(value: Any, name: str = "vllm_recipe.build") -> dict[str, Any]:
    """The canonical ``build``: every entry checked, defaults filled; empty lists dropped."""
    entry = _mapping(name, value, BUILD_KEYS)
    parts: dict[str, Callable[[str, Any], Any]] = {"files": _file, "patches": _patch}
    out: dict[str, Any] = {}
    for key, check in parts.items():
        items = [
            check(f"{name}.{key}[{i}]", v)
            for i, v in enumerate(_items(f"{name}.{key}", entry.get(key, [])))
        ]
        if items:
            out[key] = items
    commands = [
        validate.text(f"{name}.commands[{i}]", c)
        for i, c in enumerate(_items(f"{name}.commands", entry.get("commands", [])))
    ]
    if commands:
        out["commands"] = commands
    if entry.get("env_prepend"):
        out["env_prepend"] = _env_prepend(f"{name}.env_prepend", entry["env_prepend"])
    if "base" in entry:
        out["base"] = validate.image_reference(f"{name}.base", entry["base"], require_digest=True)
    if not set(out) - {"base"}:
        raise ValidationError(
            name, "derives nothing (no files, patches, commands or env_prepend)", "drop the key"
        )
    _unique(name, [f["dest"] for f in out.get("files", [])], "dest")
    return out


def _unique(name: str, values: list[str], what: str) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValidationError(name, f"two entries have the {what} {value}", "keep one")
        seen.add(value)


def mounts(value: Any, name: str = "vllm_recipe.mounts") -> list[dict[str, Any]]:
    """The canonical ``mounts``: host files or directories, read-only, each pinned or measured."""
    out = []
    for i, item in enumerate(_items(name, value)):
        entry = _mapping(f"{name}[{i}]", item, MOUNT_KEYS)
        text = validate.text(f"{name}[{i}].src", entry.get("src"), max_length=validate.MAX_PATH)
        if text.startswith(PLACEHOLDER):
            raise ValidationError(
                f"{name}[{i}].src", f"is the placeholder {text!r}", "set the path on every node"
            )
        mount = {
            "src": validate.path(f"{name}[{i}].src", text),
            "dest": _dest(f"{name}[{i}].dest", entry.get("dest")),
        }
        for key, pattern, what in (
            ("sha256", SHA256, "a 64-hex sha256"),
            ("md5", MD5, "a 32-hex md5"),
        ):
            if key in entry:
                mount[key] = _digest(f"{name}[{i}].{key}", entry[key], pattern, what)
        out.append(mount)
    _unique(name, [m["dest"] for m in out], "dest")
    return out


def controller_sources(
    raw: Any, collection_files: str, inventory_dir: str, roots: list[str]
) -> list[dict[str, str]]:
    """``[{src, path, sha256}]``: where each source the controller holds is, pinned; model: ones are not here.

    ``roots`` are the absolute directories an absolute ``src`` may lie under
    (``serve_build_roots``); a path outside them is refused naming its key.
    """
    checked = build(raw)
    found = []
    for key in ("files", "patches"):
        for index, entry in enumerate(checked.get(key, [])):
            name = f"vllm_recipe.build.{key}[{index}].src"
            src = source(name, entry["src"])
            if src["kind"] == "model":
                continue
            base = {"collection": collection_files, "inventory": inventory_dir}.get(src["kind"])
            path = f"{base.rstrip('/')}/{src['path']}" if base else src["path"]
            if src["kind"] == "controller" and not validate.is_under(
                path, [validate.path("serve_build_roots", r) for r in roots]
            ):
                raise ValidationError(
                    name,
                    f"{path} is outside serve_build_roots ({', '.join(roots) or 'none'})",
                    "keep the file beside the inventory (inventory:PATH) or add its directory to serve_build_roots",
                )
            found.append({"key": name, "src": entry["src"], "path": path, "sha256": entry["sha256"]})
    return found
