# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one harness for the lab tests (tests/lab) and the benchmarks (benchmarks/).

Everything that talks to the two-node lab goes through here: is the lab up,
``podman exec`` on a host, ``ansible-playbook`` with the lab inventory, the
PLAY RECAP, the endpoint and its first streamed token, and the lab's constants
(hosts, cluster addresses, state paths, model). Every command runs with a
timeout; one that runs over is killed with its whole process group and raises
:class:`LabError` with the end of its output.

Import it with the checkout on ``sys.path`` (``from lab import harness``);
``module_utils(name)`` imports the collection's own ``plugins/module_utils``
through ``.lab/collections``, as Ansible imports them.

Environment:

- ``LOCALINFERENCE_LAB_EXTRA_ARGS``: more ``ansible``/``ansible-playbook``
  arguments (for example ``-i extra-inventory.yml``), split like a shell would.
- ``LOCALINFERENCE_LAB_DIR``: the controller's lab directory (``make`` exports
  it; default ``.lab`` in the checkout), where the serve role writes ``endpoint``.
- ``LOCALINFERENCE_LAB_ENDPOINT``: the endpoint to use instead of that file.
- ``LOCALINFERENCE_LAB_API_KEY``: the ingress key to send instead of ``.lab/ingress/api-key``.
"""

from __future__ import annotations

import http.client
import importlib
import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
ANSIBLE_CFG = ROOT / "ansible.cfg"
INVENTORY = ROOT / "inventories" / "lab" / "hosts.yml"
PLAYBOOKS = ROOT / "playbooks"
COLLECTIONS = ROOT / ".lab" / "collections"
LAB_DIR = Path(os.environ.get("LOCALINFERENCE_LAB_DIR") or ROOT / ".lab")
ENDPOINT_FILE = LAB_DIR / "endpoint"
# The ingress key (the ingress role creates it, mode 0600; inventories/lab).
API_KEY_FILE = LAB_DIR / "ingress" / "api-key"
# The ingress speaks TLS beyond the head's loopback: its internal CA's root, fetched by the
# ingress role (ingress_ca_file), is what the lab's own HTTP calls trust.
# (and those of the one-host and three-host labs).
INGRESS_CA_FILE = LAB_DIR / "ingress" / "ca.crt"
INGRESS_CA_FILES = (
    INGRESS_CA_FILE, LAB_DIR / "onehost" / "ingress" / "ca.crt", LAB_DIR / "scale-ingress-ca.crt"
)


class _LabHTTPS(urllib.request.HTTPSHandler):
    """https for every ``urllib.request.urlopen`` of the lab's tests: the system's store and
    each lab ingress's CA (read at each request: it appears when the ingress stage runs)."""

    def https_open(self, req):
        context = ssl.create_default_context()
        for path in INGRESS_CA_FILES:
            if path.is_file():
                context.load_verify_locations(cafile=str(path))
        return self.do_open(http.client.HTTPSConnection, req, context=context)


urllib.request.install_opener(urllib.request.build_opener(_LabHTTPS()))
EXTRA_ARGS = shlex.split(os.environ.get("LOCALINFERENCE_LAB_EXTRA_ARGS", ""))

# The lab inventory (inventories/lab): two hosts, one cluster link.
HEAD, WORKER = "spark-head", "spark-worker"
HOSTS = (HEAD, WORKER)
CLUSTER_IF = "enp1s0f0np0"
CLUSTER_PROFILE = f"localinference-{CLUSTER_IF}"
CLUSTER_PREFIX = 24
CLUSTER_ADDRESSES = {HEAD: "10.77.0.11", WORKER: "10.77.0.12"}
STANDINS = "/opt/localinference-standins"
# What the lab serves (the tiny model, lab/tiny_model.py) and where.
MODEL = "localinference/tiny-deepseek"
MODEL_REVISION = "5eed0c0ffee0000000000000000000000000000a"
MODEL_SNAPSHOT = "/srv/models/hub/models--localinference--tiny-deepseek/snapshots/" + MODEL_REVISION
# Caddy on the head (the ingress role), published on the controller's loopback.
INGRESS_URL = "https://127.0.0.1:18080"
DEFAULT_ENDPOINT = f"{INGRESS_URL}/{MODEL}/v1"
VLLM_UNIT = "localinference-vllm.service"
# What the stages save on the nodes (issue 9: one saved result per stage).
STATE_DIR = "/etc/localinference"
SERVING_STATE = f"{STATE_DIR}/serving.json"
PREFLIGHT_RESULT = f"{STATE_DIR}/preflight.json"
FABRIC_RESULT = f"{STATE_DIR}/fabric.json"
PLAN_RESULT = f"{STATE_DIR}/plan.json"

