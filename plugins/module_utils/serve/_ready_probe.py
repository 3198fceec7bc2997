# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``serving_ready``: wait for the first generated token, watching the units that serve it.

A daemon thread polls ``/health``, then streams one completion (:func:`_probe`); the module
waits on its events until the deadline and never on a socket, so a server that holds the
stream open cannot hold the module. Meanwhile the units are read every ``UNIT_POLL`` seconds:
a unit that fails or restarts ends the wait at once (:class:`_UnitWatch`). The stream is
read by ``engine/_sse`` (``SseReader``), the units judged by ``_ready`` (``unit_failed``).

No AnsibleModule here: ``module`` is the caller's (``params``, ``get_bin_path``, ``fail_json``);
:func:`run` returns the result of a first token and fails the module otherwise.
"""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import urllib.error
from typing import Any
from urllib.parse import urlsplit

from ansible.module_utils.urls import open_url
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
from ansible_collections.localinference.vllm.plugins.module_utils.engine._sse import (
    SseError,
    SseReader,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._ready import (
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


def _check_params(module: Any) -> None:
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


class _UnitWatch:
    """The units the probe waits on: a unit that fails or restarts ends the wait."""

    def __init__(self, module: Any, deadline: float) -> None:
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


def _wait(
    module: Any, events: queue.Queue, watch: _UnitWatch, started: float, deadline: float
) -> tuple[dict[str, Any] | None, float | None, SseReader | None]:
    """Wait for the first token until ``deadline``: ``(result, health, reader)``, no result if none came."""
    health: float | None = None
    reader: SseReader | None = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, health, reader
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
            result = {
                "changed": False,
                "health_seconds": round(health or 0.0, 3),
                "first_token_seconds": round(now - started, 3),
                "request_first_token_seconds": round(now - sent, 3),
                "first_token": token,
                "unit_state": watch.states,
            }
            return result, health, reader
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


def run(module: Any) -> dict[str, Any]:
    """The module's result once the first token came; any other end fails the module."""
    _check_params(module)
    params = module.params
    base = params["url"].rstrip("/")
    started = time.monotonic()
    deadline = started + params["timeout"]
    watch = _UnitWatch(module, deadline)
    watch.check()
    events, stop = _start_probe(params, base, deadline)
    try:
        result, health, reader = _wait(module, events, watch, started, deadline)
    finally:
        stop.set()
    if result is not None:
        return result
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
