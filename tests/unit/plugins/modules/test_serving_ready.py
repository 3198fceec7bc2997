# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""serving_ready against a real HTTP server on a local port speaking vLLM's stream format."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import pytest
from ansible.module_utils import basic
from ansible_collections.localinference.vllm.plugins.module_utils.serve import _ready_probe
from ansible_collections.localinference.vllm.plugins.modules import serving_ready
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

# The chat.completion.chunk shape vLLM 0.32 streams with a reasoning parser (delta.reasoning).
STREAM = [
    '{"id":"chatcmpl-1","object":"chat.completion.chunk",'
    '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}',
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"reasoning":" cat"},"logprobs":null,"finish_reason":null}]}',
]  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    mode = "ok"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["stream"] is True
        if self.mode == "reject":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error":"maximum context length is 4096"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if self.mode in ("keep-alive", "drip"):
            # Accept, keep the stream alive, never generate: until the client hangs up.
            beat = b": keep-alive\n\n" if self.mode == "keep-alive" else b"d"
            try:
                while True:
                    self.wfile.write(beat)
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                return
        chunks = STREAM if self.mode == "ok" else STREAM[:1]
        for chunk in chunks:
            self.wfile.write(f"data: {chunk}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    Handler.mode = "ok"


def url(httpd) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def test_ready_means_a_streamed_token(server):
    out = run_module(serving_ready, {"url": url(server), "model": "m", "timeout": 10})
    assert not out.failed, out.result
    assert out.result["first_token"] == {"key": "reasoning", "text": " cat"}
    assert out.result["first_token_seconds"] >= out.result["health_seconds"]


@pytest.mark.parametrize(
    ("mode", "message"), [("empty", "without a generated token"), ("reject", "HTTP 400")]
)
def test_health_alone_is_not_ready(server, mode, message):
    Handler.mode = mode
    out = run_module(serving_ready, {"url": url(server), "model": "m", "timeout": 10})
    assert out.failed
    assert message in out.result["msg"]


def test_nothing_listening_times_out():
    out = run_module(serving_ready, {"url": "http://127.0.0.1:9", "model": "m", "timeout": 1})
    assert out.failed and "did not answer 200 within 1 s" in out.result["msg"]


@pytest.mark.parametrize(
    ("mode", "seen"), [("keep-alive", "keep-alive comment"), ("drip", "bytes")]
)
def test_a_stream_kept_alive_without_a_token_fails_by_the_deadline(server, mode, seen):
    """SSE comments (or a byte at a time) forever: the total deadline still ends the probe."""
    Handler.mode = mode
    deadline = 3
    started = time.monotonic()
    out = run_module(serving_ready, {"url": url(server), "model": "m", "timeout": deadline})
    elapsed = time.monotonic() - started
    print(f"{mode}: the probe failed after {elapsed:.2f} s (deadline {deadline} s)")
    assert out.failed
    assert (
        f"no generated token from {url(server)}/v1/chat/completions within 3 s" in out.result["msg"]
    )
    assert seen in out.result["msg"]
    assert elapsed < deadline + 5


def _systemctl(tmp_path: Path, show: str) -> str:
    script = tmp_path / "systemctl"
    script.write_text(f"#!/bin/sh\nprintf '{show}'\n")
    script.chmod(0o755)
    return str(script)


def test_a_misspelled_unit_is_not_watched_by_nobody(server, tmp_path):
    systemctl = _systemctl(
        tmp_path, "ActiveState=inactive\\nSubState=dead\\nLoadState=not-found\\n"
    )
    with mock.patch.object(basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: systemctl):
        out = run_module(
            serving_ready,
            {
                "url": url(server),
                "model": "m",
                "timeout": 10,
                "units": ["localinference-vlm.service"],
            },
        )
    assert out.failed
    assert out.result["msg"].startswith("localinference-vlm.service: unit cannot be watched")
    assert "LoadState=not-found" in out.result["msg"]


@pytest.mark.parametrize(
    ("script", "seen"),
    [
        # systemd not running (a container): systemctl show fails for every unit.
        ("echo 'System has not been booted with systemd' >&2; exit 1", "rc 1"),
        # An answer without LoadState: the unit's failure could not be seen either.
        ("printf 'ActiveState=active\\n'", "no LoadState"),
    ],
)
def test_a_unit_whose_state_cannot_be_read_ends_the_wait(server, tmp_path, script, seen):
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f"#!/bin/sh\n{script}\n")
    systemctl.chmod(0o755)
    with mock.patch.object(
        basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: str(systemctl)
    ):
        started = time.monotonic()
        out = run_module(
            serving_ready,
            {"url": url(server), "model": "m", "timeout": 30, "units": ["gone.service"]},
        )
    assert out.failed and time.monotonic() - started < 10
    assert out.result["msg"].startswith("units: cannot watch gone.service")
    assert seen in out.result["msg"]


def test_a_wedged_systemctl_is_bounded(server, tmp_path):
    script = tmp_path / "systemctl"
    script.write_text("#!/bin/sh\nsleep 60\n")
    script.chmod(0o755)
    with (
        mock.patch.object(
            basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: str(script)
        ),
        mock.patch.object(_ready_probe, "SYSTEMCTL_TIMEOUT", 0.5),
    ):
        out = run_module(
            serving_ready, {"url": url(server), "model": "m", "timeout": 1, "units": ["a.service"]}
        )
    assert out.failed and "watching unit a.service: systemctl did not answer" in out.result["msg"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"timeout": 0}, "timeout must be between 1 and 86400"),
        ({"url": "ftp://x"}, "url must be http(s)://"),
        ({"url": "http://a b"}, "url must be http(s)://"),
        ({"units": ["--now"]}, "units[0]: '--now' is not a systemd unit name"),
        ({"units": ["a.service", "a\nb.service"]}, "units[1]: contains '\\n'"),
        ({"units": ["localinference-vllm"]}, "units[0]: 'localinference-vllm' has no unit type"),
    ],
)
def test_bad_input(args, message):
    out = run_module(serving_ready, {"model": "m", **args})
    assert out.failed and message in out.result["msg"]
