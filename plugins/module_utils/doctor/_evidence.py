# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the doctor gathers, and how it is checked before anything in it is believed.

The ``doctor_facts`` module reads, on every node, the saved stage results,
``systemctl show`` of the serving units and the tail of the server's last boot
log, and returns them as raw text. :func:`check_node` turns one node's raw
evidence into checked values (``NodeEvidence``) plus ``problems``: every file,
property and log is schema-checked here, and anything malformed becomes a
problem the doctor reports (id ``evidence``), never an exception.

No AnsibleModule here: unit-tested on its own (tests/unit/plugins/module_utils/doctor/test_judge.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    StageResultError,
    check_document,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._systemctl import (
    parse_show,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_log import (
    LogInputError,
    check_log_text,
    parse_log,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    OWN_SERVICES,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    check_document as check_state,
)

STATE_DIR = "/etc/localinference"
# The saved results the doctor reads on every node (missing ones are skipped).
STAGE_FILES = ("preflight", "fabric", "plan", "weights", "qualify", "ingress", "client")
DEFAULT_FILES = {
    **{stage: f"{STATE_DIR}/{stage}.json" for stage in STAGE_FILES},
    "serving": f"{STATE_DIR}/serving.json",
    "observations": "/var/lib/localinference/observations.json",
}
SERVER_UNIT = "localinference-vllm.service"
UNITS = tuple(sorted(OWN_SERVICES))
UNIT_DIRS = ("/etc/containers/systemd", "/etc/systemd/system")
# systemctl show -p ... (the order systemd prints them in does not matter).
PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "Restart",
    "NRestarts",
    "ExecMainStatus",
    "ExecMainCode",
    "ExecMainStartTimestamp",
    "InvocationID",
)
# Properties a judgement needs; a unit whose `systemctl show` lacks one cannot be judged.
REQUIRED_PROPERTIES = ("LoadState", "ActiveState", "Result", "NRestarts", "ExecMainStatus")
MAX_EVIDENCE_LINE = 300


def problem(host: str, where: str, what: str, fix: str, severity: str = "error") -> dict[str, str]:
    """One thing the doctor could not read or trust (reported as id ``evidence``).

    ``error`` when a stage or the rollout would fail on it too (a malformed saved
    result), ``warning`` when only the doctor's view is partial (a log it could not read).
    """
    return {"host": host, "where": where, "message": what, "fix": fix, "severity": severity}


def clip(text: Any, limit: int = MAX_EVIDENCE_LINE) -> str:
    """One printable line of at most ``limit`` characters."""
    line = " ".join(str(text).split())
    line = "".join(c if c.isprintable() else "?" for c in line)
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class Unit:
    name: str
    properties: dict[str, str]

    def get(self, key: str) -> str:
        return self.properties.get(key, "")

    def number(self, key: str) -> int | None:
        try:
            return validate.counter(key, self.get(key))
        except validate.ValidationError:
            return None

    def line(self) -> str:
        shown = ("ActiveState", "SubState", "Result", "ExecMainStatus", "NRestarts", "Restart")
        pairs = " ".join(f"{k}={self.get(k)}" for k in shown if k in self.properties)
        return f"systemctl show {self.name}: {pairs}"


@dataclass
class NodeEvidence:
    """One node's checked evidence: only what passed its schema is here."""

    host: str
    reached: bool = True
    saved: dict[str, dict[str, Any]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    serving: dict[str, Any] | None = None
    units: dict[str, Unit] = field(default_factory=dict)
    journal_unit: str | None = None
    journal_text: str = ""
    # The whole boot since the unit's start is in journal_text (not only its newest lines).
    journal_complete: bool = False
    log: dict[str, Any] | None = None
    state: dict[str, Any] | None = None
    state_error: str | None = None
    # Live reads beside the saved results (None: not gathered on this run).
    links: dict[str, dict[str, Any]] | None = None
    shm: dict[str, Any] | None = None
    quadlet: dict[str, Any] | None = None


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _file(host: str, name: str, entry: Any, problems: list[dict[str, str]]) -> str | None:
    """The text of one gathered file, or None (missing, or a problem already recorded)."""
    if entry is None:
        return None
    if not isinstance(entry, dict):
        problems.append(
            problem(
                host,
                name,
                f"the gathered entry is {_kind(entry)}, not a file record",
                "run the doctor with the collection's doctor_facts module",
            )
        )
        return None
    path = str(entry.get("path") or name)
    if entry.get("error"):
        problems.append(
            problem(
                host,
                path,
                f"cannot be read: {clip(entry['error'])}",
                "check the file's type and permissions (root reads it)",
            )
        )
        return None
    text = entry.get("text")
    if text is None:
        return None
    if not isinstance(text, str):
        problems.append(
            problem(
                host,
                path,
                f"content is {_kind(text)}, not text",
                "run the doctor with the collection's doctor_facts module",
            )
        )
        return None
    return text


def _saved(host: str, name: str, path: str, text: str, problems: list[dict[str, str]]):
    try:
        return check_document(text, name, f"{host}:{path}")["result"]
    except StageResultError as exc:
        problems.append(
            problem(
                host,
                path,
                str(exc).split("; re-run")[0],
                f"re-run the {name} stage (--tags {name}) to write it again",
            )
        )
        return None


def _serving(host: str, path: str, text: str, problems: list[dict[str, str]]):
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        problems.append(
            problem(
                host,
                path,
                f"not valid JSON ({clip(exc, 120)})",
                "run the rollout (--tags rollout): it rewrites serving.json",
            )
        )
        return None
    trusted, found = check_state(document, UNIT_DIRS, "serving.json")
    if found:
        problems.append(
            problem(
                host,
                path,
                "; ".join(found[:3]),
                "run the rollout (--tags rollout): it rewrites serving.json",
            )
        )
    return trusted if trusted["recipe_hash"] and trusted["recipe"] is not None else None


def _observations(host: str, path: str, text: str, problems: list[dict[str, str]]) -> None:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        document = exc
    if not isinstance(document, list) or not all(isinstance(o, dict) for o in document):
        problems.append(
            problem(
                host,
                path,
                "is not a JSON list of observations: the plan cannot read the boots",
                "move it away and roll out again (the next good boot writes a new one)",
            )
        )


def _units(host: str, raw: Any, problems: list[dict[str, str]]) -> dict[str, Unit]:
    units: dict[str, Unit] = {}
    if raw is None:
        return units
    if not isinstance(raw, dict):
        problems.append(
            problem(
                host,
                "systemctl show",
                f"gathered {_kind(raw)}, not units",
                "run the doctor with the collection's doctor_facts module",
            )
        )
        return units
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            problems.append(
                problem(
                    host,
                    f"systemctl show {name}",
                    "no record",
                    "run the doctor with the collection's doctor_facts module",
                )
            )
            continue
        if entry.get("error"):
            problems.append(
                problem(
                    host,
                    f"systemctl show {name}",
                    clip(entry["error"]),
                    "check systemd on the node (systemctl status)",
                    "warning",
                )
            )
            continue
        properties = parse_show(entry.get("stdout"))
        missing = [p for p in REQUIRED_PROPERTIES if p not in properties]
        if missing:
            problems.append(
                problem(
                    host,
                    f"systemctl show {name}",
                    f"lacks {', '.join(missing)} (got {clip(entry.get('stdout'), 120)!r})",
                    "check systemd on the node (systemctl show works as root)",
                    "warning",
                )
            )
            continue
        units[str(name)] = Unit(str(name), properties)
    return units


def _journal(host: str, raw: Any, node: NodeEvidence, problems: list[dict[str, str]]) -> None:
    if raw is None:
        return
    if not isinstance(raw, dict):
        problems.append(
            problem(
                host,
                "journalctl",
                f"gathered {_kind(raw)}, not a log",
                "run the doctor with the collection's doctor_facts module",
            )
        )
        return
    unit = str(raw.get("unit") or SERVER_UNIT)
    where = f"journalctl -u {unit}"
    if raw.get("error"):
        problems.append(
            problem(
                host,
                where,
                clip(raw["error"]),
                "read the log by hand: journalctl -u " + unit + " -n 200",
                "warning",
            )
        )
        return
    text = raw.get("text")
    if not isinstance(text, str):
        problems.append(
            problem(
                host,
                where,
                f"log is {_kind(text)}, not text",
                "run the doctor with the collection's doctor_facts module",
            )
        )
        return
    node.journal_unit = unit
    node.journal_text = text
    node.journal_complete = bool(raw.get("since")) and raw.get("truncated") is False
    if not text.strip() or text.strip() == "-- No entries --":
        return
    try:
        check_log_text(text, where)
        node.log = parse_log(text)
    except (LogInputError, ValueError, RecursionError) as exc:
        problems.append(
            problem(
                host,
                where,
                f"cannot be parsed: {clip(exc, 200)}",
                "read the log by hand: journalctl -u " + unit + " -n 200",
                "warning",
            )
        )


def _state(host: str, raw: Any, node: NodeEvidence, problems: list[dict[str, str]]) -> None:
    """The picked ``serving_state state=verified`` result (or why it did not run)."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        problems.append(
            problem(
                host,
                "serving_state",
                f"gathered {_kind(raw)}, not a result",
                "run the doctor playbook of the collection",
            )
        )
        return
    if raw.get("skipped_reason"):
        node.state_error = clip(raw["skipped_reason"], 400)
        return
    if not isinstance(raw.get("differences"), list):
        # serving_state refused before comparing (an invalid recipe or node): its message says why.
        node.state_error = clip(raw.get("msg") or "serving_state returned no comparison", 400)
        return
    lists = ("differences", "live_findings", "problems")
    if not all(isinstance(raw.get(k, []), list) for k in lists):
        problems.append(
            problem(
                host,
                "serving_state",
                "returned differences that are not lists",
                "run the doctor playbook of the collection",
            )
        )
        return
    node.state = raw


def _links(host: str, raw: Any, node: NodeEvidence, problems: list[dict[str, str]]) -> None:
    """doctor_facts' ``links``: per interface its MTU (an int, or None) and operstate."""
    if raw is None:
        return
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        problems.append(
            problem(
                host,
                "/sys/class/net",
                f"gathered {_kind(raw)}, not links",
                "run the doctor with the collection's doctor_facts module",
                "warning",
            )
        )
        return
    node.links = {}
    for name, entry in raw.items():
        mtu = entry.get("mtu")
        node.links[str(name)] = {
            "mtu": int(mtu) if isinstance(mtu, str) and mtu.isdigit() else None,
            "operstate": entry.get("operstate")
            if isinstance(entry.get("operstate"), str)
            else None,
            "error": clip(entry["error"]) if entry.get("error") else None,
        }


def _entries(value: Any) -> list[dict[str, Any]] | None:
    """A list of dicts, or None when it is anything else."""
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return value
    return None


def _shm(host: str, raw: Any, node: NodeEvidence, problems: list[dict[str, str]]) -> None:
    """The kept keys of ``shm_offload state=status`` (offload files in /dev/shm, F13)."""
    if raw is None:
        return
    lists = {k: _entries(raw.get(k, [])) if isinstance(raw, dict) else None for k in
             ("live", "orphans", "unproven", "skipped")}  # fmt: skip
    refusals = raw.get("refusals", []) if isinstance(raw, dict) else None
    if any(v is None for v in lists.values()) or not isinstance(refusals, list):
        problems.append(
            problem(
                host,
                "shm_offload",
                f"returned {clip(raw, 120)}, not a survey of /dev/shm",
                "run the doctor playbook of the collection",
                "warning",
            )
        )
        return
    if raw.get("failed") and not any(lists.values()) and not refusals:
        problems.append(
            problem(
                host,
                "shm_offload",
                f"could not survey /dev/shm: {clip(raw.get('msg') or 'no reason given', 300)}",
                "read it by hand: ls -l /dev/shm; ansible -m localinference.vllm.shm_offload",
                "warning",
            )
        )
        return
    node.shm = {**lists, "refusals": [clip(r) for r in refusals], "proven": bool(raw.get("proven"))}


def _quadlet(host: str, raw: Any, node: NodeEvidence, problems: list[dict[str, str]]) -> None:
    """The kept keys of ``quadlet_verify`` on the live unit directory (F14, F17)."""
    if raw is None:
        return
    findings = _entries(raw.get("findings", [])) if isinstance(raw, dict) else None
    services = raw.get("services") or {} if isinstance(raw, dict) else None
    if findings is None or not isinstance(services, dict):
        problems.append(
            problem(
                host,
                "quadlet_verify",
                f"returned {clip(raw, 120)}, not the generator's verdict",
                "run the doctor playbook of the collection",
                "warning",
            )
        )
        return
    if raw.get("failed") and not findings:
        problems.append(
            problem(
                host,
                "quadlet -dryrun",
                f"the live units could not be checked: {clip(raw.get('msg') or 'no reason', 300)}",
                "run --tags verify on this node: it checks the units with the generator too",
                "warning",
            )
        )
        return
    argv = {
        str(name): [str(a) for a in (entry.get("exec_start") or [])]
        for name, entry in services.items()
        if isinstance(entry, dict) and isinstance(entry.get("exec_start"), list)
    }
    node.quadlet = {"findings": findings, "exec_start": argv}


def check_node(host: str, raw: Any) -> tuple[NodeEvidence, list[dict[str, str]]]:
    """One node's raw evidence (see the doctor playbook) as checked values plus problems."""
    problems: list[dict[str, str]] = []
    node = NodeEvidence(host)
    if not isinstance(raw, dict):
        node.reached = False
        return node, problems
    if raw.get("unreachable"):
        node.reached = False
        node.state_error = clip(raw.get("gather_error") or "unreachable", 400)
        return node, problems
    gathered = raw.get("gathered")
    if gathered is None:
        problems.append(
            problem(
                host,
                "doctor_facts",
                f"read nothing on the node: {clip(raw.get('gather_error') or 'no evidence', 300)}",
                "fix the error named (python3 on the node, root) and run the doctor again",
            )
        )
        return node, problems
    if not isinstance(gathered, dict):
        problems.append(
            problem(
                host,
                "doctor_facts",
                f"gathered {_kind(gathered)}",
                "run the doctor with the collection's doctor_facts module",
            )
        )
        gathered = {}
    files = gathered.get("files") or {}
    if not isinstance(files, dict):
        problems.append(
            problem(
                host,
                "files",
                f"gathered {_kind(files)}, not files",
                "run the doctor with the collection's doctor_facts module",
            )
        )
        files = {}
    for name, entry in files.items():
        text = _file(host, name, entry, problems)
        if text is None:
            continue
        path = str(entry.get("path") or name)
        node.paths[name] = path
        if name in STAGE_FILES:
            result = _saved(host, name, path, text, problems)
            if result is not None:
                node.saved[name] = result
        elif name == "serving":
            node.serving = _serving(host, path, text, problems)
        elif name == "observations":
            _observations(host, path, text, problems)
    node.units = _units(host, gathered.get("units"), problems)
    _journal(host, gathered.get("journal"), node, problems)
    _links(host, gathered.get("links"), node, problems)
    _state(host, raw.get("state"), node, problems)
    _shm(host, raw.get("shm"), node, problems)
    _quadlet(host, raw.get("quadlet"), node, problems)
    return node, problems


def first_line(text: str, *needles: str) -> str | None:
    """The first line of ``text`` that contains one of ``needles``, as one printable line.

    A long line is cut around the needle, so the words that prove the finding stay in view.
    """
    for raw in text.splitlines():
        if not any(n in raw for n in needles):
            continue
        line = clip(raw, 100_000)
        index = min((line.find(n) for n in needles if n in line), default=0)
        if len(line) <= MAX_EVIDENCE_LINE or index < MAX_EVIDENCE_LINE // 2:
            return clip(line)
        return clip("..." + line[index - MAX_EVIDENCE_LINE // 3 :])
    return None
