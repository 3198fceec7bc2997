#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: ethtool_facts
short_description: Read link, speed, duplex, driver and MTU of named interfaces
version_added: 0.2.0
description:
  - Runs C(ethtool IF) and C(ethtool -i IF) for each interface and reads its MTU, operational state and MAC
    address from sysfs.
  - Results are returned under C(ansible_facts.ethtool.<ifname>).
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes
  - localinference.vllm.attributes.FACTS
  - localinference.vllm.node
  - localinference.vllm.node.SYS_ROOT
options:
  interfaces:
    description:
      - Interface names to read.
    type: list
    elements: str
    required: true
  ethtool:
    description:
      - Name or path of the C(ethtool) executable.
    type: str
    default: ethtool
  timeout:
    default: 30
notes:
  - An interface that does not exist fails the module with its name, so a typo in the inventory is caught here.
  - Interface names are checked against the kernel's rule (1 to 15 characters, no C(/), C(:) or white space,
    not C(.) or C(..)) before they become sysfs paths or C(ethtool) arguments.
  - Commands run with C(LC_ALL=C).
  - Virtual links (veth) always report C(10000Mb/s); some virtual NICs report no speed (C(speed_mbps=null)).
"""

EXAMPLES = r"""
- name: Read the cluster interfaces
  localinference.vllm.ethtool_facts:
    interfaces: [enp1s0f0np0, enP2p1s0f0np0]

- name: Require 100 Gb/s
  ansible.builtin.assert:
    that: ansible_facts.ethtool.enp1s0f0np0.speed_mbps | default(0, true) >= 100000
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    ethtool:
      description: One entry per interface name.
      returned: always
      type: dict
      sample:
        enp1s0f0np0:
          link_detected: true
          speed_mbps: 10000
          speed_raw: 10000Mb/s
          duplex: full
          port: Twisted Pair
          autoneg: false
          driver: veth
          driver_version: "1.0"
          firmware_version: null
          bus_info: null
          mtu: 9000
          operstate: up
          mac_address: "5e:3c:11:a0:42:07"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.common._facts_module import (
    run_facts,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._ethtool_gather import (
    facts,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "interfaces": {"type": "list", "elements": "str", "required": True},
            "ethtool": {"type": "str", "default": "ethtool"},
            "sys_root": {"type": "path", "default": "/sys"},
            "timeout": {"type": "float", "default": 30.0},
        },
        supports_check_mode=True,
    )
    run_facts(module, "ethtool", lambda runner: facts(module, runner))


if __name__ == "__main__":
    main()
