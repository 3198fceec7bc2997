# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Record each host's failures of a bad-input run as JSON (tests/unit/bad_input only).

test_bad_input_roles.py batches one case per host; this callback writes, per host,
every failed or unreachable result (task, msg, whether it carried a traceback) to the
file named by ``BAD_INPUT_RESULTS`` when the run ends, so the test can judge each case
on its own without parsing the screen output.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: bad_input_results
type: aggregate
short_description: per-host failures of a bad-input run, as JSON
description: Writes every failed or unreachable result per host to the file named by BAD_INPUT_RESULTS.
requirements: [BAD_INPUT_RESULTS set in the environment]
"""

_KEPT = ("msg", "stderr", "stdout", "argument_errors", "exception", "module_stderr")


def _text(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bad_input_results"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._hosts: dict[str, dict[str, Any]] = {}

    def _host(self, name: str) -> dict[str, Any]:
        return self._hosts.setdefault(name, {"failures": [], "ok_tasks": 0})

    def _record(self, result: Any, kind: str, ignored: bool = False) -> None:
        raw = result._result
        entry = {"task": result._task.get_name(), "kind": kind, "ignored": ignored}
        entry.update({key: _text(raw[key]) for key in _KEPT if key in raw})
        items = raw.get("results")
        if isinstance(items, list):
            entry["items"] = [
                {key: _text(item[key]) for key in _KEPT if key in item}
                for item in items
                if isinstance(item, dict) and item.get("failed")
            ]
        self._host(result._host.get_name())["failures"].append(entry)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._record(result, "failed", ignore_errors)

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._record(result, "unreachable")

    def v2_runner_on_ok(self, result: Any) -> None:
        self._host(result._host.get_name())["ok_tasks"] += 1

    def v2_playbook_on_stats(self, stats: Any) -> None:
        path = os.environ.get("BAD_INPUT_RESULTS")
        if not path:
            return
        for host in stats.processed:
            self._host(host)["stats"] = stats.summarize(host)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self._hosts, handle, indent=1, sort_keys=True)
