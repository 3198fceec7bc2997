# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ingress in the converged lab, checked from outside. Read-only.

Caddy on the head (published on the controller as 127.0.0.1:18080) routes
/<served-name>/v1/... to vLLM with a bearer key: without the key 401 and never a
model answer, with it a streamed token; /health answers without the key. The
key is only in its 0600 files. Every listening socket on both hosts is one we
intend (which address, and why).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import stat
import urllib.error
import urllib.request
from typing import Any

import pytest

from lab.harness import (
    API_KEY_FILE,
    CLUSTER_ADDRESSES,
    HEAD,
    HOSTS,
    INGRESS_CA_FILE,
    INGRESS_URL,
    LAB_DIR,
    MODEL,
    STATE_DIR,
    api_key,
    endpoint,
    exec_on,
    first_token,
    module_utils,
    read_json,
    served_models,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

INGRESS_RESULT = f"{STATE_DIR}/ingress.json"
KEY_PATH = "/etc/localinference/ingress/api-key.env"
CADDYFILE = "/etc/caddy/Caddyfile"
VLLM_PORT, CADDY_PORT, CADDY_ADMIN_PORT, TORCH_STORE_PORT = 8000, 8080, 2019, 29501


def request(
    url: str, *, key: str | None = None, body: dict[str, Any] | None = None, timeout: float = 30
) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=data, headers=headers), timeout=timeout
        ) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_the_endpoint_is_the_ingress_route_of_the_model():
    assert endpoint() == f"{INGRESS_URL}/{MODEL}/v1"
    assert MODEL in [model["id"] for model in served_models()]


@pytest.mark.parametrize(
    "key", [None, "", "wrong-key-0123456789abcdef"], ids=["none", "empty", "wrong"]
)
def test_a_request_without_the_key_gets_401_and_no_model_answer(key):
    status, body = request(f"{endpoint()}/chat/completions", key=key, body=CHAT)
    assert status == 401, body
    assert "choices" not in body and "missing or wrong API key" in body
    status, body = request(f"{endpoint()}/models", key=key)
    assert status == 401 and '"data"' not in body, body


def test_with_the_key_a_token_streams_through_caddy():
    assert api_key(), f"no lab key in {API_KEY_FILE}"
    token = first_token()
    assert token["text"], token


def test_health_answers_without_the_key():
    assert request(f"{INGRESS_URL}/health") == (200, "ok")
    status, _ = request(f"{INGRESS_URL}/{MODEL}/health")
    assert status == 200


def test_an_unknown_route_is_404_naming_the_models():
    status, body = request(f"{INGRESS_URL}/no-such-model/v1/models", key=api_key())
    assert status == 404 and MODEL in body, body


def test_the_saved_result_names_routes_health_and_key_file():
    doc = read_json(HEAD, INGRESS_RESULT)
    assert doc["stage"] == "ingress"
    result = doc["result"]
    assert result["base_urls"] == {MODEL: f"{INGRESS_URL}/{MODEL}/v1"}
    assert result["health_url"] == f"{INGRESS_URL}/health"
    assert result["key_file"] == KEY_PATH


def test_the_key_files_are_private():
    assert stat.S_IMODE(API_KEY_FILE.stat().st_mode) == 0o600
    mode = exec_on(HEAD, "stat", "-c", "%a %U %G", KEY_PATH).stdout.split()
    assert mode == ["600", "root", "root"], mode


def test_the_key_is_in_no_config_log_or_command_line():
    key = api_key()
    assert key
    # grep -F reads the key from stdin (-f -): not on any command line either.
    places = [CADDYFILE, "/etc/systemd/system/caddy.service.d", STATE_DIR, "/var/log"]
    for host in HOSTS:
        found = exec_on(
            host,
            "grep",
            "-rlF",
            "-f",
            "-",
            *places,
            "--exclude=api-key.env",
            check=False,
            input=key + "\n",
        )
        assert found.stdout.strip() == "", f"{host}: the key is in {found.stdout.split()}"
        journal = exec_on(host, "journalctl", "--no-pager", "-q", "-o", "cat", check=False).stdout
        assert key not in journal, f"{host}: the key is in the journal"
        processes = exec_on(host, "ps", "-eo", "args", check=False).stdout
        assert key not in processes, f"{host}: the key is on a command line"


WATCHDOG_PORT = 9109
MONITORING_PORTS = (9090, 9093, 9100)
# Every listening socket on the lab hosts, and why it is there.
INTENDED = {
    "sshd": "the image's sshd (port 22, every address); the lab drives the hosts through podman exec",
    "caddy:8080": "the ingress: every address, the key is required",
    "caddy:2019": "Caddy's admin API, loopback only (systemctl reload uses it)",
    "vllm:8000": "vLLM's API, loopback only: Caddy proxies to it",
    "engine:cluster": "vLLM's ranks and engine (gloo, ZMQ) on the cluster address",
    "watchdog:9109": "the watchdog's Prometheus text, loopback only (Prometheus on the head scrapes it)",
    "monitoring:head": "Prometheus (9090), Alertmanager (9093, no gossip port) and node exporter (9100) on the head, loopback only",
    "node-exporter:cluster": "a worker's node exporter (9100) on its cluster address only: the head's Prometheus scrapes it",
    "torch-store": (
        "torch's TCPStore of the TP ranks (port 29501): PyTorch binds its store server to every "
        "address whatever MASTER_ADDR says (measured with torch 2.13, libuv and classic backends); "
        "only a firewall can confine it. Known exposure, kept visible here"
    ),
}


