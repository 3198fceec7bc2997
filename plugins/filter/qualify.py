# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the qualification.

- ``qualify_check_params``: the per-check parameters that measure a recipe's ``expected:``
  figures at their conditions (``_expected.check_params``).
- ``qualify_other_hold``: whether the watchdog's hold file (a ``slurp`` result) holds another
  holder's hold that has not run out at ``now`` (``watchdog/_hold``): the qualification then
  neither writes its own nor releases it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._expected import (
    ExpectedError,
    check_params,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog import _hold as hold_file


def qualify_check_params(
    expected: Any, served_limit: Any, defaults: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    try:
        return check_params(expected, served_limit, defaults, overrides)
    except ExpectedError as exc:
        raise AnsibleFilterError(f"qualify_expected: {exc}") from None


def qualify_other_hold(slurped: Any, now: Any) -> bool:
    if not isinstance(slurped, dict) or not isinstance(slurped.get("content"), str):
        return False  # no file (slurp failed), or the task was skipped
    try:
        text = base64.b64decode(slurped["content"], validate=True)[:64].decode("utf-8", "replace")
        hold = hold_file.active(text, float(now))
    except (binascii.Error, ValueError, TypeError) as exc:
        raise AnsibleFilterError(f"qualify_other_hold: {exc}") from None
    return hold is not None and hold[1] != hold_file.QUALIFY


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"qualify_check_params": qualify_check_params, "qualify_other_hold": qualify_other_hold}
