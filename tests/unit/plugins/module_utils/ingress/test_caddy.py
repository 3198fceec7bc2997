# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ingress (module_utils/ingress/_caddy.py, filter ingress.py) from case tables in test_caddy.yaml."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.ingress import FilterModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.ingress import _caddy

HERE = Path(__file__).resolve().parent
CASES = yaml.safe_load((HERE / "test_caddy.yaml").read_text())
FILTERS = FilterModule().filters()
MODEL = "localinference/tiny-deepseek"
BASE: dict[str, Any] = {
    "models": [{"name": MODEL, "upstream": {"host": "0.0.0.0", "port": 8000}}],
    "listen_address": "",
    "port": 8080,
    "public_url": "https://127.0.0.1:18080",
    "head": "spark-head",
    "unit": "localinference-vllm.service",
    "upstream_timeout": 3600,
    "dial_timeout": 10,
    "retry_after": 10,
    "key_path": "/etc/localinference/ingress/api-key.env",
    "ca_file": "/home/op/.config/localinference/ingress-ca.crt",
}


def spec(**patch: Any) -> dict[str, Any]:
    return {**copy.deepcopy(BASE), **patch}


def test_routes_a_served_name_with_a_slash_by_path():
    result = _caddy.config(spec())["result"]
    (route,) = result["routes"]
    assert route["prefix"] == "/localinference/tiny-deepseek"
    assert route["base_url"] == "https://127.0.0.1:18080/localinference/tiny-deepseek/v1"
    assert route["upstream"] == "127.0.0.1:8000"  # 0.0.0.0 is reached on loopback
    assert result["endpoint"] == route["base_url"]
    assert result["health_url"] == "https://127.0.0.1:18080/health"
    assert result["key_file"] == BASE["key_path"]


def test_the_caddyfile_holds_what_the_issue_asks():
    text = _caddy.config(spec())["caddyfile"]
    # Caddy 2.6 ends a stream whose handler says flush_interval -1 when its config is
    # reloaded (a key rotation): SSE is flushed token by token without it.
    assert "flush_interval -1" not in text
    assert "response_header_timeout 3600s" in text and "read_timeout 3600s" in text
    # Every upstream connection is closed idle before vLLM's uvicorn closes it (5 s).
    assert text.count("transport http {") == text.count(f"keepalive {_caddy.UPSTREAM_KEEPALIVE_S}s") >= 2
    assert _caddy.UPSTREAM_KEEPALIVE_S < 5
    assert "header_up -Authorization" in text
    assert (
        "@route_0 path /localinference/tiny-deepseek/v1 /localinference/tiny-deepseek/v1/*" in text
    )
    assert "uri strip_prefix /localinference/tiny-deepseek" in text
    # No key in the file: Caddy takes it from its environment when it loads the file
    # (start and reload), so a reload takes a new key.
    assert '"Bearer {$LOCALINFERENCE_INGRESS_API_KEY}"' in text
    assert '"{$LOCALINFERENCE_INGRESS_API_KEY}" != ""' in text  # an unset key refuses everything
    # During a rotation the next key is accepted too, only while it is set.
    assert '"{$LOCALINFERENCE_INGRESS_API_KEY_NEXT}" != "" && ' in text
    assert "{env." not in text
    # vLLM refusing (down, restarting): 503 with Retry-After, a body naming the unit and its log.
    assert "@engine_away expression `{http.error.status_code} == 502`" in text
    assert "header @engine_away Retry-After 10\n" in text
    assert '"type": "service_unavailable", "code": 503}}` 503' in text
    assert "journalctl -u localinference-vllm.service" in text
    assert "on spark-head" in text
    # The key check comes before every model route.
    assert text.index("respond @denied") < text.index("@route_0 path")


def test_the_key_never_reaches_the_caddyfile_or_the_result():
    key = "k" * 40
    built = _caddy.config(spec())
    assert key not in built["caddyfile"] and key not in json.dumps(built["result"])
    assert _caddy.env_file("ingress_api_key", key) == f"LOCALINFERENCE_INGRESS_API_KEY={key}\n"


