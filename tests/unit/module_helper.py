"""Run a module's main() in-process and capture its exit_json/fail_json."""

from __future__ import annotations

import contextlib
import json
from typing import Any
from unittest import mock

import pytest
from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes


class ModuleExit(Exception):
    def __init__(self, result: dict[str, Any], failed: bool) -> None:
        super().__init__(result)
        self.result = result
        self.failed = failed


def _exit_json(self, **kwargs: Any) -> None:
    raise ModuleExit(kwargs, failed=False)


def _fail_json(self, msg: str, **kwargs: Any) -> None:
    kwargs["msg"] = msg
    kwargs["failed"] = True
    raise ModuleExit(kwargs, failed=True)


def run_module(module, args: dict[str, Any], check_mode: bool = False) -> ModuleExit:
    """Run ``module.main()`` with ``args``; return the captured exit."""
    payload = dict(args)
    payload["_ansible_check_mode"] = check_mode
    payload.setdefault("_ansible_remote_tmp", "/tmp")
    payload.setdefault("_ansible_keep_remote_files", False)
    serialized = to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))
    patches = [
        mock.patch.object(basic.AnsibleModule, "exit_json", _exit_json),
        mock.patch.object(basic.AnsibleModule, "fail_json", _fail_json),
    ]
    try:
        from ansible.module_utils.testing import patch_module_args  # ansible-core >= 2.19

        patches.append(patch_module_args(payload))
    except ImportError:
        patches.append(mock.patch.object(basic, "_ANSIBLE_ARGS", serialized))
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        with pytest.raises(ModuleExit) as caught:
            module.main()
    return caught.value
