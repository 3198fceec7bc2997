#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: serving_ready
short_description: Wait until a vLLM endpoint streams its first token, or its unit fails
version_added: 0.2.0
description:
  - Polls C(/health) and, once it answers 200, sends one streamed chat completion and waits
    for the first generated token (C(content), C(reasoning) or C(reasoning_content) delta).
    Ready means that first token, not only C(/health).
  - The HTTP runs in a worker thread; the module itself only waits for it until O(timeout),
    so no server behaviour (silence, keep-alives, a byte at a time) can hold it longer.
  - While waiting, watches the systemd units of the server; a unit that fails, exits or is
    restarted by systemd ends the wait at once (for example F12, a context larger than the
    KV cache), so a rollout can roll back instead of waiting for the timeout.
extends_documentation_fragment:
  - localinference.vllm.attributes.INFO
options:
  url:
    description: Base URL of the server, without C(/v1).
    type: str
    default: http://127.0.0.1:8000
  model:
    description: The served model name to ask.
    type: str
    required: true
  units:
    description:
      - systemd units whose failure ends the wait.
      - A unit systemd does not know (C(LoadState=not-found), a misspelled name) fails the module
        at once instead of being watched by nobody.
    type: list
    elements: str
    default: []
  timeout:
    description:
      - Seconds to wait for the first token in total, a deadline for everything the module does
        (the C(/health) polls, the probe request and its stream, the C(systemctl show) calls).
      - A server that accepts the connection and keeps the stream alive (SSE comments or
        keep-alive bytes) without ever sending a token fails the probe at this deadline.
    type: int
    default: 600
  prompt:
    description: The probe message.
    type: str
    default: Say OK.
  api_key:
    description: Bearer token, when the server requires one.
    type: str
  ca_path:
    description:
      - The CA file an C(https) server's certificate chains to (the ingress's internal CA or the
        operator's), instead of the system's trust store.
    type: path
author:
  - localinference.vllm developers (@localinference)
"""

EXAMPLES = r"""
- name: Wait for a streamed first token from the head
  localinference.vllm.serving_ready:
    url: http://127.0.0.1:8000
    model: localinference/tiny-deepseek
    units: [localinference-vllm.service]
    timeout: 600
"""

RETURN = r"""
health_seconds:
  description: Seconds from the call until C(/health) answered 200.
  returned: success
  type: float
first_token_seconds:
  description: Seconds from the call until the first streamed token arrived.
  returned: success
  type: float
request_first_token_seconds:
  description: Seconds from sending the probe request to its first streamed token.
  returned: success
  type: float
first_token:
  description: The first delta (C(key) and C(text)).
  returned: success
  type: dict
unit_state:
  description: Last C(systemctl show) values of each watched unit.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.serve._ready_probe import run

ARGUMENT_SPEC = {
    "url": {"type": "str", "default": "http://127.0.0.1:8000"},
    "model": {"type": "str", "required": True},
    "units": {"type": "list", "elements": "str", "default": []},
    "timeout": {"type": "int", "default": 600},
    "prompt": {"type": "str", "default": "Say OK."},
    "api_key": {"type": "str", "no_log": True},
    "ca_path": {"type": "path"},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
