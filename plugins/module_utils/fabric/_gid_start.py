# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The RoCE GID index resolved at every start (F20; issue 30): ``gid-start``.

The RoCE v2 GID index that carries the cluster address can move while a node runs (3 to 4
within 30 minutes of a good start was reported on a DGX Spark); a ``NCCL_IB_GID_INDEX``
frozen at the last fabric run then names another entry, and NCCL falls back or hangs. So
the serving units do not carry the index: their first ``ExecStartPre=`` runs this program,
which reads the port's GID table at that moment (the same reader as the watchdog's probe,
``_rdma_facts.live_roce_v2_index``) and writes ``NCCL_IB_GID_INDEX=N`` to
:data:`ENV_FILE`, which the unit reads (``EnvironmentFile=``: systemd reads it for each
command it starts, Quadlet's ``podman run --env-file`` when ExecStart runs, both after
this program wrote it).

- The index fabric.json recorded (``--expect``): one line on stdout, exit 0.
- Another index: the start uses the table's index and one line on stderr names both
  (``MOVED_MARKER``); the watchdog reports the same drift (F20) until the fabric stage runs.
- No RoCE v2 entry for the address on the interface, or no table at all: one line on
  stderr (``REFUSAL_MARKER``), exit 1, the last start's file removed: the start fails
  instead of falling back to another GID or to sockets.

The units carry the program only where the fabric stage resolved an index (an HCA behind
the cluster interface): a node without RDMA (single host, a lab without stand-ins)
renders nothing of it and keeps the environment it had.

