# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTTP for the qualification checks: the standard library only, a total deadline on every exchange.

Every request (and the whole of its response, a server-sent event stream
included) must finish within ``timeout`` seconds of being sent: each socket
read waits at most the time left, so a server that trickles bytes, stalls in
a prefill or never closes its stream costs ``timeout`` and no more. Failures
are :class:`HttpError` with a sentence naming the URL and the fix, never a
traceback; HTTP error statuses are results (a check may expect a 400).

No AnsibleModule here.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)

USER_AGENT = "localinference.vllm-qualify"
# Longest body kept for evidence; a stream's events are kept parsed.
MAX_BODY = 4 * 1024 * 1024


class HttpError(validate.Error):
    """The exchange did not complete (refused, unreachable, over the deadline, not HTTP)."""


@dataclass
class Response:
    """One finished exchange: status, body, and when things happened (seconds since sent)."""

    method: str
    url: str
    status: int
    body: bytes = b""
    seconds: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def error_message(self) -> str:
        """vLLM's (OpenAI-style or Anthropic-style) error message, else the start of the body."""
        doc = self.json()
        if isinstance(doc, dict):
            error = doc.get("error", doc)
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                return error["message"]
            if isinstance(doc.get("detail"), str):
                return doc["detail"]
            if isinstance(doc.get("message"), str):
                return doc["message"]
        return self.text[:500]


@dataclass
class Event:
    """One server-sent event of a stream: when it arrived and its JSON data."""

    t: float
    data: Any


@dataclass
class Stream:
    """A finished stream: status, its events (``data:`` JSON), whether ``[DONE]`` came."""

    method: str
    url: str
    status: int
    events: list[Event] = field(default_factory=list)
    done: bool = False
    seconds: float = 0.0
    body: bytes = b""  # an error status's body (no stream)
    unparsed: int = 0

    def error_message(self) -> str:
        return Response(self.method, self.url, self.status, self.body).error_message()


class _Watchdog:
    """Shuts the connection's socket down at the deadline, whatever a read is waiting for.

    Per-read socket timeouts alone do not bound an exchange: a server dripping
    a byte at a time keeps every single read short.
    """

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.fired = False
        self._conn = conn
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


class Client:
    """``base_url`` is an OpenAI base URL (``.../v1``); paths are relative to it."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        ca_file: str | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url.rstrip("/"))
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise HttpError(
                f"base_url {base_url!r} is not an http(s) URL: give the OpenAI base URL,"
                " for example http://HEAD:8080/<served name>/v1"
            )
        if not math.isfinite(timeout) or timeout <= 0:
            raise HttpError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
        self.base_url = base_url.rstrip("/")
        self._parsed = parsed
        self._api_key = api_key or None
        self.timeout = float(timeout)
        self._clock = clock
        # https: the CA the ingress's certificate chains to (its internal CA), else the system's.
        self._ca_file = ca_file or None

    def url(self, path: str) -> str:
        if "://" in path:
            return path
        return f"{self.base_url}/{path.lstrip('/')}"

    def _headers(self, extra: dict[str, str] | None, body: bytes | None) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept": "*/*"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        headers.update(extra or {})
        return headers

    def _open(
        self, method: str, url: str, body: bytes | None, headers: dict[str, str], deadline: float
    ):
        parsed = urllib.parse.urlsplit(url)
        left = deadline - self._clock()
        if left <= 0:
            raise HttpError(f"{method} {url}: no time left of the {self.timeout:g} s deadline")
        port = parsed.port
        if parsed.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parsed.hostname, port, timeout=left, context=ssl.create_default_context(cafile=self._ca_file)
            )
        else:
            conn = http.client.HTTPConnection(parsed.hostname, port, timeout=left)
        target = parsed.path or "/"
        if parsed.query:
            target += "?" + parsed.query
        try:
            conn.request(method, target, body=body, headers=headers)
            self._settimeout(conn, deadline)
            response = conn.getresponse()
        except BaseException as err:
            conn.close()
            raise self._failure(method, url, err) from None
        return conn, response

    def _settimeout(self, conn: http.client.HTTPConnection, deadline: float) -> None:
        left = deadline - self._clock()
        if left <= 0:
            raise TimeoutError("deadline")
        if conn.sock is not None:
            conn.sock.settimeout(left)

    def _failure(self, method: str, url: str, err: BaseException) -> HttpError:
        if isinstance(err, (TimeoutError, socket.timeout)):
            return HttpError(
                f"{method} {url} did not finish within the {self.timeout:g} s deadline;"
                " the server is slow or stalled (raise timeout for a long prefill)"
            )
        if isinstance(err, ConnectionRefusedError):
            return HttpError(f"{method} {url}: connection refused; is the ingress (or vLLM) up?")
        if isinstance(err, (OSError, http.client.HTTPException)):
            return HttpError(f"{method} {url} failed: {err.__class__.__name__}: {err}")
        if isinstance(err, KeyboardInterrupt):
            raise err
        return HttpError(f"{method} {url} failed: {err!r}")

    def request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """One exchange; the body is read to its end within the deadline."""
        url = self.url(path)
        body = json.dumps(payload).encode() if payload is not None else None
        start = self._clock()
        deadline = start + self.timeout
        conn, response = self._open(method, url, body, self._headers(headers, body), deadline)
        watchdog = _Watchdog(conn, deadline - self._clock())
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                self._settimeout(conn, deadline)
                chunk = response.read1(65536)
                if not chunk:
                    break
                if size < MAX_BODY:
                    chunks.append(chunk[: MAX_BODY - size])
                size += len(chunk)
            if watchdog.fired:
                raise TimeoutError("deadline")
        except BaseException as err:
            raise self._failure(method, url, TimeoutError() if watchdog.fired else err) from None
        finally:
            watchdog.cancel()
            conn.close()
        return Response(
            method,
            url,
            response.status,
            b"".join(chunks),
            self._clock() - start,
            {k.lower(): v for k, v in response.getheaders()},
        )

    def stream(
        self, path: str, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Stream:
        """POST a streaming request and read its server-sent events to the end."""
        url = self.url(path)
        body = json.dumps(payload).encode()
        start = self._clock()
        deadline = start + self.timeout
        conn, response = self._open("POST", url, body, self._headers(headers, body), deadline)
        watchdog = _Watchdog(conn, deadline - self._clock())
        result = Stream("POST", url, response.status)
        try:
            if response.status != 200:
                self._settimeout(conn, deadline)
                result.body = response.read(MAX_BODY)
                return result
            for line in self._lines(conn, response, deadline):
                if not line.startswith("data:"):
                    continue  # "event:", ": keep-alive" comments, blank separators
                data = line[5:].strip()
                if data == "[DONE]":
                    result.done = True
                    break
                try:
                    result.events.append(Event(self._clock() - start, json.loads(data)))
                except ValueError:
                    result.unparsed += 1
            if watchdog.fired:
                raise TimeoutError("deadline")
        except BaseException as err:
            raise self._failure("POST", url, TimeoutError() if watchdog.fired else err) from None
        finally:
            watchdog.cancel()
            conn.close()
            result.seconds = self._clock() - start
        return result

    def _lines(self, conn: http.client.HTTPConnection, response, deadline: float) -> Iterator[str]:
        while True:
            self._settimeout(conn, deadline)
            raw = response.readline(MAX_BODY)
            if not raw:
                return
            yield raw.decode("utf-8", "replace").rstrip("\r\n")
