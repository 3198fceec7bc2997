# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The real opencode and Claude Code finish a turn they started during a wedge, once the
watchdog has recovered it (issue 37, item 3), given nothing but their generated files.

One wedge for both (``make test-lab-clients``, after test_agent_clients.py has rendered Claude
Code's files; opencode's are ``make lab``'s): ``kill -STOP`` of the worker's TP rank, as
tests/lab/faults/test_watchdog_faults.py causes it; both clients start their one-turn run while
it is stopped, each as test_agent_clients.py and test_opencode_client.py run it (opencode with
``--print-logs`` added, so its model requests can be counted); nobody touches the lab until the
watchdog has restarted the engine and recorded the incident. The rank gets ``kill -CONT`` once
the engine is down behind the ingress, or whatever happens. The ingress is polled every second
meanwhile, so the test knows how long the engine was away (the first 503 to the next 200) and
the ``Retry-After`` the clients were told.

Whether a client can finish depends on that outage: each waits out a bounded number of 503s
(lab/client_retries.py, docs/agent_client.md "A turn across a wedge"). So each client's test
asserts what its retries say for the outage measured: the turn finished with the scripted answer
when the engine was back before the client's last retry; otherwise the client gave up as its
source says (the ingress's 503 named, its retries spent), and the test is marked xfail with the
numbers: the client did not finish, for the documented reason. A result the model does not
predict fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks._faults import first_incident, interval, wait_watched_and_serving
from lab import client_retries as retries
from lab.harness import (
    HEAD,
    LAB_DIR,
    MODEL,
    WATCHDOG_UNIT,
    WORKER,
    api_key,
    auth_headers,
    endpoint,
    exec_on,
    module_utils,
    rank_pids,
    reset_watchdog_budget,
    streams_a_token,
    wait_for,
)
from lab.tiny_model import ANSWER

pytestmark = [pytest.mark.lab, pytest.mark.watchdog, pytest.mark.usefixtures("lab_hosts")]

OPENCODE = LAB_DIR / "opencode-cli" / "node_modules" / ".bin" / "opencode"
OPENCODE_CONFIG = LAB_DIR / "opencode" / "opencode.json"
OPENCODE_ENV = LAB_DIR / "opencode" / "env"
PROVIDER = "localinference"
CLAUDE = LAB_DIR / "clients-cli" / "claude_code" / "node_modules" / ".bin" / "claude"
CLAUDE_DIR = LAB_DIR / "clients" / "claude_code"
PROMPT = "Say hello."
# A client's whole run: the wedge's detection, the restart, and its own retries (Claude Code's
# last one comes up to about 210 s after the engine dropped its request).
RUN_TIMEOUT = 600
POLL_S = 1.0
# From the restart's start to the recovery record: a boot on the loaded lab took up to 4 min.
RECOVERY_TIMEOUT = 600
# How far the measured outage may be off the one a client met: the poll's second, and the head's
# server ending the client's stream a few seconds before or after it stops listening.
SLACK_S = 5.0


def _env_file(path: Path) -> dict[str, str]:
    assert oct(path.stat().st_mode & 0o777) == "0o600", f"{path} must be mode 0600"
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {name.strip(): value.strip() for name, value in pairs}


def _claude_code(scratch: Path) -> tuple[list[str], dict[str, str]]:
    """As test_agent_clients.py runs it: its env file, a scratch HOME, nothing else of ours."""
    env = {name: value for name, value in os.environ.items() if name in ("PATH", "LANG", "TERM")}
    env.update(_env_file(CLAUDE_DIR / "env"))
    env.update({"HOME": str(scratch), "XDG_CONFIG_HOME": str(scratch / "config"), "NO_COLOR": "1"})
    return [str(CLAUDE), "-p", PROMPT, "--output-format", "stream-json", "--verbose"], env


def _opencode(scratch: Path) -> tuple[list[str], dict[str, str]]:
    """As test_opencode_client.py runs it, with ``--print-logs`` (a ``message=stream`` line per
    model request on stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCODE", "XDG_"))}
    env.update(_env_file(OPENCODE_ENV))
    env.update({
        "HOME": str(scratch), "XDG_CONFIG_HOME": str(scratch / "config"), "XDG_DATA_HOME": str(scratch / "data"),
        "XDG_CACHE_HOME": str(scratch / "cache"), "XDG_STATE_HOME": str(scratch / "state"),
        "OPENCODE_CONFIG": str(OPENCODE_CONFIG), "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_SHARE": "1", "NO_COLOR": "1",
    })  # fmt: skip
    argv = [str(OPENCODE), "run", "--print-logs", "--log-level", "INFO", "--format", "json",
            "-m", f"{PROVIDER}/{MODEL}", "--title", "lab test", "--thinking", PROMPT]  # fmt: skip
    return argv, env


COMMANDS = {retries.OPENCODE: _opencode, retries.CLAUDE_CODE: _claude_code}


class ClientRun:
    """One client's run in its own process group, its output in files (no pipe to fill)."""

    def __init__(self, client: str, folder: Path) -> None:
        self.client, self.folder = client, folder
        work = folder / "work"
        work.mkdir(parents=True)
        (work / "README.md").write_text("A project the client works in.\n")
        argv, env = COMMANDS[client](folder)
        self.stdout, self.stderr = folder / "stdout.txt", folder / "stderr.txt"
        self.started = time.time()
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(
                ["timeout", "--kill-after=10", str(RUN_TIMEOUT), *argv], stdin=subprocess.DEVNULL,
                stdout=out, stderr=err, cwd=work, env=env, start_new_session=True,
            )  # fmt: skip
        self.ended: float | None = None

    def wait(self, deadline: float) -> None:
        try:
            self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            self.stop()
            self.ended = self.ended or time.time()

    def stop(self) -> None:
        """SIGTERM then SIGKILL to the group this test started, if it still runs."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                return
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue

    def result(self) -> dict[str, Any]:
        return {"rc": self.proc.returncode, "stdout": self.stdout.read_text(), "stderr": self.stderr.read_text(),
                "started": self.started, "ended": self.ended}  # fmt: skip


class IngressPoll:
    """``GET /models`` through the ingress with the key every second: ``(epoch, status)`` each
    time (None when nothing answered in 5 s), and the ``Retry-After`` of the first 503."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int | None]] = []
        self.retry_after: float | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def status(self) -> int | None:
        request = urllib.request.Request(f"{endpoint()}/models", headers=auth_headers())
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as err:
            if err.code == 503 and self.retry_after is None:
                self.retry_after = retries.retry_after_of(list(err.headers.items()))
            return err.code
        except (urllib.error.URLError, OSError):
            return None

    def poll(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.time(), self.status()))
            self.done.wait(POLL_S)

    def away(self) -> tuple[float, float | None] | None:
        return retries.engine_away(list(self.samples))

    def __enter__(self) -> IngressPoll:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(10)


def _require_generated_files(require_lab) -> None:
    """Both clients installed and their generated files there and current (the key the ingress
    takes now: a key rotation rewrites only opencode's env file)."""
    needed = [OPENCODE, OPENCODE_CONFIG, OPENCODE_ENV, CLAUDE, CLAUDE_DIR / "env", CLAUDE_DIR / "settings.json"]
    missing = [str(path) for path in needed if not path.exists()]
    require_lab(not missing, f"needs both clients and their generated files ({', '.join(missing)}):"
                             " make test-lab-clients (its first test renders Claude Code's)")  # fmt: skip
    key = api_key()
    for client, path, name in ((retries.CLAUDE_CODE, CLAUDE_DIR / "env", "ANTHROPIC_AUTH_TOKEN"),
                               (retries.OPENCODE, OPENCODE_ENV, "LOCALINFERENCE_API_KEY")):  # fmt: skip
        require_lab(_env_file(path).get(name) == key,
                    f"{client}'s {path} holds another key than the ingress's: rerun the client stage"
                    " (make test-lab-clients renders it first)")  # fmt: skip


@pytest.fixture(scope="module")
def across_wedge(require_lab, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """Both clients started during one wedge and run to their end; what the lab did meanwhile."""
    _require_generated_files(require_lab)
    reset_watchdog_budget()
    wait_watched_and_serving(timeout=400)
    since = time.time()
    pids = rank_pids()
    assert pids, f"no rank process on {WORKER}: is the lab serving?"
    runs: dict[str, ClientRun] = {}
    try:
        with IngressPoll() as poll:
            exec_on(WORKER, "kill", "-STOP", *pids)
            try:
                for client in COMMANDS:
                    runs[client] = ClientRun(client, tmp_path_factory.mktemp(client))
                wedged = wait_for("the wedge verdict", lambda: first_incident(since, verdict="wedged"),
                                  6 * interval() + 60)  # fmt: skip
                # The watchdog's restart stops the head's server first; from then on the ingress
                # answers 503 and the rank is let go (the restart stops its unit next).
                wait_for("the engine down behind the ingress", poll.away, 180, every=1)
            finally:
                exec_on(WORKER, "kill", "-CONT", *pids, check=False)
            record = wait_for(
                "the watchdog's recovery",
                lambda: first_incident(since, verdict="wedged", action="restart", outcome=("recovered", "failed")),
                RECOVERY_TIMEOUT,
            )
            wait_for("a 200 through the ingress after the restart", lambda: (poll.away() or (0, None))[1],
                     120, every=1)  # fmt: skip
            deadline = time.monotonic() + RUN_TIMEOUT + 60
            for run in runs.values():
                run.wait(deadline)
        yield {
            "since": since, "pids": pids, "wedged": wedged, "record": record, "away": poll.away(),
            "retry_after": poll.retry_after, "runs": {client: run.result() for client, run in runs.items()},
        }  # fmt: skip
    finally:
        for run in runs.values():
            run.stop()
        exec_on(HEAD, "systemctl", "start", WATCHDOG_UNIT)
        wait_for("a streamed token after the test", lambda: streams_a_token(timeout=20), 400)


def test_the_watchdog_recovered_the_wedge_both_clients_started_in(across_wedge):
    record, wedged = across_wedge["record"], across_wedge["wedged"]
    assert record["outcome"] == "recovered", record
    assert any(f["id"] == "F28" for f in record["findings"]), record
    away, back = across_wedge["away"]
    assert back is not None and back > away, across_wedge["away"]
    for client, run in across_wedge["runs"].items():
        assert run["started"] < wedged["epoch"], f"{client} started after the wedge verdict"
    assert across_wedge["retry_after"] is not None, "the ingress's 503 had no Retry-After"
    # The rank was put back: none of the stopped processes is still stopped (the watchdog
    # killed them with their unit), and a new rank serves.
    states = exec_on(WORKER, "ps", "-o", "stat=", "-p", ",".join(across_wedge["pids"]), check=False).stdout
    assert not [s for s in states.split() if s.startswith("T")], f"still stopped on {WORKER}: {states}"
    assert rank_pids(), f"no rank process on {WORKER} after the recovery"


def _outage(across_wedge: dict[str, Any]) -> tuple[float, float]:
    """Seconds from the engine's first 503 to its next 200, and the Retry-After it was told with."""
    away, back = across_wedge["away"]
    assert back is not None and across_wedge["retry_after"] is not None, across_wedge["away"]
    return back - away, across_wedge["retry_after"]


def _gave_up(client: str, outage: float, retry_after: float, shown: str) -> None:
    earliest, latest = retries.retry_window(client, retry_after)
    pytest.xfail(
        f"{client} gave up, as its retries say: the engine was away {outage:.0f} s, and with Retry-After"
        f" {retry_after:g} s its last retry comes {earliest:.0f}-{latest:.0f} s after its request was dropped"
        f" (docs/agent_client.md, A turn across a wedge)\n{shown[-600:]}"
    )


def test_claude_code_finishes_a_turn_started_during_the_wedge(across_wedge):
    run = across_wedge["runs"][retries.CLAUDE_CODE]
    outage, retry_after = _outage(across_wedge)
    expected = retries.expected(retries.CLAUDE_CODE, outage, retry_after, SLACK_S)
    turn = retries.claude_code_run(run["stdout"])
    shown = f"rc={run['rc']} outage {outage:.1f} s, expected {expected}\n{run['stdout'][-2000:]}\n{run['stderr'][-1000:]}"
    # It met the outage: it announced retries of the ingress's 503.
    assert any(r["status"] == 503 for r in turn["retries"]), shown
    if run["rc"] == 0 and turn["finished"]:
        assert expected != retries.GIVE_UP, f"finished, though its retries end before the engine was back:\n{shown}"
        assert turn["text"].strip() == ANSWER, shown
        return
    assert expected != retries.FINISH, f"gave up, though the engine was back before its last retry:\n{shown}"
    assert run["rc"] != 0 and turn["api_error_status"] == 503, shown
    assert "not accepting connections" in turn["text"], shown
    _gave_up(retries.CLAUDE_CODE, outage, retry_after, shown)


def test_opencode_finishes_a_turn_started_during_the_wedge(across_wedge):
    run = across_wedge["runs"][retries.OPENCODE]
    outage, retry_after = _outage(across_wedge)
    expected = retries.expected(retries.OPENCODE, outage, retry_after, SLACK_S)
    turn = module_utils("client._opencode_measure").run_events(run["stdout"])
    requests = retries.opencode_requests(run["stderr"])
    shown = (f"rc={run['rc']} outage {outage:.1f} s, expected {expected}, {requests} model requests\n"
             f"{run['stdout'][-1500:]}\n{json.dumps(turn['errors'])}")  # fmt: skip
    # It met the outage: the request the restart dropped, a retry refused, then the rest.
    assert requests >= 2, shown
    if run["rc"] == 0 and not turn["errors"]:
        assert expected != retries.GIVE_UP, f"finished, though its retries end before the engine was back:\n{shown}"
        assert ANSWER in turn["text"], shown
        assert requests >= 4, shown  # and the tool call's and the answer's
        return
    assert expected != retries.FINISH, f"gave up, though the engine was back before its last retry:\n{shown}"
    assert run["rc"] != 0 and requests == 1 + retries.OPENCODE_RETRIES, shown
    assert any("not accepting connections" in error for error in turn["errors"]), shown
    _gave_up(retries.OPENCODE, outage, retry_after, shown)
