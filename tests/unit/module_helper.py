"""Run a module's main() in-process and capture its exit_json/fail_json; a stand-in AnsibleModule for module_utils."""

from __future__ import annotations

import contextlib
import json
import os
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


class FakeModule:
    """The part of AnsibleModule that module_utils uses, to test them without Ansible.

    ``fail_json`` and ``exit_json`` raise :class:`ModuleExit` as :func:`run_module` does;
    ``warn`` keeps the warnings; ``atomic_move`` renames; ``get_bin_path`` answers from
    ``bins`` (a name not there is not installed).
    """

    def __init__(
        self,
        params: dict[str, Any],
        check_mode: bool = False,
        diff: bool = False,
        bins: dict[str, str] | None = None,
    ) -> None:
        self.params = params
        self.check_mode = check_mode
        self._diff = diff
        self.bins = bins or {}
        self.warnings: list[str] = []
        self.no_log_values: set[str] = set()

    def warn(self, warning: str) -> None:
        self.warnings.append(warning)

    def fail_json(self, msg: str, **kwargs: Any) -> None:
        raise ModuleExit({**kwargs, "msg": msg, "failed": True}, failed=True)

    def exit_json(self, **kwargs: Any) -> None:
        raise ModuleExit(kwargs, failed=False)

    def atomic_move(self, src: str, dest: str) -> None:
        os.replace(src, dest)

    def get_bin_path(self, name: str, required: bool = False, **_: Any) -> str | None:
        found = self.bins.get(name)
        if found is None and required:
            self.fail_json(msg=f"Failed to find required executable {name}")
        return found
