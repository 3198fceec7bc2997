# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Claude Code, Codex and Qwen Code, for real, through the configs the client stage wrote.

``make test-lab-clients`` (on a lab made by ``make lab``) installs the pinned clients
(lab/agent-clients.txt, lab/bin/agent-client), runs the client stage with
``agent_client_clients`` naming them, then runs each client for one turn with nothing but
its env file (``.lab/clients/<client>/env``: where its config is, the key, the ingress's CA)
and a scratch HOME, through Caddy over TLS with the key:

- exit 0, the scripted answer, the scripted reasoning kept out of the answer;
- a tool round trip: the lab's scripted model (lab/tiny_model.py) calls opencode's ``read``
  whatever tools it is offered, none of these clients offers a tool of that name, so each
  client sends back its own refusal of that call as the tool's result and the model answers
  after it. The round trip is real (the call parsed by the client, its result in the second
  request); the tool itself never runs. A model that calls each client's own tool by its
  own name is not built (the scripted weights know one call);
- no HTTP 4xx in the server's log, and the window each client took from its config.

Crush is not run: its npm package downloads its binary at install time, which the offline
lab cannot do (README, "What the lab cannot prove").
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from lab.harness import HEAD, LAB_DIR, VLLM_UNIT, api_key, exec_on, read_json, run, run_playbook
from lab.tiny_model import ANSWER, REASONING_ANSWER, REASONING_TOOL, TOOL_NAME

pytestmark = pytest.mark.lab

CLIENTS_DIR = LAB_DIR / "clients"
CLI = {
    "claude_code": LAB_DIR / "clients-cli" / "claude_code" / "node_modules" / ".bin" / "claude",
    "codex": LAB_DIR / "clients-cli" / "codex" / "node_modules" / ".bin" / "codex",
    "qwen_code": LAB_DIR / "clients-cli" / "qwen_code" / "node_modules" / ".bin" / "qwen",
}
PROMPT = "Say hello."
RUN_TIMEOUT = 300


@pytest.fixture(scope="module")
def rendered(lab_hosts, require_lab) -> dict[str, Any]:
    """The client stage run with every installed client; the head's saved client result."""
    missing = [str(path) for path in CLI.values() if not path.exists()]
    require_lab(not missing, f"needs the pinned clients ({', '.join(missing)}): make test-lab-clients")
    done = run_playbook(
        "client.yml", extra_vars={"agent_client_clients": ["opencode", *CLI]}, timeout=900
    )
    assert done.rc == 0, done.tail()
    return read_json(HEAD, "/etc/localinference/client.json")["result"]


def _env(client: str, scratch: Path) -> dict[str, str]:
    env_file = CLIENTS_DIR / client / "env"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600", f"{env_file} must be mode 0600"
    pairs = (line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    keep = ("PATH", "LANG", "TERM")
    env = {name: value for name, value in os.environ.items() if name in keep}
    env.update({name.strip(): value.strip() for name, value in pairs})
    env.update({"HOME": str(scratch), "XDG_CONFIG_HOME": str(scratch / "config"), "NO_COLOR": "1"})
    return env


def _claude_code(stdout: str) -> dict[str, Any]:
    result = json.loads(stdout.strip().splitlines()[-1])
    usage = list((result.get("modelUsage") or {}).values())
    return {
        "ok": result.get("is_error") is False and result.get("subtype") == "success",
        "text": result.get("result") or "",
        "turns": result.get("num_turns"),
        "window": usage[0].get("contextWindow") if len(usage) == 1 else None,
    }


def _codex(stdout: str) -> dict[str, Any]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    failed = [e for e in events if e.get("type") in ("turn.failed", "error")]
    return {
        "ok": not failed and any(e.get("type") == "turn.completed" for e in events),
        "text": "".join(i.get("text", "") for i in items if i.get("type") == "agent_message"),
        "turns": None,
        "window": None,
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
        "tool_calls": {name: value.get("count") for name, value in tools.items()},
    }


COMMANDS = {
    "claude_code": (["-p", PROMPT, "--output-format", "json"], _claude_code),
    "codex": (["exec", "--skip-git-repo-check", "--json", PROMPT], _codex),
    "qwen_code": (["-p", PROMPT, "--output-format", "json"], _qwen_code),
}


@pytest.mark.parametrize("client", list(CLI))
def test_the_real_client_completes_a_turn_through_its_generated_config(rendered, client, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    since = exec_on(HEAD, "date", "+%s").stdout.strip()
    argv, parse = COMMANDS[client]
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
    # The tool round trip: the scripted call, then the answer after its result.
    if client == "qwen_code":
        assert turn["tool_calls"] == {TOOL_NAME: 1} and turn["turns"] == 2, shown
    if client == "claude_code":
        assert turn["turns"] == 2, shown
        # The window Claude Code took is the served context the config says, not its 1M guess.
        assert turn["window"] == rendered["max_model_len"], shown
    if client == "codex":
        assert "unsupported call: " + TOOL_NAME in done.stderr, shown


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
        clients = {"agent_client_clients": ["opencode", *CLI]}
        check = run_playbook("client.yml", "--check", "--diff", extra_vars=clients, timeout=900)
        assert check.rc == 0, check.tail()
        assert path.read_text() == users, "--check wrote the config"
        shown = check.stdout
        # The window written back, the user's profile kept (no removed line but the window).
        assert f"+model_context_window = {rendered['max_model_len']}" in shown, check.tail()
        removed = [line for line in shown.splitlines() if line.startswith("-") and "=" in line]
        assert [line for line in removed if "profiles" in line or "someone-elses" in line] == [], removed
        assert api_key() not in shown + check.stderr, "the key in the diff"
        done = run_playbook("client.yml", extra_vars=clients, timeout=900)
        assert done.rc == 0, done.tail()
        after = path.read_text()
        assert '[profiles.mine]' in after and 'model = "someone-elses"' in after, after
        assert f"model_context_window = {rendered['max_model_len']}\n" in after, after
    finally:
        path.write_text(before)
