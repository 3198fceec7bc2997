# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the no-op run and the rollout's overhead grow from two lab hosts to three.

For the two-host lab (`make lab`, which must be up) and the three-host lab (the
scenario `make test-scale` tests; brought up here with `make scale-up` and
removed afterwards with `make scale-down`, unless it was up already), one run
each of:

- a no-op run of the serving stages (`molecule/scale/converge.yml`: site.yml,
  its "nothing to do?" and record included,
  from preflight to ingress; the three-host lab has no client or qualify
  setup) and a fact-gathering play on the same hosts (profiled: module runs
  that reach each node, skipped tasks), their ratio, 0 changed;
- a rollout (`--tags rollout`) of the lab's recipe with max_model_len 256 lower,
  split at the head's server start (systemd's ExecMainStartTimestamp; the lab
  hosts share the controller's clock): the orchestration before the engine
  starts (stage, checks, stop, unit writes, the workers' start), and the
  engine's boot to the first token at the new length; then the lab's recipe
  rolled back the same way.

Prints each lab's figures and the growth per added node. The labs differ in
more than the node count (the three-host lab serves a three-layer model with
pipeline parallel 3, compiled): the boot is reported but only the
orchestration before it is compared.

    .venv/bin/python benchmarks/growth.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import first_token
from benchmarks._measured import exit_code
from benchmarks._profile import profiled
from benchmarks.rollout_noop import FACTS_PLAY, module_runs, profiled_play
from lab.harness import (
    ENDPOINT_FILE,
    HEAD,
    HOSTS,
    INVENTORY,
    LAB_DIR,
    MODEL,
    ROOT,
    LabError,
    inventory_var,
    podman,
    run,
    run_playbook,
    served_max_model_len,
)

# make scale-up: create and converge three hosts (about 5 min here).
SCALE_TIMEOUT = 1800
LOWER_BY = 256
# The stages both labs converge (the three-host lab's converge playbook).
SERVING_STAGES = ROOT / "molecule" / "scale" / "converge.yml"


@dataclass(frozen=True)
class Lab:
    name: str
    inventory: Path
    head: str
    hosts: tuple[str, ...]
    endpoint_file: Path
    model: str

    def base(self) -> str:
        return self.endpoint_file.read_text().strip().rstrip("/")


LABS = (
    Lab("two hosts", INVENTORY, HEAD, HOSTS, ENDPOINT_FILE, MODEL),
    Lab(
        "three hosts",
        ROOT / "inventories" / "lab-scale" / "hosts.yml",
        "scale-head",
        ("scale-head", "scale-worker", "scale-worker2"),
        LAB_DIR / "scale-endpoint",
        "localinference/tiny-deepseek-3l",
    ),
)


def running(lab: Lab) -> bool:
    names = set(podman("ps", "--format", "{{.Names}}", timeout=30).stdout.split())
    return set(lab.hosts) <= names and lab.endpoint_file.is_file()


def noop(lab: Lab) -> dict[str, Any]:
    # Unmeasured: a run with something to do (a rollout or a tagged run before
    # this one) records the whole run, so the measured one has nothing to do.
    settle = run_playbook(SERVING_STAGES, inventory=lab.inventory)
    if settle.rc:
        raise LabError(f"{lab.name}: the serving stages failed:\n{settle.tail()}")
    with profiled(f"growth-noop-{len(lab.hosts)}") as profiler:
        run = run_playbook(SERVING_STAGES, env=profiler.env, inventory=lab.inventory)
        profiler.keep_log(run.stdout)
        timings = profiler.timings() or {"tasks": []}
    facts, _ = profiled_play(f"growth-facts-{len(lab.hosts)}", FACTS_PLAY, lab.inventory)
    if run.rc or facts.rc or run.changed():
        raise LabError(
            f"{lab.name}: the no-op was not one (rc {run.rc}, changed {run.changed()}):\n{run.tail()}"
        )
    skipped = sum(
        res.get("status") == "skipped" for task in timings["tasks"] for res in task["hosts"].values()
    )
    return {
        "noop_seconds": round(run.seconds, 2),
        "gather_facts_seconds": round(facts.seconds, 2),
        "noop_ratio": round(run.seconds / facts.seconds, 2),
        "module_runs": {
            "per_host": {h: e["module_runs"] for h, e in module_runs(timings).items()},
            "skipped": skipped,
        },
    }


def timed_rollout(lab: Lab, recipe: dict[str, Any], serves: int) -> dict[str, Any]:
    """Rollout start -> the head's server start -> first token at ``serves``."""
    started_wall = time.time()
    first, run = first_token.timed_rollout(
        recipe, serves, inventory=lab.inventory, base=lab.base(), model=lab.model
    )
    if run.rc:
        raise LabError(f"{lab.name}: the rollout to max_model_len {serves} failed:\n{run.tail()}")
    before_engine = first_token.server_started_at(lab.head) - started_wall
    return {
        "first_token_seconds": round(first, 2),
        "before_engine_seconds": round(before_engine, 2),
        "engine_boot_seconds": round(first - before_engine, 2),
        "playbook_seconds": round(run.seconds, 2),
    }


def rollouts(lab: Lab) -> dict[str, Any]:
    base = inventory_var("vllm_recipe", lab.head, lab.inventory)
    served = served_max_model_len(lab.base())
    if not isinstance(base, dict) or not served:
        raise LabError(f"{lab.name}: no recipe in the inventory or nothing served at {lab.base()}")
    try:
        changed = timed_rollout(lab, {**base, "max_model_len": served - LOWER_BY}, served - LOWER_BY)
    finally:
        back = timed_rollout(lab, base, served)
    return {"changed": changed, "back": back}


def make(target: str) -> None:
    run(["make", "--no-print-directory", target], timeout=SCALE_TIMEOUT, cwd=ROOT)


def measure() -> dict[str, Any]:
    two, three = LABS
    if not running(two):
        raise LabError("needs the two-host lab up and serving (make lab)")
    bring_up = not running(three)
    result: dict[str, Any] = {"labs": {}, "three_hosts_brought_up": bring_up}
    try:
        if bring_up:
            started = time.monotonic()
            make("scale-up")
            result["scale_up_seconds"] = round(time.monotonic() - started, 1)
        for lab in LABS:
            result["labs"][lab.name] = {
                "hosts": list(lab.hosts),
                **noop(lab),
                "rollout": rollouts(lab),
            }
    finally:
        if bring_up:
            make("scale-down")
    two, three = (result["labs"][lab.name] for lab in LABS)
    result["growth_per_added_node"] = {
        "noop_seconds": round(three["noop_seconds"] - two["noop_seconds"], 2),
        "noop_ratio": round(three["noop_ratio"] / two["noop_ratio"], 2),
        "before_engine_seconds": round(
            three["rollout"]["changed"]["before_engine_seconds"]
            - two["rollout"]["changed"]["before_engine_seconds"],
            2,
        ),
    }
    return result


def report(result: dict[str, Any]) -> str:
    lines = []
    for name, lab in result["labs"].items():
        runs = ", ".join(f"{h} {n}" for h, n in lab["module_runs"]["per_host"].items())
        lines.append(
            f"{name}: no-op {lab['noop_seconds']:.1f} s vs gather_facts {lab['gather_facts_seconds']:.1f} s"
            f" (ratio {lab['noop_ratio']:.1f}); module runs per node: {runs};"
            f" skipped host-tasks {lab['module_runs']['skipped']}"
        )
        for label, roll in lab["rollout"].items():
            lines.append(
                f"  rollout ({label}): first token after {roll['first_token_seconds']:.1f} s ="
                f" {roll['before_engine_seconds']:.1f} s before the head's server started +"
                f" {roll['engine_boot_seconds']:.1f} s of engine boot"
                f" (playbook {roll['playbook_seconds']:.1f} s)"
            )
    growth = result["growth_per_added_node"]
    lines.append(
        f"from two hosts to three: no-op {growth['noop_seconds']:+.1f} s (ratio x{growth['noop_ratio']:.2f}),"
        f" orchestration before the engine {growth['before_engine_seconds']:+.1f} s"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()
    try:
        result = measure()
    except LabError as err:
        print(err, file=sys.stderr)
        return 1
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return exit_code("growth", result)


if __name__ == "__main__":
    sys.exit(main())