def test_a_rotation_file_holds_the_key_in_use_first_and_the_next_one():
    old, new = "o" * 40, "n" * 48
    text = FILTERS["ingress_key_env_file"](old, next_key=new)
    assert text == (
        f"LOCALINFERENCE_INGRESS_API_KEY={old}\nLOCALINFERENCE_INGRESS_API_KEY_NEXT={new}\n"
    )
    # Every reader of the key file (watchdog, doctor) keeps the key in use until the last step.
    assert _caddy.key_from_env_file(text, "api-key.env") == old
    with pytest.raises(AnsibleFilterError) as err:
        FILTERS["ingress_key_env_file"](old, next_key="short")
    assert "is 5 characters long" in str(err.value) and "short" not in str(err.value)


def test_longer_routes_come_first():
    models = [
        {"name": "org", "upstream": {"port": 8000}},
        {"name": "org/big", "upstream": {"port": 8001}},
    ]
    text = _caddy.config(spec(models=models))["caddyfile"]
    assert text.index("path /org/big/v1 ") < text.index("path /org/v1 ")


def test_every_rendered_line_is_one_the_renderer_wrote():
    """Structure check: braces balance and no line comes from a value."""
    text = _caddy.config(spec())["caddyfile"]
    depth = 0
    for line in text.splitlines():
        bare = re.sub(r"`[^`]*`", "", line.split("#", 1)[0])
        depth += bare.count("{") - bare.count("}")
        assert depth >= 0, line
    assert depth == 0


@pytest.mark.parametrize("case", CASES["spec_errors"], ids=lambda c: c["case"])
def test_bad_specs_are_refused_naming_the_input(case):
    patch = dict(case.get("patch") or {})
    if "models" in case:
        patch["models"] = case["models"]
    with pytest.raises(ValidationError) as err:
        _caddy.config(spec(**patch))
    assert err.value.name.startswith(case["name"]), str(err.value)
    for text in case["says"]:
        assert text in str(err.value), str(err.value)
    with pytest.raises(AnsibleFilterError, match=re.escape(case["name"])):
        FILTERS["ingress_config"](spec(**patch))


@pytest.mark.parametrize("case", CASES["key_errors"], ids=lambda c: c["case"])
def test_bad_keys_are_refused_without_showing_them(case):
    with pytest.raises(AnsibleFilterError) as err:
        FILTERS["ingress_key_env_file"](case["key"])
    message = str(err.value)
    assert message.startswith("ingress_api_key: ")
    for text in case["says"]:
        assert text in message, message
    if isinstance(case["key"], str) and len(case["key"]) > 3:
        assert case["key"] not in message
        assert case["key"][:8] not in message


@pytest.mark.parametrize("case", CASES["key_errors"], ids=lambda c: c["case"])
def test_a_bad_key_is_not_valid_and_raises_nothing(case):
    """site.yml's "nothing to do?" asks first, so a bad key makes the stages run (and the ingress say why)."""
    assert FILTERS["ingress_key_valid"](case["key"]) is False


def test_a_good_key_is_valid():
    assert FILTERS["ingress_key_valid"]("Zq7sEcr3tV4lue-kEy_0123456789abcdef") is True
    assert FILTERS["ingress_key_valid"]("Zq7sEcr3tV4lue-kEy_0123456789abcdef\n") is True


@pytest.mark.parametrize("case", CASES["sockets"], ids=lambda c: c["case"])
def test_exposure_audit(case):
    sockets = FILTERS["ingress_listening"](case["ss"])
    found = FILTERS["ingress_exposure"](sockets, "spark-head", [8000], ["10.77.0.11"])
    assert [{k: f[k] for k in ("id", "severity", "port")} for f in found] == case["expected"]
    for f in found:
        assert f["message"] and f["fix"] and f["host"] == "spark-head"


def test_models_from_the_head_serving_state():
    state = {"recipe": {"served_model_name": MODEL, "host": "127.0.0.1", "port": 8000}}
    models = FILTERS["ingress_models_from_state"](json.dumps(state))
    assert models == [{"name": MODEL, "upstream": {"host": "127.0.0.1", "port": 8000}}]
    several = {"recipe": {"served_model_name": ["a", "b"], "port": 9000}}
    assert [m["name"] for m in FILTERS["ingress_models_from_state"](several)] == ["a", "b"]