# Bounds, in seconds. A rollout boots vLLM on two shared cores (1-3 minutes per
# boot, a rollback boots twice); the bound only stops a hung run.
COMMAND_TIMEOUT = 120
PLAYBOOK_TIMEOUT = 1800

if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))


class LabError(RuntimeError):
    """A lab command failed or ran over its timeout; the message says which and what it printed."""


def module_utils(name: str) -> ModuleType:
    """``plugins/module_utils/<stage>/<module>.py`` of this checkout (``name`` is ``stage._module``),
    imported as Ansible imports it."""
    try:
        return importlib.import_module(
            f"ansible_collections.localinference.vllm.plugins.module_utils.{name}"
        )
    except ModuleNotFoundError as err:
        raise LabError(
            f"cannot import the collection's {name} through {COLLECTIONS} ({err}): "
            "run make bootstrap (it links the checkout there)"
        ) from None


def _tail(text: str | bytes | None, chars: int = 2000) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return (text or "").strip()[-chars:]


def _output(stdout: str | bytes | None, stderr: str | bytes | None) -> str:
    return "\n".join(part for part in (_tail(stdout), _tail(stderr)) if part) or "(no output)"


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the process group this harness started (and only it)."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run(
    argv: Sequence[str | Path],
    *,
    timeout: float = COMMAND_TIMEOUT,
    check: bool = True,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in its own process group, bounded by ``timeout`` seconds.

    ``check`` turns a non-zero exit into :class:`LabError` naming the command,
    its exit code and the end of its output.
    """
    args = [str(arg) for arg in argv]
    shown = shlex.join(args)
    proc = subprocess.Popen(
        args,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a daemonised grandchild still holds the pipes
            stdout, stderr = "", ""
        raise LabError(
            f"{shown} did not finish within {timeout:g} s and was stopped; "
            f"last output:\n{_output(stdout, stderr)}"
        ) from None
    except BaseException:
        # Ctrl-C or a failing test: do not leave a playbook running on the lab.
        _kill_group(proc)
        raise
    done = subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
    if check and done.returncode != 0:
        raise LabError(f"{shown} failed (rc={done.returncode}):\n{_output(stdout, stderr)}")
    return done


# --- the hosts ---------------------------------------------------------------


def lab_up() -> bool:
    """True when both lab hosts are running (``make lab-up`` / ``make lab``)."""
    if shutil.which("podman") is None:
        return False
    try:
        done = run(["podman", "ps", "--format", "{{.Names}}"], timeout=30, check=False)
    except LabError:
        return False
    return done.returncode == 0 and set(HOSTS) <= set(done.stdout.split())


def podman(
    *args: str, check: bool = True, timeout: float = COMMAND_TIMEOUT, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` (pause, unpause, stop, start, cp, ...)."""
    return run(["podman", *args], timeout=timeout, check=check, input=input)


