# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark-only callback: when each play, task and host result started and ended, as JSON.

ansible.posix.profile_tasks prints each task's wall time; this one adds what it
cannot: each host's own time per task, the status of each result (skipped
included) and the play (stage) each task belongs to. Enabled by the benchmarks
only (``ANSIBLE_CALLBACK_PLUGINS=benchmarks/callback_plugins``,
``ANSIBLE_CALLBACKS_ENABLED=task_timing``); writes the file named by
``LOCALINFERENCE_TASK_TIMING_FILE`` at the end of the run. Not part of the
collection.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: task_timing
    type: aggregate
    short_description: per-task and per-host timings for the benchmarks, as JSON
    description:
      - Writes plays, tasks and per-host results with start and end times to
        the file named by LOCALINFERENCE_TASK_TIMING_FILE.
    requirements:
      - enabled in callbacks_enabled
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.started = time.time()
        self.plays: list[dict[str, Any]] = []
        self.tasks: list[dict[str, Any]] = []
        self.by_uuid: dict[str, dict[str, Any]] = {}

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self.plays.append(
            {"name": play.get_name(), "tags": sorted(play.tags or []), "start": time.time()}
        )

    def _task_start(self, task: Any, handler: bool) -> None:
        role = task._role.get_name() if getattr(task, "_role", None) else None
        entry = {
            "name": task.get_name(),
            "role": role,
            "action": task.action,
            "handler": handler,
            "play": len(self.plays) - 1,
            "start": time.time(),
            "hosts": {},
        }
        self.tasks.append(entry)
        # A task in a loop of includes, or a handler, can start again under the same uuid.
        self.by_uuid[task._uuid] = entry

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._task_start(task, handler=False)

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self._task_start(task, handler=True)

    def v2_runner_on_start(self, host: Any, task: Any) -> None:
        entry = self.by_uuid.get(task._uuid)
        if entry is not None:
            entry["hosts"][host.get_name()] = {"start": time.time()}

    def _result(self, result: Any, status: str) -> None:
        entry = self.by_uuid.get(result._task._uuid)
        if entry is None:
            return
        host = entry["hosts"].setdefault(result._host.get_name(), {"start": entry["start"]})
        host["end"] = time.time()
        changed = bool(result._result.get("changed")) if status == "ok" else False
        host["status"] = "changed" if changed else status

    def v2_runner_on_ok(self, result: Any) -> None:
        self._result(result, "ok")

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._result(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result: Any) -> None:
        self._result(result, "skipped")

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._result(result, "unreachable")

    def v2_playbook_on_stats(self, stats: Any) -> None:
        path = os.environ.get("LOCALINFERENCE_TASK_TIMING_FILE")
        if not path:
            return
        document = {
            "started": self.started,
            "ended": time.time(),
            "plays": self.plays,
            "tasks": self.tasks,
        }
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(document, handle)
