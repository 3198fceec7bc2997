# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The program that lists the NCCL libraries of the engine's own environment.

It runs with the engine's Python (the venv's ``bin/python`` in systemd mode;
``podman run --entrypoint <python> IMAGE`` in Quadlet mode), never with
Ansible's, because the question is which ``libnccl.so.2`` *that* process
would load: the pip wheel's (``nvidia/nccl/lib``, what torch's RUNPATH
points at) or the system's (``libnccl2`` from apt). It needs no GPU: it only
lists files, asks ``ldconfig -p`` and ``dpkg-query -l`` and reads three
environment variables.

Its output is sections of the real commands' own formats, so the judge in
``_host_stack.py`` reads the same text an operator would paste from a shell::

    # pip                 (pip freeze lines: nvidia-nccl-cu13==2.28.9)
    # files               (path, or "path -> resolved path" for a link)
    # ldconfig -p         (ldconfig -p lines that name libnccl)
    # dpkg -l             (dpkg-query -l lines of libnccl packages)
    # env                 (LD_PRELOAD=..., LD_LIBRARY_PATH=..., VLLM_NCCL_SO_PATH=...)

The probe is stdlib only, Python 3.8 or later, every command bounded. Its
output is read back here (``parse_probe``, ``nccl_summary``) and judged
(``judge_nccl``, F22 in ``docs/failure-catalog.md``).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding

PROBE = r"""
import glob, os, subprocess, sys
try:
    from importlib import metadata
except ImportError:
    metadata = None

ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "VLLM_NCCL_SO_PATH")
SYSTEM_DIRS = ("/usr/lib/*-linux-gnu", "/lib/*-linux-gnu", "/usr/lib64", "/usr/lib",
               "/usr/local/lib", "/usr/local/cuda*/lib*", "/usr/local/cuda*/targets/*/lib",
               "/opt/nvidia/*/lib", "/opt/hpcx/nccl*/lib")

def run(argv):
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=15, env=dict(os.environ, LC_ALL="C"))
    except Exception:
        return ""
    return done.stdout.decode("utf-8", "replace")

def line(path):
    real = os.path.realpath(path)
    return path if real == path else path + " -> " + real

print("# pip")
if metadata is not None:
    seen = set()
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").strip()
        key = name.lower().replace("_", "-")
        if key.startswith("nvidia-nccl") and key not in seen:
            seen.add(key)
            print("%s==%s" % (name, dist.version))
print("# files")
found = []
for entry in sys.path:
    if entry and os.path.isdir(entry):
        found += glob.glob(os.path.join(entry, "nvidia", "nccl", "lib", "libnccl.so*"))
        found += glob.glob(os.path.join(entry, "torch", "lib", "libnccl.so*"))
for pattern in SYSTEM_DIRS:
    found += glob.glob(os.path.join(pattern, "libnccl.so*"))
for name in ENV:
    for item in os.environ.get(name, "").replace(" ", ":").split(":"):
        if not item:
            continue
        if name == "LD_LIBRARY_PATH":
            found += glob.glob(os.path.join(item, "libnccl.so*"))
        elif os.path.exists(item):
            found.append(item)
for path in sorted(set(os.path.normpath(p) for p in found)):
    print(line(path))
print("# ldconfig -p")
for text in run(["ldconfig", "-p"]).splitlines() or run(["/sbin/ldconfig", "-p"]).splitlines():
    if "libnccl" in text:
        print(text)
print("# dpkg -l")
for text in run(["dpkg-query", "-l", "libnccl*"]).splitlines():
    if text.startswith(("ii", "hi", "rc", "iU", "iF")) and "nccl" in text:
        print(text)
print("# env")
for name in ENV:
    print("%s=%s" % (name, os.environ.get(name, "")))
"""