@pytest.mark.parametrize(
    "text",
    ["not json", "[1, 2]", '{"recipe": "x"}', "null"],
    ids=["not json", "a list", "recipe not a mapping", "null"],
)
def test_a_bad_serving_state_is_an_error_not_a_traceback(text):
    with pytest.raises(AnsibleFilterError, match=r"serving\.json.*(rollout|ingress_models)"):
        FILTERS["ingress_models_from_state"](text)


def test_a_bad_served_name_in_the_state_is_refused_at_config():
    state = {"recipe": {"served_model_name": "x\n}", "port": 8000}}
    models = FILTERS["ingress_models_from_state"](state)
    with pytest.raises(AnsibleFilterError, match=r"ingress_models\[0\]\.name"):
        FILTERS["ingress_config"](spec(models=models))


# --- TLS (issue 27 item 4) ----------------------------------------------------------------


def test_beyond_loopback_the_port_speaks_only_tls_from_the_internal_ca():
    built = _caddy.config(spec())
    text, tls = built["caddyfile"], built["result"]["tls"]
    assert tls["mode"] == "internal" and tls["ca_file"] == _caddy.INTERNAL_CA
    assert tls["client_ca_file"] == BASE["ca_file"]
    assert "\ttls internal\n" in text
    # No redirect server on :80, no write to the head's trust store, and a client that
    # connects by IP (no SNI) gets the public host's certificate.
    for option in ("auto_https disable_redirects", "skip_install_trust", "default_sni 127.0.0.1"):
        assert f"\t{option}\n" in text
    site = next(line for line in text.splitlines() if line.endswith(" {") and "https://" in line)
    assert site == "https://127.0.0.1:8080, https://localhost:8080, https://spark-head:8080 {"


def test_a_public_name_and_extra_names_are_certificate_subjects():
    built = _caddy.config(spec(public_url="https://spark.lan:8080", tls_names=["192.168.1.20"]))
    names = built["result"]["tls"]["names"]
    assert names == ["spark.lan", "127.0.0.1", "localhost", "spark-head", "192.168.1.20"]
    assert "default_sni spark.lan" in built["caddyfile"]


def test_on_loopback_only_the_ingress_stays_plain_http():
    built = _caddy.config(spec(listen_address="127.0.0.1", public_url="", ca_file=""))
    assert built["result"]["tls"]["mode"] == "off"
    assert built["result"]["public_url"] == "http://spark-head:8080"
    assert "tls " not in built["caddyfile"] and "auto_https" not in built["caddyfile"]
    assert "\n127.0.0.1:8080 {\n" in built["caddyfile"]


def test_the_operators_certificate_is_served_and_its_ca_trusted():
    built = _caddy.config(spec(
        tls_cert="/etc/caddy/localinference-tls/cert.pem", tls_key="/etc/caddy/localinference-tls/key.pem",
        tls_ca_path="/etc/caddy/localinference-tls/ca.pem",
    ))
    assert built["result"]["tls"]["mode"] == "operator"
    assert built["result"]["tls"]["ca_file"] == "/etc/caddy/localinference-tls/ca.pem"
    assert "\ttls /etc/caddy/localinference-tls/cert.pem /etc/caddy/localinference-tls/key.pem\n" in built["caddyfile"]
    assert "tls internal" not in built["caddyfile"]


