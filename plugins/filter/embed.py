# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one way a node program is built from the collection's code (module_utils/common/_embed.py).

- ``embedded_program``: ``'serve._shm_offload_cli' | embedded_program(header_lines)`` -> the
  program text: the module, what it imports, each after what it imports, and the loader.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.common import _embed


def embedded_program(entry: Any, header: Any = ()) -> str:
    if not isinstance(entry, str) or not entry:
        raise AnsibleFilterError("embedded_program takes a module name such as 'serve._shm_offload_cli'")
    if isinstance(header, str) or not all(isinstance(line, str) and "\n" not in line for line in header):
        raise AnsibleFilterError("embedded_program's header is a list of single lines")
    try:
        return _embed.program(entry, list(header))
    except ValueError as err:
        raise AnsibleFilterError(str(err)) from err


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"embedded_program": embedded_program}
