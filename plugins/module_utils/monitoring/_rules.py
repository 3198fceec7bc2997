# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one source of the monitoring's PromQL: the alert rules and the Grafana dashboard.

Every expression Prometheus evaluates for the collection is written here, once:
the alerts (``rules``: a Prometheus rule-file document) and the dashboard's
panels (``dashboard``: a Grafana dashboard). The role renders the rules through
the filter ``localinference.vllm.monitoring_rules``; ``docs/grafana/localinference.json``
is ``dashboard(DEFAULTS)`` (regenerate with ``python tools/monitoring_dashboard.py``).

The metric names are interfaces: vLLM's ``vllm:*`` (as the pinned vLLM 0.32.0
exports them, ``tests/unit/fixtures/vllm-metrics/real-cpu-0.32.0-*.prom``), the
watchdog's ``localinference_watchdog_*`` (``roles/watchdog/README.md``) and the
node exporter's ``node_*``. The job names are the scrape jobs of
``_config.prometheus_config``.

Pure functions: no AnsibleModule, unit-tested on their own (``promtool test rules``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)

# The scrape jobs (prometheus.yml) the expressions select.
JOB_VLLM = "vllm"
JOB_NODE = "node"
JOB_WATCHDOG = "localinference-watchdog"
GROUP = "localinference"
_WD = f'job="{JOB_WATCHDOG}"'
# Go template pieces of the annotations (Prometheus expands them per alert).
NODE = "{{ $labels.node }}"
MODEL = "{{ $labels.model_name }}"
TTFT_WINDOW = "5m"
_DURATION = re.compile(r"(?:[0-9]+y)?(?:[0-9]+w)?(?:[0-9]+d)?(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?(?:[0-9]+ms)?")
_UNIT_SECONDS = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
MAX_FOR_SECONDS = 7 * 86400

# The option defaults (roles/monitoring/defaults/main.yml says the same).
DEFAULT_FOR = "1m"
DEFAULTS: dict[str, Any] = {
    "watchdog": True,
    "alert_for": {},
    "ttft_p95_threshold_s": 30,
    "kv_cache_usage_threshold": 0.95,
    "memory_pressure_threshold": 20,
}


