# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The monitoring's configuration: scrape targets, prometheus.yml, alertmanager.yml, ARGS.

Debian's ``prometheus``, ``prometheus-alertmanager`` and ``prometheus-node-exporter``
read their command line from ``ARGS=`` in ``/etc/default/<package>``; systemd
splits ``$ARGS`` on white space, so every word here is checked to hold none, and
no quote, ``$`` or backslash. Everything else reaches YAML files as data (the
filter dumps it), after the validators of ``_validate`` have checked it and named
the option.

vLLM is scraped at each node's own API (``serving.json``'s ``recipe.host`` and
``recipe.port``), never through the ingress; a headless rank (mp, node rank > 0)
and a Ray worker run no API server and are no vLLM target.

Pure functions: no AnsibleModule, unit-tested on their own.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.monitoring import (
    _rules as rules,
)

JOB_PROMETHEUS = "prometheus"
JOB_ALERTMANAGER = "alertmanager"
RECEIVER = "operator"
MAX_SCRAPE_TIMEOUT_S = 10
_WILDCARDS = {"", "0.0.0.0", "::"}
_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!&'()*+,;=%]+")
_FIX_TARGET = "write host:port, e.g. 10.77.0.12:8000 or [fd00::2]:8000"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def address(name: str, value: Any, *, allow_wildcard: bool = False) -> tuple[str, int]:
    """``(host, port)`` of ``host:port`` (``[v6]:port``; ``:port`` is every address when allowed)."""
    text = validate.text(name, value, max_length=300, strip_ok=False)
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValidationError(name, f"{text!r} has no port", _FIX_TARGET)
    if host.startswith("[") != host.endswith("]"):
        raise ValidationError(name, f"{text!r} has an unbalanced bracket", _FIX_TARGET)
    if host.startswith("["):
        host = host[1:-1]
    elif ":" in host:
        raise ValidationError(name, f"{text!r}: an IPv6 address needs brackets", _FIX_TARGET)
    if host in _WILDCARDS:
        if not allow_wildcard:
            raise ValidationError(
                name, f"{text!r} names no single host", "name the address to scrape"
            )
    else:
        host = validate.host(name, host)
    return host, validate.port(name, port)


def webhook_url(name: str, value: Any) -> str:
    """An http(s) URL for Alertmanager's webhook receiver (empty: none)."""
    if value in (None, ""):
        return ""
    text = validate.text(name, value, max_length=2000, strip_ok=False)
    bad = next((i for i, c in enumerate(text) if not _URL_CHARS.fullmatch(c)), None)
    if bad is not None:
        raise ValidationError(
            name,
            f"contains {text[bad]!r} at position {bad}",
            "percent-encode it: a URL is letters, digits and -._~:/?#[]@!&'()*+,;=%",
        )
    parts = urllib.parse.urlsplit(text)
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError as exc:
        raise ValidationError(name, f"{text!r}: {exc}", "use a port 1-65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError(
            name,
            f"{text!r} is not an http or https URL",
            "use http(s)://host[:port]/path, e.g. https://hooks.example.net/alertmanager",
        )
    return text


def _argv_word(name: str, value: str) -> str:
    """One word of ``ARGS=`` (systemd splits on white space, reads quotes and ``$``)."""
    return validate.systemd_value(name, value, allow_empty=True)


def vllm_targets(
    states: Any, head: str, path: str = "/etc/localinference/serving.json"
) -> list[dict[str, str]]:
    """``[{node, target}]``: every node's vLLM API from its ``serving.json`` (never trusted).

    ``states`` maps each node to its document (``None``: no file). The head
    scrapes its own API over loopback; another node's API must listen on an
    address the head reaches (its cluster address), not on loopback.
    """
    if not isinstance(states, dict) or not states:
        raise ValidationError(
            "monitoring serving states", f"expected a mapping of nodes, got {validate.shown(states)}",
            "pass {node: serving.json document}",
        )
    targets = []
    for node, document in states.items():
        where = f"{path} on {node}"
        fix = "run the rollout first (--tags rollout), or list monitoring_vllm_targets"
        if document is None:
            raise ValidationError(where, "is missing or unreadable", fix)
        if not isinstance(document, dict) or document.get("schema") != 1:
            raise ValidationError(where, "is not the serve role's state (schema 1)", fix)
        recipe, placed = document.get("recipe"), document.get("node")
        if not isinstance(recipe, dict) or not isinstance(placed, dict):
            raise ValidationError(where, "has no recipe or node mapping", fix)
        argv = document.get("server_argv")
        if argv is None or (isinstance(argv, list) and "--headless" in argv):
            continue  # a Ray worker or a headless rank: no API server, no /metrics
        if not isinstance(argv, list):
            raise ValidationError(where, "server_argv is not a list", fix)
        host = recipe.get("host") or ""
        host = "" if host in _WILDCARDS else validate.host(f"{where}: recipe.host", host)
        port = validate.port(f"{where}: recipe.port", recipe.get("port", 8000))
        if node == head:
            host = "127.0.0.1" if host == "" else host
        elif host == "":
            host = validate.host(f"{where}: node.address", placed.get("address"))
        elif _is_loopback(host):
            raise ValidationError(
                where,
                f"vLLM's API listens on {host} only, which Prometheus on {head} cannot reach",
                "serve it on the node's cluster address, or list monitoring_vllm_targets",
            )
        targets.append({"node": str(node), "target": host_port(host, port)})
    return targets


