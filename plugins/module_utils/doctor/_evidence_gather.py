# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``doctor_facts``: the evidence the doctor reads on one node, gathered in one call.

Every read is bounded and none fails the module: a file (bounded, with its error), each
unit's ``systemctl show``, the journal of one unit since its start, the links' MTU and state,
one streamed token (the ingress with its key, then the engine), the watchdog's last
incidents. The doctor judges them later (``_evidence`` and ``_judge``); here they are
only read. :func:`evidence` is the module's ``gather`` for ``common._facts_module.run_facts``.

No AnsibleModule here: ``module`` is the caller's (``params``, ``get_bin_path``,
``no_log_values``, ``fail_json``).
"""

from __future__ import annotations

import os
import stat
import time
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._systemctl import (
    parse_show,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
    unit_name,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._evidence import (
    PROPERTIES,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._token_probe import (
    first_token,
    get,
)
from ansible_collections.localinference.vllm.plugins.module_utils.ingress._caddy import (
    key_from_env_file,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    StateFileError,
    read_text,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._incidents import (
    read_recent,
)

MAX_JOURNAL_LINES = 100_000
SYS_CLASS_NET = "/sys/class/net"
MAX_LINKS = 512
LINK_FILES = ("mtu", "operstate")
MAX_KEY_FILE = 4096
HEALTH_TIMEOUT = 5.0
MAX_TOKEN_DEADLINE = 600
MAX_INCIDENTS = 1000


def _checked_path(name: str, value: Any) -> str:
    """An absolute path of printable characters (only read, never written or rendered)."""
    if not isinstance(value, str) or not value.startswith("/") or not value.isprintable():
        raise ValidationError(
            f"files.{name}", f"{str(value)[:200]!r} is not an absolute path", "start it with /"
        )
    return value


def _file(path: str, max_bytes: int) -> dict[str, Any]:
    try:
        text = read_text(path, max_bytes)
    except StateFileError as exc:
        return {"path": path, "found": True, "text": None, "error": str(exc)}
    return {"path": path, "found": text is not None, "text": text, "error": None}


def _links() -> dict[str, dict[str, Any]]:
    """``mtu`` and ``operstate`` of each interface, as text (a vanished one carries an error)."""
    try:
        names = sorted(os.listdir(SYS_CLASS_NET))[:MAX_LINKS]
    except OSError as exc:
        return {"": {"mtu": None, "operstate": None, "error": f"{SYS_CLASS_NET}: {exc.strerror}"}}
    links: dict[str, dict[str, Any]] = {}
    for name in names:
        entry: dict[str, Any] = {"error": None}
        for key in LINK_FILES:
            path = os.path.join(SYS_CLASS_NET, name, key)
            try:
                entry[key] = _files.read_text(path, 64, errors="replace").strip()
            except OSError as exc:
                entry[key] = None
                entry["error"] = entry["error"] or f"{path}: {exc.strerror}"
        links[name] = entry
    return links


def _show(module: Any, runner: Runner, unit: str) -> dict[str, Any]:
    argv = [module.get_bin_path("systemctl", required=True), "show", "--no-pager"]
    argv += ["-p", ",".join(PROPERTIES), unit]
    try:
        rc, out, err = runner.run(argv, "systemd may be busy")
    except CommandError as exc:
        return {"stdout": "", "error": str(exc)}
    if rc != 0:
        return {
            "stdout": out,
            "error": f"systemctl show {unit} failed (rc={rc}): {err.strip()[:300]}",
        }
    return {"stdout": out, "error": None}


def _journal(module: Any, runner: Runner, unit: str, since: str | None) -> dict[str, Any]:
    params = module.params
    argv = [module.get_bin_path("journalctl", required=True), "-u", unit, "--no-pager"]
    argv += ["-o", "short", "-n", str(params["journal_lines"])]
    if since:
        argv += ["--since", since]
    record: dict[str, Any] = {
        "unit": unit,
        "since": since,
        "text": None,
        "error": None,
        "truncated": False,
    }
    try:
        rc, out, err = runner.run(argv, "the journal may be huge or journald busy")
    except CommandError as exc:
        record["error"] = str(exc)
        return record
    if rc != 0:
        record["error"] = f"journalctl -u {unit} failed (rc={rc}): {err.strip()[:300]}"
        return record
    record["text"] = out[-params["max_bytes"] :]
    # The newest lines only: the start of a long boot is cut (its start-up lines are not here).
    record["truncated"] = (
        out.count("\n") >= params["journal_lines"] or len(out) > params["max_bytes"]
    )
    return record


def _checked_url(where: str, value: str) -> str:
    if not value.startswith(("http://", "https://")) or not value.isprintable() or " " in value:
        raise ValidationError(
            where, f"{value[:200]!r} is not an http(s) URL", "use http://HOST:PORT/..."
        )
    return value


def read_key(module: Any, path: str) -> str:
    """The ingress key of ``path``, masked in everything Ansible logs from here on."""
    try:
        text = read_text(path, MAX_KEY_FILE)
    except StateFileError as exc:
        raise ValueError(f"{exc}: run the ingress stage (--tags ingress)") from None
    if text is None:
        raise ValueError(f"{path} does not exist: run the ingress stage (--tags ingress)")
    key = key_from_env_file(text, path)
    module.no_log_values.add(key)
    return key


def _probe(target: dict[str, Any], key: str | None, deadline: float) -> dict[str, Any]:
    """/health once, then one streamed token, each with its deadline."""
    status, body = get(target["health_url"], min(HEALTH_TIMEOUT, deadline), target.get("ca_file"))
    started = time.monotonic()
    answer = first_token(target["base_url"], target["model"], key, deadline, target.get("ca_file"))
    waited = time.monotonic() - started
    # The stream's socket times out after the same deadline as the wait for it, so a silent
    # stream may come back as the socket's "timed out" error instead of the wait's timeout:
    # either way no token came within the deadline.
    timed_out = bool(answer.get("timeout")) or (answer["ok"] is not True and waited >= deadline)
    return {
        "name": target["name"],
        "url": target["base_url"].rstrip("/") + "/chat/completions",
        "model": target["model"],
        "health_url": target["health_url"],
        "health_status": status,
        "health_error": None if status is not None else body.decode("utf-8", "replace")[:200],
        "ok": answer["ok"] is True,
        "ttft_s": answer.get("ttft_s"),
        "timeout": timed_out,
        "error": answer.get("error"),
        "waited_s": round(waited, 2),
    }


def _token(module: Any) -> dict[str, Any]:
    """Each target in order until one streams (the ingress with the key, then the engine)."""
    params = module.params
    targets = params["token_probes"]
    record: dict[str, Any] = {
        "deadline_s": params["token_deadline"],
        "key_path": params["key_path"],
        "key_error": None,
        "probes": [],
    }
    key = None
    if any(t["auth"] for t in targets):
        try:
            key = read_key(module, params["key_path"])
        except ValueError as exc:
            record["key_error"] = str(exc)
    for target in targets:
        if target["auth"] and key is None:
            continue
        probe = _probe(target, key if target["auth"] else None, params["token_deadline"])
        record["probes"].append(probe)
        if probe["ok"]:
            break
    return record


def _incident_log(path: str, limit: int) -> dict[str, Any]:
    """The last incidents of the watchdog's log (a FIFO or a directory is never opened)."""
    record: dict[str, Any] = {"path": path, "exists": True, "incidents": [], "problems": []}
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return {**record, "exists": False}
    except OSError as exc:
        return {**record, "problems": [f"{path}: {exc.strerror}"]}
    if not regular:
        return {**record, "problems": [f"{path} is not a regular file"]}
    return {"path": path, **read_recent(path, limit)}


