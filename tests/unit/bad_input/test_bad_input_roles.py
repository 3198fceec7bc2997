# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad input for every role entry point and for the playbooks, run by ansible-playbook.

The case tables are ``roles_cases.yml`` (one case per host: a batch of cases is one
``ansible-playbook --check`` run over a throw-away inventory of local-connection hosts,
each host with its own bad input) and ``playbooks_cases.yml`` (one run per case, the
playbook as a user runs it).  Every case must fail, its failure must name the offending
input, no output may show a traceback, and every run must end within ``RUN_TIMEOUT``.
Every ``*_path`` option points under the test's temporary directory and every run is in
check mode, so nothing on this machine changes.  The ``bad_input_results`` callback
(``callback_plugins/``) records each host's failures as JSON.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
ROLE_TABLE = yaml.safe_load((HERE / "roles_cases.yml").read_text(encoding="utf-8"))
PLAYBOOK_TABLE = yaml.safe_load((HERE / "playbooks_cases.yml").read_text(encoding="utf-8"))
ROLE_CASES: list[dict[str, Any]] = ROLE_TABLE["cases"]
PLAYBOOK_CASES: list[dict[str, Any]] = PLAYBOOK_TABLE["cases"]
# One ansible-playbook run may take this long; beyond it the run counts as a hang. The
# 25-host serve_stage batch took 75 s alone and over 120 s beside three others on a VM
# with 20 % steal time.
RUN_TIMEOUT = 240
# Runs at once (the machine has 2 cores; a run mostly waits on its forks).
PARALLEL_RUNS = 4
TRACEBACK = re.compile(
    r"Traceback \(most recent call last\)|The full traceback is|"
    r"An exception occurred during task execution|Unexpected Exception|unexpected failure"
)
# A Python error that reached the user instead of a message: ansible-core 2.19 shows a
# plugin's or a module's uncaught exception as its class and text, without a traceback.
RAW_EXCEPTION = re.compile(
    r"\b(KeyError|TypeError|AttributeError|IndexError|ZeroDivisionError|UnicodeDecodeError|"
    r"OverflowError|RecursionError|NameError|JSONDecodeError)\b|object has no attribute|"
    r"is not subscriptable|unsupported operand|MODULE FAILURE"
)
SAVED = ("plan.json", "serving.json", "staging", "ingress.json", "api-key.env", "Caddyfile")


def _ansible_playbook() -> str | None:
    venv = ROOT / ".venv" / "bin" / "ansible-playbook"
    return str(venv) if venv.exists() else shutil.which("ansible-playbook")


def _python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else "/usr/bin/python3"


pytestmark = pytest.mark.skipif(
    _ansible_playbook() is None
    or not (ROOT / ".lab" / "collections" / "ansible_collections" / "localinference").exists(),
    reason="needs ansible-playbook and .lab/collections (make bootstrap)",
)


def _fill(value: Any, directory: Path) -> Any:
    """Replace ``{dir}`` in every string with the host's own directory."""
    if isinstance(value, str):
        return value.replace("{dir}", str(directory))
    if isinstance(value, list):
        return [_fill(item, directory) for item in value]
    if isinstance(value, dict):
        return {key: _fill(item, directory) for key, item in value.items()}
    return value


def _case_vars(base: dict[str, Any], case: dict[str, Any], directory: Path) -> dict[str, Any]:
    """The base variables with the case's one change, every path under ``directory``."""
    result = copy.deepcopy(base)
    for name in case.get("unset", []):
        result.pop(name, None)
    result.update(copy.deepcopy(case.get("vars", {})))
    if "recipe" in case:
        result["vllm_recipe"] = {**result["vllm_recipe"], **copy.deepcopy(case["recipe"])}
    return _fill(result, directory)


