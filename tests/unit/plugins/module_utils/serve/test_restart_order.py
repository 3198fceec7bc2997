# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One restart order: ``playbooks/rollout.yml`` read back against ``_restart.RESTART_ORDER``.

The rollout restarts a cluster with plays (``rm -> update`` and ``verify`` in the play that
imports the serve role's ``apply.yml``, then one play per start); the watchdog with
``restart_plan``. Both follow ``RESTART_ORDER``: here the order is derived from the
playbook and the serve role's tasks files themselves - which plays, on which hosts, in which
order, which task file stops, verifies or starts, and which units each start starts - so a
play moved, a group changed or a start that picks other units fails until the table (and so
the watchdog) says the same.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.localinference.vllm.plugins.module_utils.serve._restart import (
    RAY_UNIT,
    RESTART_ORDER,
    restart_plan,
)

ROOT = Path(__file__).resolve().parents[5]
ROLLOUT = ROOT / "playbooks" / "rollout.yml"
SERVE_TASKS = ROOT / "roles" / "serve" / "tasks"
ROLE = "localinference.vllm.serve"
VLLM = "localinference-vllm.service"
_HOSTS = re.compile(r"^\{\{\s*'(?P<group>\w+)'\s*\|\s*localinference\.vllm\.work_hosts\(")


def _tasks(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every task, blocks (and their rescue/always) flattened in order."""
    found = []
    for task in tasks or []:
        found.append(task)
        for key in ("block", "rescue", "always"):
            found += _tasks(task.get(key))
    return found


def _serve_files(play: dict[str, Any]) -> list[str]:
    """The serve role's tasks files a play imports or includes, in order."""
    files = []
    for task in _tasks(play.get("tasks")):
        for module in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
            call = task.get(module)
            if call and call.get("name") == ROLE:
                files.append(call["tasks_from"])
    return files


def _hosts(play: dict[str, Any]) -> str:
    match = _HOSTS.match(play["hosts"])
    assert match, f"{play['name']}: hosts {play['hosts']!r} is not one group through work_hosts"
    return match.group("group")


def _load(name: str) -> list[dict[str, Any]]:
    return yaml.safe_load((SERVE_TASKS / f"{name}.yml").read_text())


def _step(name: str) -> tuple[str, str]:
    """What a serve tasks file does to a node: ``(step, units)`` read from its tasks."""
    tasks = _tasks(_load(name))
    for task in tasks:
        call = task.get("localinference.vllm.serving_state") or {}
        if call.get("state") == "present" and call.get("stop_live") is True:
            return "stop", "all"  # serving_state stops every unit of start_order, in reverse
        if call.get("state") == "verified":
            return "verify", "all"
    starts = [t for t in tasks if "ansible.builtin.systemd_service" in t]
    assert starts, f"roles/serve/tasks/{name}.yml neither stops, verifies nor starts"
    which = set()
    for task in starts:
        unit, loop = task["ansible.builtin.systemd_service"]["name"], str(task.get("loop", ""))
        if "select('match', 'localinference-ray')" in loop:
            which.add("ray")
        elif unit == VLLM:
            which.add("server")
        elif loop.replace(" ", "") == "{{__serve_staged.start_order}}":
            which.add("all")
        else:
            pytest.fail(f"roles/serve/tasks/{name}.yml starts {unit!r} over {loop!r}: which units?")
    assert len(which) == 1, f"roles/serve/tasks/{name}.yml starts {sorted(which)}"
    return "start", which.pop()


def rollout_order(plays: list[dict[str, Any]]) -> tuple[tuple[str, str, str, str], ...]:
    """``(step, hosts, tasks file, units)`` of the rollout's restart, read from its plays.

    The restart is the plays from the one that imports ``apply.yml`` (rm -> update, then
    verify) to the first one that starts the server, leaving out those that stop, verify and
    start nothing (the firewall). ``apply.yml`` is read for the order of its two halves.
    """
    order: list[tuple[str, str, str, str]] = []
    started = False
    for play in plays:
        files = [f for f in _serve_files(play) if f == "apply" or f.startswith("start_")]
        started = started or "apply" in files
        if not started or not files:
            continue
        assert len(files) == 1, f"{play['name']}: one restart step per play, found {files}"
        halves = [files[0]]
        if files[0] == "apply":
            halves = [
                Path(task.get("ansible.builtin.include_tasks", {}).get("file", "")
                     or task.get("ansible.builtin.import_tasks", "")).stem
                for task in _load("apply")
            ]
        for name in halves:
            step, units = _step(name)
            order.append((step, _hosts(play), name, units))
        if files[0] == "start_server":
            break
    return tuple(order)


PLAYS = yaml.safe_load(ROLLOUT.read_text())


def test_the_restart_order_is_the_rollouts():
    assert rollout_order(PLAYS) == RESTART_ORDER


def test_a_play_moved_in_the_rollout_is_seen():
    """The derivation is not vacuous: workers after the head's server is another order."""
    plays = copy.deepcopy(PLAYS)
    names = [play["name"] for play in plays]
    workers = names.index("Rollout | Start the workers before the head's server")
    server = names.index("Rollout | Start the server on the head and wait for its first token")
    plays[workers], plays[server] = plays[server], plays[workers]
    assert rollout_order(plays) != RESTART_ORDER
    plays = copy.deepcopy(PLAYS)
    plays[workers]["hosts"] = plays[workers]["hosts"].replace("vllm_workers", "vllm_cluster")
    assert rollout_order(plays) != RESTART_ORDER


def rollout_steps(nodes: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """What the rollout's plays do to ``nodes``, step by step, in the order read from rollout.yml.

    A play runs on its group (the head first, then the workers by rank, as the watchdog goes);
    a start with nothing to start on a node is skipped there (the tasks' ``when``/``loop``).
    """
    head = [n for n in nodes if n["rank"] == 0]
    workers = sorted((n for n in nodes if n["rank"] != 0), key=lambda n: n["rank"])
    groups = {"vllm_head": head, "vllm_workers": workers, "vllm_cluster": head + workers}
    steps = []
    for step, group, _tasks_file, which in rollout_order(PLAYS):
        for node in groups[group]:
            order = node["start_order"]
            units = {
                "all": list(order),
                "ray": [u for u in order if u == RAY_UNIT],
                "server": [u for u in order if u == VLLM],
            }[which]
            if step == "verify":
                steps.append((step, node["name"], []))
            elif step == "stop" or units:
                steps.append((step, node["name"], units))
    return steps


CLUSTERS = {
    "mp-two-nodes": [{"name": "w", "rank": 1, "start_order": [VLLM]},
                     {"name": "h", "rank": 0, "start_order": [VLLM]}],
    "ray-two-nodes": [{"name": "h", "rank": 0, "start_order": [RAY_UNIT, VLLM]},
                      {"name": "w", "rank": 1, "start_order": [RAY_UNIT]}],
    "ray-three-nodes": [{"name": "w2", "rank": 2, "start_order": [RAY_UNIT]},
                        {"name": "h", "rank": 0, "start_order": [RAY_UNIT, VLLM]},
                        {"name": "w1", "rank": 1, "start_order": [RAY_UNIT]}],
    "one-node": [{"name": "h", "rank": 0, "start_order": [VLLM]}],
    "worker-with-nothing-to-start": [{"name": "h", "rank": 0, "start_order": [VLLM]},
                                     {"name": "w", "rank": 1, "start_order": []}],
}  # fmt: skip


@pytest.mark.parametrize("nodes", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_restart_plan_is_the_rollouts_order(nodes: list[dict[str, Any]]) -> None:
    """The watchdog's restart does what the rollout's plays do, in their order."""
    assert [(s["step"], s["node"], s["units"]) for s in restart_plan(nodes)] == rollout_steps(nodes)


def test_the_derived_order_is_the_documented_one():
    """Read once by eye: what rollout_steps derives for a Ray cluster (rollout.yml's header)."""
    assert rollout_steps(CLUSTERS["ray-two-nodes"]) == [
        ("stop", "h", [RAY_UNIT, VLLM]), ("stop", "w", [RAY_UNIT]),
        ("verify", "h", []), ("verify", "w", []),
        ("start", "h", [RAY_UNIT]), ("start", "w", [RAY_UNIT]), ("start", "h", [VLLM]),
    ]  # fmt: skip


def test_restart_plan_needs_one_head() -> None:
    with pytest.raises(ValueError, match="rank 0"):
        restart_plan([{"name": "w", "rank": 1, "start_order": [VLLM]}])


@pytest.mark.parametrize("nodes", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_a_wave_is_one_play(nodes: list[dict[str, Any]]) -> None:
    """Steps of one play share its wave (the watchdog runs them at once); waves only go forward."""
    plan = restart_plan(nodes)
    waves = [s["wave"] for s in plan]
    assert waves == sorted(waves)
    for step in plan:
        assert RESTART_ORDER[step["wave"]][0] == step["step"]
