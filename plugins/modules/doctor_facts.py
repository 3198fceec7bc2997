#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: doctor_facts
short_description: Gather what the doctor judges on one node - saved results, unit states, the last boot log
version_added: 0.3.0
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
"""

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils._commands import (
    CommandError,
    Runner,
    timeout_error,
)
from ansible_collections.localinference.vllm.plugins.module_utils._doctor_evidence import (
    PROPERTIES,
    parse_show,
)
from ansible_collections.localinference.vllm.plugins.module_utils._state import (
    StateFileError,
    read_text,
)
from ansible_collections.localinference.vllm.plugins.module_utils._validate import (
    ValidationError,
    unit_name,
)

MAX_JOURNAL_LINES = 100_000
SYS_CLASS_NET = "/sys/class/net"
MAX_LINKS = 512
LINK_FILES = ("mtu", "operstate")


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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "dict", "default": {}},
            "units": {"type": "list", "elements": "str", "default": []},
            "journal_unit": {"type": "str"},
            "links": {"type": "bool", "default": False},
            "journal_lines": {"type": "int", "default": 400},
            "timeout": {"type": "float", "default": 10.0},
            "max_bytes": {"type": "int", "default": 4 * 1024 * 1024},
        },
        supports_check_mode=True,
    )
    params = module.params
    problem = timeout_error(params["timeout"])
    if problem:
        module.fail_json(msg=problem)
    if not 1 <= params["journal_lines"] <= MAX_JOURNAL_LINES:
        module.fail_json(
            msg=f"journal_lines must be between 1 and {MAX_JOURNAL_LINES}, "
            f"got {params['journal_lines']}"
        )
    if params["max_bytes"] < 1:
        module.fail_json(msg=f"max_bytes must be positive, got {params['max_bytes']}")
    try:
        files = {
            str(name): _checked_path(str(name), value) for name, value in params["files"].items()
        }
        units = [unit_name("units", unit) for unit in params["units"]]
        journal_unit = params["journal_unit"] and unit_name("journal_unit", params["journal_unit"])
    except ValidationError as exc:
        module.fail_json(msg=str(exc))
    runner = Runner(params["timeout"])
    evidence: dict[str, Any] = {
        "files": {name: _file(path, params["max_bytes"]) for name, path in files.items()},
        "units": {unit: _show(module, runner, unit) for unit in units},
        "journal": None,
        "links": _links() if params["links"] else None,
    }
    if journal_unit:
        shown = evidence["units"].get(journal_unit) or _show(module, runner, journal_unit)
        since = parse_show(shown["stdout"]).get("ExecMainStartTimestamp") or None
        evidence["journal"] = _journal(module, runner, journal_unit, since)
    module.exit_json(changed=False, ansible_facts={"doctor_evidence": evidence})


if __name__ == "__main__":
    main()