@pytest.mark.parametrize("patch, name, says", [
    ({"public_url": "http://127.0.0.1:18080"}, "ingress_public_url", "plain HTTP there is refused"),
    ({"listen_address": "127.0.0.1", "public_url": "https://127.0.0.1:8080"}, "ingress_public_url",
     "plain HTTP on loopback only"),
    ({"ca_file": ""}, "ingress_ca_file", "speaks only TLS"),
    ({"tls_cert": "/etc/c.pem"}, "ingress_tls_key", "give both"),
    ({"tls_key": "/etc/k.pem"}, "ingress_tls_cert", "give both"),
    ({"tls_cert": "/etc/c .pem", "tls_key": "/etc/k.pem"}, "ingress_tls_cert", "' '"),
    ({"tls_names": ["ok.lan", "bad\n}"]}, "ingress_tls_names[1]", "line break"),
    ({"tls_names": ["a/b"]}, "ingress_tls_names[0]", "neither an IP address"),
    ({"tls_names": "spark.lan"}, "ingress_tls_names", "expected a list"),
    ({"ca_file": "relative/ca.crt"}, "ingress_ca_file", "absolute"),
], ids=["http beyond loopback", "https on loopback", "no CA copy", "cert without key",
        "key without cert", "space in cert path", "newline in a name", "slash in a name", "names not a list", "relative CA"])
def test_bad_tls_inputs_are_refused_naming_the_variable(patch, name, says):
    with pytest.raises(ValidationError) as err:
        _caddy.config(spec(**patch))
    assert err.value.name == name, str(err.value)
    assert says in str(err.value)


def test_the_head_reaches_its_own_caddy_over_tls_on_loopback():
    tls = {"mode": "internal", "ca_file": _caddy.INTERNAL_CA}
    assert _caddy.caddy_base(":8080", tls) == "https://127.0.0.1:8080"
    assert _caddy.caddy_ca(tls) == _caddy.INTERNAL_CA
    assert _caddy.caddy_base(":8080", {"mode": "off"}) == "http://127.0.0.1:8080"
    assert _caddy.caddy_ca({"mode": "off"}) is None and _caddy.caddy_ca(None) is None
    assert _caddy.caddy_ca({"mode": "internal", "ca_file": "relative"}) is None


def _openssl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def _pair(tmp: Path, name: str, days: int) -> tuple[Path, Path]:
    cert, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    done = _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-subj", f"/CN={name}", "-days", str(days),
                    "-keyout", str(key), "-out", str(cert), cwd=tmp)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return cert, key


def _expired_pair(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate that ended on 2020-01-01 (openssl 3.0's req cannot make one)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(datetime.datetime(2019, 1, 1))
            .not_valid_after(datetime.datetime(2020, 1, 1)).sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "old.crt", tmp / "old.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _checks(cert: Path, key: Path, tmp: Path) -> dict[str, Any]:
    """What the role's three openssl commands answer, run here for real."""
    cert_pub = _openssl("x509", "-in", str(cert), "-noout", "-pubkey", cwd=tmp)
    key_pub = _openssl("pkey", "-in", str(key), "-pubout", "-passin", "pass:", cwd=tmp)
    end = _openssl("x509", "-in", str(cert), "-noout", "-enddate", "-checkend", "0", cwd=tmp)
    return {"cert": str(cert), "key": str(key),
            "cert_pubkey": cert_pub.stdout if cert_pub.returncode == 0 else None,
            "key_pubkey": key_pub.stdout if key_pub.returncode == 0 else None,
            "checkend_rc": end.returncode, "enddate": end.stdout}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_the_operators_pair_is_checked_with_real_openssl(tmp_path):
    cert, key = _pair(tmp_path, "spark", 30)
    _, other_key = _pair(tmp_path, "other", 30)
    assert FILTERS["ingress_tls_errors"](_checks(cert, key, tmp_path)) == []
    mismatch = FILTERS["ingress_tls_errors"](_checks(cert, other_key, tmp_path))
    assert len(mismatch) == 1 and mismatch[0].startswith("ingress_tls_key: ") and "does not match" in mismatch[0]
    old_cert, old_key = _expired_pair(tmp_path)
    assert FILTERS["ingress_tls_errors"](_checks(old_cert, old_key, tmp_path)) == [
        f"ingress_tls_cert: {old_cert} expired (Jan  1 00:00:00 2020 GMT); renew it and run --tags ingress again"]
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    unread = FILTERS["ingress_tls_errors"](_checks(garbage, garbage, tmp_path))
    assert [e.split(":", 1)[0] for e in unread] == ["ingress_tls_cert", "ingress_tls_key"]
    key_text = key.read_text()
    assert all(key_text.strip() not in e for e in mismatch + unread)