# --- F22: the NCCL library the engine loads --------------------------------------------------
#
# torch's RUNPATH points at the pip wheel (nvidia/nccl/lib/libnccl.so.2), and vLLM's pynccl
# opens "libnccl.so.2", which resolves to the copy already loaded: the wheel wins over the
# system libnccl2 unless LD_PRELOAD (or LD_LIBRARY_PATH, which RUNPATH yields to) says
# otherwise. On DGX Spark the wheel and DGX OS's libnccl2 were both 2.28.9 but different builds
# (219 MB vs 190 MB); the wheel's hung all-reduce under load after 20-26 minutes and linking the
# system library over the wheel's path fixed it (vllm-project/vllm#42354 and #41725, 2026-07-23).
# eugr/spark-vllm-docker#278: "pip packages have precedence with dynamic library loading".
_PIP = re.compile(r"^(?P<name>nvidia[-_]nccl[-_]\S*?)\s*==\s*(?P<version>\S+)$", re.IGNORECASE)
_LDCONFIG = re.compile(r"^\s*(?P<soname>libnccl\.so\S*)\s+\([^)]*\)\s+=>\s+(?P<path>\S+)\s*$")
_DPKG = re.compile(r"^(?P<state>[a-zA-Z]{2,3})\s+(?P<pkg>libnccl2)(?::\S+)?\s+(?P<version>\S+)")
_SO_VERSION = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)$")
_SECTIONS = {
    "pip": "pip",
    "files": "files",
    "ldconfig -p": "ldconfig",
    "dpkg -l": "dpkg",
    "env": "env",
}


def parse_probe(text: str) -> dict[str, Any]:
    """The sections of ``_nccl_probe.PROBE`` output (or the same commands pasted by hand)."""
    out: dict[str, Any] = {"pip": [], "files": [], "ldconfig": [], "dpkg": [], "env": {}}
    section = None
    for raw in (text or "").splitlines():
        line = raw.rstrip()
        if line.startswith("# "):
            section = _SECTIONS.get(line[2:].strip())
            continue
        if not line.strip() or section is None:
            continue
        if section == "env":
            key, sep, value = line.partition("=")
            if sep:
                out["env"][key.strip()] = value.strip()
        elif section == "files":
            path, _, real = line.partition(" -> ")
            out["files"].append({"path": path.strip(), "real": (real or path).strip()})
        else:
            out[section].append(line)
    return out


def _wheel_path(path: str) -> bool:
    return "/site-packages/" in path or "/dist-packages/" in path


def _version_of(path: str) -> str | None:
    match = _SO_VERSION.search(path)
    return match.group(1) if match else None


