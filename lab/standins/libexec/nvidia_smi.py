# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""LAB STAND-IN for nvidia-smi on a DGX Spark (GB10). Not NVIDIA's tool.

The lab has no GPU. This prints the output recorded on a real GB10
(../recorded/nvidia-smi-gb10-table.txt, see tests/unit/fixtures/README.md):

  nvidia-smi                                      -> the recorded table, verbatim
  nvidia-smi --query-gpu=F1,F2,... --format=csv[,noheader][,nounits]
                                                  -> the recorded GB10 values for the
                                                     fields asked, memory as [N/A]
  nvidia-smi -q -x                                -> the recorded GB10 values in the
                                                     element layout of nvidia-smi -q -x

Fields the recordings do not contain (uuid, ...) print [N/A].  Anything else
exits 2 with a message naming this file as a stand-in.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

RECORDED = Path(__file__).resolve().parent.parent / "recorded" / "nvidia-smi-gb10-table.txt"


def recorded_values(table: str) -> dict[str, str]:
    versions = re.search(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)", table)
    row = re.search(r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|\s+([0-9A-Fa-f:.]+)\s", table, re.M)
    if not versions or not row:
        sys.exit(f"stand-in nvidia-smi: {RECORDED} is not a recorded nvidia-smi table")
    return {
        "index": row.group(1),
        "name": row.group(2),
        "pci.bus_id": row.group(3),
        "driver_version": versions.group(1),
        "cuda_version": versions.group(2),
        # GB10 is unified memory: the real tool prints [N/A] for all of these.
        "memory.total": "[N/A]",
        "memory.used": "[N/A]",
        "memory.free": "[N/A]",
        "memory.reserved": "[N/A]",
    }


def query_csv(values: dict[str, str], fields: list[str], options: set[str]) -> str:
    lines = []
    if "noheader" not in options:
        header = []
        for field in fields:
            unit = " [MiB]" if field.startswith("memory.") and "nounits" not in options else ""
            header.append(field + unit)
        lines.append(", ".join(header))
    lines.append(", ".join(values.get(field, "[N/A]") for field in fields))
    return "\n".join(lines) + "\n"


def query_xml(values: dict[str, str]) -> str:
    return f"""<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">
<nvidia_smi_log>
\t<driver_version>{values["driver_version"]}</driver_version>
\t<cuda_version>{values["cuda_version"]}</cuda_version>
\t<attached_gpus>1</attached_gpus>
\t<gpu id="{values["pci.bus_id"]}">
\t\t<product_name>{values["name"]}</product_name>
\t\t<uuid>N/A</uuid>
\t\t<minor_number>{values["index"]}</minor_number>
\t\t<fb_memory_usage>
\t\t\t<total>N/A</total>
\t\t\t<reserved>N/A</reserved>
\t\t\t<used>N/A</used>
\t\t\t<free>N/A</free>
\t\t</fb_memory_usage>
\t</gpu>
</nvidia_smi_log>
"""


def main(argv: list[str]) -> int:
    table = RECORDED.read_text()
    if not argv:
        sys.stdout.write(table)
        return 0
    values = recorded_values(table)
    if argv in (["-q", "-x"], ["-x", "-q"]):
        sys.stdout.write(query_xml(values))
        return 0
    query = [arg for arg in argv if arg.startswith("--query-gpu=")]
    fmt = [arg for arg in argv if arg.startswith("--format=")]
    if query and fmt and fmt[0].split("=", 1)[1].split(",")[0] == "csv":
        fields = [field.strip() for field in query[0].split("=", 1)[1].split(",")]
        options = set(fmt[0].split("=", 1)[1].split(",")[1:])
        sys.stdout.write(query_csv(values, fields, options))
        return 0
    sys.stderr.write(
        f"lab stand-in nvidia-smi ({__file__}): arguments {argv} have no recorded output\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
