# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The derived image of ``vllm_recipe.build``: its identity, its Containerfile, its patches.

Pure functions (``plugins/modules/image_build.py`` does the I/O):

1. :func:`inputs_hash` - the sha256 of everything that goes into the image: the base's
   digest, each file's and patch's sha256 and place, the commands, the prepends. The
   built image is tagged and labelled with it; an image with that label is the build,
   so an unchanged recipe builds nothing.
2. :func:`parse_patch` and :func:`apply_patch` - a unified diff applied strictly: every
   hunk's old lines must be found exactly (near its line number, any offset), never
   fuzzed. A hunk that does not apply is refused naming the patch, the file and the
   hunk, before anything is built or stopped (fail closed).
3. :func:`containerfile` - ``FROM base@digest``, then ``COPY`` of numbered context
   files, ``RUN`` in exec form (``/bin/sh -c`` with the line as one JSON string) and
   ``ENV`` prepends; every user value is a JSON string or a checked path, so nothing a
   recipe says can start a Containerfile instruction of its own.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)

FORMAT = "localinference.vllm/derived-image/v1"
LABEL_INPUTS = "io.localinference.build.inputs"
LABEL_BASE = "io.localinference.build.base"
NAME = "localhost/localinference-vllm-built"
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@.*")


class PatchError(ValidationError):
    """A patch that does not apply to the base; names the patch, the file and the hunk."""


@dataclass
class Hunk:
    header: str
    old_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)


@dataclass
class FilePatch:
    path: str  # relative to the patch's root, after strip
    hunks: list[Hunk] = field(default_factory=list)
    created: bool = False


