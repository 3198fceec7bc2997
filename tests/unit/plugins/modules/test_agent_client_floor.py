# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""agent_client_floor with real sockets and a real program: the recorder on the loopback, an
endpoint that counts the prompt it is sent, and a client program that reads the config the
module rendered for it and sends its first request where that config says.

The program stands in for Qwen Code (it reads the same settings file and sends a chat
request with tools); the real Claude Code, Codex and Qwen Code are measured through the lab's
Caddy in tests/lab/clients (make test-lab-clients).
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.client import (
    _floor as floor,
)
from ansible_collections.localinference.vllm.plugins.modules import agent_client_floor
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

KEY = "sk-lab-0123456789abcdef"
PLAN = {"context": 65536, "input": 57344, "output": 8192, "reserved": 8192}
# A Qwen Code stand-in: its settings file (QWEN_CODE_SYSTEM_SETTINGS_PATH) names the base
# URL and the env key; it sends one chat request with its tools, and stops on a refusal.
QWEN_STANDIN = r'''
import json, os, sys, urllib.request, urllib.error
settings = json.load(open(os.environ["QWEN_CODE_SYSTEM_SETTINGS_PATH"]))
provider = settings["modelProviders"]["openai"][0]
body = {"model": provider["id"], "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": provider["generationConfig"]["samplingParams"]["max_tokens"],
        "messages": [{"role": "system", "content": "You are Qwen Code. " * 200},
                     {"role": "user", "content": sys.argv[2]}],
        "tools": [{"type": "function", "function": {"name": "glob", "parameters": {}}}],
        "user": os.environ[provider["envKey"]]}
request = urllib.request.Request(provider["baseUrl"] + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
try:
    urllib.request.urlopen(request, timeout=10)
except urllib.error.HTTPError as exc:
    print("refused", exc.code)
    sys.exit(1)
'''


