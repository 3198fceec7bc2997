#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: serving_ready
short_description: Wait until a vLLM endpoint streams its first token, or its unit fails
version_added: 0.1.0
description:
  - Polls C(/health) and, once it answers 200, sends one streamed chat completion and waits
    for the first generated token (C(content), C(reasoning) or C(reasoning_content) delta).
    Ready means that first token, not only C(/health).
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
    description: systemd units whose failure ends the wait.
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds to wait for the first token in total.
    type: int
    default: 600
  prompt:
    description: The probe message.
    type: str
    default: Say OK.
  api_key:
    description: Bearer token, when the server requires one.
    type: str
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

import json
import time
import urllib.error

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.localinference.vllm.plugins.module_utils._ready import (
    parse_show,
    sse_token,
    unit_failed,
)

SHOW = ["-p", "ActiveState", "-p", "SubState", "-p", "NRestarts", "-p", "Result", "-p", "LoadState"]


def _units(module, units):
    states = {}
    for unit in units:
        rc, out, _ = module.run_command(
            ["systemctl", "show", *SHOW, unit], environ_update={"LC_ALL": "C"}
        )
        states[unit] = parse_show(out) if rc == 0 else {}
    return states


def _headers(api_key):
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "default": "http://127.0.0.1:8000"},
            "model": {"type": "str", "required": True},
            "units": {"type": "list", "elements": "str", "default": []},
            "timeout": {"type": "int", "default": 600},
            "prompt": {"type": "str", "default": "Say OK."},
            "api_key": {"type": "str", "no_log": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    base = params["url"].rstrip("/")
    started = time.monotonic()
    deadline = started + params["timeout"]
    baseline = {u: int(s.get("NRestarts") or 0) for u, s in _units(module, params["units"]).items()}
    states = {}

    def check_units():
        nonlocal states
        states = _units(module, params["units"])
        for unit, show in states.items():
            why = unit_failed(show, baseline.get(unit, 0))
            if why:
                module.fail_json(msg=f"{unit}: {why} before the first token", unit_state=states)

    health = None
    while health is None:
        check_units()
        try:
            with open_url(f"{base}/health", timeout=5) as response:
                if response.status == 200:
                    health = time.monotonic() - started
                    break
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            module.fail_json(
                msg=f"{base}/health did not answer 200 within {params['timeout']} s",
                unit_state=states,
            )
        time.sleep(2)

    body = json.dumps(
        {
            "model": params["model"],
            "messages": [{"role": "user", "content": params["prompt"]}],
            "max_tokens": 8,
            "stream": True,
        }
    ).encode()
    sent = time.monotonic()
    try:
        with open_url(
            f"{base}/v1/chat/completions",
            data=body,
            headers=_headers(params["api_key"]),
            method="POST",
            timeout=max(5, deadline - time.monotonic()),
        ) as response:
            for raw in response:
                token = sse_token(raw.decode("utf-8", "replace"))
                if token:
                    now = time.monotonic()
                    module.exit_json(
                        changed=False,
                        health_seconds=round(health, 3),
                        first_token_seconds=round(now - started, 3),
                        request_first_token_seconds=round(now - sent, 3),
                        first_token=token,
                        unit_state=states,
                    )
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:500]
        module.fail_json(
            msg=f"the probe request failed with HTTP {exc.code}: {detail}", unit_state=states
        )
    except (urllib.error.URLError, OSError) as exc:
        check_units()
        module.fail_json(msg=f"the probe request failed: {exc}", unit_state=states)
    module.fail_json(msg="the stream ended without a generated token", unit_state=states)


if __name__ == "__main__":
    main()
