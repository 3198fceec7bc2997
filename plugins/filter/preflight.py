# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight's judgements, run on the controller; the logic lives in module_utils/preflight/_judge.py.

- ``preflight_rank``: ``ansible_facts.memory | preflight_rank(ansible_facts.gpu, thresholds, host)``
  -> this node's summary with its findings (F4, F13, F5); given ``ansible_facts.host_stack`` and
  the host-stack options as well, also its ``host_stack`` summary and the host-stack findings
  (F21, F22, F24, F26; module_utils/preflight/_host_stack.py).
- ``preflight_silent_verdict``: the registered probe results about a node that did not
  answer -> ``{class: saturated|unreachable, evidence, load_1m, advice, findings}`` (F5).
- ``preflight_cluster``: ``hostvars | preflight_cluster(ansible_play_hosts_all, ansible_play_hosts)``
  -> ``{nodes, weakest_rank, unresponsive, cluster_limits, findings, failing, lines}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._host_stack import (
    HostStackInputError,
    judge_node,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._judge import (
    PreflightInputError,
    judge_cluster,
    rank_summary,
    silent_verdict,
)


def preflight_rank(
    memory: Mapping[str, Any],
    gpu: Mapping[str, Any] | None,
    thresholds: Mapping[str, Any],
    host: str = "",
    host_stack: Mapping[str, Any] | None = None,
    stack_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    try:
        summary = rank_summary(memory, gpu, thresholds, host)
        if host_stack is not None:
            judged = judge_node(host_stack, gpu, stack_options or {}, host)
            summary["host_stack"] = judged["summary"]
            summary["findings"] = [*summary["findings"], *judged["findings"]]
        return summary
    except (PreflightInputError, HostStackInputError) as exc:
        raise AnsibleFilterError(f"preflight_rank: {exc}") from None


def preflight_silent_verdict(
    evidence: Mapping[str, Any], banner_timeout: Any = 10, host: str = ""
) -> dict[str, Any]:
    if not isinstance(evidence, Mapping):
        raise AnsibleFilterError("preflight_silent_verdict expects a mapping of probe results")
    return silent_verdict(evidence, banner_timeout, host)


def preflight_cluster(
    hostvars: Mapping[str, Any], hosts: list[str], active: list[str] | None = None
) -> dict[str, Any]:
    try:
        return judge_cluster(hostvars, list(hosts), None if active is None else list(active))
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(
            f"preflight_cluster: a node's preflight_rank is malformed ({exc!r}); re-run preflight"
        ) from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "preflight_rank": preflight_rank,
            "preflight_silent_verdict": preflight_silent_verdict,
            "preflight_cluster": preflight_cluster,
        }