def _write_tar(target: Path, members: dict[str, Any]) -> None:
    """A tar of ``members`` (a mapping member is written as JSON): a made-up image archive."""
    with tarfile.open(target, "w") as tar:
        for member, content in members.items():
            data = (content if isinstance(content, str) else json.dumps(content)).encode("utf-8")
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _write_files(case: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in case.get("files", {}).items():
        target = directory / name.rstrip("/")
        if name.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
        elif isinstance(content, dict):
            _write_tar(target, content)
        else:
            target.write_text(content, encoding="utf-8")


@dataclass
class Run:
    """One ansible-playbook run and what each host of it failed with."""

    name: str
    rc: int | None = None
    seconds: float = 0.0
    output: str = ""
    hosts: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False


def _run(name: str, workdir: Path, inventory: dict[str, Any], argv: list[str]) -> Run:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "inventory.yml").write_text(yaml.safe_dump(inventory), encoding="utf-8")
    results = workdir / "results.json"
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_CALLBACK_PLUGINS": str(HERE / "callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": "bad_input_results",
        "BAD_INPUT_RESULTS": str(results),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(workdir / "ansible-tmp"),
        "ANSIBLE_REMOTE_TEMP": str(workdir / "ansible-tmp"),
        "ANSIBLE_FORKS": "10",
    }
    command = [_ansible_playbook(), "-i", str(workdir / "inventory.yml"), *argv, "--check", "-vvv"]
    run = Run(name)
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
        )
        run.rc, run.output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        run.timed_out = True
        run.output = str(exc.stdout or "") + str(exc.stderr or "")
    run.seconds = time.monotonic() - started
    (workdir / "output.txt").write_text(run.output, encoding="utf-8")
    if results.exists():
        run.hosts = json.loads(results.read_text(encoding="utf-8"))
    return run


def _role_playbook(target: dict[str, Any]) -> list[dict[str, Any]]:
    role = f"localinference.vllm.{target['role']}"
    tasks = [
        {
            "name": f"Before the entry point: {entry}",
            "ansible.builtin.import_role": {"name": role, "tasks_from": entry},
        }
        for entry in target.get("pre", [])
    ]
    tasks.append(
        {
            "name": f"Entry point under test: {target['role']} {target['entry']}",
            "ansible.builtin.import_role": {"name": role, "tasks_from": target["entry"]},
        }
    )
    return [{"name": "Bad input", "hosts": "cases", "gather_facts": False, "tasks": tasks}]


def _role_inventory(
    target: dict[str, Any], hosts: dict[str, dict[str, Any]], spare: dict[str, Any]
):
    names = {name: {} for name in hosts}
    layout = target["layout"]
    children: dict[str, Any] = {"cases": {"hosts": hosts}}
    if layout == "cluster":
        children["vllm_cluster"] = {"hosts": names}
    elif layout in ("heads", "alone"):
        children["vllm_cluster"] = {"children": {"vllm_head": {"hosts": names}, "vllm_workers": {}}}
    elif layout == "spare":
        children["vllm_cluster"] = {
            "children": {"vllm_head": {"hosts": {"h0": spare}}, "vllm_workers": {"hosts": names}}
        }
    else:
        raise ValueError(f"unknown layout {layout!r}")
    return {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": _python()},
                    "children": children}}  # fmt: skip


def _role_batches(tmp: Path) -> list[tuple[str, Path, dict[str, Any], list[str]]]:
    """(run name, work directory, inventory, argv) per batch; CASE_HOST maps each case to its host."""
    by_target: dict[str, list[dict[str, Any]]] = {}
    for case in ROLE_CASES:
        by_target.setdefault(case["target"], []).append(case)
    batches = []
    for target_name, cases in by_target.items():
        target = ROLE_TABLE["targets"][target_name]
        groups = [[case] for case in cases] if target["layout"] == "alone" else [cases]
        for number, group in enumerate(groups):
            name = f"{target_name}-{number}" if target["layout"] == "alone" else target_name
            workdir = tmp / name
            hosts = {}
            for index, case in enumerate(group):
                host = f"c{index:03d}"
                CASE_HOST[case["id"]] = (name, host)
                directory = workdir / host
                _write_files(case, directory)
                hosts[host] = _case_vars(target["base"], case, directory)
            (workdir / "h0").mkdir(parents=True, exist_ok=True)
            spare = _fill(copy.deepcopy(target["base"]), workdir / "h0")
            inventory = _role_inventory(target, hosts, spare)
            workdir.mkdir(parents=True, exist_ok=True)
            playbook = workdir / "playbook.yml"
            playbook.write_text(
                yaml.safe_dump(_role_playbook(target), sort_keys=False), encoding="utf-8"
            )
            batches.append((name, workdir, inventory, [str(playbook)]))
    return batches


def _playbook_batches(tmp: Path) -> list[tuple[str, Path, dict[str, Any], list[str]]]:
    batches = []
    for case in PLAYBOOK_CASES:
        name = f"playbook-{case['id']}"
        workdir = tmp / name
        directory = workdir / "h0"
        _write_files(case, directory)
        group_vars = _case_vars(PLAYBOOK_TABLE["base"], case, directory)
        group_vars.update(ansible_connection="local", ansible_python_interpreter=_python())
        inventory = {"all": {"vars": group_vars, "children": {"vllm_cluster": {"children": {
            "vllm_head": {"hosts": {"h0": {}}}, "vllm_workers": {}}}}}}  # fmt: skip
        playbook = case["playbook"]
        if not playbook.startswith("localinference."):
            playbook = str(ROOT / "playbooks" / playbook)
        argv = [playbook] + (["--tags", case["tags"]] if case.get("tags") else [])
        CASE_HOST[name] = (name, None)
        batches.append((name, workdir, inventory, argv))
    return batches


