# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Claude Code, Codex and Qwen Code, for real, through the configs the client stage wrote.

``make test-lab-clients`` (on a lab made by ``make lab``) installs the pinned clients
(lab/agent-clients.txt, lab/bin/agent-client), runs the client stage with
``agent_client_clients`` naming them, then runs each client for one turn with nothing but
its env file (``.lab/clients/<client>/env``: where its config is, the key, the ingress's CA)
and a scratch HOME, through Caddy over TLS with the key:

- exit 0, the scripted answer, the scripted reasoning kept out of the answer;
- a tool round trip with the client's own tool: the lab's scripted model (lab/tiny_model.py)
  calls the read-only tool each client offers by its own name (Claude Code's ``Bash`` and
  Codex's ``exec_command`` of ``pwd``, Qwen Code's ``glob``), the client runs it without
  asking, sends its result back, and the model answers after it;
- each client's prompt floor measured by the stage (agent_client_floor: its real first
  request, counted by the server) and its budget checked with it;
- no HTTP 4xx in the server's log, and the window each client took from its config.

Crush is not run: its npm package downloads its binary at install time, which the offline
lab cannot do (README, "What the lab cannot prove").
"""

from __future__ import annotations

import json
import os
import re
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest

from lab.harness import (
    HEAD,
    LAB_DIR,
    MODEL,
    VLLM_UNIT,
    api_key,
    exec_on,
    inventory_recipe,
    read_json,
    rollout,
    run,
    run_playbook,
    served_max_model_len,
)
from lab.tiny_model import ANSWER, LAB_TOOLS, REASONING_ANSWER, REASONING_TOOL

pytestmark = pytest.mark.lab

CLIENTS_DIR = LAB_DIR / "clients"
CLI = {
    "claude_code": LAB_DIR / "clients-cli" / "claude_code" / "node_modules" / ".bin" / "claude",
    "codex": LAB_DIR / "clients-cli" / "codex" / "node_modules" / ".bin" / "codex",
    "qwen_code": LAB_DIR / "clients-cli" / "qwen_code" / "node_modules" / ".bin" / "qwen",
}
PROMPT = "Say hello."
RUN_TIMEOUT = 300
# The stage runs the same programs to measure each client's first request.
CLIENT_VARS = {
    "agent_client_clients": ["opencode", *CLI],
    "agent_client_programs": {client: str(path) for client, path in CLI.items()},
}
# The tool the scripted model calls for each client (its own name).
TOOLS = {path.removeprefix("tool-"): name for path, name, _, _ in LAB_TOOLS}
# Prompt tokens of each client's first request through the lab's tokenizer, measured by
# hand in the stop that added the clients (Claude Code ~18,800, Codex ~14,000, Qwen Code
# ~21,600): the stage's own measurement must land near them.
FIRST_REQUEST = {"claude_code": 18800, "codex": 14000, "qwen_code": 21600}


@pytest.fixture(scope="module")
def rendered(lab_hosts, require_lab) -> dict[str, Any]:
    """The client stage run with every installed client; the head's saved client result."""
    missing = [str(path) for path in CLI.values() if not path.exists()]
    require_lab(not missing, f"needs the pinned clients ({', '.join(missing)}): make test-lab-clients")
    done = run_playbook("client.yml", extra_vars=CLIENT_VARS, timeout=900)
    assert done.rc == 0, done.tail()
    return read_json(HEAD, "/etc/localinference/client.json")["result"]


def test_the_stage_measures_each_clients_first_request(rendered):
    """Each installed client's prompt floor is its own first request, counted by the server."""
    floors = rendered["client_floors"]
    assert floors["skipped"] == [] and floors["given"] == {}, floors
    measured = {m["client"]: m for m in floors["measured"]}
    assert set(measured) == set(CLI), floors
    paths = {"claude_code": "/v1/messages", "codex": "/v1/responses", "qwen_code": "/v1/chat/completions"}
    for client, measurement in measured.items():
        assert measurement["request"]["path"] == paths[client], measurement
        assert measurement["request"]["tools"] >= 5, measurement
        assert abs(measurement["prompt_floor"] - FIRST_REQUEST[client]) < 0.1 * FIRST_REQUEST[client], measurement
    budgets = {c["client"]: c["budget"] for c in rendered["clients"]}
    for client, measurement in measured.items():
        assert budgets[client]["prompt_floor"] == measurement["prompt_floor"], budgets[client]
        assert budgets[client]["calibrated"] is True, budgets[client]


