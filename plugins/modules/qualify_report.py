#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: qualify_report
short_description: Write the qualification report (report.json, report.md, PNG plots) and decide promote or challenger
version_added: 0.2.0
description:
  - Turns the results of M(localinference.vllm.qualify_check) calls, two snapshots of vLLM's
    C(/metrics) (parsed with C(prometheus_client)) and vLLM's periodic stats log lines (median,
    Tukey IQR and peak per window) into C(report.json) and C(report.md) with PNG plots drawn by
    matplotlib on the controller (TTFT and prefill tok/s by context rung, decode tok/s over time,
    concurrency against context from the plan, achieved against expected).
  - The verdict is C(promote) only when every check passed or was not meaningful, every figure of
    the recipe's C(expected) block is met, every node keeps O(reserve_gib) free after the load
    (F18; least free card on discrete GPUs, C(MemAvailable) on unified memory) and no figure
    regressed against O(promoted), the last promoted report of the same model; otherwise
    C(challenger) with the reasons.
  - Runs where the report is written (the controller). In check mode nothing is written.
extends_documentation_fragment:
  - localinference.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
options:
  checks:
    description: The registered results of M(localinference.vllm.qualify_check), one per check.
    type: list
    elements: dict
    required: true
  dest:
    description: The directory to write into (created when missing).
    type: path
    required: true
  model:
    description: The served model name the checks ran against.
    type: str
    required: true
  endpoint:
    description: The base URL the checks used.
    type: str
    required: true
  recipe_hash:
    description: The served recipe's hash (the plan's C(recipe_hash)).
    type: str
  expected:
    description:
      - The recipe's C(expected) block in the one vocabulary of C(plugins/module_utils/qualify/_expected.py)
        (C(decode_tps_single_stream), C(decode_tps_at_<N>_streams), C(ttft_s_at_<N>_tokens),
        C(prefill_tps_at_<N>_tokens), C(max_context), C(concurrent_requests)); each entry a number, a
        C([low, high]) range or the recipe's mapping (C(value), C(unit), C(at), C(source), C(quote)).
      - Every declared figure must be met, measured at its condition; C(value=null) is shown, not judged.
        An unknown key fails naming C(expected.<key>) and listing the known ones.
    type: dict
    default: {}
  metrics_before:
    description: vLLM's C(/metrics) text before the checks.
    type: str
  metrics_after:
    description: vLLM's C(/metrics) text after the checks.
    type: str
  log_text:
    description: vLLM's log over the checks (its periodic stats and SpecDecoding lines are summarised).
    type: str
  nodes:
    description: Per host, C(memory) (M(localinference.vllm.memory_facts)) and C(gpu) (M(localinference.vllm.gpu_facts)) after the load.
    type: dict
    default: {}
  reserve_gib:
    description: Free memory every node must keep after the load (F18); 0 checks nothing.
    type: float
    default: 0
  promoted:
    description: The last promoted report's C(model), C(figures), C(recipe_hash) and C(at) (from C(/etc/localinference/qualify.json)).
    type: dict
  tolerance:
    description: Relative drop of a rate figure (decode, TTFT, prefill, prefix hits) that counts as a regression.
    type: float
    default: 0.1
  plan:
    description: The saved plan (C(/etc/localinference/plan.json) result) for the concurrency-against-context plot.
    type: dict
  plots:
    description: Draw the PNG plots (needs matplotlib on the controller).
    type: bool
    default: true
author:
  - localinference.vllm developers (@localinference)
"""

EXAMPLES = r"""
- name: Qualify | Write the report
  localinference.vllm.qualify_report:
    checks: "{{ qualify_results }}"
    dest: "{{ playbook_dir }}/../.lab/qualify"
    model: localinference/tiny-deepseek
    endpoint: http://127.0.0.1:18080/localinference/tiny-deepseek/v1
    reserve_gib: 3
  delegate_to: localhost
"""

RETURN = r"""
verdict:
  description: C(promote) or C(challenger).
  returned: success
  type: str
reasons:
  description: Why the verdict is C(challenger) (empty for C(promote)).
  returned: success
  type: list
  elements: str
report:
  description: The whole report as written to C(report.json) (C(checks), C(summary), C(figures), C(verdict), ...).
  returned: success
  type: dict
files:
  description: The files written (empty in check mode).
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._report_write import run


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "checks": {"type": "list", "elements": "dict", "required": True},
            "dest": {"type": "path", "required": True},
            "model": {"type": "str", "required": True},
            "endpoint": {"type": "str", "required": True},
            "recipe_hash": {"type": "str"},
            "expected": {"type": "dict", "default": {}},
            "metrics_before": {"type": "str"},
            "metrics_after": {"type": "str"},
            "log_text": {"type": "str"},
            "nodes": {"type": "dict", "default": {}},
            "reserve_gib": {"type": "float", "default": 0},
            "promoted": {"type": "dict"},
            "tolerance": {"type": "float", "default": 0.1},
            "plan": {"type": "dict"},
            "plots": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
