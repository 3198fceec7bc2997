# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ingress in front of vLLM: routes, the Caddyfile, the API key, the exposure audit.

One route per served model, path-routed: the served name is the path prefix,
so ``localinference/tiny-deepseek`` is served at
``<public_url>/localinference/tiny-deepseek/v1/...`` and an OpenAI client's
base URL is ``<public_url>/localinference/tiny-deepseek/v1``. A served name may
contain ``/`` (one path segment per part); every part is URL-safe as it is
(``A-Z a-z 0-9 . _ ~ -``, RFC 3986 unreserved), so the path needs no
percent-encoding, and no part may be ``.``, ``..`` or ``v1`` (a route
``a`` would otherwise swallow ``a/v1``'s). Caddy matches paths without regard
to case, so two names that differ only in case are refused.

The API key never enters the Caddyfile: it holds ``{$LOCALINFERENCE_INGRESS_API_KEY}``,
which Caddy's Caddyfile adapter replaces when it loads the file - at start and at
each ``caddy reload`` (systemd's ``ExecReload=``) - from the environment systemd (as
root) reads from the key file (mode 0600, owner root, ``EnvironmentFile=``) before
each of those commands. So a new key takes effect with a reload, which keeps the
streams in flight, not a restart, which ends them. A rotation passes through a key
file with two keys (``..._NEXT``, both accepted), so whoever reads the file while
Caddy reloads holds a key Caddy takes. Every value rendered into the Caddyfile passes
a validator first (``_validate`` kinds, or the route-name rule above), so no newline,
brace, quote or backtick can reach it; nor can a key (``api_key``: b64token characters).

Pure functions: no AnsibleModule, unit-tested on their own.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)

