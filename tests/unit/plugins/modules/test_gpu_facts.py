# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_facts end to end: the module runs the lab's GB10 stand-in (which prints a
recorded GB10 output) and a recorded H200 through a one-line printer."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest
from ansible_collections.localinference.vllm.plugins.modules import gpu_facts
from ansible_collections.localinference.vllm.tests.unit.module_helper import run_module

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = ROOT / "tests" / "unit" / "fixtures"
STANDIN = ROOT / "lab" / "standins" / "bin" / "nvidia-smi"
QUERY = (
    "--query-gpu=index,name,uuid,memory.total,memory.used,memory.free,pci.bus_id,driver_version"
    " --format=csv"
)


@pytest.fixture
def h200_smi(tmp_path: Path) -> Path:
    """A fake nvidia-smi that prints the recorded H200 outputs for the exact argv the module uses."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in\n'
        f'  "") cat {FIXTURES}/nvidia-smi/h200-table.txt ;;\n'
        f'  "{QUERY}") cat {FIXTURES}/nvidia-smi/h200-query-gpu.csv ;;\n'
        f'  "-q -x") cat {FIXTURES}/nvidia-smi/h200-q-x.xml ;;\n'
        '  *) echo "unexpected argv: $*" >&2; exit 9 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.parametrize("source", ["csv", "xml"])
def test_gb10_standin_unified_memory(source):
    meminfo = FIXTURES / "proc" / "meminfo-controller.txt"
    result = run_module(
        gpu_facts, {"nvidia_smi": str(STANDIN), "source": source, "meminfo_path": str(meminfo)}
    )
    assert not result.failed, result.result
    gpu = result.result["ansible_facts"]["gpu"]
    assert result.result["changed"] is False
    assert gpu["present"] is True
    assert gpu["unified_memory"] is True
    assert gpu["driver_version"] == "580.173.02"
    assert gpu["cuda_version"] == "13.0"
    assert gpu["gpus"][0]["name"] == "NVIDIA GB10"
    assert gpu["gpus"][0]["memory_source"] == "/proc/meminfo"
    assert gpu["min_free_memory_mib"] == 24039792 // 1024


@pytest.mark.parametrize("source", ["csv", "xml"])
def test_h200_dedicated_memory(h200_smi, source):
    result = run_module(gpu_facts, {"nvidia_smi": str(h200_smi), "source": source}, check_mode=True)
    assert not result.failed, result.result
    gpu = result.result["ansible_facts"]["gpu"]
    assert gpu["unified_memory"] is False
    assert gpu["min_free_memory_mib"] == 143156
    assert gpu["gpus"][0]["uuid"] == "GPU-00000000-1111-2222-3333-444444444444"


@pytest.mark.parametrize("source", ["csv", "xml"])
def test_rtx_pro_6000_pair_standin(monkeypatch, source):
    """The lab's one-host stand-in: two discrete cards, full names and UUIDs from the recording."""
    monkeypatch.setenv("LOCALINFERENCE_STANDIN_GPU", "rtx_pro_6000_pair")
    result = run_module(gpu_facts, {"nvidia_smi": str(STANDIN), "source": source})
    assert not result.failed, result.result
    gpu = result.result["ansible_facts"]["gpu"]
    assert (gpu["count"], gpu["unified_memory"]) == (2, False)
    assert (gpu["driver_version"], gpu["cuda_version"]) == ("595.71.05", "13.2")
    assert [g["name"] for g in gpu["gpus"]] == [
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    ] * 2
    assert [g["uuid"] for g in gpu["gpus"]] == [
        "GPU-23b4975b-2171-ea56-f5f7-f78bf0cd300a",
        "GPU-d0b27d44-e215-eeda-b053-6a2342e854c5",
    ]
    assert [g["pci_bus_id"] for g in gpu["gpus"]] == ["00000000:11:00.0", "00000000:F1:00.0"]
    assert [g["memory_free_mib"] for g in gpu["gpus"]] == [97872, 97765]
    assert gpu["min_free_memory_mib"] == 97765


def test_standin_refuses_an_unknown_profile(monkeypatch):
    monkeypatch.setenv("LOCALINFERENCE_STANDIN_GPU", "h100")
    result = run_module(gpu_facts, {"nvidia_smi": str(STANDIN), "required": True})
    assert result.failed
    assert "unknown profile 'h100'" in result.result["msg"], result.result


def test_missing_binary_optional_and_required(tmp_path):
    missing = str(tmp_path / "no-such-nvidia-smi")
    result = run_module(gpu_facts, {"nvidia_smi": missing})
    assert not result.failed
    assert result.result["ansible_facts"]["gpu"]["present"] is False
    result = run_module(gpu_facts, {"nvidia_smi": missing, "required": True})
    assert result.failed
    assert "required=true" in result.result["msg"]


def test_unreadable_meminfo_for_unified_memory_is_a_clear_error(tmp_path):
    result = run_module(
        gpu_facts, {"nvidia_smi": str(STANDIN), "meminfo_path": str(tmp_path / "nope")}
    )
    assert result.failed
    assert "unified memory" in result.result["msg"]


@pytest.mark.parametrize("required", [False, True])
def test_wedged_nvidia_smi_fails_by_the_timeout(tmp_path, required):
    """A driver stuck in the kernel must not hang preflight, even with required=false."""
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nsleep 60\n")
    script.chmod(0o755)
    started = time.monotonic()
    result = run_module(
        gpu_facts, {"nvidia_smi": str(script), "timeout": 0.5, "required": required}
    )
    elapsed = time.monotonic() - started
    print(f"wedged nvidia-smi failed after {elapsed:.2f} s")
    assert result.failed
    assert result.result["msg"].startswith("nvidia-smi did not answer within 0.5 s")
    assert "GPU driver may be wedged" in result.result["msg"]
    assert result.result["cmd"] == [str(script)]
    assert elapsed < 10


@pytest.mark.parametrize("timeout", [0, -5, float("inf"), float("nan")])
def test_bad_timeout(timeout):
    result = run_module(gpu_facts, {"timeout": timeout})
    assert result.failed and result.result["msg"].startswith("timeout must be")
