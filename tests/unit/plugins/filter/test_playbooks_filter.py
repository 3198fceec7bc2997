# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``work_hosts``: every stage play's hosts, none once site.yml found nothing to do; and every
play of the stage playbooks names its hosts through it (one way, no copied condition)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.filter.playbooks import trial_hosts, work_hosts

PLAYBOOKS = Path(__file__).resolve().parents[4] / "playbooks"
# Plays that must run whatever the shortcut decided: the shortcut itself, the doctor
# (read-only, its own entry point) and the upgrade's own plays.
OWN_HOSTS = {"site_converged.yml", "doctor.yml", "upgrade.yml", "site.yml", "tune.yml", "tune_trial.yml"}


@pytest.mark.parametrize(
    ("pattern", "localhost", "want"),
    [
        ("vllm_cluster", {"localhost": {}}, "vllm_cluster"),
        # The first play of a run: hostvars is undefined, the template passes {}.
        ("vllm_cluster", {}, "vllm_cluster"),
        ("vllm_head[0]", {"localinference_nothing_to_do": False}, "vllm_head[0]"),
        ("localhost", {"localinference_nothing_to_do": True}, []),
        ("vllm_workers", {"localinference_nothing_to_do": "true"}, []),
        # A tune's slot without a trial: every stage play is idle too.
        ("vllm_cluster", {"localinference_tune_idle": True}, []),
        ("vllm_cluster", {"localinference_tune_idle": False, "localinference_nothing_to_do": False}, "vllm_cluster"),
    ],
)
def test_work_hosts(pattern: str, localhost: dict[str, Any], want: Any) -> None:
    assert work_hosts(pattern, {"localhost": localhost}) == want


@pytest.mark.parametrize(
    ("pattern", "hostvars", "message"),
    [
        ("", {"localhost": {}}, "the host pattern must be a non-empty string"),
        (None, {"localhost": {}}, "the host pattern must be a non-empty string"),
        ("vllm_cluster", None, r"pass hostvars \| default\(\{\}\) as its argument"),
        ("vllm_cluster", {"localhost": {"localinference_nothing_to_do": "maybe"}},
         "localinference_nothing_to_do must be true or false"),
    ],
)  # fmt: skip
def test_work_hosts_refuses(pattern: Any, hostvars: Any, message: str) -> None:
    with pytest.raises(AnsibleFilterError, match=message):
        work_hosts(pattern, hostvars)


def test_every_stage_play_names_its_hosts_through_work_hosts() -> None:
    wanted = re.compile(
        r"^\{\{ '[\w\[\]:&!]+' \| localinference\.vllm\.work_hosts\(hostvars \| default\(\{\}\)\) \}\}$"
    )
    plays = [
        (path.name, play)
        for path in sorted(PLAYBOOKS.glob("*.yml"))
        if path.name not in OWN_HOSTS
        for play in yaml.safe_load(path.read_text()) or []
        if "hosts" in play
    ]
    assert len(plays) >= 25, len(plays)
    wrong = [(name, play["name"], play["hosts"]) for name, play in plays if not wanted.match(play["hosts"])]
    assert wrong == []


@pytest.mark.parametrize(
    ("localhost", "want"),
    [
        ({}, "vllm_head"),
        # A promoted upgrade set the nothing-to-do switch: its report still runs.
        ({"localinference_nothing_to_do": True}, "vllm_head"),
        ({"localinference_tune_idle": True}, []),
    ],
)
def test_trial_hosts(localhost: dict[str, Any], want: Any) -> None:
    assert trial_hosts("vllm_head", {"localhost": localhost}) == want


def test_trial_hosts_refuses_a_switch_that_is_not_a_boolean() -> None:
    with pytest.raises(AnsibleFilterError, match="localinference_tune_idle must be true or false"):
        trial_hosts("vllm_head", {"localhost": {"localinference_tune_idle": "maybe"}})


def test_the_upgrades_own_plays_name_their_hosts_through_trial_hosts() -> None:
    """A tune's slot without a trial must skip the whole upgrade, its begin and report too."""
    plays = [p for p in yaml.safe_load((PLAYBOOKS / "upgrade.yml").read_text()) if "hosts" in p]
    assert len(plays) == 3
    assert all("localinference.vllm.trial_hosts(hostvars | default({}))" in p["hosts"] for p in plays)
