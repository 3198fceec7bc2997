#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: host_stack_facts
short_description: Gather the host-stack evidence preflight judges (kernel, CMA, NCCL, clock, disk, memlock)
version_added: 0.2.0
description:
  - Reads the kernel release, C(/proc/cmdline) and the C(CmaTotal)/C(CmaFree) lines of C(/proc/meminfo) (F21), the
    RDMA devices under C(<sys_root>/class/infiniband), C(timedatectl show) and C(chronyc -n tracking) (F24),
    systemd's C(DefaultLimitMEMLOCK) and the serving unit's C(LimitMEMLOCK) (F26), and the free space and weights
    already present where the weights land, with the size of their manifest when the node holds one (F25).
  - Lists the NCCL libraries of the engine's own environment (F22) without a GPU, by running a small program with
    the engine's Python - O(engine_python) on the node, or inside O(engine_image) with
    C(podman run --rm --network=none --pull=never) - that prints C(pip freeze) lines of the C(nvidia-nccl) wheels,
    the C(libnccl.so*) files with their link targets, C(ldconfig -p), C(dpkg-query -l libnccl*) and the
    C(LD_PRELOAD), C(LD_LIBRARY_PATH) and C(VLLM_NCCL_SO_PATH) the engine sees.
  - Every command runs with a timeout and the C locale; a command that is missing, fails or times out is noted
    in RV(ansible_facts.host_stack.notes) and its evidence left empty, so a wedged daemon never hangs preflight.
  - The judgement is C(plugins/module_utils/preflight/_host_stack.py), through the C(preflight_rank) filter.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.FACTS
  - localinference.vllm.node.PROC_ROOT
  - localinference.vllm.node.SYS_ROOT
options:
  weights_path:
    description:
      - The directory the weights land in (a Hugging Face snapshot directory); it need not exist yet.
      - The free space is measured on the filesystem of its nearest existing parent.
    type: path
  weights_manifest:
    description:
      - The weights' manifest (from C(localinference.vllm.model_manifest)).
      - Defaults to C(<repo>/localinference-manifests/<revision>.json) beside O(weights_path).
    type: path
  engine_python:
    description:
      - The engine's Python on the node (systemd mode, for example C(/opt/localinference/vllm-0.32.0/bin/python)).
      - Ignored when O(engine_image) is set; nothing is listed when neither exists on the node.
    type: path
  engine_image:
    description:
      - The engine's container image (Quadlet mode). Listed only when the image is already on the node.
    type: str
  engine_entrypoint:
    description:
      - The image's vLLM entrypoint; the Python beside it (C(<dir>/python3)) runs the listing, or C(python3) when
        it is not a path.
    type: str
    default: vllm
  engine_env:
    description:
      - C(LD_PRELOAD), C(LD_LIBRARY_PATH) and C(VLLM_NCCL_SO_PATH) the engine is started with (other keys are
        ignored).
    type: dict
    default: {}
  inspect_engine:
    description:
      - List the engine's NCCL libraries.
    type: bool
    default: true
  unit:
    description:
      - The serving unit whose C(LimitMEMLOCK) is read when it exists.
    type: str
    default: localinference-vllm.service
  timeout:
    description:
      - Seconds each command may take.
    type: float
    default: 10
  engine_timeout:
    description:
      - Seconds the engine listing may take (a container start included).
    type: float
    default: 120
notes:
  - In Quadlet mode the listing starts a throw-away container (C(--rm), no network); nothing on the node changes.
