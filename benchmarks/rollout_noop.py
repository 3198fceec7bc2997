# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A no-op re-run against the lab, against a plain fact-gathering play on the same hosts.

Prints, from one run: wall time of the no-op run, of `gather_facts` on the same
hosts, their ratio, the number of changed tasks (must be 0) and of restarts of
the vLLM units (InvocationID before and after; must be 0). Needs a lab that
`make lab` has brought up and served.

    .venv/bin/python benchmarks/rollout_noop.py [--playbook playbooks/site.yml]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.harness import LAB_DIR, LabError, lab_up, run_playbook, unit_invocations

FACTS_PLAY = """---
- name: Plain fact gathering on the lab hosts
  hosts: vllm_cluster
  gather_facts: true
  tasks: []
"""


def measure(playbook: str) -> int:
    before = unit_invocations()
    noop = run_playbook(playbook)
    after = unit_invocations()
    with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=LAB_DIR, delete=True) as play:
        play.write(FACTS_PLAY)
        play.flush()
        facts = run_playbook(play.name)

    counters = noop.recap
    changed = noop.changed()
    failed = sum(host.get("failed", 0) + host.get("unreachable", 0) for host in counters.values())
    restarts = sum(1 for host in before if before[host] != after[host])
    print(
        f"no-op {playbook}: {noop.seconds:.1f} s, rc={noop.rc}, changed={changed}, failed={failed}"
    )
    print(f"gather_facts play: {facts.seconds:.1f} s, rc={facts.rc}")
    print(f"ratio no-op / gather_facts: {noop.seconds / facts.seconds:.2f}")
    print(f"vLLM unit restarts: {restarts} (InvocationID before {before}, after {after})")
    if noop.rc or changed or restarts:
        print(noop.tail(), file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--playbook", default="playbooks/site.yml")
    args = parser.parse_args()
    if not lab_up():
        print("needs the lab hosts spark-head and spark-worker running (make lab)", file=sys.stderr)
        return 2
    try:
        return measure(args.playbook)
    except LabError as err:
        print(err, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
