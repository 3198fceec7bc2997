# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``--check --diff`` of a changed recipe shows what would change and changes nothing. Read-only.

The rollout of a recipe with another ``max_num_seqs`` in check mode: it ends
without a failure, reports the units it would stop and the files it would
write, shows the state document's diff, and afterwards every node runs the
same engine (same systemd invocation) from the same state document, staging
place and guard programs as before.
"""

from __future__ import annotations

import pytest

from lab.harness import (
    HEAD,
    HOSTS,
    SERVING_STATE,
    inventory_recipe,
    read_text,
    run_playbook,
    streams_a_token,
    unit_invocations,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

WATCHED = (
    SERVING_STATE,
    "/etc/localinference/staging/serving.json",
    "/usr/local/libexec/localinference/admission",
)
PLAN = "/etc/localinference/plan.json"


def snapshot() -> dict[tuple[str, str], str]:
    files = {(host, path): read_text(host, path) for host in HOSTS for path in WATCHED}
    return {**files, (HEAD, PLAN): read_text(HEAD, PLAN)}


def test_check_diff_of_a_changed_recipe_changes_nothing():
    recipe = inventory_recipe()
    changed = {**recipe, "max_num_seqs": recipe.get("max_num_seqs", 4) + 4}
    before, invocations = snapshot(), unit_invocations()
    run = run_playbook("site.yml", "--check", "--diff", tags="rollout", extra_vars={"vllm_recipe": changed})
    assert run.rc == 0, run.tail()
    assert "Apply | rm - stop the old units; update - write the reconciled state and units" in run.stdout
    assert f'"max_num_seqs": {changed["max_num_seqs"]}' in run.stdout, "the diff does not show the new value"
    assert run.changed() > 0, run.tail()
    assert unit_invocations() == invocations, "check mode started or stopped a unit"
    assert snapshot() == before, "check mode wrote a file"
    assert streams_a_token(timeout=60)
