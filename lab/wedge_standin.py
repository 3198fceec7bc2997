# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A stand-in for the ingress and vLLM across a watchdog restart, to record how the real agent
clients wait one out (tests/unit/fixtures/clients-across-wedge/, lab/client_retries.py).

What a client meets in the lab when it starts a turn during a wedge (tests/lab/clients/
test_clients_across_wedge.py), replayed on the loopback in seconds instead of a restart's minute:

1. its first request gets ``200`` and SSE headers, then nothing for ``--hang`` seconds (the
   stopped rank: vLLM's API server is up, its engine makes no step);
2. the watchdog stops the head's server: that request ends as vLLM 0.32.0 ends it (``--end
   error``: the error event its stream generators write for a dead engine, then ``[DONE]``; the
   Anthropic route's ``event: error``) or with the socket closed mid-body (``--end drop``);
3. for ``--down`` seconds after that every request gets the ingress's 503 with ``Retry-After``
   (roles/ingress: ``ingress_retry_after``);
4. then a streamed (or, when asked without ``stream``, a whole) answer, OpenAI's chat
   completion or Anthropic's message by the path.

One JSON line per request and per phase on stdout: ``t`` is seconds since the first request.
Usage: ``python3 lab/wedge_standin.py --port 18931 --end error --hang 3 --down 60 --retry-after 10``
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# vLLM 0.32.0's message for a dead engine (vllm/v1/engine/exceptions.py, EngineDeadError).
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
ANSWER = "Hello from the stand-in."


class Phases:
    """When the wedge ends and the engine is back, from the first request on."""

    def __init__(self, hang: float, down: float, end: str) -> None:
        self.hang, self.down, self.end = hang, down, end
        self.lock = threading.Lock()
        self.first: float | None = None
        self.dropped: float | None = None
        self.count = 0

    def arrive(self) -> int:
        with self.lock:
            self.count += 1
            if self.first is None:
                self.first = time.time()
            return self.count

    def engine_back(self) -> bool:
        return self.dropped is not None and time.time() - self.dropped >= self.down

    def log(self, **fields: Any) -> None:
        print(json.dumps({"t": round(time.time() - (self.first or time.time()), 2), **fields}), flush=True)


def make_handler(phases: Phases, retry_after: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(size) or b"{}")
            anthropic = self.path.split("?")[0].endswith("/messages")
            number = phases.arrive()
            if number == 1:
                phases.log(request=number, path=self.path, stream=bool(request.get("stream")), answer="hang")
                return self.wedged(anthropic)
            if not phases.engine_back():
                phases.log(request=number, path=self.path, stream=bool(request.get("stream")), answer=503)
                return self.unavailable()
            phases.log(request=number, path=self.path, stream=bool(request.get("stream")), answer=200)
            return self.answer(anthropic, request)

        def chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def start_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()

        def wedged(self, anthropic: bool) -> None:
            self.start_stream()
            time.sleep(phases.hang)
            phases.dropped = time.time()
            phases.log(event="engine stopped", end=phases.end)
            if phases.end == "drop":
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if anthropic:
                error = {"type": "error", "error": {"type": "internal_error", "message": ENGINE_DEAD}}
                self.chunk(f"event: error\ndata: {json.dumps(error)}\n\n")
            else:
                error = {"error": {"message": ENGINE_DEAD, "type": "InternalServerError", "param": None, "code": 500}}
                self.chunk(f"data: {json.dumps(error)}\n\n")
                self.chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def unavailable(self) -> None:
            message = ("the vLLM server for model stand-in is not accepting connections: the engine is down,"
                       f" starting or restarting. Retry after {retry_after} s.")  # fmt: skip
            body = json.dumps({"error": {"message": message, "type": "service_unavailable", "code": 503}}).encode()
            self.send_response(503)
            self.send_header("Retry-After", retry_after)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def answer(self, anthropic: bool, request: dict[str, Any]) -> None:
            model = request.get("model")
            if not request.get("stream"):
                body = json.dumps(_whole_answer(anthropic, model)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.start_stream()
            for event in _streamed_answer(anthropic, model):
                self.chunk(event)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


def _whole_answer(anthropic: bool, model: Any) -> dict[str, Any]:
    if anthropic:
        return {"id": "msg_standin", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": ANSWER}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 5}}  # fmt: skip
    return {"id": "chatcmpl-standin", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}  # fmt: skip


def _streamed_answer(anthropic: bool, model: Any) -> list[str]:
    if anthropic:
        message = {"id": "msg_standin", "type": "message", "role": "assistant", "model": model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}
        events = [
            {"type": "message_start", "message": message},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ANSWER}},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
             "usage": {"output_tokens": 5}},
            {"type": "message_stop"},
        ]  # fmt: skip
        return [f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events]
    base = {"id": "chatcmpl-standin", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    deltas = [({"role": "assistant", "content": ""}, None), ({"content": ANSWER}, None), ({}, "stop")]
    chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]} for delta, finish in deltas]
    chunks.append({**base, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
    return [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]


def serve(port: int, end: str, hang: float, down: float, retry_after: str) -> ThreadingHTTPServer:
    """The stand-in listening on the loopback's ``port`` (0: any free port); ``serve_forever`` it."""
    return ThreadingHTTPServer(("127.0.0.1", port), make_handler(Phases(hang, down, end), retry_after))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--end", choices=("error", "drop"), default="error")
    parser.add_argument("--hang", type=float, default=3.0)
    parser.add_argument("--down", type=float, default=60.0)
    parser.add_argument("--retry-after", default="10")
    args = parser.parse_args(argv)
    serve(args.port, args.end, args.hang, args.down, args.retry_after).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
