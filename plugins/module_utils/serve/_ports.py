# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who listens on a TCP port: /proc/net/tcp{,6} joined with /proc/PID/fd, judged pure.

A port the recipe needs (vLLM's API, the torch store, Ray's GCS) that something
else already holds makes the new engine die at bind time after the old one was
stopped. Staging reads the listeners first and refuses a port held by anything
that is not one of the collection's own serving units (their processes carry
the unit's name in their cgroup path, Quadlet payloads included).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._files import read_bytes

TCP_LISTEN = "0A"
_SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")


@dataclass(frozen=True)
class Listener:
    port: int
    address: str
    inode: int
    pid: int | None = None
    command: str = ""
    cgroup: str = ""

    def as_dict(self) -> dict:
        return {
            "port": self.port,
            "address": self.address,
            "pid": self.pid,
            "command": self.command,
            "cgroup": self.cgroup,
        }


def _address(hex_addr: str) -> str:
    """Kernel hex address (little-endian words) to text; unknown forms are kept as read."""
    try:
        raw = bytes.fromhex(hex_addr)
    except ValueError:
        return hex_addr
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw))
    if len(raw) == 16:
        words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
        flat = b"".join(words)
        return ":".join(flat[i:i + 2].hex() for i in range(0, 16, 2))
    return hex_addr


def parse_proc_net_tcp(text: str) -> list[tuple[int, str, int]]:
    """LISTEN sockets of one /proc/net/tcp or tcp6 text: (port, address, inode). Bad lines are skipped."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        local = fields[1]
        addr, _, port_hex = local.rpartition(":")
        try:
            port, inode = int(port_hex, 16), int(fields[9])
        except ValueError:
            continue
        if 0 < port < 65536:
            found.append((port, _address(addr), inode))
    return found


def _read(path: Path, limit: int = 1 << 20) -> str:
    return read_bytes(str(path), limit).decode("utf-8", "replace")


def socket_owners(proc: Path, inodes: set[int]) -> dict[int, int]:
    """inode -> pid for the sockets in ``inodes`` (processes that vanish meanwhile are skipped)."""
    owners: dict[int, int] = {}
    if not inodes:
        return owners
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(Path(entry.path) / "fd")
            with fds:
                for fd in fds:
                    try:
                        match = _SOCKET_LINK.match(os.readlink(fd.path))
                    except OSError:
                        continue
                    if match and int(match.group(1)) in inodes:
                        owners.setdefault(int(match.group(1)), int(entry.name))
        except OSError:
            continue
    return owners


def listeners(ports: list[int], proc: Path = Path("/proc")) -> list[Listener]:
    """Every listening TCP socket on one of ``ports``, with its process when /proc shows it."""
    wanted = set(ports)
    sockets = []
    for name in ("tcp", "tcp6"):
        path = proc / "net" / name
        if path.exists():
            sockets += [s for s in parse_proc_net_tcp(_read(path)) if s[0] in wanted]
    owners = socket_owners(proc, {inode for _, _, inode in sockets})
    found = []
    for port, address, inode in sockets:
        pid = owners.get(inode)
        command = cgroup = ""
        if pid is not None:
            try:
                command = _read(proc / str(pid) / "cmdline", 4096).replace("\0", " ").strip()
                cgroup = _read(proc / str(pid) / "cgroup", 65536).strip()
            except OSError:
                pass
        found.append(Listener(port, address, inode, pid, command, cgroup))
    return found


def foreign(found: list[Listener], units: list[str]) -> list[Listener]:
    """Listeners that belong to none of ``units`` (judged from the process's cgroup path).

    A socket whose process is not visible (another PID namespace) is foreign: the
    evidence that it is ours is missing, and a start would fail on it anyway.
    """
    ours = set(units)

    def owned(item: Listener) -> bool:
        paths = (line.split(":", 2)[-1] for line in item.cgroup.splitlines())
        return any(ours.intersection(path.split("/")) for path in paths)

    return [item for item in found if not owned(item)]


def describe(item: Listener) -> str:
    who = f"pid {item.pid} ({item.command[:120] or '?'})" if item.pid is not None else "a process this node cannot see"
    return f"port {item.port} on {item.address} is held by {who}"


def refusal(strangers: list[Listener]) -> str:
    """Why staging refuses ports held by other processes, and the fix."""
    lines = "; ".join(describe(item) for item in strangers)
    return (
        f"{lines}. The new engine would die at bind time after the old one was stopped, so nothing"
        " was changed. Stop that process (or move it to another port), or set another port in"
        " vllm_recipe, and run the rollout again."
    )


def run(module: Any) -> dict[str, Any]:
    """The ``port_listeners`` module: the listeners on ``ports``; a foreign one fails it (``fail_on_foreign``).

    ``module`` is the caller's AnsibleModule (``params``, ``fail_json``).
    """
    ports = module.params["ports"]
    bad = [p for p in ports if not 0 < p < 65536]
    if bad:
        module.fail_json(msg=f"ports: {bad} are not TCP ports (1-65535)")
    try:
        found = listeners(ports)
    except OSError as exc:
        module.fail_json(msg=f"cannot read the node's listening sockets from /proc: {exc}")
    strangers = foreign(found, module.params["units"])
    result = {
        "changed": False,
        "listeners": [item.as_dict() for item in found],
        "foreign": [item.as_dict() for item in strangers],
    }
    if strangers and module.params["fail_on_foreign"]:
        module.fail_json(msg=refusal(strangers), **result)
    return result
