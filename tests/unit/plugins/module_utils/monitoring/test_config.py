# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The monitoring's configuration (module_utils/monitoring/_config.py): targets, files, ARGS.

The vLLM targets come from the serve role's real ``serving.json`` shapes (the
lab's head and headless worker, a Ray worker, a worker serving its own API);
``prometheus.yml`` passes ``promtool check config`` with the rules beside it;
every option that reaches a file is refused with its name when bad.
"""

from __future__ import annotations

import base64
import copy
import json

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter import monitoring
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.monitoring import (
    _config as config,
)

from tests.unit.plugins.module_utils.monitoring.promtool import promtool

HEAD_STATE = {
    "schema": 1,
    "recipe": {"host": "127.0.0.1", "port": 8000, "executor_backend": "mp"},
    "node": {"host": "spark-head", "address": "10.77.0.11", "rank": 0, "role": "head"},
    "server_argv": ["serve", "/models/x", "--port", "8000", "--nnodes", "2", "--node-rank", "0"],
    "ray_argv": None,
}
WORKER_STATE = {
    **HEAD_STATE,
    "node": {"host": "spark-worker", "address": "10.77.0.12", "rank": 1, "role": "worker"},
    "server_argv": ["serve", "/models/x", "--node-rank", "1", "--headless"],
}


def _state(base, **changes):
    document = copy.deepcopy(base)
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            document[section][field] = value
        else:
            document[section] = value
    return document


SPEC = {
    "head": "spark-head",
    "prometheus_listen": "127.0.0.1:9090",
    "alertmanager_listen": "127.0.0.1:9093",
    "scrape_interval": "15s",
    "evaluation_interval": "15s",
    "retention": "15d",
    "vllm_targets": [{"node": "spark-head", "target": "127.0.0.1:8000"}],
    "node_exporter_port": 9100,
    "node_exporter_nodes": [
        {"node": "spark-head", "address": "127.0.0.1"},
        {"node": "spark-worker", "address": "10.77.0.12"},
    ],
    "watchdog_target": "127.0.0.1:9109",
    "webhook_url": "",
    "rules_path": "/etc/prometheus/localinference.rules.yml",
    "prometheus_config": "/etc/prometheus/prometheus.yml",
    "alertmanager_config": "/etc/prometheus/alertmanager.yml",
}


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({"spark-head": HEAD_STATE, "spark-worker": WORKER_STATE},
         [{"node": "spark-head", "target": "127.0.0.1:8000"}]),
        ({"spark-head": _state(HEAD_STATE, recipe__host="0.0.0.0", recipe__port=8001)},
         [{"node": "spark-head", "target": "127.0.0.1:8001"}]),
        ({"spark-head": _state(HEAD_STATE, recipe__host=None)},
         [{"node": "spark-head", "target": "127.0.0.1:8000"}]),
        ({"spark-head": HEAD_STATE,
          "spark-worker": _state(WORKER_STATE, server_argv=["serve", "/models/x"], recipe__host="0.0.0.0")},
         [{"node": "spark-head", "target": "127.0.0.1:8000"},
          {"node": "spark-worker", "target": "10.77.0.12:8000"}]),
        ({"spark-head": HEAD_STATE,
          "spark-worker": _state(WORKER_STATE, server_argv=["serve"], recipe__host="10.77.0.12")},
         [{"node": "spark-head", "target": "127.0.0.1:8000"},
          {"node": "spark-worker", "target": "10.77.0.12:8000"}]),
        ({"spark-head": _state(HEAD_STATE, recipe__host="fd00::1"),
          "spark-worker": _state(WORKER_STATE, server_argv=None, ray_argv=["start"])},
         [{"node": "spark-head", "target": "[fd00::1]:8000"}]),
    ],
    ids=["lab: head on loopback, headless worker", "head on every address", "head without host",
         "worker with its own API on every address", "worker API on its cluster address",
         "ray worker, head on IPv6"],
)  # fmt: skip
def test_vllm_targets(states, expected):
    assert config.vllm_targets(states, "spark-head") == expected


@pytest.mark.parametrize(
    ("states", "pattern"),
    [
        ({"spark-head": None}, "serving.json on spark-head: is missing or unreadable; run the rollout first"),
        ({"spark-head": [1]}, "is not the serve role's state"),
        ({"spark-head": _state(HEAD_STATE, schema=2)}, "schema 1"),
        ({"spark-head": _state(HEAD_STATE, recipe="x")}, "has no recipe or node mapping"),
        ({"spark-head": _state(HEAD_STATE, server_argv="serve")}, "server_argv is not a list"),
        ({"spark-head": _state(HEAD_STATE, recipe__port=70000)}, r"recipe.port: 70000 is above 65535"),
        ({"spark-head": _state(HEAD_STATE, recipe__host="a\nb")}, r"recipe.host: contains '\\n'"),
        ({"spark-head": HEAD_STATE,
          "spark-worker": _state(WORKER_STATE, server_argv=["serve"])},
         "on spark-worker: vLLM's API listens on 127.0.0.1 only"),
        ({"spark-head": HEAD_STATE,
          "spark-worker": _state(WORKER_STATE, server_argv=["serve"], recipe__host="", node__address=None)},
         "node.address"),
        ({}, "expected a mapping of nodes"),
    ],
    ids=["missing", "not a mapping", "other schema", "no recipe", "argv a string", "port out of range",
         "newline in host", "worker on loopback", "worker without address", "no nodes"],
)  # fmt: skip
def test_vllm_targets_refused(states, pattern):
    with pytest.raises(ValidationError, match=pattern):
        config.vllm_targets(states, "spark-head")


def test_the_filter_reads_slurped_states():
    encoded = {n: base64.b64encode(json.dumps(d).encode()).decode() for n, d in
               {"spark-head": HEAD_STATE, "spark-worker": WORKER_STATE}.items()}  # fmt: skip
    assert monitoring.monitoring_serving_targets(encoded, "spark-head") == [
        {"node": "spark-head", "target": "127.0.0.1:8000"}
    ]
    with pytest.raises(AnsibleFilterError, match=r"serving\.json on spark-head is not JSON"):
        monitoring.monitoring_serving_targets({"spark-head": base64.b64encode(b"{").decode()}, "spark-head")
    with pytest.raises(AnsibleFilterError, match="on spark-worker: is missing or unreadable"):
        monitoring.monitoring_serving_targets({"spark-worker": ""}, "spark-head")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["10.77.0.12:8000"], [{"node": "10.77.0.12", "target": "10.77.0.12:8000"}]),
        ([{"target": "[fd00::2]:8000", "node": "spark-worker"}],
         [{"node": "spark-worker", "target": "[fd00::2]:8000"}]),
        ([], []),
    ],
)  # fmt: skip
def test_explicit_targets(value, expected):
    assert monitoring.monitoring_explicit_targets(value) == expected


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        ("10.0.0.1:8000", r"monitoring_vllm_targets: expected a list"),
        (["10.0.0.1"], r"monitoring_vllm_targets\[0\]: '10.0.0.1' has no port"),
        (["fd00::2:8000"], "needs brackets"),
        (["0.0.0.0:8000"], "names no single host"),
        (["10.0.0.1:8000\n  - job_name: x"], r"monitoring_vllm_targets\[0\]: contains '\\n'"),
        ([{"target": "h:1", "node": "a b"}], r"monitoring_vllm_targets\[0\].node"),
        ([{"target": "h:1", "labels": {}}], "unknown keys"),
    ],
)
def test_explicit_targets_refused(value, pattern):
    with pytest.raises(AnsibleFilterError, match=pattern):
        monitoring.monitoring_explicit_targets(value)


def test_prometheus_yml_passes_promtool(tmp_path):
    rules = tmp_path / "localinference.rules.yml"
    built = monitoring.monitoring_config({**SPEC, "rules_path": str(rules)})
    rules.write_text(monitoring.monitoring_rules(built["rules"]))
    (tmp_path / "prometheus.yml").write_text(built["prometheus_yml"])
    done = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_configuration():
    built = monitoring.monitoring_config(SPEC)
    prometheus = yaml.safe_load(built["prometheus_yml"])
    jobs = {job["job_name"]: job["static_configs"] for job in prometheus["scrape_configs"]}
    assert jobs["vllm"] == [{"targets": ["127.0.0.1:8000"], "labels": {"node": "spark-head"}}]
    assert jobs["node"][1] == {"targets": ["10.77.0.12:9100"], "labels": {"node": "spark-worker"}}
    # The watchdog's series carry the node they describe: no node label on its target.
    assert jobs["localinference-watchdog"] == [{"targets": ["127.0.0.1:9109"]}]
    assert prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    assert prometheus["global"]["scrape_timeout"] == "10s"
    assert built["args"] == {
        "prometheus": "--config.file=/etc/prometheus/prometheus.yml --web.listen-address=127.0.0.1:9090 "
        "--storage.tsdb.retention.time=15d",
        "alertmanager": "--config.file=/etc/prometheus/alertmanager.yml --web.listen-address=127.0.0.1:9093 "
        "--cluster.listen-address=",
        "node_exporter": {"spark-head": "--web.listen-address=127.0.0.1:9100",
                          "spark-worker": "--web.listen-address=10.77.0.12:9100"},
    }  # fmt: skip
    assert yaml.safe_load(built["alertmanager_yml"])["receivers"] == [{"name": "operator"}]
    assert built["result"]["alerts"][0] == "LocalinferenceEngineWedged"


def test_short_intervals_every_address_a_webhook_and_no_watchdog():
    built = monitoring.monitoring_config({
        **SPEC, "scrape_interval": "5s", "prometheus_listen": ":9090", "alertmanager_listen": "[::1]:9093",
        "webhook_url": "https://hooks.example.net/am?token=a%2Fb", "watchdog_target": "",
    })  # fmt: skip
    prometheus = yaml.safe_load(built["prometheus_yml"])
    assert prometheus["global"]["scrape_timeout"] == "5s"
    assert "localinference-watchdog" not in {job["job_name"] for job in prometheus["scrape_configs"]}
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9090"]
    assert "--web.listen-address=:9090" in built["args"]["prometheus"]
    assert "--web.listen-address=[::1]:9093" in built["args"]["alertmanager"]
    assert yaml.safe_load(built["alertmanager_yml"])["receivers"] == [
        {"name": "operator", "webhook_configs": [
            {"url": "https://hooks.example.net/am?token=a%2Fb", "send_resolved": True}]}
    ]  # fmt: skip
    assert "LocalinferenceWatchdogDown" not in built["result"]["alerts"]


@pytest.mark.parametrize("url", [
    # docs/monitoring.md's examples: ntfy's built-in Alertmanager template, and a
    # self-hosted ntfy with a user in the URL; tests/lab/faults/test_alert_delivery.py's receiver.
    "https://ntfy.sh/spark-alerts-7f3kq9x2?template=alertmanager",
    "https://alertmanager:s3cret-Pa55@ntfy.example.net/alerts?template=alertmanager",
    "http://127.0.0.1:19093/alertmanager",
])
def test_the_documented_webhooks_render_as_alertmanagers_webhook_with_resolutions(url):
    built = monitoring.monitoring_config({**SPEC, "webhook_url": url})
    assert yaml.safe_load(built["alertmanager_yml"])["receivers"] == [
        {"name": "operator", "webhook_configs": [{"url": url, "send_resolved": True}]}]
    route = yaml.safe_load(built["alertmanager_yml"])["route"]
    # The lab test waits for a resolution within one group_interval of the alert clearing.
    assert (route["group_wait"], route["group_interval"]) == ("10s", "1m")
    assert built["result"]["webhook"] is True


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"prometheus_listen": "127.0.0.1"}, "monitoring_prometheus_listen: '127.0.0.1' has no port"),
        ({"prometheus_listen": "127.0.0.1:9090\nrule_files: []"}, r"monitoring_prometheus_listen: contains '\\n'"),
        ({"prometheus_listen": "127.0.0.1:99999"}, "monitoring_prometheus_listen: 99999 is above 65535"),
        ({"alertmanager_listen": "0.0.0.0:9090"}, "monitoring_alertmanager_listen: port 9090 is Prometheus's"),
        ({"alertmanager_listen": "my host:9093"}, "monitoring_alertmanager_listen"),
        ({"scrape_interval": "0s"}, "monitoring_scrape_interval: '0s' is zero"),
        ({"scrape_interval": "fast"}, "monitoring_scrape_interval: 'fast' is not a Prometheus duration"),
        ({"evaluation_interval": "2h"}, "monitoring_evaluation_interval: '2h' is above 3600"),
        ({"retention": "15 days"}, "monitoring_retention"),
        ({"watchdog_target": "127.0.0.1"}, "monitoring_watchdog_target: '127.0.0.1' has no port"),
        ({"webhook_url": "ftp://example.net/x"}, "monitoring_webhook_url: 'ftp://example.net/x' is not an http"),
        ({"webhook_url": "https://example.net/a b"}, r"monitoring_webhook_url: contains ' ' at position 21"),
        ({"webhook_url": "https://example.net:99999/"}, "monitoring_webhook_url: .* out of range|use a port"),
        ({"webhook_url": "https:///path"}, "is not an http or https URL"),
        ({"node_exporter_port": 0}, "monitoring_node_exporter_port: 0 is below 1"),
        ({"node_exporter_nodes": [{"node": "spark-head", "address": "127.0.0.1"},
                                  {"node": "spark-worker", "address": "127.0.0.1"}]},
         "cluster address of spark-worker: '127.0.0.1' is not reachable from spark-head"),
        ({"node_exporter_nodes": [{"node": "spark-worker", "address": None}]}, "cluster address of spark-worker"),
        ({"node_exporter_nodes": []}, "the head at least"),
        ({"rules_path": "etc/rules.yml"}, "monitoring rules_path: 'etc/rules.yml' is not an absolute path"),
        ({"alert_for": {"wedged": "1m"}}, "monitoring_alert_for: has unknown keys 'wedged'"),
        ({"vllm_targets": ["127.0.0.1:8000"]}, "monitoring vllm targets"),
        ({"head": "spark head"}, "monitoring head"),
    ],
    ids=lambda value: value if isinstance(value, str) else next(iter(value)),
)  # fmt: skip
def test_bad_options_are_named(change, pattern):
    with pytest.raises(AnsibleFilterError, match=pattern):
        monitoring.monitoring_config({**SPEC, **change})


def test_health_of_prometheus_targets():
    active = [
        {"labels": {"job": "vllm", "node": "spark-head", "instance": "127.0.0.1:8000"},
         "health": "up", "lastError": ""},
        {"labels": {"job": "localinference-watchdog", "instance": "127.0.0.1:9109"},
         "health": "down", "lastError": "connection refused"},
        "junk",
    ]  # fmt: skip
    assert monitoring.monitoring_health(active) == [
        {"job": "localinference-watchdog", "node": "", "target": "127.0.0.1:9109", "health": "down",
         "error": "connection refused"},
        {"job": "vllm", "node": "spark-head", "target": "127.0.0.1:8000", "health": "up", "error": ""},
    ]  # fmt: skip
    assert monitoring.monitoring_health(None) == []


class _Tagged(str):
    """ansible-core 2.19 hands filters str/dict subclasses (tagged values)."""


class _TaggedDict(dict):
    pass


def test_tagged_values_from_ansible_are_written_as_plain_yaml():
    spec = _TaggedDict({key: _Tagged(value) if isinstance(value, str) else value for key, value in SPEC.items()})
    spec["alert_for"] = _TaggedDict({"engine_wedged": _Tagged("10s")})
    built = monitoring.monitoring_config(spec)
    assert yaml.safe_load(built["prometheus_yml"])["global"]["scrape_interval"] == "15s"
    assert "for: 10s" in monitoring.monitoring_rules(built["rules"])
