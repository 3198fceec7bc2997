# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Alerts delivered (issue 37, item 7): the wedge alert reaches a receiver, firing while the
engine is wedged and resolved once the watchdog has recovered it.

The steps, each undone in a ``finally``:

1. a webhook receiver on the head's loopback (``python3`` under ``systemd-run``, unit
   :data:`RECEIVER_UNIT`): every POST it gets is one JSON line in :data:`RECEIVED`;
2. the monitoring stage again (``site.yml --tags monitoring``) with ``monitoring_webhook_url``
   pointing at it; ``/etc/prometheus/alertmanager.yml`` then has the webhook with
   ``send_resolved: true``;
3. the measured wedge (``kill -STOP`` of the worker's tensor-parallel rank), left to the
   watchdog, which detects it and restarts the cluster;
4. the receiver got Alertmanager's webhook payload (version 4) for
   ``LocalinferenceEngineWedged`` with status ``firing``, then, after the watchdog's
   "recovered" incident, one with status ``resolved``;
5. the monitoring stage again with the inventory's own variables (no webhook), the receiver
   stopped and its files removed.

Timing, from the lab's inventory (``inventories/lab/group_vars/all.yml``) and the rendered
``alertmanager.yml`` (``plugins/module_utils/monitoring/_config.py``): the watchdog
looks every 10 s and calls a wedge on the second bad look; Prometheus scrapes and evaluates
every 5 s and the alert must hold 10 s (``monitoring_alert_for.engine_wedged``); the
watchdog publishes ``wedged`` before it restarts and keeps it while the restart runs (about
40 s in the lab), so the alert fires during the restart; Alertmanager sends a new group after
``group_wait`` (10 s) and a change to it (the resolution) at the next ``group_interval``
tick (1 m). Firing is due about a minute after the stop, resolved at most about 80 s after
the recovery. The whole test takes 4 to 6 minutes (two monitoring runs of about a minute
each included): marked ``extended``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from lab.harness import (
    HEAD,
    RANK_PATTERN,
    WORKER,
    exec_on,
    incidents,
    inventory_var,
    rank_pids,
    read_text,
    reset_watchdog_budget,
    run_playbook,
    streams_a_token,
    wait_for,
    write_text,
)

# "watchdog": the faults' conftest leaves the watchdog running for this test.
pytestmark = [pytest.mark.lab, pytest.mark.extended, pytest.mark.watchdog,
              pytest.mark.usefixtures("lab_hosts")]

ALERT = "LocalinferenceEngineWedged"
RECEIVER_UNIT = "localinference-alert-receiver"
RECEIVER_DIR = "/run/localinference-alert-receiver"
RECEIVED = f"{RECEIVER_DIR}/received.jsonl"
RECEIVER_PORT = 19093
WEBHOOK_URL = f"http://127.0.0.1:{RECEIVER_PORT}/alertmanager"
ALERTMANAGER_YML = "/etc/prometheus/alertmanager.yml"
MONITORING_TIMEOUT = 900
# Alertmanager's group_interval in the rendered alertmanager.yml: a resolution is sent at its next tick.
GROUP_INTERVAL_S = 60

# The receiver: answers GET with "ok" (ready), appends every POST as one JSON line
# {"at": epoch, "path": ..., "payload": the JSON body or null, "raw": the body when it is not JSON}.
RECEIVER = '''\
import http.server, json, sys, time
port, out = int(sys.argv[1]), sys.argv[2]
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode("utf-8", "replace")
        try:
            record = {"payload": json.loads(body)}
        except ValueError:
            record = {"payload": None, "raw": body[:4000]}
        record.update(at=time.time(), path=self.path)
        with open(out, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\\n")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Receiver).serve_forever()
'''


def interval() -> float:
    return float(inventory_var("watchdog_interval_s"))


def received() -> list[dict[str, Any]]:
    """Every POST the receiver got, oldest first (a torn last line is skipped)."""
    records = []
    for line in exec_on(HEAD, "cat", RECEIVED, check=False).stdout.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def wedge_notice(status: str, after: float) -> dict[str, Any] | None:
    """The first notification for :data:`ALERT` with this group status received at or after ``after``."""
    for record in received():
        payload = record.get("payload") or {}
        names = {a.get("labels", {}).get("alertname") for a in payload.get("alerts") or []}
        if record["at"] >= after and payload.get("status") == status and ALERT in names:
            return record
    return None


def new_incident(seen: int, **match: Any) -> dict[str, Any] | None:
    for record in incidents()[seen:]:
        if all(record.get(k) == v for k, v in match.items()):
            return record
    return None


def listening(port: int) -> bool:
    done = exec_on(HEAD, "ss", "-Hltn", "sport", "=", f":{port}", check=False)
    return bool(done.stdout.strip())


def monitoring_stage(extra_vars: dict[str, Any] | None = None) -> None:
    """``site.yml --tags monitoring``; ``extra_vars`` over the lab inventory's."""
    run = run_playbook("site.yml", tags="monitoring", extra_vars=extra_vars, timeout=MONITORING_TIMEOUT)
    assert run.rc == 0, run.tail()


def webhooks() -> list[dict[str, Any]]:
    """The webhook_configs of the head's alertmanager.yml (its one receiver, "operator")."""
    config = yaml.safe_load(read_text(HEAD, ALERTMANAGER_YML))
    return [hook for receiver in config["receivers"] for hook in receiver.get("webhook_configs") or []]


def stop_receiver() -> None:
    exec_on(HEAD, "systemctl", "stop", f"{RECEIVER_UNIT}.service", check=False)
    exec_on(HEAD, "systemctl", "reset-failed", f"{RECEIVER_UNIT}.service", check=False)


@pytest.fixture
def receiver() -> Iterator[None]:
    """The webhook receiver on the head's loopback; stopped and removed afterwards."""
    stop_receiver()  # a run killed before its finally left it behind
    assert not listening(RECEIVER_PORT), f"port {RECEIVER_PORT} on {HEAD} is taken: pick another RECEIVER_PORT"
    exec_on(HEAD, "install", "-d", "-m", "0700", RECEIVER_DIR)
    write_text(HEAD, f"{RECEIVER_DIR}/receiver.py", RECEIVER)
    try:
        # RuntimeMaxSec: gone within the hour even if this process dies before its finally.
        exec_on(HEAD, "systemd-run", f"--unit={RECEIVER_UNIT}", "--collect",
                "--property=RuntimeMaxSec=3600", "/usr/bin/python3",
                f"{RECEIVER_DIR}/receiver.py", str(RECEIVER_PORT), RECEIVED)
        ready = f"http://127.0.0.1:{RECEIVER_PORT}/ready"
        assert wait_for("the receiver", lambda: exec_on(
            HEAD, "curl", "-s", "-m", "2", ready, check=False).stdout == "ok", 30)
        yield
    finally:
        stop_receiver()
        exec_on(HEAD, "rm", "-rf", RECEIVER_DIR, check=False)


@pytest.fixture
def webhook_configured(receiver: None) -> Iterator[None]:
    """The monitoring stage with ``monitoring_webhook_url`` at the receiver; the lab's own
    configuration (no webhook) again afterwards."""
    try:
        monitoring_stage({"monitoring_webhook_url": WEBHOOK_URL})
        assert webhooks() == [{"url": WEBHOOK_URL, "send_resolved": True}], read_text(HEAD, ALERTMANAGER_YML)
        yield
    finally:
        monitoring_stage()
        assert webhooks() == [], read_text(HEAD, ALERTMANAGER_YML)


def test_the_wedge_alert_reaches_a_webhook_firing_and_then_resolved(webhook_configured: None) -> None:
    reset_watchdog_budget()
    assert wait_for("a streamed token", lambda: streams_a_token(timeout=20), 300)
    healthy = 'localinference_watchdog_verdict{verdict="healthy"} 1'
    assert wait_for("the watchdog's healthy verdict", lambda: healthy in exec_on(
        HEAD, "curl", "-s", "-m", "5", "http://127.0.0.1:9109/metrics", check=False).stdout, 6 * interval())
    seen, started = len(incidents()), time.time()
    ranks = rank_pids()
    assert ranks, f"no process {RANK_PATTERN!r} on {WORKER}"
    exec_on(WORKER, "kill", "-STOP", *ranks)
    try:
        firing = wait_for("the firing notification", lambda: wedge_notice("firing", started),
                          6 * interval() + 120)
        recovered = wait_for("the watchdog's recovery", lambda: new_incident(
            seen, verdict="wedged", action="restart", outcome="recovered"), 400)
    finally:
        exec_on(WORKER, "kill", "-CONT", *ranks, check=False)  # gone once restarted: no error
    resolved = wait_for("the resolved notification", lambda: wedge_notice("resolved", firing["at"]),
                        GROUP_INTERVAL_S + 120)

    payload = firing["payload"]
    assert (payload["version"], payload["receiver"], firing["path"]) == ("4", "operator", "/alertmanager"), payload
    alert = next(a for a in payload["alerts"] if a["labels"]["alertname"] == ALERT)
    assert (alert["status"], alert["labels"]["verdict"], alert["labels"]["severity"]) == (
        "firing", "wedged", "critical"), alert
    assert "F28" in alert["annotations"]["description"], alert
    assert resolved["at"] >= recovered["epoch"], (resolved, recovered)
    ended = [a for a in resolved["payload"]["alerts"] if a["labels"]["alertname"] == ALERT]
    assert ended and all(a["status"] == "resolved" for a in ended), resolved["payload"]
    assert streams_a_token(timeout=60)
    print(f"\nfiring {firing['at'] - started:.0f} s after the stop, recovered "
          f"{recovered['epoch'] - started:.0f} s, resolved {resolved['at'] - started:.0f} s")
