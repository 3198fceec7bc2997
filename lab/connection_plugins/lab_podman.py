# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's connection: containers.podman.podman with pipelining, entering the host's namespaces.

Lab only (the inventories under inventories/lab*); users reach their nodes over
SSH, where ansible.cfg already pipelines. The upstream plugin runs every module
in six `podman` calls (mount, home, mkdir, chmod, exec, rm) because it says
pipelining does not work with podman: `podman exec` without `-i` drops stdin
(containers/podman#4785, fixed in 1.8 for `-i`). Here a module run is one
command with the module's payload on stdin, and files are copied the same way
(no `podman mount`).

That command is `nsenter --all` into the namespaces of the container's init
(mount, UTS, IPC, network, PID, cgroup), with the root, working directory and
environment of that init: what `podman exec` does, without podman's and runc's
own start-up, about 0.3 s of every `podman exec` on this machine against a few
milliseconds (about what one command costs on an SSH ControlPersist channel,
which is what users have). The init's PID is asked of `podman inspect` once and
kept in a small file per host; its start time is checked against /proc
before every use, so a restarted or removed host is looked up again. A paused host (its freezer cgroup FROZEN) or a stopped one raises
AnsibleConnectionFailure, the unreachable host `podman exec` reports. With a
remote_user, or without nsenter, every command goes through `podman exec -i`.
Measured in benchmarks/bench.py's no-op and rollout runs.
"""

from __future__ import annotations

DOCUMENTATION = """
    name: lab_podman
    short_description: containers.podman.podman with pipelining, for the lab's systemd hosts
    description:
      - The upstream podman connection; modules and files are piped through C(podman exec -i).
    options:
      remote_addr:
        description: The container's name.
        default: inventory_hostname
        vars:
          - name: ansible_host
          - name: inventory_hostname
          - name: ansible_podman_host
      remote_user:
        description: The user inside the container.
        vars:
          - name: ansible_user
      podman_extra_args:
        description: Extra arguments for every podman command.
        default: ''
        vars:
          - name: ansible_podman_extra_args
      podman_executable:
        description: The podman executable.
        default: podman
        vars:
          - name: ansible_podman_executable
      pipelining:
        description: Pipe modules to C(podman exec -i) instead of copying them.
        default: true
        type: boolean
        vars:
          - name: ansible_pipelining
"""

import json
import os
import shlex
import shutil
import subprocess
import tempfile

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.plugins.connection import ConnectionBase, ensure_connect
from ansible_collections.containers.podman.plugins.connection.podman import (
    Connection as PodmanConnection,
)

# How podman says that it, not the command, failed: exit 125, or 255 for a container that
# cannot take an exec session ("container state improper": paused, stopped), and its own
# "Error: ..." line on stderr.
PODMAN_FAILED = (125, 255)
NSENTER = shutil.which("nsenter")
CACHE_DIR = os.path.join(tempfile.gettempdir(), f"localinference-lab-connection-{os.getuid()}")
INSPECT_TIMEOUT = 60


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def freezer_file(cgroup_text: str, exists=os.path.exists) -> str | None:
    """The freezer state file of the cgroup in /proc/PID/cgroup text (v1 freezer, else v2 cgroup.freeze)."""
    lines = [line.split(":", 2) for line in cgroup_text.splitlines() if line.count(":") >= 2]
    for _, controllers, path in lines:
        if "freezer" in controllers.split(","):
            return f"/sys/fs/cgroup/freezer{path}/freezer.state"
    for hierarchy, _, path in lines:
        if hierarchy == "0":
            for root in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
                if exists(f"{root}{path}/cgroup.freeze"):
                    return f"{root}{path}/cgroup.freeze"
    return None


def _freezer(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            return freezer_file(handle.read())
    except OSError:
        return None


def frozen(path: str | None) -> bool:
    if not path:
        return False
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip() in ("FROZEN", "FREEZING", "1")
    except OSError:
        return False


class Connection(PodmanConnection):
    transport = "lab_podman"
    has_pipelining = True

    def _target(self) -> dict | None:
        """The container init's PID, start time, freezer file and environment; None: use podman exec."""
        if NSENTER is None or self.user:
            return None
        path = os.path.join(CACHE_DIR, f"{self._container_id}.json")
        try:
            with open(path, encoding="utf-8") as handle:
                target = json.load(handle)
            if start_time(target["pid"]) == target["start"]:
                return target
        except (OSError, ValueError, KeyError, TypeError):
            pass
        try:
            done = subprocess.run(
                [self.get_option("podman_executable"), "inspect", "--type", "container", self._container_id],
                capture_output=True, timeout=INSPECT_TIMEOUT, check=False,
            )
            state = json.loads(done.stdout)[0]["State"] if done.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError, IndexError, KeyError) as exc:
            raise AnsibleConnectionFailure(f"podman inspect {self._container_id} failed: {exc}") from exc
        if not state or not state.get("Running") or state.get("Paused") or not state.get("Pid"):
            status = (state or {}).get("Status") or to_native(done.stderr).strip() or "not running"
            raise AnsibleConnectionFailure(f"{self._container_id}: container state improper: {status}")
        pid = int(state["Pid"])
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                pairs = [item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item]
        except OSError as exc:
            raise AnsibleConnectionFailure(f"{self._container_id}: cannot read its init's environment: {exc}") from exc
        env = {to_native(k): to_native(v) for k, v in pairs}
        env.setdefault("HOME", "/root")
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        target = {"pid": pid, "start": start_time(pid), "freezer": _freezer(pid), "env": env}
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=CACHE_DIR)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(target, handle)
        os.replace(tmp, path)
        return target

    def _connect(self):
        # No `podman mount`: files go through `podman exec -i` too, which also
        # sees the container's own mounts (its /tmp is a tmpfs the overlay
        # mount point does not show).
        ConnectionBase._connect(self)
        self._connected = True
        return self

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        target = self._target()
        if target is not None:
            if frozen(target["freezer"]):
                raise AnsibleConnectionFailure(f"{self._container_id}: container state improper: paused")
            argv = [NSENTER, "--target", str(target["pid"]), "--all", "--root", "--wd", "--"]
            argv += shlex.split(to_native(cmd, errors="surrogate_or_strict"))
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=target["env"], close_fds=True,
            )
            stdout, stderr = proc.communicate(in_data)
            return proc.returncode, stdout, stderr
        args = ["exec"] + (["-i"] if in_data is not None else [])
        if self.user:
            args += ["--user", self.user]
        rc, stdout, stderr = self._podman(args, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)
        if rc in PODMAN_FAILED and to_native(stderr).startswith("Error: "):
            # Podman itself failed (the container is paused, stopped or gone): the host is
            # unreachable, as the upstream plugin reports it when its first `podman exec`
            # (the temporary directory) fails; a pipelined module must not turn it into a
            # module failure (preflight tells an unreachable node from a failed check).
            raise AnsibleConnectionFailure(
                f"podman exec in {self._container_id} failed: {to_native(stderr).strip()}"
            )
        return rc, stdout, stderr

    @ensure_connect
    def put_file(self, in_path, out_path):
        ConnectionBase.put_file(self, in_path, out_path)
        with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as src:
            data = src.read()
        rc, _, stderr = self.exec_command("/bin/sh -c " + shlex.quote("cat > " + shlex.quote(out_path)), in_data=data)
        if rc != 0:
            raise AnsibleError(f"Failed to copy {in_path} to {out_path} in container {self._container_id}: {to_native(stderr)}")

    @ensure_connect
    def fetch_file(self, in_path, out_path):
        ConnectionBase.fetch_file(self, in_path, out_path)
        rc, data, stderr = self.exec_command("cat " + shlex.quote(in_path))
        if rc != 0:
            raise AnsibleError(f"Failed to fetch {in_path} from container {self._container_id}: {to_native(stderr)}")
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as dst:
            dst.write(data)
