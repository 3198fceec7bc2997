#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_facts
short_description: Read NVIDIA GPU facts from nvidia-smi, with unified-memory fallback
version_added: 0.2.0
description:
  - Runs C(nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,memory.free,pci.bus_id,driver_version --format=csv)
    (or C(nvidia-smi -q -x)) and the plain C(nvidia-smi) table for the CUDA version.
  - GPUs that report no framebuffer memory (DGX Spark GB10 prints C([N/A]) and C(Not Supported)) are unified-memory
    parts; their memory is taken from O(meminfo_path) (C(MemTotal), C(MemAvailable)) and marked C(unified_memory=true).
  - Results are returned under C(ansible_facts.gpu).
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.FACTS
  - localinference.vllm.node
  - localinference.vllm.node.REQUIRED
options:
  nvidia_smi:
    description:
      - Name or path of the C(nvidia-smi) executable.
    type: str
    default: nvidia-smi
  source:
    description:
      - Which machine-readable form to read.
      - V(csv) uses C(--query-gpu ... --format=csv); V(xml) uses C(-q -x).
    type: str
    choices: [csv, xml]
    default: csv
  meminfo_path:
    description:
      - Where to read C(/proc/meminfo) for unified-memory GPUs.
    type: path
    default: /proc/meminfo
  timeout:
    default: 30
notes:
  - Commands run with C(LC_ALL=C).
"""

EXAMPLES = r"""
- name: Read GPU facts on every node
  localinference.vllm.gpu_facts:

- name: A node without a GPU is an error here
  localinference.vllm.gpu_facts:
    required: true

- name: Show the free memory the weakest GPU offers
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpu.min_free_memory_mib }} MiB ({{ 'unified' if ansible_facts.gpu.unified_memory else 'dedicated' }})"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    gpu:
      description: GPU facts.
      returned: always
      type: dict
      contains:
        present:
          description: Whether at least one GPU was found.
          type: bool
          sample: true
        absent_reason:
          description: Why no GPU was found (only when O(required=false) and none was).
          type: str
          returned: when present is false
          sample: nvidia-smi not found in PATH
        count:
          description: Number of GPUs.
          type: int
          sample: 1
        driver_version:
          description: NVIDIA driver version.
          type: str
          sample: "580.173.02"
        cuda_version:
          description: Highest CUDA version the driver supports (from the table header).
          type: str
          sample: "13.0"
        unified_memory:
          description: Whether any GPU reported no framebuffer memory (GB10) and uses the system pool.
          type: bool
          sample: true
        total_memory_mib:
          description: Memory across GPUs in MiB; for unified memory the single shared pool.
          type: int
          sample: 122880
        min_free_memory_mib:
          description: Lowest free memory of any GPU in MiB (for unified memory, C(MemAvailable)).
          type: int
          sample: 111390
        gpus:
          description: One entry per GPU.
          type: list
          elements: dict
          sample:
            - index: 0
              name: NVIDIA GB10
              uuid: null
              pci_bus_id: "0000000F:01:00.0"
              driver_version: "580.173.02"
              memory_total_mib: 122880
              memory_used_mib: 11490
              memory_free_mib: 111390
              memory_source: /proc/meminfo
              unified_memory: true
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    run_facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._gpu_gather import (
    WHEN_ABSENT,
    facts,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "source": {"type": "str", "choices": ["csv", "xml"], "default": "csv"},
            "meminfo_path": {"type": "path", "default": "/proc/meminfo"},
            "required": {"type": "bool", "default": False},
            "timeout": {"type": "float", "default": 30.0},
        },
        supports_check_mode=True,
    )
    run_facts(module, "gpu", lambda runner: facts(module, runner), absent=WHEN_ABSENT)


if __name__ == "__main__":
    main()
