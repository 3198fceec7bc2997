# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A local HTTP server that answers the qualification checks with recorded vLLM responses.

``answer(method, path, body) -> Reply`` decides each response; a reply is a
status and either a body or server-sent event chunks (each sent after
``delay`` seconds), so the tests drive the real stdlib client, deadlines
included, against real vLLM bytes (tests/unit/fixtures/vllm-api).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

API = Path(__file__).resolve().parents[3] / "fixtures" / "vllm-api"


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    chunks: list[bytes] = field(default_factory=list)
    delay: float = 0.0
    content_type: str = "application/json"


def recorded(name: str) -> bytes:
    return (API / name).read_bytes()


def sse(name: str) -> Reply:
    """A recorded stream, one chunk per event."""
    events = [part + b"\n\n" for part in recorded(name).split(b"\n\n") if part.strip()]
    return Reply(chunks=events, content_type="text/event-stream")


def as_json(value: Any, status: int = 200) -> Reply:
    return Reply(status=status, body=json.dumps(value).encode())


class FakeServer:
    def __init__(self, answer: Callable[[str, str, Any], Reply]) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, Any, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                outer.requests.append((method, self.path, body, dict(self.headers)))
                reply = outer.answer(method, self.path, body)
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                if reply.chunks:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    try:
                        for chunk in reply.chunks:
                            time.sleep(reply.delay)
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    return
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                time.sleep(reply.delay)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(reply.body)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
