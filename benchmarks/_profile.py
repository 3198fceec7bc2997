# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a playbook run's seconds go: per task, per stage, per host.

A profiled run has two callbacks on: ``ansible.posix.profile_tasks`` (each
task's wall time over all hosts, printed as its TASKS RECAP, here parsed) and
this directory's ``callback_plugins/task_timing`` (each host's result of each
task with its start, end and status, and the play each task ran in). From both
:func:`breakdown` makes one summary: the slowest tasks, task and skip counts,
seconds per stage and per host.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.harness import LAB_DIR

CALLBACK_DIR = Path(__file__).resolve().parent / "callback_plugins"
KEEP_DIR = LAB_DIR / "bench-timings"
# The stage tags site.yml gives its imported playbooks (STYLE.md), in order.
STAGES = ("preflight", "fabric", "weights", "plan", "rollout", "ingress", "client", "qualify")
PROFILE_LINE = re.compile(r"^(?P<task>.+?) -*\s?(?P<seconds>\d+\.\d+)s$")


@dataclass
class Profiler:
    """Environment for one profiled ``ansible-playbook`` run and where its timings land."""

    timing_file: Path
    label: str | None = None

    def keep_log(self, stdout: str) -> None:
        """With a label, the run's output (profile_tasks' TASKS RECAP included) beside its timings."""
        if self.label:
            KEEP_DIR.mkdir(parents=True, exist_ok=True)
            (KEEP_DIR / f"{self.label}.log").write_text(stdout)

    @property
    def env(self) -> dict[str, str]:
        return {
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks,task_timing",
            "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACK_DIR),
            "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
            "PROFILE_TASKS_SORT_ORDER": "descending",
            "LOCALINFERENCE_TASK_TIMING_FILE": str(self.timing_file),
        }

    def timings(self) -> dict[str, Any] | None:
        """What task_timing wrote, or None when the run ended before its recap."""
        try:
            return json.loads(self.timing_file.read_text())
        except (OSError, ValueError):
            return None


@contextmanager
def profiled(label: str | None = None) -> Iterator[Profiler]:
    """A profiler; with ``label`` the raw timings and output are kept in ``.lab/bench-timings/``."""
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        profiler = Profiler(Path(tmp) / "timings.json", label)
        yield profiler
        if label and profiler.timing_file.exists():
            KEEP_DIR.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(profiler.timing_file, KEEP_DIR / f"{label}.json")


