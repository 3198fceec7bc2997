# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""LAB STAND-IN for Mellanox show_gids. Not NVIDIA's script.

The real show_gids is a shell script that reads the GID table from
/sys/class/infiniband; this one prints the same columns from the sysfs tree
given by LOCALINFERENCE_SYSFS_ROOT (default /opt/localinference-standins/sys,
where the lab installs the recorded tree).  Usage: show_gids [DEV]
"""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path

ROOT = Path(os.environ.get("LOCALINFERENCE_SYSFS_ROOT", "/opt/localinference-standins/sys"))
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def main(argv: list[str]) -> int:
    base = ROOT / "class" / "infiniband"
    devices = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
    if argv:
        devices = [d for d in devices if d == argv[0]]
    print("DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV")
    print("---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---")
    count = 0
    for dev in devices:
        for port in sorted((base / dev / "ports").iterdir(), key=lambda p: int(p.name)):
            gids = port / "gids"
            for entry in sorted(gids.iterdir(), key=lambda p: int(p.name)):
                gid = read(entry)
                if not gid or gid == ZERO:
                    continue
                kind = read(port / "gid_attrs" / "types" / entry.name)
                ver = "v2" if kind.endswith("v2") else "v1"
                ndev = read(port / "gid_attrs" / "ndevs" / entry.name)
                mapped = ipaddress.IPv6Address(gid).ipv4_mapped
                ipv4 = f"{mapped}  " if mapped else ""
                print(f"{dev}\t{port.name}\t{entry.name}\t{gid}\t\t\t{ipv4}\t{ver}\t{ndev}")
                count += 1
    print(f"n_gids_found={count}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
