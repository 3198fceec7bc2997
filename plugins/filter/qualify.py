# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the qualification.

- ``qualify_check_params``: the per-check parameters that measure a recipe's ``expected:``
  figures at their conditions (``_qualify_expected.check_params``).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._qualify_expected import (
    ExpectedError,
    check_params,
)


def qualify_check_params(
    expected: Any, served_limit: Any, defaults: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    try:
        return check_params(expected, served_limit, defaults, overrides)
    except ExpectedError as exc:
        raise AnsibleFilterError(f"qualify_expected: {exc}") from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"qualify_check_params": qualify_check_params}
