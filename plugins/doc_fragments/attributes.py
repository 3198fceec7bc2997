# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    """Shared attribute documentation for this collection's modules."""

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
"""

    FACTS = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: The module only reads the system; check mode behaves exactly like a normal run.
  diff_mode:
    support: N/A
    description: The module reports facts and changes nothing.
  facts:
    support: full
    description: Results are returned under C(ansible_facts).
"""

    INFO = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: The module only reads or computes; check mode behaves exactly like a normal run.
  diff_mode:
    support: N/A
    description: The module changes nothing.
"""

    CHANGES = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    support: full
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
"""