def _checked_params(module: Any) -> tuple[dict[str, str], list[str], str | None]:
    """``(files, units, journal_unit)`` once every option is checked; a bad one ends the module."""
    params = module.params
    if not 1 <= params["journal_lines"] <= MAX_JOURNAL_LINES:
        module.fail_json(
            msg=f"journal_lines must be between 1 and {MAX_JOURNAL_LINES}, "
            f"got {params['journal_lines']}"
        )
    if params["max_bytes"] < 1:
        module.fail_json(msg=f"max_bytes must be positive, got {params['max_bytes']}")
    if not 0 < params["token_deadline"] <= MAX_TOKEN_DEADLINE:
        module.fail_json(
            msg=f"token_deadline (the doctor's doctor_token_deadline) must be above 0 and at most "
            f"{MAX_TOKEN_DEADLINE} seconds, got {params['token_deadline']}"
        )
    if not 0 <= params["incidents_limit"] <= MAX_INCIDENTS:
        module.fail_json(
            msg=f"incidents_limit (the doctor's doctor_incidents) must be between 0 and "
            f"{MAX_INCIDENTS}, got {params['incidents_limit']}"
        )
    try:
        files = {
            str(name): _checked_path(str(name), value) for name, value in params["files"].items()
        }
        units = [unit_name("units", unit) for unit in params["units"]]
        journal_unit = params["journal_unit"] and unit_name("journal_unit", params["journal_unit"])
        for index, target in enumerate(params["token_probes"]):
            for key in ("base_url", "health_url"):
                _checked_url(f"token_probes[{index}].{key}", target[key])
            if target.get("ca_file"):
                _checked_path(f"token_probes[{index}].ca_file", target["ca_file"])
    except ValidationError as exc:
        module.fail_json(msg=str(exc))
    return files, units, journal_unit


def evidence(module: Any, runner: Runner) -> dict[str, Any]:
    """The doctor's evidence of this node (``ansible_facts.doctor_evidence``); a bad option ends the module."""
    params = module.params
    files, units, journal_unit = _checked_params(module)
    evidence: dict[str, Any] = {
        "files": {name: _file(path, params["max_bytes"]) for name, path in files.items()},
        "units": {unit: _show(module, runner, unit) for unit in units},
        "journal": None,
        "links": _links() if params["links"] else None,
        "token": _token(module) if params["token_probes"] else None,
        "incidents": (
            _incident_log(params["incidents"], params["incidents_limit"])
            if params["incidents"]
            else None
        ),
    }
    if journal_unit:
        shown = evidence["units"].get(journal_unit) or _show(module, runner, journal_unit)
        since = parse_show(shown["stdout"]).get("ExecMainStartTimestamp") or None
        evidence["journal"] = _journal(module, runner, journal_unit, since)
    return evidence
