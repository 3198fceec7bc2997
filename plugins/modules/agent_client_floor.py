#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: agent_client_floor
short_description: Measure each coding agent's prompt floor with its real first request
version_added: 0.3.0
description:
  - For each client of O(clients) (Claude Code, Codex, Qwen Code, Crush) whose program is
    installed, runs it once with its config rendered into a scratch directory and pointed at
    a recorder on the loopback, keeps the first request it sends, and sends that request to
    O(base_url) for a one-token answer. The server's count of its prompt is the client's
    prompt floor, the tokens a first turn costs before any work.
  - Every installed client's version (C(--version)) is read first; a version outside the range
    the collection's rules cover fails the module before anything is measured, naming the
    client, its version and that range, unless O(allow_unknown_versions).
  - A client whose program is not found is reported in RV(skipped) (its budget is then checked
    without a floor); a program that runs but sends nothing, or a request the server refuses,
    fails the module with the client's name and output.
  - Writes nothing outside a scratch directory it removes; the same in check mode.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
options:
  clients:
    description: The clients to look at (C(claude_code), C(codex), C(qwen_code), C(crush)).
    type: list
    elements: str
    required: true
  measure:
    description: The clients of O(clients) to measure (the others only have their version checked); default all.
    type: list
    elements: str
  allow_unknown_versions:
    description: Report a client version outside the rules' range in RV(warnings_versions) instead of failing.
    type: bool
    default: false
  programs:
    description:
      - Client name to the path of its program. A client not named here is looked up on C(PATH)
        (C(claude), C(codex), C(qwen), C(crush)).
    type: dict
    default: {}
  plan:
    description: The budget the configs are rendered from (C(context), C(output), C(reserved) in tokens, as for the client configs).
    type: dict
    required: true
  model:
    description: The served model name.
    type: str
    required: true
  base_url:
    description: The OpenAI base URL of the endpoint, ending in C(/v1).
    type: str
    required: true
  api_key_env:
    description: The environment variable the configs read the key from.
    type: str
    required: true
  api_key:
    description: The key the endpoint wants (sent to O(base_url) only, never to the recorder).
    type: str
    default: ""
  reasoning_key:
    description: The reasoning field the server streams (C(reasoning), C(reasoning_content), C(none)).
    type: str
    default: reasoning
  ca_file:
    description: The CA that signed the endpoint's certificate, for an C(https) O(base_url).
    type: str
    default: ""
  timeout:
    description: Seconds each client may take to send its first request, and the server to answer it.
    type: int
    default: 120
"""

EXAMPLES = r"""
- name: Measure Claude Code's and Codex's first requests
  localinference.vllm.agent_client_floor:
    clients: [claude_code, codex]
    plan: {context: 65536, input: 64512, output: 1024, reserved: 1024}
    model: localinference/tiny-deepseek
    base_url: https://127.0.0.1:18080/localinference/tiny-deepseek/v1
    api_key_env: LOCALINFERENCE_API_KEY
    api_key: "{{ key }}"
    ca_file: /etc/localinference/ca.crt
  no_log: true
"""

RETURN = r"""
floors:
  description: Client name to its measured prompt floor in tokens.
  returned: always
  type: dict
measurements:
  description: Per measured client, C(client), C(program), C(version), C(prompt_floor) and C(request) (C(path), C(bytes), C(tools)).
  returned: always
  type: list
  elements: dict
versions:
  description: Client name to the version its program reports (installed clients only).
  returned: always
  type: dict
warnings_versions:
  description: With O(allow_unknown_versions), why each version outside the rules' range is not covered.
  returned: always
  type: list
  elements: str
skipped:
  description: Per client not measured because its program is not found, C(client) and C(why).
  returned: always
  type: list
  elements: dict
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.client._floor_run import run

ARGUMENT_SPEC: dict[str, Any] = {
    "clients": {"type": "list", "elements": "str", "required": True},
    "measure": {"type": "list", "elements": "str"},
    "allow_unknown_versions": {"type": "bool", "default": False},
    "programs": {"type": "dict", "default": {}},
    "plan": {"type": "dict", "required": True},
    "model": {"type": "str", "required": True},
    "base_url": {"type": "str", "required": True},
    "api_key_env": {"type": "str", "required": True, "no_log": False},
    "api_key": {"type": "str", "default": "", "no_log": True},
    "reasoning_key": {"type": "str", "default": "reasoning", "no_log": False},
    "ca_file": {"type": "str", "default": ""},
    "timeout": {"type": "int", "default": 120},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
