# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A no-op re-run against the lab, against a plain fact-gathering play on the same hosts.

Prints, from one run: wall time of the no-op run, of `gather_facts` on the same
hosts, their ratio, the number of changed tasks (must be 0) and of restarts of
the vLLM units (InvocationID before and after; must be 0), and where the no-op's
seconds go: the slowest tasks (ansible.posix.profile_tasks), task and skip
counts, seconds per stage and each host's own task time (both runs profiled
alike). Needs a lab that `make lab` has brought up and served.

    .venv/bin/python benchmarks/rollout_noop.py [--playbook playbooks/site.yml] [--top 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._measured import exit_code
from benchmarks._profile import breakdown, format_breakdown, profiled
from lab.harness import (
    HOSTS,
    LAB_DIR,
    LabError,
    PlaybookRun,
    lab_up,
    run_playbook,
    unit_invocations,
)

FACTS_PLAY = """---
- name: Plain fact gathering on the lab hosts
  hosts: vllm_cluster
  gather_facts: true
  tasks: []
"""
PING_TASKS = 10
PING_PLAY = f"""---
- name: One module round trip per task on the lab hosts
  hosts: vllm_cluster
  gather_facts: false
  tasks:
{"".join(f"    - name: Round trip {i}{chr(10)}      ansible.builtin.ping:{chr(10)}" for i in range(PING_TASKS))}"""
# Modules that run on the controller alone: no round trip to a node.
CONTROLLER_ACTIONS = frozenset(
    "ansible.builtin." + name
    for name in (
        "set_fact", "assert", "debug", "validate_argument_spec", "include_tasks", "include_role",
        "import_tasks", "meta", "fail", "add_host", "group_by", "include_vars",
    )
)
THREE_HOSTS = (
    "this part runs against the two-host lab (spark-head, spark-worker); the growth part"
    " (benchmarks/growth.py) measures the no-op and the rollout on two and three hosts"
)


def module_runs(timings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per host: the module runs that reached it (task_timing's results) and their seconds."""
    per_host: dict[str, dict[str, Any]] = {}
    for task in timings["tasks"]:
        if task["action"] in CONTROLLER_ACTIONS:
            continue
        for host, res in task["hosts"].items():
            if res.get("status") in (None, "skipped"):
                continue
            entry = per_host.setdefault(host, {"module_runs": 0, "seconds": 0.0})
            entry["module_runs"] += 1
            entry["seconds"] += res.get("end", res["start"]) - res["start"]
    return {
        host: {**entry, "seconds": round(entry["seconds"], 1)}
        for host, entry in sorted(per_host.items())
    }


def round_trips(
    noop: dict[str, Any] | None, pings: dict[str, Any] | None, ping_seconds: float, ping_rc: int
) -> dict[str, Any]:
    """Module runs of the no-op that reach a node, and what one round trip costs on this lab."""
    if not noop or not pings or ping_rc:
        return {"note": "no timings (a run ended before its recap, or the round-trip play failed)"}
    each = [
        res["end"] - res["start"]
        for task in pings["tasks"]
        if task["action"] == "ansible.builtin.ping"
        for res in task["hosts"].values()
        if "end" in res
    ]
    return {
        "per_host": module_runs(noop),
        "ping_seconds_median": round(statistics.median(each), 3) if each else None,
        "ping_play_seconds": round(ping_seconds, 2),
        "ping_tasks": PING_TASKS,
    }


def profiled_play(
    label: str, text: str, inventory: Path | None = None
) -> tuple[PlaybookRun, dict[str, Any] | None]:
    """Run a play given as text against the lab (or ``inventory``'s), profiled: (run, timings)."""
    with (
        profiled(label) as profiler,
        tempfile.NamedTemporaryFile("w", suffix=".yml", dir=LAB_DIR, delete=True) as play,
    ):
        play.write(text)
        play.flush()
        run = run_playbook(play.name, env=profiler.env, inventory=inventory)
        return run, profiler.timings()


def measure(playbook: str = "playbooks/site.yml", top: int = 15) -> dict[str, Any]:
    """One no-op run and one fact-gathering run, profiled alike; raises LabError when the lab fails.

    An unmeasured run comes first: after a rollout or a tagged run (the
    rollout part runs before this one) the lab has something to do, and that
    run records the whole run, so the measured one is a no-op.
    """
    settle = run_playbook(playbook)
    if settle.rc:
        raise LabError(f"{playbook} failed before the no-op was measured:\n{settle.tail()}")
    before = unit_invocations()
    with profiled("noop") as profiler:
        noop = run_playbook(playbook, env=profiler.env)
        profiler.keep_log(noop.stdout)
        noop_timings = profiler.timings()
        noop_breakdown = breakdown(noop.stdout, noop_timings, noop.seconds, top)
    after = unit_invocations()
    facts, facts_timings = profiled_play("gather-facts", FACTS_PLAY)
    facts_breakdown = breakdown(facts.stdout, facts_timings, facts.seconds, top)
    pings, ping_timings = profiled_play("round-trips", PING_PLAY)
    counters = noop.recap
    return {
        "playbook": playbook,
        "settle_seconds": round(settle.seconds, 2),
        "settle_changed": settle.changed(),
        "noop_seconds": round(noop.seconds, 2),
        "gather_facts_seconds": round(facts.seconds, 2),
        "noop_ratio": round(noop.seconds / facts.seconds, 2),
        "noop_rc": noop.rc,
        "gather_facts_rc": facts.rc,
        "changed": noop.changed(),
        "failed": sum(h.get("failed", 0) + h.get("unreachable", 0) for h in counters.values()),
        "restarts": sum(1 for host in before if before[host] != after[host]),
        "invocations": {"before": before, "after": after},
        "recap": counters,
        "hosts": len(HOSTS),
        "three_hosts": THREE_HOSTS,
        "noop_breakdown": noop_breakdown,
        "round_trips": round_trips(noop_timings, ping_timings, pings.seconds, pings.rc),
        "gather_facts_breakdown": facts_breakdown,
        "_tail": noop.tail() if noop.rc or noop.changed() else "",
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        f"before it, unmeasured: {result['playbook']} {result.get('settle_seconds', 0):.1f} s,"
        f" changed={result.get('settle_changed', 0)} (what a rollout run before it left to do)",
        f"no-op {result['playbook']}: {result['noop_seconds']:.1f} s, rc={result['noop_rc']},"
        f" changed={result['changed']}, failed={result['failed']}",
        f"gather_facts play: {result['gather_facts_seconds']:.1f} s, rc={result['gather_facts_rc']}",
        f"ratio no-op / gather_facts: {result['noop_ratio']:.2f} (goal <= 5, stretch 2)",
        f"vLLM unit restarts: {result['restarts']} (InvocationID before"
        f" {result['invocations']['before']}, after {result['invocations']['after']})",
        format_breakdown("no-op", result["noop_breakdown"]),
        format_round_trips(result["round_trips"]),
        f"hosts: {result['hosts']} lab hosts measured; three hosts: {result['three_hosts']}",
    ]
    return "\n".join(lines)


def format_round_trips(data: dict[str, Any]) -> str:
    if "per_host" not in data:
        return f"round trips: {data.get('note')}"
    runs = ", ".join(
        f"{host} {entry['module_runs']} ({entry['seconds']:.0f} s)"
        for host, entry in data["per_host"].items()
    )
    return (
        f"module runs that reach a node (localhost's are mostly delegated to the head): {runs};"
        f" one ansible.builtin.ping round trip on this lab's connection: "
        f"{data['ping_seconds_median']:.2f} s median ({data['ping_tasks']} pings per host in"
        f" {data['ping_play_seconds']:.1f} s); a fact-gathering play is one module run per host"
    )


def ok(result: dict[str, Any]) -> bool:
    return not (result["noop_rc"] or result["changed"] or result["restarts"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--playbook", default="playbooks/site.yml")
    parser.add_argument("--top", type=int, default=15, help="how many of the slowest tasks to show")
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()
    if not lab_up():
        print("needs the lab hosts spark-head and spark-worker running (make lab)", file=sys.stderr)
        return 2
    try:
        result = measure(args.playbook, args.top)
    except LabError as err:
        print(err, file=sys.stderr)
        return 1
    print(report(result))
    if result["_tail"]:
        print(result["_tail"], file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return exit_code("noop", result, ok(result))


if __name__ == "__main__":
    sys.exit(main())
