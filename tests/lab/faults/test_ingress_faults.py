# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ingress faults against the real lab (make lab first).

1. vLLM stopped behind Caddy: a keyed request gets a 502 whose body names the
   unit on the head and the journalctl command; started again, a token streams.
2. A served name that would inject lines into the Caddyfile is refused before
   anything is written: the installed Caddyfile and Caddy's process are unchanged.
3. An upstream listening on every address is refused (the key would be bypassed)
   before Caddy is touched.
Each test puts the lab back as it found it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from lab.harness import (
    HEAD,
    HOSTS,
    MODEL,
    VLLM_UNIT,
    api_key,
    endpoint,
    exec_on,
    run_playbook,
    streams_a_token,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

CADDYFILE = "/etc/caddy/Caddyfile"
RECOVERY_SECONDS = 600


def keyed_chat() -> tuple[int, str]:
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
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")


def caddy_state() -> tuple[str, str]:
    digest = exec_on(HEAD, "sha256sum", CADDYFILE).stdout.split()[0]
    pid = exec_on(HEAD, "systemctl", "show", "-p", "MainPID", "--value", "caddy.service").stdout
    return digest, pid.strip()


def wait_for_token(seconds: float = RECOVERY_SECONDS) -> float:
    started = time.monotonic()
    while not streams_a_token(timeout=20):
        if time.monotonic() - started > seconds:
            return -1.0
        time.sleep(3)
    return time.monotonic() - started


def test_a_dead_upstream_gets_a_502_naming_the_unit_and_recovers():
    assert streams_a_token(timeout=60), (
        "the lab does not serve through the ingress before the fault"
    )
    exec_on(HEAD, "systemctl", "stop", VLLM_UNIT, timeout=180)
    try:
        status, body = keyed_chat()
        assert status == 502, body
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
