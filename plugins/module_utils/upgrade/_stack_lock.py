# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stack lockfile: the whole stack that last served, with its history.

After every good rollout the head records, per node, what served: the image
(reference, digest, local id), the vLLM and NCCL versions, the normalised
recipe and its hash, the model revision and the digest of its weights
manifest, the kernel, the driver and CUDA versions and the firmware of the
cluster NICs. ``/etc/localinference/stack.lock.json`` keeps the newest entries
first::

    {"schema": 1, "kind": "localinference.vllm/stack-lock",
     "entries": [{"recorded_at": "...", "stack_hash": "<sha256>", "nodes": {host: {...}}}, ...]}

``stack_hash`` is the sha256 of the canonical JSON of ``nodes``: recording
the same stack again adds nothing, and an entry edited by hand no longer
matches its hash. The file read back from a node is schema-checked; what is
wrong with it becomes findings, never an exception. Pure Python: the module
``stack_lock`` does the reading and writing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import recipe_hash

SCHEMA = 1
KIND = "localinference.vllm/stack-lock"
CHECK = "stack_lock"
DEFAULT_KEEP = 10
MAX_KEEP = 1000
MAX_LINES = 60
MAX_TEXT = 512
HEX64 = re.compile(r"[0-9a-f]{64}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,63}")

# Every key of a node's record, in the order diffs print them. Values are
# null when the node could not tell (no GPU, no NCCL in the image, ...).
TEXT_FIELDS = (
    "image",
    "image_digest",
    "image_id",
    "vllm_version",
    "model",
    "revision",
    "manifest_digest",
    "kernel",
    "driver_version",
    "cuda_version",
    "nccl_version",
)
NODE_FIELDS = ("rank", "deploy_mode", "recipe_hash", "recipe", "gpus", "nics", "hcas", *TEXT_FIELDS)
DIFF_ORDER = (
    "rank",
    "deploy_mode",
    "image",
    "image_digest",
    "image_id",
    "vllm_version",
    "recipe_hash",
    "recipe",
    "model",
    "revision",
    "manifest_digest",
    "kernel",
    "driver_version",
    "cuda_version",
    "gpus",
    "nccl_version",
    "nics",
    "hcas",
)
# Properties of the image (or venv): a node that could not read them takes
# them from another node that runs the same image.
IMAGE_FIELDS = ("vllm_version", "nccl_version")


