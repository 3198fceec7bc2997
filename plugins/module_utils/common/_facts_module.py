# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One runner for the facts modules: the tail every ``*_facts`` module shares.

A facts module checks its options, then hands :func:`run_facts` a ``gather(runner)``
that reads the node and returns the facts. The runner checks the deadlines, makes the
module's one :class:`Runner` (C locale, bounded), turns a command that could not run or
did not finish into a failure naming it, answers "not on this node" (:class:`Absent`)
the same way for every module that has ``required``, and returns the facts under one
namespaced key with ``changed=False``.

No AnsibleModule here: ``module`` is the caller's (``params``, ``fail_json``, ``exit_json``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
    timeout_error,
)


class Absent(validate.Error):
    """What the module reads is not on this node (no tool, no driver, no device); says why."""


def find_binary(module: Any, binary: str) -> str:
    """The program a facts module runs: a path as given when it is executable, a bare name
    looked up in PATH (``module.get_bin_path``); raises :class:`Absent` naming it otherwise."""
    path = (binary if os.access(binary, os.X_OK) else None) if "/" in binary else module.get_bin_path(binary)
    if not path:
        raise Absent(f"{binary} not found in PATH")
    return path


@dataclass(frozen=True)
class WhenAbsent:
    """How a module with a ``required`` option answers :class:`Absent`."""

    name: str  # the module, named in the refusal
    fix: str  # what to do when required=true
    facts: Callable[[str], dict[str, Any]]  # the facts to return instead, from the reason


def run_facts(
    module: Any,
    key: str,
    gather: Callable[[Runner | None], dict[str, Any]],
    timeouts: Sequence[str] = ("timeout",),
    absent: WhenAbsent | None = None,
) -> None:
    """Check the ``timeouts`` options, run ``gather`` and exit with ``ansible_facts[key]``.

    ``gather`` gets a :class:`Runner` with the first of ``timeouts`` (None without one).
    """
    for option in timeouts:
        problem = timeout_error(module.params[option], option)
        if problem:
            module.fail_json(msg=problem)
    runner = Runner(module.params[timeouts[0]]) if timeouts else None
    try:
        facts = gather(runner)
    except CommandError as exc:
        module.fail_json(msg=str(exc), cmd=runner.ran[-1] if runner and runner.ran else None)
    except Absent as exc:
        if absent is None:
            raise
        if module.params["required"]:
            module.fail_json(
                msg=f"{exc}; {absent.name} was called with required=true. {absent.fix}"
            )
        facts = absent.facts(str(exc))
    module.exit_json(changed=False, ansible_facts={key: facts})
