# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The commands that measure the cluster's collective bandwidth, one per node.

On GPU nodes the head runs nccl-tests' ``all_reduce_perf`` (the operator's MPI
build) with ``mpirun`` across the nodes, one rank per node, with the NCCL
variables the serving units get; the other nodes run nothing. Where there is
no GPU (the lab) every node runs ``GLOO_PROGRAM``: torch.distributed's gloo
backend all-reducing float32 tensors between the nodes over the cluster link,
with the engine's own Python (on the node, or in the engine's image through
``podman run --network=host``). It prints nccl-tests' table, marked as the CPU
stand-in, so ``_busbw.parse_all_reduce`` reads both. Every command runs
under ``timeout`` with the stage's deadline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.fabric._busbw import (
    STAND_IN_MARK,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._judge import (
    FabricInputError,
)

BACKENDS = ("nccl", "gloo")

GLOO_PROGRAM = r"""
import argparse, datetime, os, sys, time
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, required=True)
p.add_argument("--world", type=int, required=True)
p.add_argument("--master", required=True)
p.add_argument("--port", type=int, required=True)
p.add_argument("--sizes", type=int, nargs="+", required=True)
p.add_argument("--iters", type=int, required=True)
p.add_argument("--warmup", type=int, required=True)
p.add_argument("--timeout", type=int, required=True)
a = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://%s:%d" % (a.master, a.port), rank=a.rank,
                        world_size=a.world, timeout=datetime.timedelta(seconds=a.timeout))
out = a.rank == 0
if out:
    print("%s over %s" % (MARK, os.environ.get("GLOO_SOCKET_IFNAME", "?")))
    print("# nThread 1 nGpus 0 minBytes %d maxBytes %d warmup iters: %d iters: %d validation: 1"
          % (min(a.sizes), max(a.sizes), a.warmup, a.iters))
    print("#       size         count      type   redop    root     time   algbw   busbw  #wrong")
    print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)")
total = 0.0
for size in sorted(a.sizes):
    count = max(1, size // 4)
    t = torch.ones(count, dtype=torch.float32)
    for _ in range(a.warmup):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(a.iters):
        t.fill_(1.0)
        dist.all_reduce(t)
    elapsed = (time.perf_counter() - start) / a.iters
    wrong = int((t != float(a.world)).sum().item())
    algbw = count * 4 / elapsed / 1e9
    busbw = algbw * 2 * (a.world - 1) / a.world
    total += busbw
    if out:
        print("%12d  %12d     float     sum      -1  %8.1f  %6.3f  %6.3f  %6d"
              % (count * 4, count, elapsed * 1e6, algbw, busbw, wrong))
    sys.stdout.flush()
dist.destroy_process_group()
if out:
    print("# Out of bounds values : 0 OK")
    print("# Avg bus bandwidth    : %.5f" % (total / len(a.sizes)))
""".replace("MARK", repr(STAND_IN_MARK))


def _deadline(cfg: Mapping[str, Any]) -> list[str]:
    return ["timeout", "-k", "5", str(int(cfg["timeout"]))]


def gloo_argv(cfg: Mapping[str, Any], rank: int, world: int, master: str, ifname: str) -> list[str]:
    """One node's stand-in: the engine's Python, on the node or in its image."""
    args = [
        "-c",
        GLOO_PROGRAM,
        "--rank",
        str(rank),
        "--world",
        str(world),
        "--master",
        master,
        "--port",
        str(cfg["port"]),
        "--sizes",
        *[str(int(s)) for s in cfg["sizes"]],
        "--iters",
        str(cfg["iters"]),
        "--warmup",
        str(cfg["warmup"]),
        "--timeout",
        str(int(cfg["timeout"])),
    ]
    if cfg.get("image"):
        run = ["podman", "run", "--rm", "--network=host", "--pull=never"]
        run += ["-e", f"GLOO_SOCKET_IFNAME={ifname}", "--entrypoint", cfg["python"], cfg["image"]]
        return [*_deadline(cfg), *run, *args]
    return [*_deadline(cfg), "env", f"GLOO_SOCKET_IFNAME={ifname}", cfg["python"], *args]


