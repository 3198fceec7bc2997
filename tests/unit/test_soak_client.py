# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The soak's client (benchmarks/_soak_client.py) and its pre-fault check, against real TLS
servers on loopback: a CA and a certificate made here, python's http.server behind ssl. The soak
itself (benchmarks/soak.py) runs as a subprocess where it must stop before touching the lab."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from benchmarks import _soak_client as client
from lab.harness import LabError

ROOT = Path(__file__).resolve().parents[2]


def _pki(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 it signed: (ca.crt, server.crt, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("soak test CA")).issuer_name(name("soak test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder().subject_name(name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


KEY = "sk-soak-test"


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    return f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta, 'finish_reason': finish}]})}\n\n".encode()


class Endpoint(BaseHTTPRequestHandler):
    """``mode``: ``"400"`` answers 400 to everything (Caddy's answer to plain HTTP on its TLS
    port); ``"stream"`` is an OpenAI-compatible streaming server that wants the key;
    ``"defer-once"`` says 503 with Retry-After 1 first, then streams; ``"hang"`` never answers."""

    protocol_version = "HTTP/1.1"
    mode = "stream"
    seen: ClassVar[list[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for header, value in headers.items():
            self.send_header(header.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.mode == "400":
            self.reply(400, b"Client sent an HTTP request to an HTTPS server.\n")
        else:
            self.reply(200, json.dumps({"data": [{"id": "m", "max_model_len": 2048}]}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(self.headers.get("Authorization") or "")
        if self.mode == "400":
            self.reply(400, b"Client sent an HTTP request to an HTTPS server.\n")
            return
        if self.mode == "hang":
            time.sleep(10)
            return
        if self.mode == "defer-once" and len(self.seen) == 1:
            self.reply(503, b"the engine is restarting\n", Retry_After="1")
            return
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self.reply(401, b"unauthorized\n")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for part in (_chunk({"role": "assistant"}), _chunk({"content": "O"}), _chunk({"content": "K"}, "stop"),
                     b'data: {"choices": [], "usage": {"prompt_tokens": 12}}\n\n', b"data: [DONE]\n\n"):
            self.wfile.write(part)
            self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Path, Path, Path]:
    return _pki(tmp_path)


@pytest.fixture
def serve(pki) -> Iterator:
    servers: list[ThreadingHTTPServer] = []

    def start(mode: str) -> str:
        handler = type("Handler", (Endpoint,), {"mode": mode, "seen": []})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki[1], pki[2])
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"https://127.0.0.1:{httpd.server_address[1]}/v1"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def target(base: str, ca: Path, key: str | None = KEY) -> client.Target:
    return client.Target(base, str(ca), key)


def soak(base: str, pki, tmp_path: Path) -> subprocess.CompletedProcess:
    """benchmarks/soak.py pointed at ``base``, with the lab directory in ``tmp_path``."""
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    env = {**os.environ, "SOAK_ENDPOINT": base, "SOAK_CA_FILE": str(pki[0]), "SOAK_KEY_FILE": str(key_file),
           "SOAK_MINUTES": "2", "SOAK_READY_S": "4", "SOAK_DEADLINE_S": "5",
           "LOCALINFERENCE_LAB_DIR": str(tmp_path / "lab")}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_soak_of_an_endpoint_that_answers_400_stops_with_the_error_and_no_availability(serve, pki, tmp_path):
    started = time.monotonic()
    done = soak(serve("400"), pki, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "soak: the endpoint never answered before any fault: HTTP 400: Client sent an HTTP request" \
        in done.stderr
    assert "availability" not in done.stdout + done.stderr
    assert not (tmp_path / "lab" / "soak.json").exists()
    assert time.monotonic() - started < 30  # a 400 is not asked again


def test_a_soak_with_nothing_listening_stops_with_the_error(pki, tmp_path):
    done = soak(f"https://127.0.0.1:{free_port()}/v1", pki, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "soak: the endpoint never answered before any fault: ConnectionRefusedError" in done.stderr
    assert "availability" not in done.stdout + done.stderr


def test_a_soak_refuses_an_address_outside_the_lab(pki, tmp_path):
    done = soak("https://192.0.2.7/v1", pki, tmp_path)
    assert done.returncode == 2 and "only to loopback and the lab's addresses" in done.stderr


def test_the_pre_fault_check_passes_on_a_streaming_endpoint_with_the_key_over_tls(serve, pki):
    base = serve("stream")
    ready = client.first_answer(target(base, pki[0]), within=10, deadline=5)
    assert ready["attempts"] == 1 and ready["ttft_s"] < 5
    reply = client.stream_chat(target(base, pki[0]), {"model": "m", "messages": [], "stream": True}, 5)
    assert (reply["content"], reply["finish_reason"], reply["prompt_tokens"]) == ("OK", "stop", 12)
    assert client.served_max_model_len(target(base, pki[0])) == 2048


def test_the_pre_fault_check_stops_at_once_without_the_key(serve, pki):
    with pytest.raises(client.NeverAnswered, match=r"^HTTP 401: unauthorized .*1 attempt"):
        client.first_answer(target(serve("stream"), pki[0], key=None), within=10, deadline=5)


def test_told_to_wait_is_a_deferral_and_the_check_asks_again_after_it(serve, pki):
    base = serve("defer-once")
    with pytest.raises(client.Refused) as refused:
        client.stream_chat(target(base, pki[0]), {"model": "m", "messages": []}, 5)
    assert (refused.value.status, refused.value.retry_after, refused.value.deferred) == (503, 1.0, True)
    assert client.first_answer(target(base, pki[0]), within=10, deadline=5)["attempts"] == 1


def test_the_deferral_is_honoured_by_the_pre_fault_check(serve, pki):
    started = time.monotonic()
    assert client.first_answer(target(serve("defer-once"), pki[0]), within=10, deadline=5)["attempts"] == 2
    assert time.monotonic() - started >= 1.0


def test_a_certificate_the_ca_did_not_sign_is_refused(serve, pki, tmp_path):
    (tmp_path / "other").mkdir()
    other = _pki(tmp_path / "other")[0]
    with pytest.raises(RuntimeError, match="SSLCertVerificationError"):
        client.stream_chat(target(serve("stream"), other), {"model": "m", "messages": []}, 5)


def test_an_endpoint_that_never_answers_is_a_timeout_at_the_deadline(serve, pki):
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        client.stream_chat(target(serve("hang"), pki[0]), {"model": "m", "messages": []}, 1.5)
    assert 1.4 < time.monotonic() - started < 3


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, None), ("", None), ("7", 7.0), ("600", client.RETRY_AFTER_MAX), ("soon", None),
     ("Thu, 01 Jan 1970 00:00:20 GMT", 10.0), ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0)],
)
def test_retry_after_is_read_and_bounded(header, expected):
    assert client.retry_after(header, now=10.0) == expected


def test_the_environment_points_the_soak_and_https_needs_a_ca(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-1\nignored\n")
    ca = tmp_path / "ca.crt"
    ca.write_text("")
    got = client.target_from_env({"SOAK_ENDPOINT": "https://127.0.0.1:9/v1/", "SOAK_CA_FILE": str(ca),
                                  "SOAK_KEY_FILE": str(key)})
    assert got == client.Target("https://127.0.0.1:9/v1", str(ca), "sk-1")
    assert got.chat_url == "https://127.0.0.1:9/v1/chat/completions"
    with pytest.raises(LabError, match="no CA file"):
        client.target_from_env({"SOAK_ENDPOINT": "https://127.0.0.1:9/v1", "SOAK_CA_FILE": str(tmp_path / "no")})
    plain = client.target_from_env({"SOAK_ENDPOINT": "http://127.0.0.1:9/v1", "SOAK_CA_FILE": str(ca),
                                    "SOAK_KEY_FILE": str(key)})
    assert plain.ca_file is None


def test_a_session_waits_as_told_and_counts_the_deferral_apart(serve, pki):
    from benchmarks._soak_schedule import schedule, select
    from benchmarks.soak import Session, Soak

    plan = schedule(select("", 2), 2)
    run = Soak(target(serve("defer-once"), pki[0]), minutes=0.05, sessions=2, deadline=5, plan=plan)
    assert (run.max_model_len, run.planned) == (2048, ["wedge"])
    run.start = time.monotonic()
    session = Session(1, run)
    session.start()
    session.join(timeout=20)
    first, second = run.requests[:2]
    assert (first.ok, first.deferred, first.retry_after, first.error) == (
        False, True, 1.0, "HTTP 503: the engine is restarting")
    assert second.ok and second.started - first.started >= 1.0


def test_after_a_key_rotation_a_401_reads_the_key_file_again_once(serve, pki, tmp_path, monkeypatch):
    from benchmarks.soak import Soak

    key_file = tmp_path / "api-key"
    key_file.write_text("sk-before-the-rotation\n")
    monkeypatch.setenv("SOAK_KEY_FILE", str(key_file))
    base = serve("stream")
    run = Soak(target(base, pki[0], key="sk-before-the-rotation"), minutes=1, sessions=2, deadline=5, plan=[])
    run.start = time.monotonic()
    reply, record = run.send(1, 1, 1, [{"role": "user", "content": "hi"}])
    # The file still holds the refused key: the 401 is a failure, asked once.
    assert reply is None and record.error == "HTTP 401: unauthorized" and run.key_reloads == 0
    key_file.write_text(KEY + "\n")  # the rotation rewrote it
    reply, record = run.send(1, 1, 2, [{"role": "user", "content": "hi"}])
    assert reply is not None and record.ok and record.error is None
    assert (run.key_reloads, run.target.key) == (1, KEY)
    assert [r.ok for r in run.requests] == [False, True]


def test_with_fresh_key_is_none_when_the_key_did_not_change(tmp_path):
    key_file = tmp_path / "api-key"
    key_file.write_text("sk-1\n")
    env = {"SOAK_KEY_FILE": str(key_file)}
    assert client.with_fresh_key(client.Target("https://127.0.0.1:9/v1", None, "sk-1"), env) is None
    assert client.with_fresh_key(client.Target("https://127.0.0.1:9/v1", None, "sk-0"), env).key == "sk-1"
    assert client.with_fresh_key(client.Target("https://127.0.0.1:9/v1", None, "sk-0"),
                                 {"SOAK_KEY_FILE": str(tmp_path / "gone")}) is None


class _Lines:
    """A response body read line by line, as http.client gives it."""

    def __init__(self, *lines: bytes) -> None:
        self.lines = list(lines)

    def readline(self, _limit: int) -> bytes:
        return self.lines.pop(0) if self.lines else b""


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        # vLLM's in-stream error event (serving_chat.py: `data: {"error": {...}}` then [DONE])
        ((b'data: {"error": {"message": "engine dead", "type": "InternalServerError", "code": 500}}\n',
          b"data: [DONE]\n"), "the stream carried an error: engine dead"),
        ((b'data: {"object": "error", "message": "too long", "type": "BadRequestError", "code": 400}\n',),
         "the stream carried an error: too long"),
        # a body that is not a stream at all is named by its first line
        ((b"<html>bad gateway</html>\n",),
         "the stream ended without a finish_reason (it began: <html>bad gateway</html>)"),
        ((), "the stream ended without a finish_reason (it began: nothing)"),
    ],
)
def test_a_stream_without_a_finish_says_what_came_instead(lines, message):
    with pytest.raises(RuntimeError) as err:
        client._read_stream(_Lines(*lines), time.monotonic())
    assert str(err.value) == message
