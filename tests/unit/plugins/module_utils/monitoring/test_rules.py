# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The monitoring's alerts and dashboard (module_utils/monitoring/_rules.py), checked by promtool.

``test_rules.promtool.yaml`` holds the alert tests (input series,
expected alerts with their exact text); they run with ``promtool test rules``
against the rules the role installs (the filter's own output). Every panel
query of the dashboard passes ``promtool check rules``, and the committed
``docs/grafana/localinference.json`` is the generated one.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter import monitoring
from ansible_collections.localinference.vllm.plugins.module_utils.common._validate import (
    ValidationError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.monitoring import (
    _rules as rules,
)

from tests.unit.plugins.module_utils.monitoring.promtool import ROOT, promtool

HERE = Path(__file__).parent
PROMTOOL_TESTS = HERE / "test_rules.promtool.yaml"
# The role's defaults (roles/monitoring/defaults/main.yml).
DEFAULT_SPEC = {"watchdog": True, "watchdog_target": "127.0.0.1:9109"}
# The lab's (inventories/lab/group_vars/all.yml): alerts within about 15 s.
LAB_SPEC = {
    **DEFAULT_SPEC,
    "alert_for": dict.fromkeys(rules.ALERT_KEYS, "10s"),
}
NAMES = [
    "LocalinferenceEngineWedged",
    "LocalinferenceTimeToFirstTokenHigh",
    "LocalinferenceKVCacheNearlyFull",
    "LocalinferenceFabricDrift",
    "LocalinferenceMemoryPressure",
    "LocalinferenceRestartBudgetSpent",
    "LocalinferenceWatchdogDown",
    "LocalinferenceTargetDown",
]
VLLM_FIXTURES = sorted((ROOT / "tests/unit/fixtures/vllm-metrics").glob("real-cpu-0.32.0-*.prom"))
WATCHDOG_README = ROOT / "roles" / "watchdog" / "README.md"


def test_the_alert_names_are_the_interface():
    assert monitoring.monitoring_alert_names(DEFAULT_SPEC) == NAMES


def test_promtool_test_rules_fires_and_stays_quiet(tmp_path):
    (tmp_path / "localinference.rules.yml").write_text(monitoring.monitoring_rules(DEFAULT_SPEC))
    shutil.copy(PROMTOOL_TESTS, tmp_path / "tests.yaml")
    done = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_quiet_test():
    table = yaml.safe_load(PROMTOOL_TESTS.read_text())
    fires, quiet = set(), set()
    for case in table["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    assert sorted(fires) == sorted(NAMES) == sorted(quiet)


@pytest.mark.parametrize(
    "spec",
    [
        DEFAULT_SPEC,
        LAB_SPEC,
        {"watchdog": False},
        {**DEFAULT_SPEC, "ttft_p95_threshold_s": 2.5, "kv_cache_usage_threshold": 1,
         "memory_pressure_threshold": "7.5", "alert_for": {"restart_budget_spent": 0}},
    ],
    ids=["defaults", "lab", "no watchdog", "other thresholds"],
)  # fmt: skip
def test_promtool_check_rules(tmp_path, spec):
    path = tmp_path / "rules.yml"
    path.write_text(monitoring.monitoring_rules(spec))
    done = promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_without_the_watchdog_only_the_engine_alerts_remain():
    assert monitoring.monitoring_alert_names({"watchdog": False}) == [
        "LocalinferenceTimeToFirstTokenHigh",
        "LocalinferenceKVCacheNearlyFull",
        "LocalinferenceTargetDown",
    ]


def test_options_reach_the_rules():
    document = yaml.safe_load(monitoring.monitoring_rules(
        {**LAB_SPEC, "ttft_p95_threshold_s": 2.5, "kv_cache_usage_threshold": 0.8}
    ))  # fmt: skip
    by_name = {rule["alert"]: rule for rule in document["groups"][0]["rules"]}
    assert {rule["for"] for rule in by_name.values()} == {"10s"}
    assert by_name["LocalinferenceTimeToFirstTokenHigh"]["expr"].endswith("> 2.5")
    assert by_name["LocalinferenceKVCacheNearlyFull"]["expr"].endswith("> 0.8")
    assert "Above 80%" in by_name["LocalinferenceKVCacheNearlyFull"]["annotations"]["description"]


def test_the_catalog_ids_are_named():
    document = yaml.safe_load(monitoring.monitoring_rules(DEFAULT_SPEC))
    text = {rule["alert"]: json.dumps(rule["annotations"]) for rule in document["groups"][0]["rules"]}
    assert "F28" in text["LocalinferenceEngineWedged"]
    assert "F19" in text["LocalinferenceFabricDrift"] and "F20" in text["LocalinferenceFabricDrift"]
    assert "F4" in text["LocalinferenceMemoryPressure"]


def _expressions() -> list[str]:
    document = rules.rules(DEFAULT_SPEC)
    return [r["expr"] for r in document["groups"][0]["rules"]] + [
        r["expr"] for r in rules.panel_rules()["groups"][0]["rules"]
    ]


def test_every_vllm_metric_is_one_the_pinned_vllm_exports():
    exported = set()
    for fixture in VLLM_FIXTURES:
        exported |= set(re.findall(r"^(vllm:[a-z_]+)", fixture.read_text(), re.MULTILINE))
    used = {name for expr in _expressions() for name in re.findall(r"vllm:[a-z_]+", expr)}
    assert VLLM_FIXTURES and used
    assert used <= exported, f"not exported by vLLM 0.32.0: {sorted(used - exported)}"


def test_every_watchdog_metric_is_one_the_watchdog_publishes():
    published = set(re.findall(r"`(localinference_watchdog_[a-z_]+)`", WATCHDOG_README.read_text()))
    used = {name for e in _expressions() for name in re.findall(r"localinference_watchdog_[a-z_]+", e)}
    assert used and used <= published, f"not in roles/watchdog/README.md: {sorted(used - published)}"


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ("1m", "expected a mapping"),
        ({"alert_for": {"engine_wedge": "1m"}}, r"monitoring_alert_for: has unknown keys 'engine_wedge'"),
        ({"alert_for": ["1m"]}, "monitoring_alert_for: expected a mapping"),
        ({"alert_for": {"engine_wedged": "1 m"}}, r"monitoring_alert_for.engine_wedged: '1 m' is not"),
        ({"alert_for": {"engine_wedged": "1m\n- alert: x"}}, "monitoring_alert_for.engine_wedged: contains '\\\\n'"),
        ({"alert_for": {"engine_wedged": "30d"}}, "monitoring_alert_for.engine_wedged: '30d' is above"),
        ({"alert_for": {"engine_wedged": "1h1m1h"}}, "is not a Prometheus duration"),
        ({"alert_for": {"engine_wedged": -5}}, "is not a Prometheus duration"),
        ({"ttft_p95_threshold_s": 0}, "monitoring_ttft_p95_threshold_s: 0 is not above 0"),
        ({"ttft_p95_threshold_s": "fast"}, "monitoring_ttft_p95_threshold_s: expected a number"),
        ({"kv_cache_usage_threshold": 95}, "monitoring_kv_cache_usage_threshold: 95 is above 1"),
        ({"memory_pressure_threshold": float("nan")}, "monitoring_memory_pressure_threshold"),
        ({"watchdog": "yes"}, "monitoring_watchdog_target"),
    ],
    ids=["not a mapping", "unknown alert key", "for not a mapping", "space in duration",
         "newline in duration", "for too long", "units out of order", "negative seconds",
         "zero TTFT", "word TTFT", "KV in percent", "NaN PSI", "watchdog flag a word"],
)  # fmt: skip
def test_bad_rule_options_are_named(spec, pattern):
    with pytest.raises(ValidationError, match=pattern):
        rules.rules(spec)
    with pytest.raises(AnsibleFilterError, match=pattern):
        monitoring.monitoring_rules(spec)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("15s", 15), ("1m30s", 90), ("2h", 7200), ("500ms", 0.5), (20, 20), ("1d", 86400)],
)
def test_durations(value, seconds):
    assert rules.seconds_of(rules.duration("x", value)) == seconds


# --- the dashboard -------------------------------------------------------------


def test_the_committed_dashboard_is_the_generated_one():
    committed = (ROOT / "docs" / "grafana" / "localinference.json").read_text(encoding="utf-8")
    assert committed == monitoring.monitoring_dashboard(), (
        "docs/grafana/localinference.json is stale: run .venv/bin/python tools/monitoring_dashboard.py"
    )


def test_every_panel_query_passes_promtool(tmp_path):
    path = tmp_path / "panels.yml"
    path.write_text(monitoring.dump_yaml(rules.panel_rules(), "test"))
    done = promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    queries = [t["expr"] for p in json.loads(monitoring.monitoring_dashboard())["panels"] for t in p["targets"]]
    assert queries == [r["expr"] for r in rules.panel_rules()["groups"][0]["rules"]]


def test_the_dashboard_layout():
    board = json.loads(monitoring.monitoring_dashboard({"kv_cache_usage_threshold": 0.8}))
    panels = board["panels"]
    assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        cell = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & cell, f"{p['title']} overlaps another panel"
        cells |= cell
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    kv = next(p for p in panels if p["title"] == "KV cache usage")
    assert kv["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"] == 0.8
