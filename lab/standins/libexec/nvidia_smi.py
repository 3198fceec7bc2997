# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""LAB STAND-IN for nvidia-smi. Not NVIDIA's tool.

The lab has no GPU. This prints output recorded on real hardware, for one of
two profiles (see ../README.md and tests/unit/fixtures/README.md):

  gb10               DGX Spark (GB10, unified memory): ../recorded/nvidia-smi-gb10-table.txt
  rtx_pro_6000_pair  2 x RTX PRO 6000 Blackwell Max-Q in one host:
                     ../recorded/nvidia-smi-rtx-pro-6000-maxq-x2-table.txt, with the
                     full product names and the UUIDs from the two query outputs
                     recorded on the same host

The profile is $LOCALINFERENCE_STANDIN_GPU, else the first word of
../gpu-profile (written by lab/standins/install.yml), else gb10.

  nvidia-smi                                      -> the recorded table, verbatim
  nvidia-smi --query-gpu=F1,F2,... --format=csv[,noheader][,nounits]
                                                  -> the recorded values for the fields
                                                     asked, one row per GPU
  nvidia-smi -q -x                                -> the recorded values in the element
                                                     layout of nvidia-smi -q -x

Fields the recordings do not contain print [N/A]. Unified memory (GB10)
prints [N/A] memory, as the real tool does. The RTX PRO 6000 recording gives
used and total memory per card; free is total - used (the real tool reports a
few hundred MiB less: the driver's reserved memory, not recorded). No real -q -x
dump of either machine was available: the XML is synthesised from the same
recorded values. Anything else exits 2 with a message naming this file as a
stand-in.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
RECORDED = HERE / "recorded"
PROFILE_FILE = HERE / "gpu-profile"
PROFILES = {
    "gb10": {"table": "nvidia-smi-gb10-table.txt"},
    "rtx_pro_6000_pair": {
        "table": "nvidia-smi-rtx-pro-6000-maxq-x2-table.txt",
        "names": "nvidia-smi-rtx-pro-6000-maxq-x2-query-name-compute_cap.csv",
        "uuids": "nvidia-smi-rtx-pro-6000-maxq-x2-query-index-uuid.csv",
    },
}
_VERSIONS = re.compile(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)")
_ROW = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|\s+([0-9A-Fa-f:.]+)\s")
_MEMORY = re.compile(r"\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|")
_MEMORY_FIELDS = ("memory.total", "memory.used", "memory.free", "memory.reserved")


def profile() -> str:
    name = os.environ.get("LOCALINFERENCE_STANDIN_GPU", "").strip()
    if not name and PROFILE_FILE.is_file():
        words = PROFILE_FILE.read_text().split()
        name = words[0] if words else ""
    name = name or "gb10"
    if name not in PROFILES:
        sys.exit(f"stand-in nvidia-smi: unknown profile {name!r} (known: {', '.join(PROFILES)})")
    return name


def _csv_column(path: Path, column: str) -> list[str]:
    """One column of a recorded ``--format=csv`` output (with its header)."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    header = [cell.strip() for cell in lines[0].split(",")]
    where = header.index(column)
    return [row.split(",")[where].strip() for row in lines[1:]]


def recorded_values(name: str) -> tuple[str, list[dict[str, str]]]:
    """(the recorded table, one dict of query fields per GPU)."""
    files = PROFILES[name]
    table = (RECORDED / files["table"]).read_text()
    versions = _VERSIONS.search(table)
    if not versions:
        sys.exit(f"stand-in nvidia-smi: {files['table']} is not a recorded nvidia-smi table")
    lines = table.splitlines()
    gpus = []
    for number, line in enumerate(lines):
        row = _ROW.match(line)
        if not row:
            continue
        memory = _MEMORY.search(lines[number + 1]) if number + 1 < len(lines) else None
        gpu = {
            "index": row.group(1),
            "name": row.group(2),
            "pci.bus_id": row.group(3),
            "driver_version": versions.group(1),
            "cuda_version": versions.group(2),
            # No memory in the table: unified memory (GB10), [N/A] as the real tool prints.
            **dict.fromkeys(_MEMORY_FIELDS, "[N/A]"),
        }
        if memory:
            used, total = int(memory.group(1)), int(memory.group(2))
            gpu |= {
                "memory.total": f"{total} MiB",
                "memory.used": f"{used} MiB",
                "memory.free": f"{total - used} MiB",
            }
        gpus.append(gpu)
    if not gpus:
        sys.exit(f"stand-in nvidia-smi: no GPU row in {files['table']}")
    # The table truncates long names ("NVIDIA RTX PRO 6000 Blac..."): the query output has them whole.
    for key, field in (("names", "name"), ("uuids", "uuid")):
        if key in files:
            for gpu, value in zip(gpus, _csv_column(RECORDED / files[key], field), strict=True):
                gpu[field] = value
    return table, gpus


def query_csv(gpus: list[dict[str, str]], fields: list[str], options: set[str]) -> str:
    lines = []
    if "noheader" not in options:
        header = []
        for field in fields:
            unit = " [MiB]" if field.startswith("memory.") and "nounits" not in options else ""
            header.append(field + unit)
        lines.append(", ".join(header))
    for gpu in gpus:
        values = []
        for field in fields:
            value = gpu.get(field, "[N/A]")
            if "nounits" in options and value.endswith(" MiB"):
                value = value[: -len(" MiB")]
            values.append(value)
        lines.append(", ".join(values))
    return "\n".join(lines) + "\n"


def _xml_memory(value: str) -> str:
    return "N/A" if value == "[N/A]" else value


def query_xml(gpus: list[dict[str, str]]) -> str:
    first = gpus[0]
    out = [
        '<?xml version="1.0" ?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">',
        "<nvidia_smi_log>",
        f"\t<driver_version>{first['driver_version']}</driver_version>",
        f"\t<cuda_version>{first['cuda_version']}</cuda_version>",
        f"\t<attached_gpus>{len(gpus)}</attached_gpus>",
    ]
    for gpu in gpus:
        out += [
            f'\t<gpu id="{gpu["pci.bus_id"]}">',
            f"\t\t<product_name>{gpu['name']}</product_name>",
            f"\t\t<uuid>{_xml_memory(gpu.get('uuid', '[N/A]'))}</uuid>",
            f"\t\t<minor_number>{gpu['index']}</minor_number>",
            "\t\t<fb_memory_usage>",
            f"\t\t\t<total>{_xml_memory(gpu['memory.total'])}</total>",
            f"\t\t\t<reserved>{_xml_memory(gpu['memory.reserved'])}</reserved>",
            f"\t\t\t<used>{_xml_memory(gpu['memory.used'])}</used>",
            f"\t\t\t<free>{_xml_memory(gpu['memory.free'])}</free>",
            "\t\t</fb_memory_usage>",
            "\t</gpu>",
        ]
    out.append("</nvidia_smi_log>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    table, gpus = recorded_values(profile())
    if not argv:
        sys.stdout.write(table)
        return 0
    if argv in (["-q", "-x"], ["-x", "-q"]):
        sys.stdout.write(query_xml(gpus))
        return 0
    query = [arg for arg in argv if arg.startswith("--query-gpu=")]
    fmt = [arg for arg in argv if arg.startswith("--format=")]
    if query and fmt and fmt[0].split("=", 1)[1].split(",")[0] == "csv":
        fields = [field.strip() for field in query[0].split("=", 1)[1].split(",")]
        options = set(fmt[0].split("=", 1)[1].split(",")[1:])
        sys.stdout.write(query_csv(gpus, fields, options))
        return 0
    sys.stderr.write(
        f"lab stand-in nvidia-smi ({__file__}): arguments {argv} have no recorded output\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
