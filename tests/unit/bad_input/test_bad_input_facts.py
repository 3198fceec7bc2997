# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad input for the node-facts modules, the manifest, the readiness probe and the KV plan.

A table of cases, each run in-process (modules through ``run_module``, module_utils
functions directly) against real files, real fake binaries and real local servers.
Every case must end in a clear refusal whose message names the offending input (or,
for ``model_manifest``, in ``ok=false`` with the file named): an uncaught exception
fails the case as a traceback, an alarm fails it as a hang, and a success fails it
as a silent acceptance.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from ansible.module_utils import basic
from ansible_collections.localinference.vllm.plugins.module_utils.common import _commands
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_log import (
    LogInputError,
    check_log_text,
    decode_log,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._ethtool_facts import (
    EthtoolParseError,
    parse_driver,
    parse_settings,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._rdma_facts import (
    RdmaParseError,
    parse_ibv_devinfo,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._client_budget import (
    ClientInputError,
    check_client_limits,
    plan_client,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._kv_model import (
    KvInputError,
    plan_kv,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._gpu_facts import (
    NvidiaSmiParseError,
    memory_mib,
    parse_query_csv,
    parse_table,
    parse_xml,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    ProcParseError,
    parse_cgroup_limit,
    parse_loadavg,
    parse_meminfo,
    parse_memlock,
    parse_psi,
    parse_status,
)
from ansible_collections.localinference.vllm.plugins.module_utils.weights import (
    _manifest as manifest,
)
from ansible_collections.localinference.vllm.plugins.modules import (
    ethtool_facts,
    gpu_facts,
    host_stack_facts,
    memory_facts,
    model_manifest,
    rdma_facts,
    serving_ready,
    vllm_log_facts,
)
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "unit" / "fixtures"
GB10_SMI = ROOT / "lab" / "standins" / "bin" / "nvidia-smi"
HANG_SECONDS = 30  # a case still running after this is a hang
BINARY = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4
HUGE = "9" * 5000  # int() of it raises ValueError, float() of it gives inf
GB10_TABLE = (FIXTURES / "nvidia-smi" / "gb10-table.txt").read_text()
TWINS = (FIXTURES / "ibv_devinfo" / "dgx-spark-cx7-twins-active.txt").read_text()
VETH = (FIXTURES / "ethtool" / "veth-mtu9000.txt").read_text()
REV = "5eed0c0ffee0000000000000000000000000000a"
GOOD_ENTRY = {"path": "config.json", "size": 9, "mtime_ns": 1, "sha256": "0" * 64}
SERVERS: list[ThreadingHTTPServer] = []


# --- real files, fake binaries, a keep-alive server ----------------------------------


def script(tmp: Path, name: str, body: str) -> str:
    """An executable shell script ``name`` in ``tmp`` (a fake nvidia-smi, ethtool, ...)."""
    path = tmp / "bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def printer(tmp: Path, name: str, text: str | bytes, rc: int = 0) -> str:
    """A fake binary that prints ``text`` (whatever its arguments) and exits ``rc``."""
    data = tmp / f"{name}.out"
    data.write_bytes(text if isinstance(text, bytes) else text.encode())
    return script(tmp, name, f"cat {data}\nexit {rc}")


def wedged(tmp: Path, name: str) -> str:
    return script(tmp, name, "sleep 60")


def smi(tmp: Path, table: str | bytes = GB10_TABLE, csv: str | bytes = "", xml: str = "") -> str:
    """A fake nvidia-smi: the table without arguments, ``csv`` for --query-gpu, ``xml`` for -q."""
    for name, text in (("table", table), ("csv", csv), ("xml", xml)):
        (tmp / f"smi-{name}.out").write_bytes(text if isinstance(text, bytes) else text.encode())
    cases = (
        f'"") cat {tmp}/smi-table.out ;; -q) cat {tmp}/smi-xml.out ;; *) cat {tmp}/smi-csv.out ;;'
    )
    return script(tmp, "nvidia-smi", f'case "$1" in {cases} esac')


PROC_FILES = {
    "meminfo": ("meminfo", "meminfo-controller.txt"),
    "loadavg": ("loadavg", "loadavg.txt"),
    "psi": ("pressure/memory", "pressure-memory-idle.txt"),
    "limits": ("self/limits", "limits-memlock-8m.txt"),
    "status": ("4242/status", "status-pid1.txt"),
}
STATUS = (FIXTURES / "proc" / "status-pid1.txt").read_text()


def mem(tmp: Path, cgroup: dict[str, str] | None = None, **files: str | bytes) -> dict:
    """memory_facts options over a recorded /proc (any file replaced) and a fake cgroup."""
    for key, (rel, fixture) in PROC_FILES.items():
        path = tmp / "proc" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = files.get(key, (FIXTURES / "proc" / fixture).read_text())
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    for rel, text in (cgroup or {}).items():
        path = tmp / "sys" / "fs" / "cgroup" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp / "sys").mkdir(exist_ok=True)
    (tmp / "shm").mkdir(exist_ok=True)
    return {
        "proc_root": str(tmp / "proc"),
        "sys_root": str(tmp / "sys"),
        "shm_path": str(tmp / "shm"),
    }


def eth(tmp: Path, interfaces: list[str], ethtool: str | None = None, **extra: Any) -> dict:
    """ethtool_facts options over a sysfs with veth0 and an ethtool printing a recorded veth."""
    (tmp / "sys" / "class" / "net" / "veth0").mkdir(parents=True)
    ethtool = ethtool or printer(tmp, "ethtool", VETH)
    return {"interfaces": interfaces, "sys_root": str(tmp / "sys"), "ethtool": ethtool, **extra}


def snapshot(tmp: Path) -> Path:
    snap = tmp / "hub" / "models--org--name" / "snapshots" / REV
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"a": 1}\n')
    return snap


def manifest_doc(files: list[dict]) -> dict:
    return {"format": manifest.MANIFEST_FORMAT, "files": files}


class KeepAlive(BaseHTTPRequestHandler):
    """Accepts the probe, keeps the stream alive with SSE comments, never generates."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        with contextlib.suppress(OSError):
            while True:
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                time.sleep(0.2)


def keep_alive_url(tmp: Path) -> str:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    SERVERS.append(httpd)
    return f"http://127.0.0.1:{httpd.server_address[1]}"


# --- the module case table -----------------------------------------------------------


@dataclass
class Case:
    """A module run with ``args(tmp)`` that must fail (or not be ok) with ``pattern``."""

    module: Any
    id: str
    args: Callable[[Path], dict]
    pattern: str
    outcome: str = "failed"  # or "not_ok": exits, but ok=false with msg (model_manifest)
    patches: Callable[[Path], list] = field(default=lambda tmp: [])


def journal_says(text: str) -> Callable[[Path], list]:
    return lambda tmp: [
        mock.patch.object(basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: name),
        mock.patch.object(_commands, "run_bounded", lambda *a, **kw: (0, text, "")),
    ]


def bin_dir(name: str, body: str) -> Callable[[Path], list]:
    """get_bin_path answers with a fake script ``name`` for every command."""

    def patches(tmp: Path) -> list:
        path = script(tmp, name, body)
        return [mock.patch.object(basic.AnsibleModule, "get_bin_path", lambda self, n, **kw: path)]

    return patches


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _link(snap: Path, name: str, target: str) -> Path:
    (snap / name).symlink_to(target)
    return snap


def _verify(t: Path, *files: dict, link: tuple[str, str] | None = None) -> dict:
    snap = snapshot(t) if link is None else _link(snapshot(t), *link)
    return {"path": str(snap), "mode": "verify", "manifest_content": manifest_doc(list(files))}


DANGLING = ("model-00002.safetensors", "../../blobs/" + "0" * 64)
NOT_OK = "not_ok"
# fmt: off
MODULE_CASES = [
    # gpu_facts: bounded nvidia-smi, garbage output, garbage /proc/meminfo
    Case(gpu_facts, "gpu-timeout-zero", lambda t: {"timeout": 0}, r"^timeout must be a positive"),
    Case(gpu_facts, "gpu-timeout-nan", lambda t: {"timeout": float("nan")}, r"^timeout must be"),
    Case(gpu_facts, "gpu-timeout-huge", lambda t: {"timeout": 1e9}, r"^timeout must be at most"),
    Case(gpu_facts, "gpu-wedged-nvidia-smi", lambda t: {"nvidia_smi": wedged(t, "nvidia-smi"), "timeout": 0.5},
         r"^nvidia-smi did not answer within 0\.5 s .*GPU driver may be wedged"),
    Case(gpu_facts, "gpu-garbage-table", lambda t: {"nvidia_smi": smi(t, table="hello\n")},
         r"output of .*nvidia-smi \(nvidia_smi\): no 'Driver Version:'"),
    Case(gpu_facts, "gpu-binary-table", lambda t: {"nvidia_smi": smi(t, table=BINARY)}, r"no 'Driver Version:'"),
    Case(gpu_facts, "gpu-absurd-memory",
         lambda t: {"nvidia_smi": smi(t, csv=f"0, H200, GPU-1, {HUGE} MiB, 1 MiB, 1 MiB, 0:1, 5\n")},
         r"unexpected memory value '9999"),
    Case(gpu_facts, "gpu-garbage-index",
         lambda t: {"nvidia_smi": smi(t, csv="abc, H200, GPU-1, 1 MiB, 1 MiB, 1 MiB, 0:1, 5\n")},
         r"GPU index: 'abc' is not a number; not the nvidia-smi output asked for"),
    Case(gpu_facts, "gpu-short-csv-row", lambda t: {"nvidia_smi": smi(t, csv="0, H200\n")},
         r"row 1 has 2 values for 8 columns"),
    Case(gpu_facts, "gpu-xml-not-xml", lambda t: {"nvidia_smi": smi(t, xml="<nvidia_smi_log"), "source": "xml"},
         r"nvidia-smi -q -x output is not XML"),
    Case(gpu_facts, "gpu-unified-binary-meminfo",
         lambda t: {"nvidia_smi": str(GB10_SMI), "meminfo_path": str(_write(t / "meminfo", BINARY))},
         r"/meminfo is unreadable: no MemTotal line"),
    Case(gpu_facts, "gpu-unified-absurd-meminfo",
         lambda t: {"nvidia_smi": str(GB10_SMI), "meminfo_path": str(_write(t / "mi", f"MemTotal: {HUGE} kB".encode()))},
         r"meminfo MemTotal: 9999.* has 5000 digits"),
    Case(gpu_facts, "gpu-failing-required",
         lambda t: {"nvidia_smi": printer(t, "nvidia-smi", "NVML: driver mismatch", rc=9), "required": True},
         r"failed with rc=9: NVML: driver mismatch; gpu_facts was called with required=true"),
    # rdma_facts: device names never become paths unchecked, bounded ibv_devinfo
    Case(rdma_facts, "rdma-device-traversal", lambda t: {"devices": ["../../etc"]}, r"^devices\[0\]: contains '/'"),
    Case(rdma_facts, "rdma-device-dotdot", lambda t: {"devices": [".."]}, r"^devices\[0\]: '\.\.' is not an RDMA"),
    Case(rdma_facts, "rdma-device-long", lambda t: {"devices": ["m" * 64]}, r"^devices\[0\]: .*longer than 63"),
    Case(rdma_facts, "rdma-device-newline", lambda t: {"devices": ["mlx5_0\n"]}, r"^devices\[0\]: contains '\\n'"),
    Case(rdma_facts, "rdma-device-empty", lambda t: {"devices": [""]}, r"^devices\[0\]: is empty"),
    Case(rdma_facts, "rdma-timeout-negative", lambda t: {"timeout": -1}, r"^timeout must be a positive"),
    Case(rdma_facts, "rdma-wedged-ibv_devinfo", lambda t: {"ibv_devinfo": wedged(t, "ibv_devinfo"), "timeout": 0.5},
         r"^ibv_devinfo did not answer within 0\.5 s .*RDMA driver"),
    Case(rdma_facts, "rdma-garbage-output", lambda t: {"ibv_devinfo": printer(t, "ibv_devinfo", BINARY), "sys_root": str(t)},
         r"Could not parse '.*ibv_devinfo -v' output: no 'hca_id:'"),
    Case(rdma_facts, "rdma-device-name-from-output",
         lambda t: {"ibv_devinfo": printer(t, "ibv_devinfo", "hca_id:\t../../evil\n"), "sys_root": str(t)},
         r"reported device name\(s\) that cannot be RDMA devices: '\.\./\.\./evil'"),
    Case(rdma_facts, "rdma-unknown-device",
         lambda t: {"ibv_devinfo": printer(t, "ibv_devinfo", TWINS), "devices": ["mlx5_9"], "sys_root": str(t)},
         r"^devices: no RDMA device mlx5_9 \(present: "),
    Case(rdma_facts, "rdma-none-required",
         lambda t: {"ibv_devinfo": printer(t, "ibv_devinfo", "No IB devices found\n"), "required": True},
         r"found no device .*No IB devices found; rdma_facts was called with required=true"),
    # ethtool_facts: interface names never become paths unchecked, bounded ethtool
    Case(ethtool_facts, "eth-traversal", lambda t: eth(t, ["../../etc"]), r"^interfaces\[0\]: contains '/'"),
    Case(ethtool_facts, "eth-dotdot", lambda t: eth(t, ["veth0", ".."]), r"^interfaces\[1\]: '\.\.' is not an interface"),
    Case(ethtool_facts, "eth-too-long", lambda t: eth(t, ["e" * 16]), r"^interfaces\[0\]: 'eeee.*longer than 15 bytes"),
    Case(ethtool_facts, "eth-space", lambda t: eth(t, ["eth 0"]), r"^interfaces\[0\]: contains ' '"),
    Case(ethtool_facts, "eth-alias-colon", lambda t: eth(t, ["eth0:1"]), r"^interfaces\[0\]: contains ':'"),
    Case(ethtool_facts, "eth-nul", lambda t: eth(t, ["eth\x000"]), r"^interfaces\[0\]: contains '\\x00' \(a NUL byte\)"),
    Case(ethtool_facts, "eth-empty-list", lambda t: eth(t, []), r"^interfaces: give at least one"),
    Case(ethtool_facts, "eth-missing", lambda t: eth(t, ["eth9"]), r"no such interface eth9 on this host \(present: veth0\)"),
    Case(ethtool_facts, "eth-timeout-inf", lambda t: eth(t, ["veth0"], timeout=float("inf")), r"^timeout must be a positive, finite"),
    Case(ethtool_facts, "eth-wedged-ethtool", lambda t: eth(t, ["veth0"], wedged(t, "ethtool"), timeout=0.5),
         r"^ethtool did not answer within 0\.5 s \(ran: .*ethtool veth0\)"),
    Case(ethtool_facts, "eth-garbage-output", lambda t: eth(t, ["veth0"], printer(t, "ethtool", BINARY)),
         r"Could not parse ethtool output for veth0: .*not ethtool output"),
    # memory_facts: garbage /proc and cgroup text names the file and the value
    Case(memory_facts, "mem-no-proc", lambda t: {"proc_root": str(t / "nowhere")}, r"Cannot read .*/nowhere/meminfo"),
    Case(memory_facts, "mem-binary-meminfo", lambda t: mem(t, meminfo=BINARY), r"in .*/proc/meminfo: no MemTotal"),
    Case(memory_facts, "mem-absurd-meminfo", lambda t: mem(t, meminfo=f"MemTotal: {HUGE} kB\n"),
         r"proc/meminfo: meminfo MemTotal: .*5000 digits"),
    Case(memory_facts, "mem-loadavg-shape", lambda t: mem(t, loadavg="a b c d\n"),
         r"proc/loadavg: unexpected /proc/loadavg content 'a b c d"),
    Case(memory_facts, "mem-loadavg-garbage", lambda t: mem(t, loadavg="x 0.1 0.1 1/2 3\n"),
         r"proc/loadavg: loadavg 1m: expected a number, got 'x'; not the file the kernel writes"),
    Case(memory_facts, "mem-loadavg-inf", lambda t: mem(t, loadavg="inf 0.1 0.1 1/2 3\n"), r"loadavg 1m: 'inf' is not a finite"),
    Case(memory_facts, "mem-psi-garbage", lambda t: mem(t, psi="some avg10=abc avg60=0 avg300=0 total=0\n"),
         r"pressure/memory: PSI some avg10: expected a number, got 'abc'"),
    Case(memory_facts, "mem-psi-huge-total", lambda t: mem(t, psi=f"some avg10=0 total={HUGE}\n"), r"PSI some total: 9999.*5000 digits"),
    Case(memory_facts, "mem-limits-garbage", lambda t: mem(t, limits="Max locked memory  zzz  zzz  bytes\n"),
         r"self/limits: Max locked memory soft limit: 'zzz'"),
    # issue 39: a /proc/<pid>/status the kernel did not write was skipped in silence
    Case(memory_facts, "mem-status-binary", lambda t: mem(t, status=BINARY),
         r"^Unexpected content in .*/proc/4242/status: a NUL byte \(binary content\): not a status file; "
         r"is proc_root=.*/proc a real procfs mount\?$"),
    Case(memory_facts, "mem-status-no-vmrss", lambda t: mem(t, status=STATUS.replace("VmRSS:\t   12272 kB\n", "")),
         r"proc/4242/status: Vm\* lines without a VmRSS line"),
    Case(memory_facts, "mem-status-rss-words", lambda t: mem(t, status=STATUS.replace("12272 kB", "lots kB")),
         r"proc/4242/status: status VmRSS: 'lots' is not a number"),
    Case(memory_facts, "mem-status-uid-words", lambda t: mem(t, status=STATUS.replace("Uid:\t0", "Uid:\troot")),
         r"proc/4242/status: status Uid: 'root' is not a number"),
    Case(memory_facts, "mem-status-text", lambda t: mem(t, status="hello\n"), r"proc/4242/status: no Uid line"),
    Case(memory_facts, "mem-min-uid", lambda t: {**mem(t), "min_uid": -1}, r"^min_uid must be 0 or more, got -1"),
    Case(memory_facts, "mem-top-processes", lambda t: {**mem(t), "top_processes": -5}, r"^top_processes must be 0 or more"),
    Case(memory_facts, "mem-cgroup-usage-garbage", lambda t: mem(t, {"memory.max": "max\n", "memory.current": "junk\n"}),
         r"fs/cgroup: cgroup memory usage: 'junk' is not a number"),
    Case(memory_facts, "mem-cgroup-limit-absurd", lambda t: mem(t, {"memory.max": HUGE, "memory.current": "1\n"}),
         r"cgroup memory limit: 9999.*5000 digits"),
    # vllm_log_facts: empty and binary logs are reported, unit names checked, journalctl bounded
    Case(vllm_log_facts, "log-empty-content", lambda t: {"content": ""}, r"^the log is empty: content has no lines"),
    Case(vllm_log_facts, "log-blank-content", lambda t: {"content": "\n \n\t"}, r"^the log is empty: content"),
    Case(vllm_log_facts, "log-nul-content", lambda t: {"content": "INFO x\x00y"}, r"^content is not text"),
    Case(vllm_log_facts, "log-empty-file", lambda t: {"path": str(_write(t / "empty.log", b""))},
         r"^the log is empty: path .*/empty\.log has no lines"),
    Case(vllm_log_facts, "log-binary-file", lambda t: {"path": str(_write(t / "vllm.log", BINARY))},
         r"^path .*/vllm\.log is not text: NUL byte at offset 7"),
    Case(vllm_log_facts, "log-not-utf8", lambda t: {"path": str(_write(t / "latin1.log", bytes(range(128, 256)) * 40))},
         r"^path .*/latin1\.log is not text: 5120 of 5120 bytes are not UTF-8"),
    Case(vllm_log_facts, "log-missing-file", lambda t: {"path": str(t / "no.log")}, r"^path .*/no\.log cannot be read"),
    Case(vllm_log_facts, "log-misspelled-unit", lambda t: {"unit": "localinference-vlm.service"},
         r"^the log is empty: unit localinference-vlm\.service \(journalctl -u; check the unit name",
         patches=journal_says("-- No entries --\n")),
    Case(vllm_log_facts, "log-unit-as-option", lambda t: {"unit": "--follow"}, r"^unit: '--follow' is not a systemd unit name"),
    Case(vllm_log_facts, "log-unit-no-suffix", lambda t: {"unit": "vllm"}, r"^unit: 'vllm' has no unit type suffix"),
    Case(vllm_log_facts, "log-container-as-option", lambda t: {"unit": "-f", "source": "podman"}, r"^unit: '-f' is not a container name"),
    Case(vllm_log_facts, "log-lines-zero", lambda t: {"content": "x", "lines": 0}, r"^lines must be between 1 and"),
    Case(vllm_log_facts, "log-kv-inf", lambda t: {"content": "x", "kv_memory_gib": float("inf")},
         r"^kv_memory_gib must be positive and finite, got inf"),
    Case(vllm_log_facts, "log-kv-nan", lambda t: {"content": "x", "kv_memory_gib": float("nan")},
         r"^kv_memory_gib must be positive and finite, got nan"),
    Case(vllm_log_facts, "log-timeout-zero", lambda t: {"content": "x", "timeout": 0}, r"^timeout must be a positive"),
    Case(vllm_log_facts, "log-since-newline", lambda t: {"unit": "a.service", "since": "today\n--x"},
         r"^since must be a non-empty printable string, got 'today\\n--x' \(contains '\\n'\)"),
    Case(vllm_log_facts, "log-host-blank", lambda t: {"content": "x", "host": " "}, r"^host must be a non-empty printable string"),
    Case(vllm_log_facts, "log-wedged-journalctl", lambda t: {"unit": "a.service", "timeout": 0.5},
         r"^journalctl did not answer within 0\.5 s \(ran: .*/journalctl -u a\.service",
         patches=bin_dir("journalctl", "sleep 60")),
    # model_manifest: incomplete snapshots fail closed, manifests are schema-checked
    Case(model_manifest, "manifest-dangling-shard", lambda t: {"path": str(_link(snapshot(t), *DANGLING)), "mode": "create"},
         r"1 file\(s\) do not match: model-00002\.safetensors \(dangling symlink to ", NOT_OK),
    Case(model_manifest, "manifest-self-link", lambda t: {"path": str(_link(snapshot(t), "self.bin", "self.bin")), "mode": "create"},
         r"1 file\(s\) do not match: self\.bin \(symlink loop", NOT_OK),
    Case(model_manifest, "manifest-dir-loop", lambda t: {"path": str(_link(snapshot(t), "loop", ".")), "mode": "create"},
         r"1 file\(s\) do not match: loop \(symlink loop: leads back to the snapshot root", NOT_OK),
    Case(model_manifest, "manifest-verify-dangling", lambda t: _verify(t, GOOD_ENTRY, link=DANGLING),
         r"model-00002\.safetensors \(dangling symlink .*not in the manifest: delete it\)", NOT_OK),
    Case(model_manifest, "manifest-negative-size", lambda t: _verify(t, dict(GOOD_ENTRY, size=-1)),
         r"manifest_content has a malformed file entry files\[0\]"),
    Case(model_manifest, "manifest-traversal", lambda t: _verify(t, dict(GOOD_ENTRY, path="../../etc/shadow")),
         r"manifest_content has an unsafe path in files\[0\]: '\.\./\.\./etc/shadow'"),
    Case(model_manifest, "manifest-nul-path", lambda t: _verify(t, dict(GOOD_ENTRY, path="a\x00b")),
         r"unsafe path in files\[0\]: 'a\\x00b'"),
    Case(model_manifest, "manifest-duplicate", lambda t: _verify(t, GOOD_ENTRY, GOOD_ENTRY),
         r"manifest_content lists 'config\.json' twice \(files\[1\]\)"),
    Case(model_manifest, "manifest-wrong-format", lambda t: dict(_verify(t), manifest_content={"files": []}),
         r"manifest_content is not a localinference\.vllm/weights-manifest-v1 document"),
    Case(model_manifest, "manifest-deep-json-file",
         lambda t: {"path": str(snapshot(t)), "mode": "verify", "manifest": str(_write(t / "m.json", b"[" * 100_000))},
         r"manifest .*/m\.json cannot be read"),
    Case(model_manifest, "manifest-workers-negative", lambda t: {"path": str(t), "mode": "verify", "workers": -1},
         r"^workers must be 0 \(one per CPU\) to 256, got -1"),
    Case(model_manifest, "manifest-workers-huge", lambda t: {"path": str(t), "mode": "verify", "workers": 10**6},
         r"^workers must be .* got 1000000"),
    Case(model_manifest, "manifest-path-nul", lambda t: {"path": "/srv/a\x00b", "mode": "verify"}, r"^path: contains '\\x00' \(a NUL byte\)"),
    Case(model_manifest, "manifest-paths-newline", lambda t: {"path": str(t), "mode": "verify", "paths": ["a\nb"]},
         r"^paths\[0\]: contains '\\n'"),
    # serving_ready: a total deadline, checked units and URL
    Case(serving_ready, "ready-timeout-zero", lambda t: {"model": "m", "timeout": 0}, r"^timeout must be between 1 and 86400"),
    Case(serving_ready, "ready-url-scheme", lambda t: {"model": "m", "url": "file:///etc/passwd"},
         r"^url must be http\(s\)://.*'file:///etc/passwd'"),
    Case(serving_ready, "ready-url-space", lambda t: {"model": "m", "url": "http://a b:8000"}, r"^url must be http\(s\)://"),
    Case(serving_ready, "ready-unit-option", lambda t: {"model": "m", "units": ["--now"]}, r"^units\[0\]: '--now' is not a systemd unit name"),
    Case(serving_ready, "ready-unit-suffix", lambda t: {"model": "m", "units": ["vllm"]}, r"^units\[0\]: 'vllm' has no unit type suffix"),
    Case(serving_ready, "ready-unit-not-found",
         lambda t: {"model": "m", "url": keep_alive_url(t), "units": ["localinference-vlm.service"], "timeout": 10},
         r"^localinference-vlm\.service: unit cannot be watched \(LoadState=not-found\)",
         patches=bin_dir("systemctl", "printf 'ActiveState=inactive\\nLoadState=not-found\\n'")),
    Case(serving_ready, "ready-keep-alive-forever", lambda t: {"model": "m", "url": keep_alive_url(t), "timeout": 2},
         r"no generated token from http://127\.0\.0\.1:\d+/v1/chat/completions within 2 s .*keep-alive comment"),
    Case(serving_ready, "ready-nothing-listening", lambda t: {"model": "m", "url": "http://127.0.0.1:9", "timeout": 1},
         r"^http://127\.0\.0\.1:9/health did not answer 200 within 1 s"),
    Case(serving_ready, "ready-unit-unreadable",
         lambda t: {"model": "m", "url": keep_alive_url(t), "units": ["localinference-vllm.service"], "timeout": 10},
         r"^units: cannot watch localinference-vllm\.service: systemctl show failed \(rc 1",
         patches=bin_dir("systemctl", "echo 'System has not been booted with systemd' >&2; exit 1")),
    # a path option that must be a directory, given a regular file (read as an empty tree before)
    Case(memory_facts, "mem-shm-path-file", lambda t: {**mem(t), "shm_path": str(_write(t / "shm-file", b"x"))},
         r"^shm_path: .*/shm-file is not a directory; give an existing directory"),
    Case(memory_facts, "mem-shm-path-missing", lambda t: {**mem(t), "shm_path": str(t / "no-shm")},
         r"^shm_path: .*/no-shm does not exist"),
    Case(memory_facts, "mem-sys-root-file", lambda t: {**mem(t), "sys_root": str(_write(t / "sys-file", b""))},
         r"^sys_root: .*/sys-file is not a directory"),
    Case(memory_facts, "mem-proc-root-file", lambda t: {**mem(t), "proc_root": str(_write(t / "proc-file", b""))},
         r"^proc_root: .*/proc-file is not a directory"),
    Case(ethtool_facts, "eth-sys-root-file", lambda t: {**eth(t, ["veth0"]), "sys_root": str(_write(t / "f", b""))},
         r"^sys_root: .*/f is not a directory"),
    Case(rdma_facts, "rdma-sys-root-file",
         lambda t: {"ibv_devinfo": printer(t, "ibv_devinfo", TWINS), "sys_root": str(_write(t / "f", b""))},
         r"^sys_root: .*/f is not a directory"),
    Case(host_stack_facts, "stack-sys-root-file", lambda t: {"sys_root": str(_write(t / "f", b""))},
         r"^sys_root: .*/f is not a directory"),
    # a weights tree with a name that is not UTF-8: refused before the manifest is written
    Case(model_manifest, "manifest-name-not-utf8",
         lambda t: {"path": str(_link(snapshot(t), "shard\udcff.bin", "config.json")), "mode": "create"},
         r"holds a file name that is not UTF-8 \(b'shard\\xff\.bin'\)"),
]
# fmt: on


@pytest.fixture(autouse=True)
def no_hang():
    """Fail a case that runs longer than HANG_SECONDS instead of hanging the suite."""

    def alarm(signum, frame):
        raise TimeoutError(f"hang: the case ran longer than {HANG_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
    while SERVERS:
        SERVERS.pop().shutdown()


@pytest.mark.parametrize("case", MODULE_CASES, ids=[c.id for c in MODULE_CASES])
def test_module_refuses_bad_input(case: Case, tmp_path: Path):
    args = case.args(tmp_path)
    with contextlib.ExitStack() as stack:
        for patch in case.patches(tmp_path):
            stack.enter_context(patch)
        try:
            out = run_module(case.module, args)
        except TimeoutError:
            raise
        except Exception as exc:  # the point is to catch every traceback
            pytest.fail(f"traceback instead of a message: {type(exc).__name__}: {exc}")
    if case.outcome == NOT_OK:
        assert not out.failed and out.result["ok"] is False, f"silent success: {out.result}"
    else:
        assert out.failed, f"silent success: {out.result}"
    assert re.search(case.pattern, out.result["msg"]), out.result["msg"]


# --- module_utils functions ----------------------------------------------------------

RECIPE_A = {"recipe_hash": "a" * 64, "recorded_at": "t1", "max_model_len": 4096,
            "kv_tokens": 100_000, "kv_memory_gib": 10.0}  # fmt: skip
RECIPE_B = {"recipe_hash": "b" * 64, "recorded_at": "t2", "max_model_len": 8192,
            "kv_tokens": 50_000, "kv_memory_gib": 10.0}  # fmt: skip
HUGE_INDEX_TABLE = GB10_TABLE.replace("|   0  NVIDIA GB10", f"|   {'9' * 30}  NVIDIA GB10")

# fmt: off
FUNCTION_CASES = [
    # parsers: garbage is a parse error naming what was read, never a bare exception
    ("meminfo-binary", lambda: parse_meminfo(BINARY.decode("latin-1")), ProcParseError, r"no MemTotal line"),
    ("meminfo-huge", lambda: parse_meminfo(f"MemTotal: {HUGE} kB"), ProcParseError, r"meminfo MemTotal: 9999"),
    ("psi-inf", lambda: parse_psi("some avg10=1e999"), ProcParseError, r"PSI some avg10: '1e999' is not a finite"),
    ("loadavg-empty", lambda: parse_loadavg(""), ProcParseError, r"unexpected /proc/loadavg content ''"),
    ("memlock-huge", lambda: parse_memlock(f"Max locked memory {HUGE} 1 bytes"), ProcParseError, r"soft limit: 9999"),
    ("status-garbage-uid", lambda: parse_status("Uid:\tabc\n"), ProcParseError, r"status Uid: 'abc'"),
    ("status-empty-uid", lambda: parse_status("Uid:\n"), ProcParseError, r"status Uid: ''"),
    ("status-unicode-digits", lambda: parse_status("Uid:\t\u0663\nVmRSS:\t1 kB\n"), ProcParseError, r"status Uid"),
    ("cgroup-garbage", lambda: parse_cgroup_limit("12ab"), ProcParseError, r"cgroup memory limit: '12ab'"),
    ("smi-memory-huge", lambda: memory_mib(HUGE), NvidiaSmiParseError, r"unexpected memory value"),
    ("smi-table-huge-index", lambda: parse_table(HUGE_INDEX_TABLE), NvidiaSmiParseError, r"GPU index: 9+\.\.\. has \d+ digits"),
    ("smi-csv-unicode-index", lambda: parse_query_csv("\u0663, a, b, 1, 1, 1, x, y"), NvidiaSmiParseError,
     r"GPU index: '\u0663' is not a number"),
    ("smi-xml-wrong-root", lambda: parse_xml("<html/>"), NvidiaSmiParseError, r"unexpected XML root 'html'"),
    ("ibv-empty", lambda: parse_ibv_devinfo(""), RdmaParseError, r"no 'hca_id:'"),
    ("ethtool-binary", lambda: parse_settings(BINARY.decode("latin-1")), EthtoolParseError, r"not ethtool output"),
    ("ethtool-i-garbage", lambda: parse_driver("hello"), EthtoolParseError, r"no 'driver:' line"),
    ("log-binary", lambda: decode_log(BINARY, "path x"), LogInputError, r"path x is not text"),
    ("log-journal-empty", lambda: check_log_text("-- No entries --", "unit u"), LogInputError,
     r"the log is empty: unit u"),
    # the KV plan and the client budget
    ("kv-max-len-below-granule", lambda: plan_kv([RECIPE_A], model_max_len=512), KvInputError,
     r"model_max_len 512 is below granularity 1024"),
    ("kv-inf-memory", lambda: plan_kv([RECIPE_A], available_kv_gib=float("inf")), KvInputError,
     r"available_kv_gib: inf is not a finite number; set a finite number"),
    ("kv-nan-concurrency", lambda: plan_kv([RECIPE_A], min_concurrency=float("nan")), KvInputError,
     r"min_concurrency: nan is not a finite number; set a finite number"),
    ("kv-inf-observation", lambda: plan_kv([dict(RECIPE_A, kv_memory_gib=float("inf"))]), KvInputError,
     r"observations\[0\]\.kv_memory_gib: inf is not a finite number"),
    ("kv-huge-tokens", lambda: plan_kv([dict(RECIPE_A, kv_tokens=10**400)]), KvInputError,
     r"observations\[0\]\.kv_tokens: 10+\.\.\. is 2\*\*53 or more, too large for a count"),
    ("kv-nan-from-json", lambda: plan_kv(json.loads('[{"max_model_len": 4096, "kv_tokens": NaN}]')), KvInputError,
     r"observations\[0\]\.kv_tokens: nan is not a finite number"),
    ("kv-fraction-length", lambda: plan_kv([dict(RECIPE_A, max_model_len=4096.5)]), KvInputError,
     r"observations\[0\]\.max_model_len: 4096\.5 is not a whole number; set a whole number"),
    ("kv-bad-recipe-hash", lambda: plan_kv([dict(RECIPE_A, recipe_hash=["x"])]), KvInputError,
     r"observations\[0\]\.recipe_hash must be"),
    ("client-limits-text", lambda: check_client_limits({"context": "32k", "output": 1}, 4096, None), ClientInputError,
     r"client_limits\.context: expected a number, got '32k'; set a whole number of tokens"),
    ("client-limits-nan", lambda: check_client_limits({"context": 1, "output": float("nan")}, 4096, None),
     ClientInputError, r"client_limits\.output: nan is not a finite number; set a whole number of tokens"),
    ("safetensors-header-bomb",
     lambda: manifest.safetensors_header_check(struct.pack("<Q", 200_000), b"[" * 200_000, 200_008), ValueError,
     r"safetensors header is not valid JSON"),
]
# fmt: on


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [case[1:] for case in FUNCTION_CASES],
    ids=[case[0] for case in FUNCTION_CASES],
)
def test_function_refuses_bad_input(call, error, pattern):
    with pytest.raises(error) as caught:
        call()
    assert re.search(pattern, str(caught.value)), str(caught.value)


@pytest.mark.parametrize("floor", [None, 20000])
def test_output_at_the_context_is_never_a_feasible_negative_input(floor):
    client = plan_client(16384, floor, output_tokens=16384)
    assert client["ok"] is False and client["input"] == 0
    assert "output_tokens 16384 must be below the context 16384" in client["reason"]


@pytest.mark.parametrize("hashed", [True, False])
def test_two_recipes_never_plan_above_the_worst_boot(hashed):
    observations = [RECIPE_A, RECIPE_B]
    if not hashed:
        observations = [{k: v for k, v in o.items() if k != "recipe_hash"} for o in observations]
    plan = plan_kv(observations, granularity=1024)
    assert plan["max_model_len"] <= 50_000 and plan["kv_tokens"]["worst"] <= 50_000


def test_the_suite_is_large_enough():
    assert len(MODULE_CASES) + len(FUNCTION_CASES) >= 60
