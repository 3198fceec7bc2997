# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared helpers of the rollout benchmarks (lab hosts, playbook runs, streamed tokens)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
INVENTORY = ROOT / "inventories" / "lab" / "hosts.yml"
EXTRA = shlex.split(os.environ.get("LOCALINFERENCE_LAB_EXTRA_ARGS", ""))
ENDPOINT = os.environ.get("LOCALINFERENCE_LAB_ENDPOINT", "http://127.0.0.1:18000")
HOSTS = ("spark-head", "spark-worker")
MODEL = "localinference/tiny-deepseek"
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}


def ansible_playbook(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(INVENTORY), *EXTRA, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        check=False,
    )
    return time.monotonic() - started, proc


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host."""
    hosts = {}
    for line in stdout.splitlines():
        match = re.match(r"^(\S+)\s+: (ok=.*)$", line)
        if match:
            hosts[match.group(1)] = {
                k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))
            }
    return hosts


def invocations(unit: str = "localinference-vllm.service") -> dict[str, str]:
    """systemd InvocationID of the server unit on each lab host (changes on every start)."""
    ids = {}
    for host in HOSTS:
        proc = subprocess.run(
            ["podman", "exec", host, "systemctl", "show", "-p", "InvocationID", "--value", unit],
            capture_output=True,
            text=True,
            check=False,
        )
        ids[host] = proc.stdout.strip()
    return ids


def inventory_recipe() -> dict:
    proc = subprocess.run(
        [
            str(BIN / "ansible"),
            "spark-head",
            "-i",
            str(INVENTORY),
            *EXTRA,
            "-m",
            "ansible.builtin.debug",
            "-a",
            "var=vllm_recipe",
            "-o",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        check=True,
    )
    return json.loads(proc.stdout.split("=>", 1)[1])["vllm_recipe"]


def served_max_model_len(base: str = ENDPOINT) -> int | None:
    try:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=2) as response:
            return json.loads(response.read())["data"][0]["max_model_len"]
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError):
        return None


def streamed_token(base: str = ENDPOINT, model: str = MODEL, timeout: float = 30) -> bool:
    """True once a streamed chat completion yields its first generated token."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: {"):
                    continue
                for choice in json.loads(line[6:]).get("choices") or []:
                    delta = choice.get("delta") or {}
                    if (
                        delta.get("content")
                        or delta.get("reasoning")
                        or delta.get("reasoning_content")
                    ):
                        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return False
