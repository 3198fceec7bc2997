# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's connection: containers.podman.podman with pipelining.

Lab only (the inventories under inventories/lab*); users reach their nodes over
SSH, where ansible.cfg already pipelines. The upstream plugin runs every module
in six `podman` calls (mount, home, mkdir, chmod, exec, rm) because it says
pipelining does not work with podman: `podman exec` without `-i` drops stdin
(containers/podman#4785, fixed in 1.8 for `-i`). With `-i` the module's
payload goes in on stdin, so a module run is one `podman exec -i`, and the
files are copied through `podman exec -i` as well (no `podman mount`). Measured in
benchmarks/bench.py's no-op and rollout runs.
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

import shlex

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


class Connection(PodmanConnection):
    transport = "lab_podman"
    has_pipelining = True

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
