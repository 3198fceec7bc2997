# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Caddyfile the ingress renders, run by the real Caddy (Debian's, as on the head).

On a loopback port with TLS from Caddy's internal CA, as the role serves it: a request
without the key is refused (401) before anything else; while nothing accepts on vLLM's
port (a stopped or restarting engine: the port bound, not listening) a keyed request gets
503 with ``Retry-After`` and an OpenAI-style body at once; an engine that drops the
connection unanswered gets the same; then a stand-in vLLM answers and its answers pass
through untouched, a 502 of its own included. Skipped where Caddy is not installed
(lab/system-packages.txt installs it).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.ingress import _caddy

from .test_caddy import MODEL, spec

pytestmark = pytest.mark.skipif(
    shutil.which("caddy") is None, reason="needs Caddy (apt-get install caddy; lab/system-packages.txt)"
)

KEY = "test-key-" + "k" * 32
RETRY_AFTER = 7
ROUTE = "/" + MODEL
START_DEADLINE_S = 30.0
REQUEST_TIMEOUT_S = 10.0


def _bound_port() -> socket.socket:
    """A loopback port bound but not listening: a connection to it is refused, as to vLLM
    while it is stopped or restarting, and no other process can take it meanwhile."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


class _StandIn(BaseHTTPRequestHandler):
    """vLLM on loopback: 200 with what it saw; ``/v1/drop`` closes unanswered; ``/v1/bad`` 502."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/drop":
            self.close_connection = True
            return
        status = 502 if self.path == "/v1/bad" else 200
        body = json.dumps({"path": self.path, "authorization": self.headers.get("Authorization")}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _caddyfile(caddy_port: int, upstream_port: int) -> str:
    """The role's Caddyfile (every address, TLS from the internal CA), admin API off for the test."""
    built = _caddy.config(spec(
        models=[{"name": MODEL, "upstream": {"host": "127.0.0.1", "port": upstream_port}}],
        port=caddy_port, public_url=f"https://127.0.0.1:{caddy_port}", retry_after=RETRY_AFTER,
    ))
    assert built["result"]["retry_after"] == RETRY_AFTER
    text = built["caddyfile"]
    assert "\tadmin localhost:2019\n" in text and "\ttls internal\n" in text
    # Port 2019 may be taken on a test machine; nothing here reloads.
    return text.replace("\tadmin localhost:2019\n", "\tadmin off\n")


def _wait_for_tls(proc: subprocess.Popen, port: int, ca: Path, log: Path) -> ssl.SSLContext:
    """Caddy's own /health over TLS, verified against the CA it made, within the deadline."""
    deadline = time.monotonic() + START_DEADLINE_S
    error: Exception | None = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"caddy exited {proc.returncode}: {log.read_text()[-2000:]}"
        if ca.exists():
            try:
                context = ssl.create_default_context(cafile=str(ca))
                status, _, _ = _request(context, port, "GET", "/health", key=None)
                if status == 200:
                    return context
            except (OSError, ssl.SSLError) as exc:
                error = exc
        time.sleep(0.2)
    raise AssertionError(f"caddy did not serve /health within {START_DEADLINE_S} s ({error}): "
                         f"{log.read_text()[-2000:]}")


@pytest.fixture
def caddy(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Caddy running the rendered Caddyfile against a refused upstream port; stopped at the end."""
    upstream = _bound_port()
    probe = _bound_port()
    caddy_port = probe.getsockname()[1]
    probe.close()
    config = tmp_path / "Caddyfile"
    config.write_text(_caddyfile(caddy_port, upstream.getsockname()[1]))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           _caddy.KEY_ENV: KEY}
    log = tmp_path / "caddy.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["caddy", "run", "--config", str(config), "--adapter", "caddyfile"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        ca = tmp_path / "data" / "caddy" / "pki" / "authorities" / "local" / "root.crt"
        context = _wait_for_tls(proc, caddy_port, ca, log)
        yield {"port": caddy_port, "context": context, "upstream": upstream, "log": log}
    finally:
        upstream.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _request(context: ssl.SSLContext, port: int, method: str, path: str,
             key: str | None = KEY) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=REQUEST_TIMEOUT_S)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}' if method == "POST" else None
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _assert_told_to_wait(answer: tuple[int, dict[str, str], bytes]) -> None:
    status, headers, body = answer
    assert status == 503, (status, body)
    assert headers.get("retry-after") == str(RETRY_AFTER)
    assert headers.get("content-type") == "application/json"
    error = json.loads(body)["error"]
    assert error["type"] == "service_unavailable" and error["code"] == 503
    assert "restarting" in error["message"] and f"Retry after {RETRY_AFTER} s" in error["message"]
    assert MODEL in error["message"] and "journalctl -u localinference-vllm.service" in error["message"]


def _serve(sock: socket.socket) -> ThreadingHTTPServer:
    """The stand-in vLLM on the port Caddy proxies to (the bound socket starts listening)."""
    server = ThreadingHTTPServer(sock.getsockname(), _StandIn, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    sock.listen()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return server


def test_the_key_comes_first_then_a_down_engine_means_503_retry_after_at_once(caddy):
    context, port = caddy["context"], caddy["port"]
    chat = f"{ROUTE}/v1/chat/completions"
    for key in (None, "wrong-key-" + "w" * 30):
        status, headers, body = _request(context, port, "POST", chat, key=key)
        assert status == 401 and "retry-after" not in headers, (status, body)
        assert json.loads(body)["error"]["type"] == "invalid_api_key"
        assert b"restarting" not in body and b"journalctl" not in body
    started = time.monotonic()
    _assert_told_to_wait(_request(context, port, "POST", chat))
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, f"the 503 took {elapsed:.2f} s"
    # vLLM's own health route (no key) says the same: not ready, come back.
    _assert_told_to_wait(_request(context, port, "GET", f"{ROUTE}/health", key=None))


def test_a_dropped_connection_waits_and_an_answering_engine_passes_through(caddy):
    context, port = caddy["context"], caddy["port"]
    server = _serve(caddy["upstream"])
    try:
        status, headers, body = _request(context, port, "POST", f"{ROUTE}/v1/chat/completions")
        assert status == 200 and "retry-after" not in headers, (status, body)
        # The prefix is stripped and the key stops at Caddy.
        assert json.loads(body) == {"path": "/v1/chat/completions", "authorization": None}
        _assert_told_to_wait(_request(context, port, "POST", f"{ROUTE}/v1/drop"))
        # A status vLLM answers itself is its own: passed through, never turned into a 503.
        status, headers, body = _request(context, port, "POST", f"{ROUTE}/v1/bad")
        assert status == 502 and "retry-after" not in headers
        assert json.loads(body)["path"] == "/v1/bad"
    finally:
        server.shutdown()
        server.server_close()