KEY_ENV = "LOCALINFERENCE_INGRESS_API_KEY"
# The key being rotated in: accepted too while it is set (only during a rotation).
NEXT_KEY_ENV = KEY_ENV + "_NEXT"
# RFC 6750 b64token characters: safe in an HTTP header, a systemd EnvironmentFile
# line and a CEL string without any quoting.
_KEY_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]")
KEY_MIN, KEY_MAX = 16, 512
_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")
_RESERVED_SEGMENTS = {".", "..", "v1"}
MAX_NAME = 200
_PUBLIC_URL = re.compile(r"(?P<scheme>https?)://(?P<host>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
# Where Caddy keeps its internal CA's root certificate: the role's drop-in sets
# XDG_DATA_HOME, so the path is the same on every head.
CADDY_DATA_HOME = "/var/lib/caddy/.local/share"
INTERNAL_CA = f"{CADDY_DATA_HOME}/caddy/pki/authorities/local/root.crt"
MAX_TIMEOUT = 7 * 24 * 3600
# Seconds a client is told to wait (Retry-After) while the engine refuses connections: the
# openai, Anthropic and AI SDKs follow a Retry-After of at most 60 s (a longer one falls back
# to their own backoff of a second or two).
RETRY_AFTER_MAX = 60
# What the ingress answers with (OpenAI-style error bodies, so clients show the message).
_JSON = "application/json"


def api_key(name: str, value: Any) -> str:
    """The API key, checked without ever repeating it in a message."""
    if not isinstance(value, str):
        raise ValidationError(
            name, f"expected text, got {type(value).__name__}", "set the key as a string"
        )
    value = value.strip("\n")
    if len(value) < KEY_MIN:
        raise ValidationError(
            name,
            f"is {len(value)} characters long (at least {KEY_MIN})",
            "use a longer random key, e.g. `openssl rand -hex 32`",
        )
    if len(value) > KEY_MAX:
        raise ValidationError(
            name, f"is {len(value)} characters long (at most {KEY_MAX})", "use a shorter key"
        )
    for index, char in enumerate(value):
        if not _KEY_CHARS.fullmatch(char):
            shown = (
                "a space"
                if char == " "
                else "a control character"
                if not char.isprintable()
                else repr(char)
            )
            raise ValidationError(
                name,
                f"contains {shown} at position {index} (the key itself is not shown)",
                "use only letters, digits and . _ ~ + / = - (e.g. `openssl rand -hex 32`)",
            )
    return value


def env_file(name: str, value: Any, next_value: Any = None) -> str:
    """The key file's content: one ``LOCALINFERENCE_INGRESS_API_KEY=<key>`` line.

    With ``next_value`` (a rotation's first step) a second line
    ``LOCALINFERENCE_INGRESS_API_KEY_NEXT=<new key>``: Caddy accepts both, and a
    reader of the first line (:func:`key_from_env_file`) still gets the key in use.
    """
    text = f"{KEY_ENV}={api_key(name, value)}\n"
    if next_value is not None:
        text += f"{NEXT_KEY_ENV}={api_key(name, next_value)}\n"
    return text


def route_prefix(name: str, served: Any) -> str:
    """``/localinference/tiny-deepseek`` for the served name ``localinference/tiny-deepseek``."""
    value = validate.text(name, served, max_length=MAX_NAME, strip_ok=False)
    for part in value.split("/"):
        if part == "":
            raise ValidationError(
                name,
                f"{value!r} has an empty path segment (a leading, trailing or doubled '/')",
                "name the model as vLLM's served_model_name, e.g. org/model",
            )
        if part in _RESERVED_SEGMENTS:
            raise ValidationError(
                name,
                f"{value!r} has a segment {part!r}, which the ingress cannot route",
                "rename the served model (served_model_name) without '.', '..' or 'v1' segments",
            )
        bad = next((c for c in part if not _SEGMENT.fullmatch(c)), None)
        if bad is not None:
            index = value.index(bad)
            raise ValidationError(
                name,
                f"contains {bad!r} at position {index}, which is not allowed in a route",
                "use letters, digits, '.', '_', '~', '-' and '/' between parts",
            )
    return "/" + value


def _upstream(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(
            name,
            f"expected a mapping with host and port, got {validate.shown(value)}",
            "set {host, port}",
        )
    host = validate.host(f"{name}.host", value.get("host") or "127.0.0.1")
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    port = validate.port(f"{name}.port", value.get("port"))
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return {"host": host, "port": port, "address": shown}


def models_from_state(state: Any, where: str = "serving.json") -> list[dict[str, Any]]:
    """The models the head serves, from its reconciled state (``serving.json``): never trusted.

    Returns ``[{name, upstream: {host, port}}]``; one entry per served name
    (vLLM accepts a list).
    """
    if not isinstance(state, dict) or not isinstance(state.get("recipe"), dict):
        raise ValidationError(
            where,
            "is not the serve role's state (no recipe mapping)",
            "run the rollout first (--tags rollout) or set ingress_models",
        )
    recipe = state["recipe"]
    names = recipe.get("served_model_name") or recipe.get("model")
    names = names if isinstance(names, list) else [names]
    upstream = {"host": recipe.get("host") or "127.0.0.1", "port": recipe.get("port", 8000)}
    return [{"name": n, "upstream": dict(upstream)} for n in names]


def _loopback_only(listen: str) -> bool:
    return listen != "" and _is_loopback(listen)


def tls_spec(spec: dict[str, Any], *, listen: str, head: str, port: int) -> dict[str, Any]:
    """How the ingress speaks TLS: ``{mode, names, cert, key, ca_file, client_ca_file}``.

    Beyond loopback (an empty ``listen_address`` is every address) the port speaks only
    TLS: Caddy's internal CA (``mode: internal``, its root at :data:`INTERNAL_CA`), or the
    operator's certificate and key (``tls_cert``/``tls_key``, paths on the head; ``mode:
    operator``, the clients trust ``tls_ca`` or the certificate itself). A plain HTTP
    request to it is answered 400 by the TLS server and never reaches a route. On
    loopback only: plain HTTP (``mode: off``). ``names`` are the certificate's subjects:
    the public URL's host, loopback, the head's inventory name, the listen address and
    ``tls_names``.
    """
    cert = validate.path("ingress_tls_cert", spec.get("tls_cert"), allow_empty=True)
    key = validate.path("ingress_tls_key", spec.get("tls_key"), allow_empty=True)
    if bool(cert) != bool(key):
        raise ValidationError(
            "ingress_tls_key" if cert else "ingress_tls_cert",
            "is empty while " + ("ingress_tls_cert" if cert else "ingress_tls_key") + " is set",
            "give both the certificate and its key, or neither (Caddy's internal CA)",
        )
    extra = spec.get("tls_names") or []
    if not isinstance(extra, list):
        raise ValidationError(
            "ingress_tls_names", f"expected a list, got {validate.shown(extra)}",
            "list host names or addresses clients use, e.g. [spark-head.lan, 192.168.1.20]",
        )
    client_ca = validate.path("ingress_ca_file", spec.get("ca_file"), allow_empty=True)
    if _loopback_only(listen):
        return {"mode": "off", "names": [], "cert": "", "key": "", "ca_file": "", "client_ca_file": ""}
    if not client_ca:
        raise ValidationError(
            "ingress_ca_file",
            f"is empty while Caddy listens beyond loopback ({listen or 'every address'}:{port}), "
            "where the ingress speaks only TLS",
            "set ingress_ca_file to a controller path for the CA clients trust, "
            "or ingress_listen_address: 127.0.0.1",
        )
    names = ["127.0.0.1", "localhost", head] + ([listen] if listen and not _wildcard(listen) else [])
    for index, value in enumerate(extra):
        name = validate.host(f"ingress_tls_names[{index}]", value)
        if name not in names:
            names.append(name)
    names = list(dict.fromkeys(names))
    ca_head = spec.get("tls_ca_path") or cert
    return {
        "mode": "operator" if cert else "internal",
        "names": names,
        "cert": cert,
        "key": key,
        "ca_file": validate.path("ingress CA on the head", ca_head) if cert else INTERNAL_CA,
        "client_ca_file": client_ca,
    }


def tls_pair_errors(
    cert: str, key: str, *, cert_pubkey: Any, key_pubkey: Any, checkend_rc: Any, enddate: Any
) -> list[str]:
    """What is wrong with the operator's certificate and key, from openssl's answers.

    ``cert_pubkey``/``key_pubkey``: ``openssl x509 -noout -pubkey`` and ``openssl pkey -pubout``
    (None when openssl could not read the file); ``checkend_rc``/``enddate``: ``openssl x509
    -noout -enddate -checkend 0`` (0: valid now, 1: expired). Messages never quote the key.
    """
    errors: list[str] = []
    if not isinstance(cert_pubkey, str) or "BEGIN PUBLIC KEY" not in cert_pubkey:
        errors.append(f"ingress_tls_cert: {cert} is not a PEM certificate openssl can read; "
                      "give the PEM certificate (chain) of the ingress")
    if not isinstance(key_pubkey, str) or "BEGIN PUBLIC KEY" not in key_pubkey:
        errors.append(f"ingress_tls_key: {key} is not a PEM private key openssl can read "
                      "(an encrypted key is not supported); give the unencrypted PEM key")
    if errors:
        return errors
    if cert_pubkey.strip() != key_pubkey.strip():
        errors.append(f"ingress_tls_key: {key} does not match the certificate {cert} "
                      "(their public keys differ); give the key the certificate was issued for")
    if checkend_rc != 0:
        line = next((x for x in str(enddate or "").splitlines() if x.startswith("notAfter=")), "")
        when = line.partition("=")[2].strip() or "an unreadable date"
        errors.append(f"ingress_tls_cert: {cert} expired ({when}); renew it and run --tags ingress again")
    return errors


def config(spec: dict[str, Any]) -> dict[str, Any]:
    """Validate the ingress spec and return the routes, the result and the Caddyfile.

    ``spec`` keys: ``models`` (``[{name, upstream: {host, port}}]``), ``listen_address``
    (empty: every address), ``port``, ``public_url`` (what clients use; empty:
    ``https://<head>:<port>``, ``http://`` on loopback only), ``head`` (the inventory host,
    named in error bodies), ``unit`` (the server's systemd unit), ``upstream_timeout`` and
    ``dial_timeout`` (seconds), ``retry_after`` (the seconds of the ``Retry-After`` sent with
    the 503 while vLLM refuses connections), ``key_path`` (the node's key file, reported only),
    and the TLS keys of :func:`tls_spec`.
    """
    if not isinstance(spec, dict):
        raise ValidationError(
            "ingress", f"expected a mapping, got {validate.shown(spec)}", "pass a dict"
        )
    head = validate.host("ingress head (inventory_hostname)", spec.get("head"))
    unit = validate.unit_name("ingress_upstream_unit", spec.get("unit"))
    port = validate.port("ingress_port", spec.get("port"))
    listen = validate.host("ingress_listen_address", spec.get("listen_address"), allow_empty=True)
    timeout = validate.integer(
        "ingress_upstream_timeout", spec.get("upstream_timeout"), minimum=1, maximum=MAX_TIMEOUT
    )
    dial = validate.integer(
        "ingress_dial_timeout", spec.get("dial_timeout"), minimum=1, maximum=600
    )
    retry_after = validate.integer(
        "ingress_retry_after", spec.get("retry_after"), minimum=1, maximum=RETRY_AFTER_MAX
    )
    key_path = validate.path("ingress_key_path", spec.get("key_path"))
    tls = tls_spec(spec, listen=listen, head=head, port=port)
    public, public_host = _public_url(spec.get("public_url"), tls, head=head, port=port)
    models = spec.get("models")
    routes = _routes(models, public)
    site = f"{'[' + listen + ']' if ':' in listen else listen}:{port}" if listen else f":{port}"
    result = {
        "listen": site,
        # How clients reach it: the CA they trust (ca_file on the head, client_ca_file on
        # the controller), empty with mode off.
        "tls": {k: tls[k] for k in ("mode", "names", "ca_file", "client_ca_file")},
        "public_url": public,
        "health_url": f"{public}/health",
        "key_file": key_path,
        "key_env": KEY_ENV,
        "unit": unit,
        "routes": sorted(routes, key=lambda r: r["prefix"]),
        "base_urls": {r["model"]: r["base_url"] for r in routes},
        # The first model listed: what a client that needs one URL uses.
        "endpoint": f"{public}{route_prefix('ingress_models[0].name', models[0]['name'])}/v1",
        "upstream_timeout": timeout,
        # The Retry-After of the 503 a client gets while vLLM is down or restarting.
        "retry_after": retry_after,
    }
    return {
        "result": result,
        "caddyfile": caddyfile(
            routes, site=site, head=head, unit=unit, timeout=timeout, dial=dial, tls=tls, port=port,
            default_sni=public_host, retry_after=retry_after,
        ),
    }


def _public_url(given: Any, tls: dict[str, Any], *, head: str, port: int) -> tuple[str, str]:
    """``(public URL, its host)``: what clients use, checked against the TLS mode.

    With TLS the public host joins the certificate's names (``tls["names"]``, first).
    """
    scheme = "http" if tls["mode"] == "off" else "https"
    public = given or f"{scheme}://{head}:{port}"
    public = validate.text("ingress_public_url", public, max_length=300, strip_ok=False).rstrip("/")
    match = _PUBLIC_URL.fullmatch(public)
    if match is None:
        raise ValidationError(
            "ingress_public_url",
            f"{public!r} is not a base URL",
            f"use scheme, host and port only, e.g. {scheme}://10.0.0.5:{port}",
        )
    if match.group("scheme") != scheme:
        raise ValidationError(
            "ingress_public_url",
            f"{public!r} is {match.group('scheme')}:// but the ingress speaks "
            + ("only TLS beyond loopback (plain HTTP there is refused)" if scheme == "https"
               else "plain HTTP on loopback only"),
            f"use {scheme}://{public.split('://', 1)[1]}",
        )
    if tls["mode"] != "off":
        public_host = validate.host("ingress_public_url (its host)", match.group("host"))
        if public_host not in tls["names"]:
            tls["names"].insert(0, public_host)
    return public, match.group("host").strip("[]")


def _routes(models: Any, public: str) -> list[dict[str, Any]]:
    """One route per served model, longest prefix first; names that collide are refused."""
    if not isinstance(models, list) or not models:
        raise ValidationError(
            "ingress_models",
            f"expected a non-empty list, got {validate.shown(models)}",
            "list the served models, or leave it empty to read the head's serving state",
        )
    routes: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for index, model in enumerate(models):
        where = f"ingress_models[{index}]"
        if not isinstance(model, dict):
            raise ValidationError(
                where, f"expected a mapping, got {validate.shown(model)}", "set {name, upstream}"
            )
        prefix = route_prefix(f"{where}.name", model.get("name"))
        if prefix.lower() in seen:
            raise ValidationError(
                f"{where}.name",
                f"{model['name']!r} has the same route as {seen[prefix.lower()]!r} (Caddy matches paths regardless of case)",
                "give every served model a distinct name",
            )
        seen[prefix.lower()] = model["name"]
        upstream = _upstream(f"{where}.upstream", model.get("upstream"))
        routes.append(
            {
                "model": model["name"],
                "prefix": prefix,
                "base_url": f"{public}{prefix}/v1",
                "health_url": f"{public}{prefix}/health",
                "upstream": upstream["address"],
                "upstream_port": upstream["port"],
            }
        )
    # Longest prefix first: a route never hides a longer one it is a prefix of.
    routes.sort(key=lambda r: (-len(r["prefix"]), r["prefix"]))
    return routes


def _json_error(message: str, status: int | str, code: str) -> str:
    # Backquoted Caddyfile token: the message is built only from validated parts
    # and this module's own words (no backquote can appear).
    return (
        '`{"error": {"message": "'
        + message
        + '", "type": "'
        + code
        + '", "code": '
        + str(status)
        + "}}`"
    )


def _site(site: str, tls: dict[str, Any] | None, port: int, default_sni: str) -> tuple[list[str], str, list[str]]:
    """The global options, the site address and its ``tls`` line(s) for ``tls`` (:func:`tls_spec`).

    With TLS the site names every certificate subject on the port (Caddy issues or loads one
    certificate per name); a client that connects by IP address sends no SNI and gets the
    public host's certificate (``default_sni``). No redirect server on port 80, no attempt to
    install the internal root in the head's own trust store.
    """
    if not tls or tls["mode"] == "off":
        return [], site, []
    options = ["\tauto_https disable_redirects", "\tskip_install_trust", f"\tdefault_sni {default_sni}"]
    address = ", ".join(f"https://{'[' + n + ']' if ':' in n else n}:{port}" for n in tls["names"])
    if tls["mode"] == "internal":
        lines = ["\t# Caddy's internal CA: clients trust its root (NODE_EXTRA_CA_CERTS, ingress_ca_file).",
                 "\ttls internal"]
    else:
        lines = ["\t# The operator's certificate and key (ingress_tls_cert, ingress_tls_key).",
                 f"\ttls {tls['cert']} {tls['key']}"]
    return options, address, lines


def caddyfile(
    routes: list[dict[str, Any]], *, site: str, head: str, unit: str, timeout: int, dial: int,
    tls: dict[str, Any] | None = None, port: int = 0, default_sni: str = "", retry_after: int = 10,
) -> str:
    """The whole Caddyfile; ``routes`` come from :func:`config` (validated, longest first)."""
    options, address, tls_lines = _site(site, tls, port, default_sni)
    lines = [
        "# Managed by localinference.vllm (role ingress); the next run replaces it.",
        "# The API key is not in this file: Caddy takes it from the environment",
        f"# ({KEY_ENV}) when it loads this file; systemd reads the 0600 key file.",
        "{",
        "\tadmin localhost:2019",
        *options,
        "}",
        "",
        f"{address} {{",
        *tls_lines,
        "\troute {",
        "\t\t# Caddy's own liveness, without the key.",
        "\t\t@health path /health",
        "\t\trespond @health `ok` 200",
    ]
    for index, route in enumerate(routes):
        lines += _health_route(index, route, dial)
    lines += _key_check()
    for index, route in enumerate(routes):
        lines += _model_route(index, route, dial, timeout)
    names = ", ".join(r["prefix"][1:] for r in sorted(routes, key=lambda r: r["prefix"]))
    lines += [
        f"\t\theader Content-Type {_JSON}",
        "\t\trespond "
        + _json_error(
            f"no such route: use /<model>/v1/... with a served model ({names})", 404, "not_found"
        )
        + " 404",
        "\t}",
        *_upstream_errors(head, unit, retry_after),
        "}",
    ]
    return "\n".join(lines) + "\n"


# vLLM's API server (uvicorn) closes a keep-alive connection idle for 5 s
# (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); Caddy keeps an idle upstream connection 2 min by default,
# so a request Caddy sends into a connection vLLM is closing at that moment fails (a POST
# is not retried). Caddy closes its idle ones first.
UPSTREAM_KEEPALIVE_S = 4


def _health_route(index: int, route: dict[str, Any], dial: int) -> list[str]:
    """A model's vLLM /health, without the key."""
    return [
        f"\t\t# {route['model']}: vLLM's /health, without the key.",
        f"\t\t@health_{index} path {route['prefix']}/health",
        f"\t\thandle @health_{index} {{",
        f"\t\t\tvars ingress_model {route['prefix'][1:]}",
        f"\t\t\tvars ingress_upstream {route['upstream']}",
        "\t\t\trewrite * /health",
        f"\t\t\treverse_proxy {route['upstream']} {{",
        "\t\t\t\ttransport http {",
        f"\t\t\t\t\tdial_timeout {dial}s",
        "\t\t\t\t\tresponse_header_timeout 30s",
        f"\t\t\t\t\tkeepalive {UPSTREAM_KEEPALIVE_S}s",
        "\t\t\t\t}",
        "\t\t\t}",
        "\t\t}",
    ]


def _key_check() -> list[str]:
    """Everything after the health routes needs the current or the next key."""
    # {$NAME} is replaced when the Caddyfile is adapted (start and reload), not at
    # run time like {env.NAME}: a reload then takes a new key. An unset key is
    # empty and refuses everything; the next key counts only while it is set.
    header = "{http.request.header.Authorization}"
    auth = (
        f'`"{{${KEY_ENV}}}" != "" && ({header} == "Bearer {{${KEY_ENV}}}"'
        f' || ("{{${NEXT_KEY_ENV}}}" != "" && {header} == "Bearer {{${NEXT_KEY_ENV}}}"))`'
    )
    return [
        "\t\t# Everything else needs the key; a request without it never reaches vLLM.",
        f"\t\t@denied not expression {auth}",
        '\t\theader @denied WWW-Authenticate `Bearer realm="localinference"`',
        f"\t\theader @denied Content-Type {_JSON}",
        "\t\trespond @denied "
        + _json_error(
            "missing or wrong API key: send the header Authorization: Bearer <key>",
            401,
            "invalid_api_key",
        )
        + " 401",
    ]


def _model_route(index: int, route: dict[str, Any], dial: int, timeout: int) -> list[str]:
    """A model's API (and /metrics) behind the key, its prefix stripped, streams unbuffered."""
    prefix = route["prefix"]
    return [
        # /metrics too (behind the key): qualification reads the engine's counters
        f"\t\t@route_{index} path {prefix}/v1 {prefix}/v1/* {prefix}/metrics",
        f"\t\thandle @route_{index} {{",
        f"\t\t\tvars ingress_model {prefix[1:]}",
        f"\t\t\tvars ingress_upstream {route['upstream']}",
        f"\t\t\turi strip_prefix {prefix}",
        f"\t\t\treverse_proxy {route['upstream']} {{",
        "\t\t\t\t# The key stops here; vLLM runs without one on loopback.",
        "\t\t\t\theader_up -Authorization",
        # Caddy flushes an SSE or unsized answer at once by itself; an explicit
        # flush_interval -1 would tie the stream to the config and a reload
        # (a key rotation) would cut it (Caddy 2.6).
        "\t\t\t\t# Streams (SSE) are flushed token by token as they are; an explicit",
        "\t\t\t\t# flush interval of -1 would make a reload end the streams in flight.",
        "\t\t\t\ttransport http {",
        f"\t\t\t\t\tdial_timeout {dial}s",
        "\t\t\t\t\t# A long prefill sends nothing for minutes (1,028 s to the",
        "\t\t\t\t\t# first token of a 900K-token prompt on a Spark pair).",
        f"\t\t\t\t\tresponse_header_timeout {timeout}s",
        f"\t\t\t\t\tread_timeout {timeout}s",
        "\t\t\t\t\t# vLLM closes a connection idle for 5 s: close it first, never reuse a closed one.",
        f"\t\t\t\t\tkeepalive {UPSTREAM_KEEPALIVE_S}s",
        "\t\t\t\t}",
        "\t\t\t}",
        "\t\t}",
    ]


def _upstream_errors(head: str, unit: str, retry_after: int) -> list[str]:
    """Caddy's own errors on a route, as OpenAI-style JSON naming the model, the head and how to look.

    Caddy's reverse proxy answers 502 when the round trip fails without an answer: the
    connection is refused (vLLM stopped, still binding, restarting under the watchdog or a
    rollout) or closed before the response headers (the engine died under the request).
    That becomes ``503`` with ``Retry-After`` at once, which agent clients (the openai and
    AI SDKs, Claude Code) wait out and retry. A hang is not that: vLLM's silence runs into
    ``response_header_timeout`` (504, left to the watchdog, which restarts a wedged engine),
    and a status vLLM itself answers passes through untouched.
    """
    look = (
        f"Look at {unit} on {head}: systemctl status {unit}; "
        f"journalctl -u {unit} -n 200 --no-pager"
    )
    model = "the vLLM server for model {vars.ingress_model} ({vars.ingress_upstream} on " + head + ")"
    return [
        "\thandle_errors {",
        "\t\t# Refused or dropped by vLLM (down, starting, restarting): tell the client to wait.",
        "\t\t@engine_away expression `{http.error.status_code} == 502`",
        f"\t\theader @engine_away Retry-After {retry_after}",
        f"\t\theader @engine_away Content-Type {_JSON}",
        "\t\trespond @engine_away "
        + _json_error(
            f"{model} is not accepting connections: the engine is down, starting or restarting. "
            f"Retry after {retry_after} s. {look}",
            503,
            "service_unavailable",
        )
        + " 503",
        "\t\t@upstream_down expression `{http.error.status_code} in [503, 504]`",
        f"\t\theader @upstream_down Content-Type {_JSON}",
        "\t\trespond @upstream_down "
        + _json_error(
            f"{model} did not answer in time: it is hung or unreachable. {look}",
            "{http.error.status_code}",
            "upstream_unavailable",
        )
        + " {http.error.status_code}",
        "\t\trespond `{http.error.status_code} {http.error.status_text}` {http.error.status_code}",
        "\t}",
    ]


# --- exposure audit -----------------------------------------------------------

_SS_LINE = re.compile(r"^(?:LISTEN\s+)?\d+\s+\d+\s+(?P<local>\S+)\s+\S+(?:\s+(?P<process>.*))?$")
_PROCESS = re.compile(r'\(\("(?P<name>[^"]*)"')


def parse_listening(text: Any) -> list[dict[str, Any]]:
    """Listening TCP sockets from ``ss -Hltnp`` (or ``ss -ltnp``): ``{address, port, process}``.

    Lines that do not parse are skipped; garbage never raises.
    """
    sockets: list[dict[str, Any]] = []
    if not isinstance(text, str):
        return sockets
    for line in text.splitlines():
        match = _SS_LINE.match(line.strip())
        if match is None:
            continue
        address, _, port = match.group("local").rpartition(":")
        if not port.isdigit() or not address:
            continue
        address = address.strip("[]").split("%", 1)[0]
        process = _PROCESS.search(match.group("process") or "")
        sockets.append(
            {
                "address": address,
                "port": int(port),
                "process": process.group("name") if process else "",
            }
        )
    return sockets


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _wildcard(address: str) -> bool:
    return address in ("*", "0.0.0.0", "::")


# Engine and Ray processes: these must listen on loopback or the cluster address only.
_ENGINE = re.compile(r"^(vllm|VLLM::|python|ray|raylet|gcs_server|ray::)", re.IGNORECASE)


def exposure(
    sockets: list[dict[str, Any]],
    *,
    host: str,
    upstream_ports: list[int],
    cluster_addresses: list[str],
    store_port: int = 29501,
    confined_ports: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Findings for engine sockets reachable beyond loopback and the cluster link.

    - an upstream (vLLM API) port on any other address: ``error`` (the key is bypassed);
    - torch's TCPStore (``store_port``) on the wildcard: ``warning`` (PyTorch binds its
      store server to every address whatever MASTER_ADDR says; a firewall must confine it);
    - any other engine or Ray socket on another address: ``error``.

    A port in ``confined_ports`` (the serve role's nftables table, ``_firewall.confined_ports``)
    answers only loopback and the cluster's addresses whatever it binds: no finding.
    """
    allowed = set(cluster_addresses)
    confined = set(confined_ports or [])
    found: list[dict[str, Any]] = []
    for sock in sockets:
        address, port, process = sock["address"], sock["port"], sock["process"]
        if _is_loopback(address) or address in allowed or port in confined:
            continue
        where = f"{address}:{port}" if ":" not in address else f"[{address}]:{port}"
        if port in upstream_ports:
            found.append(
                finding(
                    "ingress-bypass",
                    "error",
                    f"vLLM's API listens on {where} on {host} ({process or 'unknown process'}): "
                    "anyone who reaches this address talks to the model without the ingress key",
                    "bind vLLM to loopback (vllm_recipe.host: 127.0.0.1) and roll out again "
                    "(--tags rollout)",
                    host=host,
                    address=address,
                    port=port,
                )
            )
        # The store is served by whichever rank-0 process holds it: its title is
        # VLLM::EngineCore on one boot and plain python on another.
        elif port == store_port and _wildcard(address):
            found.append(
                finding(
                    "torch-store-wildcard",
                    "warning",
                    f"torch's distributed store of the TP ranks listens on {where} on {host}: "
                    "PyTorch's TCPStore server binds every address (MASTER_ADDR only tells clients "
                    "where to connect)",
                    "confine it with the serve role's firewall (serve_firewall: true, then "
                    "--tags rollout,ingress)",
                    host=host,
                    address=address,
                    port=port,
                )
            )
        elif process and _ENGINE.match(process):
            found.append(
                finding(
                    "engine-exposed",
                    "error",
                    f"{process} listens on {where} on {host}, outside loopback and the cluster "
                    f"address ({', '.join(sorted(allowed)) or 'none known'})",
                    "bind it to loopback or the cluster address",
                    host=host,
                    address=address,
                    port=port,
                )
            )
    return found


# --- read back on the head: the key file and Caddy's own address (doctor, watchdog) ---

def key_from_env_file(text: str, path: str) -> str:
    """The key of the ingress's env file (one ``LOCALINFERENCE_INGRESS_API_KEY=<key>`` line).

    Raises ValueError with a message that never contains the key.
    """
    line = next((raw for raw in text.splitlines() if raw.strip()), "")
    name, sep, value = line.partition("=")
    if not sep or name.strip() != KEY_ENV:
        raise ValueError(
            f"{path} does not start with a {KEY_ENV}=<key> line: run the ingress stage "
            "(--tags ingress) to write it"
        )
    try:
        return api_key(path, value.strip())
    except ValidationError as exc:
        raise ValueError(f"{exc} (run --tags ingress to write it again)") from None


def caddy_base(listen: Any, tls: Any = None) -> str | None:
    """``http(s)://HOST:PORT`` at which the head reaches its own Caddy (``listen`` and ``tls`` of
    ingress.json): ``https://127.0.0.1:PORT`` when the ingress speaks TLS (its certificate names
    loopback; :func:`caddy_ca` is the CA to trust)."""
    if not isinstance(listen, str) or ":" not in listen:
        return None
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if caddy_ca(tls):
        return f"https://127.0.0.1:{port}"
    host = host.strip("[]") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def caddy_ca(tls: Any) -> str | None:
    """The CA file on the head that the ingress's certificate chains to (None: plain HTTP)."""
    if not isinstance(tls, dict) or tls.get("mode") in (None, "off"):
        return None
    path = tls.get("ca_file")
    return path if isinstance(path, str) and path.startswith("/") and "\n" not in path else None
