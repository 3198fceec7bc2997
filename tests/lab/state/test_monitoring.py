# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The monitoring in the converged lab (role monitoring), checked from outside. Read-only.

Prometheus on the head scrapes vLLM at the head's own API (what serving.json
says, never the ingress), the node exporters of both hosts (the worker's over
the cluster link) and the watchdog; every vLLM and node target is up; the
collection's alert rules are loaded and none fires on the healthy lab; nothing
listens beyond loopback but the worker's node exporter on its cluster address.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from lab.harness import (
    CLUSTER_ADDRESSES,
    HEAD,
    SERVING_STATE,
    WORKER,
    exec_on,
    module_utils,
    read_json,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

PROMETHEUS = "http://127.0.0.1:9090"
ALERTMANAGER = "http://127.0.0.1:9093"
INGRESS_PORT = 8080


def api(url: str) -> Any:
    done = exec_on(HEAD, "curl", "-sf", "-m", "10", url, check=False)
    assert done.returncode == 0, f"{url} on {HEAD}: curl exit {done.returncode} {done.stderr}"
    return json.loads(done.stdout)


def targets() -> list[dict[str, Any]]:
    """Prometheus's active targets, once every one has been scraped (up or down, not unknown)."""
    deadline = time.monotonic() + 60
    while True:
        active = api(f"{PROMETHEUS}/api/v1/targets?state=active")["data"]["activeTargets"]
        if all(t["health"] != "unknown" for t in active) or time.monotonic() > deadline:
            return active
        time.sleep(2)


def test_the_services_run_on_the_head_and_the_exporter_on_both_hosts():
    for unit in ("prometheus.service", "prometheus-alertmanager.service", "prometheus-node-exporter.service"):
        assert exec_on(HEAD, "systemctl", "is-active", unit).stdout.strip() == "active", unit
        assert exec_on(HEAD, "systemctl", "is-enabled", unit).stdout.strip() == "enabled", unit
    assert exec_on(WORKER, "systemctl", "is-active", "prometheus-node-exporter.service").stdout.strip() == "active"


def test_every_vllm_and_node_target_is_up():
    active = targets()
    by_job: dict[str, dict[str, str]] = {}
    for target in active:
        by_job.setdefault(target["labels"]["job"], {})[target["labels"]["instance"]] = target["health"]
    recipe = read_json(HEAD, SERVING_STATE)["recipe"]
    assert by_job["vllm"] == {f"127.0.0.1:{recipe['port']}": "up"}, active
    assert by_job["node"] == {"127.0.0.1:9100": "up", f"{CLUSTER_ADDRESSES[WORKER]}:9100": "up"}, active
    assert "localinference-watchdog" in by_job


def test_vllm_is_scraped_at_its_own_api_never_through_the_ingress():
    for target in targets():
        if target["labels"]["job"] == "vllm":
            assert not target["labels"]["instance"].endswith(f":{INGRESS_PORT}")
            assert target["labels"]["node"] == HEAD


def test_the_alert_rules_are_loaded():
    rules = module_utils("monitoring._rules")
    groups = api(f"{PROMETHEUS}/api/v1/rules?type=alert")["data"]["groups"]
    loaded = [rule["name"] for group in groups for rule in group["rules"]]
    assert loaded == rules.alert_names({"watchdog": True})
    assert all(rule["health"] == "ok" for group in groups for rule in group["rules"]), groups


def test_alertmanager_answers_and_nothing_fires_on_the_engine():
    assert api(f"{ALERTMANAGER}/api/v2/status")["cluster"]["status"] == "disabled"
    firing = api(f"{PROMETHEUS}/api/v1/alerts")["data"]["alerts"]
    engine = {"LocalinferenceEngineWedged", "LocalinferenceTargetDown", "LocalinferenceKVCacheNearlyFull"}
    assert not [a for a in firing if a["labels"]["alertname"] in engine and a["state"] == "firing"], firing


def _listening(host: str, port: int) -> set[str]:
    lines = exec_on(host, "ss", "-Hltn", f"sport = :{port}").stdout.splitlines()
    return {line.split()[3].rsplit(":", 1)[0] for line in lines if line.strip()}


@pytest.mark.parametrize(
    ("host", "port", "addresses"),
    [
        (HEAD, 9090, {"127.0.0.1"}),
        (HEAD, 9093, {"127.0.0.1"}),
        (HEAD, 9094, set()),
        (HEAD, 9100, {"127.0.0.1"}),
        (WORKER, 9100, {CLUSTER_ADDRESSES[WORKER]}),
    ],
    ids=["prometheus", "alertmanager", "no gossip port", "head exporter", "worker exporter"],
)
def test_nothing_listens_beyond_loopback_and_the_cluster_address(host, port, addresses):
    assert _listening(host, port) == addresses
