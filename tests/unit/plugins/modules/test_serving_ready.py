# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""serving_ready against a real HTTP server on a local port speaking vLLM's stream format."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
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
