# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``serving_state``'s decision (``_reconcile.decide``) from a case table, no node, no mocks.

A row: the state asked, what the node holds (its document, the files there) and the
options -> the plan: the refusal, the services to stop, the steps in order
(``write <path>``/``remove <path>``), the files left in place, daemon-reload, the checks.
"""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.localinference.vllm.plugins.module_utils.serve._reconcile import (
    ABSENT,
    DIRECTORY,
    REMOVABLE,
    SPECIAL,
    Observed,
    decide,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import dump

STATE = "/etc/localinference/serving.json"
PREVIOUS = "/etc/localinference/serving.previous.json"
STAGING = "/etc/localinference/staging"
STAGED_DOC = f"{STAGING}/serving.json"
STAGED_UNIT = f"{STAGING}/units/localinference-vllm.container"
STAGED_RAY = f"{STAGING}/units/localinference-ray.container"
UNIT = "/etc/containers/systemd/localinference-vllm.container"
RAY = "/etc/containers/systemd/localinference-ray.container"
NEW, OLD = "a" * 64, "b" * 64

DOCUMENT = {"recipe_hash": NEW, "start_order": ["localinference-vllm.service"]}
WANTED = {
    "document": DOCUMENT,
    "units": [{"name": "localinference-vllm.container", "path": UNIT, "content": "new unit\n"}],
}
LIVE = {"recipe_hash": OLD, "start_order": ["localinference-ray.service"]}
TRUSTED = {
    "valid": True,
    "recipe_hash": OLD,
    "recipe": {},
    "start_order": ["localinference-ray.service", "localinference-vllm.service"],
    "units": [{"path": UNIT}, {"path": RAY}],
}
NOTHING = {"valid": False, "recipe_hash": None, "recipe": None, "start_order": [], "units": []}
# The node already holds what is asked.
CURRENT = {STATE: dump(DOCUMENT), UNIT: "new unit\n", STAGED_DOC: dump(DOCUMENT), STAGED_UNIT: "new unit\n"}
BLOCKING = [{"id": "F27", "blocking": True, "message": "tp 3 does not divide 32 heads"}]
WARNING = [{"id": "F14", "blocking": False, "message": "a warning"}]
DIFF = ["serving.json: missing on the node (never rolled out, or removed)"]


def left(path: str, what: str) -> str:
    return f"{path}: is {what}, not a unit file the collection wrote; left in place"


CASES: list[dict[str, Any]] = [
    # --- staged: only the staging place is written -------------------------------------
    {"id": "staged-fresh", "state": "staged", "trusted": NOTHING, "diff": DIFF,
     "plan": {"steps": [f"write {STAGED_DOC}", f"write {STAGED_UNIT}"]}},
    {"id": "staged-already-there", "state": "staged", "texts": CURRENT,
     "plan": {}},
    {"id": "staged-warning-is-not-blocking", "state": "staged", "texts": CURRENT,
     "options": {"problems": WARNING}, "plan": {}},
    {"id": "staged-checks-run-after-the-steps", "state": "staged", "texts": CURRENT,
     "options": {"checks": True}, "plan": {"checks": "staged"}},
    {"id": "staged-removes-a-stale-own-unit-keeps-a-foreign-file", "state": "staged",
     "texts": CURRENT, "names": ["other.container", "localinference-vllm.container",
                                 "localinference-ray.container"],
     "kinds": {STAGED_RAY: REMOVABLE},
     "plan": {"steps": [f"remove {STAGED_RAY}"],
              "refused": [f"{STAGING}/units/other.container: not a unit this collection writes; "
                          "left in place (the Quadlet check reads it too)"]}},
    {"id": "staged-blocking-problem-refuses", "state": "staged", "options": {"problems": BLOCKING},
     "plan": {"refusal": "F27: tp 3 does not divide 32 heads"}},
    {"id": "staged-document-is-a-directory", "state": "staged", "directories": [STAGED_DOC],
     "plan": {"refusal": f"staging_dir: {STAGED_DOC} is a directory where a file belongs; remove it "
                         "or choose another staging_dir"}},
    # --- a directory at path: refused in every state, before anything is written ---------
    *({"id": f"{state}-state-path-is-a-directory", "state": state, "directories": [STATE],
       "texts": CURRENT, "diff": DIFF, "options": {"problems": BLOCKING, "checks": True},
       "plan": {"refusal": f"path: {STATE} is a directory where a file belongs; remove it or "
                           "choose another path"}}
      for state in ("staged", "present", "verified", "absent")),
    # --- present: back up, remove what is no longer rendered, write, reload -------------
    {"id": "present-new-recipe", "state": "present",
     "kinds": {RAY: REMOVABLE},
     "plan": {"stop": None, "steps": [f"write {PREVIOUS}", f"remove {RAY}", f"write {UNIT}",
                                      f"write {STATE}"]}},
    {"id": "present-stop-live-and-reload", "state": "present", "kinds": {RAY: REMOVABLE},
     "options": {"stop_live": True, "daemon_reload": True},
     "plan": {"stop": ["localinference-ray.service", "localinference-vllm.service"],
              "steps": [f"write {PREVIOUS}", f"remove {RAY}", f"write {UNIT}", f"write {STATE}"],
              "reload": True}},
    {"id": "present-no-reload-in-check-mode", "state": "present", "kinds": {RAY: REMOVABLE},
     "options": {"daemon_reload": True, "check_mode": True},
     "plan": {"steps": [f"write {PREVIOUS}", f"remove {RAY}", f"write {UNIT}", f"write {STATE}"]}},
    {"id": "present-same-hash-no-backup", "state": "present",
     "trusted": {**TRUSTED, "recipe_hash": NEW, "units": [{"path": UNIT}]},
     "texts": {UNIT: "edited\n", STATE: dump(DOCUMENT)}, "options": {"daemon_reload": True},
     "plan": {"steps": [f"write {UNIT}"], "reload": True}},
    {"id": "present-only-the-document-changes-no-reload", "state": "present",
     "trusted": {**TRUSTED, "units": [{"path": UNIT}]}, "texts": {UNIT: "new unit\n"},
     "options": {"daemon_reload": True},
     "plan": {"steps": [f"write {PREVIOUS}", f"write {STATE}"]}},
    {"id": "present-malformed-document-is-no-rollback-target", "state": "present",
     "trusted": NOTHING, "plan": {"steps": [f"write {UNIT}", f"write {STATE}"]}},
    {"id": "present-converged", "state": "present",
     "trusted": {**TRUSTED, "recipe_hash": NEW, "units": [{"path": UNIT}]}, "texts": CURRENT,
     "options": {"daemon_reload": True, "stop_live": True},
     "plan": {"stop": ["localinference-ray.service", "localinference-vllm.service"]}},
    {"id": "present-state-path-is-a-directory", "state": "present", "directories": [STATE, UNIT],
     "plan": {"refusal": f"path: {STATE} is a directory where a file belongs; remove it or "
                         "choose another path"}},
    {"id": "present-unit-path-is-a-directory", "state": "present", "directories": [UNIT],
     "plan": {"refusal": f"unit_dir: {UNIT} is a directory where a file belongs; remove it or "
                         "choose another unit_dir"}},
    {"id": "present-previous-path-is-a-directory", "state": "present", "directories": [PREVIOUS],
     "plan": {"refusal": f"path: {PREVIOUS} is a directory where a file belongs; remove it or "
                         "choose another path"}},
    {"id": "present-stale-unit-that-is-a-directory", "state": "present",
     "kinds": {RAY: DIRECTORY},
     "plan": {"steps": [f"write {PREVIOUS}", f"write {UNIT}", f"write {STATE}"],
              "refused": [left(RAY, "a directory")]}},
    # --- absent: remove the live document's units, never anything else -----------------
    {"id": "absent-removes-files-and-links", "state": "absent",
     "kinds": {UNIT: REMOVABLE, RAY: REMOVABLE}, "options": {"problems": BLOCKING},
     "plan": {"steps": [f"remove {UNIT}", f"remove {RAY}"]}},
    {"id": "absent-already-gone", "state": "absent", "kinds": {UNIT: ABSENT}, "plan": {}},
    {"id": "absent-leaves-what-is-not-a-file", "state": "absent",
     "kinds": {UNIT: SPECIAL, RAY: "Permission denied"},
     "plan": {"refused": [left(UNIT, "not a regular file"),
                          f"{RAY}: cannot be inspected (Permission denied); left in place"]}},
    {"id": "absent-nothing-trusted", "state": "absent", "trusted": NOTHING, "plan": {}},
    # --- verified: changes nothing --------------------------------------------------------
    {"id": "verified-differs-f10", "state": "verified", "diff": DIFF, "options": {"checks": True},
     "plan": {"refusal": "the reconciled state on this node differs from the inventory (F10); "
                         "run the rollout (rm -> update -> verify -> start) instead of starting "
                         "it: " + DIFF[0]}},
    {"id": "verified-matches", "state": "verified", "plan": {}},
    {"id": "verified-matches-with-checks", "state": "verified", "options": {"checks": True},
     "plan": {"checks": "live"}},
    {"id": "verified-no-live-checks-in-check-mode", "state": "verified",
     "options": {"checks": True, "check_mode": True}, "plan": {}},
]  # fmt: skip

DEFAULT_OPTIONS = {
    "path": STATE,
    "staging_dir": STAGING,
    "problems": [],
    "stop_live": False,
    "daemon_reload": False,
    "checks": False,
    "check_mode": False,
}
DEFAULT_PLAN = {"refusal": None, "stop": None, "steps": [], "refused": [], "reload": False, "checks": ""}


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_decide(case: dict[str, Any]) -> None:
    observed = Observed(
        texts=case.get("texts", {}),
        directories=frozenset(case.get("directories", ())),
        kinds=case.get("kinds", {}),
        staged_names=tuple(case.get("names", ())),
    )
    plan = decide(
        case["state"],
        WANTED,
        LIVE,
        case.get("trusted", TRUSTED),
        case.get("diff", []),
        observed,
        {**DEFAULT_OPTIONS, **case.get("options", {})},
    )
    got = {
        "refusal": plan.refusal,
        "stop": list(plan.stop) if plan.stop is not None else None,
        "steps": [f"{step.action} {step.path}" for step in plan.steps],
        "refused": list(plan.refused),
        "reload": plan.reload,
        "checks": plan.checks,
    }
    assert got == {**DEFAULT_PLAN, **case["plan"]}


def test_a_backup_holds_the_live_document_and_writes_carry_their_option() -> None:
    plan = decide("present", WANTED, LIVE, TRUSTED, [], Observed(), DEFAULT_OPTIONS)
    backup, unit, state = plan.steps
    assert (backup.text, backup.option, backup.unit) == (dump(LIVE), "path", False)
    assert (unit.text, unit.option, unit.unit) == ("new unit\n", "unit_dir", True)
    assert (state.text, state.option, state.unit) == (dump(DOCUMENT), "path", False)
