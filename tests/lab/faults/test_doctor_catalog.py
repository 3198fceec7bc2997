# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every catalog defect the lab can reproduce, planted at once; one doctor run names them all.

Planted together on the real lab (which id is tested where: docs/failure-catalog.md,
"Where each id is tested"):

- F19: spark-worker's cluster interface set to MTU 1500 with ``ip link`` (behind
  NetworkManager) while spark-head keeps 9000.
- F13: an orphaned ``/dev/shm/vllm_offload_*.mmap`` on spark-worker that no process maps or
  holds, 1.5 GiB of its 2 GiB /dev/shm (seen live, and by preflight's /dev/shm check).
- F4, F5, F25: preflight run on the lab with limits the lab's real figures do not meet (4 TiB
  of free memory, a load of 0.01 per CPU, 1 PiB of weights): its saved verdict is what the
  doctor reads. (The frozen node of F5 and the full disk are tests/lab/faults/test_preflight_faults.py
  and test_weights_disk_full.py; a real 4 TiB model does not fit this machine.)
- F14, F17: spark-worker's Quadlet unit edited to add ``PodmanArgs=--ipc=host`` and
  ``PodmanArgs=--privileged`` beside its ``ShmSize=1g``. systemd is not reloaded, so the
  engine keeps running; the file is what the next start runs (the edit is also F10).
- F11: Caddy on spark-head cannot reach its upstream (an iptables REJECT of Caddy's user to
  127.0.0.1:8000), so the ingress answers 502 while the unit looks fine. The engine is not
  stopped: with tensor parallel over ``mp`` a stopped rank 0 comes back only with a rollout
  (minutes, tests/lab/faults/test_engine_faults.py); the doctor's reading of stopped units is
  unit-tested on their recorded ``systemctl show``.
- F7, F8, F9: the controller's opencode.json (the copy the doctor reads) asks for 131,072 tokens
  of context with 60,000 reserved, and the head's client.json records an opencode that reads
  ``reasoning_content`` only (1.18.15; the lab's own opencode reads both fields).
- F1, F3, F6, F12, F14, F15, F16, F17, F27: the plan stage run on the lab with a recipe that
  carries each, and the doctor given that recipe as the inventory's (the nodes, which run the
  lab recipe, then differ from it: F10, which tests/lab/faults/test_doctor.py plants on its own).
- F24 (real on the lab: its hosts do not synchronise their clocks) and F1's warning (the lab
  recipe pins kv_cache_memory_bytes) are named as the lab is.