def exec_on(
    host: str,
    *argv: str,
    check: bool = True,
    timeout: float = COMMAND_TIMEOUT,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``podman exec HOST ARGV``; ``input`` is fed to the command's stdin."""
    interactive = ["-i"] if input is not None else []
    return podman("exec", *interactive, host, *argv, check=check, timeout=timeout, input=input)


def read_text(host: str, path: str) -> str:
    return exec_on(host, "cat", path).stdout


def write_text(host: str, path: str, text: str) -> None:
    exec_on(host, "sh", "-c", 'cat > "$1"', "sh", path, input=text)


def read_json(host: str, path: str) -> Any:
    """A JSON file on a host, e.g. ``read_json(HEAD, SERVING_STATE)``."""
    text = read_text(host, path)
    try:
        return json.loads(text)
    except ValueError as err:
        raise LabError(f"{host}:{path} is not JSON ({err}): {text[:300]}") from None


def unit_invocations(unit: str = VLLM_UNIT) -> dict[str, str]:
    """systemd InvocationID of ``unit`` on each host (a new one on every start)."""
    return {
        host: exec_on(
            host, "systemctl", "show", "-p", "InvocationID", "--value", unit, check=False
        ).stdout.strip()
        for host in HOSTS
    }


# --- ansible -----------------------------------------------------------------


def ansible_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the checkout's ansible.cfg, the lab directory, no colour."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_CFG), "ANSIBLE_NOCOLOR": "1"}
    env.pop("ANSIBLE_FORCE_COLOR", None)
    # The lab inventory finds .lab through it (make exports it; ad-hoc runs need it).
    env.setdefault("LOCALINFERENCE_LAB_DIR", str(LAB_DIR))
    env.update(overrides or {})
    return env


RECAP_LINE = re.compile(r"^(\S+)\s+:\s+(ok=\d+.*)$")


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """The last PLAY RECAP's counters per host: ``{host: {"ok": 3, "changed": 0, ...}}``."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("PLAY RECAP")]
    hosts: dict[str, dict[str, int]] = {}
    for line in lines[starts[-1] + 1 if starts else 0 :]:
        match = RECAP_LINE.match(line)
        if match:
            hosts[match.group(1)] = {
                key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(2))
            }
    return hosts


@dataclass(frozen=True)
class PlaybookRun:
    """One finished ``ansible-playbook`` run."""

    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def flat(self) -> str:
        """stdout on single spaces: the YAML callback wraps long messages."""
        return " ".join(self.stdout.split())

    @property
    def recap(self) -> dict[str, dict[str, int]]:
        return recap(self.stdout)

    def changed(self) -> int:
        """Changed tasks over all hosts of the last PLAY RECAP."""
        return sum(counts.get("changed", 0) for counts in self.recap.values())

    def tail(self, chars: int = 3000) -> str:
        """The end of the output, for an assertion message, after the failed tasks' results.

        A failed task's result is often far from the end (the rollback runs
        after it), so each ``fatal:`` block comes first with its task's name.
        """
        failed = [
            self.stdout[max(0, m.start() - 300) : m.start() + 1500]
            for m in re.finditer(r"(?m)^fatal: \[", self.stdout)
        ][:3]
        text = "".join(f"--- failed task ---\n{block}\n" for block in failed)
        text += "--- end of output ---\n" + self.stdout[-chars:]
        if self.stderr.strip():
            text += "\n--- stderr ---\n" + self.stderr[-chars:]
        return text


def playbook_path(playbook: str | Path) -> Path:
    """``site.yml`` means playbooks/site.yml; any other relative path is from the checkout."""
    path = Path(playbook)
    if path.is_absolute():
        return path
    if len(path.parts) == 1 and (PLAYBOOKS / path).exists():
        return PLAYBOOKS / path
    return ROOT / path


def playbook_argv(
    playbook: str | Path,
    args: Sequence[str],
    tags: str | None,
    extra_vars: Mapping[str, Any] | None,
    tmp: Path,
    inventory: Path | None = None,
) -> list[str]:
    """``ansible-playbook -i <lab inventory> [EXTRA_ARGS] PLAYBOOK ARGS [--tags] [-e @tmp/extra-vars.json]``.

    ``extra_vars`` go through a JSON file in ``tmp`` (typed; the caller removes it);
    ``inventory`` replaces the two-host lab's (the three-host lab's, for the benchmarks).
    """
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory or INVENTORY), *EXTRA_ARGS]
    argv += [str(playbook_path(playbook)), *args]
    if tags:
        argv += ["--tags", tags]
    if extra_vars is not None:
        file = tmp / "extra-vars.json"
        file.write_text(json.dumps(extra_vars))
        argv += ["-e", f"@{file}"]
    return argv


def run_playbook(
    playbook: str | Path,
    *args: str,
    tags: str | None = None,
    extra_vars: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = PLAYBOOK_TIMEOUT,
    inventory: Path | None = None,
) -> PlaybookRun:
    """``ansible-playbook -i <lab inventory> [EXTRA_ARGS] PLAYBOOK ARGS`` from the checkout.

    ``extra_vars`` go through a JSON file (``-e @file``, typed, removed after
    the run); ``env`` adds variables such as ``ANSIBLE_STDOUT_CALLBACK``.
    A failing play is a result (``rc``), not an exception; a hung one raises
    :class:`LabError` after ``timeout`` seconds.
    """
    with tempfile.TemporaryDirectory(prefix="lab-vars-") as tmp:
        argv = playbook_argv(playbook, args, tags, extra_vars, Path(tmp), inventory)
        started = time.monotonic()
        done = run(argv, timeout=timeout, check=False, env=ansible_env(env))
    return PlaybookRun(argv, done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def rollout(
    recipe: Mapping[str, Any] | None = None,
    *,
    tags: str = "fabric,rollout",
    extra_vars: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = PLAYBOOK_TIMEOUT,
    inventory: Path | None = None,
) -> PlaybookRun:
    """site.yml limited to ``tags``; ``recipe`` replaces the inventory's ``vllm_recipe``.

    The default tags include the fabric stage, which publishes the cluster
    network environment the rollout starts vLLM with. ``env`` as for
    :func:`run_playbook` (the benchmarks add their profiling callbacks).
    The rollout's opencode turn is off unless ``extra_vars`` sets
    ``agent_client_rollout_turn``: the fault tests start the server some twenty
    times and a turn costs 10-13 s each; test_rollout_agent_turn.py and
    ``make lab`` (a whole site.yml) prove it.
    """
    variables = {"agent_client_rollout_turn": "never", **(extra_vars or {})}
    if recipe is not None:
        variables["vllm_recipe"] = dict(recipe)
    return run_playbook(
        "site.yml",
        tags=tags,
        extra_vars=variables or None,
        env=env,
        timeout=timeout,
        inventory=inventory,
    )


def playbook_with_action(
    playbook: str | Path,
    marker: str,
    action: Callable[[subprocess.Popen], None],
    *,
    tags: str | None = None,
    extra_vars: Mapping[str, Any] | None = None,
    interrupt: bool = False,
    timeout: float = PLAYBOOK_TIMEOUT,
) -> tuple[PlaybookRun, bool]:
    """Run ``playbook`` and call ``action(proc)`` once the task named ``marker`` reports a result.

    The fault happens *inside* the run (a link going down during start, a disk
    filling during a copy). With ``interrupt`` the action stops the run (Ctrl-C)
    and the run is then only waited for, pressing Ctrl-C again, then SIGTERM, as
    an operator would. Output is drained the whole time: ansible-playbook blocks
    on a full pipe. Returns the run and whether the action fired.
    """
    with tempfile.TemporaryDirectory(prefix="lab-vars-") as tmp:
        argv = playbook_argv(playbook, (), tags, extra_vars, Path(tmp))
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=ROOT, env=ansible_env(), start_new_session=True,
        )
        seen: list[str] = []
        fired = threading.Event()

        def read() -> None:
            armed = False
            assert proc.stdout is not None
            for line in proc.stdout:
                seen.append(line)
                if marker in line:
                    armed = True
                elif armed and not fired.is_set() and line.startswith(("changed:", "ok:", "skipping:")):
                    fired.set()
                    action(proc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            if interrupt:
                fired.wait(timeout)
                for sig, grace in ((None, 60), (signal.SIGINT, 30), (signal.SIGTERM, 30)):
                    if sig is not None and proc.poll() is None:
                        os.killpg(proc.pid, sig)
                    try:
                        proc.wait(timeout=grace)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise LabError(
                f"{shlex.join(argv)} did not finish within {timeout:g} s and was stopped;"
                f" last output:\n{_tail(''.join(seen))}"
            ) from None
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            reader.join(timeout=10)
    run = PlaybookRun(argv, proc.returncode, "".join(seen), "", time.monotonic() - started)
    return run, fired.is_set()


def inventory_var(name: str, host: str = HEAD, inventory: Path | None = None) -> Any:
    """A variable as the lab inventory (or ``inventory``) gives it to ``host`` (templated)."""
    done = run(
        [
            str(BIN / "ansible"),
            host,
            "-i",
            str(inventory or INVENTORY),
            *EXTRA_ARGS,
            "-m",
            "ansible.builtin.debug",
            "-a",
            f"var={name}",
            "-o",
        ],
        timeout=COMMAND_TIMEOUT,
        env=ansible_env(),
    )
    try:
        value = json.loads(done.stdout.split("=>", 1)[1])[name]
    except (IndexError, ValueError, KeyError):
        raise LabError(f"cannot read {name} for {host}: {done.stdout[:300]}") from None
    if isinstance(value, str) and value.startswith("VARIABLE IS NOT DEFINED"):
        raise LabError(f"the lab inventory defines no {name} for {host}")
    return value


def inventory_recipe() -> dict[str, Any]:
    recipe = inventory_var("vllm_recipe")
    if not isinstance(recipe, dict):
        raise LabError(f"the lab inventory's vllm_recipe is not a mapping: {recipe!r}")
    return recipe


# --- the endpoint ------------------------------------------------------------


def endpoint() -> str:
    """The OpenAI base URL (``.../v1``) of the lab's endpoint.

    ``LOCALINFERENCE_LAB_ENDPOINT`` if set, else what the serve role wrote to
    ``.lab/endpoint``, else the lab inventory's ``serve_endpoint_url``.
    """
    base = os.environ.get("LOCALINFERENCE_LAB_ENDPOINT", "").strip()
    if not base and ENDPOINT_FILE.is_file():
        base = ENDPOINT_FILE.read_text().strip()
    base = (base or DEFAULT_ENDPOINT).rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def api_key() -> str | None:
    """The ingress key: ``LOCALINFERENCE_LAB_API_KEY``, else ``.lab/ingress/api-key``, else None."""
    key = os.environ.get("LOCALINFERENCE_LAB_API_KEY", "").strip()
    if not key and API_KEY_FILE.is_file():
        lines = API_KEY_FILE.read_text().splitlines()
        key = lines[0].strip() if lines else ""
    return key or None


def auth_headers(key: str | None = None) -> dict[str, str]:
    """``Authorization: Bearer <key>`` with ``key`` or :func:`api_key`; empty without a key."""
    key = key or api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def served_models(base: str | None = None, timeout: float = 10) -> list[dict[str, Any]]:
    """``GET /v1/models``: the served models (vLLM adds ``max_model_len``)."""
    request = urllib.request.Request(f"{base or endpoint()}/models", headers=auth_headers())
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())["data"]


def served_max_model_len(base: str | None = None, timeout: float = 10) -> int | None:
    """The served ``max_model_len``, or None while nothing answers."""
    try:
        return served_models(base, timeout)[0]["max_model_len"]
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError):
        return None


def _sse_token(line: str) -> dict[str, Any] | None:
    """The collection's own first-token rule (serving_ready uses it too)."""
    return module_utils("engine._sse").sse_token(line)


