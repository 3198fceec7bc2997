# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Rollout faults against the real lab (make lab first): vLLM CPU, TP=2 over mp, Quadlet.

1. A max_model_len larger than the KV cache (F12) fails the start; the rollout
   rolls back to the previous recipe and quotes vLLM's estimated maximum model
   length; the endpoint keeps serving the previous recipe.
2. An edited reconciled state file (F10) is caught by verify, with the difference.
3. A stopped worker aborts the rollout before the head is touched.

Each rollout boots vLLM for real (about 1-3 minutes on two shared cores).
LOCALINFERENCE_LAB_EXTRA_ARGS adds ansible-playbook arguments (for example
``-i extra-inventory.yml``) when the lab inventory needs them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
INVENTORY = ROOT / "inventories" / "lab" / "hosts.yml"
EXTRA = shlex.split(os.environ.get("LOCALINFERENCE_LAB_EXTRA_ARGS", ""))
STATE = "/etc/localinference/serving.json"
ENDPOINT = "http://127.0.0.1:18000"


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def lab_up() -> bool:
    out = podman("ps", "--format", "{{.Names}}", check=False).stdout.split()
    return {"spark-head", "spark-worker"} <= set(out)


def playbook(
    *args: str, recipe: dict | None = None, tmp_path: Path | None = None, extra: str | None = None
) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "ansible-playbook"), "-i", str(INVENTORY), *EXTRA]
    if recipe is not None:
        assert tmp_path is not None
        file = tmp_path / f"recipe-{time.monotonic_ns()}.json"
        file.write_text(json.dumps({"vllm_recipe": recipe}))
        cmd += ["-e", f"@{file}"]
    if extra:
        cmd += ["-e", f"@{extra}"]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [*cmd, *args], capture_output=True, text=True, cwd=ROOT, env=env, check=False
    )
    # The YAML callback wraps long messages: compare on single spaces.
    proc.flat = " ".join(proc.stdout.split())
    return proc


def rollout(
    recipe: dict | None = None,
    tmp_path: Path | None = None,
    tags: str = "fabric,rollout",
    extra: str | None = None,
):
    """site.yml's fabric stage (it publishes cluster_network_env), then ``tags``."""
    site = str(ROOT / "playbooks" / "site.yml")
    return playbook(site, "--tags", tags, recipe=recipe, tmp_path=tmp_path, extra=extra)


def inventory_recipe() -> dict:
    cmd = [str(BIN / "ansible"), "spark-head", "-i", str(INVENTORY), *EXTRA]
    proc = subprocess.run(
        [*cmd, "-m", "ansible.builtin.debug", "-a", "var=vllm_recipe", "-o"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        check=True,
    )
    recipe = json.loads(proc.stdout.split("=>", 1)[1])["vllm_recipe"]
    assert isinstance(recipe, dict), (
        f"the lab inventory defines no vllm_recipe: {proc.stdout[:300]}"
    )
    return recipe


def node_state(host: str) -> dict:
    return json.loads(podman("exec", host, "cat", STATE).stdout)


def first_token() -> str:
    body = json.dumps(
        {
            "model": "localinference/tiny-deepseek",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"{ENDPOINT}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response:
            text = line.decode()
            if text.startswith("data: {") and (
                '"reasoning"' in text or '"content":"' in text.replace('"content":""', "")
            ):
                return text
    raise AssertionError("no streamed token")


def served_max_model_len() -> int:
    with urllib.request.urlopen(f"{ENDPOINT}/v1/models", timeout=10) as response:
        return json.loads(response.read())["data"][0]["max_model_len"]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    if not lab_up():
        pytest.skip("the lab is not up (make lab)")
    recipe = inventory_recipe()
    proc = rollout()
    assert proc.returncode == 0, proc.stdout[-3000:]
    first_token()
    return {
        "recipe": recipe,
        "hash": node_state("spark-head")["recipe_hash"],
        "tmp": tmp_path_factory.mktemp("r"),
    }


def test_too_large_max_model_len_rolls_back_quoting_the_estimate(baseline):
    recipe = dict(baseline["recipe"])
    env = {k: v for k, v in recipe.get("env", {}).items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    # 4 MiB of KV per rank holds 16,384 tokens of the tiny model at TP=2: too few for 32,768.
    recipe.update({"max_model_len": 32768, "kv_cache_memory_bytes": 4 * 1024 * 1024, "env": env})
    proc = rollout(recipe, baseline["tmp"])
    out = proc.flat
    assert proc.returncode != 0, out[-3000:]
    match = re.search(r"vLLM's estimated maximum model length is\s+(\d+)", out)
    assert match, out[-3000:]
    assert 0 < int(match.group(1)) < 32768
    assert "Rolled back: the endpoint serves the previous recipe" in out
    assert node_state("spark-head")["recipe_hash"] == baseline["hash"]
    assert node_state("spark-worker")["recipe_hash"] == baseline["hash"]
    assert served_max_model_len() == baseline["recipe"]["max_model_len"]
    first_token()


def test_edited_state_file_is_caught_by_verify(baseline):
    original = podman("exec", "spark-worker", "cat", STATE).stdout
    edited = json.loads(original)
    edited["recipe"]["max_model_len"] = 8192
    subprocess.run(
        ["podman", "exec", "-i", "spark-worker", "sh", "-c", f"cat > {STATE}"],
        input=json.dumps(edited, indent=2),
        text=True,
        check=True,
    )
    try:
        proc = rollout(tags="fabric,verify")
        assert proc.returncode != 0
        assert "F10" in proc.flat
        assert "recipe.max_model_len: node has 8192, inventory asks" in proc.flat
    finally:
        subprocess.run(
            ["podman", "exec", "-i", "spark-worker", "sh", "-c", f"cat > {STATE}"],
            input=original,
            text=True,
            check=True,
        )
    assert rollout(tags="fabric,verify").returncode == 0


def test_stopped_worker_aborts_before_the_head(baseline):
    head_before = podman("exec", "spark-head", "cat", STATE).stdout
    podman("stop", "--time", "20", "spark-worker")
    try:
        recipe = {**baseline["recipe"], "max_num_seqs": 8}
        proc = rollout(recipe, baseline["tmp"])
        assert proc.returncode != 0
        assert "UNREACHABLE" in proc.flat or "did not pass staging" in proc.flat
        assert "Apply | rm" not in proc.flat  # the play stopped before any rm/update
        assert podman("exec", "spark-head", "cat", STATE).stdout == head_before
    finally:
        podman("start", "spark-worker")
        for _ in range(60):
            state = podman(
                "exec", "spark-worker", "systemctl", "is-system-running", check=False
            ).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(2)
    # The inventory's recipe again: the worker's rank is back, so the cluster restarts if needed.
    proc = rollout()
    assert proc.returncode == 0, proc.stdout[-3000:]
    first_token()