def _env(client: str, scratch: Path) -> dict[str, str]:
    env_file = CLIENTS_DIR / client / "env"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600", f"{env_file} must be mode 0600"
    pairs = (line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    keep = ("PATH", "LANG", "TERM")
    env = {name: value for name, value in os.environ.items() if name in keep}
    env.update({name.strip(): value.strip() for name, value in pairs})
    env.update({"HOME": str(scratch), "XDG_CONFIG_HOME": str(scratch / "config"), "NO_COLOR": "1"})
    return env


def _tool_results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claude Code's and Qwen Code's stream: each tool call and what the client sent back for it."""
    calls, results = {}, []
    for event in events:
        for block in (event.get("message") or {}).get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                calls[block["id"]] = block["name"]
            elif block.get("type") == "tool_result":
                content = block.get("content")
                if isinstance(content, list):
                    content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
                results.append({"tool": calls.get(block.get("tool_use_id")), "error": bool(block.get("is_error")),
                                "output": content or ""})  # fmt: skip
    return results


def _claude_code(stdout: str) -> dict[str, Any]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    result = events[-1]
    usage = list((result.get("modelUsage") or {}).values())
    return {
        "ok": result.get("is_error") is False and result.get("subtype") == "success",
        "text": result.get("result") or "",
        "turns": result.get("num_turns"),
        "window": usage[0].get("contextWindow") if len(usage) == 1 else None,
        "tools": _tool_results(events),
    }


def _codex(stdout: str) -> dict[str, Any]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    failed = [e for e in events if e.get("type") in ("turn.failed", "error")]
    commands = [i for i in items if i.get("type") == "command_execution"]
    return {
        "ok": not failed and any(e.get("type") == "turn.completed" for e in events),
        "text": "".join(i.get("text", "") for i in items if i.get("type") == "agent_message"),
        "turns": None,
        "window": None,
        "tools": [
            {"tool": "exec_command", "error": c.get("exit_code") != 0, "output": c.get("aggregated_output", "")}
            for c in commands
        ],
    }


def _qwen_code(stdout: str) -> dict[str, Any]:
    document = json.loads(stdout[stdout.index("["):])
    result = next(e for e in document if e.get("type") == "result")
    tools = ((result.get("stats") or {}).get("tools") or {}).get("byName") or {}
    return {
        "ok": result.get("is_error") is False,
        "text": result.get("result") or "",
        "turns": result.get("num_turns"),
        "window": None,
        "tool_calls": {name: (value.get("count"), value.get("success")) for name, value in tools.items()},
        "tools": _tool_results(document),
    }


COMMANDS = {
    "claude_code": (["-p", PROMPT, "--output-format", "stream-json", "--verbose"], _claude_code),
    "codex": (["exec", "--skip-git-repo-check", "--json", PROMPT], _codex),
    "qwen_code": (["-p", PROMPT, "--output-format", "json"], _qwen_code),
}


class Watch:
    """Every file under ``folder`` (its env file aside) listed every 20 ms while the block runs
    and once after it, and read when new or changed: ``seen`` holds every name that existed,
    ``leaked`` those that held the key, even for a moment."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.key = folder, api_key().encode()
        self.seen: set[str] = set()
        self.leaked: list[str] = []
        self.stamps: dict[str, tuple[int, int]] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.look_until_done, daemon=True)

    def look(self) -> None:
        for parent, _, names in os.walk(self.folder):  # a folder gone meanwhile is skipped
            for path in (Path(parent) / name for name in names if name != "env"):
                name = str(path.relative_to(self.folder))
                try:
                    info = path.stat()
                    if self.stamps.get(name) != (info.st_mtime_ns, info.st_size):
                        self.stamps[name] = (info.st_mtime_ns, info.st_size)
                        self.seen.add(name)
                        if self.key in path.read_bytes():
                            self.leaked.append(name)
                except OSError:  # gone between listing and reading
                    continue

    def look_until_done(self) -> None:
        while not self.done.wait(0.02):
            self.look()

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(10)
        self.look()
        self.leaked = sorted(set(self.leaked))