def explicit_targets(name: str, value: Any) -> list[dict[str, str]]:
    """``monitoring_vllm_targets``: ``host:port`` strings or ``{target, node}`` mappings."""
    if not isinstance(value, list):
        raise ValidationError(name, f"expected a list, got {validate.shown(value)}", _FIX_TARGET)
    targets = []
    for index, item in enumerate(value):
        label = f"{name}[{index}]"
        node = None
        if isinstance(item, dict):
            unknown = sorted(str(k) for k in item if k not in ("target", "node"))
            if unknown:
                raise ValidationError(label, f"has unknown keys {unknown}", "use target and node")
            node, item = item.get("node"), item.get("target")
        host, port = address(f"{label}.target" if node is not None else label, item)
        node = host if node is None else validate.host(f"{label}.node", node)
        targets.append({"node": node, "target": host_port(host, port)})
    return targets


def _static(targets: list[dict[str, str]], labelled: bool = True) -> list[dict[str, Any]]:
    if not labelled:
        return [{"targets": [t["target"] for t in targets]}]
    return [{"targets": [t["target"]], "labels": {"node": t["node"]}} for t in targets]


def config(spec: Any) -> dict[str, Any]:
    """Validate the monitoring spec; return prometheus.yml, alertmanager.yml, ARGS and the result.

    ``spec`` keys: ``head``, ``prometheus_listen``, ``alertmanager_listen``,
    ``scrape_interval``, ``evaluation_interval``, ``retention``, ``vllm_targets``
    (``[{node, target}]``), ``node_exporter_port``, ``node_exporter_nodes``
    (``[{node, address}]``, the head first), ``watchdog_target`` (empty: none),
    ``webhook_url``, ``rules_path``, ``prometheus_config``, ``alertmanager_config``,
    and the rule options of ``_rules.rules_spec``.
    """
    if not isinstance(spec, dict):
        raise ValidationError("monitoring", f"expected a mapping, got {validate.shown(spec)}", "pass a dict")
    head = validate.host("monitoring head (inventory_hostname)", spec.get("head"))
    (prom_host, prom_port), (am_host, am_port) = _listens(spec)
    interval = rules.duration("monitoring_scrape_interval", spec.get("scrape_interval"), maximum=3600)
    evaluation = rules.duration(
        "monitoring_evaluation_interval", spec.get("evaluation_interval"), maximum=3600
    )
    retention = rules.duration("monitoring_retention", spec.get("retention"), maximum=10 * 365 * 86400)
    timeout = interval if rules.seconds_of(interval) < MAX_SCRAPE_TIMEOUT_S else f"{MAX_SCRAPE_TIMEOUT_S}s"
    paths = {
        key: validate.path(f"monitoring {key}", spec.get(key))
        for key in ("rules_path", "prometheus_config", "alertmanager_config")
    }
    watchdog = spec.get("watchdog_target") or ""
    if watchdog:
        watchdog = host_port(*address("monitoring_watchdog_target", watchdog))
    checked_rules = rules.rules_spec(
        {key: spec.get(key) for key in rules.DEFAULTS} | {"watchdog": bool(watchdog), "watchdog_target": watchdog}
    )
    vllm = _vllm_targets(spec.get("vllm_targets"))
    node_exporters, exporter_args = _node_exporters(spec, head)
    prom_target = host_port("127.0.0.1" if prom_host in _WILDCARDS else prom_host, prom_port)
    am_target = host_port("127.0.0.1" if am_host in _WILDCARDS else am_host, am_port)
    scrape = [
        {"job_name": JOB_PROMETHEUS, "static_configs": [{"targets": [prom_target]}]},
        {"job_name": JOB_ALERTMANAGER, "static_configs": [{"targets": [am_target]}]},
        {"job_name": rules.JOB_NODE, "static_configs": _static(node_exporters)},
    ]
    if vllm:
        scrape.append({"job_name": rules.JOB_VLLM, "static_configs": _static(vllm)})
    if watchdog:
        # No node label: the watchdog's own series carry one (the node they describe).
        scrape.append({"job_name": rules.JOB_WATCHDOG, "static_configs": [{"targets": [watchdog]}]})
    prometheus = {
        "global": {"scrape_interval": interval, "scrape_timeout": timeout, "evaluation_interval": evaluation},
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am_target]}]}]},
        "rule_files": [paths["rules_path"]],
        "scrape_configs": scrape,
    }
    url = webhook_url("monitoring_webhook_url", spec.get("webhook_url"))
    args = _args(
        paths, retention, host_port(prom_host, prom_port), host_port(am_host, am_port)
    ) | {"node_exporter": exporter_args}
    return {
        "prometheus": prometheus,
        "alertmanager": _alertmanager(url),
        "args": args,
        "rules": checked_rules,
        "result": {
            "scrape_interval_s": rules.seconds_of(interval),
            "prometheus_url": f"http://{prom_target}",
            "alertmanager_url": f"http://{am_target}",
            "targets": {
                rules.JOB_VLLM: vllm,
                rules.JOB_NODE: node_exporters,
                rules.JOB_WATCHDOG: [{"target": watchdog}] if watchdog else [],
            },
            "alerts": [alert.name for alert in rules.alerts(checked_rules)],
            "rules_path": paths["rules_path"],
            "webhook": bool(url),
        },
    }