def first_token(
    base: str | None = None, model: str = MODEL, timeout: float = 60, prompt: str = "hi"
) -> dict[str, Any]:
    """Stream a chat completion and return its first generated token.

    Returns ``{"key": "content"|"reasoning"|..., "text": ...}``; raises
    :class:`LabError` when the stream ends without one or nothing answers.
    """
    url = f"{base or endpoint()}/chat/completions"
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 4,
            "stream": True,
        }
    ).encode()
    headers = {"Content-Type": "application/json", **auth_headers()}
    request = urllib.request.Request(url, data=body, headers=headers)
    seen: list[str] = []
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace")
                token = _sse_token(line)
                if token:
                    return token
                seen.append(line.strip())
    except (urllib.error.URLError, OSError) as err:
        raise LabError(f"no streamed token from {url}: {err}") from None
    raise LabError(f"{url} streamed no generated token: {' | '.join(seen)[-1000:]}")


def streams_a_token(base: str | None = None, model: str = MODEL, timeout: float = 30) -> bool:
    """True once the endpoint streams a first token (for polling during a restart)."""
    try:
        first_token(base, model, timeout)
    except (LabError, ValueError):
        return False
    return True


# --- the head's watchdog (role watchdog): one set of helpers for tests/lab and benchmarks/ ---
WATCHDOG_UNIT = "localinference-watchdog.service"
INCIDENTS_FILE = "/var/lib/localinference/incidents.jsonl"
# The worker's tensor-parallel rank: its processes are titled VLLM::Worker_TP1 (or VLLM::…) or
# still show the venv's python, depending on the boot; stopping them all stops the rank.
RANK_PATTERN = "VLLM::|/opt/vllm/bin/python"


