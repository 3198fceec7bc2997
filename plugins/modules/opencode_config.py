#!/usr/bin/python
# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: opencode_config
short_description: Write or judge the opencode client's provider config against the measured server
version_added: 0.2.0
description:
  - Runs where opencode runs (the operator's workstation). With O(state=present) it merges one
    C(@ai-sdk/openai-compatible) provider and model into an opencode config file (JSON) without
    losing the user's other providers or keys, with C(limit.context), C(limit.input), C(limit.output)
    and the top-level C(compaction.reserved) chosen by the collection's client budget
    (opencode 1.18.33's rules - input is context minus output, and the working budget input minus reserved
    is at least the prompt floor plus 10,240 tokens). The API key is never written, only C({env:NAME}).
  - With O(state=checked) it judges an existing file and changes nothing.
  - Both fail with failure-catalog ids and the numbers - F8 (C(limit.context) above the server's
    context, input plus output or prompt floor plus output above it), F9 (compaction trigger below the
    prompt floor, or less than 10,240 tokens above it), F7 (the server streams reasoning in a field
    the configured client does not read) - and write nothing then.
  - The file is rewritten (and C(changed) is true) only when its parsed content changes; a new file
    gets mode 0600 (it may sit in a home directory), an existing one keeps its mode.
  - opencode also reads JSONC. O(state=checked) reads it; O(state=present) refuses a file with
    comments, because rewriting it would drop them.
author:
  - localinference.vllm developers (@localinference)
extends_documentation_fragment:
  - localinference.vllm.attributes.CHANGES
options:
  path:
    description: The opencode config file, for example C(~/.config/opencode/opencode.json).
    type: path
    required: true
  state:
    description: C(present) writes or merges the provider; C(checked) judges the file and changes nothing.
    type: str
    default: present
    choices: [present, checked]
  provider:
    description: The provider id in opencode's config (C(opencode run -m PROVIDER/MODEL)).
    type: str
    required: true
  model:
    description: The served model name, as C(/v1/models) lists it.
    type: str
    required: true
  max_model_len:
    description: The server's context in tokens (C(max_model_len) of C(/v1/models)).
    type: int
    required: true
  prompt_floor:
    description:
      - opencode's first request in tokens (system prompt plus tool schemas) as the server counts it;
        measure it (the C(agent_client) role does), do not guess.
    type: int
    required: true
  reasoning_key:
    description: The delta field the server streams reasoning in (measured); C(none) when it streams none.
    type: str
    required: true
    choices: [reasoning, reasoning_content, none]
  base_url:
    description: The OpenAI base URL (ending in C(/v1)); required when O(state=present) creates the provider.
    type: str
  api_key_env:
    description: The environment variable holding the API key; the config gets C({env:NAME}).
    type: str
  output_tokens:
    description: C(limit.output); chosen by the client budget when unset.
    type: int
  reserved_tokens:
    description: C(compaction.reserved); opencode's own default (min(20000, output)) when unset.
    type: int
  client_version:
    description: The opencode version the config is for; decides which reasoning fields it reads.
    type: str
    default: 1.18.33
  client_reads:
    description: The reasoning delta fields the client reads, overriding what O(client_version) implies.
    type: list
    elements: str
  provider_name:
    description: The provider's display name when it is created; default O(provider).
    type: str
  model_name:
    description: The model's display name when it is created; default O(model).
    type: str
  settings:
    description:
      - More top-level keys to set, for example C(autoupdate=false) and C(share=disabled) in a test.
        C(provider) and C(compaction) are not allowed here.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Point opencode at the cluster
  localinference.vllm.opencode_config:
    path: ~/.config/opencode/opencode.json
    provider: localinference
    model: deepseek-ai/DeepSeek-V4-Flash
    base_url: https://spark-head.example/deepseek-ai/DeepSeek-V4-Flash/v1
    api_key_env: LOCALINFERENCE_API_KEY
    max_model_len: 262144
    prompt_floor: 11012
    reasoning_key: reasoning

- name: Judge an existing config (the two-Spark field report's context 8192 / reserved 8000 fails with F9)
  localinference.vllm.opencode_config:
    path: ~/.config/opencode/opencode.json
    state: checked
    provider: localinference
    model: deepseek-ai/DeepSeek-V4-Flash
    max_model_len: 16384
    prompt_floor: 8193
    reasoning_key: reasoning
"""

RETURN = r"""
path:
  description: The config file.
  returned: always
  type: str
findings:
  description: Findings C({id, severity, message, fix}) of the judged config (F7, F8, F9, client-config).
  returned: always
  type: list
  elements: dict
limits:
  description:
    - The numbers judged - C(server_context), C(prompt_floor), C(context), C(input), C(output),
      C(reserved), C(working_budget), C(work_room).
  returned: always
  type: dict
budget:
  description: The client budget the collection chose (O(state=present)), as C(plan/_client_budget.plan_client) returns it.
  returned: when state is present
  type: dict
warnings_list:
  description: Notes about the merge (for example a replaced global compaction.reserved).
  returned: always
  type: list
  elements: str
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode import (
    OpencodeConfigError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode_apply import (
    run,
)

ARGUMENT_SPEC: dict[str, Any] = {
    "path": {"type": "path", "required": True},
    "state": {"type": "str", "default": "present", "choices": ["present", "checked"]},
    "provider": {"type": "str", "required": True},
    "model": {"type": "str", "required": True},
    "max_model_len": {"type": "int", "required": True},
    "prompt_floor": {"type": "int", "required": True},
    "reasoning_key": {
        "type": "str",
        "required": True,
        "choices": ["reasoning", "reasoning_content", "none"],
        "no_log": False,
    },
    "base_url": {"type": "str"},
    "api_key_env": {"type": "str", "no_log": False},
    "output_tokens": {"type": "int", "no_log": False},
    "reserved_tokens": {"type": "int", "no_log": False},
    "client_version": {"type": "str", "default": "1.18.33"},
    "client_reads": {"type": "list", "elements": "str"},
    "provider_name": {"type": "str"},
    "model_name": {"type": "str"},
    "settings": {"type": "dict", "default": {}},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module)
    except OpencodeConfigError as exc:
        module.fail_json(msg=str(exc), path=module.params["path"])
    except (OSError, UnicodeDecodeError) as exc:
        module.fail_json(
            msg=f"cannot read or write {module.params['path']}: {exc}", path=module.params["path"]
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
