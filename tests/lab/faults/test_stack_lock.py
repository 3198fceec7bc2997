# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stack lockfile against the real lab (make lab first): issue 16, point 4.

1. After the lab's rollout the head's /etc/localinference/stack.lock.json holds
   the whole stack that served, per node, and passes the collection's own
   schema check: the recipe hash each node serves, the lab image by digest, the
   vLLM version of the boot, the weights revision and manifest digest, the kernel.
2. A rollout of a changed recipe (max_num_seqs + 4) prints what changed since
   the last good stack; `--tags revert` then serves the previous recipe again
   through the normal rollout, and the head's recipe hash is the old one.

Each rollout that restarts boots vLLM for real (about 1-3 minutes on two
shared cores).
"""

from __future__ import annotations

import re

import pytest

from lab.harness import (
    HEAD,
    HOSTS,
    MODEL_REVISION,
    SERVING_STATE,
    STATE_DIR,
    exec_on,
    inventory_recipe,
    module_utils,
    read_json,
    read_text,
    rollout,
    streams_a_token,
)

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("lab_hosts")]

STACK_LOCK = f"{STATE_DIR}/stack.lock.json"
HEX64 = re.compile(r"[0-9a-f]{64}")


def lock_entries() -> list[dict]:
    """The head's lockfile as the collection reads it back (no finding allowed)."""
    judge = module_utils("upgrade._stack_lock")
    entries, findings = judge.check_document(read_text(HEAD, STACK_LOCK), STACK_LOCK)
    assert findings == [], findings
    return entries


def serving_hash(host: str = HEAD) -> str:
    return read_json(host, SERVING_STATE)["recipe_hash"]


def ensure_recorded() -> None:
    """The stack serving now is the newest entry (a lab converged before the lockfile
    existed, or changed since by hand, gets it from a rollout that restarts nothing)."""
    if exec_on(HEAD, "test", "-f", STACK_LOCK, check=False).returncode == 0:
        entries = lock_entries()
        if entries and entries[0]["nodes"][HEAD]["recipe_hash"] == serving_hash():
            return
    run = rollout(tags="rollout")
    assert run.rc == 0, run.tail()


def test_the_rollout_records_the_whole_stack_that_served():
    ensure_recorded()
    entries = lock_entries()
    assert entries, f"{STACK_LOCK} holds no stack"
    newest = entries[0]
    judge = module_utils("upgrade._stack_lock")
    assert set(newest["nodes"]) == set(HOSTS)
    image = inventory_recipe()["image"]
    for host, node in newest["nodes"].items():
        assert set(node) == set(judge.NODE_FIELDS), host
        assert node["recipe_hash"] == serving_hash(host), host
        assert node["rank"] == (0 if host == HEAD else 1)
        assert node["image"] == image and node["image_digest"] == image.split("@", 1)[1]
        assert node["vllm_version"] == "0.32.0", (host, node["vllm_version"])
        assert node["revision"] == MODEL_REVISION
        assert HEX64.fullmatch(node["manifest_digest"] or ""), (host, node["manifest_digest"])
        assert node["kernel"] == exec_on(host, "uname", "-r").stdout.strip()
    digests = {node["manifest_digest"] for node in newest["nodes"].values()}
    assert len(digests) == 1, f"the nodes' weights differ: {digests}"


# Three rollouts (changed, revert, back): about 3 min in the lab.
@pytest.mark.extended
def test_a_changed_recipe_shows_its_diff_and_revert_restores_the_previous_recipe():
    ensure_recorded()
    recipe = inventory_recipe()
    before = serving_hash()
    seqs = recipe.get("max_num_seqs", 4)
    changed = rollout({**recipe, "max_num_seqs": seqs + 4}, tags="rollout")
    try:
        assert changed.rc == 0, changed.tail()
        assert f"recipe.max_num_seqs: {seqs} -> {seqs + 4}" in changed.flat, changed.tail()
        assert "changed since the last good stack" in changed.flat, changed.tail()
        assert lock_entries()[1]["nodes"][HEAD]["recipe_hash"] == before

        reverted = rollout(tags="revert")
        assert reverted.rc == 0, reverted.tail()
        assert "Reverting to the stack recorded at" in reverted.flat, reverted.tail()
        assert f"recipe.max_num_seqs: {seqs + 4} -> {seqs}" in reverted.flat, reverted.tail()
        assert serving_hash() == before
        assert {serving_hash(host) for host in HOSTS} == {before}
        assert lock_entries()[0]["nodes"][HEAD]["recipe_hash"] == before
        assert streams_a_token(timeout=60)
    finally:
        if serving_hash() != before:
            back = rollout(tags="rollout")
            assert back.rc == 0, back.tail()
