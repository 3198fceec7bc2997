# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The soak's client: the ingress reached exactly as an agent reaches it.

TLS verified against the ingress's CA, the key as a bearer token, and the connection opened by
the collection's own helper (``engine._token_probe._connection``, the one the watchdog, the
doctor and ``agent_client_floor`` use), never a second http.client of the benchmarks' own.
Every exchange runs in a daemon thread the caller waits on until its deadline, as the
collection's probe does: nothing the server does holds the caller longer.

Environment (each defaults to the lab's):

- ``SOAK_ENDPOINT``: the OpenAI base URL (``.../v1``); else ``lab.harness.endpoint()``.
- ``SOAK_CA_FILE``: the CA the endpoint's certificate is verified against; else
  ``.lab/ingress/ca.crt`` (required for https: the soak never falls back to no verification).
- ``SOAK_KEY_FILE``: a file whose first line is the key; else ``lab.harness.api_key()``. Read
  again after a 401 (:func:`with_fresh_key`): a key rotation rewrites both files.
"""

from __future__ import annotations

import dataclasses
import email.utils
import ipaddress
import json
import os
import queue
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.harness import (
    CLUSTER_ADDRESSES,
    INGRESS_CA_FILE,
    MODEL,
    LabError,
    api_key,
    endpoint,
    module_utils,
)

# A Retry-After is honoured up to this many seconds: a longer one is slept this long, then asked again.
RETRY_AFTER_MAX = 30.0
# Statuses that tell a client to come back later; with a Retry-After they are deferrals, not failures.
DEFERRING = (429, 503)
# Client errors a retry cannot mend (the pre-fault check stops at once on them).
FINAL = tuple(status for status in range(400, 500) if status not in (408, 425, 429))


@dataclass(frozen=True)
class Target:
    """Where the soak sends its requests and how it proves who it is."""

    base: str
    ca_file: str | None
    key: str | None

    @property
    def chat_url(self) -> str:
        return f"{self.base}/chat/completions"

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        return headers


class Refused(RuntimeError):
    """An HTTP answer other than 200: its status, a Retry-After in seconds, and the body's start."""

    def __init__(self, status: int, retry_after: float | None, detail: str) -> None:
        super().__init__(f"HTTP {status}" + (f": {detail}" if detail else ""))
        self.status, self.retry_after, self.detail = status, retry_after, detail

    @property
    def deferred(self) -> bool:
        """Told to come back later (503 or 429 with a Retry-After): not a lost request."""
        return self.status in DEFERRING and self.retry_after is not None


class NeverAnswered(LabError):
    """The endpoint streamed no token before any fault: nothing the soak would measure is real."""


def check_address(url: str) -> None:
    """Only loopback and the lab's own addresses: the soak never sends traffic elsewhere."""
    host = urllib.parse.urlsplit(url).hostname or ""
    lab = set(CLUSTER_ADDRESSES.values())
    try:
        allowed = ipaddress.ip_address(host).is_loopback or host in lab
    except ValueError:
        allowed = host == "localhost"
    if not allowed:
        raise LabError(f"the soak talks only to loopback and the lab's addresses, not {host!r} ({url})")


def target_from_env(environ: dict[str, str] | None = None) -> Target:
    """The endpoint, CA and key from ``SOAK_*`` (see the module's docstring), checked."""
    env = os.environ if environ is None else environ
    base = (env.get("SOAK_ENDPOINT", "").strip() or endpoint()).rstrip("/")
    check_address(base)
    scheme = urllib.parse.urlsplit(base).scheme
    if scheme not in ("http", "https"):
        raise LabError(f"SOAK_ENDPOINT {base!r} is not an http(s) URL")
    ca_file = env.get("SOAK_CA_FILE", "").strip() or str(INGRESS_CA_FILE)
    if scheme == "https" and not Path(ca_file).is_file():
        raise LabError(f"no CA file {ca_file} to verify {base} against (make lab fetches the"
                       " ingress's; SOAK_CA_FILE names another)")
    return Target(base, ca_file if scheme == "https" else None, read_key(env))


def read_key(environ: dict[str, str] | None = None) -> str | None:
    """The first line of ``SOAK_KEY_FILE``, else the lab's key; None when there is none."""
    env = os.environ if environ is None else environ
    key_file = env.get("SOAK_KEY_FILE", "").strip()
    if not key_file:
        return api_key()
    try:
        lines = Path(key_file).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise LabError(f"cannot read the key SOAK_KEY_FILE={key_file}: {err}") from None
    return (lines[0].strip() if lines else "") or None


def with_fresh_key(target: Target, environ: dict[str, str] | None = None) -> Target | None:
    """``target`` with its key read again, or None when it did not change (or cannot be read)."""
    try:
        key = read_key(environ)
    except LabError:
        return None
    return None if key == target.key else dataclasses.replace(target, key=key)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header (seconds or an HTTP date) as seconds from ``now``, at most
    :data:`RETRY_AFTER_MAX`; None when absent or unreadable."""
    value = (value or "").strip()
    if not value:
        return None
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(seconds, 0.0), RETRY_AFTER_MAX)


def bounded(work: Callable[[], Any], deadline: float) -> Any:
    """``work()``'s result, or its exception, within ``deadline`` seconds; else TimeoutError.

    The work runs in a daemon thread; its sockets time out a second after the deadline."""
    events: queue.Queue = queue.Queue()

    def run() -> None:
        try:
            events.put((True, work()))
        except BaseException as err:  # handed to the caller, whatever it is
            events.put((False, err))

    threading.Thread(target=run, name="soak-request", daemon=True).start()
    try:
        done, value = events.get(timeout=deadline)
    except queue.Empty:
        raise TimeoutError from None
    if not done:
        raise value
    return value


def _read_stream(response: Any, started: float) -> dict[str, Any]:
    """The streamed chat completion: first-token time, content, tool calls, finish, usage."""
    sse_token = module_utils("engine._sse").sse_token
    ttft, content, calls, finish, usage = None, [], {}, None, None
    seen: list[str] = []  # the first lines, to say what came instead of a finish_reason
    while True:
        raw = response.readline(1 << 20)
        if not raw:
            break
        line = raw.decode("utf-8", "replace").strip()
        if line and len(seen) < 3:
            seen.append(line[:160])
        if ttft is None and sse_token(line):
            ttft = time.monotonic() - started
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        # vLLM's in-stream error event: {"error": {"message": ...}} (older: {"object": "error", ...})
        error = chunk.get("error") if isinstance(chunk.get("error"), dict) else None
        if error is None and chunk.get("object") == "error":
            error = chunk
        if error is not None:
            raise RuntimeError(f"the stream carried an error: {error.get('message') or error}"[:300])
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call.get("index", 0), {"id": "", "name": "", "arguments": ""})
                function = call.get("function") or {}
                entry["id"] = call.get("id") or entry["id"]
                entry["name"] += function.get("name") or ""
                entry["arguments"] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    if finish is None:
        got = " | ".join(seen) if seen else "nothing"
        raise RuntimeError(f"the stream ended without a finish_reason (it began: {got})"[:300])
    return {"ttft": ttft, "content": "".join(content), "tool_calls": [calls[i] for i in sorted(calls)],
            "finish_reason": finish, "prompt_tokens": (usage or {}).get("prompt_tokens")}


def stream_chat(target: Target, body: dict[str, Any] | bytes, deadline: float) -> dict[str, Any]:
    """POST a streamed chat completion; the whole exchange ends by ``deadline`` seconds.

    Returns ``{ttft, content, tool_calls, finish_reason, prompt_tokens}``; raises
    ``TimeoutError`` past the deadline, :class:`Refused` on an HTTP status other than 200 and
    ``RuntimeError`` naming the error on any other failure (TLS, refused connection, a torn stream).
    """
    connection = module_utils("engine._token_probe")._connection
    payload = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
    started = time.monotonic()

    def exchange() -> dict[str, Any]:
        conn, path = connection(target.chat_url, deadline + 1.0, target.ca_file)
        try:
            conn.request("POST", path, body=payload, headers=target.headers())
            response = conn.getresponse()
            if response.status != 200:
                detail = response.read(300).decode("utf-8", "replace")
                raise Refused(response.status, retry_after(response.getheader("Retry-After")),
                              " ".join(detail.split())[:200])
            return _read_stream(response, started)
        finally:
            conn.close()

    try:
        return bounded(exchange, deadline)
    except (TimeoutError, Refused, RuntimeError):
        raise
    except Exception as err:  # TLS, a refused connection, http.client's, a torn JSON line
        raise RuntimeError(f"{type(err).__name__}: {err}"[:200]) from None


def served_max_model_len(target: Target, deadline: float = 10) -> int | None:
    """``max_model_len`` of the first model ``GET /models`` lists, or None when none is told."""
    connection = module_utils("engine._token_probe")._connection

    def fetch() -> int | None:
        conn, path = connection(f"{target.base}/models", deadline + 1.0, target.ca_file)
        try:
            conn.request("GET", path, headers=target.headers())
            response = conn.getresponse()
            data = json.loads(response.read(1 << 20)) if response.status == 200 else {}
        finally:
            conn.close()
        models = data.get("data") if isinstance(data, dict) else None
        value = models[0].get("max_model_len") if isinstance(models, list) and models else None
        return value if isinstance(value, int) and value > 0 else None

    try:
        return bounded(fetch, deadline)
    except Exception:  # only a hint: the soak runs on without it
        return None


def first_answer(target: Target, within: float, deadline: float = 30, every: float = 2.0,
                 model: str = MODEL) -> dict[str, Any]:
    """The pre-fault check: one streamed token with the key over TLS, asked again until
    ``within`` seconds have passed (each request bounded by ``deadline``).

    Returns ``{ttft_s, attempts, seconds}``; raises :class:`NeverAnswered` with the last error,
    at once on a client error a retry cannot mend (400, 401, 403, 404, ...).
    """
    body = module_utils("engine._token_probe").chat_body(model, max_tokens=4)
    started = time.monotonic()
    attempts, error = 0, "nothing asked"
    while True:
        attempts += 1
        left = within - (time.monotonic() - started)
        try:
            reply = stream_chat(target, body, max(1.0, min(deadline, left)))
        except Refused as err:
            error = str(err)
            if err.status in FINAL:
                break
            pause = err.retry_after if err.deferred else every
        except TimeoutError:
            error, pause = f"no token within {max(1.0, min(deadline, left)):g} s", every
        except RuntimeError as err:
            error, pause = str(err), every
        else:
            if reply["ttft"] is not None:
                return {"ttft_s": round(reply["ttft"], 3), "attempts": attempts,
                        "seconds": round(time.monotonic() - started, 1)}
            error, pause = f"the stream ended without a generated token ({reply['finish_reason']})", every
        if time.monotonic() - started + pause >= within:
            break
        time.sleep(pause or every)
    raise NeverAnswered(f"{error} ({target.chat_url}, {attempts} attempt(s) in"
                        f" {time.monotonic() - started:.0f} s)")