def watchdog_active() -> bool:
    done = exec_on(HEAD, "systemctl", "is-active", WATCHDOG_UNIT, check=False)
    return done.stdout.strip() == "active"


WATCHDOG_STATE = "/var/lib/localinference/watchdog-state.json"


def reset_watchdog_budget() -> None:
    """The watchdog restarted with its whole restart budget: earlier faults' restarts do not count."""
    exec_on(HEAD, "systemctl", "stop", WATCHDOG_UNIT)
    done = exec_on(HEAD, "cat", WATCHDOG_STATE, check=False)
    state = json.loads(done.stdout) if done.returncode == 0 else {"counts": {}}
    exec_on(HEAD, "tee", WATCHDOG_STATE, input=json.dumps({**state, "restarts": []}))
    exec_on(HEAD, "systemctl", "start", WATCHDOG_UNIT)


def incidents(since: float = 0.0) -> list[dict[str, Any]]:
    """The head's incident records whose epoch is at or after ``since`` (a torn line is skipped)."""
    text = exec_on(HEAD, "cat", INCIDENTS_FILE, check=False).stdout
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and float(record.get("epoch") or 0) >= since:
            records.append(record)
    return records


def rank_pids() -> list[str]:
    """The pids of the worker's rank (:data:`RANK_PATTERN`)."""
    return exec_on(WORKER, "pgrep", "-f", RANK_PATTERN, check=False).stdout.split()


