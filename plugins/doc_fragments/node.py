# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    """Options of the modules that read a node: command deadlines, procfs, sysfs, presence."""

    # The facts modules whose commands run through module_utils/common/_facts_module.py.
    DOCUMENTATION = r"""
options:
  timeout:
    description:
      - Seconds each command the module runs may take. A command that does not finish in time is
        killed and fails the module with the command named (a wedged driver or daemon must not
        hang the play).
    type: float
"""

    PROC_ROOT = r"""
options:
  proc_root:
    description:
      - Mount point of procfs.
    type: path
    default: /proc
"""

    SYS_ROOT = r"""
options:
  sys_root:
    description:
      - Mount point of sysfs. A recorded tree can be given here (the unit tests and the lab do,
        because the lab's kernel has no RDMA).
    type: path
    default: /sys
"""

    REQUIRED = r"""
options:
  required:
    description:
      - Fail when the tool or the devices the module reads are not on the node.
      - When V(false) such a node returns C(present=false) with C(absent_reason).
    type: bool
    default: false
"""
