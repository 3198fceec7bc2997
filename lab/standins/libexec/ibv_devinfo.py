# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""LAB STAND-IN for ibv_devinfo on a DGX Spark (ConnectX-7). Not rdma-core's tool.

The lab kernel has no RDMA. This prints the ibv_devinfo output recorded on a
real DGX Spark with the cable in port 0 (rocep1s0f0 and its PCIe twin
roceP2p1s0f0 PORT_ACTIVE, active_mtu 4096, link_layer Ethernet; see
tests/unit/fixtures/README.md).  ``-d DEV`` selects one device as the real tool
does.  ``-v`` prints the same recorded text: no complete ConnectX-7 ``-v`` dump
was available, and the fields the collection reads (state, max_mtu,
active_mtu, link_layer) are identical in both forms.  The GID table comes from
the sysfs stand-in tree (see lab/standins/README.md), as on a real node.
"""

from __future__ import annotations

import sys
from pathlib import Path

RECORDED = Path(__file__).resolve().parent.parent / "recorded" / "ibv_devinfo-dgx-spark-cx7.txt"


def main(argv: list[str]) -> int:
    blocks = [block for block in RECORDED.read_text().split("\n\n") if block.strip()]
    device = None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-v", "-vv", "--verbose"):
            continue
        if arg in ("-d", "--ib-dev") and args:
            device = args.pop(0)
        elif arg.startswith("--ib-dev="):
            device = arg.split("=", 1)[1]
        else:
            sys.stderr.write(
                f"lab stand-in ibv_devinfo ({__file__}): argument {arg!r} has no recorded output\n"
            )
            return 2
    if device is not None:
        blocks = [block for block in blocks if block.splitlines()[0].split("\t")[-1] == device]
        if not blocks:
            sys.stderr.write(f"IB device '{device}' wasn't found\n")
            return 255
    sys.stdout.write("\n\n".join(block.rstrip("\n") for block in blocks) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