@pytest.mark.parametrize("client", list(CLI))
def test_the_real_client_completes_a_turn_through_its_generated_config(rendered, client, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "README.md").write_text("A project the client works in.\n")
    since = exec_on(HEAD, "date", "+%s").stdout.strip()
    argv, parse = COMMANDS[client]
    with Watch(CLIENTS_DIR / client) as written:
        done = run(
            ["timeout", "--kill-after=10", str(RUN_TIMEOUT), CLI[client], *argv],
            env=_env(client, tmp_path),
            cwd=work,
            timeout=RUN_TIMEOUT + 60,
            check=False,
            input="",
        )
    shown = f"rc={done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-1500:]}"
    assert done.returncode == 0, shown
    turn = parse(done.stdout)
    assert turn["ok"], shown
    assert turn["text"].strip() == ANSWER, shown
    for reasoning in (REASONING_TOOL, REASONING_ANSWER, "<think>", "</think>"):
        assert reasoning not in turn["text"], shown
    journal = exec_on(
        HEAD, "journalctl", "-u", VLLM_UNIT, "--since", f"@{since}", "--no-pager", "-o", "cat"
    ).stdout
    posts = [line for line in journal.splitlines() if '"POST /v1/' in line]
    assert len(posts) >= 2, f"the server logged {len(posts)} requests for a turn with a tool call:\n{journal[-1500:]}"
    refused = [line for line in journal.splitlines() if re.search(r'" 4\d\d ', line)]
    assert not refused, "HTTP 4xx in the server log:\n" + "\n".join(refused[-5:])
    # The tool round trip: the client's own tool called, run without asking, its result sent
    # back, then the answer after it.
    (ran,) = turn["tools"]
    assert ran["tool"] == TOOLS[client] and not ran["error"], shown
    if client == "qwen_code":
        assert turn["tool_calls"] == {"glob": (1, 1)} and turn["turns"] == 2, shown
        assert "Found 1 matching file" in ran["output"], shown
    else:  # Bash / exec_command of pwd, in the client's working directory
        assert ran["output"].strip() == str(work), shown
    if client == "claude_code":
        assert turn["turns"] == 2, shown
        # The window Claude Code took is the served context the config says, not its 1M guess.
        assert turn["window"] == rendered["max_model_len"], shown
    # Nothing the client wrote in its folder, while it ran or after, holds the key but its env
    # file: Codex 0.169.0 snapshots the exported environment into shell_snapshots/ (mode 0644)
    # during a run unless its config turns that off.
    assert written.leaked == [], written.leaked
    assert [name for name in written.seen if name.startswith("shell_snapshots/")] == [], written.seen


def test_the_doctor_names_a_wrong_limit_planted_in_a_clients_config(rendered):
    """Qwen Code's window set above the served context: F8 for qwen_code, that file named."""
    path = CLIENTS_DIR / "qwen_code" / "settings.json"
    before = path.read_text()
    document = json.loads(before)
    document["modelProviders"]["openai"][0]["generationConfig"]["contextWindowSize"] = 4 * rendered["max_model_len"]
    try:
        path.write_text(json.dumps(document, indent=2))
        planted = run_playbook("doctor.yml", timeout=600)
    finally:
        path.write_text(before)
    flat = " ".join((planted.stdout + planted.stderr).split())
    assert planted.rc != 0, flat[-3000:]
    assert "F8 error qwen_code: generationConfig.contextWindowSize" in flat, flat[-3000:]
    assert str(path) in flat, flat[-3000:]
    healthy = run_playbook("doctor.yml", timeout=600)
    assert healthy.rc == 0 and "qwen_code" not in healthy.stdout, healthy.tail()