def _listens(spec: dict[str, Any]) -> tuple[tuple[str, int], tuple[str, int]]:
    """Prometheus's and Alertmanager's ``(host, port)``; they may not share a port."""
    prom_host, prom_port = address(
        "monitoring_prometheus_listen", spec.get("prometheus_listen"), allow_wildcard=True
    )
    am_host, am_port = address(
        "monitoring_alertmanager_listen", spec.get("alertmanager_listen"), allow_wildcard=True
    )
    if prom_port == am_port and (prom_host == am_host or {prom_host, am_host} & _WILDCARDS):
        raise ValidationError(
            "monitoring_alertmanager_listen", f"port {am_port} is Prometheus's too",
            "give Prometheus and Alertmanager different ports",
        )
    return (prom_host, prom_port), (am_host, am_port)


def _vllm_targets(vllm: Any) -> list[dict[str, str]]:
    if not isinstance(vllm, list) or not all(
        isinstance(t, dict) and set(t) == {"node", "target"} for t in vllm
    ):
        raise ValidationError(
            "monitoring vllm targets", f"expected [{{node, target}}], got {validate.shown(vllm)}",
            "set monitoring_vllm_targets or let the role read serving.json",
        )
    return vllm


def _node_exporters(spec: dict[str, Any], head: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """``([{node, target}], {node: ARGS})``: each node's exporter on its cluster address."""
    ne_port = validate.port("monitoring_node_exporter_port", spec.get("node_exporter_port"))
    ne_nodes = spec.get("node_exporter_nodes")
    if not isinstance(ne_nodes, list) or not ne_nodes:
        raise ValidationError(
            "monitoring node exporter nodes", f"expected [{{node, address}}], got {validate.shown(ne_nodes)}",
            "the head at least",
        )
    node_exporters, exporter_args = [], {}
    for item in ne_nodes:
        node = validate.host("monitoring node exporter node", (item or {}).get("node"))
        host = validate.host(f"cluster address of {node} (fabric.json primary_ip)", item.get("address"))
        if node != head and (_is_loopback(host) or host in _WILDCARDS):
            raise ValidationError(
                f"cluster address of {node}", f"{host!r} is not reachable from {head}",
                "run the fabric stage on it (--tags fabric)",
            )
        listen = host_port(host, ne_port)
        node_exporters.append({"node": node, "target": listen})
        exporter_args[node] = f"--web.listen-address={_argv_word('monitoring_node_exporter_port', listen)}"
    return node_exporters, exporter_args


def _alertmanager(url: str) -> dict[str, Any]:
    """alertmanager.yml: one receiver, the webhook when one is set."""
    receiver: dict[str, Any] = {"name": RECEIVER}
    if url:
        receiver["webhook_configs"] = [{"url": url, "send_resolved": True}]
    return {
        "route": {
            "receiver": RECEIVER,
            "group_by": ["alertname", "node"],
            "group_wait": "10s",
            "group_interval": "1m",
            "repeat_interval": "4h",
        },
        "receivers": [receiver],
    }


def _args(paths: dict[str, str], retention: str, prom_listen: str, am_listen: str) -> dict[str, Any]:
    """The ARGS= line of Prometheus's and Alertmanager's environment files."""
    words = {
        "prometheus": [
            f"--config.file={paths['prometheus_config']}",
            f"--web.listen-address={prom_listen}",
            f"--storage.tsdb.retention.time={retention}",
        ],
        # --cluster.listen-address= : no gossip port (0.0.0.0:9094 by default) for one Alertmanager.
        "alertmanager": [
            f"--config.file={paths['alertmanager_config']}",
            f"--web.listen-address={am_listen}",
            "--cluster.listen-address=",
        ],
    }
    return {name: " ".join(_argv_word(f"monitoring ARGS of {name}", w) for w in ws) for name, ws in words.items()}


def health(active: Any) -> list[dict[str, str]]:
    """``[{job, node, target, health, error}]`` of Prometheus's ``activeTargets`` (its API), sorted."""
    if not isinstance(active, list):
        return []
    rows = []
    for target in active:
        if not isinstance(target, dict):
            continue
        labels = target.get("labels") if isinstance(target.get("labels"), dict) else {}
        rows.append(
            {
                "job": str(labels.get("job", "")),
                "node": str(labels.get("node", "")),
                "target": str(labels.get("instance", target.get("scrapeUrl", ""))),
                "health": str(target.get("health", "unknown")),
                "error": str(target.get("lastError", "")),
            }
        )
    return sorted(rows, key=lambda row: (row["job"], row["node"], row["target"]))
