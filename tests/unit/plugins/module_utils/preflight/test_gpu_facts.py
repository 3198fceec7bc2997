# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._gpu_facts import (
    NvidiaSmiParseError,
    build_facts,
    memory_mib,
    merge_table,
    parse_query_csv,
    parse_table,
    parse_xml,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    parse_meminfo,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("143771 MiB", 143771),
        ("0 MiB", 0),
        ("143771", 143771),
        ("2 GiB", 2048),
        ("[N/A]", None),
        ("N/A", None),
        ("Not Supported", None),
        ("[Not Supported]", None),
        (None, None),
    ],
)
def test_memory_mib(value, expected):
    assert memory_mib(value) == expected


def test_memory_mib_rejects_garbage():
    with pytest.raises(NvidiaSmiParseError):
        memory_mib("lots")


def test_h200_csv_with_header_and_units():
    gpus = parse_query_csv(fixture("nvidia-smi/h200-query-gpu.csv"))
    assert gpus == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "uuid": "GPU-00000000-1111-2222-3333-444444444444",
            "pci_bus_id": "00000000:00:06.0",
            "driver_version": "580.159.04",
            "memory_total_mib": 143771,
            "memory_used_mib": 0,
            "memory_free_mib": 143156,
        }
    ]


def test_gb10_csv_without_header_uses_requested_fields():
    gpus = parse_query_csv(
        fixture("nvidia-smi/gb10-query-name-memtotal-driver-noheader.csv"),
        fields=("name", "memory.total", "driver_version"),
    )
    assert gpus[0]["name"] == "NVIDIA GB10"
    assert gpus[0]["memory_total_mib"] is None
    assert gpus[0]["driver_version"] == "580.126.09"
    assert gpus[0]["index"] == 0


def test_csv_column_count_mismatch_is_an_error():
    with pytest.raises(NvidiaSmiParseError, match="row 1 has 2 values"):
        parse_query_csv("NVIDIA GB10, [N/A]\n")


@pytest.mark.parametrize(
    ("name", "driver", "cuda", "bus", "total", "used"),
    [
        ("nvidia-smi/h200-table.txt", "580.159.04", "13.0", "00000000:00:06.0", 143771, 0),
        ("nvidia-smi/gb10-table.txt", "580.173.02", "13.0", "0000000F:01:00.0", None, None),
    ],
)
def test_table(name, driver, cuda, bus, total, used):
    table = parse_table(fixture(name))
    assert table["driver_version"] == driver
    assert table["cuda_version"] == cuda
    assert len(table["gpus"]) == 1
    gpu = table["gpus"][0]
    assert gpu["pci_bus_id"] == bus
    assert gpu["memory_total_mib"] == total
    assert gpu["memory_used_mib"] == used


def test_table_two_rtx_pro_6000_max_q():
    """Two cards in one host (seed 002's machine class): one row each, the name truncated."""
    table = parse_table(fixture("nvidia-smi/rtx-pro-6000-maxq-x2-table.txt"))
    assert (table["driver_version"], table["cuda_version"]) == ("595.71.05", "13.2")
    rows = [
        (g["index"], g["name"], g["pci_bus_id"], g["memory_total_mib"], g["memory_used_mib"])
        for g in table["gpus"]
    ]
    assert rows == [
        (0, "NVIDIA RTX PRO 6000 Blac...", "00000000:11:00.0", 97887, 15),
        (1, "NVIDIA RTX PRO 6000 Blac...", "00000000:F1:00.0", 97887, 122),
    ]
    facts = build_facts(table["gpus"], table["driver_version"], table["cuda_version"], None)
    assert facts["count"] == 2 and facts["unified_memory"] is False
    assert facts["total_memory_mib"] == 2 * 97887
    assert [g["memory_free_mib"] for g in facts["gpus"]] == [97872, 97765]
    assert facts["min_free_memory_mib"] == 97765


def test_table_without_header_is_an_error():
    with pytest.raises(NvidiaSmiParseError, match="Driver Version"):
        parse_table("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_h200_xml():
    parsed = parse_xml(fixture("nvidia-smi/h200-q-x.xml"))
    assert parsed["driver_version"] == "580.159.04"
    assert parsed["cuda_version"] == "13.0"
    gpu = parsed["gpus"][0]
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["memory_total_mib"] == 143771
    assert gpu["memory_free_mib"] == 143156
    assert gpu["pci_bus_id"] == "00000000:00:06.0"


def test_xml_garbage():
    with pytest.raises(NvidiaSmiParseError):
        parse_xml("not xml")


def test_h200_facts_use_dedicated_memory():
    gpus = merge_table(
        parse_query_csv(fixture("nvidia-smi/h200-query-gpu.csv")),
        parse_table(fixture("nvidia-smi/h200-table.txt")),
    )
    facts = build_facts(gpus, "580.159.04", "13.0", None)
    assert facts["unified_memory"] is False
    assert facts["min_free_memory_mib"] == 143156
    assert facts["total_memory_mib"] == 143771
    assert facts["gpus"][0]["memory_source"] == "nvidia-smi"


def test_gb10_falls_back_to_meminfo():
    meminfo = parse_meminfo(fixture("proc/meminfo-controller.txt"))
    gpus = merge_table(
        parse_query_csv(
            fixture("nvidia-smi/gb10-query-name-memtotal-driver-noheader.csv"),
            fields=("name", "memory.total", "driver_version"),
        ),
        parse_table(fixture("nvidia-smi/gb10-table.txt")),
    )
    facts = build_facts(gpus, "580.173.02", "13.0", meminfo)
    gpu = facts["gpus"][0]
    assert gpu["unified_memory"] is True
    assert gpu["memory_source"] == "/proc/meminfo"
    assert gpu["memory_total_mib"] == meminfo["MemTotal"] // 1024
    assert gpu["memory_free_mib"] == meminfo["MemAvailable"] // 1024
    assert gpu["pci_bus_id"] == "0000000F:01:00.0"  # filled from the table
    assert facts["min_free_memory_mib"] == meminfo["MemAvailable"] // 1024
    assert facts["total_memory_mib"] == meminfo["MemTotal"] // 1024


def test_unified_memory_without_meminfo_is_none_not_a_crash():
    facts = build_facts(
        [
            {
                "index": 0,
                "name": "NVIDIA GB10",
                "uuid": None,
                "pci_bus_id": None,
                "driver_version": None,
                "memory_total_mib": None,
                "memory_used_mib": None,
                "memory_free_mib": None,
            }
        ],
        "580",
        "13.0",
        None,
    )
    assert facts["min_free_memory_mib"] is None
    assert facts["gpus"][0]["memory_source"] is None
