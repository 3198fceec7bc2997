#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: doctor_facts
short_description: Gather what the doctor judges on one node - saved results, unit states, the last boot log
version_added: 0.2.0
description:
  - Reads the files in O(files) (the saved stage results, C(serving.json), the observation file),
    C(systemctl show) of each unit in O(units), and the newest O(journal_lines) lines of
    O(journal_unit)'s journal since that unit's last start (its C(ExecMainStartTimestamp)).
  - Returns everything as raw text under C(ansible_facts.doctor_evidence); nothing is parsed or
    trusted here. The doctor's judge (C(localinference.vllm.doctor_findings)) schema-checks it.
  - With O(links), the MTU and operational state of every network interface (C(/sys/class/net)), so
    the judge can compare the cluster link with what the fabric stage set (F19).
  - A file that is missing is reported as not found; one that cannot be read (a directory, a
    FIFO, larger than O(max_bytes), not UTF-8) carries an C(error). A command that fails or does
    not finish within O(timeout) seconds carries an C(error) too. The module itself fails only on
    bad options.
  - With O(token_probes) (the doctor gives them to the head only), one streamed chat
    completion (C(stream), C(max_tokens=1)) per target in order, each after one C(/health)
    GET, until a target streams a token - through the ingress with the key read from
    O(key_path) on the node (never returned, never logged), then directly at the engine.
    Each waits at most O(token_deadline) seconds (C(_token_probe), the watchdog's probe).
  - With O(incidents), the last O(incidents_limit) incidents of the watchdog's log, each line
    schema-checked (C(_incidents.read_recent)); a missing file means none.
  - Changes nothing on the node.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.FACTS
options:
  files:
    description:
      - Files to read, by name (for example C(plan) -> C(/etc/localinference/plan.json)). Each must
        be an absolute path.
    type: dict
    default: {}
  units:
    description: systemd units whose state to read with C(systemctl show).
    type: list
    elements: str
    default: []
  journal_unit:
    description: The unit whose last boot log to read; omitted means no log.
    type: str
  links:
    description:
      - Read C(mtu) and C(operstate) of every interface in C(/sys/class/net) (at most 512).
    type: bool
    default: false
  journal_lines:
    description: Read at most this many of the newest lines of that boot.
    type: int
    default: 400
  timeout:
    description: Seconds each command (C(systemctl), C(journalctl)) may take before it is killed.
    type: float
    default: 10
  max_bytes:
    description: Largest file read, and largest log kept (its newest part).
    type: int
    default: 4194304
  token_probes:
    description:
      - Where to stream one token, in order; the first that streams ends the probe. The
        doctor's filter C(localinference.vllm.doctor_token_targets) builds them from the head's
        C(ingress.json) and C(serving.json).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: What is probed.
        type: str
        required: true
        choices: [ingress, engine]
      base_url:
        description: The OpenAI base URL (C(http://127.0.0.1:8080/<model>/v1)).
        type: str
        required: true
      health_url:
        description: The C(/health) URL asked once before the stream.
        type: str
        required: true
      model:
        description: The served model name.
        type: str
        required: true
      auth:
        description: Send the key of O(key_path) (the ingress); C(false) for the engine.
        type: bool
        default: false
      ca_file:
        description:
          - The CA file on the node an C(https) target's certificate chains to (the ingress's, from
            its saved result); empty or null with plain HTTP.
        type: str
  key_path:
    description:
      - The ingress's key file on the node (one C(LOCALINFERENCE_INGRESS_API_KEY=<key>) line),
        read only when a target of O(token_probes) has C(auth).
    type: path
    default: /etc/localinference/ingress/api-key.env
  token_deadline:
    description:
      - Seconds each target may take to stream its first token (the playbook's
        C(doctor_token_deadline)); C(/health) gets at most 5 of them.
    type: float
    default: 20
  incidents:
    description: The watchdog's incident log to read (omitted means none).
    type: path
  incidents_limit:
    description: How many of the newest incidents to return (the playbook's C(doctor_incidents)).
    type: int
    default: 5
notes:
  - Commands run with C(LC_ALL=C).
"""

EXAMPLES = r"""
- name: Gather the doctor's evidence
  localinference.vllm.doctor_facts:
    files:
      plan: /etc/localinference/plan.json
      serving: /etc/localinference/serving.json
    units: [localinference-vllm.service]
    journal_unit: localinference-vllm.service

- name: Stream one token through the ingress, else at the engine; read the last incidents
  localinference.vllm.doctor_facts:
    token_probes:
      - name: ingress
        base_url: http://127.0.0.1:8080/localinference/tiny-deepseek/v1
        health_url: http://127.0.0.1:8080/localinference/tiny-deepseek/health
        model: localinference/tiny-deepseek
        auth: true
      - name: engine
        base_url: http://127.0.0.1:8000/v1
        health_url: http://127.0.0.1:8000/health
        model: localinference/tiny-deepseek
    token_deadline: 20
    incidents: /var/lib/localinference/incidents.jsonl
  no_log: true
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    doctor_evidence:
      description: What was read, as raw text.
      returned: always
      type: dict
      contains:
        files:
          description: Per name C(path), C(found), C(text) (or null) and C(error) (or null).
          returned: always
          type: dict
        units:
          description: Per unit C(stdout) of C(systemctl show -p ...) and C(error) (or null).
          returned: always
          type: dict
        journal:
          description:
            - C(unit), C(since) (null without a start time), C(text), C(error) and C(truncated) (the
              boot has more lines than O(journal_lines), so its first lines are not in C(text)).
            - Null without O(journal_unit).
          returned: always
          type: dict
        links:
          description:
            - Per interface name C(mtu) and C(operstate) as read (text, or null) and C(error) (or
              null). Null without O(links).
          returned: always
          type: dict
        token:
          description:
            - C(deadline_s), C(key_path), C(key_error) (or null) and C(probes), one per
              target tried - C(name), C(url), C(model), C(health_url),
              C(health_status) (or null), C(health_error), C(ok), C(ttft_s), C(timeout), C(error),
              C(waited_s). Null without O(token_probes).
          returned: always
          type: dict
        incidents:
          description:
            - C(path), C(exists), C(incidents) (the newest last) and C(problems) (lines that
              are not incidents). Null without O(incidents).
          returned: always
          type: dict
"""

import os
import stat
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    run_facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
    unit_name,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._evidence import (
    PROPERTIES,
    parse_show,
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
                with open(path, encoding="ascii", errors="replace") as handle:
                    entry[key] = handle.read(64).strip()
            except OSError as exc:
                entry[key] = None
                entry["error"] = entry["error"] or f"{path}: {exc.strerror}"
        links[name] = entry
    return links


def _show(module: AnsibleModule, runner: Runner, unit: str) -> dict[str, Any]:
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


def _journal(module: AnsibleModule, runner: Runner, unit: str, since: str | None) -> dict[str, Any]:
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


def _read_key(module: AnsibleModule, path: str) -> str:
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


def _token(module: AnsibleModule) -> dict[str, Any]:
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
            key = _read_key(module, params["key_path"])
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


ARGUMENT_SPEC: dict[str, Any] = {
    "files": {"type": "dict", "default": {}},
    "units": {"type": "list", "elements": "str", "default": []},
    "journal_unit": {"type": "str"},
    "links": {"type": "bool", "default": False},
    "journal_lines": {"type": "int", "default": 400},
    "timeout": {"type": "float", "default": 10.0},
    "max_bytes": {"type": "int", "default": 4 * 1024 * 1024},
    # Where to stream a token, not a secret (the key is read from key_path on the node).
    "token_probes": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "no_log": False,
        "options": {
            "name": {"type": "str", "required": True, "choices": ["ingress", "engine"]},
            "base_url": {"type": "str", "required": True},
            "health_url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "auth": {"type": "bool", "default": False},
            "ca_file": {"type": "str"},
        },
    },
    "key_path": {"type": "path", "default": "/etc/localinference/ingress/api-key.env"},
    "token_deadline": {"type": "float", "default": 20.0, "no_log": False},
    "incidents": {"type": "path"},
    "incidents_limit": {"type": "int", "default": 5},
}


def _checked_params(module: AnsibleModule) -> tuple[dict[str, str], list[str], str | None]:
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


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_facts(module, "doctor_evidence", lambda runner: _evidence(module, runner))


def _evidence(module: AnsibleModule, runner: Runner) -> dict[str, Any]:
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


if __name__ == "__main__":
    main()
