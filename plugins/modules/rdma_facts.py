#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: rdma_facts
short_description: Read RDMA port state, MTU, link layer and the RoCE v2 GID index per port
version_added: 0.2.0
description:
  - Runs C(ibv_devinfo -v) for port state, C(max_mtu)/C(active_mtu) and link layer, and reads the GID table from
    sysfs (C(<sys_root>/class/infiniband/<hca>/ports/<n>/gids/*), C(gid_attrs/types/*), C(gid_attrs/ndevs/*)).
  - For each port it resolves the network device and the lowest RoCE v2 GID index whose GID carries one of that
    device's IPv4 addresses; this is the value for C(NCCL_IB_GID_INDEX) on this node (it can differ per node).
  - When sysfs has no GID table the GID lines of C(ibv_devinfo -v) are used.
  - Results are returned under C(ansible_facts.rdma).
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.FACTS
  - localinference.vllm.node
  - localinference.vllm.node.SYS_ROOT
  - localinference.vllm.node.REQUIRED
options:
  ibv_devinfo:
    description:
      - Name or path of the C(ibv_devinfo) executable.
    type: str
    default: ibv_devinfo
  devices:
    description:
      - Only report these HCAs (for example V(rocep1s0f0)). Empty means all.
    type: list
    elements: str
    default: []
  timeout:
    default: 30
notes:
  - Commands run with C(LC_ALL=C).
  - Device names in O(devices) and network device names read from sysfs are checked against the kernel's
    naming rule (no C(/), not C(..), at most 63 or 15 characters) before they become paths or arguments.
"""

EXAMPLES = r"""
- name: Read RDMA facts
  localinference.vllm.rdma_facts:

- name: GID index for NCCL on this node
  ansible.builtin.debug:
    msg: "{{ ansible_facts.rdma.devices.rocep1s0f0.ports['1'].roce_v2_gid_index }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    rdma:
      description: RDMA facts.
      returned: always
      type: dict
      contains:
        present:
          description: Whether any RDMA device was found.
          type: bool
        absent_reason:
          description: Why no device was found.
          type: str
          returned: when present is false
        netdev_to_hca:
          description: Map of network device name to C({hca, port}).
          type: dict
          sample: {enp1s0f0np0: {hca: rocep1s0f0, port: "1"}}
        devices:
          description: One entry per HCA; C(ports) maps the port number (a string) to its state.
          type: dict
          sample:
            rocep1s0f0:
              fw_ver: 28.45.4028
              vendor_part_id: "4129"
              board_id: NVD0000000087
              ports:
                "1":
                  state: PORT_ACTIVE
                  max_mtu: 4096
                  active_mtu: 4096
                  link_layer: Ethernet
                  netdev: enp1s0f0np0
                  ipv4_addresses: [192.168.100.10]
                  roce_v2_gid_index: 3
                  roce_v2_gid: "0000:0000:0000:0000:0000:ffff:c0a8:640a"
                  gid_source: sysfs
                  gids: {"3": {gid: "0000:0000:0000:0000:0000:ffff:c0a8:640a", type: RoCE v2, netdev: enp1s0f0np0, ipv4: 192.168.100.10}}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    run_facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._rdma_gather import (
    WHEN_ABSENT,
    facts,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "ibv_devinfo": {"type": "str", "default": "ibv_devinfo"},
            "sys_root": {"type": "path", "default": "/sys"},
            "devices": {"type": "list", "elements": "str", "default": []},
            "required": {"type": "bool", "default": False},
            "timeout": {"type": "float", "default": 30.0},
        },
        supports_check_mode=True,
    )
    run_facts(module, "rdma", lambda runner: facts(module, runner), absent=WHEN_ABSENT)


if __name__ == "__main__":
    main()