def duration(name: str, value: Any, *, allow_zero: bool = False, maximum: float | None = None) -> str:
    """A Prometheus duration (``15s``, ``1m30s``, ``2h``); a whole number means seconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = f"{value}s"
    value = validate.text(name, value, max_length=40, strip_ok=False)
    if not _DURATION.fullmatch(value) or not value:
        raise ValidationError(
            name,
            f"{value!r} is not a Prometheus duration",
            "write a number and a unit, e.g. 15s, 1m, 1m30s, 2h (units y w d h m s ms)",
        )
    seconds = seconds_of(value)
    if seconds == 0 and not allow_zero:
        raise ValidationError(name, f"{value!r} is zero", "set a positive duration, e.g. 15s")
    if maximum is not None and seconds > maximum:
        raise ValidationError(name, f"{value!r} is above {maximum:g} s", f"set at most {maximum:g}s")
    return value


def seconds_of(value: str) -> float:
    """Seconds of a duration ``duration`` accepted."""
    return sum(
        int(number) * _UNIT_SECONDS[unit]
        for number, unit in re.findall(r"([0-9]+)(ms|[ywdhms])", value)
    )


@dataclass(frozen=True)
class Alert:
    """One alert: its name (an interface), the ``monitoring_alert_for`` key, and its text."""

    name: str
    key: str
    severity: str
    watchdog: bool
    expr: Callable[[dict[str, Any]], str]
    summary: Callable[[dict[str, Any]], str]
    description: Callable[[dict[str, Any]], str]


def _wedged_expr(_: dict[str, Any]) -> str:
    return (
        f'max by (verdict) (localinference_watchdog_verdict{{{_WD}, verdict=~"wedged|down"}}) == 1'
    )


def _ttft_expr(spec: dict[str, Any]) -> str:
    return (
        f"histogram_quantile(0.95, sum by (node, model_name, le) "
        f'(rate(vllm:time_to_first_token_seconds_bucket{{job="{JOB_VLLM}"}}[{TTFT_WINDOW}]))) '
        f"> {spec['ttft_p95_threshold_s']:g}"
    )


def _kv_expr(spec: dict[str, Any]) -> str:
    return (
        f'max by (node, model_name) (vllm:kv_cache_usage_perc{{job="{JOB_VLLM}"}}) '
        f"> {spec['kv_cache_usage_threshold']:g}"
    )


def _memory_expr(spec: dict[str, Any]) -> str:
    short = f"max by (node) (localinference_watchdog_memory_short{{{_WD}}}) == 1"
    psi = (
        f"max by (node) (localinference_watchdog_memory_pressure{{{_WD}}}) "
        f"> {spec['memory_pressure_threshold']:g}"
    )
    return (
        f'label_replace({short}, "reason", "memory_short", "", "")\n'
        f'or label_replace({psi}, "reason", "psi", "", "")'
    )


ALERTS: tuple[Alert, ...] = (
    Alert(
        "LocalinferenceEngineWedged", "engine_wedged", "critical", True, _wedged_expr,
        lambda _: "The endpoint is {{ $labels.verdict }} (the watchdog's verdict)",
        lambda _: (
            '{{ if eq $labels.verdict "wedged" }}F28 - the engine answers /health but streams no '
            "token (two looks in a row): a tensor-parallel rank is stuck in a collective "
            "(docs/failure-catalog.md#f28).{{ else }}The serving units or the ingress unit "
            "failed.{{ end }} The watchdog restarts the cluster in the rollout's order within its "
            "budget; read /var/lib/localinference/incidents.jsonl on the head and run "
            "playbooks/doctor.yml."
        ),
    ),
    Alert(
        "LocalinferenceTimeToFirstTokenHigh", "time_to_first_token_high", "warning", False,
        _ttft_expr,
        lambda _: f"p95 time to first token of {MODEL} is {{{{ $value | humanizeDuration }}}}",
        lambda s: (
            f"Above {s['ttft_p95_threshold_s']:g} s over {TTFT_WINDOW} on {NODE}: requests queue "
            "(vllm:num_requests_waiting) or long prompts prefill one after another. Lower "
            "max_num_seqs or the context with the plan stage (--tags plan,rollout), or add "
            "capacity; monitoring_ttft_p95_threshold_s sets the limit."
        ),
    ),
    Alert(
        "LocalinferenceKVCacheNearlyFull", "kv_cache_nearly_full", "warning", False, _kv_expr,
        lambda _: f"KV cache of {MODEL} on {NODE} is {{{{ $value | humanizePercentage }}}} full",
        lambda s: (
            f"Above {s['kv_cache_usage_threshold']:.0%}: new requests wait and running ones are "
            "preempted and recomputed (vllm:num_preemptions_total). Serve fewer or shorter "
            "requests (max_num_seqs, max_model_len: --tags plan,rollout) or give the KV cache "
            "more memory; monitoring_kv_cache_usage_threshold sets the limit."
        ),
    ),
    Alert(
        "LocalinferenceFabricDrift", "fabric_drift", "warning", True,
        lambda _: f"max by (node, kind) (localinference_watchdog_fabric_drift{{{_WD}}}) == 1",
        lambda _: f"The cluster link of {NODE} drifted from fabric.json ({{{{ $labels.kind }}}})",
        lambda _: (
            '{{ if eq $labels.kind "mtu" }}F19 - the running MTU differs from the one the fabric '
            "stage set: jumbo frames are dropped and NCCL slows or hangs "
            '(docs/failure-catalog.md#f19).{{ else if eq $labels.kind "gid" }}F20 - the RoCE GID '
            "table differs from fabric.json: NCCL_IB_GID_INDEX names the wrong entry "
            "(docs/failure-catalog.md#f20).{{ else }}The cluster interface is down or gone: the "
            "ranks cannot reach each other.{{ end }} Run the fabric stage and the rollout again: "
            "ansible-playbook playbooks/site.yml --tags fabric,rollout."
        ),
    ),
    Alert(
        "LocalinferenceMemoryPressure", "memory_pressure", "warning", True, _memory_expr,
        lambda _: f"Memory pressure on {NODE} ({{{{ $labels.reason }}}})",
        lambda s: (
            '{{ if eq $labels.reason "psi" }}PSI memory some avg10 is {{ printf "%.1f" $value }}% '
            f"(above {s['memory_pressure_threshold']:g}%){{{{ else }}}}MemAvailable is below what "
            "the admission needs to start a rank again{{ end }}: F4 - a rank may be OOM-killed or "
            "refused at its next start (docs/failure-catalog.md#f4). Find the other processes by "
            "RSS (playbooks/doctor.yml) and stop them, or lower kv_cache_memory_bytes or "
            "max_model_len (--tags plan,rollout)."
        ),
    ),
    Alert(
        "LocalinferenceRestartBudgetSpent", "restart_budget_spent", "critical", True,
        lambda _: f"max(localinference_watchdog_budget_spent{{{_WD}}}) == 1",
        lambda _: "The watchdog's restart budget is spent: it only pages now",
        lambda _: (
            "watchdog_max_restarts restarts within watchdog_restart_window_s did not keep the "
            "endpoint healthy; no restart happens until one leaves the window. Read "
            "/var/lib/localinference/incidents.jsonl on the head, run playbooks/doctor.yml, fix "
            "the cause, then roll out again (--tags rollout)."
        ),
    ),
    Alert(
        "LocalinferenceWatchdogDown", "watchdog_down", "critical", True,
        lambda _: (
            f"(max(up{{{_WD}}}) or vector(0)) == 0\n"
            f"or max(localinference_watchdog_up{{{_WD}}}) == 0"
        ),
        lambda _: "The watchdog does not report",
        lambda s: (
            f"Prometheus cannot scrape the watchdog at {s.get('watchdog_target') or 'its target'} "
            "or its loop stopped: nothing detects or recovers a wedge (F28). On the head: "
            "systemctl status localinference-watchdog.service and journalctl -u "
            "localinference-watchdog.service."
        ),
    ),
    Alert(
        "LocalinferenceTargetDown", "target_down", "warning", False,
        lambda _: f'up{{job=~"{JOB_VLLM}|{JOB_NODE}"}} == 0',
        lambda _: f"{{{{ $labels.job }}}} on {NODE} ({{{{ $labels.instance }}}}) does not answer",
        lambda _: (
            f'{{{{ if eq $labels.job "{JOB_VLLM}" }}}}vLLM\'s API does not serve /metrics: '
            f"systemctl status localinference-vllm.service and journalctl -u "
            f"localinference-vllm.service on {NODE} (the watchdog recovers a failed unit)."
            f"{{{{ else }}}}The node exporter does not answer: systemctl status "
            f"prometheus-node-exporter.service on {NODE}.{{{{ end }}}}"
        ),
    ),
)
ALERT_KEYS = tuple(alert.key for alert in ALERTS)


def rules_spec(spec: Any) -> dict[str, Any]:
    """The validated thresholds and ``for`` durations (option names in every message)."""
    if not isinstance(spec, dict):
        raise ValidationError(
            "monitoring rules", f"expected a mapping, got {validate.shown(spec)}", "pass a dict"
        )
    merged = {**DEFAULTS, **{k: v for k, v in spec.items() if v is not None}}
    watchdog = merged["watchdog"]
    if not isinstance(watchdog, bool):
        raise ValidationError(
            "monitoring watchdog", f"expected true or false, got {validate.shown(watchdog)}",
            "set monitoring_watchdog_target (empty: the watchdog is not scraped)",
        )
    alert_for = merged["alert_for"]
    if not isinstance(alert_for, dict):
        raise ValidationError(
            "monitoring_alert_for", f"expected a mapping, got {validate.shown(alert_for)}",
            f"map alert keys ({', '.join(ALERT_KEYS)}) to durations, e.g. {{engine_wedged: 30s}}",
        )
    unknown = sorted(str(k) for k in alert_for if k not in ALERT_KEYS)
    if unknown:
        raise ValidationError(
            "monitoring_alert_for", f"has unknown keys {', '.join(map(repr, unknown))}",
            f"use only {', '.join(ALERT_KEYS)}",
        )
    return {
        "watchdog": watchdog,
        "watchdog_target": merged.get("watchdog_target", ""),
        "alert_for": {
            key: duration(
                f"monitoring_alert_for.{key}",
                DEFAULT_FOR if alert_for.get(key) is None else alert_for[key],
                allow_zero=True, maximum=MAX_FOR_SECONDS,
            )
            for key in ALERT_KEYS
        },
        "ttft_p95_threshold_s": validate.number(
            "monitoring_ttft_p95_threshold_s", merged["ttft_p95_threshold_s"],
            above=0, maximum=86400,
        ),
        "kv_cache_usage_threshold": validate.number(
            "monitoring_kv_cache_usage_threshold", merged["kv_cache_usage_threshold"],
            above=0, maximum=1,
        ),
        "memory_pressure_threshold": validate.number(
            "monitoring_memory_pressure_threshold", merged["memory_pressure_threshold"],
            above=0, maximum=100,
        ),
    }


def alerts(spec: dict[str, Any]) -> list[Alert]:
    """The alerts this spec installs (the watchdog's are left out when it is not scraped)."""
    return [a for a in ALERTS if spec["watchdog"] or not a.watchdog]


def rules(spec: Any) -> dict[str, Any]:
    """The Prometheus rule-file document (``groups``) for ``spec`` (see :func:`rules_spec`)."""
    checked = rules_spec(spec)
    return {
        "groups": [
            {
                "name": GROUP,
                "rules": [
                    {
                        "alert": alert.name,
                        "expr": alert.expr(checked),
                        "for": checked["alert_for"][alert.key],
                        "labels": {"severity": alert.severity},
                        "annotations": {
                            "summary": alert.summary(checked),
                            "description": alert.description(checked),
                        },
                    }
                    for alert in alerts(checked)
                ],
            }
        ]
    }


def alert_names(spec: Any) -> list[str]:
    return [alert.name for alert in alerts(rules_spec(spec))]


# --- the dashboard -------------------------------------------------------------
_VLLM = f'job="{JOB_VLLM}"'
_NODE = f'job="{JOB_NODE}"'


def _quantile(q: float, metric: str, by: str = "model_name") -> str:
    return f"histogram_quantile({q:g}, sum by ({by}, le) (rate({metric}_bucket{{{_VLLM}}}[5m])))"


@dataclass(frozen=True)
class Panel:
    """One dashboard panel: its queries (expression, legend), unit and threshold option."""

    title: str
    kind: str
    unit: str
    queries: tuple[tuple[str, str], ...]
    description: str
    threshold: str = ""


PANELS: tuple[Panel, ...] = (
    Panel("Watchdog verdict", "stat", "none",
          ((f"max by (verdict) (localinference_watchdog_verdict{{{_WD}}}) == 1", "{{verdict}}"),),
          "The watchdog's current verdict: healthy, degraded, wedged, down or unknown."),
    Panel("Scrape targets up", "stat", "none",
          ((f'up{{job=~"{JOB_VLLM}|{JOB_NODE}|{JOB_WATCHDOG}"}}', "{{job}} {{node}}"),),
          "1 when Prometheus reached the target at its last scrape."),
    Panel("Restarts in the window / budget", "stat", "none",
          ((f"max(localinference_watchdog_restarts_in_window{{{_WD}}})", "restarts"),
           (f"max(localinference_watchdog_restart_budget{{{_WD}}})", "budget")),
          "Restarts the watchdog made within watchdog_restart_window_s, and watchdog_max_restarts."),
    Panel("KV cache usage now", "stat", "percentunit",
          ((f"max by (model_name) (vllm:kv_cache_usage_perc{{{_VLLM}}})", "{{model_name}}"),),
          "The fullest KV cache of each served model.", "kv_cache_usage_threshold"),
    Panel("Time to first token", "timeseries", "s",
          ((_quantile(0.5, "vllm:time_to_first_token_seconds"), "p50 {{model_name}}"),
           (_quantile(0.95, "vllm:time_to_first_token_seconds"), "p95 {{model_name}}")),
          "Over 5 minutes; the alert line is monitoring_ttft_p95_threshold_s.",
          "ttft_p95_threshold_s"),
    Panel("Inter-token latency", "timeseries", "s",
          ((_quantile(0.5, "vllm:inter_token_latency_seconds"), "p50 {{model_name}}"),
           (_quantile(0.95, "vllm:inter_token_latency_seconds"), "p95 {{model_name}}")),
          "Time between streamed tokens, over 5 minutes."),
    Panel("Requests", "timeseries", "none",
          ((f"sum by (model_name) (vllm:num_requests_running{{{_VLLM}}})", "running {{model_name}}"),
           (f"sum by (model_name) (vllm:num_requests_waiting{{{_VLLM}}})", "waiting {{model_name}}")),
          "Requests in the engine's batch, and waiting for a place in it."),
    Panel("KV cache usage", "timeseries", "percentunit",
          ((f"max by (node, model_name) (vllm:kv_cache_usage_perc{{{_VLLM}}})",
            "{{node}} {{model_name}}"),),
          "1 is full; the alert line is monitoring_kv_cache_usage_threshold.",
          "kv_cache_usage_threshold"),
    Panel("Tokens per second", "timeseries", "none",
          ((f"sum by (model_name) (rate(vllm:prompt_tokens_total{{{_VLLM}}}[5m]))",
            "prompt {{model_name}}"),
           (f"sum by (model_name) (rate(vllm:generation_tokens_total{{{_VLLM}}}[5m]))",
            "generated {{model_name}}")),
          "Prefill and generated tokens per second, over 5 minutes."),
    Panel("Preemptions per second", "timeseries", "none",
          ((f"sum by (model_name) (rate(vllm:num_preemptions_total{{{_VLLM}}}[5m]))",
            "{{model_name}}"),),
          "Requests pushed out of a full KV cache (recomputed later)."),
    Panel("Request latency (p95)", "timeseries", "s",
          ((_quantile(0.95, "vllm:e2e_request_latency_seconds"), "end to end {{model_name}}"),
           (_quantile(0.95, "vllm:request_queue_time_seconds"), "queued {{model_name}}")),
          "Whole requests, and the part spent waiting, over 5 minutes."),
    Panel("Watchdog probe: first token", "timeseries", "s",
          ((f"localinference_watchdog_first_token_seconds{{{_WD}}}", "first token"),),
          "The watchdog's own streamed token through the ingress (a gap: no token came)."),
    Panel("Memory pressure (PSI some avg10)", "timeseries", "percent",
          ((f"localinference_watchdog_memory_pressure{{{_WD}}}", "{{node}}"),),
          "F4: the alert line is monitoring_memory_pressure_threshold.",
          "memory_pressure_threshold"),
    Panel("Memory available", "timeseries", "bytes",
          ((f"node_memory_MemAvailable_bytes{{{_NODE}}}", "{{node}}"),),
          "MemAvailable of every node the node exporter runs on."),
    Panel("Fabric drift", "timeseries", "none",
          ((f"localinference_watchdog_fabric_drift{{{_WD}}}", "{{node}} {{kind}}"),),
          "1 when the cluster link differs from fabric.json (F19 mtu, F20 gid, link)."),
    Panel("Network traffic", "timeseries", "Bps",
          ((f'sum by (node, device) (rate(node_network_receive_bytes_total{{{_NODE}, device!="lo"}}[5m]))',
            "in {{node}} {{device}}"),
           (f'sum by (node, device) (rate(node_network_transmit_bytes_total{{{_NODE}, device!="lo"}}[5m]))',
            "out {{node}} {{device}}")),
          "Bytes per second of every interface but loopback (the cluster link among them)."),
    Panel("Kernel events (last hour)", "timeseries", "none",
          ((f"sum by (node, kind) (increase(localinference_watchdog_kernel_events_total{{{_WD}}}[1h]))",
            "{{node}} {{kind}}"),),
          "Xid, AER and OOM lines the watchdog read in the kernel log."),
    Panel("Watchdog restarts (last hour)", "timeseries", "none",
          ((f"sum by (target) (increase(localinference_watchdog_restarts_total{{{_WD}}}[1h]))",
            "{{target}}"),),
          "Restarts of the engine and of the ingress."),
)  # fmt: skip

_SIZES = {"stat": (6, 4), "timeseries": (12, 8)}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana asks for the Prometheus data source when the JSON is imported.
_DATASOURCE_VARIABLE = {
    "name": "datasource",
    "label": "Prometheus",
    "type": "datasource",
    "query": "prometheus",
    "current": {},
    "hide": 0,
    "refresh": 1,
    "regex": "",
    "options": [],
}


def _panel(index: int, panel: Panel, spec: dict[str, Any], x: int, y: int) -> dict[str, Any]:
    width, height = _SIZES[panel.kind]
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if panel.threshold:
        steps.append({"color": "red", "value": spec[panel.threshold]})
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "thresholds": {"mode": "absolute", "steps": steps},
    }
    if panel.kind == "timeseries":
        defaults["custom"] = {"thresholdsStyle": {"mode": "line" if panel.threshold else "off"}}
        options: dict[str, Any] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        }
    else:
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "name" if panel.title == "Watchdog verdict" else "value_and_name",
            "colorMode": "value",
            "graphMode": "none",
        }
    return {
        "id": index,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": width, "h": height},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {
                "refId": chr(ord("A") + n),
                "datasource": DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
            }
            for n, (expr, legend) in enumerate(panel.queries)
        ],
    }


