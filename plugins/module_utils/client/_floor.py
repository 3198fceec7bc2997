# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A client's prompt floor, measured (issue 29): its first request, as the server counts it.

The client runs once, with its config rendered into a scratch directory and pointed at a
recorder on this machine's loopback. The recorder keeps the first request the client
sends (system prompt, tools, the one-line prompt: everything a first turn costs) and
refuses it, so the client stops; nothing reaches the server under the client's name.
That request is then sent to the real endpoint with a one-token answer, and the usage
the server returns is the floor. One way for every client, whatever its own output says.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.client._agents import (
    CLAUDE_CODE,
    CODEX,
    CRUSH,
    QWEN_CODE,
    ClientConfigError,
    render,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._token_probe import (
    _connection,
)

PROMPT = "Say hello."
# The program each client installs, and its one-turn, non-interactive command.
PROGRAMS = {CLAUDE_CODE: "claude", CODEX: "codex", QWEN_CODE: "qwen", CRUSH: "crush"}
ARGV = {
    CLAUDE_CODE: ["-p", PROMPT],
    CODEX: ["exec", "--skip-git-repo-check", PROMPT],
    QWEN_CODE: ["-p", PROMPT],
    CRUSH: ["run", PROMPT],
}
# The versions whose config keys and budget rules the collection knows: from the version
# measured against the lab (lab/agent-clients.txt; Crush: its source and recorded request,
# tests/unit/fixtures/crush) up to the next major. [lowest, below)
RULES_VERSIONS = {
    CLAUDE_CODE: ((2, 1, 0), (3, 0, 0)),
    CODEX: ((0, 169, 0), (1, 0, 0)),
    QWEN_CODE: ((0, 24, 0), (1, 0, 0)),
    CRUSH: ((0, 90, 0), (1, 0, 0)),
}
_VERSION = re.compile(r"(?<![\d.])(\d+)\.(\d+)\.(\d+)")
# An error every API shape reads as a refused request (Anthropic: type/error; OpenAI: error).
_REFUSAL = json.dumps(
    {"type": "error", "error": {"type": "invalid_request_error", "message": "recorded", "code": None}}
).encode()
_MAX_BODY = 16 * 1024 * 1024


class FloorError(validate.InputError):
    """A measurement that could not be made; the message names what to fix."""


class _Recorder(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(min(length, _MAX_BODY))
        if self.server.first is None:
            self.server.first = (self.path, body)
            self.server.got.set()
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(_REFUSAL)))
        self.end_headers()
        self.wfile.write(_REFUSAL)

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return