def profile_tasks_rows(stdout: str) -> list[dict[str, Any]]:
    """The TASKS RECAP of ansible.posix.profile_tasks: ``[{"task", "seconds"}]``, slowest first."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("TASKS RECAP")]
    if not starts:
        return []
    rows = []
    for line in lines[starts[-1] + 1 :]:
        match = PROFILE_LINE.match(line.rstrip())
        if match and not line.startswith("="):
            rows.append({"task": match.group("task").strip(), "seconds": float(match.group("seconds"))})
    rows.sort(key=lambda row: row["seconds"], reverse=True)
    return rows


def stage_of(play: dict[str, Any]) -> str:
    """The stage tag of a play (site.yml tags each imported playbook), else its name up to " - ".

    site.yml's untagged plays ("Site | Nothing to do? - ...", "Site | Record the whole run - ...")
    each count as one part, whatever host they run on.
    """
    for stage in STAGES:
        if stage in play.get("tags", []):
            return stage
    return (play.get("name") or "(unnamed play)").split(" - ")[0]


def _task_spans(timings: dict[str, Any]) -> list[float]:
    """Wall seconds of each task: until the next task or play starts, or the run ends."""
    marks = sorted(
        [t["start"] for t in timings["tasks"]] + [p["start"] for p in timings["plays"]]
    )
    spans = []
    for task in timings["tasks"]:
        later = [m for m in marks if m > task["start"]]
        ends = [h.get("end", task["start"]) for h in task["hosts"].values()]
        spans.append((min(later) if later else max([timings["ended"], *ends])) - task["start"])
    return spans


def breakdown(
    stdout: str, timings: dict[str, Any] | None, process_seconds: float, top: int = 15
) -> dict[str, Any]:
    """One summary of a profiled run (see the module docstring); JSON-ready."""
    rows = profile_tasks_rows(stdout)
    result: dict[str, Any] = {
        "top_tasks": rows[:top],
        "profile_tasks_count": len(rows),
        "profile_tasks_seconds": round(sum(row["seconds"] for row in rows), 2),
    }
    if timings is None:
        result["note"] = "no task_timing file: the run ended before its recap"
        return result
    plays = timings["plays"]
    tasks = timings["tasks"]
    spans = _task_spans(timings)
    in_plays = timings["ended"] - timings["started"]
    stages: dict[str, dict[str, Any]] = {}
    for index, play in enumerate(plays):
        end = plays[index + 1]["start"] if index + 1 < len(plays) else timings["ended"]
        stage = stages.setdefault(
            stage_of(play), {"seconds": 0.0, "plays": 0, "tasks": 0, "skipped_tasks": 0}
        )
        stage["seconds"] += end - play["start"]
        stage["plays"] += 1
    hosts: dict[str, dict[str, Any]] = {}
    skipped_tasks = 0
    for task in tasks:
        stage = stages.get(stage_of(plays[task["play"]])) if task["play"] >= 0 else None
        statuses = [h.get("status", "unfinished") for h in task["hosts"].values()]
        skipped = bool(statuses) and all(s == "skipped" for s in statuses)
        skipped_tasks += skipped
        if stage is not None:
            stage["tasks"] += 1
            stage["skipped_tasks"] += skipped
        for name, host in task["hosts"].items():
            entry = hosts.setdefault(
                name, {"task_seconds": 0.0, "results": 0, "skipped": 0, "changed": 0}
            )
            entry["results"] += 1
            entry["task_seconds"] += host.get("end", host["start"]) - host["start"]
            entry["skipped"] += host.get("status") == "skipped"
            entry["changed"] += host.get("status") == "changed"
    changed = [
        {"task": t["name"], "hosts": sorted(n for n, h in t["hosts"].items() if h.get("status") == "changed")}
        for t in tasks
        if any(h.get("status") == "changed" for h in t["hosts"].values())
    ]
    by_name: dict[str, float] = {}
    roles: dict[str, dict[str, Any]] = {}
    for task, span in zip(tasks, spans, strict=True):
        by_name[task["name"]] = by_name.get(task["name"], 0.0) + span
        role = roles.setdefault(
            task["role"] or "(play)", {"seconds": 0.0, "tasks": 0, "skipped_tasks": 0}
        )
        role["seconds"] += span
        role["tasks"] += 1
        statuses = [h.get("status") for h in task["hosts"].values()]
        role["skipped_tasks"] += bool(statuses) and all(s == "skipped" for s in statuses)
    result.update(
        {
            "task_count": len(tasks),
            "skipped_tasks": skipped_tasks,
            "skipped_results": sum(h["skipped"] for h in hosts.values()),
            "changed_tasks": changed,
            "startup_seconds": round(max(0.0, process_seconds - in_plays), 2),
            "plays_seconds": round(in_plays, 2),
            "seconds_per_task": round(in_plays / len(tasks), 3) if tasks else None,
            "stages": {
                name: {**stage, "seconds": round(stage["seconds"], 2)}
                for name, stage in stages.items()
            },
            "roles": {
                name: {**role, "seconds": round(role["seconds"], 2)}
                for name, role in sorted(roles.items(), key=lambda item: -item[1]["seconds"])
            },
            "per_host": {
                name: {**entry, "task_seconds": round(entry["task_seconds"], 2)}
                for name, entry in sorted(hosts.items())
            },
        }
    )
    if not rows:  # profile_tasks missing: the same ranking from task_timing
        ranked = sorted(by_name.items(), key=lambda item: item[1], reverse=True)
        result["top_tasks"] = [{"task": n, "seconds": round(s, 2)} for n, s in ranked[:top]]
    return result


def format_breakdown(label: str, data: dict[str, Any]) -> str:
    """The breakdown as the benchmark prints it."""
    out = [f"--- {label}: where the seconds go (profile_tasks + task_timing) ---"]
    if "task_count" in data:
        out.append(
            f"{data['task_count']} tasks started, {data['skipped_tasks']} skipped on every host"
            f" ({data['skipped_results']} skipped host results); {data['plays_seconds']:.1f} s in"
            f" plays ({data['seconds_per_task']:.2f} s per task), {data['startup_seconds']:.1f} s"
            " before the first play (ansible-playbook start, inventory, playbook parsing)"
        )
        out.append(f"{'stage':<22}{'seconds':>9}{'tasks':>7}{'skipped':>9}")
        for name, stage in data["stages"].items():
            out.append(
                f"{name[:21]:<22}{stage['seconds']:>9.1f}{stage['tasks']:>7}{stage['skipped_tasks']:>9}"
            )
        out.append(f"{'host':<22}{'task s':>9}{'results':>9}{'skipped':>9}{'changed':>9}")
        for name, host in data["per_host"].items():
            out.append(
                f"{name:<22}{host['task_seconds']:>9.1f}{host['results']:>9}"
                f"{host['skipped']:>9}{host['changed']:>9}"
            )
        for entry in data["changed_tasks"]:
            out.append(f"changed: {entry['task']} on {', '.join(entry['hosts'])}")
    else:
        out.append(data.get("note", ""))
    out.append(f"slowest tasks ({len(data['top_tasks'])} of {data['profile_tasks_count']}):")
    out += [f"{row['seconds']:>8.2f} s  {row['task']}" for row in data["top_tasks"]]
    return "\n".join(out)
