# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's parts other than the judgement: node parsers, incidents,
the Prometheus text (read back with prometheus_client's own parser) and the config's bounds."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog import (
    _incidents as incidents,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._config import (
    ConfigError,
    build,
    check,
    node_config,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._kernel import parse_kmsg
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._node import (
    NodeError,
    parse_command,
    parse_show_blocks,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._program import Watchdog
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._prom import (
    render,
)
from prometheus_client.parser import text_string_to_metric_families

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "watchdog"
KMSG = [line.encode() for line in (FIXTURES / "kmsg-xid-oom-aer.txt").read_text().splitlines()]
VLLM = "localinference-vllm.service"
RAY = "localinference-ray.service"


def test_kmsg_first_look_takes_the_end_and_reports_nothing() -> None:
    assert parse_kmsg(KMSG, None) == ([], 1208)


def test_kmsg_events_after_the_cursor_are_classified() -> None:
    events, last = parse_kmsg(KMSG, 1200)
    assert last == 1208
    # The constraint and "Killed process" lines of one kill are one event (pid and name kept);
    # "VLLM::EngineCor invoked oom-killer" starts the next kill.
    assert [(e["seq"], e["kind"], e.get("xid"), e.get("pid"), e.get("process"), e.get("invoked_by"))
            for e in events] == [
        (1201, "xid", 79, None, None, None), (1202, "xid", 79, None, None, None),
        (1204, "oom", None, 16014, "cicc", None), (1206, "oom", None, None, None, "VLLM::EngineCor"),
        (1207, "aer", None, None, None, None)]
    assert events[2]["line"].startswith("Out of memory: Killed process 16014 (cicc)")
    assert parse_kmsg(KMSG, 1206)[0] == [events[-1]]


@pytest.mark.parametrize("record", [b"", b"garbage", b"6,x,1,-;NVRM: Xid (", b"6;NVRM: Xid ("])
def test_kmsg_ignores_what_is_no_record(record: bytes) -> None:
    assert parse_kmsg([record], 5) == ([], 5)


@pytest.mark.parametrize(("text", "want"), [
    ("probe", ("probe", None, [])),
    ("probe 1208", ("probe", 1208, [])),
    ("stop", ("stop", None, [])),
    ("verify", ("verify", None, [])),
    ("start", ("start", None, [])),
    (f"start {RAY}", ("start", None, [RAY])),
])
def test_forced_command_accepts_the_verbs(text: str, want: tuple) -> None:
    assert parse_command(text) == want


@pytest.mark.parametrize("text", [None, "", "bash", "probe; rm -rf /", "probe -1", "probe 1 2",
                                  "stop now", "start sshd.service", "verify --all",
                                  "probe 99999999999999999999999"])
def test_forced_command_refuses_anything_else(text: str | None) -> None:
    with pytest.raises(NodeError, match="refused"):
        parse_command(text)


def test_systemctl_show_blocks() -> None:
    text = (f"Id={VLLM}\nLoadState=loaded\nActiveState=active\nSubState=running\nResult=success\n"
            "NRestarts=2\nActiveEnterTimestampMonotonic=5000000\n\n"
            f"Id={RAY}\nLoadState=loaded\nActiveState=failed\nSubState=failed\nResult=signal\n"
            "NRestarts=\nActiveEnterTimestampMonotonic=0\n")
    units = parse_show_blocks(text)
    assert units[VLLM]["NRestarts"] == 2 and units[VLLM]["active_since_monotonic_us"] == 5000000
    assert units[RAY]["NRestarts"] is None and units[RAY]["active_since_monotonic_us"] is None


# restart_plan: test_restart_order.py, against playbooks/rollout.yml itself.


def test_incidents_append_rotate_and_read(tmp_path: Path) -> None:
    path = str(tmp_path / "incidents.jsonl")
    for n in range(40):
        incidents.append(path, incidents.incident("wedged", f"look {n}", "restart", "recovered", now=1000.0 + n,
                                                  detect_seconds=31.2, recover_seconds=60.0), 2048, 2)
    assert (tmp_path / "incidents.jsonl.1").exists() and (tmp_path / "incidents.jsonl.2").exists()
    assert not (tmp_path / "incidents.jsonl.3").exists()
    assert all(p.stat().st_size <= 2048 for p in tmp_path.iterdir())
    recent = incidents.read_recent(path, 3)
    assert [r["evidence"] for r in recent["incidents"]] == ["look 37", "look 38", "look 39"]
    assert recent["problems"] == [] and oct((tmp_path / "incidents.jsonl").stat().st_mode)[-3:] == "640"


def test_incidents_report_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "incidents.jsonl"
    good = json.dumps(incidents.incident("down", "x", "restart", "failed", now=5.0))
    path.write_bytes(b"\n".join([good.encode(), b"{not json", b"\xff\xfe", b"[]", b"x" * 20000,
                                 json.dumps({**json.loads(good), "verdict": "fine"}).encode(), good.encode()]))
    recent = incidents.read_recent(str(path), 10)
    assert len(recent["incidents"]) == 2 and len(recent["problems"]) == 5
    assert incidents.read_recent(str(tmp_path / "none"), 5) == {"incidents": [], "problems": [], "exists": False}


def test_incident_refuses_values_outside_the_schema() -> None:
    with pytest.raises(ValueError, match="verdict"):
        incidents.incident("fine", "x", "none", "detected", now=1.0)
    with pytest.raises(ValueError, match="detect_seconds"):
        incidents.incident("down", "x", "none", "detected", now=1.0, detect_seconds=-1)


def test_prometheus_text_parses_with_prometheus_client() -> None:
    status = {"verdict": "wedged", "last_look": 1000.5, "ttft_s": None, "bad_looks": 2, "max_restarts": 3,
              "restarts_in_window": 3, "budget_spent": True, "restarts": {"engine": 3}, "incidents": {"wedged": 4},
              "nodes": {"spark-worker": {"drift": ["mtu"], "psi": 1.5, "memory_short": False,
                                         "kernel": {"xid": 1}, "unknown": ["node"]}}}
    families = {f.name: f for f in text_string_to_metric_families(render(status))}
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    p = "localinference_watchdog_"
    assert value[(p + "verdict", (("verdict", "wedged"),))] == 1
    assert value[(p + "verdict", (("verdict", "healthy"),))] == 0
    assert math.isnan(value[(p + "first_token_seconds", ())])
    assert value[(p + "budget_spent", ())] == 1
    assert value[(p + "restarts_total", (("target", "engine"),))] == 3
    assert value[(p + "fabric_drift", (("kind", "mtu"), ("node", "spark-worker")))] == 1
    assert value[(p + "fabric_drift", (("kind", "gid"), ("node", "spark-worker")))] == 0
    assert value[(p + "kernel_events_total", (("kind", "xid"), ("node", "spark-worker")))] == 1
    assert value[(p + "evidence_unknown", (("node", "spark-worker"), ("probe", "node")))] == 1
    assert families[p + "restarts"].type == "counter"


OPTS: dict[str, Any] = {
    "interval_s": 30, "token_deadline_s": 10, "probe_timeout_s": 15, "ready_timeout_s": 900,
    "boot_grace_s": 900, "max_restarts": 3, "restart_window_s": 3600, "recover": True, "psi_limit": 20,
    "min_available_gib": 4, "incidents_path": "/var/lib/localinference/incidents.jsonl",
    "incidents_max_bytes": 1048576, "incidents_keep": 3, "metrics_listen": "127.0.0.1", "metrics_port": 9109,
    "ingress_url": "", "ingress_unit": "caddy.service", "key_file": "/etc/localinference/ingress/api-key.env",
    "serving_path": "/etc/localinference/serving.json", "rdma_sys_root": "/sys", "ssh_user": "root",
    "ssh_key": "/etc/localinference/watchdog/id_ed25519", "known_hosts": "/etc/localinference/watchdog/known_hosts",
    "unit_dirs": ["/etc/containers/systemd", "/etc/systemd/system"],
    "state_path": "/var/lib/localinference/watchdog-state.json", "hold_path": "/run/localinference/rollout.hold",
}
FABRIC = {"primary_ip": "10.89.1.3", "gid_index": 3,
          "interfaces": [{"ifname": "eth1", "address": "10.89.1.3/24", "mtu": 9000, "hca": "rocep1s0f0"}]}
INGRESS = {"listen": ":8080", "routes": [{"model": "org/m", "prefix": "/org/m", "upstream": "127.0.0.1:8000",
                                          "upstream_port": 8000}]}
NODES = [{"name": "head", "rank": 0, "fabric": {**FABRIC, "primary_ip": "10.89.1.2"}},
         {"name": "worker", "rank": 1, "fabric": FABRIC}]


def test_build_the_lab_config() -> None:
    cfg = build(OPTS, NODES, INGRESS)
    assert cfg["ingress"]["base_url"] == "http://127.0.0.1:8080/org/m/v1"
    assert cfg["engine"]["base_url"] == "http://127.0.0.1:8000"
    assert cfg["nodes"][0]["metrics_url"] == "http://127.0.0.1:8000/metrics" and cfg["nodes"][0]["ssh"] is None
    assert cfg["nodes"][1]["ssh"]["host"] == "10.89.1.3" and cfg["nodes"][1]["metrics_url"] is None
    assert cfg["expect"]["worker"] == {"psi_limit": 20, "min_available_bytes": 4 * 2**30, "mtu": 9000, "gid_index": 3}
    assert check(json.loads(json.dumps(cfg)))["nodes"] == cfg["nodes"]
    node = node_config("worker", FABRIC, OPTS)
    assert node["interfaces"] == ["eth1"]
    assert node["rdma"] == [{"hca": "rocep1s0f0", "port": 1, "ipv4": "10.89.1.3", "netdev": "eth1"}]


def test_over_tls_the_probe_goes_to_https_loopback_with_the_heads_ca() -> None:
    """Issue 27: the ingress speaks TLS beyond loopback; its certificate names 127.0.0.1."""
    ca = "/var/lib/caddy/.local/share/caddy/pki/authorities/local/root.crt"
    cfg = build(OPTS, NODES, {**INGRESS, "tls": {"mode": "internal", "ca_file": ca}})
    assert cfg["ingress"]["base_url"] == "https://127.0.0.1:8080/org/m/v1"
    assert cfg["ingress"]["ca_file"] == ca
    assert check(json.loads(json.dumps(cfg)))["ingress"]["ca_file"] == ca
    assert build(OPTS, NODES, INGRESS)["ingress"]["ca_file"] is None
    bad = json.loads(json.dumps(cfg))
    bad["ingress"]["ca_file"] = "../root.crt"
    with pytest.raises(ConfigError, match="ca_file"):
        check(bad)


@pytest.mark.parametrize(("change", "message"), [
    ({"interval_s": 0}, r"watchdog_interval_s: 0 is below 1; set a number between 1 and 3600"),
    ({"interval_s": "30s"}, "watchdog_interval_s: expected a number, got '30s'; set a number between"),
    ({"interval_s": float("nan")}, "watchdog_interval_s: nan is not a finite number; set a number between"),
    ({"token_deadline_s": 30}, r"watchdog_token_deadline_s \(30\) must be shorter than watchdog_interval_s \(30\)"),
    ({"max_restarts": -1}, "watchdog_max_restarts: -1 is below 0; set a number between 0 and"),
    ({"max_restarts": 1.5}, "watchdog_max_restarts: 1.5 is not a whole number"),
    ({"max_restarts": True}, "watchdog_max_restarts: expected a number, got True"),
    ({"restart_window_s": 10**9}, "watchdog_restart_window_s: 1000000000 is above 604800; set a number between 1 and 604800"),
    ({"recover": "yes"}, "watchdog_recover: set true or false"),
    ({"metrics_listen": "localhost\nExecStart=/bin/sh"}, "watchdog_metrics_listen: .* is not an IP address"),
    ({"metrics_port": 70000}, "watchdog_metrics_port"),
    ({"incidents_path": "../incidents"}, "watchdog_incidents_path"),
    ({"incidents_keep": 50}, "watchdog_incidents_keep"),
    ({"ingress_url": "ftp://x/v1"}, "watchdog_ingress_url: 'ftp://x/v1' is not an http\\(s\\) URL"),
    ({"ingress_unit": "caddy"}, "watchdog_ingress_unit"),
    ({"key_file": "/etc/key\n"}, "watchdog_key_file"),
])
def test_bad_options_name_their_variable(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build({**OPTS, **change}, NODES, INGRESS)


def test_a_worker_without_a_fabric_result_is_refused() -> None:
    with pytest.raises(ConfigError, match="worker: no saved fabric result"):
        build(OPTS, [NODES[0], {"name": "worker", "rank": 1, "fabric": {}}], INGRESS)


def test_no_route_is_refused() -> None:
    with pytest.raises(ConfigError, match="run the ingress stage first"):
        build(OPTS, NODES, {"listen": ":8080", "routes": []})


@pytest.mark.parametrize("document", [None, [], {"schema": 2}, {"schema": 1}])
def test_a_saved_config_that_is_not_one_is_refused(document: Any) -> None:
    with pytest.raises(ConfigError):
        check(document)


def test_token_probe_a_silent_stream_is_a_timeout_and_a_closed_port_a_refusal() -> None:
    import socket
    import threading

    from ansible_collections.localinference.vllm.plugins.module_utils.engine._token_probe import (
        first_token,
    )

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held = []

    def accept() -> None:  # a wedged engine: takes the request, never answers
        for _ in range(2):
            conn, _ = server.accept()
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    for _ in range(2):
        silent = first_token(f"http://127.0.0.1:{port}/v1", "m", "k", 0.5)
        assert (silent["ok"], silent["timeout"]) == (False, True), silent
    server.close()
    closed = first_token(f"http://127.0.0.1:{port}/v1", "m", None, 2.0)
    assert (closed["ok"], closed["timeout"], closed.get("refused")) == (False, False, True), closed


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("{future}\n", "a rollout holds the cluster until "),
        ("{future} qualify\n", "a qualification holds the cluster until "),
        ("{past} qualify\n", None),
        ("", None),
        ("not a number", None),
        (None, None),
    ],
)
def test_the_hold_names_who_holds(tmp_path: Path, text: str | None, want: str | None) -> None:
    """The rollout writes a deadline; the qualification a deadline and ``qualify``."""
    hold = tmp_path / "rollout.hold"
    if text is not None:
        hold.write_text(text.format(future=int(time.time()) + 600, past=int(time.time()) - 5))
    dog = Watchdog({**OPTS, "hold_path": str(hold), "state_path": str(tmp_path / "state.json")})
    held = dog.held()
    assert held == want if want is None else held.startswith(want), held


def _answering_server(answers: list[bytes]) -> tuple[int, list[bytes]]:
    """A socket server that reads one request per connection and sends the next answer."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    seen: list[bytes] = []

    def serve() -> None:
        for answer in answers:
            conn, _ = server.accept()
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                head, _, body = request.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                seen.append(head.split(b"\r\n")[0])
                conn.sendall(answer)
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], seen


EMPTY_STREAM = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
TOKEN_STREAM = EMPTY_STREAM + b'data: {"choices":[{"delta":{"content":"OK"}}]}\n\n'


@pytest.mark.parametrize(
    ("answers", "ok", "asked"),
    [
        # Caddy's reload closed the first stream before a byte; the second streams.
        ([EMPTY_STREAM, TOKEN_STREAM], True, 2),
        # An ingress that keeps closing stays a failed look (the judge counts it).
        ([EMPTY_STREAM, EMPTY_STREAM], False, 2),
        # A status is an answer: never asked again.
        ([b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"], False, 1),
        ([TOKEN_STREAM], True, 1),
    ],
)
def test_a_stream_closed_before_its_first_byte_is_asked_once_more(
    tmp_path: Path, answers: list[bytes], ok: bool, asked: int
) -> None:
    port, seen = _answering_server(answers)
    dog = Watchdog({**OPTS, "state_path": str(tmp_path / "state.json"), "token_deadline_s": 5,
                    "ingress": {"base_url": f"http://127.0.0.1:{port}/v1", "model": "m"}})
    token = dog.ingress_token("k")
    assert token["ok"] is ok, token
    assert len(seen) == asked, seen
    assert ("asked_again" in token) is (asked == 2), token


def _restarting_dog(tmp_path: Path, answer) -> tuple[Watchdog, list[str]]:
    """A watchdog on a Ray cluster (head h, worker w) whose node calls ``answer`` (node, command)."""
    calls: list[str] = []
    dog = Watchdog({**OPTS, "state_path": str(tmp_path / "state.json"),
                    "nodes": [{"name": "h", "rank": 0}, {"name": "w", "rank": 1}]})

    def node_call(node: dict[str, Any], command: str, timeout: float) -> dict[str, Any]:
        calls.append(f"{node['name']}: {command}")
        return answer(node["name"], command)

    dog.node_call = node_call  # type: ignore[method-assign]
    dog.wait_token = lambda: (True, "streams again")  # type: ignore[method-assign]
    return dog, calls


LOOK = {"nodes": {"h": {"start_order": [RAY, VLLM]}, "w": {"start_order": [RAY]}}}


def test_a_restart_runs_each_play_on_its_nodes_at_once(tmp_path: Path) -> None:
    """Stop and verify reach both nodes together (a barrier both must meet); the waves keep the order."""
    import threading

    together = threading.Barrier(2, timeout=10)

    def answer(node: str, command: str) -> dict[str, Any]:
        if command in ("stop", "verify"):
            together.wait()  # raises BrokenBarrierError if the two nodes were asked one after another
        return {"ok": True}

    dog, calls = _restarting_dog(tmp_path, answer)
    assert dog.restart_engine(LOOK) == (True, "streams again")
    assert sorted(calls[:2]) == ["h: stop", "w: stop"] and sorted(calls[2:4]) == ["h: verify", "w: verify"]
    assert calls[4:] == [f"h: start {RAY}", f"w: start {RAY}", f"h: start {VLLM}"]


def test_a_refusal_ends_the_restart_after_its_wave(tmp_path: Path) -> None:
    """A node whose files differ is not started: no start after the verify wave, and it is named."""
    def answer(node: str, command: str) -> dict[str, Any]:
        if node == "w" and command == "verify":
            return {"ok": False, "problems": ["unit file changed"]}
        return {"ok": True}

    dog, calls = _restarting_dog(tmp_path, answer)
    assert dog.restart_engine(LOOK) == (False, "w: verify refused: unit file changed")
    assert not [c for c in calls if "start" in c], calls
