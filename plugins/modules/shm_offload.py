#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: shm_offload
short_description: Report, and reclaim fail-closed, orphaned vLLM native KV-offload mmaps in /dev/shm
version_added: 0.2.0
description:
  - vLLM's native KV offload (C(--kv-offloading-size)) keeps its CPU tier in
    C(/dev/shm/vllm_offload_*.mmap). A killed server leaves these files behind and the next start
    fails with C(OSError) C([Errno 14] Bad address) once they fill the tmpfs (failure F13, see
    C(docs/failure-catalog.md)).
  - With O(state=status) the module only reads. With O(state=reclaimed) and O(confirm=true) it
    deletes a file only when its name matches O(pattern) exactly, it is a regular file (never a
    symbolic link) owned by O(owner), no live process maps it or holds it open (every
    C(/proc/PID/maps), matched by device and inode and by path, and every C(/proc/PID/fd)), no
    running Podman container has O(directory) mounted (or runs with C(--ipc=host) when
    O(directory) is C(/dev/shm)), and two inspections O(settle) seconds apart agree on its inode,
    size, modification time and owner. It verifies afterwards that the deleted files are gone.
  - It fails closed. When any source of evidence cannot be read (a live process's C(maps) or
    C(fd) that is unreadable or not in the kernel's format, C(/proc) hidden by C(hidepid), Podman
    failing or not answering within O(timeout)) nothing is deleted, RV(proven) is false and the
    reasons are listed in RV(refusals); O(state=reclaimed) then fails naming them. A process that
    exits between the listing of C(/proc) and the reading of its files is not missing evidence.
  - A running container with the directory mounted blocks reclaim (the offload qualification report, "no running
    native-offload owner"), even though this collection's containers run in the host's PID
    namespace and C(/proc) already shows their processes. Podman is asked only when its binary
    exists (O(podman)); rootless containers of other users are covered by C(/proc) alone.
  - Run it as root. As another user the C(maps) of other users' processes are unreadable, so it
    always refuses; that is the intended behaviour, not an error to work around.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
attributes:
  check_mode:
    support: full
    details: With O(state=reclaimed), RV(reclaimed) and RV(bytes_freed) say what would be reclaimed.
  diff_mode:
    support: full
options:
  state:
    description:
      - C(status) reports and changes nothing; C(reclaimed) deletes the proven orphans.
    type: str
    default: status
    choices: [status, reclaimed]
  confirm:
    description:
      - Must be true with O(state=reclaimed) (also in check mode); without it the module fails and
        deletes nothing.
    type: bool
    default: false
  directory:
    description: The tmpfs folder vLLM puts its offload files in (absolute, no symbolic links).
    type: path
    default: /dev/shm
  pattern:
    description:
      - A plain file-name glob (C(*), C(?), C([...])) matched against names in O(directory); no
        C(/), no C(..), at least three literal characters before the first wildcard.
    type: str
    default: vllm_offload_*.mmap
  owner:
    description:
      - The user (name or uid) the serving units run as; only files owned by this user are deleted.
    type: str
    default: root
  settle:
    description: Seconds between the two inspections (0 to 60).
    type: float
    default: 1.0
  timeout:
    description:
      - Seconds one scan of O(proc_root) may take, and each Podman command; past it the module
        refuses (1 to 600).
    type: float
    default: 60.0
  podman:
    description:
      - The Podman binary asked for running containers. Default C(podman) on C(PATH); when it is
        not installed the container check is skipped and RV(sources) says so. A path given here
        that does not exist is an error.
    type: str
  proc_root:
    description:
      - The process table to scan. Only the unit tests change it (a copied tree with an unreadable
        or garbled C(maps), which a root test cannot produce on the real C(/proc)).
    type: path
    default: /proc
"""

EXAMPLES = r"""
- name: Report offload files and who maps them
  localinference.vllm.shm_offload:
  register: shm

- name: Reclaim the orphans left by a killed engine (the serving units run as root)
  localinference.vllm.shm_offload:
    state: reclaimed
    confirm: true
  register: shm_reclaim

- name: The same from a shell (the ExecStopPost of a serving unit)
  ansible.builtin.debug:
    msg: >-
      ansible localhost -m localinference.vllm.shm_offload
      -a 'state=reclaimed confirm=true'
"""

RETURN = r"""
proven:
  description:
    - Whether every source of evidence was read; when false, RV(orphans) is empty, the candidates
      are in RV(unproven) and RV(refusals) says why.
  returned: always
  type: bool
live:
  description: Matching files a live process maps or holds open, with the PIDs.
  returned: always
  type: list
  elements: dict
  sample: [{path: /dev/shm/vllm_offload_0.mmap, size: 8587821056, allocated: 8587821056,
            uid: 0, inode: 17, pids: [4242, 4243], how: [mapped]}]
orphans:
  description: Files proven unmapped, unchanged across both inspections and owned by O(owner).
  returned: always
  type: list
  elements: dict
unproven:
  description: Files that would be orphans if the missing evidence (RV(refusals)) were there.
  returned: always
  type: list
  elements: dict
skipped:
  description: Matching entries never deleted, each with its C(reason) (link, other owner, changed).
  returned: always
  type: list
  elements: dict
reclaimed:
  description: Files deleted (in check mode, that would be deleted).
  returned: always
  type: list
  elements: dict
bytes_freed:
  description:
    - tmpfs space released, the sum of the reclaimed files' allocated blocks (st_blocks x 512);
      a sparse file frees less than its size.
  returned: always
  type: int
refusals:
  description: Why the evidence is incomplete (nothing is deleted when this is not empty).
  returned: always
  type: list
  elements: str
containers:
  description: Running Podman containers that have O(directory) mounted.
  returned: always
  type: list
  elements: dict
sources:
  description: What was read, for the record (processes checked, Podman binary and containers).
  returned: always
  type: dict
  sample: {proc: /proc, processes: 212, podman: /usr/bin/podman, running_containers: 1}
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.serve._shm_offload import (
    ShmOffloadError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._shm_reclaim import (
    Refused,
    module_result,
)

ARGUMENT_SPEC: dict[str, Any] = {
    "state": {"type": "str", "default": "status", "choices": ["status", "reclaimed"]},
    "confirm": {"type": "bool", "default": False},
    "directory": {"type": "path", "default": "/dev/shm"},
    "pattern": {"type": "str", "default": "vllm_offload_*.mmap"},
    "owner": {"type": "str", "default": "root"},
    "settle": {"type": "float", "default": 1.0},
    "timeout": {"type": "float", "default": 60.0},
    "podman": {"type": "str"},
    "proc_root": {"type": "path", "default": "/proc"},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = module_result(module.params, module.check_mode, module._diff, module.warn)
    except Refused as exc:
        module.fail_json(msg=str(exc), **exc.result)
    except ShmOffloadError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"shm_offload: cannot inspect {module.params['directory']}: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
