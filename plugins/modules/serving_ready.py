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

import http.client
import json
import queue
import threading
import time
import urllib.error
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
    unit_name,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._sse import (
    SseError,
    SseReader,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._ready import (
    parse_show,
    unit_failed,
)

SHOW = ["-p", "ActiveState", "-p", "SubState", "-p", "NRestarts", "-p", "Result", "-p", "LoadState"]
# How often the units are checked while the probe waits.
UNIT_POLL = 2.0
HEALTH_POLL = 2.0
SYSTEMCTL_TIMEOUT = 30.0
NET_ERRORS = (urllib.error.URLError, OSError, ValueError, http.client.HTTPException)


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _probe(
    base: str,
    body: bytes,
    api_key: str | None,
    deadline: float,
    events: queue.Queue,
    stop: threading.Event,
    ca_path: str | None = None,
) -> None:
    """Poll /health, then stream one completion; report each step on ``events``.

    Runs in a daemon thread: the module waits on ``events`` until its deadline
    and never on a socket, so a server that holds the stream open cannot hold it.
    """

    def remaining() -> float:
        return max(0.1, deadline - time.monotonic())

    try:
        while not stop.is_set():
            try:
                with open_url(f"{base}/health", timeout=min(5.0, remaining()), ca_path=ca_path) as response:
                    if response.status == 200:
                        events.put(("health", time.monotonic()))
                        break
            except NET_ERRORS:
                pass
            stop.wait(min(HEALTH_POLL, remaining()))
        if stop.is_set():
            return
        sent = time.monotonic()
        reader = SseReader()
        with open_url(
            f"{base}/v1/chat/completions",
            data=body,
            headers=_headers(api_key),
            method="POST",
            timeout=remaining(),
            ca_path=ca_path,
        ) as response:
            events.put(("sent", (sent, reader)))
            while not stop.is_set():
                chunk = response.read1(65536)
                if not chunk:
                    events.put(("ended", reader.summary()))
                    return
                token = reader.feed(chunk)
                if token:
                    events.put(("token", (token, sent, time.monotonic())))
                    return
    except urllib.error.HTTPError as exc:
        try:
            detail = exc.read(2000).decode("utf-8", "replace")[:500]
        except NET_ERRORS:
            detail = ""
        events.put(("http", f"HTTP {exc.code}: {detail}"))
    except SseError as exc:
        events.put(("error", str(exc)))
    except NET_ERRORS as exc:
        events.put(("error", str(exc)))
    except Exception as exc:  # a dead thread must never look like a slow server
        events.put(("error", f"{type(exc).__name__}: {exc}"))


def _check_params(module: AnsibleModule) -> None:
    params = module.params
    if not 0 < params["timeout"] <= 86400:
        module.fail_json(
            msg=f"timeout must be between 1 and 86400 seconds, got {params['timeout']}"
        )
    parts = urlsplit(params["url"])
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or any(not c.isprintable() or c.isspace() for c in params["url"])
    ):
        module.fail_json(
            msg=f"url must be http(s)://host:port without spaces, got {params['url'][:200]!r}"
        )
    try:
        for position, unit in enumerate(params["units"]):
            unit_name(f"units[{position}]", unit)
    except ValidationError as exc:
        module.fail_json(msg=str(exc))


ARGUMENT_SPEC = {
    "url": {"type": "str", "default": "http://127.0.0.1:8000"},
    "model": {"type": "str", "required": True},
    "units": {"type": "list", "elements": "str", "default": []},
    "timeout": {"type": "int", "default": 600},
    "prompt": {"type": "str", "default": "Say OK."},
    "api_key": {"type": "str", "no_log": True},
    "ca_path": {"type": "path"},
}