def classify(host: str, sock: dict[str, Any]) -> str | None:
    address, port, process = sock["address"], sock["port"], sock["process"]
    loopback = address in ("127.0.0.1", "::1")
    if process == "sshd" and port == 22:
        return "sshd"
    if process == "caddy" and port == CADDY_PORT and host == HEAD:
        return "caddy:8080"
    if process == "caddy" and port == CADDY_ADMIN_PORT and loopback:
        return "caddy:2019"
    if port == VLLM_PORT and loopback and host == HEAD:
        return "vllm:8000"
    if port == WATCHDOG_PORT and loopback and host == HEAD:
        return "watchdog:9109"
    if process.startswith("prometheus") and port in MONITORING_PORTS and loopback and host == HEAD:
        return "monitoring:head"
    if process.startswith("prometheus-node") and port == 9100 and address == CLUSTER_ADDRESSES[host]:
        return "node-exporter:cluster"
    # The ranks' processes are titled VLLM::Worker_TP*, VLLM::EngineCore or plain
    # python depending on the boot; the cluster link is private either way.
    if process.startswith(("VLLM::", "vllm", "python")) and address == CLUSTER_ADDRESSES[host]:
        return "engine:cluster"
    if port == TORCH_STORE_PORT and address in ("*", "::", "0.0.0.0") and host == HEAD:
        return "torch-store"
    return None


def test_every_listening_socket_is_intended():
    parse = module_utils("ingress._caddy").parse_listening
    unexpected = []
    for host in HOSTS:
        for sock in parse(exec_on(host, "ss", "-Hltnp").stdout):
            if classify(host, sock) is None:
                unexpected.append(f"{host} {sock['address']}:{sock['port']} ({sock['process']})")
    assert not unexpected, "listening, and not intended: " + "; ".join(unexpected)


def test_vllm_api_answers_only_on_loopback():
    sockets = module_utils("ingress._caddy").parse_listening(exec_on(HEAD, "ss", "-Hltnp").stdout)
    api = [s["address"] for s in sockets if s["port"] == VLLM_PORT]
    assert api and set(api) <= {"127.0.0.1", "::1"}, api
    # And from the management network it does not answer at all.
    probe = exec_on(HEAD, "curl", "-sS", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}",
                    "http://10.76.0.11:8000/health", check=False)  # fmt: skip
    assert probe.stdout.strip() == "000", probe.stdout


def test_on_the_controller_the_key_is_only_in_its_two_secret_files():
    """Issue 14: no API key in site.log or any other file the lab wrote, only in the key file
    and the clients' env files (all 0600): opencode's, and one per other client (issue 29)."""
    key = api_key()
    assert key, f"no key in {API_KEY_FILE}"
    lab = LAB_DIR.resolve()
    secrets = {API_KEY_FILE.resolve(), (lab / "opencode" / "env").resolve()}
    secrets |= {path.resolve() for path in (lab / "clients").glob("*/env")}
    skip = {"cache", "vllm-venv", "wheelhouse", "opencode-cli", "clients-cli", "collections", "sanity",
            "models"}
    found = []
    for path in lab.rglob("*"):
        if path.is_symlink() or not path.is_file() or path.resolve() in secrets:
            continue
        if set(path.relative_to(lab).parts[:1]) & skip or path.stat().st_size > 64 * 1024 * 1024:
            continue
        if key.encode() in path.read_bytes():
            found.append(str(path))
    assert not found, f"the API key is in {found}"
    for secret in secrets:
        if secret.exists():
            assert stat.S_IMODE(secret.stat().st_mode) == 0o600, f"{secret} is not 0600"


# --- TLS beyond loopback (issue 27) ---------------------------------------------------------

PUBLISHED = ("127.0.0.1", 18080)


def test_the_ingress_speaks_tls_from_its_internal_ca_and_the_controller_holds_the_ca():
    saved = read_json(HEAD, INGRESS_RESULT)["result"]
    assert saved["tls"]["mode"] == "internal", saved["tls"]
    assert saved["public_url"].startswith("https://") and endpoint().startswith("https://")
    head_ca = exec_on(HEAD, "cat", saved["tls"]["ca_file"]).stdout
    assert INGRESS_CA_FILE.read_text() == head_ca, "the controller's CA copy is not the head's root"
    # The certificate the controller gets names the address it asked for and chains to that root.
    context = ssl.create_default_context(cafile=str(INGRESS_CA_FILE))
    with (
        socket.create_connection(PUBLISHED, timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        cert = tls.getpeercert()
        assert ("IP Address", "127.0.0.1") in cert["subjectAltName"], cert
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_without_the_ca_the_certificate_is_not_trusted():
    context = ssl.create_default_context()  # the system's store only
    with (
        pytest.raises(ssl.SSLCertVerificationError),
        socket.create_connection(PUBLISHED, timeout=10) as raw,
    ):
        context.wrap_socket(raw, server_hostname="127.0.0.1").close()


def test_plain_http_beyond_loopback_is_refused_and_never_reaches_a_route():
    conn = http.client.HTTPConnection(*PUBLISHED, timeout=10)
    try:
        conn.request("GET", f"/{MODEL}/v1/models", headers={"Authorization": f"Bearer {api_key()}"})
        response = conn.getresponse()
        body = response.read().decode("utf-8", "replace")
    finally:
        conn.close()
    assert response.status == 400, (response.status, body[:200])
    assert '"data"' not in body and MODEL not in body
    # Nor does Caddy run a redirect server on port 80 (auto_https disable_redirects).
    listening = module_utils("ingress._caddy").parse_listening(exec_on(HEAD, "ss", "-Hltnp").stdout)
    assert not [s for s in listening if s["port"] == 80], listening
