#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: host_stack_facts
short_description: Gather the host-stack evidence preflight judges (kernel, CMA, NCCL, clock, disk, memlock)
version_added: 0.2.0
description:
  - Reads the kernel release, C(/proc/cmdline) and the C(CmaTotal)/C(CmaFree) lines of C(/proc/meminfo) (F21), the
    RDMA devices under C(<sys_root>/class/infiniband), C(timedatectl show) and C(chronyc -n tracking) (F24),
    systemd's C(DefaultLimitMEMLOCK) and the serving unit's C(LimitMEMLOCK) (F26), and the free space and weights
    already present where the weights land, with the size of their manifest when the node holds one (F25).
  - Lists the NCCL libraries of the engine's own environment (F22) without a GPU, by running a small program with
    the engine's Python - O(engine_python) on the node, or inside O(engine_image) with
    C(podman run --rm --network=none --pull=never) - that prints C(pip freeze) lines of the C(nvidia-nccl) wheels,
    the C(libnccl.so*) files with their link targets, C(ldconfig -p), C(dpkg-query -l libnccl*) and the
    C(LD_PRELOAD), C(LD_LIBRARY_PATH) and C(VLLM_NCCL_SO_PATH) the engine sees.
  - Every command runs with a timeout and the C locale; a command that is missing, fails or times out is noted
    in RV(ansible_facts.host_stack.notes) and its evidence left empty, so a wedged daemon never hangs preflight.
  - The judgement is C(plugins/module_utils/preflight/_host_stack.py), through the C(preflight_rank) filter.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.FACTS
  - localinference.vllm.node.PROC_ROOT
  - localinference.vllm.node.SYS_ROOT
options:
  weights_path:
    description:
      - The directory the weights land in (a Hugging Face snapshot directory); it need not exist yet.
      - The free space is measured on the filesystem of its nearest existing parent.
    type: path
  weights_manifest:
    description:
      - The weights' manifest (from C(localinference.vllm.model_manifest)).
      - Defaults to C(<repo>/localinference-manifests/<revision>.json) beside O(weights_path).
    type: path
  engine_python:
    description:
      - The engine's Python on the node (systemd mode, for example C(/opt/localinference/vllm-0.32.0/bin/python)).
      - Ignored when O(engine_image) is set; nothing is listed when neither exists on the node.
    type: path
  engine_image:
    description:
      - The engine's container image (Quadlet mode). Listed only when the image is already on the node.
    type: str
  engine_entrypoint:
    description:
      - The image's vLLM entrypoint; the Python beside it (C(<dir>/python3)) runs the listing, or C(python3) when
        it is not a path.
    type: str
    default: vllm
  engine_env:
    description:
      - C(LD_PRELOAD), C(LD_LIBRARY_PATH) and C(VLLM_NCCL_SO_PATH) the engine is started with (other keys are
        ignored).
    type: dict
    default: {}
  inspect_engine:
    description:
      - List the engine's NCCL libraries.
    type: bool
    default: true
  unit:
    description:
      - The serving unit whose C(LimitMEMLOCK) is read when it exists.
    type: str
    default: localinference-vllm.service
  timeout:
    description:
      - Seconds each command may take.
    type: float
    default: 10
  engine_timeout:
    description:
      - Seconds the engine listing may take (a container start included).
    type: float
    default: 120
notes:
  - In Quadlet mode the listing starts a throw-away container (C(--rm), no network); nothing on the node changes.
"""

EXAMPLES = r"""
- name: Gather the host-stack evidence
  localinference.vllm.host_stack_facts:
    weights_path: /srv/models/hub/models--org--name/snapshots/5eed0c0ffee0000000000000000000000000000a
    engine_image: registry.example/vllm@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    engine_entrypoint: /opt/vllm/bin/vllm
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    host_stack:
      description: The recorded evidence (texts as the commands printed them).
      returned: always
      type: dict
      contains:
        kernel_release:
          description: C(uname -r).
          type: str
        machine:
          description: C(uname -m).
          type: str
        cmdline:
          description: C(/proc/cmdline).
          type: str
        meminfo_cma:
          description: The C(Cma*) lines of C(/proc/meminfo) (empty on kernels without CMA).
          type: str
        rdma_devices:
          description: RDMA devices under C(<sys_root>/class/infiniband).
          type: list
          elements: str
        clock:
          description: C(timedatectl) (output of C(timedatectl show)) and C(chronyc) (of C(chronyc -n tracking)); null when not available.
          type: dict
        memlock:
          description:
            - C(manager) (systemd's C(DefaultLimitMEMLOCK*)), C(unit) (the unit's C(LimitMEMLOCK*), when it exists)
              and C(process) (the C(Max locked memory) line of the module's own limits).
          type: dict
        engine:
          description: C(source) (C(venv), C(image) or C(none)), C(where), C(probe) (the listing's output) and C(error).
          type: dict
        disk:
          description: C(path), C(measured_at), C(free_bytes), C(present_bytes), C(manifest) and C(manifest_bytes) (null without a manifest).
          type: dict
        notes:
          description: Evidence that could not be gathered, and why.
          type: list
          elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    run_facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._host_stack_gather import (
    facts,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "proc_root": {"type": "path", "default": "/proc"},
            "sys_root": {"type": "path", "default": "/sys"},
            "weights_path": {"type": "path"},
            "weights_manifest": {"type": "path"},
            "engine_python": {"type": "path"},
            "engine_image": {"type": "str"},
            "engine_entrypoint": {"type": "str", "default": "vllm"},
            "engine_env": {"type": "dict", "default": {}},
            "inspect_engine": {"type": "bool", "default": True},
            "unit": {"type": "str", "default": "localinference-vllm.service"},
            "timeout": {"type": "float", "default": 10.0},
            "engine_timeout": {"type": "float", "default": 120.0},
        },
        supports_check_mode=True,
    )
    run_facts(
        module, "host_stack", lambda runner: facts(module, runner), ("timeout", "engine_timeout")
    )


if __name__ == "__main__":
    main()