class _UnitWatch:
    """The units the probe waits on: a unit that fails or restarts ends the wait."""

    def __init__(self, module: AnsibleModule, deadline: float) -> None:
        self.module = module
        self.units = module.params["units"]
        self.deadline = deadline
        self.runner = Runner(SYSTEMCTL_TIMEOUT)
        self.systemctl = module.get_bin_path("systemctl") if self.units else None
        if self.units and not self.systemctl:
            module.fail_json(msg=f"units {self.units} given but systemctl is not on this host")
        self.states: dict[str, dict[str, str]] = {}
        self.baseline = {u: int(s.get("NRestarts") or 0) for u, s in self.read().items()}

    def read(self) -> dict[str, dict[str, str]]:
        found = {}
        for unit in self.units:
            limit = max(1.0, min(SYSTEMCTL_TIMEOUT, self.deadline - time.monotonic() + 5))
            try:
                rc, out, err = self.runner.run([self.systemctl, "show", *SHOW, unit], timeout=limit)
            except CommandError as exc:
                self.module.fail_json(msg=f"watching unit {unit}: {exc}", unit_state=self.states)
            found[unit] = parse_show(out) if rc == 0 else {}
            if rc != 0 or not found[unit].get("LoadState"):
                # A unit whose state cannot be read could never end the wait by failing.
                why = (
                    f"systemctl show failed (rc {rc}: {(err or out).strip()[:200]})"
                    if rc != 0
                    else "systemctl show gave no LoadState"
                )
                self.module.fail_json(
                    msg=f"units: cannot watch {unit}: {why}; check the unit name"
                    " ('systemctl list-units --all') and that systemd runs on this host",
                    unit_state=found,
                )
        return found

    def check(self) -> None:
        self.states = self.read()
        for unit, show in self.states.items():
            why = unit_failed(show, self.baseline.get(unit, 0))
            if why:
                self.module.fail_json(
                    msg=f"{unit}: {why} before the first token", unit_state=self.states
                )


def _start_probe(params: dict, base: str, deadline: float) -> tuple[queue.Queue, threading.Event]:
    """The probe thread (health, then one streamed completion) and its events."""
    body = json.dumps(
        {
            "model": params["model"],
            "messages": [{"role": "user", "content": params["prompt"]}],
            "max_tokens": 8,
            "stream": True,
        }
    ).encode()
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    worker = threading.Thread(
        target=_probe,
        args=(base, body, params["api_key"], deadline, events, stop, params["ca_path"]),
        name="serving_ready-probe",
        daemon=True,
    )
    worker.start()
    return events, stop


def _wait(module, events, watch, started, deadline):
    """Wait for the first token until ``deadline``; returns ``(health, reader)`` if none came."""
    health: float | None = None
    reader: SseReader | None = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return health, reader
        try:
            kind, payload = events.get(timeout=min(UNIT_POLL, left))
        except queue.Empty:
            watch.check()
            continue
        if kind == "health":
            health = payload - started
        elif kind == "sent":
            reader = payload[1]
        elif kind == "token":
            token, sent, now = payload
            module.exit_json(
                changed=False,
                health_seconds=round(health or 0.0, 3),
                first_token_seconds=round(now - started, 3),
                request_first_token_seconds=round(now - sent, 3),
                first_token=token,
                unit_state=watch.states,
            )
        elif kind == "http":
            module.fail_json(msg=f"the probe request failed with {payload}", unit_state=watch.states)
        elif kind == "error":
            watch.check()
            module.fail_json(msg=f"the probe request failed: {payload}", unit_state=watch.states)
        else:
            module.fail_json(
                msg=f"the stream ended without a generated token ({payload})",
                unit_state=watch.states,
            )


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    _check_params(module)
    params = module.params
    base = params["url"].rstrip("/")
    started = time.monotonic()
    deadline = started + params["timeout"]
    watch = _UnitWatch(module, deadline)
    watch.check()
    events, stop = _start_probe(params, base, deadline)
    try:
        health, reader = _wait(module, events, watch, started, deadline)
    finally:
        stop.set()
    if health is None:
        module.fail_json(
            msg=f"{base}/health did not answer 200 within {params['timeout']} s",
            unit_state=watch.states,
        )
    what = reader.summary() if reader else "no response to the request"
    module.fail_json(
        msg=f"no generated token from {base}/v1/chat/completions within {params['timeout']} s"
        f" (/health answered after {health:.1f} s; the stream sent {what}): the server accepts"
        " requests but does not generate; check the engine log (vllm_log_facts)",
        unit_state=watch.states,
    )


if __name__ == "__main__":
    main()
