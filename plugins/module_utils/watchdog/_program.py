# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog program: ``watchdog run|once --config FILE`` on the head, ``watchdog node`` everywhere.

Every ``interval_s`` the head looks at the cluster (a streamed token through the ingress
with the key, each node's probe over the cluster link, vLLM's ``/metrics``), judges the look
(``_judge``), acts (``_restart``: the rollout's order) within a restart budget,
records incidents (``_incidents``) and publishes Prometheus text (``_prom``).
The role ``watchdog`` installs this file, embedded with its imports, as
``/usr/local/libexec/localinference/watchdog``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import http.server
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._files import read_text
from ansible_collections.localinference.vllm.plugins.module_utils.engine._metrics import (
    MetricsError,
    summarise,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._token_probe import (
    first_token,
    get,
)
from ansible_collections.localinference.vllm.plugins.module_utils.ingress._caddy import (
    key_from_env_file,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._restart import restart_plan
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog import (
    _hold as hold_file,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog import (
    _incidents as incidents,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._config import (
    ConfigError,
    load_config,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._judge import (
    judge,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._kernel import (
    KINDS as KERNEL_KINDS,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._node import (
    NodeError,
    parse_command,
    run_verb,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._prom import (
    render,
)

NODE_CONFIG = "/etc/localinference/watchdog-node.json"
# A stream the ingress closed before its first byte is asked again after this pause.
REASK_PAUSE_S = 1.0
# After a restart, a streamed token is asked for this often until ready_timeout_s: while the
# engine boots the ingress answers 503 at once, so a short pause costs nothing and the
# recovery ends within this much of the engine's first token.
TOKEN_POLL_S = 2.0


def closed_early(token: dict[str, Any]) -> bool:
    """A probe the ingress closed without a status other than 200 and without a timeout."""
    return (token.get("ok") is False and not token.get("timeout")
            and not str(token.get("error") or "").startswith("HTTP "))


def log(message: str) -> None:
    print(message, flush=True)


def read_key(path: str) -> str:
    """The ingress key from its env file (``_caddy.key_from_env_file``); never printed."""
    return key_from_env_file(read_text(path, 4096), path)


class Watchdog:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.runner = Runner(timeout=cfg["probe_timeout_s"])
        saved = self._load_state()
        self.state: dict[str, Any] = {"restarts": saved.get("restarts", [])}
        self.cursors: dict[str, int | None] = {}
        self.counts = saved.get("counts", {"restarts": {}, "incidents": {}, "kernel": {}})
        self.status: dict[str, Any] = {"verdict": "unknown", "max_restarts": cfg["max_restarts"]}
        self.paged_episode = False

    # ------------------------------------------------------------------ evidence
    def node_call(self, node: dict[str, Any], command: str, timeout: float) -> dict[str, Any]:
        """A node verb: locally on the head, over SSH (forced command) on a worker."""
        ssh = node.get("ssh")
        argv = [sys.executable, "-I", os.path.abspath(sys.argv[0]), "node", *command.split()]
        if ssh:
            argv = ["ssh", "-i", ssh["key"], "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                    "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={ssh['known_hosts']}",
                    "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=2",
                    f"{ssh['user']}@{ssh['host']}", command]
        try:
            rc, out, err = self.runner.run(argv, timeout=timeout)
        except CommandError as exc:
            return {"reachable": False, "ok": False, "error": str(exc)[:300]}
        try:
            answer = json.loads(out)
        except ValueError:
            return {"reachable": False, "ok": False,
                    "error": f"rc {rc}: {(err or out).strip()[:300] or 'no answer'}"}
        if not isinstance(answer, dict):
            return {"reachable": False, "ok": False, "error": "the node answered no JSON object"}
        return answer

    def token(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the ingress probe, the engine's own /health and, when the ingress refused, its token)."""
        ingress, engine_url = self.cfg["ingress"], self.cfg["engine"]["base_url"]
        try:
            key = read_key(ingress["key_file"])
        except (OSError, ValueError) as exc:
            token = {"ok": None, "error": f"the ingress key cannot be read: {exc}"}
        else:
            token = self.ingress_token(key)
        engine: dict[str, Any] = {"health": None, "token_ok": None}
        if token.get("ok") is not True:
            engine["health"], _ = get(engine_url + "/health", min(5.0, self.cfg["token_deadline_s"]))
            if token.get("ok") is False and not token.get("timeout"):
                direct = first_token(engine_url + "/v1", ingress["model"], None, self.cfg["token_deadline_s"])
                engine["token_ok"] = direct["ok"]
        return token, engine

    def ingress_token(self, key: str) -> dict[str, Any]:
        """The ingress's first token; a stream closed before its first byte is asked once more.

        Caddy closes a connection that meets its reload (a key rotation, a new route) with an
        empty body: one more request a second later tells that from an ingress that is broken.
        A timeout (a wedge) or an HTTP status (401, a 503 naming the unit) is never asked again.
        """
        ingress = self.cfg["ingress"]
        probe = functools.partial(first_token, ingress["base_url"], ingress["model"], key,
                                  self.cfg["token_deadline_s"], ingress.get("ca_file"))
        token = probe()
        if closed_early(token):
            time.sleep(REASK_PAUSE_S)
            token = {**probe(), "asked_again": str(token["error"])[:160]}
        return token

    def look(self) -> dict[str, Any]:
        token, engine = self.token()
        look: dict[str, Any] = {"token": token, "engine": engine, "nodes": {}, "metrics": {}}
        for node in self.cfg["nodes"]:
            cursor = self.cursors.get(node["name"])
            answer = self.node_call(node, "probe" + (f" {cursor}" if cursor is not None else ""),
                                    self.cfg["probe_timeout_s"])
            if answer.get("ok") is False and answer.get("reachable", False):
                answer = {"reachable": True, "error": answer.get("error"), "unknown": [answer.get("error")]}
            look["nodes"][node["name"]] = answer
            if answer.get("reachable"):
                self.cursors[node["name"]] = answer.get("kernel_cursor", cursor)
            if node.get("metrics_url"):
                status, body = get(node["metrics_url"], self.cfg["probe_timeout_s"])
                try:
                    summary = summarise(body) if status == 200 else None
                    look["metrics"][node["name"]] = (
                        {"running": summary["requests_running"], "generation_tokens": summary["generation_tokens"],
                         "prompt_tokens": summary["prompt_tokens"], "kv_usage": summary["kv_cache_usage_perc"]}
                        if summary else {"error": f"/metrics answered {status}"})
                except MetricsError as exc:
                    look["metrics"][node["name"]] = {"error": str(exc)[:200]}
        rc, out, _ = self.runner.run(["systemctl", "show", "-p", "ActiveState", "--", self.cfg["ingress"]["unit"]])
        look["ingress_unit"] = {"ActiveState": out.strip().partition("=")[2]} if rc == 0 else {}
        look["time"] = time.time()
        return look

    # ------------------------------------------------------------------ acting
    def held(self) -> str | None:
        """Why the watchdog must not act now (a rollout or a qualification holds the cluster), or None.

        The hold file holds a deadline (epoch seconds) and, after it, who holds (``_hold``).
        """
        try:
            text = read_text(self.cfg["hold_path"], 64)
        except (OSError, ValueError):
            return None
        hold = hold_file.active(text, time.time())
        if hold is None:
            return None
        holder = "a qualification" if hold[1] == hold_file.QUALIFY else "a rollout"
        return f"{holder} holds the cluster until {time.strftime('%H:%M:%S', time.localtime(hold[0]))}"

    def restart_engine(self, look: dict[str, Any]) -> tuple[bool, str]:
        """The rollout's order (``_restart.restart_plan``), then a streamed token through the ingress."""
        nodes = []
        for node in self.cfg["nodes"]:
            order = (look["nodes"].get(node["name"]) or {}).get("start_order")
            if not order:
                answer = self.node_call(node, "verify", self.cfg["probe_timeout_s"])
                order = answer.get("start_order")
            if not order:
                return False, f"{node['name']}: its serving units cannot be read (no restart)"
            nodes.append({"name": node["name"], "rank": node["rank"], "start_order": order})
        for _wave, steps in itertools.groupby(restart_plan(nodes), key=lambda s: s["wave"]):
            refused = self.restart_wave(list(steps))
            if refused:
                return False, refused
        return self.wait_token()

    def restart_wave(self, steps: list[dict[str, Any]]) -> str | None:
        """One wave of the restart on its nodes at once, as the rollout's play runs on its hosts.

        Returns why a node refused (the first in the plan's order), or None when every node did
        its step; the next wave starts only after every node of this one answered.
        """
        by_name = {n["name"]: n for n in self.cfg["nodes"]}

        def call(step: dict[str, Any]) -> dict[str, Any]:
            command = step["step"] + (" " + " ".join(step["units"]) if step["step"] == "start" else "")
            answer = self.node_call(by_name[step["node"]], command, self.cfg["ready_timeout_s"])
            log(f"restart: {step['node']}: {command}: {json.dumps(answer)[:300]}")
            return answer

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(steps)) as pool:
            answered = [(step, pool.submit(call, step)) for step in steps]
        for step, future in answered:
            answer = future.result()
            if not answer.get("ok"):
                problems = answer.get("problems") or [answer.get("error")]
                return f"{step['node']}: {step['step']} refused: {'; '.join(map(str, problems))[:300]}"
        return None

    def restart_ingress(self) -> tuple[bool, str]:
        try:
            rc, _, err = self.runner.run(["systemctl", "restart", "--", self.cfg["ingress"]["unit"]])
        except CommandError as exc:
            return False, str(exc)
        if rc != 0:
            return False, f"systemctl restart {self.cfg['ingress']['unit']} failed: {err.strip()[:200]}"
        return self.wait_token()

    def wait_token(self) -> tuple[bool, str]:
        deadline = time.monotonic() + self.cfg["ready_timeout_s"]
        token: dict[str, Any] = {"error": "not tried"}
        while time.monotonic() < deadline:
            token, _ = self.token()
            if token.get("ok"):
                return True, f"streams again (first token in {token['ttft_s']:.2f} s)"
            time.sleep(min(TOKEN_POLL_S, max(0.0, deadline - time.monotonic())))
        return False, f"no token within {self.cfg['ready_timeout_s']:g} s after the restart: {token.get('error')}"

    def record(self, verdict: str, evidence: str, action: str, outcome: str, **extra: Any) -> None:
        record = incidents.incident(verdict, evidence, action, outcome, now=time.time(),
                                    previous=self.status.get("previous_verdict", "healthy"), **extra)
        cfg = self.cfg["incidents"]
        incidents.append(cfg["path"], record, cfg["max_bytes"], cfg["keep"])
        self.counts["incidents"][verdict] = self.counts["incidents"].get(verdict, 0) + 1
        log(f"incident: {json.dumps(record)}")

    def step(self) -> dict[str, Any]:
        """One look, judged and acted on."""
        look = self.look()
        result = judge(look, self.state, self.cfg)
        hold = self.held()
        if hold and result["action"] in ("restart", "restart-ingress"):
            result["action"], result["evidence"] = "hold", f"{result['evidence']}; {hold}"
        before = self.status.get("verdict", "unknown")
        self.state = result["state"]
        verdict, action = result["verdict"], result["action"]
        log(f"look: {verdict} ({action}): {result['evidence']}")
        if action in ("restart", "restart-ingress"):
            self.status["previous_verdict"] = before
            self.record(verdict, result["evidence"], action, "detected", findings=result["findings"],
                        detect_seconds=result["detect_seconds"])
            # Scraped while the restart runs: the alert fires on the verdict, not after it.
            self.publish(look, result, verdict)
            started = time.monotonic()
            ok, outcome = (self.restart_ingress() if action == "restart-ingress" else self.restart_engine(look))
            target = "ingress" if action == "restart-ingress" else "engine"
            self.counts["restarts"][target] = self.counts["restarts"].get(target, 0) + 1
            self.state["restarts"] = [*self.state["restarts"], time.time()]
            self.record(verdict, f"{result['evidence']} -> {outcome}", action,
                        "recovered" if ok else "failed", findings=result["findings"],
                        detect_seconds=result["detect_seconds"],
                        recover_seconds=time.monotonic() - started + (result["detect_seconds"] or 0))
            self.state.update(bad_looks=0, first_bad_at=None, last_good_at=time.time() if ok else None)
            self.state["previous"] = {}
            verdict = "healthy" if ok else verdict
            self.paged_episode = False
        elif (verdict != before and verdict != "healthy") or (action == "page" and not self.paged_episode):
            self.status["previous_verdict"] = before
            spent = any(f["id"] == "watchdog-budget" for f in result["findings"])
            outcome = "budget-spent" if spent else "paged" if action == "page" else "detected"
            self.record(verdict, result["evidence"], action, outcome, findings=result["findings"],
                        detect_seconds=result["detect_seconds"])
            self.paged_episode = action == "page"
        elif verdict == "healthy" and before not in ("healthy", "unknown"):
            self.status["previous_verdict"] = before
            self.record("healthy", f"{before} cleared: {result['evidence']}", "none", "cleared")
            self.paged_episode = False
        self.publish(look, result, verdict)
        return {"verdict": verdict, "action": action, "evidence": result["evidence"],
                "findings": result["findings"]}

    def publish(self, look: dict[str, Any], result: dict[str, Any], verdict: str) -> None:
        nodes = {}
        for name, node in look["nodes"].items():
            drift = {f.get("kind") for f in result["findings"] if f.get("host") == name}
            for event in node.get("kernel") or []:
                key = f"{name}/{event['kind']}"
                self.counts["kernel"][key] = self.counts["kernel"].get(key, 0) + 1
            nodes[name] = {
                "drift": [k for k in ("mtu", "gid", "link") if k in drift],
                "psi": node.get("psi_some_avg10"),
                "memory_short": "memory" in drift,
                "kernel": {k: self.counts["kernel"].get(f"{name}/{k}", 0) for k in KERNEL_KINDS},
                "unknown": (["node"] if not node.get("reachable") else [])
                + (["metrics"] if "error" in look["metrics"].get(name, {}) else []),
            }
        head = self.cfg["nodes"][0]["name"]
        if look["token"].get("ok") is None:
            nodes.setdefault(head, {}).setdefault("unknown", []).append("token")
        window = self.state.get("restarts", [])
        self.status.update(
            verdict=verdict, last_look=time.time(), ttft_s=look["token"].get("ttft_s"),
            bad_looks=self.state.get("bad_looks", 0), restarts_in_window=len(window),
            budget_spent=len(window) >= self.cfg["max_restarts"], restarts=self.counts["restarts"],
            incidents=self.counts["incidents"], nodes=nodes)
        self.text = render(self.status)
        self._save_state()

    # ------------------------------------------------------------------ state
    def _load_state(self) -> dict[str, Any]:
        try:
            saved = json.loads(read_text(self.cfg["state_path"], 1024 * 1024))
        except (OSError, ValueError):
            return {}
        ok = (isinstance(saved, dict) and isinstance(saved.get("restarts"), list)
              and all(isinstance(t, (int, float)) for t in saved["restarts"])
              and isinstance(saved.get("counts"), dict))
        return saved if ok else {}

    def _save_state(self) -> None:
        path = self.cfg["state_path"]
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump({"restarts": self.state.get("restarts", []), "counts": self.counts}, handle)
        os.replace(path + ".tmp", path)


def serve_metrics(watchdog: Watchdog) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = getattr(watchdog, "text", "").encode()
            self.send_response(200 if self.path == "/metrics" and body else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body if self.path == "/metrics" else b"")

        def log_message(self, *args: Any) -> None:
            pass

    listen = watchdog.cfg["metrics"]
    server = http.server.ThreadingHTTPServer((listen["listen"], listen["port"]), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="watchdog", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("run", "once", "node"))
    parser.add_argument("words", nargs="*", help="node: the verb and its arguments")
    parser.add_argument("--config", default="/etc/localinference/watchdog.json")
    args = parser.parse_args(argv)
    if args.mode == "node":
        return node_main(args.words)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"watchdog: {exc}", file=sys.stderr)
        return 2
    watchdog = Watchdog(cfg)
    if args.mode == "once":
        look = watchdog.look()
        result = judge(look, watchdog.state, cfg)
        print(json.dumps({k: result[k] for k in ("verdict", "action", "evidence", "findings")}))
        return 0
    serve_metrics(watchdog)
    log(f"watchdog: every {cfg['interval_s']:g} s, recover={cfg['recover']}, "
        f"budget {cfg['max_restarts']} in {cfg['restart_window_s']:g} s")
    while True:
        started = time.monotonic()
        try:
            watchdog.step()
        except Exception as exc:  # a look that breaks is logged; the loop goes on
            log(f"look failed: {type(exc).__name__}: {exc}")
        # A first wedge sign is confirmed by the next look at once, not an interval later.
        confirm = watchdog.state.get("bad_looks", 0) == 1
        time.sleep(1.0 if confirm else max(1.0, cfg["interval_s"] - (time.monotonic() - started)))


def node_main(words: Sequence[str]) -> int:
    """``watchdog node VERB`` (the head) or the forced command of the watchdog's key."""
    text = os.environ.get("SSH_ORIGINAL_COMMAND") if not words else " ".join(words)
    try:
        verb, cursor, units = parse_command(text)
        cfg = json.loads(read_text(NODE_CONFIG, 1024 * 1024))
    except (NodeError, OSError, ValueError) as exc:
        print(json.dumps({"ok": False, "reachable": True, "error": str(exc)[:300]}))
        return 1
    answer = run_verb(verb, cfg, Runner(timeout=60), cursor, units)
    print(json.dumps(answer))
    return 0 if answer.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
