# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``host_stack_facts``: what the host's software stack is, read from the node for the preflight.

The kernel and its command line, the CMA pool, the RDMA devices, the clock's sync, the
locked-memory limits (the manager's, the serving unit's, this process's), what the engine
environment links (the NCCL probe run in the image or the venv) and the weights' disk. Every
command is bounded and a failed one is a note, not a failure; the judgement is
``_host_stack``'s and ``_judge``'s.

No AnsibleModule here: ``module`` is the caller's (``params``, ``get_bin_path``, ``fail_json``).
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._files import (
    read_kernel_text,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._manifest_file import (
    ManifestError,
    default_manifest_path,
    load_manifest,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._nccl_probe import PROBE

# A snapshot walk that finds more files than this is not a model snapshot.
MAX_FILES = 200_000
ENGINE_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "VLLM_NCCL_SO_PATH")


class Gatherer:
    def __init__(self, module: Any, runner: Runner) -> None:
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
        limits = read_kernel_text(os.path.join(proc_root, "self", "limits")) or ""
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


def _disk(module: Any, notes: list[str]) -> dict:
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


def facts(module: Any, runner: Runner) -> dict:
    """The facts of ``ansible_facts.host_stack``; a proc_root that is no procfs ends the module."""
    try:
        validate.existing_directory("proc_root", module.params["proc_root"], must_exist=False)
        validate.existing_directory("sys_root", module.params["sys_root"], must_exist=False)
    except validate.ValidationError as exc:
        module.fail_json(msg=str(exc))
    proc_root = module.params["proc_root"]
    meminfo = read_kernel_text(os.path.join(proc_root, "meminfo"))
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
        "cmdline": (read_kernel_text(os.path.join(proc_root, "cmdline")) or "").strip(),
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