def _dotted(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def _scratch_env(home: str, **more: str) -> dict[str, str]:
    """A client's environment: PATH and LANG from ours, a scratch HOME, no colour, ``more``."""
    env = {name: os.environ[name] for name in ("PATH", "LANG") if name in os.environ}
    return {**env, "HOME": home, "XDG_CONFIG_HOME": f"{home}/.config", "NO_COLOR": "1", **more}


def read_version(client: str, program: str, timeout: float) -> str:
    """``program --version`` (a scratch HOME), its first x.y.z."""
    scratch = tempfile.mkdtemp(prefix=f"localinference-{client}-version-")
    env = _scratch_env(scratch)
    try:
        done = subprocess.run(
            [program, "--version"], env=env, cwd=scratch, stdin=subprocess.DEVNULL, capture_output=True,
            timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise FloorError(f"{program} --version did not answer in {timeout:.0f} s") from None
    except OSError as exc:
        raise FloorError(f"cannot run {program}: {exc.strerror}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    found = _VERSION.search(done.stdout.decode(errors="replace"))
    if done.returncode != 0 or not found:
        said = (done.stdout + done.stderr).decode(errors="replace").strip()[-200:]
        raise FloorError(f"{program} --version printed no version (rc={done.returncode}): {said or 'nothing'}")
    return found.group(0)


def version_problem(client: str, version: str) -> str | None:
    """Why the collection's rules do not cover this version of the client, or None."""
    lowest, below = RULES_VERSIONS[client]
    numbers = tuple(int(part) for part in version.split("."))
    if lowest <= numbers < below:
        return None
    return (
        f"{client} {version}: the collection has config and budget rules for {client} {_dotted(lowest)} up to"
        f" {_dotted(below)} (not included); install one of those (lab/agent-clients.txt pins the measured"
        f" one), or set agent_client_allow_unknown_versions: true to write its config by these rules anyway"
    )


def first_request(argv: list[str], env: dict[str, str], cwd: str, recorder: ThreadingHTTPServer, timeout: float):
    """Run the client until it has sent its first POST; (path, body) or FloorError."""
    try:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        raise FloorError(f"cannot run {argv[0]}: {exc.strerror}") from None
    deadline = time.monotonic() + timeout
    try:
        while not recorder.got.wait(0.2):
            if proc.poll() is not None or time.monotonic() > deadline:
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate(timeout=10)[0].decode(errors="replace")
    if recorder.first is None:
        why = "timed out" if proc.returncode in (None, -signal.SIGKILL) else f"exited {proc.returncode}"
        raise FloorError(
            f"{argv[0]} {why} after {timeout:.0f} s without a request: {output.strip()[-300:] or 'no output'}"
        )
    return recorder.first


def replay_body(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The recorded request, unstreamed, for the smallest answer the API allows."""
    out = {key: value for key, value in body.items() if key not in ("stream_options", "max_completion_tokens")}
    out["stream"] = False
    if path.split("?")[0].endswith("/responses"):
        out["max_output_tokens"] = 16  # the Responses API's least
    else:
        out["max_tokens"] = 1
    return out


def prompt_tokens(path: str, answer: dict[str, Any]) -> int:
    """The server's count of the request's prompt, from its usage."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        raise FloorError(f"the answer to {path} carries no usage: {json.dumps(answer)[:300]}")
    if path.split("?")[0].endswith("/chat/completions"):
        parts = [usage.get("prompt_tokens")]
    else:  # /messages counts cached input apart; /responses has input_tokens
        cached = ("cache_read_input_tokens", "cache_creation_input_tokens")
        parts = [usage.get("input_tokens"), *(usage.get(name) or 0 for name in cached)]
    counts = all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in parts)
    count = sum(parts) if counts else 0
    if count <= 0:
        raise FloorError(f"the answer to {path} counts no prompt tokens: usage {json.dumps(usage)[:300]}")
    return count


def replay(url: str, body: dict[str, Any], key: str, ca_file: str, timeout: float) -> dict[str, Any]:
    """POST the request to the endpoint (the collection's one HTTP(S) connection) and read its JSON."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn, target = _connection(url, timeout, ca_file or None)
        try:
            conn.request("POST", target, body=json.dumps(body).encode(), headers=headers)
            answer = conn.getresponse()
            text = answer.read(_MAX_BODY)
        finally:
            conn.close()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise FloorError(f"POST {url} failed: {exc}") from None
    if answer.status != 200:
        raise FloorError(f"POST {url} answered {answer.status}: {text[:300].decode(errors='replace')}")
    try:
        return json.loads(text)
    except ValueError:
        raise FloorError(f"POST {url} answered no JSON: {text[:200].decode(errors='replace')}") from None


def measure(client: str, program: str, *, plan: dict[str, Any], model: str, base_url: str, api_key_env: str,
            reasoning_key: str, key: str, ca_file: str, timeout: float) -> dict[str, Any]:  # fmt: skip
    """One client's floor: its first request recorded, then counted by the server behind base_url."""
    scratch = tempfile.mkdtemp(prefix=f"localinference-{client}-floor-")
    recorder = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    recorder.first, recorder.got = None, threading.Event()
    thread = threading.Thread(target=recorder.serve_forever, daemon=True)
    thread.start()
    try:
        local = f"http://127.0.0.1:{recorder.server_address[1]}/v1"
        try:
            rendered = render(
                client, plan=plan, model=model, base_url=local, api_key_env=api_key_env,
                reasoning_key=reasoning_key, client_dir=f"{scratch}/{client}",
            )  # fmt: skip
        except ClientConfigError as exc:
            raise FloorError(str(exc)) from None
        os.makedirs(f"{scratch}/{client}", mode=0o700)
        os.makedirs(f"{scratch}/home/work", mode=0o700)
        with open(rendered["config_path"], "w", encoding="utf-8") as handle:
            handle.write(rendered["config"])
        # not the real key: the recorder is no endpoint
        env = _scratch_env(f"{scratch}/home", **rendered["env"], **{rendered["key_env"]: "recorder"})
        path, raw = first_request([program, *ARGV[client]], env, f"{scratch}/home/work", recorder, timeout)
    finally:
        recorder.shutdown()
        recorder.server_close()
        shutil.rmtree(scratch, ignore_errors=True)
    if not path.startswith("/v1/") or ".." in path or any(c.isspace() for c in path):
        raise FloorError(f"{program}'s first request went to {path[:120]!r}, not under the /v1/ it was given")
    try:
        body = json.loads(raw)
    except ValueError:
        raise FloorError(f"{program}'s first request to {path} is not JSON") from None
    if not isinstance(body, dict):
        raise FloorError(f"{program}'s first request to {path} is not a JSON object")
    url = base_url.rstrip("/").removesuffix("/v1") + path
    floor = prompt_tokens(path, replay(url, replay_body(path, body), key, ca_file, timeout))
    return {
        "client": client,
        "program": program,
        "prompt_floor": floor,
        "request": {"path": path.split("?")[0], "bytes": len(raw), "tools": len(body.get("tools") or [])},
    }