CASE_HOST: dict[str, tuple[str, str | None]] = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    tmp = tmp_path_factory.mktemp("bad-input-roles")
    batches = _role_batches(tmp) + _playbook_batches(tmp)
    started = time.monotonic()
    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        done = list(pool.map(lambda batch: _run(*batch), batches))
    result = {run.name: run for run in done}
    total = time.monotonic() - started
    slowest = sorted(done, key=lambda run: -run.seconds)[:3]
    print(f"\nbad-input roles: {len(batches)} runs in {total:.1f} s; slowest "
          + ", ".join(f"{run.name} {run.seconds:.1f} s" for run in slowest))  # fmt: skip
    return result


def _messages(failures: list[dict[str, Any]]) -> str:
    parts = []
    for failure in failures:
        for key in ("msg", "argument_errors", "stderr", "module_stderr"):
            if failure.get(key):
                parts.append(str(failure[key]))
        for item in failure.get("items", []):
            parts.extend(str(item.get(key)) for key in ("msg", "stderr") if item.get(key))
    return "\n".join(parts)


def _judge(run: Run, hosts: list[str] | None, expect: list[str]) -> None:
    """Fail the case on a hang, a traceback, a success or a message that does not name the input."""
    assert not run.timed_out, f"hang: {run.name} did not end within {RUN_TIMEOUT} s"
    tracebacks = [line for line in run.output.splitlines() if TRACEBACK.search(line)]
    failures = [
        failure
        for host, record in run.hosts.items()
        if hosts is None or host in hosts
        for failure in record.get("failures", [])
        if not failure.get("ignored")
    ]
    # ansible-core 2.19 marks every failed task with exception "(traceback unavailable)";
    # only a real traceback or a raw Python error in the message counts.
    exceptions = [
        failure["task"]
        for failure in failures
        if "Traceback" in str(failure.get("exception", ""))
        or RAW_EXCEPTION.search(_messages([failure]))
    ]
    assert not tracebacks and not exceptions, (
        f"traceback in {run.name}: {tracebacks[:3]} {exceptions}\n{_messages(failures)[-3000:]}"
    )
    assert run.rc not in (None, 0), f"silent success: {run.name} ended with rc {run.rc}"
    assert failures, f"silent success: no failure for {hosts} in {run.name}: {run.hosts}"
    assert not any(failure["kind"] == "unreachable" for failure in failures), failures
    text = _messages(failures)
    missing = [word for word in expect if word.lower() not in text.lower()]
    assert not missing, f"vague: the message does not name {missing}:\n{text}"


def _params(cases: list[dict[str, Any]]) -> list[Any]:
    """A case with ``known`` is a defect found and not yet fixed: a strict xfail naming it."""
    return [
        pytest.param(
            case,
            id=case["id"],
            marks=[pytest.mark.xfail(strict=True, reason=case["known"])]
            if case.get("known")
            else [],
        )
        for case in cases
    ]


@pytest.mark.parametrize("case", _params(ROLE_CASES))
def test_role_entry_point_refuses_bad_input(runs: dict[str, Run], case: dict[str, Any]) -> None:
    name, host = CASE_HOST[case["id"]]
    _judge(runs[name], [host], case["expect"])


@pytest.mark.parametrize("case", _params(PLAYBOOK_CASES))
def test_playbook_refuses_bad_input_before_touching_anything(
    runs: dict[str, Run], case: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    name = f"playbook-{case['id']}"
    run = runs[name]
    _judge(run, None, case["expect"])
    left = [
        str(path)
        for path in tmp_path_factory.getbasetemp().glob(f"bad-input-roles*/{name}/h0/*")
        if path.name in SAVED
    ]
    assert not left, f"the run left {left} behind"


def test_every_entry_point_has_a_case() -> None:
    """Each entry point of every role's argument_specs.yml is exercised by the table."""
    covered = {(target["role"], target["entry"]) for target in ROLE_TABLE["targets"].values()}
    declared = set()
    for spec in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        entries = yaml.safe_load(spec.read_text(encoding="utf-8"))["argument_specs"]
        declared |= {(spec.parent.parent.name, entry) for entry in entries}
    assert declared <= covered, (
        f"entry points without a bad-input case: {sorted(declared - covered)}"
    )