def nccl_argv(
    cfg: Mapping[str, Any], addresses: Sequence[str], env: Mapping[str, Any]
) -> list[str]:
    """The head's ``mpirun`` of ``all_reduce_perf``: one rank per node, the units' NCCL variables."""
    sizes = sorted(int(s) for s in cfg["sizes"])
    argv = [*_deadline(cfg), "mpirun", "--allow-run-as-root", "-np", str(len(addresses))]
    argv += ["-H", ",".join(f"{a}:1" for a in addresses)]
    argv += ["--mca", "btl_tcp_if_include", str(env.get("NCCL_SOCKET_IFNAME", ""))]
    for name in sorted(env):
        if name.startswith(("NCCL_", "UCX_")):
            argv += ["-x", f"{name}={env[name]}"]
    argv += [cfg["nccl_tests"], "-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", "2", "-g", "1"]
    argv += ["-n", str(cfg["iters"]), "-w", str(cfg["warmup"])]
    return argv


def command(
    cfg: Mapping[str, Any],
    host: str,
    nodes: Sequence[str],
    addresses: Mapping[str, str],
    ifname: str,
    env: Mapping[str, Any],
) -> list[str]:
    """This node's argv (empty: nothing to run here). ``nodes[0]`` is rank 0 and
    reads the result; ``addresses`` maps each node to its primary cluster address."""
    if cfg["backend"] not in BACKENDS:
        raise FabricInputError(
            f"cluster_network_busbw_backend must be one of {BACKENDS}, got {cfg['backend']!r}"
        )
    if not cfg["sizes"]:
        raise FabricInputError(
            "cluster_network_busbw_sizes is empty: list the message sizes in bytes"
        )
    if cfg["backend"] == "nccl":
        return nccl_argv(cfg, [addresses[n] for n in nodes], env) if host == nodes[0] else []
    return gloo_argv(cfg, list(nodes).index(host), len(nodes), addresses[nodes[0]], ifname)


def busbw_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The gate's settings, typed; a bad one raises FabricInputError naming its variable."""
    sizes = settings.get("sizes")
    if not isinstance(sizes, Sequence) or isinstance(sizes, str) or not sizes:
        raise FabricInputError(
            f"cluster_network_busbw_sizes must list message sizes in bytes, got {sizes!r}"
        )
    try:
        sizes = [int(s) for s in sizes]
    except (TypeError, ValueError):
        raise FabricInputError(
            f"cluster_network_busbw_sizes must hold integers, got {sizes!r}"
        ) from None
    if min(sizes) < 4:
        raise FabricInputError(
            f"cluster_network_busbw_sizes: every size must be 4 bytes or more, got {sizes}"
        )
    gate = settings.get("min_gbps")
    if gate in ("", "None"):
        gate = None
    if gate is not None:
        try:
            gate = None if isinstance(gate, bool) else float(gate)
        except (TypeError, ValueError):
            gate = None
        if gate is None or not 0 < gate < 1e6:
            raise FabricInputError(
                "cluster_network_min_busbw_gbps must be a positive number of GB/s,"
                f" got {settings.get('min_gbps')!r}"
            )
    return {
        "enabled": bool(settings.get("enabled", True)),
        "backend": str(settings.get("backend") or "nccl"),
        "sizes": sizes,
        "iters": int(settings.get("iters", 20)),
        "warmup": int(settings.get("warmup", 5)),
        "timeout": int(settings.get("timeout", 180)),
        "port": int(settings.get("port", 29599)),
        "python": str(settings.get("python") or ""),
        "image": str(settings.get("image") or ""),
        "nccl_tests": str(settings.get("nccl_tests") or ""),
        "min_gbps": gate,
    }
