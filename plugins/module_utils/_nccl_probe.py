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

Stdlib only, Python 3.8 or later, every command bounded.
"""

from __future__ import annotations

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
