# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPUs nvidia-smi reports (module_utils/preflight/_gpu_gather.py), and its absence.

A node without nvidia-smi, or one whose nvidia-smi fails, is Absent (the module answers it by
``required``); WHEN_ABSENT's facts say why and list no GPU. Real nvidia-smi output is
test_gpu_facts.py's; the module is tests/unit/plugins/modules/test_gpu_facts.py's.
"""

from __future__ import annotations

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import Runner
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import Absent
from ansible_collections.localinference.vllm.plugins.module_utils.preflight import _gpu_gather
from ansible_collections.localinference.vllm.tests.unit.module_helper import FakeModule


def params(binary: str) -> dict:
    return {"nvidia_smi": binary, "source": "csv", "meminfo_path": "/proc/meminfo", "required": False,
            "timeout": 30.0}


def test_no_nvidia_smi_is_absent(tmp_path):
    with pytest.raises(Absent, match="nvidia-smi not found in PATH"):
        _gpu_gather.facts(FakeModule(params("nvidia-smi")), Runner(30))
    with pytest.raises(Absent, match="not found in PATH"):
        _gpu_gather.facts(FakeModule(params(str(tmp_path / "nvidia-smi"))), Runner(30))


def test_a_failing_nvidia_smi_is_absent_with_its_output(tmp_path):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n")
    script.chmod(0o755)
    with pytest.raises(Absent, match="failed with rc=9: NVIDIA-SMI has failed"):
        _gpu_gather.facts(FakeModule(params(str(script))), Runner(30))


def test_the_absent_facts_say_why_and_list_no_gpu():
    facts = _gpu_gather.WHEN_ABSENT.facts("nvidia-smi not found in PATH")
    assert facts["absent_reason"] == "nvidia-smi not found in PATH"
    assert facts["gpus"] == [] and _gpu_gather.WHEN_ABSENT.name == "gpu_facts"
