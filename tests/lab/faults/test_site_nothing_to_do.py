# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml with nothing to do (issue 15): one call per node, then no stage runs.

A whole run records on every node what it depended on and what every stage
left there (/etc/localinference/site.json). The next whole run compares that
record with its own inputs and the node in one call per node, pings every
peer with a full jumbo payload, re-verifies the weights and streams one token
through the ingress; then every stage play has no hosts. A change behind the
collection's back makes every stage run, and the run says why.
"""

from __future__ import annotations

import re

import pytest

from lab.harness import (
    HEAD,
    HOSTS,
    PLAN_RESULT,
    SERVING_STATE,
    exec_on,
    read_json,
    run_playbook,
    streams_a_token,
    unit_invocations,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

SITE = "/etc/localinference/site.json"
NOTHING_TO_DO = "Site | Nothing to do - every node holds what the last whole run left"
STAGE_PLAYS = ("Preflight", "Fabric", "Weights", "Plan", "Ingress", "Agent client", "Qualify")


def whole_run():
    run = run_playbook("site.yml", timeout=1800)
    assert run.rc == 0, run.tail()
    return run


def skipped_plays(run) -> list[str]:
    """The plays that matched no host."""
    return re.findall(r"PLAY \[([^\]]+)\] \*+\nskipping: no hosts matched", run.stdout)


def nothing_to_do(run) -> bool:
    """site_converged.yml's last task ran (its title shows even when skipped)."""
    return re.search(re.escape(NOTHING_TO_DO) + r".*\*+\nok: ", run.stdout) is not None


def assert_nothing_ran(run) -> None:
    assert nothing_to_do(run), run.tail()
    assert run.changed() == 0, run.recap
    skipped = skipped_plays(run)
    for play in STAGE_PLAYS:
        assert play in skipped, f"{play} ran:\n{run.tail()}"
    assert sum(p.startswith("Rollout") for p in skipped) >= 8
    # One call per node, the weights' re-verify, one token: no stage's own task ran.
    assert "localinference.vllm.serve : Stage |" not in run.stdout
    assert "TASK [localinference.vllm.cluster_network : Ping" not in run.stdout


def test_a_whole_run_with_nothing_to_do_stops_after_one_call_per_node():
    whole_run()  # records, if an earlier test left something to do
    before = unit_invocations()
    recorded = {host: read_json(host, SITE) for host in HOSTS}
    run = whole_run()
    assert_nothing_ran(run)
    assert unit_invocations() == before, "a run with nothing to do restarted vLLM"
    assert {host: read_json(host, SITE) for host in HOSTS} == recorded
    head = recorded[HEAD]
    assert head["stage"] == "site" and head["result"]["routes"]
    assert {"preflight", "fabric", "weights", "rollout", "ingress", "plan", "client"} <= set(
        head["result"]["stages"]
    )
    # What the head's record watches: every stage's saved result and the services it runs.
    assert {PLAN_RESULT, SERVING_STATE, "/etc/caddy/Caddyfile"} <= set(
        head["live"]["files"]
    )
    assert {"caddy.service", "localinference-vllm.service"} <= set(head["live"]["units"])
    assert streams_a_token(timeout=30)


def test_a_tagged_run_neither_takes_the_shortcut_nor_records():
    whole_run()
    recorded = exec_on(HEAD, "stat", "-c", "%Y %s %i", SITE).stdout
    run = run_playbook("site.yml", tags="plan", timeout=600)
    assert run.rc == 0, run.tail()
    site_tasks = [line for line in run.stdout.splitlines() if line.startswith("TASK [") and "Site |" in line]
    assert not site_tasks, f"site.yml's own plays ran tasks under --tags: {site_tasks}"
    assert exec_on(HEAD, "stat", "-c", "%Y %s %i", SITE).stdout == recorded


# 124 s in the clean-clone CI of 1fc7702 (a whole run of every stage): make test-lab-extended,
# so CI keeps under the hour.
@pytest.mark.extended
def test_site_reuse_false_runs_every_stage_and_changes_nothing():
    """The documented way past the shortcut: no record compared, every stage runs, nothing
    changes or restarts (the skipped record once failed the token task: its loop is made
    before its when)."""
    whole_run()
    before = unit_invocations()
    run = run_playbook("site.yml", extra_vars={"site_reuse": False}, timeout=1800)
    assert run.rc == 0, run.tail()
    assert not nothing_to_do(run), run.tail()
    assert run.changed() == 0, run.recap
    assert not [play for play in STAGE_PLAYS if play in skipped_plays(run)], run.tail()
    assert "localinference.vllm.serve : Stage |" in run.stdout
    assert unit_invocations() == before, "site_reuse: false restarted vLLM with nothing changed"


def test_a_change_behind_the_collections_back_makes_every_stage_run_and_says_why():
    whole_run()
    # A harmless edit of a watched file: the plan stage writes it back as it was.
    exec_on(HEAD, "sh", "-c", f"echo >> {PLAN_RESULT}")
    before = unit_invocations()
    run = whole_run()
    assert not nothing_to_do(run)
    assert f"{HEAD}: the stages run - {PLAN_RESULT} changed since the stage last ran" in run.flat, (
        run.tail()
    )
    assert "Preflight" not in skipped_plays(run)
    assert unit_invocations() == before, "a rewritten plan.json restarted vLLM"
    assert_nothing_ran(whole_run())