"""

EXAMPLES = r"""
- name: Gather the host-stack evidence
  localinference.vllm.host_stack_facts:
    weights_path: /srv/models/hub/models--org--name/snapshots/5eed0c0ffee0000000000000000000000000000a
    engine_image: registry.example/vllm@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    engine_entrypoint: /opt/vllm/bin/vllm
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    host_stack:
      description: The recorded evidence (texts as the commands printed them).
      returned: always
      type: dict
      contains:
        kernel_release:
          description: C(uname -r).
          type: str
        machine:
          description: C(uname -m).
          type: str
        cmdline:
          description: C(/proc/cmdline).
          type: str
        meminfo_cma:
          description: The C(Cma*) lines of C(/proc/meminfo) (empty on kernels without CMA).
          type: str
        rdma_devices:
          description: RDMA devices under C(<sys_root>/class/infiniband).
          type: list
          elements: str
        clock:
          description: C(timedatectl) (output of C(timedatectl show)) and C(chronyc) (of C(chronyc -n tracking)); null when not available.
          type: dict
        memlock:
          description:
            - C(manager) (systemd's C(DefaultLimitMEMLOCK*)), C(unit) (the unit's C(LimitMEMLOCK*), when it exists)
              and C(process) (the C(Max locked memory) line of the module's own limits).
          type: dict
        engine:
          description: C(source) (C(venv), C(image) or C(none)), C(where), C(probe) (the listing's output) and C(error).
          type: dict
        disk:
          description: C(path), C(measured_at), C(free_bytes), C(present_bytes), C(manifest) and C(manifest_bytes) (null without a manifest).
          type: dict
        notes:
          description: Evidence that could not be gathered, and why.
          type: list
          elements: str
"""

import os
import posixpath

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    run_facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._nccl_probe import PROBE
from ansible_collections.localinference.vllm.plugins.module_utils.weights._manifest import (
    ManifestError,
    default_manifest_path,
    load_manifest,
)

MAX_READ = 1024 * 1024
# A snapshot walk that finds more files than this is not a model snapshot.
MAX_FILES = 200_000
ENGINE_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "VLLM_NCCL_SO_PATH")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(MAX_READ)
    except (OSError, ValueError):
        return None


class Gatherer:
    def __init__(self, module: AnsibleModule, runner: Runner) -> None:
        self.module = module
        self.runner = runner
        self.notes: list[str] = []

    def run(self, argv: list[str], timeout: float | None = None) -> str | None:
        """stdout of a command that exited 0; None (and a note) otherwise."""
        path = self.module.get_bin_path(argv[0])
        if not path:
            self.notes.append(f"{argv[0]} not found")
            return None
        try:
            rc, out, err = self.runner.run([path, *argv[1:]], timeout=timeout)
        except CommandError as exc:
            self.notes.append(str(exc))
            return None
        if rc != 0:
            self.notes.append(f"{' '.join(argv[:3])} exited {rc}: {(err or out).strip()[:200]}")
            return None
        return out

    def memlock(self, proc_root: str) -> dict[str, str | None]:
        limits = _read(os.path.join(proc_root, "self", "limits")) or ""
        unit = None
        name = self.module.params["unit"]
        shown = self.run(["systemctl", "show", "-p", "LoadState", name])
        if shown and "LoadState=loaded" in shown:
            unit = self.run(
                ["systemctl", "show", "-p", "LimitMEMLOCK", "-p", "LimitMEMLOCKSoft", name]
            )
        return {
            "manager": self.run(
                ["systemctl", "show", "-p", "DefaultLimitMEMLOCK", "-p", "DefaultLimitMEMLOCKSoft"]
            ),
            "unit": unit,
            "process": next((ln for ln in limits.splitlines() if "locked memory" in ln), None),
        }

    def engine(self) -> dict[str, str | None]:
        params = self.module.params
        env = {k: str(v) for k, v in (params["engine_env"] or {}).items() if k in ENGINE_ENV}
        if not params["inspect_engine"]:
            return {"source": "none", "where": None, "probe": None, "error": "inspect_engine=false"}
        image = params["engine_image"]
        if image:
            if self.run(["podman", "image", "exists", image]) is None:
                return {
                    "source": "none",
                    "where": image,
                    "probe": None,
                    "error": "image not on this node",
                }
            entry = params["engine_entrypoint"]
            python = (
                posixpath.join(posixpath.dirname(entry), "python3")
                if entry.startswith("/")
                else "python3"
            )
            argv = [
                "podman",
                "run",
                "--rm",
                "--network=none",
                "--pull=never",
                "--entrypoint",
                python,
            ]
            for key, value in env.items():
                argv += ["--env", f"{key}={value}"]
            argv += [image, "-I", "-c", PROBE]
            out = self.run(argv, timeout=params["engine_timeout"])
            return {
                "source": "image",
                "where": image,
                "probe": out,
                "error": None if out else self.notes[-1],
            }
        python = params["engine_python"]
        if python and os.access(python, os.X_OK):
            runner = Runner(params["engine_timeout"], env)
            try:
                rc, out, err = runner.run([python, "-I", "-c", PROBE])
            except CommandError as exc:
                self.notes.append(str(exc))
                return {"source": "venv", "where": python, "probe": None, "error": str(exc)}
            if rc == 0:
                return {"source": "venv", "where": python, "probe": out, "error": None}
            error = f"{python} exited {rc}: {(err or out).strip()[:200]}"
            self.notes.append(error)
            return {"source": "venv", "where": python, "probe": None, "error": error}
        return {
            "source": "none",
            "where": python,
            "probe": None,
            "error": "no engine environment on this node yet",
        }


def _nearest_existing(path: str) -> str:
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe


def _present_bytes(root: str, manifest: dict | None) -> int:
    """Bytes of the weights already in place: manifest entries of the right size, else every
    regular file under ``root`` (links followed, each file counted once)."""
    if manifest is not None:
        total = 0
        for entry in manifest["files"]:
            try:
                if os.stat(os.path.join(root, entry["path"])).st_size == entry["size"]:
                    total += entry["size"]
            except OSError:
                continue
        return total
    seen: set[tuple[int, int]] = set()
    total = 0
    for count, (folder, _dirs, files) in enumerate(os.walk(root)):
        if count + len(seen) > MAX_FILES:
            break
        for name in files:
            try:
                stat = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


def _disk(module: AnsibleModule, notes: list[str]) -> dict:
    path = module.params["weights_path"]
    if not path:
        return {}
    measured = _nearest_existing(path)
    out: dict = {"path": path, "measured_at": measured, "manifest": None, "manifest_bytes": None}
    try:
        stat = os.statvfs(measured)
        out["free_bytes"] = stat.f_frsize * stat.f_bavail
    except OSError as exc:
        notes.append(f"cannot measure {measured}: {exc.strerror or exc}")
        out["free_bytes"] = None
    manifest_path = module.params["weights_manifest"] or default_manifest_path(path)
    manifest = None
    if os.path.exists(manifest_path):
        try:
            manifest = load_manifest(manifest_path)
            out["manifest"] = manifest_path
            out["manifest_bytes"] = sum(entry["size"] for entry in manifest["files"])
        except ManifestError as exc:
            notes.append(str(exc))
    out["present_bytes"] = _present_bytes(path, manifest) if os.path.isdir(path) else 0
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "proc_root": {"type": "path", "default": "/proc"},
            "sys_root": {"type": "path", "default": "/sys"},
            "weights_path": {"type": "path"},
            "weights_manifest": {"type": "path"},
            "engine_python": {"type": "path"},
            "engine_image": {"type": "str"},
            "engine_entrypoint": {"type": "str", "default": "vllm"},
            "engine_env": {"type": "dict", "default": {}},
            "inspect_engine": {"type": "bool", "default": True},
            "unit": {"type": "str", "default": "localinference-vllm.service"},
            "timeout": {"type": "float", "default": 10.0},
            "engine_timeout": {"type": "float", "default": 120.0},
        },
        supports_check_mode=True,
    )
    run_facts(
        module, "host_stack", lambda runner: _facts(module, runner), ("timeout", "engine_timeout")
    )


def _facts(module: AnsibleModule, runner: Runner) -> dict:
    try:
        validate.existing_directory("proc_root", module.params["proc_root"], must_exist=False)
        validate.existing_directory("sys_root", module.params["sys_root"], must_exist=False)
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    proc_root = module.params["proc_root"]
    meminfo = _read(os.path.join(proc_root, "meminfo"))
    if meminfo is None:
        module.fail_json(
            msg=f"Cannot read {proc_root}/meminfo: is proc_root={proc_root} a procfs mount?"
        )
    gather = Gatherer(module, runner)
    infiniband = os.path.join(module.params["sys_root"], "class", "infiniband")
    try:
        rdma = sorted(os.listdir(infiniband))[:64]
    except OSError:
        rdma = []
    uname = os.uname()
    facts = {
        "kernel_release": uname.release,
        "machine": uname.machine,
        "cmdline": (_read(os.path.join(proc_root, "cmdline")) or "").strip(),
        "meminfo_cma": "\n".join(ln for ln in meminfo.splitlines() if ln.startswith("Cma")),
        "rdma_devices": rdma,
        "clock": {
            "timedatectl": gather.run(["timedatectl", "show"]),
            "chronyc": gather.run(["chronyc", "-n", "tracking"]),
        },
        "memlock": gather.memlock(proc_root),
        "engine": gather.engine(),
        "disk": _disk(module, gather.notes),
    }
    facts["notes"] = gather.notes
    return facts


if __name__ == "__main__":
    main()
