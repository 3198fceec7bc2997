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

from _lab import ROOT, ansible_playbook, invocations, recap

FACTS_PLAY = """---
- name: Plain fact gathering on the lab hosts
  hosts: vllm_cluster
  gather_facts: true
  tasks: []
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--playbook", default="playbooks/site.yml")
    args = parser.parse_args()

    before = invocations()
    noop_s, noop = ansible_playbook(str(ROOT / args.playbook))
    after = invocations()
    with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=ROOT / ".lab", delete=True) as play:
        play.write(FACTS_PLAY)
        play.flush()
        facts_s, facts = ansible_playbook(play.name)

    counters = recap(noop.stdout)
    changed = sum(host.get("changed", 0) for host in counters.values())
    failed = sum(host.get("failed", 0) + host.get("unreachable", 0) for host in counters.values())
    restarts = sum(1 for host in before if before[host] != after[host])
    print(
        f"no-op {args.playbook}: {noop_s:.1f} s, rc={noop.returncode}, changed={changed}, failed={failed}"
    )
    print(f"gather_facts play: {facts_s:.1f} s, rc={facts.returncode}")
    print(f"ratio no-op / gather_facts: {noop_s / facts_s:.2f}")
    print(f"vLLM unit restarts: {restarts} (InvocationID before {before}, after {after})")
    if noop.returncode or changed or restarts:
        print(noop.stdout[-3000:], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