The program installed on the node (role serve, ``templates/gid_start.j2``) is this file with
``_validate`` and ``_rdma_facts``, embedded unchanged.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._files import (
    read_sysfs,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._rdma_facts import (
    live_roce_v2_index,
    rdma_device_name,
    sysfs_port_dir,
)

PROGRAM = "gid-start"
ENV_FILE = "/run/localinference/nccl-gid.env"
VARIABLE = "NCCL_IB_GID_INDEX"
OK, REFUSE, USAGE = 0, 1, 2
REFUSAL_MARKER = "localinference gid-start refused the start"
MOVED_MARKER = "localinference gid-start: the RoCE GID index moved"
FIX = "docs/failure-catalog.md#f20"
MAX_PORT = 255
MAX_INDEX = 4096


class GidStartError(validate.Error):
    """The table holds no usable entry: the start is refused with this text."""


def parse_source(name: str, raw: Any) -> dict[str, Any]:
    """The node's ``rdma`` option (``{hca, port, sys_root}``), validated; ``{}`` when absent.

    Every value reaches the unit's command line; a refusal names ``name.<key>``.
    """
    if raw in (None, {}):
        return {}
    if not isinstance(raw, Mapping):
        raise validate.ValidationError(
            name, f"expected a dict, got {validate.shown(raw)}", "give {hca, port, sys_root}"
        )
    unknown = sorted(set(raw) - {"hca", "port", "sys_root"})
    if unknown:
        raise validate.ValidationError(
            name, f"unknown key {validate.shown(unknown[0])}", "use hca, port and sys_root"
        )
    if raw.get("hca") in (None, ""):
        return {}
    return {
        "hca": rdma_device_name(f"{name}.hca", raw.get("hca")),
        "port": validate.integer(f"{name}.port", raw.get("port", 1), minimum=1, maximum=MAX_PORT),
        "sys_root": validate.path(f"{name}.sys_root", raw.get("sys_root") or "/sys"),
    }


def start_argv(
    libexec_dir: str, source: Mapping[str, Any], address: str, env: Mapping[str, str]
) -> list[str] | None:
    """The ``ExecStartPre=`` argv of a node's units, or None where no index was resolved.

    ``source`` is :func:`parse_source`'s result, ``address`` the node's cluster address,
    ``env`` its environment from the fabric stage (``NCCL_IB_GID_INDEX`` is what fabric.json
    recorded, ``NCCL_SOCKET_IFNAME`` the cluster interface).
    """
    expect, netdev = env.get(VARIABLE), env.get("NCCL_SOCKET_IFNAME")
    if not source or expect in (None, "") or not netdev:
        return None
    try:
        ipv4 = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    return [
        f"{libexec_dir.rstrip('/')}/{PROGRAM}",
        "--sys-root", source["sys_root"],
        "--hca", source["hca"],
        "--port", str(source["port"]),
        "--ipv4", str(ipv4),
        "--netdev", validate.interface_name("node.env.NCCL_SOCKET_IFNAME", netdev),
        "--expect", str(validate.integer(f"node.env.{VARIABLE}", expect, minimum=0, maximum=MAX_INDEX)),
        "--env-file", ENV_FILE,
    ]


def resolve(
    sys_root: str,
    hca: str,
    port: int,
    ipv4: str,
    netdev: str,
    expect: int,
    read: Callable[[str], str | None],
) -> dict[str, Any]:
    """``{index, expect, moved, line}`` for this start, or :class:`GidStartError`."""
    where = f"{hca} port {port}"
    port_dir = sysfs_port_dir(sys_root, hca, port)
    if not os.path.isdir(os.path.join(port_dir, "gids")):
        raise GidStartError(
            f"{REFUSAL_MARKER}: {where} has no GID table ({port_dir}/gids does not exist): the "
            f"RDMA device is gone or renamed since the fabric run; NCCL_IB_GID_INDEX cannot be "
            f"resolved. Fix: check 'rdma link' and 'ibv_devices', then run the fabric stage "
            f"(--tags fabric) ({FIX})"
        )
    index, table = live_roce_v2_index(sys_root, hca, port, ipv4, netdev, read)
    if index is None:
        seen = ", ".join(
            f"{i} {e['type'] or '?'} {e['ipv4'] or 'non-IPv4'}"
            for i, e in sorted(table.items(), key=lambda item: int(item[0]))
        )
        raise GidStartError(
            f"{REFUSAL_MARKER}: the GID table of {where} has no RoCE v2 entry for {ipv4} on "
            f"{netdev} (it holds: {seen or 'no used entry'}); NCCL_IB_GID_INDEX cannot be "
            f"resolved and the start does not fall back to another GID or to sockets. Fix: "
            f"check that {ipv4} is on {netdev} ('ip -4 addr show dev {netdev}') and RoCE v2 "
            f"is enabled, then run the fabric stage (--tags fabric) ({FIX})"
        )
    entry = f"RoCE v2, {ipv4} on {netdev}, {where}"
    if index != expect:
        line = (
            f"{MOVED_MARKER} from {expect} (fabric.json) to {index} (the GID table now; {entry}): "
            f"this start uses {VARIABLE}={index}; run the fabric stage (--tags fabric) so "
            f"fabric.json agrees ({FIX})"
        )
    else:
        line = f"localinference gid-start: {VARIABLE}={index} ({entry}), as fabric.json says"
    return {"index": index, "expect": expect, "moved": index != expect, "line": line}


def write_env(path: str, index: int) -> None:
    """``NCCL_IB_GID_INDEX=N`` into ``path`` (atomic: a reader never sees half a file)."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(f"{VARIABLE}={int(index)}\n")
    os.chmod(partial, 0o644)
    os.replace(partial, path)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("--sys-root", required=True)
    parser.add_argument("--hca", required=True)
    parser.add_argument("--port", required=True)
    parser.add_argument("--ipv4", required=True)
    parser.add_argument("--netdev", required=True)
    parser.add_argument("--expect", required=True)
    parser.add_argument("--env-file", required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, read: Callable[[str], str | None] = read_sysfs) -> int:
    args = _arguments(argv)
    try:
        hca = rdma_device_name("--hca", args.hca)
        port = validate.integer("--port", args.port, minimum=1, maximum=MAX_PORT)
        try:
            ipv4 = str(ipaddress.IPv4Address(args.ipv4))
        except ValueError as exc:
            raise validate.ValidationError("--ipv4", str(exc), "give the node's IPv4 cluster address") from None
        netdev = validate.interface_name("--netdev", args.netdev)
        expect = validate.integer("--expect", args.expect, minimum=0, maximum=MAX_INDEX)
        sys_root = validate.path("--sys-root", args.sys_root)
        env_file = validate.path("--env-file", args.env_file)
    except validate.ValidationError as exc:
        print(f"{REFUSAL_MARKER}: bad argument: {exc}", file=sys.stderr)
        return USAGE
    try:
        found = resolve(sys_root, hca, port, ipv4, netdev, expect, read)
        write_env(env_file, found["index"])
    except GidStartError as exc:
        print(str(exc), file=sys.stderr)
        # The last start's index must not outlive a table that no longer has one.
        try:
            os.unlink(env_file)
        except FileNotFoundError:
            pass
        except OSError as gone:
            print(f"{REFUSAL_MARKER}: cannot remove {env_file}: {gone.strerror or gone}", file=sys.stderr)
        return REFUSE
    except OSError as exc:
        print(f"{REFUSAL_MARKER}: cannot write {env_file}: {exc.strerror or exc} ({FIX})",
              file=sys.stderr)
        return REFUSE
    print(found["line"], file=sys.stderr if found["moved"] else sys.stdout)
    return OK


if __name__ == "__main__":
    sys.exit(main())
