# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The real opencode client against the lab, through the config the client stage wrote.

``make lab`` ends with the client stage (playbooks/client.yml): opencode
1.18.33 installed by lab/bin/opencode in .lab/opencode-cli, its config in
.lab/opencode/opencode.json and the key in .lab/opencode/env (0600), the
measurements saved on the head as /etc/localinference/client.json.

1. ``opencode run`` through that config completes a turn with a tool round
   trip: the lab's scripted model (lab/tiny_model.py) reasons, calls opencode's
   ``read`` tool, and answers after the result. Exit 0, the tool completed,
   the scripted answer, the reasoning opencode read from vLLM's
   ``delta.reasoning`` separated from the text (no think tags in it), no HTTP
   400 in the server's log, and no compaction: the server saw exactly the two
   requests of the two steps.
2. Seed 000's broken config (context 8192, compaction.reserved 8000: a working
   budget of 192 tokens against the measured floor) is caught by
   ``opencode_config state=checked`` with F9 and the numbers, before any client
   is run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lab.harness import (
    BIN,
    HEAD,
    LAB_DIR,
    MODEL,
    VLLM_UNIT,
    ansible_env,
    exec_on,
    module_utils,
    read_json,
    run,
)
from lab.tiny_model import ANSWER, REASONING_ANSWER, REASONING_TOOL, TOOL_NAME

pytestmark = pytest.mark.lab

OPENCODE = LAB_DIR / "opencode-cli" / "node_modules" / ".bin" / "opencode"
CONFIG = LAB_DIR / "opencode" / "opencode.json"
ENV_FILE = LAB_DIR / "opencode" / "env"
CLIENT_RESULT = "/etc/localinference/client.json"
PROVIDER = "localinference"
METRICS = "http://127.0.0.1:8000/metrics"
# opencode loops forever when its prompt cannot fit: every run is bounded.
RUN_TIMEOUT = 600


@pytest.fixture(scope="module")
def client(lab_hosts) -> dict:
    if not (OPENCODE.exists() and CONFIG.is_file()):
        reason = (
            f"needs opencode ({OPENCODE}, lab/bin/opencode) and the client stage's config ({CONFIG}):"
            " run make lab (or ansible-playbook playbooks/client.yml)"
        )
        if os.environ.get("LOCALINFERENCE_LAB_REQUIRED") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return read_json(HEAD, CLIENT_RESULT)["result"]


def _env_file() -> dict[str, str]:
    if not ENV_FILE.is_file():
        return {}
    assert oct(ENV_FILE.stat().st_mode & 0o777) == "0o600", f"{ENV_FILE} must be mode 0600"
    pairs = (line.split("=", 1) for line in ENV_FILE.read_text().splitlines() if "=" in line)
    return {name.strip(): value.strip() for name, value in pairs}


def _opencode_env(scratch: Path, config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCODE", "XDG_"))}
    env.update(_env_file())
    env.update(
        {
            "HOME": str(scratch),
            "XDG_CONFIG_HOME": str(scratch / "config"),
            "XDG_DATA_HOME": str(scratch / "data"),
            "XDG_CACHE_HOME": str(scratch / "cache"),
            "XDG_STATE_HOME": str(scratch / "state"),
            "OPENCODE_CONFIG": str(config),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "NO_COLOR": "1",
        }
    )
    return env


def _requests_seen() -> float:
    text = exec_on(HEAD, "curl", "-s", "-m", "10", METRICS).stdout
    count = module_utils("client._opencode_measure").metric_total(
        text, "vllm:request_prompt_tokens_count", MODEL
    )
    assert count is not None, f"no vLLM metrics at {METRICS} on {HEAD}: {text[:300]}"
    return count


def test_opencode_completes_a_turn_through_the_generated_config(client, tmp_path):
    config = json.loads(CONFIG.read_text())
    assert config["share"] == "disabled" and config["autoupdate"] is False
    limits = config["provider"][PROVIDER]["models"][MODEL]["limit"]
    assert limits["context"] == client["max_model_len"]
    work = tmp_path / "work"
    work.mkdir()
    since = exec_on(HEAD, "date", "+%s").stdout.strip()
    requests_before = _requests_seen()
    done = run(
        [
            "timeout", "--kill-after=10", str(RUN_TIMEOUT), OPENCODE, "run", "--format", "json",
            "-m", f"{PROVIDER}/{MODEL}", "--title", "lab test", "--thinking", "Say hello.",
        ],
        env=_opencode_env(tmp_path, CONFIG),
        cwd=work,
        timeout=RUN_TIMEOUT + 60,
        check=False,
    )  # fmt: skip
    requests = _requests_seen() - requests_before
    turn = module_utils("client._opencode_measure").run_events(done.stdout)
    journal = exec_on(
        HEAD, "journalctl", "-u", VLLM_UNIT, "--since", f"@{since}", "--no-pager", "-o", "cat"
    ).stdout
    rejected = [line for line in journal.splitlines() if '" 400 ' in line or "HTTP/1.1 400" in line]
    shown = f"rc={done.returncode}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}"
    assert done.returncode == 0, shown
    assert not turn["errors"], shown
    assert ANSWER in turn["text"], f"not the scripted answer:\n{shown}"
    assert REASONING_TOOL in turn["reasoning"] and REASONING_ANSWER in turn["reasoning"], turn["reasoning"][:500]
    assert "<think>" not in turn["text"] and "</think>" not in turn["text"], turn["text"][:500]
    assert turn["tool_calls"] == [{"tool": TOOL_NAME, "status": "completed"}], turn["tool_calls"]
    assert not rejected, "HTTP 400 in the server log:\n" + "\n".join(rejected[-5:])
    # No compaction: two steps (the tool call, then the answer), two requests the
    # server counted, and the first request fits the working budget of the config.
    assert [step["reason"] for step in turn["steps"]] == ["tool-calls", "stop"], turn["steps"]
    assert turn["compactions"] == 0, turn
    assert requests == 2, f"the server saw {requests:g} requests for one turn: {turn['steps']}"
    assert turn["steps"][0]["input"] >= client["prompt_floor"] - 200, turn["steps"]


def test_checked_catches_seed_000_config_before_the_client_runs(client, tmp_path):
    broken = json.loads(CONFIG.read_text())
    broken["provider"][PROVIDER]["models"][MODEL]["limit"] = {
        "context": 8192,
        "input": 8192,
        "output": 4096,
    }
    broken["compaction"] = {"reserved": 8000}
    path = tmp_path / "opencode.json"
    path.write_text(json.dumps(broken, indent=2))
    before = path.read_text()
    args = {
        "path": str(path),
        "state": "checked",
        "provider": PROVIDER,
        "model": MODEL,
        "max_model_len": client["max_model_len"],
        "prompt_floor": client["prompt_floor"],
        "reasoning_key": client["reasoning_key"],
        "client_version": client["opencode_version"],
    }
    done = run(
        [
            BIN / "ansible",
            "localhost",
            "-m",
            "localinference.vllm.opencode_config",
            "-a",
            json.dumps(args),
        ],
        env=ansible_env(),
        check=False,
    )
    flat = " ".join(done.stdout.split())
    assert done.returncode != 0, flat
    assert "[F9 error]" in flat and "working budget is 192 tokens" in flat, flat
    assert f"prompt floor {client['prompt_floor']}" in flat, flat
    assert path.read_text() == before
