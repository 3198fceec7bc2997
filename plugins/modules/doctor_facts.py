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

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    run_facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._evidence_gather import (
    evidence,
)

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


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_facts(module, "doctor_evidence", lambda runner: evidence(module, runner))


if __name__ == "__main__":
    main()
