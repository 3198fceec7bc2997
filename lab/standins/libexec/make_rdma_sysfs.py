# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""LAB STAND-IN: write the RoCE GID table a ConnectX-7 port would show in sysfs.

The lab kernel has no RDMA, so /sys/class/infiniband does not exist.  This
writes, under --root, the files rdma_facts and show_gids read:

  class/infiniband/<hca>/ports/1/gids/<n>
  class/infiniband/<hca>/ports/1/gid_attrs/types/<n>
  class/infiniband/<hca>/ports/1/gid_attrs/ndevs/<n>
  class/infiniband/<hca>/device/net/<netdev>/

in the layout recorded by show_gids on a real DGX Spark after IPv4 was
assigned (tests/unit/fixtures/ibv_devinfo/dgx-spark-show_gids-rows.txt):
index 0/1 the link-local GID (RoCE v1/v2), index 2/3 the IPv4-mapped GID
(RoCE v1/v2).  --ipv4-first-index N moves the IPv4 pair to N/N+1 (what a
node whose addresses were rebuilt shows: F20).  Unused slots up to 15 are
all-zero, as on a real port.

  make-rdma-sysfs --root /opt/localinference-standins/sys \\
      --port rocep1s0f0=enp1s0f0np0=10.77.0.11 --port roceP2p1s0f0=enP2p1s0f0np0
"""

from __future__ import annotations

import argparse
import ipaddress
import shutil
from pathlib import Path

# Link-local GID of the recorded Spark port (fe80::4ebb:47ff:fee8:9f39), used
# when the netdev does not exist on this host.
RECORDED_MAC = "4c:bb:47:e8:9f:39"
SLOTS = 16


def full(address: ipaddress.IPv6Address) -> str:
    """Eight groups of four hex digits, as the kernel writes GIDs (Python 3.13's
    ``exploded`` prints IPv4-mapped addresses with a dotted quad)."""
    raw = address.packed
    return ":".join(f"{raw[i]:02x}{raw[i + 1]:02x}" for i in range(0, 16, 2))


def link_local(mac: str) -> ipaddress.IPv6Address:
    octets = [int(part, 16) for part in mac.split(":")]
    octets[0] ^= 0x02
    eui = [*octets[:3], 0xFF, 0xFE, *octets[3:]]
    return ipaddress.IPv6Address(bytes([0xFE, 0x80, 0, 0, 0, 0, 0, 0, *eui]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--port", action="append", required=True, help="HCA=NETDEV[=IPV4]")
    parser.add_argument("--ipv4-first-index", type=int, default=2)
    parser.add_argument("--net-root", type=Path, default=Path("/sys/class/net"))
    args = parser.parse_args()

    base = args.root / "class" / "infiniband"
    wanted: dict[Path, str] = {}
    wanted_dirs: set[Path] = set()
    for spec in args.port:
        parts = spec.split("=")
        hca, netdev = parts[0], parts[1]
        ipv4 = parts[2] if len(parts) > 2 else None
        mac_file = args.net_root / netdev / "address"
        mac = mac_file.read_text().strip() if mac_file.exists() else RECORDED_MAC
        entries = {
            0: (full(link_local(mac)), "IB/RoCE v1"),
            1: (full(link_local(mac)), "RoCE v2"),
        }
        if ipv4:
            mapped = ipaddress.IPv6Address("::ffff:" + str(ipaddress.IPv4Address(ipv4)))
            entries[args.ipv4_first_index] = (full(mapped), "IB/RoCE v1")
            entries[args.ipv4_first_index + 1] = (full(mapped), "RoCE v2")
        port = base / hca / "ports" / "1"
        wanted_dirs.add(base / hca / "device" / "net" / netdev)
        for index in range(max(SLOTS, args.ipv4_first_index + 2)):
            gid, kind = entries.get(index, ("0000:0000:0000:0000:0000:0000:0000:0000", None))
            wanted[port / "gids" / str(index)] = gid + "\n"
            if kind:
                wanted[port / "gid_attrs" / "types" / str(index)] = kind + "\n"
                wanted[port / "gid_attrs" / "ndevs" / str(index)] = netdev + "\n"
    changed = sync(base, wanted, wanted_dirs)
    # One word on stdout so that Ansible can report changed/ok truthfully.
    print("CHANGED" if changed else "UNCHANGED")


def sync(base: Path, wanted: dict[Path, str], wanted_dirs: set[Path]) -> bool:
    """Make the tree under ``base`` exactly ``wanted``; True when anything changed."""
    changed = False
    if base.exists():
        keep = set(wanted) | wanted_dirs
        keep |= {parent for path in keep for parent in path.parents}
        for path in sorted(base.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path not in keep:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                changed = True
    for directory in wanted_dirs:
        if not directory.is_dir():
            directory.mkdir(parents=True)
            changed = True
    for path, content in wanted.items():
        if not path.exists() or path.read_text() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            changed = True
    return changed


if __name__ == "__main__":
    main()
