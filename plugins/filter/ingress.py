# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ingress filters; the rules live in module_utils/ingress/_caddy.py.

- ``ingress_config``: validated routes, the saved result and the Caddyfile for an ingress spec.
- ``ingress_models_from_state``: the served models and upstreams in the head's ``serving.json``.
- ``ingress_key_env_file``: the key file's one line (the key is never repeated in an error);
  with ``next_key`` a second line, the key a rotation brings in.
- ``ingress_listening``: listening sockets parsed from ``ss -Hltnp``.
- ``ingress_exposure``: findings for engine sockets beyond loopback and the cluster address.
- ``ingress_tls_errors``: what is wrong with the operator's certificate and key (openssl's answers).
"""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.ingress import _caddy


def ingress_config(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        return _caddy.config(spec)
    except ValidationError as exc:
        raise AnsibleFilterError(str(exc)) from None


def ingress_models_from_state(text: Any, where: str = "serving.json") -> list[dict[str, Any]]:
    if isinstance(text, (str, bytes)):
        try:
            text = json.loads(text)
        except ValueError as exc:
            raise AnsibleFilterError(
                f"{where} is not JSON ({exc}): run the rollout again (--tags rollout) or set ingress_models"
            ) from None
    try:
        return _caddy.models_from_state(text, where)
    except ValidationError as exc:
        raise AnsibleFilterError(str(exc)) from None


def ingress_key_env_file(key: Any, name: str = "ingress_api_key", next_key: Any = None) -> str:
    try:
        return _caddy.env_file(name, key, next_key)
    except ValidationError as exc:
        raise AnsibleFilterError(str(exc)) from None


def ingress_key_valid(key: Any) -> bool:
    """Whether ``key`` is a key the ingress takes (site.yml's "nothing to do?" must not fail on one)."""
    try:
        _caddy.api_key("ingress_api_key", key)
    except ValidationError:
        return False
    return True


def ingress_tls_errors(checks: dict[str, Any]) -> list[str]:
    """``checks``: ``{cert, key, cert_pubkey, key_pubkey, checkend_rc, enddate}``."""
    if not isinstance(checks, dict):
        raise AnsibleFilterError("ingress_tls_errors expects a mapping")
    return _caddy.tls_pair_errors(
        str(checks.get("cert")), str(checks.get("key")), cert_pubkey=checks.get("cert_pubkey"),
        key_pubkey=checks.get("key_pubkey"), checkend_rc=checks.get("checkend_rc"),
        enddate=checks.get("enddate"),
    )


def ingress_listening(text: Any) -> list[dict[str, Any]]:
    return _caddy.parse_listening(text)


def ingress_exposure(
    sockets: list[dict[str, Any]],
    host: str,
    upstream_ports: list[int],
    cluster_addresses: list[str],
    store_port: int = 29501,
    confined_ports: Any = None,
) -> list[dict[str, Any]]:
    if not isinstance(sockets, list):
        raise AnsibleFilterError("ingress_exposure expects the list ingress_listening returns")
    try:
        ports = [int(p) for p in upstream_ports]
    except (TypeError, ValueError):
        raise AnsibleFilterError(
            f"upstream_ports must be port numbers, got {upstream_ports!r}"
        ) from None
    addresses = [str(a) for a in cluster_addresses if a]
    try:
        confined = [int(p) for p in confined_ports or []]
    except (TypeError, ValueError):
        raise AnsibleFilterError(
            f"confined_ports must be port numbers (firewall_confined), got {confined_ports!r}"
        ) from None
    return _caddy.exposure(
        sockets,
        host=host,
        upstream_ports=ports,
        cluster_addresses=addresses,
        store_port=int(store_port),
        confined_ports=confined,
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "ingress_config": ingress_config,
            "ingress_models_from_state": ingress_models_from_state,
            "ingress_key_env_file": ingress_key_env_file,
            "ingress_key_valid": ingress_key_valid,
            "ingress_listening": ingress_listening,
            "ingress_exposure": ingress_exposure,
            "ingress_tls_errors": ingress_tls_errors,
        }