def wait_for(what: str, predicate: Callable[[], Any], timeout: float, every: float = 2.0) -> Any:
    """``predicate()``'s first true value within ``timeout`` seconds, else AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


# --- faults the fault tests and the soak cause alike (tests/lab/faults, benchmarks/soak.py) ---
# The ingress's unit on the head (roles/ingress: ingress_service).
INGRESS_UNIT = "caddy.service"
# The head's vLLM server, by its command line (the worker's rank is RANK_PATTERN).
HEAD_SERVER_PATTERN = "vllm serve"
# What the upgrade's qualifications measure in the lab (the scripted model has no other).
QUALIFY_CHECKS = ("smoke", "tools", "concurrency")
UPGRADE_TIMEOUT = 2400


def kill_head_server() -> list[str]:
    """``kill -KILL`` of the head's vLLM server; returns its pids (LabError when none runs)."""
    pids = exec_on(HEAD, "pgrep", "-f", HEAD_SERVER_PATTERN, check=False).stdout.split()
    if not pids:
        raise LabError(f"no {HEAD_SERVER_PATTERN!r} process on {HEAD}: is the lab serving?")
    exec_on(HEAD, "kill", "-KILL", *pids)
    return pids


def rotate_key() -> PlaybookRun:
    """ingress.yml with ``ingress_rotate_key`` and ``--diff`` (which must print no key): a new
    key on the head, Caddy reloaded, :data:`API_KEY_FILE` and the client's env file rewritten."""
    return run_playbook("ingress.yml", "--diff", extra_vars={"ingress_rotate_key": True}, timeout=600)


def serving_hashes() -> set[str]:
    """The recipe hash each node's saved serving state names (one when the cluster agrees)."""
    return {read_json(host, SERVING_STATE)["recipe_hash"] for host in HOSTS}


def qualify(saved_path: str, report_dir: Path, checks: Sequence[str] = QUALIFY_CHECKS) -> PlaybookRun:
    """qualify.yml saving its verdict at ``saved_path`` (not the lab's own qualify.json)."""
    return run_playbook("qualify.yml", extra_vars={
        "qualify_checks": list(checks), "qualify_saved_path": saved_path, "qualify_report_dir": str(report_dir)})


def upgrade(changes: Mapping[str, Any], saved_path: str, report_dir: Path,
            checks: Sequence[str] = QUALIFY_CHECKS) -> PlaybookRun:
    """upgrade.yml with ``upgrade_set: changes``, qualified against the verdict at ``saved_path``."""
    return run_playbook("upgrade.yml", extra_vars={
        "upgrade_set": dict(changes), "qualify_checks": list(checks), "qualify_saved_path": saved_path,
        "qualify_report_dir": str(report_dir)}, timeout=UPGRADE_TIMEOUT)
