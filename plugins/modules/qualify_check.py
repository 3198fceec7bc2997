#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: qualify_check
short_description: Run one qualification check against a served model and judge it
version_added: 0.2.0
description:
  - Sends real requests to an OpenAI-compatible vLLM endpoint (normally the ingress route an agent
    uses), measures them and judges the answers in pure Python (C(module_utils/qualify/*.py)).
    One check per call; C(playbooks/qualify.yml) runs them all and writes the report.
  - The status is C(pass), C(fail) or C(not_meaningful). A check fails when the serving stack
    breaks its contract (an HTTP error, reasoning or tool-call markup in C(content),
    C(finish_reason=tool_calls) with arguments that are not JSON, a refused prompt the plan said
    fits, a stream that loses the tool call its unstreamed twin returns) or when the model does not
    do the task. When O(model_limitation) says why the served model cannot do it (the lab's scripted
    model writes no JSON of its own), a held contract with the model's part missing is
    C(not_meaningful) with that reason, never a pass.
  - A failing check does not fail the task; the playbook decides from all of them. Bad input (an
    unknown check, a malformed O(params) entry) fails the task naming the option.
  - Only the Python standard library talks HTTP; every exchange, a stream included, ends within
    O(timeout) seconds (a watchdog closes the socket at the deadline).
extends_documentation_fragment:
  - localinference.vllm.attributes.INFO
options:
  check:
    description:
      - The check to run. C(smoke) models and a streamed and unstreamed completion;
        C(structured_json) C(response_format) json_schema; C(tools) and C(tools_stream) a tool call
        with C(tool_choice=auto); C(tool_continuation) a turn carrying a tool result;
        C(responses_api) C(/v1/responses); C(anthropic_messages) C(/v1/messages) (not meaningful
        where vLLM lacks it); C(reasoning_split) which field carries the reasoning;
        C(concurrency) N requests at once; C(context_ladder) prompts at fractions of the context
        and a needle; C(shared_prefix) prefix-cache hits of a batch; C(reasoning_budget) an answer
        within the client's output budget; C(truncated_tool_call) a call cut by C(max_tokens);
        C(head_of_line) a short request's TTFT behind a long prefill.
    type: str
    required: true
    choices: [smoke, structured_json, tools, tools_stream, tool_continuation, responses_api,
              anthropic_messages, reasoning_split, concurrency, context_ladder, shared_prefix,
              reasoning_budget, truncated_tool_call, head_of_line]
  base_url:
    description: The OpenAI base URL, ending in C(/v1) (the ingress route C(<public url>/<served name>/v1)).
    type: str
    required: true
  api_key:
    description: The bearer key the ingress requires.
    type: str
  ca_path:
    description: The CA file an C(https) endpoint's certificate chains to (the ingress's C(ingress_ca_file)).
    type: path
  model:
    description: The served model name; default the first model C(/models) lists.
    type: str
  max_model_len:
    description:
      - The context the plan expects the server to serve. The context ladder and head-of-line checks
        read the served one from C(/models) and fail when the two differ.
    type: int
  timeout:
    description: Seconds every HTTP exchange may take in total, streams included.
    type: float
    default: 300
  metrics_url:
    description:
      - vLLM's C(/metrics) as seen from where the module runs, read with the same key.
      - Default the base URL with C(/metrics) in place of C(/v1) (the ingress routes
        C(<served name>/metrics) to vLLM). An empty string reads no metrics (the concurrency check
        then judges from timings only; the shared-prefix check fails, naming this option).
    type: str
  model_limitation:
    description:
      - Why the served model cannot be expected to do this check's task (for example
        C(the lab's scripted model writes no JSON of its own)). With it, a check whose server
        contract holds but whose model part is missing is C(not_meaningful) with this reason.
    type: str
    default: ""
  repeat:
    description:
      - Run the check this many times (repeated-run evidence); the status is C(pass) only when
        every run passed, and RV(runs) lists each.
    type: int
    default: 1
  params:
    description:
      - Check-specific parameters. C(max_tokens) (most checks); C(tool) (an OpenAI tool
        definition, default opencode's C(read)) and C(tool_arguments) (tool checks); C(schema),
        C(prompt) (C(structured_json)); C(cut_tokens) (C(truncated_tool_call), default
        C([1, 2, 3, 5])); C(requests), C(min_duration_s), C(min_speedup), C(sample_interval)
        (C(concurrency)); C(fractions) (default C([0.25, 0.5, 0.9, 1.1])), C(needle),
        C(needle_fraction), C(needle_max_tokens) (C(context_ladder)); C(requests),
        C(prefix_tokens) (C(shared_prefix)); C(long_tokens), C(max_stall_s), C(max_stall_share),
        C(min_long_prefill_s) (C(head_of_line)).
    type: dict
    default: {}
author:
  - localinference.vllm developers (@localinference)
"""

EXAMPLES = r"""
- name: Qualify | tools through the ingress
  localinference.vllm.qualify_check:
    check: tools
    base_url: http://head:8080/localinference/tiny-deepseek/v1
    api_key: "{{ lookup('ansible.builtin.file', 'api-key') }}"
    timeout: 120
  register: tools_check

- name: Qualify | a context ladder without a needle (the model cannot retrieve one)
  localinference.vllm.qualify_check:
    check: context_ladder
    base_url: http://127.0.0.1:18080/localinference/tiny-deepseek/v1
    max_model_len: 65536
    params:
      fractions: [0.1, 0.25, 0.5, 1.05]
      needle: false
"""

RETURN = r"""
name:
  description: The check.
  returned: success
  type: str
status:
  description: C(pass), C(fail) or C(not_meaningful).
  returned: success
  type: str
why:
  description: Why it failed or was not meaningful (empty on a pass).
  returned: success
  type: str
timings:
  description: Seconds and rates measured (C(ttft_s), C(completion_s), C(check_s), per-rung TTFT, ...).
  returned: success
  type: dict
evidence:
  description: What the judgement rests on (finish reasons, fields, calls, rungs, metrics).
  returned: success
  type: dict
model:
  description: The served model name the check ran against.
  returned: success
  type: str
runs:
  description: With O(repeat) above 1, C(status) and C(why) of each run.
  returned: success
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._check_target import run
from ansible_collections.localinference.vllm.plugins.module_utils.qualify._checks import CHECKS


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "check": {"type": "str", "required": True, "choices": list(CHECKS)},
            "base_url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "ca_path": {"type": "path"},
            "model": {"type": "str"},
            "max_model_len": {"type": "int"},
            "timeout": {"type": "float", "default": 300},
            "metrics_url": {"type": "str"},
            "model_limitation": {"type": "str", "default": ""},
            "repeat": {"type": "int", "default": 1},
            "params": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