def test_a_users_codex_config_is_merged_and_check_diff_shows_only_the_collections_keys(rendered):
    """A config the user already had keeps their keys; ``--check --diff`` shows the change, writes nothing."""
    path = CLIENTS_DIR / "codex" / "config.toml"
    before = path.read_text()
    users = before.replace('model_context_window = ', 'model_context_window = 1').replace(
        "[model_providers.", '[profiles.mine]\nmodel = "someone-elses"\n\n[model_providers.', 1
    )
    assert users != before
    try:
        path.write_text(users)
        check = run_playbook("client.yml", "--check", "--diff", extra_vars=CLIENT_VARS, timeout=900)
        assert check.rc == 0, check.tail()
        assert path.read_text() == users, "--check wrote the config"
        shown = check.stdout
        # The window written back, the user's profile kept (no removed line but the window).
        assert f"+model_context_window = {rendered['max_model_len']}" in shown, check.tail()
        removed = [line for line in shown.splitlines() if line.startswith("-") and "=" in line]
        assert [line for line in removed if "profiles" in line or "someone-elses" in line] == [], removed
        assert api_key() not in shown + check.stderr, "the key in the diff"
        done = run_playbook("client.yml", extra_vars=CLIENT_VARS, timeout=900)
        assert done.rc == 0, done.tail()
        after = path.read_text()
        assert '[profiles.mine]' in after and 'model = "someone-elses"' in after, after
        assert f"model_context_window = {rendered['max_model_len']}\n" in after, after
    finally:
        path.write_text(before)


def windows() -> dict[str, int]:
    """The context window each client's config on this workstation holds."""
    def read(client: str) -> dict[str, Any]:
        text = (CLIENTS_DIR / client / {"codex": "config.toml"}.get(client, "settings.json")).read_text()
        return tomllib.loads(text) if client == "codex" else json.loads(text)

    opencode = json.loads((LAB_DIR / "opencode" / "opencode.json").read_text())
    qwen = read("qwen_code")["modelProviders"]["openai"][0]
    return {
        "opencode": opencode["provider"]["localinference"]["models"][MODEL]["limit"]["context"],
        "claude_code": int(read("claude_code")["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"]),
        "codex": read("codex")["model_context_window"],
        "qwen_code": qwen["generationConfig"]["contextWindowSize"],
    }


def test_a_rollout_that_changes_the_served_length_rewrites_every_client(rendered):
    """More KV: the rollout serves a longer context and the client stage after it rewrites all four."""
    served = served_max_model_len()
    assert set(windows().values()) == {served}, windows()
    recipe = inventory_recipe()
    larger = {**recipe, "kv_cache_memory_bytes": recipe["kv_cache_memory_bytes"] * 2}
    try:
        run = rollout(larger, tags="rollout,client", extra_vars=CLIENT_VARS)
        assert run.rc == 0, run.tail()
        longer = served_max_model_len()
        assert longer > served, (longer, served)
        assert windows() == dict.fromkeys(windows(), longer)
    finally:
        back = rollout(tags="rollout,client", extra_vars=CLIENT_VARS)
    assert back.rc == 0, back.tail()
    assert served_max_model_len() == served
    assert windows() == dict.fromkeys(windows(), served)


def test_a_served_length_a_client_cannot_fit_in_is_refused_before_any_file_is_written(rendered):
    """Half the KV: Claude Code's and Qwen Code's measured first requests leave less than the
    work room below their compaction points, so the client stage names both with their numbers
    and writes no client's config (opencode's included)."""
    served = served_max_model_len()
    configs = {path: path.read_bytes() for path in [*CLIENTS_DIR.glob("*/*"), LAB_DIR / "opencode" / "opencode.json"]
               if path.is_file()}  # fmt: skip
    recipe = inventory_recipe()
    smaller = {**recipe, "kv_cache_memory_bytes": recipe["kv_cache_memory_bytes"] // 2}
    try:
        run = rollout(smaller, tags="rollout,client", extra_vars=CLIENT_VARS)
        assert served_max_model_len() == served // 2
        assert run.rc != 0, run.tail()
        assert "no client config was written" in run.flat, run.tail()
        for client in ("claude_code", "qwen_code"):
            assert client in run.flat, run.tail()
        assert str(served // 2) in run.flat, run.tail()
        changed = [str(path) for path, data in configs.items() if path.read_bytes() != data]
        assert changed == [], changed
    finally:
        back = rollout(tags="rollout,client", extra_vars=CLIENT_VARS)
    assert back.rc == 0, back.tail()
    assert served_max_model_len() == served
