# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog in the converged lab, checked from outside. Read-only.

The service runs on the head and judges the lab healthy; its Prometheus text parses; its
config is private; on the worker its key can run only `watchdog node`, only from the head's
cluster address; and a command other than the four verbs is refused there.
"""

from __future__ import annotations

import json
import stat
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lab.harness import CLUSTER_ADDRESSES, HEAD, WORKER, exec_on

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

PROGRAM = "/usr/local/libexec/localinference/watchdog"


def test_the_service_runs_on_the_head_only():
    assert exec_on(HEAD, "systemctl", "is-active", "localinference-watchdog.service").stdout.strip() == "active"
    assert exec_on(HEAD, "systemctl", "is-enabled", "localinference-watchdog.service").stdout.strip() == "enabled"
    done = exec_on(WORKER, "systemctl", "is-active", "localinference-watchdog.service", check=False)
    assert done.stdout.strip() != "active"


def test_its_prometheus_text_parses_and_says_healthy():
    # Served from the end of the first look on; a fault test just before may leave one look
    # that is not healthy yet: wait for a few looks.
    healthy = 'localinference_watchdog_verdict{verdict="healthy"} 1'
    deadline = time.monotonic() + 60
    text = ""
    while healthy not in text and time.monotonic() < deadline:
        time.sleep(0 if not text else 2)
        text = exec_on(HEAD, "curl", "-s", "-m", "5", "http://127.0.0.1:9109/metrics", check=False).stdout
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("localinference_watchdog_up", ())] == 1
    assert samples[("localinference_watchdog_verdict", (("verdict", "healthy"),))] == 1, text
    assert ("localinference_watchdog_fabric_drift", (("kind", "mtu"), ("node", WORKER))) in samples


def test_one_look_from_the_command_line_is_healthy():
    done = exec_on(HEAD, PROGRAM, "once", timeout=60)
    assert json.loads(done.stdout)["verdict"] == "healthy", done.stdout


def test_its_config_is_private():
    mode = int(exec_on(HEAD, "stat", "-c", "%a", "/etc/localinference/watchdog.json").stdout.strip(), 8)
    assert stat.S_IMODE(mode) == 0o600


def test_on_the_worker_the_key_runs_only_the_node_verbs_from_the_head():
    keys = exec_on(WORKER, "cat", "/root/.ssh/authorized_keys").stdout
    line = next(line for line in keys.splitlines() if "localinference-watchdog@" in line)
    assert line.startswith(f'command="{PROGRAM} node",from="{CLUSTER_ADDRESSES[HEAD]}",restrict ')
    refused = exec_on(WORKER, PROGRAM, "node", check=False,
                      timeout=30).stdout  # no SSH_ORIGINAL_COMMAND: nothing to run
    assert json.loads(refused)["ok"] is False and "refused" in refused
