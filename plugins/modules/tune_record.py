#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: tune_record
short_description: Write the tune's record, the tuned recipe's diff and the plot of its trials
version_added: 0.3.0
description:
  - Writes C(tune.json) (every candidate, what the planner said of it, every trial with its
    qualification figures, outcome and seconds), C(tuned-recipe.diff) (the tuned recipe against
    the inventory's C(vllm_recipe), for review; never written into the inventory) and
    C(trials.png) into O(dest) on the controller, each replaced atomically.
  - The roles/tune calls it after the proposal and after every trial, so an interrupted tune
    leaves a record of what it did.
author:
  - localinference.vllm developers (@localinference)
options:
  dest:
    description: The directory (created when missing).
    type: path
    required: true
  status:
    description: C(running) while trials remain, C(done) at the end.
    type: str
    choices: [running, done]
    default: running
  stopped:
    description: Why the tune stopped (or the last thing it did).
    type: str
    default: ''
  findings:
    description: The findings the rules answer.
    type: list
    elements: dict
    default: []
  candidates:
    description: The candidates the planner let through, in trial order.
    type: list
    elements: dict
    default: []
  dropped:
    description: The candidates the planner refused, each with its numbers.
    type: list
    elements: dict
    default: []
  skipped:
    description: The rules that had nothing to change.
    type: list
    elements: dict
    default: []
  trials:
    description: The trials so far.
    type: list
    elements: dict
    default: []
  before:
    description: The serving stack's recipe, checks and figures when the tune began.
    type: dict
    required: true
  after:
    description: The stack serving now (the last promoted trial, or the one before the tune).
    type: dict
    required: true
  inventory_recipe:
    description: The inventory's C(vllm_recipe), the left side of the diff.
    type: dict
    required: true
  weights:
    description: The objective's weights.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Tune | Record the trials
  localinference.vllm.tune_record:
    dest: "{{ tune_dir }}"
    status: done
    trials: "{{ tune_trials }}"
    before: "{{ tune_before }}"
    after: "{{ tune_incumbent }}"
    inventory_recipe: "{{ tune_inventory_recipe }}"
  delegate_to: localhost
"""

RETURN = r"""
tune_json:
  description: The path of C(tune.json).
  returned: success
  type: str
diff:
  description: The tuned recipe's diff against the inventory's (empty when nothing was promoted).
  returned: success
  type: str
figures:
  description: "The objective's figures, one line each: C(<name>: <before> -> <after>)."
  returned: success
  type: list
  elements: str
plot:
  description: The path of C(trials.png), or null (no trial yet, or no matplotlib).
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.tune._review_files import record

ARGUMENT_SPEC = {
    "dest": {"type": "path", "required": True},
    "status": {"type": "str", "choices": ["running", "done"], "default": "running"},
    "stopped": {"type": "str", "default": ""},
    "findings": {"type": "list", "elements": "dict", "default": []},
    "candidates": {"type": "list", "elements": "dict", "default": []},
    "dropped": {"type": "list", "elements": "dict", "default": []},
    "skipped": {"type": "list", "elements": "dict", "default": []},
    "trials": {"type": "list", "elements": "dict", "default": []},
    "before": {"type": "dict", "required": True},
    "after": {"type": "dict", "required": True},
    "inventory_recipe": {"type": "dict", "required": True},
    "weights": {"type": "dict", "default": {}},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(**record(module))


if __name__ == "__main__":
    main()