def dashboard(spec: Any) -> dict[str, Any]:
    """The Grafana dashboard (a ``Prometheus`` data source chosen on import)."""
    checked = rules_spec(spec)
    panels, x, y, row_height = [], 0, 0, 0
    for index, panel in enumerate(PANELS, start=1):
        width, height = _SIZES[panel.kind]
        if x + width > 24:
            x, y, row_height = 0, y + row_height, 0
        panels.append(_panel(index, panel, checked, x, y))
        x, row_height = x + width, max(row_height, height)
    return {
        "title": "localinference vLLM",
        "uid": "localinference-vllm",
        "description": (
            "Generated from plugins/module_utils/monitoring/_rules.py (the alerts' source); "
            "regenerate with python tools/monitoring_dashboard.py, do not edit."
        ),
        "tags": ["localinference", "vllm"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "annotations": {"list": []},
        "templating": {"list": [_DATASOURCE_VARIABLE]},
        "panels": panels,
    }


def panel_rules() -> dict[str, Any]:
    """Every panel query as a recording rule, for ``promtool check rules``."""
    return {
        "groups": [
            {
                "name": f"{GROUP}-dashboard",
                "rules": [
                    {"record": f"localinference_dashboard:panel{index}_{n}", "expr": expr}
                    for index, panel in enumerate(PANELS, start=1)
                    for n, (expr, _) in enumerate(panel.queries)
                ],
            }
        ]
    }
