# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Weight manifests: per-file size, mtime and sha256, safetensors header sanity.

A manifest records one model snapshot (a directory) as a sorted list of files
with their size, modification time (nanoseconds) and sha256.  ``create`` makes
one from the head's copy; ``verify`` checks another node's copy against it.

The fast path trusts a file whose size and mtime equal the manifest's (rsync
preserves mtimes, so a faithful copy matches) and hashes nothing for it;
``full`` hashes every file.  Hashing runs several files at once in threads,
and each file is read by its own reader thread while it is hashed
(``_file_hash``): ``hashlib`` releases the GIL while it digests large buffers
and so do file reads, so threads scale across cores without extra processes.

The manifest's format and its reader (``load_manifest``, ``validate_manifest``) are
``common/_manifest_file.py``'s: the preflight and the upgrade read manifests too.

No AnsibleModule here: this file is unit-tested on its own.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat as stat_mod
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._manifest_file import (
    MANIFEST_FORMAT,
    SHA256_HEX,
    ManifestError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.weights._file_hash import (
    READ_BYTES,
    file_sha256,
)
from ansible_collections.localinference.vllm.plugins.module_utils.weights._safetensors import (  # noqa: F401 (re-exported)
    MAX_SAFETENSORS_HEADER,
    SAFETENSORS_DTYPE_BYTES,
    read_safetensors_summary,
    safetensors_header_check,
)


@dataclass
class FileRecord:
    path: str
    size: int
    mtime_ns: int
    sha256: str
    safetensors: dict[str, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "path": self.path,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "sha256": self.sha256,
        }
        if self.safetensors is not None:
            entry["safetensors"] = dict(self.safetensors)
        return entry


@dataclass
class HashResult:
    sha256: str
    size: int
    mtime_ns: int
    safetensors: dict[str, int] | None = None
    safetensors_error: str | None = None


@dataclass
class Outcome:
    """What ``create`` or ``verify`` found; the module turns it into its result."""

    records: list[FileRecord] = field(default_factory=list)
    mismatched: list[dict[str, Any]] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    hashed: int = 0
    hashed_bytes: int = 0
    # Files whose content matched but whose mtime did not: path -> manifest mtime_ns.
    touch: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatched


# --- hashing -----------------------------------------------------------------


def hash_file(
    path: str, chunk_bytes: int = READ_BYTES, drop_cache: bool = False, overlap: bool = True
) -> HashResult:
    """Hash one file (``_file_hash.file_sha256``), checking a safetensors header on the way.

    With ``drop_cache`` the file's pages are released while it is read so that a
    verification of a large checkpoint does not fill the page cache (on GB10
    the page cache competes with CUDA allocations).
    """
    digest = file_sha256(path, read_bytes=chunk_bytes, drop_cache=drop_cache, overlap=overlap)
    result = HashResult(sha256=digest.sha256, size=digest.size, mtime_ns=digest.mtime_ns)
    if path.endswith(".safetensors"):
        try:
            result.safetensors = read_safetensors_summary(path)
        except ValueError as exc:
            result.safetensors_error = str(exc)
    return result


def default_workers(file_count: int) -> int:
    return max(1, min(file_count, os.cpu_count() or 1, 16))


def hash_many(
    root: str,
    rel_paths: Iterable[str],
    workers: int = 0,
    drop_cache: bool = False,
    hasher: Callable[..., HashResult] = hash_file,
) -> dict[str, HashResult | OSError]:
    """Hash files under ``root`` in parallel; biggest first for an even finish."""
    paths = list(rel_paths)

    def size_of(rel: str) -> int:
        try:
            return os.stat(os.path.join(root, rel)).st_size
        except OSError:
            return 0

    paths.sort(key=size_of, reverse=True)
    count = workers if workers > 0 else default_workers(len(paths))

    def one(rel: str) -> tuple[str, HashResult | OSError]:
        try:
            return rel, hasher(os.path.join(root, rel), drop_cache=drop_cache)
        except OSError as exc:
            return rel, exc

    if count <= 1 or len(paths) <= 1:
        return dict(one(rel) for rel in paths)
    with ThreadPoolExecutor(max_workers=count) as pool:
        return dict(pool.map(one, paths))


# --- listing and manifest files ------------------------------------------------


# A snapshot has tens to thousands of files; more entries than this (or deeper
# nesting) means links that fan out, not a model.
MAX_ENTRIES = 1_000_000
MAX_DEPTH = 64


@dataclass
class Listing:
    """Regular files of a snapshot, and the entries that cannot be read as files."""

    files: dict[str, os.stat_result] = field(default_factory=dict)
    # relative path -> why it is broken (dangling link, link loop, unreadable)
    broken: dict[str, str] = field(default_factory=dict)


def broken_reason(path: str, error: OSError) -> str:
    """Why ``path`` cannot be read, in words (a dangling link is a shard never downloaded)."""
    if os.path.islink(path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        if error.errno == errno.ELOOP:
            return f"symlink loop: {target} leads back to itself"
        if error.errno == errno.ENOENT:
            return (
                f"dangling symlink to {target}: the file it points to does not exist"
                " (a shard never downloaded, or a blob deleted)"
            )
        return f"symlink to {target} cannot be read: {error.strerror or error}"
    return f"unreadable: {error.strerror or error}"


def scan(root: str) -> Listing:
    """Walk ``root`` following symlinks (as vLLM reads them); never loop, never skip silently.

    Hidden entries are skipped: rsync's in-flight temporary files start with a
    dot, and so do editor and download leftovers.  A dangling link or a link
    loop is reported once in ``broken``; a directory link that leads back to a
    directory above it is a loop and is not entered.
    """
    if not os.path.isdir(root):
        raise ManifestError(f"{root} is not a directory")
    listing = Listing()
    counted = 0

    def walk(directory: str, rel: str, ancestors: dict[tuple[int, int], str]) -> None:
        nonlocal counted
        try:
            with os.scandir(directory) as handle:
                entries = sorted(handle, key=lambda entry: entry.name)
        except OSError as exc:
            listing.broken[rel or "."] = f"directory unreadable: {exc.strerror or exc}"
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            counted += 1
            if counted > MAX_ENTRIES:
                raise ManifestError(
                    f"{root} has more than {MAX_ENTRIES} entries (directory links that fan out?)"
                )
            entry_rel = f"{rel}/{entry.name}" if rel else entry.name
            _check_utf8(root, entry_rel)
            try:
                stat = os.stat(entry.path)
            except OSError as exc:
                listing.broken[entry_rel] = broken_reason(entry.path, exc)
                continue
            if stat_mod.S_ISDIR(stat.st_mode):
                key = (stat.st_dev, stat.st_ino)
                if key in ancestors:
                    above = ancestors[key] or "the snapshot root"
                    listing.broken[entry_rel] = (
                        f"symlink loop: leads back to {above}, which contains it"
                    )
                elif len(ancestors) > MAX_DEPTH:
                    listing.broken[entry_rel] = f"nested more than {MAX_DEPTH} directories deep"
                else:
                    walk(entry.path, entry_rel, {**ancestors, key: entry_rel})
            elif _is_regular(stat):
                listing.files[entry_rel] = stat

    top = os.stat(root)
    walk(root, "", {(top.st_dev, top.st_ino): ""})
    return listing


def _check_utf8(root: str, rel: str) -> None:
    """Refuse a name that is not UTF-8 before anything is written.

    Such a name would reach the manifest (JSON, UTF-8) and the module's result, which Ansible
    cannot return; no model repository holds one, so it is a leftover to remove.
    """
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(rel)
        raise ManifestError(
            f"{root} holds a file name that is not UTF-8 ({shown!r}): rename or remove it"
            " (no model repository has one) and run again"
        ) from None


def list_files(root: str) -> dict[str, os.stat_result]:
    """Regular files under ``root`` (symlinks followed, as vLLM reads them), by relative path.

    Broken entries are left out here; :func:`scan` reports them.
    """
    return scan(root).files


def _is_regular(stat: os.stat_result) -> bool:
    return stat_mod.S_ISREG(stat.st_mode)


def manifest_document(
    records: list[FileRecord], model: str | None, revision: str | None
) -> dict[str, Any]:
    records = sorted(records, key=lambda r: r.path)
    return {
        "format": MANIFEST_FORMAT,
        "model": model,
        "revision": revision,
        "file_count": len(records),
        "total_bytes": sum(r.size for r in records),
        "files": [r.as_dict() for r in records],
    }


def render_manifest(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def write_manifest(path: str, document: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a manifest."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(render_manifest(document))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def summary_lines(document: dict[str, Any] | None) -> str:
    """One line per file, for diff output."""
    if not document:
        return ""
    return "".join(
        f"{e['sha256']}  {e['size']:>14}  {e['path']}\n" for e in document.get("files", [])
    )


# --- create and verify -------------------------------------------------------


def same_mtime(recorded_ns: int, actual_ns: int) -> bool:
    """Equal, or equal to the second when one side has no sub-second precision."""
    if recorded_ns == actual_ns:
        return True
    if recorded_ns % 1_000_000_000 == 0 or actual_ns % 1_000_000_000 == 0:
        return recorded_ns // 1_000_000_000 == actual_ns // 1_000_000_000
    return False


def blob_digest(path: str) -> str | None:
    """sha256 named by a Hugging Face cache blob a snapshot entry links to, if any."""
    if not os.path.islink(path):
        return None
    name = os.path.basename(os.path.realpath(path))
    return name if SHA256_HEX.match(name) else None


def _hash_error(rel: str, res: HashResult | OSError) -> dict[str, Any] | None:
    if isinstance(res, OSError):
        return {"path": rel, "reason": f"unreadable: {res.strerror or res}"}
    if res.safetensors_error:
        return {"path": rel, "reason": res.safetensors_error}
    return None


def create(
    root: str,
    previous: dict[str, Any] | None,
    full: bool = False,
    workers: int = 0,
    drop_cache: bool = False,
) -> Outcome:
    """Build the records for ``root``, reusing ``previous`` digests on the fast path.

    A file the previous manifest lists that is now missing, or whose content
    changed while its size and mtime did not, is reported as mismatched: the
    caller must not bless a damaged snapshot by rewriting its manifest.  So is
    a dangling link (a shard never downloaded) or a link loop: a manifest of an
    incomplete snapshot would approve it on every node.
    """
    outcome = Outcome()
    listing = scan(root)
    on_disk = listing.files
    for rel, reason in sorted(listing.broken.items()):
        outcome.mismatched.append({"path": rel, "reason": reason})
    known = {e["path"]: e for e in (previous or {}).get("files", [])}
    to_hash: list[str] = []
    for rel, stat in sorted(on_disk.items()):
        entry = known.get(rel)
        if (
            not full
            and entry
            and entry["size"] == stat.st_size
            and same_mtime(entry["mtime_ns"], stat.st_mtime_ns)
        ):
            outcome.records.append(
                FileRecord(
                    rel, entry["size"], entry["mtime_ns"], entry["sha256"], entry.get("safetensors")
                )
            )
        else:
            to_hash.append(rel)
    results = hash_many(root, to_hash, workers=workers, drop_cache=drop_cache)
    for rel in to_hash:
        res = results[rel]
        error = _hash_error(rel, res)
        if error or not isinstance(res, HashResult):
            outcome.mismatched.append(error or {"path": rel, "reason": "unreadable"})
            continue
        outcome.hashed += 1
        outcome.hashed_bytes += res.size
        entry = known.get(rel)
        expected_blob = blob_digest(os.path.join(root, rel))
        if expected_blob and expected_blob != res.sha256:
            outcome.mismatched.append(
                {
                    "path": rel,
                    "reason": f"sha256 {res.sha256} differs from its cache blob name {expected_blob}",
                }
            )
            continue
        if (
            entry
            and entry["size"] == res.size
            and same_mtime(entry["mtime_ns"], res.mtime_ns)
            and entry["sha256"] != res.sha256
        ):
            outcome.mismatched.append(
                {
                    "path": rel,
                    "reason": "sha256 changed while size and mtime did not (corrupted in place)",
                }
            )
            continue
        outcome.records.append(FileRecord(rel, res.size, res.mtime_ns, res.sha256, res.safetensors))
    for rel in sorted(set(known) - set(on_disk) - set(listing.broken)):
        outcome.mismatched.append(
            {"path": rel, "reason": "missing (listed in the existing manifest)"}
        )
    outcome.mismatched.sort(key=lambda m: m["path"])
    return outcome


def verify(
    root: str,
    manifest: dict[str, Any],
    full: bool = False,
    paths: list[str] | None = None,
    workers: int = 0,
    drop_cache: bool = False,
) -> Outcome:
    """Check ``root`` against ``manifest``.

    Fast path: a file whose size and mtime equal the manifest's is trusted and
    not read.  Size differences fail without hashing.  A file with the right
    size but another mtime is hashed; when its content matches, the caller may
    restore the recorded mtime (``Outcome.touch``) so the next run is fast again.
    """
    outcome = Outcome()
    entries = {e["path"]: e for e in manifest["files"]}
    selected = sorted(entries) if paths is None else sorted(set(paths))
    unknown = [p for p in selected if p not in entries]
    for rel in unknown:
        outcome.mismatched.append({"path": rel, "reason": "not in the manifest", "size": 0})
    to_hash = _stat_pass(root, entries, selected, full, outcome)
    _hash_pass(root, entries, to_hash, workers, drop_cache, outcome)
    if paths is None and os.path.isdir(root):
        listing = scan(root)
        outcome.extra = sorted(set(listing.files) - set(entries))
        # A broken entry the manifest does not list (a dangling link, a loop) would
        # still be read by vLLM's glob: it must go, and a copy cannot fix it.
        for rel, reason in sorted(listing.broken.items()):
            if rel not in entries:
                outcome.mismatched.append(
                    {"path": rel, "reason": f"{reason}; not in the manifest: delete it", "size": 0}
                )
    outcome.mismatched.sort(key=lambda m: m["path"])
    return outcome


def _stat_pass(
    root: str, entries: dict[str, Any], selected: list[str], full: bool, outcome: Outcome
) -> list[str]:
    """The files to hash: missing, odd or resized files fail here without being read."""
    to_hash: list[str] = []
    for rel in selected:
        entry = entries.get(rel)
        if entry is None:
            continue
        full_path = os.path.join(root, rel)
        try:
            stat = os.stat(full_path)
        except OSError as exc:
            reason = "missing" if not os.path.islink(full_path) else broken_reason(full_path, exc)
            outcome.mismatched.append({"path": rel, "reason": reason, "size": entry["size"]})
            continue
        if not _is_regular(stat):
            outcome.mismatched.append(
                {"path": rel, "reason": "not a regular file", "size": entry["size"]}
            )
        elif stat.st_size != entry["size"]:
            outcome.mismatched.append(
                {
                    "path": rel,
                    "reason": f"size {stat.st_size} differs from {entry['size']}",
                    "size": entry["size"],
                }
            )
        elif full or not same_mtime(entry["mtime_ns"], stat.st_mtime_ns):
            to_hash.append(rel)
    return to_hash


def _hash_pass(
    root: str,
    entries: dict[str, Any],
    to_hash: list[str],
    workers: int,
    drop_cache: bool,
    outcome: Outcome,
) -> None:
    """Hash ``to_hash``; a match with another mtime is to be touched back (``Outcome.touch``)."""
    results = hash_many(root, to_hash, workers=workers, drop_cache=drop_cache)
    for rel in to_hash:
        entry = entries[rel]
        res = results[rel]
        error = _hash_error(rel, res)
        if error or not isinstance(res, HashResult):
            error = error or {"path": rel, "reason": "unreadable"}
            error["size"] = entry["size"]
            outcome.mismatched.append(error)
            continue
        outcome.hashed += 1
        outcome.hashed_bytes += res.size
        if res.sha256 != entry["sha256"]:
            outcome.mismatched.append(
                {
                    "path": rel,
                    "reason": f"sha256 {res.sha256} differs from {entry['sha256']}",
                    "size": entry["size"],
                }
            )
        elif not same_mtime(entry["mtime_ns"], res.mtime_ns):
            outcome.touch[rel] = entry["mtime_ns"]


def restore_mtimes(root: str, touch: dict[str, int]) -> None:
    for rel, mtime_ns in touch.items():
        full_path = os.path.join(root, rel)
        atime_ns = os.stat(full_path).st_atime_ns
        os.utime(full_path, ns=(atime_ns, mtime_ns))


def disk_free_bytes(path: str) -> int:
    """Free bytes for unprivileged writers on the filesystem that holds (or would hold) ``path``."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return shutil.disk_usage(probe).free
