# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's judge as filters; the judgement lives in ``module_utils/doctor/_judge.py``.

- ``doctor_findings``: the gathered evidence (see ``_judge.judge``) judged:
  ``{healthy, verdict, findings, checked}``; never raises on malformed evidence.
- ``doctor_probe_urls``: the ingress health URLs the head's saved ingress result lists.
- ``doctor_client_paths``: where the other clients' configs (Claude Code, Codex, Qwen Code, Crush) are
  on the controller: the head's saved client result, else ``agent_client_dir/<client>/<file>``.
- ``doctor_probe_ca``: the controller's copy of the CA those https URLs chain to ('' for none).
- ``doctor_token_targets``: where the head streams its token (through the ingress with the
  key, then at the engine), from what ``doctor_facts`` read on the head, and the key file.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.client._agents import (
    ClientConfigError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._judge import (
    client_paths,
    judge,
    probe_ca,
    probe_urls,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._serving import (
    KEY_PATH,
    probe_targets,
)


def doctor_findings(evidence: Any) -> dict[str, Any]:
    return judge(evidence)


def doctor_probe_urls(evidence: Any) -> list[str]:
    return probe_urls(evidence)


def doctor_client_paths(evidence: Any, clients: Any = None, client_dir: Any = "") -> dict[str, str]:
    try:
        return client_paths(evidence, clients, client_dir)
    except ClientConfigError as exc:
        raise AnsibleFilterError(str(exc)) from None


def doctor_probe_ca(evidence: Any) -> str:
    return probe_ca(evidence)


def doctor_token_targets(gathered: Any, key_path: Any = KEY_PATH) -> dict[str, Any]:
    return probe_targets(gathered, key_path or KEY_PATH)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "doctor_findings": doctor_findings,
            "doctor_probe_urls": doctor_probe_urls,
            "doctor_probe_ca": doctor_probe_ca,
            "doctor_client_paths": doctor_client_paths,
            "doctor_token_targets": doctor_token_targets,
        }