class Endpoint(BaseHTTPRequestHandler):
    """Counts a prompt as its bytes / 4 and answers with the usage of the API asked."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.seen.append({"path": self.path, "auth": self.headers.get("authorization"), "body": body})
        if self.server.status != 200:
            self.send_response(self.server.status)
            self.end_headers()
            self.wfile.write(b'{"error": "nope"}')
            return
        count = len(json.dumps(body["messages"] if "messages" in body else body["input"])) // 4
        usage = {"input_tokens": count} if "/chat/" not in self.path else {"prompt_tokens": count}
        answer = json.dumps({"usage": usage}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    server.seen, server.status = [], 200
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def program(tmp_path: Path, source: str, version: str = "0.24.4") -> str:
    """An executable Python program; ``--version`` prints ``version`` as Qwen Code does."""
    path = tmp_path / "qwen"
    answer = f"import sys\nif sys.argv[1:] == ['--version']:\n    print({version!r})\n    sys.exit(0)\n"
    path.write_text(f"#!{sys.executable}\n{answer}{source}")
    path.chmod(0o755)
    return str(path)


def args(endpoint, **kw: Any) -> dict[str, Any]:
    base = {
        "clients": ["qwen_code"], "plan": PLAN, "model": "localinference/tiny-deepseek",
        "base_url": f"http://127.0.0.1:{endpoint.server_address[1]}/localinference/tiny-deepseek/v1",
        "api_key_env": "LOCALINFERENCE_API_KEY", "api_key": KEY, "timeout": 30,
    }  # fmt: skip
    base.update(kw)
    return base


def test_the_first_request_is_recorded_and_counted_by_the_endpoint(endpoint, tmp_path):
    done = run_module(agent_client_floor, args(endpoint, programs={"qwen_code": program(tmp_path, QWEN_STANDIN)}))
    assert not done.failed, done.result
    (seen,) = endpoint.seen
    # the recorded request, unstreamed for one token, under the endpoint's own prefix, with the real key
    assert seen["path"] == "/localinference/tiny-deepseek/v1/chat/completions"
    assert seen["auth"] == f"Bearer {KEY}"
    assert seen["body"]["stream"] is False and seen["body"]["max_tokens"] == 1
    assert "stream_options" not in seen["body"]
    # the client ran with the config rendered for it: the model, its max_tokens, and no real key
    assert seen["body"]["model"] == "localinference/tiny-deepseek"
    assert seen["body"]["user"] == "recorder"
    expected = len(json.dumps(seen["body"]["messages"])) // 4
    assert done.result["floors"] == {"qwen_code": expected}
    (measured,) = done.result["measurements"]
    assert measured["request"] == {"path": "/v1/chat/completions", "bytes": measured["request"]["bytes"], "tools": 1}
    assert measured["version"] == "0.24.4" and done.result["versions"] == {"qwen_code": "0.24.4"}
    assert done.result["skipped"] == [] and done.result["changed"] is False
    assert done.result["warnings_versions"] == []
    assert KEY not in json.dumps(done.result)


@pytest.mark.parametrize(
    ("version", "allow", "expected"),
    [
        ("0.24.0", False, None),
        ("0.99.12", False, None),
        ("0.23.9", False, "qwen_code 0.23.9: the collection has config and budget rules for qwen_code 0.24.0 up to"),
        ("1.0.0", False, "1.0.0 (not included)"),
        ("1.0.0", True, "agent_client_allow_unknown_versions: true"),
        ("qwen (development build)", False, "printed no version (rc=0): qwen (development build)"),
    ],
)
def test_a_version_the_rules_do_not_cover_is_refused_first(endpoint, tmp_path, version, allow, expected):
    """Checked for every installed client, measured or not (measure: [])."""
    given = {"programs": {"qwen_code": program(tmp_path, QWEN_STANDIN, version)}, "measure": [],
             "allow_unknown_versions": allow}  # fmt: skip
    done = run_module(agent_client_floor, args(endpoint, **given))
    assert endpoint.seen == [] and done.result.get("measurements", []) == []
    if expected is None:
        assert not done.failed and done.result["versions"] == {"qwen_code": version}, done.result
    elif allow:
        assert not done.failed and expected in done.result["warnings_versions"][0], done.result
    else:
        assert done.failed and expected in done.result["msg"], done.result


def test_a_client_not_installed_is_skipped_with_the_reason(endpoint, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    done = run_module(agent_client_floor, args(endpoint, clients=["codex", "crush"]), check_mode=True)
    assert not done.failed, done.result
    assert done.result["floors"] == {} and endpoint.seen == []
    assert done.result["skipped"] == [
        {"client": "codex", "why": "codex is not on PATH (agent_client_programs.codex names it)"},
        {"client": "crush", "why": "crush is not on PATH (agent_client_programs.crush names it)"},
    ]


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("relative", "agent_client_programs.qwen_code must be an absolute path, got 'bin/qwen'"),
        ("not-executable", "is not an executable file"),
        ("silent", "exited 3 after 30 s without a request: said nothing useful"),
        ("refused", "answered 401"),
        ("elsewhere", "first request went to '/admin/reset', not under the /v1/ it was given"),
        ("unknown", "clients: no measurement for ['aider']"),
    ],
)
def test_what_cannot_be_measured_is_named_with_the_fix(endpoint, tmp_path, setup, expected):
    qwen = program(tmp_path, QWEN_STANDIN)
    given: dict[str, Any] = {"programs": {"qwen_code": qwen}}
    if setup == "relative":
        given["programs"] = {"qwen_code": "bin/qwen"}
    elif setup == "not-executable":
        Path(qwen).chmod(0o644)
    elif setup == "silent":
        given["programs"] = {"qwen_code": program(tmp_path, "print('said nothing useful'); raise SystemExit(3)")}
    elif setup == "refused":
        endpoint.status = 401
    elif setup == "elsewhere":
        elsewhere = QWEN_STANDIN.replace('provider["baseUrl"] + "/chat/completions"',
                                         'provider["baseUrl"][:-3] + "/admin/reset"')
        given["programs"] = {"qwen_code": program(tmp_path, elsewhere)}
    else:
        given["clients"] = ["aider"]
    done = run_module(agent_client_floor, args(endpoint, **given))
    assert done.failed
    assert expected in done.result["msg"]
    if setup in ("silent", "refused", "elsewhere"):
        assert "agent_client_prompt_floors.qwen_code" in done.result["msg"]
    assert KEY not in done.result["msg"]


@pytest.mark.parametrize(
    ("path", "usage", "expected"),
    [
        ("/v1/chat/completions", {"prompt_tokens": 18, "completion_tokens": 1}, 18),
        ("/v1/messages?beta=true", {"input_tokens": 5, "cache_read_input_tokens": 10}, 15),
        ("/v1/responses", {"input_tokens": 21, "output_tokens": 16}, 21),
        ("/v1/chat/completions", {"input_tokens": 9}, "counts no prompt tokens"),
        ("/v1/responses", {"input_tokens": 0}, "counts no prompt tokens"),
        ("/v1/responses", {"input_tokens": True}, "counts no prompt tokens"),
        ("/v1/responses", None, "carries no usage"),
    ],
)
def test_the_servers_usage_is_the_floor(path, usage, expected):
    answer = {} if usage is None else {"usage": usage}
    if isinstance(expected, int):
        assert floor.prompt_tokens(path, answer) == expected
    else:
        with pytest.raises(floor.FloorError, match=expected):
            floor.prompt_tokens(path, answer)


@pytest.mark.parametrize(
    ("path", "limit"),
    [("/v1/chat/completions", {"max_tokens": 1}), ("/v1/messages?beta=true", {"max_tokens": 1}),
     ("/v1/responses", {"max_output_tokens": 16})],
)  # fmt: skip
def test_the_replay_asks_for_the_smallest_unstreamed_answer(path, limit):
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 9,
            "max_tokens": 1024, "tools": [{"name": "Read"}]}  # fmt: skip
    out = floor.replay_body(path, body)
    assert out["stream"] is False and "stream_options" not in out and "max_completion_tokens" not in out
    assert {key: out[key] for key in limit} == limit
    assert out["tools"] == body["tools"] and body["stream"] is True  # the recording is left as it was
