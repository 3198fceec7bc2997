# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One streamed first token, and ``/health``, with a hard deadline and the standard library only.

A wedged engine accepts the request and never sends a byte; a socket timeout alone would
reset on every keep-alive comment. The request runs in a daemon thread and the caller waits
on a queue until its deadline, so nothing the server does can hold the caller longer.
The watchdog program (no Ansible on the node) and the doctor use this file; the reading of the
stream is ``_sse.SseReader``, the same as ``serving_ready``'s.
"""

from __future__ import annotations

import http.client
import json
import queue
import ssl
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from ansible_collections.localinference.vllm.plugins.module_utils.engine._sse import (
    SseError,
    SseReader,
)

NET_ERRORS = (OSError, ValueError, http.client.HTTPException)


def chat_body(model: str, max_tokens: int = 1) -> bytes:
    return json.dumps({
        "model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": "Say OK."}],
    }).encode("utf-8")


def _connection(url: str, timeout: float, ca_file: str | None = None) -> tuple[http.client.HTTPConnection, str]:
    """A connection to ``url``'s host (http or https) and the request target (path and query).

    https verifies the server against ``ca_file`` (the ingress's CA) when given, else the
    system's trust store."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url[:80]!r} is not an http(s) URL")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=ca_file or None)
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout, context=context), target
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout), target


def _stream(url: str, body: bytes, key: str | None, timeout: float, events: queue.Queue,
            ca_file: str | None = None) -> None:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    reader = SseReader()
    try:
        conn, target = _connection(url, timeout, ca_file)
        try:
            conn.request("POST", target, body=body, headers=headers)
            response = conn.getresponse()
            if response.status != 200:
                events.put(("error", f"HTTP {response.status}"))
                return
            while True:
                chunk = response.read1(65536)
                if not chunk:
                    events.put(("error", f"the stream ended: {reader.summary()}"))
                    return
                if reader.feed(chunk):
                    events.put(("token", time.monotonic()))
                    return
        finally:
            conn.close()
    except (SseError, *NET_ERRORS) as exc:
        events.put(("refused", str(exc)[:200]))
    except Exception as exc:  # a dead thread must never look like a slow server
        events.put(("error", f"{type(exc).__name__}: {exc}"[:200]))


def first_token(base_url: str, model: str, key: str | None, deadline_s: float,
                ca_file: str | None = None) -> dict[str, Any]:
    """``{ok, ttft_s, error, timeout, deadline_s}`` for one streamed chat completion."""
    events: queue.Queue = queue.Queue()
    started = time.monotonic()
    url = base_url.rstrip("/") + "/chat/completions"
    # The socket outlives the wait by a second: the wait, not the socket, says "no token in time".
    thread = threading.Thread(target=_stream, args=(url, chat_body(model), key, deadline_s + 1.0, events, ca_file),
                              daemon=True)
    thread.start()
    try:
        kind, value = events.get(timeout=deadline_s)
    except queue.Empty:
        return {"ok": False, "ttft_s": None, "timeout": True, "deadline_s": deadline_s,
                "error": f"no token within {deadline_s:g} s"}
    if kind == "token":
        return {"ok": True, "ttft_s": round(value - started, 3), "timeout": False,
                "deadline_s": deadline_s, "error": None}
    if time.monotonic() - started >= deadline_s:  # the socket gave up as the wait did
        return {"ok": False, "ttft_s": None, "timeout": True, "deadline_s": deadline_s,
                "error": f"no token within {deadline_s:g} s"}
    return {"ok": False, "ttft_s": None, "timeout": False, "deadline_s": deadline_s,
            "refused": kind == "refused", "error": value}


def get(url: str, timeout: float, ca_file: str | None = None) -> tuple[int | None, bytes]:
    """GET with a deadline: (status or None when nothing answered, at most 4 MiB of body)."""
    events: queue.Queue = queue.Queue()

    def fetch() -> None:
        try:
            conn, target = _connection(url, timeout, ca_file)
            try:
                conn.request("GET", target)
                response = conn.getresponse()
                events.put((response.status, response.read(4 * 1024 * 1024)))
            finally:
                conn.close()
        except Exception as exc:
            events.put((None, str(exc).encode()[:200]))

    threading.Thread(target=fetch, daemon=True).start()
    try:
        return events.get(timeout=timeout)
    except queue.Empty:
        return None, f"no answer within {timeout:g} s".encode()
