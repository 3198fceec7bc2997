# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ingress faults against the real lab (make lab first).

1. vLLM stopped behind Caddy: a keyed request gets a 503 at once with Retry-After,
   whose body names the unit on the head and the journalctl command; started again,
   a token streams.
2. A served name that would inject lines into the Caddyfile is refused before
   anything is written: the installed Caddyfile and Caddy's process are unchanged.
3. An upstream listening on every address is refused (the key would be bypassed)
   before Caddy is touched.
4. Key rotation (-e ingress_rotate_key=true, with --diff): a stream started with the
   old key before the rotation completes across both of Caddy's reloads; the old key
   gets 401, the new one streams; the client's env file holds the new key (0600); the
   run prints neither key; the watchdog, which reads the head's key file at each look,
   stays healthy with no new incident; a second run without the option changes nothing.
Each test puts the lab back as it found it (4 leaves a new key, which every reader -
the harness, the watchdog, the client's env file - takes from the files).
"""

from __future__ import annotations

import json
import stat
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from lab.harness import (
    API_KEY_FILE,
    HEAD,
    HOSTS,
    INGRESS_CA_FILE,
    INGRESS_UNIT,
    LAB_DIR,
    MODEL,
    VLLM_UNIT,
    WATCHDOG_UNIT,
    api_key,
    endpoint,
    exec_on,
    incidents,
    rotate_key,
    run_playbook,
    streams_a_token,
    wait_for,
    watchdog_active,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

CADDYFILE = "/etc/caddy/Caddyfile"
HEAD_KEY_FILE = "/etc/localinference/ingress/api-key.env"
CLIENT_ENV_FILE = LAB_DIR / "opencode" / "env"
# The stream that must outlive the rotation: tokens the tiny model cannot end early
# (ignore_eos), 20 s at the lab's peak decode rate (about 100 tokens/s), about 50 s at
# its median - longer than the rotation's run up to its second reload. The second run
# and the watchdog's look are awaited while it still streams.
STREAM_TOKENS = 2000
RECOVERY_SECONDS = 600


def keyed_chat() -> tuple[int, str, dict[str, str]]:
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ).encode()
    request = urllib.request.Request(
        f"{endpoint()}/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key()}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode("utf-8", "replace"), dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace"), dict(err.headers)


def caddy_state() -> tuple[str, str]:
    digest = exec_on(HEAD, "sha256sum", CADDYFILE).stdout.split()[0]
    pid = exec_on(HEAD, "systemctl", "show", "-p", "MainPID", "--value", INGRESS_UNIT).stdout
    return digest, pid.strip()


def wait_for_token(seconds: float = RECOVERY_SECONDS) -> float:
    started = time.monotonic()
    while not streams_a_token(timeout=20):
        if time.monotonic() - started > seconds:
            return -1.0
        time.sleep(3)
    return time.monotonic() - started


def test_a_dead_upstream_gets_a_503_retry_after_naming_the_unit_and_recovers():
    assert streams_a_token(timeout=60), (
        "the lab does not serve through the ingress before the fault"
    )
    exec_on(HEAD, "systemctl", "stop", VLLM_UNIT, timeout=180)
    try:
        started = time.monotonic()
        status, body, headers = keyed_chat()
        assert status == 503 and time.monotonic() - started < 5, (status, body)
        assert headers.get("Retry-After") == "10", headers
        assert json.loads(body)["error"]["type"] == "service_unavailable", body
        message = json.loads(body)["error"]["message"]
        assert VLLM_UNIT in message and HEAD in message, message
        assert f"journalctl -u {VLLM_UNIT}" in message, message
        assert MODEL in message, message
    finally:
        # vLLM's multi-node mp: the worker's headless rank does not rejoin a new head
        # (it waited for the old one until a 300 s deadline in every run measured), so the
        # lab is put back as an operator would: the ranks first, then the head.
        for host in reversed(HOSTS):
            exec_on(host, "systemctl", "restart", VLLM_UNIT, timeout=180)
    waited = wait_for_token()
    assert waited >= 0, f"no token through the ingress {RECOVERY_SECONDS} s after the restart"


def test_an_injected_served_name_is_refused_before_the_caddyfile_changes():
    before = caddy_state()
    run = run_playbook(
        "ingress.yml",
        extra_vars={
            "ingress_models": [
                {"name": "m\n}\n:9999 {\n\trespond owned", "upstream": {"port": 8000}}
            ]
        },
        timeout=600,
    )
    assert run.rc != 0, run.tail()
    assert "ingress_models[0].name" in run.flat and "position 1" in run.flat, run.tail()
    assert caddy_state() == before


def test_an_upstream_on_every_address_is_refused_before_caddy_is_touched():
    before = caddy_state()
    exec_on(HEAD, "systemd-run", "--unit=ingress-fault-listener", "python3", "-m", "http.server",
            "18555", "--bind", "0.0.0.0")  # fmt: skip
    try:
        time.sleep(2)
        run = run_playbook(
            "ingress.yml",
            extra_vars={"ingress_models": [{"name": "fault/m", "upstream": {"port": 18555}}]},
            timeout=600,
        )
    finally:
        exec_on(HEAD, "systemctl", "stop", "ingress-fault-listener.service", check=False)
    assert run.rc != 0, run.tail()
    assert "ingress-bypass" in run.flat or "without the ingress key" in run.flat, run.tail()
    assert "0.0.0.0:18555" in run.flat, run.tail()
    assert caddy_state() == before


def keyed_status(key: str) -> int:
    request = urllib.request.Request(
        f"{endpoint()}/models", headers={"Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def long_stream(key: str, record: dict[str, Any]) -> None:
    """A streamed chat completion with ``key``; ``record`` gets its times, tokens and end."""
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Count slowly."}],
            "max_tokens": STREAM_TOKENS,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"{endpoint()}/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    record.update(started=time.time(), chunks=0, done=False, finish=None)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            record["status"] = response.status
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if line == "data: [DONE]":
                    record["done"] = True
                elif line.startswith("data: "):
                    record["chunks"] += 1
                    for choice in json.loads(line[6:]).get("choices") or []:
                        record["finish"] = choice.get("finish_reason") or record["finish"]
    except (urllib.error.URLError, OSError, ValueError) as err:
        record["error"] = repr(err)
    record["ended"] = time.time()


def caddy_reloads(since: float) -> list[float]:
    """Epochs at which systemd finished reloading Caddy since ``since``."""
    journal = exec_on(HEAD, "journalctl", "-u", INGRESS_UNIT, "-o", "short-unix", "--no-pager",
                      "-q", "--since", f"@{int(since)}", check=False).stdout  # fmt: skip
    return [float(line.split()[0]) for line in journal.splitlines() if "Reloaded" in line]


def watchdog_healthy_after(epoch: float) -> bool:
    metrics = exec_on(HEAD, "curl", "-s", "-m", "5", "http://127.0.0.1:9109/metrics",
                      check=False).stdout  # fmt: skip
    values = dict(
        line.rsplit(" ", 1) for line in metrics.splitlines() if line and not line.startswith("#")
    )
    look = float(values.get("localinference_watchdog_last_look_timestamp_seconds", "0"))
    healthy = values.get('localinference_watchdog_verdict{verdict="healthy"}') == "1"
    return look > epoch and healthy


@pytest.mark.watchdog
def test_a_key_rotation_keeps_a_stream_in_flight_and_refuses_the_old_key():
    old = api_key()
    assert old and keyed_status(old) == 200, (
        "the lab does not answer with its key before the rotation"
    )
    assert watchdog_active(), f"{WATCHDOG_UNIT} does not run on {HEAD}"
    started = time.time()
    seen = len(incidents())

    stream: dict[str, Any] = {}
    reader = threading.Thread(target=long_stream, args=(old, stream), daemon=True)
    reader.start()
    wait_for("the stream's first chunk", lambda: stream.get("chunks", 0) > 0, 60, every=0.2)
    run = rotate_key()
    rotated = time.time()
    assert run.rc == 0, run.tail()

    new = api_key()
    assert new and new != old, f"{API_KEY_FILE} still holds the old key"
    output = run.stdout + run.stderr
    assert old not in output and new not in output, "the rotation printed a key (--diff)"

    assert keyed_status(old) == 401
    assert keyed_status(new) == 200 and streams_a_token(timeout=60)
    # The key, and the ingress's CA for opencode (TLS beyond the head's loopback).
    assert CLIENT_ENV_FILE.read_text() == (
        f"LOCALINFERENCE_API_KEY={new}\nNODE_EXTRA_CA_CERTS={INGRESS_CA_FILE}\n"
    )
    for path in (API_KEY_FILE, CLIENT_ENV_FILE):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    head_file = exec_on(HEAD, "stat", "-c", "%a %U", HEAD_KEY_FILE).stdout.split()
    assert head_file == ["600", "root"], head_file
    # Caddy's running configuration holds the key: it is saved nowhere but /run/caddy.
    found = exec_on(HEAD, "grep", "-rlF", "-f", "-", "/var/lib/caddy", "/var/log", "/etc/caddy",
                    check=False, input=f"{old}\n{new}\n").stdout  # fmt: skip
    assert found.strip() == "", f"a key is saved in {found.split()}"

    # The watchdog read the new key from the head's file: a look after the rotation
    # streamed (healthy) and no incident was recorded.
    wait_for("a healthy look of the watchdog after the rotation",
             lambda: watchdog_healthy_after(rotated), 60)  # fmt: skip
    assert incidents()[seen:] == []

    again = run_playbook("ingress.yml", timeout=600)
    assert again.rc == 0, again.tail()
    assert again.changed() == 0, again.tail()
    assert api_key() == new

    reader.join(timeout=300)
    # The stream began before Caddy's first reload and ended, complete, after its last.
    reloads = caddy_reloads(started)
    assert len(reloads) >= 2, f"Caddy was not reloaded twice: {reloads}"
    assert stream.get("error") is None, stream
    assert stream["done"] and stream["finish"] == "length", stream
    assert stream["started"] < reloads[0] and stream["ended"] > reloads[-1], (stream, reloads)