def inputs_hash(base: str, build: dict[str, Any], measured: dict[str, str]) -> str:
    """sha256 of the base digest and every input; ``measured`` maps a model: src to its sha256."""
    files = [
        {"sha256": f.get("sha256") or measured[f["src"]], "dest": f["dest"], "mode": f["mode"]}
        for f in build.get("files", [])
    ]
    patches = [
        {"sha256": p["sha256"], "root": p["root"], "strip": p["strip"]}
        for p in build.get("patches", [])
    ]
    payload = {
        "format": FORMAT,
        "base": base.partition("@")[2],
        "files": files,
        "patches": patches,
        "commands": build.get("commands", []),
        "env_prepend": build.get("env_prepend", {}),
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def reference(inputs: str, digest: str = "") -> str:
    """The built image's reference: tagged by its inputs, pinned by its digest once built."""
    tag = f"{NAME}:{inputs[:16]}"
    return f"{tag}@{digest}" if digest else tag


def _strip(name: str, path: str, strip: int, where: str) -> str:
    path = path.split("\t", 1)[0].strip()
    parts = path.split("/")
    if len(parts) <= strip or any(p in ("", ".", "..") for p in parts[strip:]):
        raise PatchError(
            name,
            f"{where}: {path!r} has no file left after strip {strip}",
            "fix the patch or its strip",
        )
    return "/".join(parts[strip:])


def _hunk_body(name: str, lines: list[str], i: int, hunk: Hunk, counts: tuple[int, int]) -> int:
    old_left, new_left = counts
    while old_left > 0 or new_left > 0:
        if i >= len(lines):
            raise PatchError(
                name, f"{hunk.header}: the hunk ends early", "make the diff again (diff -u)"
            )
        line = lines[i]
        i += 1
        if line.startswith("\\"):
            continue
        tag, text = (line[:1], line[1:]) if line else (" ", "")
        if tag in " -":
            hunk.old.append(text)
            old_left -= 1
        if tag in " +":
            hunk.new.append(text)
            new_left -= 1
        if tag not in " -+":
            raise PatchError(
                name, f"{hunk.header}: line {line!r} is not part of a hunk", "make the diff again"
            )
    return i


def parse_patch(name: str, text: str, strip: int) -> list[FilePatch]:
    """The files and hunks of a unified diff; ``name`` (the recipe key) is in every refusal."""
    lines = text.splitlines()
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not (
            lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        ):
            i += 1
            continue
        created = lines[i][4:].split("\t")[0].strip() == "/dev/null"
        current = FilePatch(_strip(name, lines[i + 1][4:], strip, "+++ line"), created=created)
        files.append(current)
        i += 2
        while i < len(lines) and (match := _HUNK.fullmatch(lines[i])):
            hunk = Hunk(lines[i], int(match.group(1)))
            counts = (int(match.group(2) or 1), int(match.group(4) or 1))
            i = _hunk_body(name, lines, i + 1, hunk, counts)
            current.hunks.append(hunk)
    if not files or not all(f.hunks for f in files):
        raise PatchError(name, "holds no unified diff hunks", "write it with diff -u or git diff")
    return files


def _find(lines: list[str], old: list[str], near: int, start: int) -> int | None:
    """The index nearest ``near`` (at or after ``start``) where ``old`` appears exactly."""
    places = [at for at in range(start, len(lines) - len(old) + 1) if lines[at : at + len(old)] == old]
    return min(places, key=lambda at: abs(at - near), default=None)


def apply_patch(name: str, patch: FilePatch, original: str | None) -> str:
    """``original`` with every hunk applied, or :class:`PatchError` naming the file and hunk."""
    if original is None and not patch.created:
        raise PatchError(
            name,
            f"{patch.path}: the base image has no such file",
            "check the patch's root and strip",
        )
    lines = (original or "").splitlines()
    trailing = (original or "").endswith("\n") or original in (None, "")
    delta = 0
    start = 0
    for number, hunk in enumerate(patch.hunks, 1):
        near = max(hunk.old_start - 1 + delta, 0) if hunk.old else max(hunk.old_start + delta, 0)
        at = _find(lines, hunk.old, min(near, len(lines)), start)
        if at is None:
            raise PatchError(
                name,
                f"{patch.path}: hunk #{number} ({hunk.header}) does not apply: its lines are not in the base"
                f" (first: {(hunk.old or [''])[0].strip()[:80]!r})",
                "the base changed under the patch: rebase the patch on the new base, or keep the old image",
            )
        lines[at : at + len(hunk.old)] = hunk.new
        delta += len(hunk.new) - len(hunk.old)
        start = at + len(hunk.new)
    return "\n".join(lines) + ("\n" if trailing and lines else "")


def _json(value: str) -> str:
    return json.dumps(value, ensure_ascii=True)


def containerfile(base: str, build: dict[str, Any], inputs: str, patched: list[str]) -> str:
    """The Containerfile of the derived image; context files are ``files/N`` and ``patched/N``.

    ``patched`` lists the absolute destinations of the patched files, in context order.
    """
    lines = [
        "# Rendered by localinference.vllm from vllm_recipe.build; do not edit.",
        f"FROM {base}",
    ]
    for index, entry in enumerate(build.get("files", [])):
        lines.append(
            f"COPY --chmod={entry['mode']} [{_json(f'files/{index}')}, {_json(entry['dest'])}]"
        )
    for index, dest in enumerate(patched):
        lines.append(f"COPY [{_json(f'patched/{index}')}, {_json(dest)}]")
    for command in build.get("commands", []):
        lines.append(f'RUN ["/bin/sh", "-c", {_json(command)}]')
    for var, paths in build.get("env_prepend", {}).items():
        lines.append(f'ENV {var}="{":".join(paths)}${{{var}:+:${{{var}}}}}"')
    lines.append(f"LABEL {_json(LABEL_INPUTS)}={_json(inputs)} {_json(LABEL_BASE)}={_json(base)}")
    return "\n".join(lines) + "\n"


def env_problems(build: dict[str, Any], env: list[str]) -> list[str]:
    """What the built image's ``Config.Env`` lacks of ``env_prepend`` (empty when it has it all)."""
    values = dict(item.partition("=")[::2] for item in env)
    problems = []
    for var, paths in build.get("env_prepend", {}).items():
        want = ":".join(paths)
        have = values.get(var, "")
        if have != want and not have.startswith(want + ":"):
            problems.append(f"{var} is {have!r}, not {want!r} prepended")
    return problems
