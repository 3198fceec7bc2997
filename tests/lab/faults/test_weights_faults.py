# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Weights stage against the real lab: faults on the worker are caught and repaired.

Runs playbooks/weights.yml (the same play `site.yml --tags weights` runs) on
the two lab hosts, damages the worker's copy with `podman exec`, and checks
from outside that each fault is detected, repaired over the cluster link, and
that a run over an unchanged snapshot copies nothing and hashes nothing.

Faults, one file each: truncate (caught by size), delete (missing), and one
byte flipped in place with size and mtime kept (invisible to the fast path by
design, caught by model_weights_verify_full=true).
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from lab.harness import (
    BIN,
    HEAD,
    HOSTS,
    MODEL_SNAPSHOT,
    ROOT,
    WORKER,
    exec_on,
    podman,
    run,
    run_playbook,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

SNAPSHOT = MODEL_SNAPSHOT
VERIFY_TASK = "Compare this node's copy with the head's manifest"
CREATE_TASK = "Record the head's snapshot in its manifest"
REVERIFY_TASK = "Verify the copied files by hash"
SHORTCUT_TASK = "Re-verify this node's copy against its manifest"
SAVE_TASK = "Save this node's result (/etc/localinference/weights.json)"


def sha256(host: str, rel: str) -> str:
    return exec_on(host, "sha256sum", f"{SNAPSHOT}/{rel}").stdout.split()[0]


class Run:
    """One playbooks/weights.yml run, read through the json callback."""

    def __init__(self, **extra_vars: Any) -> None:
        proc = run_playbook(
            "weights.yml",
            extra_vars=extra_vars or None,
            env={"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"},
            timeout=900,
        )
        assert proc.rc == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        self.data = json.loads(proc.stdout[proc.stdout.index("{") :])

    def result(self, task: str, host: str) -> dict | None:
        for play in self.data["plays"]:
            for entry in play["tasks"]:
                if entry["task"]["name"].endswith(task) and host in entry["hosts"]:
                    return entry["hosts"][host]
        return None

    def changed(self, host: str) -> int:
        return self.data["stats"][host]["changed"]


@pytest.fixture(scope="module")
def converged():
    Run()  # first run: stage on the head, copy to the worker (or nothing, if done before)
    return {
        rel: sha256(HEAD, rel) for rel in ("model.safetensors", "tokenizer.json", "config.json")
    }


def assert_quiet(weights: Run, shortcut: bool) -> None:
    """Nothing changed or hashed; with ``shortcut``, the stage stopped after each node's re-verify.

    Without it (the first run after other inputs), the whole stage ran and found nothing to do.
    """
    for host in HOSTS:
        # The first run after other inputs records its fingerprint in the saved result, nothing else.
        recorded = 0 if shortcut else int(bool((weights.result(SAVE_TASK, host) or {}).get("changed")))
        assert weights.changed(host) == recorded, f"{host} changed on a run over an unchanged snapshot"
    if shortcut:
        for host in HOSTS:
            reverified = weights.result(SHORTCUT_TASK, host)
            assert reverified["ok"] is True and reverified["hashed"] == 0, reverified
        assert weights.result(CREATE_TASK, HEAD) is None, "the head recorded its manifest again"
        assert weights.result(VERIFY_TASK, WORKER) is None, "the worker compared its copy again"
        return
    assert weights.result(CREATE_TASK, HEAD)["hashed"] == 0
    assert weights.result(VERIFY_TASK, WORKER)["hashed"] == 0
    assert weights.result(VERIFY_TASK, WORKER)["mismatched"] == []


def test_second_run_changes_nothing_and_hashes_nothing(converged):
    assert_quiet(Run(), shortcut=True)


def test_faults_are_detected_and_repaired(converged):
    path = f"{SNAPSHOT}/model.safetensors"
    exec_on(WORKER, "truncate", "-s", "100", f"{SNAPSHOT}/tokenizer.json")
    exec_on(WORKER, "rm", "-f", f"{SNAPSHOT}/config.json")
    # one byte flipped in the middle of the tensor data; size and mtime kept
    exec_on(
        WORKER,
        "python3",
        "-c",
        "import os,sys;p=sys.argv[1];s=os.stat(p);f=open(p,'r+b');f.seek(s.st_size//2);b=f.read(1);"
        "f.seek(s.st_size//2);f.write(bytes([b[0]^0xFF]));f.close();os.utime(p,ns=(s.st_atime_ns,s.st_mtime_ns))",
        path,
    )
    assert sha256(WORKER, "model.safetensors") != converged["model.safetensors"]

    # The fast path catches the truncation and the deletion, and repairs them:
    # the worker's re-verify fails, so the whole stage runs on every node.
    fast = Run()
    assert fast.result(SHORTCUT_TASK, WORKER)["ok"] is False
    reasons = {m["path"]: m["reason"] for m in fast.result(VERIFY_TASK, WORKER)["mismatched"]}
    assert reasons["tokenizer.json"].startswith("size 100 differs")
    assert reasons["config.json"] == "missing"
    assert "model.safetensors" not in reasons  # same size and mtime: invisible without full
    assert fast.result(REVERIFY_TASK, WORKER)["ok"] is True
    for rel in ("tokenizer.json", "config.json"):
        assert sha256(WORKER, rel) == converged[rel]

    # Full verification catches the flipped byte; the next run repairs it.
    full = Run(model_weights_verify_full=True)
    mismatched = full.result(VERIFY_TASK, WORKER)["mismatched"]
    assert [m["path"] for m in mismatched] == ["model.safetensors"]
    assert mismatched[0]["reason"].startswith("sha256")
    assert full.result(REVERIFY_TASK, WORKER)["hashed"] == 1
    assert sha256(WORKER, "model.safetensors") == converged["model.safetensors"]

    # Repaired: the next run copies nothing and hashes nothing (the whole stage
    # runs once, as model_weights_verify_full changed back), and the one after
    # that stops after each node's re-verify.
    assert_quiet(Run(), shortcut=False)
    assert_quiet(Run(), shortcut=True)


HUB_TEST_ID = "localinference/hubtest"
HUB_TOKEN = (
    "hf_0123456789secret"  # the stand-in hub's token (tests/unit/.../test_manifest_hf_snapshot.py)
)
HUB_SNAPSHOT = SNAPSHOT.replace("tiny-deepseek", "hubtest")
STAND_IN = ROOT / "tests" / "unit" / "plugins" / "module_utils" / "weights" / "test_manifest_hf_snapshot.py"
# Serves the lab model's files as repo localinference/hubtest from inside the head: the
# same stand-in hub as the unit tests, run with the head's own Python (stdlib only).
SERVE = f"""
import importlib.util, os, sys, time, types
sys.modules["pytest"] = types.SimpleNamespace(
    importorskip=lambda name: None, fixture=lambda f: f,
    mark=types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f)))
spec = importlib.util.spec_from_file_location("hub", "/root/lab-hub/a/b/c/d/e/hub.py")
hub_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hub_module)
hub_module.REPO = "{HUB_TEST_ID}"
src = "{SNAPSHOT}"
hub = hub_module.FakeHub({{name: open(os.path.join(src, name), "rb").read() for name in os.listdir(src)}})
with open("/root/lab-hub/pid", "w") as handle:
    handle.write(str(os.getpid()))
with open("/root/lab-hub/url.tmp", "w") as handle:
    handle.write(hub.url)
os.replace("/root/lab-hub/url.tmp", "/root/lab-hub/url")
time.sleep(600)
"""


@pytest.fixture
def stand_in_hub(tmp_path, converged):
    """A stand-in hub inside the head, and a wheelhouse for its huggingface_hub venv.

    The lab hosts cannot verify PyPI's certificate chain here, so the head installs
    huggingface_hub from wheels downloaded on the controller (the air-gapped way).
    """
    wheels = tmp_path / "wheels"
    head_python = exec_on(
        HEAD, "python3", "-c", "import sys;print('%d.%d' % sys.version_info[:2])"
    ).stdout.strip()
    fetched = run(
        [
            str(BIN / "pip"),
            "download",
            "-q",
            "--dest",
            str(wheels),
            "--only-binary=:all:",
            "--python-version",
            head_python,
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "huggingface-hub==2.4.0",
        ],
        timeout=300,
        check=False,
    )
    if fetched.returncode != 0:
        pytest.skip(f"cannot download huggingface_hub wheels for the head: {fetched.stderr[-500:]}")
    exec_on(HEAD, "mkdir", "-p", "/root/lab-hub/a/b/c/d/e")
    podman("cp", str(wheels), f"{HEAD}:/root/lab-hub/wheels")
    podman("cp", str(STAND_IN), f"{HEAD}:/root/lab-hub/a/b/c/d/e/hub.py")
    # The hub runs for the whole test: started in the background, stopped below.
    server = subprocess.Popen(["podman", "exec", HEAD, "python3", "-c", SERVE])
    try:
        url = ""
        for _ in range(50):
            probe = exec_on(HEAD, "cat", "/root/lab-hub/url", check=False)
            if probe.returncode == 0 and probe.stdout:
                url = probe.stdout.strip()
                break
            time.sleep(0.2)
        assert url, "the stand-in hub did not start in the head"
        yield url
    finally:
        # stopping `podman exec` does not stop the process inside the head
        pid = exec_on(HEAD, "cat", "/root/lab-hub/pid", check=False).stdout.strip()
        if pid.isdigit():
            exec_on(HEAD, "kill", pid, check=False)
        server.wait(timeout=30)
        for host in HOSTS:
            exec_on(host, "rm", "-rf", HUB_SNAPSHOT.rsplit("/snapshots/", 1)[0], check=False)
        exec_on(
            HEAD,
            "rm",
            "-rf",
            "/root/lab-hub",
            "/opt/localinference/hf-venv",
            "/srv/models/hub/localinference-download.log",
            check=False,
        )


def test_hub_source_downloads_on_the_head_and_distributes(stand_in_hub):
    extra = {
        "model_weights_source": "hub",
        "model_weights_id": HUB_TEST_ID,
        "model_weights_hub_endpoint": stand_in_hub,
        "model_weights_hub_token": HUB_TOKEN,
        "model_weights_hub_pip_extra_args": "--no-index --find-links /root/lab-hub/wheels",
    }
    first = Run(**extra)
    assert HUB_TOKEN not in json.dumps(first.data)
    download = first.result(
        "Download the revision (space checked first, resumable; progress in the log on the head)",
        HEAD,
    )
    assert download["changed"] is True
    assert first.result(CREATE_TASK, HEAD)["ok"] is True
    for rel in ("model.safetensors", "config.json"):
        head_copy = exec_on(HEAD, "readlink", "-f", f"{HUB_SNAPSHOT}/{rel}").stdout.strip()
        assert "/blobs/" in head_copy  # the hub cache layout vLLM reads offline
        worker_copy = exec_on(WORKER, "sha256sum", f"{HUB_SNAPSHOT}/{rel}").stdout.split()[0]
        assert worker_copy == sha256(HEAD, rel)
    # The second run stops after each node's re-verify (model_weights_reuse).
    assert_quiet(Run(**extra), shortcut=True)