class StackLockError(validate.InputError):
    """A stack that cannot be recorded; the message names the node, the key and the fix."""


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def stack_hash(nodes: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(nodes).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- node records


def _text_ok(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_TEXT
        and all(char.isprintable() for char in value)
    )


def node_problems(record: Any) -> list[str]:
    """What is wrong with one node's record (empty when it is well-formed)."""
    if not isinstance(record, dict):
        return [f"is {type(record).__name__}, not a mapping"]
    problems = []
    missing = [key for key in NODE_FIELDS if key not in record]
    if missing:
        problems.append(f"lacks {', '.join(missing)}")
    extra = sorted(str(key) for key in record if key not in NODE_FIELDS)
    if extra:
        problems.append(f"has unknown keys {', '.join(extra)}")
    rank = record.get("rank")
    if "rank" in record and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        problems.append(f"rank is {rank!r}, not a non-negative integer")
    if "deploy_mode" in record and record["deploy_mode"] not in ("quadlet", "systemd"):
        problems.append(f"deploy_mode is {record['deploy_mode']!r}, not quadlet or systemd")
    for key in TEXT_FIELDS:
        if key in record and record[key] is not None and not _text_ok(record[key]):
            problems.append(f"{key} is {_shown(record[key])}, not printable text or null")
    digest = record.get("image_digest")
    if digest is not None and not DIGEST.fullmatch(str(digest)):
        problems.append(f"image_digest is {_shown(record['image_digest'])}, not sha256:<64 hex>")
    problems += _recipe_problems(record)
    if "gpus" in record and not (
        isinstance(record["gpus"], list) and all(_text_ok(name) for name in record["gpus"])
    ):
        problems.append(f"gpus is {_shown(record['gpus'])}, not a list of GPU names")
    for key in ("nics", "hcas"):
        value = record.get(key)
        if key in record and not (
            isinstance(value, dict)
            and all(
                isinstance(name, str) and NAME.fullmatch(name) and (fw is None or _text_ok(fw))
                for name, fw in value.items()
            )
        ):
            problems.append(f"{key} is {_shown(value)}, not a mapping of device name to firmware")
    return problems


def _recipe_problems(record: dict[str, Any]) -> list[str]:
    digest, recipe = record.get("recipe_hash"), record.get("recipe")
    problems = []
    if "recipe_hash" in record and not (isinstance(digest, str) and HEX64.fullmatch(digest)):
        problems.append(f"recipe_hash is {_shown(digest)}, not a sha256 hex digest")
    if "recipe" in record and not isinstance(recipe, dict):
        problems.append(f"recipe is {_shown(recipe)}, not a mapping")
    elif isinstance(recipe, dict) and not problems and "recipe_hash" in record:
        try:
            actual = recipe_hash(recipe)
        except (TypeError, ValueError):
            actual = None
        if actual != digest:
            problems.append(f"recipe does not hash to its recipe_hash {digest[:12]} (edited?)")
    return problems


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def build_entry(nodes: Any, recorded_at: str) -> dict[str, Any]:
    """One history entry from the records ``gathered`` on each node.

    A node that could not read an image property (the vLLM version: only the
    head's log prints it) takes it from a node running the same image.
    Raises :class:`StackLockError` naming the node and the key.
    """
    if not isinstance(nodes, dict) or not nodes:
        raise StackLockError(
            "nodes must map each node's inventory name to its gathered record (state=gathered)"
        )
    clean: dict[str, Any] = {}
    for host, record in nodes.items():
        if not isinstance(host, str) or not HOST.fullmatch(host):
            raise StackLockError(f"nodes: {_shown(host)} is not an inventory host name")
        problems = node_problems(record)
        if problems:
            raise StackLockError(
                f"nodes.{host} {'; '.join(problems)}: pass the record stack_lock state=gathered "
                "returned on that node (its node key)"
            )
        clean[host] = json.loads(canonical_json(record))
    ranks = sorted(record["rank"] for record in clean.values())
    if len(set(ranks)) != len(ranks):
        raise StackLockError(f"nodes: two nodes claim the same rank ({ranks})")
    _fill_from_peers(clean)
    return {"recorded_at": recorded_at, "stack_hash": stack_hash(clean), "nodes": clean}


def _fill_from_peers(nodes: dict[str, dict[str, Any]]) -> None:
    for key in IMAGE_FIELDS:
        known: dict[Any, Any] = {}
        for record in sorted(nodes.values(), key=lambda r: r["rank"]):
            anchor = _image_anchor(record)
            if record[key] is not None and anchor is not None:
                known.setdefault(anchor, record[key])
        for record in nodes.values():
            anchor = _image_anchor(record)
            if record[key] is None and anchor in known:
                record[key] = known[anchor]


def _image_anchor(record: dict[str, Any]) -> Any:
    """What makes two nodes' image properties equal: the image by digest, or the venv's vLLM."""
    if record.get("deploy_mode") == "quadlet":
        return (
            ("image", record.get("image_digest") or record.get("image"))
            if record.get("image")
            else None
        )
    recipe = record.get("recipe") or {}
    version = recipe.get("vllm_version") if isinstance(recipe, dict) else None
    return ("venv", version) if version else None


def same_image(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two records of a node ran the same image (or venv release)."""
    if not a or not b:
        return False
    anchor = _image_anchor(a)
    return anchor is not None and anchor == _image_anchor(b)


# --------------------------------------------------------------------------- the file


def empty_document() -> dict[str, Any]:
    return {"schema": SCHEMA, "kind": KIND, "entries": []}


def render(entries: list[dict[str, Any]]) -> str:
    return json.dumps({**empty_document(), "entries": entries}, sort_keys=True, indent=2) + "\n"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def check_document(
    text: str | bytes | None, where: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(entries, findings)`` of a lockfile read back from a node; never raises.

    ``entries`` holds only the entries that passed, newest first. A file that
    cannot be trusted at all gives no entries and one error finding; an entry
    that is malformed or does not match its ``stack_hash`` is dropped with an
    error finding naming its position.
    """
    if text is None:
        return [], []
    fix = f"move {where} aside (the next good rollout records a new history)"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return [], [finding(CHECK, "error", f"{where} is not UTF-8 text", fix, path=where)]
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        return [], [finding(CHECK, "error", f"{where} is not valid JSON ({exc})", fix, path=where)]
    problems = []
    if not isinstance(doc, dict):
        problems.append(f"holds {type(doc).__name__}, not a stack lock document")
    else:
        if doc.get("schema") != SCHEMA:
            problems.append(f"schema is {_shown(doc.get('schema'))}, expected {SCHEMA}")
        if doc.get("kind") != KIND:
            problems.append(f"kind is {_shown(doc.get('kind'))}, expected {KIND!r}")
        if not isinstance(doc.get("entries"), list):
            problems.append("entries is not a list")
    if problems:
        message = f"{where} cannot be trusted: {'; '.join(problems)}"
        return [], [finding(CHECK, "error", message, fix, path=where)]
    entries, findings = [], []
    for position, entry in enumerate(doc["entries"]):
        found = entry_problems(entry)
        if found:
            findings.append(
                finding(
                    CHECK,
                    "error",
                    f"{where} entries[{position}] is dropped: {'; '.join(found)}",
                    fix,
                    path=where,
                )
            )
        else:
            entries.append(entry)
    return entries, findings


def entry_problems(entry: Any) -> list[str]:
    if not isinstance(entry, dict):
        return [f"is {type(entry).__name__}, not a mapping"]
    problems = []
    if not _text_ok(entry.get("recorded_at")) or len(entry["recorded_at"]) > 64:
        problems.append(f"recorded_at is {_shown(entry.get('recorded_at'))}, not a timestamp")
    digest = entry.get("stack_hash")
    if not (isinstance(digest, str) and HEX64.fullmatch(digest)):
        problems.append(f"stack_hash is {_shown(digest)}, not a sha256 hex digest")
    nodes = entry.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        return [*problems, "nodes is not a non-empty mapping"]
    for host, record in nodes.items():
        if not HOST.fullmatch(host):
            problems.append(f"node {_shown(host)} is not an inventory host name")
        problems += [f"nodes.{host} {problem}" for problem in node_problems(record)]
    if not problems and stack_hash(nodes) != digest:
        problems.append(f"nodes do not hash to its stack_hash {digest[:12]} (edited?)")
    return problems


# --------------------------------------------------------------------------- history


def record(
    entries: list[dict[str, Any]], entry: dict[str, Any], keep: int = DEFAULT_KEEP
) -> dict[str, Any]:
    """Put ``entry`` on top of the history, unless it is the stack already on top.

    Returns ``{entries, entry, added, changes, last_good}``: ``last_good`` is
    the good stack before the current one (null when there is none) and
    ``changes`` what changed from it (empty when nothing was added).
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= MAX_KEEP:
        raise StackLockError(f"keep must be an integer from 1 to {MAX_KEEP}, got {keep!r}")
    if entries and entries[0]["stack_hash"] == entry["stack_hash"]:
        return {
            "entries": entries[:keep],
            "entry": entries[0],
            "added": False,
            "changes": [],
            "last_good": entries[1] if len(entries) > 1 else None,
        }
    return {
        "entries": [entry, *entries][:keep],
        "entry": entry,
        "added": True,
        "changes": diff_entries(entries[0], entry) if entries else [],
        "last_good": entries[0] if entries else None,
    }


def head_of(entry: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The rank-0 node of an entry, ``(host, record)``."""
    return min(entry["nodes"].items(), key=lambda item: item[1]["rank"])


def revert_plan(
    entries: list[dict[str, Any]], findings: Iterable[dict[str, Any]], where: str
) -> dict[str, Any]:
    """Whether ``--tags revert`` can go back to the last good stack, and to which recipe."""
    plan: dict[str, Any] = {
        "possible": False,
        "reason": "",
        "recipe": None,
        "recipe_hash": None,
        "recorded_at": None,
        "changes": [],
    }
    errors = [f["message"] for f in findings if f.get("severity") == "error"]
    if errors:
        plan["reason"] = (
            f"refusing to revert: {'; '.join(errors)}. Move the file aside and roll out the "
            "recipe you want by hand (vllm_recipe)."
        )
        return plan
    if not entries:
        plan["reason"] = (
            f"no stack is recorded in {where}: nothing to revert to (every good rollout records one)."
        )
        return plan
    current, *older = entries
    if not older:
        plan["reason"] = (
            f"{where} holds one stack only (recorded {current['recorded_at']}): there is no previous "
            "good stack to revert to."
        )
        return plan
    target = older[0]
    hashes = sorted({node["recipe_hash"] for node in target["nodes"].values()})
    if len(hashes) > 1:
        plan["reason"] = (
            f"the last good stack (recorded {target['recorded_at']}) has nodes that served different "
            f"recipes ({', '.join(h[:12] for h in hashes)}): roll out the recipe you want by hand."
        )
        return plan
    _, head = head_of(target)
    _, now = head_of(current)
    changes = diff_entries(current, target)
    if head["recipe_hash"] == now["recipe_hash"]:
        outside = "; ".join(changes) or "nothing"
        plan["reason"] = (
            f"the last good stack (recorded {target['recorded_at']}) served the same recipe "
            f"{head['recipe_hash'][:12]} as the current one: what differs is outside the recipe "
            f"({outside}). Put those back by hand; a rollout cannot."
        )
        plan["changes"] = changes
        return plan
    plan.update(
        possible=True,
        recipe=head["recipe"],
        recipe_hash=head["recipe_hash"],
        recorded_at=target["recorded_at"],
        changes=changes,
    )
    return plan


# --------------------------------------------------------------------------- diffs


def _brief(value: Any) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, str):
        if HEX64.fullmatch(value):
            return value[:12]
        if DIGEST.fullmatch(value):
            return value[:19]
        text = value
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        text = ", ".join(value) or "none"
    else:
        text = canonical_json(value)
    return text if len(text) <= 120 else text[:117] + "..."


_ABSENT = object()


def _paths(record: dict[str, Any]) -> dict[str, Any]:
    """A record as ``{"image": ..., "recipe.max_num_seqs": ..., "nics.eth0": ...}``."""
    out: dict[str, Any] = {}
    for key in DIFF_ORDER:
        value = record.get(key)
        if key in ("recipe", "nics", "hcas") and isinstance(value, dict):
            for sub in sorted(value):
                out[f"{key}.{sub}"] = value[sub]
        else:
            out[key] = value
    return out


def _shown_value(path: str, value: Any) -> str:
    if value is _ABSENT:
        return "(unset)" if path.startswith("recipe.") else "(absent)"
    return _brief(value)


def diff_entries(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human lines from ``old`` to ``new``: ``image: A -> B``.

    A change seen the same way on every node is one line; otherwise each node
    that differs has its own (``spark-worker kernel: A -> B``).
    """
    lines: list[str] = []
    old_nodes, new_nodes = old["nodes"], new["nodes"]
    for host in sorted(set(old_nodes) - set(new_nodes)):
        lines.append(f"node {host}: removed (was rank {old_nodes[host]['rank']})")
    for host in sorted(set(new_nodes) - set(old_nodes)):
        lines.append(f"node {host}: added (rank {new_nodes[host]['rank']})")
    common = sorted(set(old_nodes) & set(new_nodes), key=lambda h: new_nodes[h]["rank"])
    before = {host: _paths(old_nodes[host]) for host in common}
    after = {host: _paths(new_nodes[host]) for host in common}
    order: list[str] = []
    for host in common:
        for path in [*before[host], *after[host]]:
            if path not in order:
                order.append(path)
    order.sort(key=_order_key)
    for path in order:
        pairs = {
            host: (before[host].get(path, _ABSENT), after[host].get(path, _ABSENT))
            for host in common
        }
        changed = {host: pair for host, pair in pairs.items() if pair[0] != pair[1]}
        if not changed:
            continue
        if len(common) > 1 and len(changed) == len(common) and _all_equal(changed.values()):
            was, now = next(iter(changed.values()))
            lines.append(f"{path}: {_shown_value(path, was)} -> {_shown_value(path, now)}")
            continue
        prefix = "" if len(common) == 1 else "{host} "
        for host, (was, now) in changed.items():
            lines.append(
                f"{prefix.format(host=host)}{path}: {_shown_value(path, was)} -> {_shown_value(path, now)}"
            )
    if len(lines) > MAX_LINES:
        lines = [*lines[: MAX_LINES - 1], f"... and {len(lines) - MAX_LINES + 1} more differences"]
    return lines


def _order_key(path: str) -> tuple[int, str]:
    head = path.split(".", 1)[0]
    return (DIFF_ORDER.index(head) if head in DIFF_ORDER else len(DIFF_ORDER), path)


def _token(value: Any) -> str:
    return "(absent)" if value is _ABSENT else canonical_json(value)


def _all_equal(pairs: Iterable[tuple[Any, Any]]) -> bool:
    return len({(_token(was), _token(now)) for was, now in pairs}) == 1