def nccl_summary(text: str) -> dict[str, Any]:
    """Which ``libnccl`` the engine's process loads, and what else is installed."""
    probe = parse_probe(text)
    wheel_version = None
    for line in probe["pip"]:
        match = _PIP.match(line.strip())
        if match:
            wheel_version = match.group("version")
    libs = [f for f in probe["files"] if "libnccl.so" in f["path"].rsplit("/", 1)[-1]]
    wheel = next((f for f in libs if _wheel_path(f["path"]) and "/nccl/lib/" in f["path"]), None)
    wheel = wheel or next((f for f in libs if _wheel_path(f["path"])), None)
    system_paths = [m.group("path") for m in map(_LDCONFIG.match, probe["ldconfig"]) if m]
    system_paths += [f["path"] for f in libs if not _wheel_path(f["path"])]
    dpkg = next(
        (m.group("version") for m in map(_DPKG.match, probe["dpkg"]) if m and m["state"][1] == "i"),
        None,
    )
    system = None
    if system_paths:
        path = system_paths[0]
        real = next((f["real"] for f in libs if f["path"] == path), path)
        version = (dpkg or "").split("-")[0] or _version_of(real) or _version_of(path)
        system = {"path": path, "real": real, "version": version, "package": dpkg}
    env = probe["env"]
    loads: dict[str, Any] = {"kind": "none", "path": None, "version": None, "exists": True}
    existing = {f["path"] for f in probe["files"]} | {f["real"] for f in probe["files"]}
    preload = [p for p in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")) if "libnccl" in p]
    library_dirs = [d.rstrip("/") for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    in_dirs = [f for d in library_dirs for f in libs if f["path"].rsplit("/", 1)[0] == d]
    if preload:
        loads = {"kind": "LD_PRELOAD", "path": preload[0], "exists": preload[0] in existing}
    elif env.get("VLLM_NCCL_SO_PATH"):
        path = env["VLLM_NCCL_SO_PATH"]
        loads = {"kind": "VLLM_NCCL_SO_PATH", "path": path, "exists": path in existing}
    elif in_dirs:
        loads = {"kind": "LD_LIBRARY_PATH", "path": in_dirs[0]["path"], "exists": True}
    elif wheel:
        linked = not _wheel_path(wheel["real"])
        loads = {
            "kind": "system linked over the wheel" if linked else "wheel",
            "path": wheel["path"],
        }
        loads["exists"] = True
    elif system:
        loads = {"kind": "system", "path": system["path"], "exists": True}
    if loads["kind"] == "wheel":
        loads["version"] = wheel_version
    elif loads["kind"] != "none":
        real = next((f["real"] for f in libs if f["path"] == loads["path"]), loads["path"] or "")
        on_system = system and real in (system["real"], system["path"])
        loads["version"] = (system or {}).get("version") if on_system else _version_of(real)
    return {
        "loads": loads,
        "wheel": None
        if not (wheel or wheel_version)
        else {
            "path": (wheel or {}).get("path"),
            "real": (wheel or {}).get("real"),
            "version": wheel_version,
        },
        "system": system,
    }


def judge_nccl(text: str | None, unified_memory: bool, host: str = "") -> list[dict[str, Any]]:
    """F22: a named NCCL override that does not exist (error); the wheel shadowing the system."""
    if not text:
        return []
    summary = nccl_summary(text)
    loads, wheel, system = summary["loads"], summary["wheel"], summary["system"]
    if loads["kind"] in ("LD_PRELOAD", "VLLM_NCCL_SO_PATH") and not loads["exists"]:
        return [
            finding(
                "F22",
                "error",
                f"{loads['kind']} names {loads['path']}, which does not exist in the engine's"
                " environment: the engine cannot load NCCL and fails at its first collective",
                f"point {loads['kind']} (vllm_recipe.env) at an existing libnccl.so.2, e.g."
                f" {(system or {}).get('path') or 'the system libnccl2'} (docs/failure-catalog.md#f22)",
                host=host,
                check="nccl",
                evidence=f"{loads['kind']}={loads['path']}; not found",
            )
        ]
    if loads["kind"] != "wheel" or not system:
        return []
    wheel_v, system_v = (wheel or {}).get("version"), system.get("version")
    differ = bool(wheel_v and system_v and wheel_v != system_v)
    if not (differ or unified_memory):
        return []
    same = "a different version" if differ else "possibly the same version but a different build"
    message = (
        f"the engine loads the pip-bundled NCCL {wheel_v or '(version unknown)'}"
        f" ({loads['path']}), not the system libnccl2 {system.get('package') or system_v or ''}"
        f" ({system['path']}): {same}"
    )
    if unified_memory and not differ:
        message += (
            "; on DGX Spark the wheel's build hung all-reduce under load where the system build"
            " of the same version did not (vllm-project/vllm#42354)"
        )
    return [
        finding(
            "F22",
            "warning",
            message,
            f"link the system library over the wheel's in the image or venv (ln -sf"
            f" {system['path']} {loads['path']}) or set LD_PRELOAD={system['path']} in"
            f" vllm_recipe.env, then re-run --tags preflight (docs/failure-catalog.md#f22)",
            host=host,
            check="nccl",
            evidence=f"wheel {loads['path']} ({wheel_v}); system {system['path']} ({system_v})",
        )
    ]