One doctor run sees everything (changed=0, within the doctor's minute). Each defect is then put
back, each restore on its own so one failure does not leave the others planted; the next doctor
run is healthy, and every file and setting the test touched is as it was (content, mtime, the
engines' invocations, Caddy's process, the firewall, the MTU, /dev/shm).

Measured on the lab (two shared cores), the whole file: 46 to 54 s (the baseline doctor 12 s,
planting with the preflight and plan runs 12 s, the planted doctor 10-13 s, the restore 1 s, the
last doctor 10-14 s); 67 s while another session loaded the machine. A rollout first, only when the lab is not
healthy to begin with, adds its minutes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.harness import (
    CLUSTER_IF,
    HEAD,
    HOSTS,
    LAB_DIR,
    STATE_DIR,
    VLLM_UNIT,
    WORKER,
    exec_on,
    read_json,
    rollout,
    run_playbook,
    unit_invocations,
    write_text,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

DOCTOR_SECONDS = 60
FILE_SECONDS = 120
CONTAINER_UNIT = "/etc/containers/systemd/localinference-vllm.container"
ORPHAN = "/dev/shm/vllm_offload_doctor-catalog.mmap"
PREFLIGHT_RESULT = f"{STATE_DIR}/preflight.json"
# Limits the lab's real figures do not meet (the lab itself asks for 2 GiB and a load of 1000).
PREFLIGHT_LIMITS = {
    "preflight_min_free_memory_gib": 4096,  # F4
    "preflight_max_load_per_cpu": 0.01,  # F5
    "preflight_weights_bytes": 2**50,  # F25
    "preflight_inspect_engine": False,  # the NCCL probe of the image is not what is tested
}
CLIENT_RESULT = f"{STATE_DIR}/client.json"
PLAN_RESULT = f"{STATE_DIR}/plan.json"
OPENCODE = LAB_DIR / "opencode" / "opencode.json"
BACKUP = "/root/doctor-catalog.bak"
# Caddy's user may not reach vLLM's API on the head's loopback (refused): the ingress answers 503.
UPSTREAM_BLOCK = ["OUTPUT", "-o", "lo", "-p", "tcp", "-d", "127.0.0.1", "--dport", "8000",
                  "-m", "owner", "--uid-owner", "caddy",
                  "-j", "REJECT", "--reject-with", "tcp-reset"]  # fmt: skip
# The plan's lint ids, all in one recipe (the plan saves its verdict, then refuses it).
DEFECTIVE = {
    "gpu_memory_utilization": 0.5,  # F1: inert beside kv_cache_memory_bytes
    "max_num_seqs": 1,  # F3
    "reasoning_parser": None,  # F6: tool parser without reasoning parser
    "max_model_len": 1_000_000,  # F12: no observed boot holds it
    "ipc_host": True,  # F14: beside shm_size 1g
    "speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                           "parallel_drafting": True, "prompt_lookup_max": 4},  # F15
    "max_num_batched_tokens": 8192,
    "kv_offloading_size": 4,  # F16: 4 GiB against the lab's 2 GiB /dev/shm
    "privileged": True,  # F17
    "tensor_parallel_size": 3,  # F27: 3 ranks cannot spread evenly over the lab's 2 nodes
}  # fmt: skip
# What the planted run must name: id, host, words of the evidence, severity.
EXPECTED = [
    ("F19", WORKER, f"/sys/class/net/{CLUSTER_IF}/mtu: 1500", "error"),
    ("F13", WORKER, ORPHAN, "error"),
    ("F13", WORKER, "preflight.json findings", "error"),
    ("F4", WORKER, "preflight.json findings", "error"),
    ("F5", WORKER, "preflight.json findings", "error"),
    ("F25", WORKER, "preflight.json findings", "error"),
    ("F14", WORKER, "--ipc=host", "error"),
    ("F17", WORKER, "--privileged", "error"),
    ("F11", HEAD, "HTTP 503", "error"),
    ("F7", "controller", "opencode.json", "error"),
    ("F8", "controller", "context 131072", "error"),
    ("F9", "controller", "prompt floor", "error"),
    ("F1", HEAD, "plan.json violations", "error"),
    ("F3", HEAD, "plan.json violations", "error"),
    ("F6", HEAD, "plan.json violations", "error"),
    ("F12", HEAD, "plan.json violations", "error"),
    ("F14", HEAD, "plan.json violations", "error"),
    ("F15", HEAD, "plan.json violations", "warning"),
    ("F16", HEAD, "plan.json violations", "error"),
    ("F17", HEAD, "plan.json violations", "warning"),
    ("F27", HEAD, "plan.json violations", "error"),
    ("F24", WORKER, "NTPSynchronized=no", "warning"),
    ("F1", WORKER, "serving.json recipe", "warning"),
]


class Doctor:
    """One doctor run through the JSON callback: the judge's findings, the verdict, the table."""

    def __init__(self, extra_vars: dict[str, Any] | None = None) -> None:
        proc = run_playbook(
            "doctor.yml",
            extra_vars=extra_vars,
            env={"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"},
            timeout=300,
        )
        self.proc = proc
        self.data = json.loads(proc.stdout[proc.stdout.index("{") :])
        result = self._result("Judge the evidence", "localhost")
        self.result = result["ansible_facts"]["doctor_result"]
        self.table = "\n".join(self._result("Print the diagnosis", "localhost")["msg"])

    def _result(self, task: str, host: str) -> dict[str, Any]:
        for play in self.data["plays"]:
            for entry in play["tasks"]:
                if task in entry["task"]["name"] and host in entry["hosts"]:
                    return entry["hosts"][host]
        raise AssertionError(f"no result of {task!r} on {host}:\n{self.proc.tail()}")

    @property
    def changed(self) -> int:
        return sum(stats.get("changed", 0) for stats in self.data["stats"].values())

    def named(self, fid: str, host: str, evidence: str, severity: str) -> bool:
        return any(
            f["id"] == fid
            and host in f["host"].split(", ")
            and evidence in f["evidence"]
            and f["severity"] == severity
            for f in self.result["findings"]
        )

    def shown(self) -> str:
        return f"{self.result['verdict']}\n{self.table}"


# --- what the test touches, recorded before and compared after -------------------------------


# The saved results this test plants, restores or judges by (qualify.json and the stack lock are
# written by other stages only: another session's qualification may legitimately rewrite them).
SAVED = ("client", "fabric", "ingress", "plan", "preflight", "serving", "weights")


def _node_state(host: str) -> dict[str, str]:
    files = " ".join(f"{name}.json" for name in SAVED)
    script = (
        f"cd {STATE_DIR} && stat -c '%n %s %.9Y' {files} 2>/dev/null; sha256sum {files} 2>/dev/null; "
        f"stat -c '%n %s %.9Y' {CONTAINER_UNIT}; sha256sum {CONTAINER_UNIT}; "
        "ls /dev/shm; "
        f"cat /sys/class/net/{CLUSTER_IF}/mtu; iptables -S; "
        "systemctl show -p MainPID --value caddy.service"
    )
    return {"node": exec_on(host, "sh", "-c", script).stdout}


def lab_state() -> dict[str, Any]:
    opencode = OPENCODE.stat()
    return {
        **{host: _node_state(host) for host in HOSTS},
        "invocations": unit_invocations(),
        "opencode": (OPENCODE.read_bytes(), opencode.st_mtime_ns),
    }


@pytest.fixture(scope="module")
def healthy_lab() -> dict[str, Any]:
    """The doctor finds the lab healthy before anything is planted (a rollout first if not)."""
    before = Doctor()
    if not before.result["healthy"]:
        proc = rollout()
        assert proc.rc == 0, proc.tail()
        before = Doctor()
    assert before.result["healthy"], f"the lab is not healthy before the test:\n{before.shown()}"
    return lab_state()


class Planted:
    """Plant defects; put every one back, each on its own, however the test ends."""

    def __init__(self) -> None:
        self.restores: list[tuple[str, Callable[[], None]]] = []

    def plant(self, name: str, plant: Callable[[], None], restore: Callable[[], None]) -> None:
        # Registered first: a plant that fails half-way is put back too.
        self.restores.append((name, restore))
        plant()

    def restore_all(self) -> list[str]:
        failed = []
        for name, restore in reversed(self.restores):
            try:
                restore()
            except Exception as exc:  # every restore runs; the failures are listed
                failed.append(f"{name}: {exc}")
        return failed


def _backup(host: str, path: str) -> Callable[[], None]:
    """Copy ``path`` aside (content and times); the returned function puts it back."""
    saved = f"{BACKUP}.{os.path.basename(path)}"
    exec_on(
        host, "test", "!", "-e", saved
    )  # a backup left by an interrupted run is not overwritten
    exec_on(host, "cp", "-p", path, saved)

    def restore() -> None:
        exec_on(host, "sh", "-c", 'cp -p "$1" "$2" && rm -f "$1"', "sh", saved, path)

    return restore


def _edit_json(host: str, path: str, edit: Callable[[dict[str, Any]], None]) -> None:
    document = read_json(host, path)
    edit(document)
    write_text(host, path, json.dumps(document, indent=2))


def _plant_everything(planted: Planted, defective: dict[str, Any]) -> None:
    mtu = exec_on(WORKER, "cat", f"/sys/class/net/{CLUSTER_IF}/mtu").stdout.strip()
    planted.plant(
        "F19 worker MTU",
        lambda: exec_on(WORKER, "ip", "link", "set", "dev", CLUSTER_IF, "mtu", "1500"),
        lambda: exec_on(WORKER, "ip", "link", "set", "dev", CLUSTER_IF, "mtu", mtu),
    )
    planted.plant(
        "F13 orphan",
        lambda: exec_on(WORKER, "fallocate", "-l", "1536M", ORPHAN),
        lambda: exec_on(WORKER, "rm", "-f", ORPHAN),
    )
    unit = exec_on(WORKER, "cat", CONTAINER_UNIT).stdout
    assert "ShmSize=" in unit and "[Container]\n" in unit, unit
    planted.plant(
        "F14/F17 unit file",
        lambda: None,
        _backup(WORKER, CONTAINER_UNIT),
    )
    edited = unit.replace(
        "[Container]\n", "[Container]\nPodmanArgs=--ipc=host\nPodmanArgs=--privileged\n", 1
    )
    write_text(WORKER, CONTAINER_UNIT, edited)
    planted.plant(
        "F11 upstream refused",
        lambda: exec_on(HEAD, "iptables", "-I", *UPSTREAM_BLOCK[:1], "1", *UPSTREAM_BLOCK[1:]),
        lambda: exec_on(HEAD, "iptables", "-D", *UPSTREAM_BLOCK),
    )
    planted.plant("F7 client.json", lambda: None, _backup(HEAD, CLIENT_RESULT))
    _edit_json(HEAD, CLIENT_RESULT, lambda d: d["result"].update(opencode_version="1.18.15"))
    before, times = OPENCODE.read_bytes(), OPENCODE.stat()

    def restore_opencode() -> None:
        OPENCODE.write_bytes(before)
        os.utime(OPENCODE, ns=(times.st_atime_ns, times.st_mtime_ns))

    def plant_opencode() -> None:
        config = json.loads(before)
        model = next(iter(config["provider"]["localinference"]["models"].values()))
        model["limit"]["context"] = 131072
        config["compaction"]["reserved"] = 60000
        OPENCODE.write_text(json.dumps(config, indent=2))

    planted.plant("F8/F9 opencode.json", plant_opencode, restore_opencode)
    for host in HOSTS:
        planted.plant(f"{host} preflight.json", lambda: None, _backup(host, PREFLIGHT_RESULT))
    preflight = run_playbook("preflight.yml", extra_vars=PREFLIGHT_LIMITS, timeout=300)
    assert preflight.rc != 0, preflight.tail()
    planted.plant("plan.json", lambda: None, _backup(HEAD, PLAN_RESULT))
    plan = run_playbook("plan.yml", extra_vars={"vllm_recipe": defective}, timeout=300)
    assert plan.rc != 0 and "The plan blocks vllm_recipe" in plan.flat, plan.tail()


def _defective() -> dict[str, Any]:
    recipe = dict(read_json(HEAD, f"{STATE_DIR}/serving.json")["recipe"])
    for key, value in DEFECTIVE.items():
        if value is None:
            recipe.pop(key, None)
        else:
            recipe[key] = value
    return recipe


@pytest.fixture
def planted(healthy_lab) -> Iterator[dict[str, Any]]:
    defective = _defective()
    planted = Planted()
    try:
        _plant_everything(planted, defective)
        yield {"recipe": defective}
    finally:
        failed = planted.restore_all()
    assert not failed, f"could not put back: {failed}"


def test_the_doctor_names_every_planted_defect_and_the_lab_is_healthy_again(planted, healthy_lab):
    sick = Doctor({"vllm_recipe": planted["recipe"]})
    assert sick.proc.rc != 0, sick.proc.tail()
    assert sick.changed == 0, sick.proc.tail()
    assert sick.proc.seconds < DOCTOR_SECONDS, f"the doctor took {sick.proc.seconds:.0f} s"
    missing = [e for e in EXPECTED if not sick.named(*e)]
    print(sick.shown())
    assert not missing, f"not named: {missing}\n{sick.shown()}"
    # The printed table: the verdict, the header, then per row HOST(S)  ID  SEVERITY ...
    rows = [re.split(r"\s{2,}", row.strip()) for row in sick.table.splitlines()[2:]]
    for fid, host, _, severity in EXPECTED:
        assert any(
            r[1:3] == [fid, severity] and host in r[0].split(", ") for r in rows if len(r) > 2
        ), f"{fid} on {host} is not in the printed table:\n{sick.table}"
    for f in sick.result["findings"]:
        assert "docs/failure-catalog.md#" in f["fix"], f


def test_after_the_restore_the_doctor_is_healthy_and_nothing_changed(healthy_lab):
    well = Doctor()
    assert well.proc.rc == 0 and well.result["healthy"], well.shown()
    assert well.changed == 0, well.proc.tail()
    assert not [f for f in well.result["findings"] if f["severity"] == "error"], well.shown()
    # The serve role's firewall confines the head's torch store: no warning about it (issue 27).
    store = [f for f in well.result["findings"] if f["id"] == "torch-store-wildcard"]
    assert not store, well.shown()
    now = lab_state()
    for key in healthy_lab:
        assert now[key] == healthy_lab[key], f"{key} changed:\n{healthy_lab[key]}\n---\n{now[key]}"
    assert Path(OPENCODE).read_bytes() == healthy_lab["opencode"][0]
    assert exec_on(HEAD, "systemctl", "is-active", VLLM_UNIT).stdout.strip() == "active"
