# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's view of one run's evidence: checked nodes, saved findings, the client judged.

:class:`Doctor` holds the nodes as :func:`_evidence.check_node` checked
them, and the helpers the per-id checks of :mod:`_judge` share: the head's
saved plan (only when made for the inventory's recipe), the findings a stage
saved with a given id, the lint of the recipe the nodes actually run, and
opencode's config judged against the served context. Findings are collected
with :meth:`Doctor.add`, which adds ``evidence`` and ``doc`` (the catalog entry).

No AnsibleModule here: unit-tested through tests/unit/plugins/module_utils/doctor/test_judge.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.client._check import (
    judge_clients,
)
from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode import (
    OpencodeConfigError,
    parse_config,
)
from ansible_collections.localinference.vllm.plugins.module_utils.client._opencode import (
    judge as judge_client,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import (
    SEVERITIES,
    finding,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    problems as deployment_problems,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._stage_result import (
    StageResultError,
    inputs_hash,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._evidence import (
    NodeEvidence,
    check_node,
    clip,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    lint_static,
)

CATALOG = "docs/failure-catalog.md"
CATALOG_IDS = tuple(f"F{n}" for n in range(1, 29))
# The catalog's table of stage and doctor ids (mtu, evidence, unreachable, ...).
OTHER_IDS = "stage-check-ids"


def doc(fid: str) -> str:
    """The catalog entry of an id (``docs/failure-catalog.md#f12``); doctor ids have their own."""
    return f"{CATALOG}#{fid.lower()}"


class Doctor:
    """The checked evidence of one doctor run, and the findings the checks add."""

    def __init__(self, evidence: Any) -> None:
        self.found: list[dict[str, Any]] = []
        raw = evidence if isinstance(evidence, dict) else {}
        if not isinstance(evidence, dict):
            self.add(
                "evidence",
                "error",
                "controller",
                "the doctor got no evidence to judge",
                f"got {type(evidence).__name__}",
                "run playbooks/doctor.yml",
            )
        nodes = raw.get("nodes") if isinstance(raw.get("nodes"), dict) else {}
        self.nodes: dict[str, NodeEvidence] = {}
        for host, node_raw in nodes.items():
            node, problems = check_node(str(host), node_raw)
            self.nodes[str(host)] = node
            for item in problems:
                self.add(
                    "evidence",
                    item.get("severity", "error"),
                    item["host"],
                    f"{item['where']}: {item['message']}",
                    item["where"],
                    item["fix"],
                )
        head = raw.get("head")
        self.head = (
            head if isinstance(head, str) and head in self.nodes else next(iter(self.nodes), "")
        )
        self.recipe = raw.get("recipe") if isinstance(raw.get("recipe"), dict) else None
        # What the head read live: the streamed-token probe and the watchdog's incidents.
        head_raw = nodes.get(self.head)
        live = head_raw.get("live") if isinstance(head_raw, dict) else None
        self.live: dict[str, Any] = live if isinstance(live, dict) else {}
        if live is not None and not isinstance(live, dict):
            self.add(
                "evidence",
                "warning",
                self.head,
                f"the head's live reads are {type(live).__name__}, not a record",
                clip(live, 120),
                "run the doctor playbook of the collection",
            )
        probes = raw.get("ingress_probes")
        self.probes = [p for p in probes if isinstance(p, dict)] if isinstance(probes, list) else []
        client = raw.get("client") if isinstance(raw.get("client"), dict) else {}
        self.client_input = client
        self._client_findings: list[dict[str, Any]] | None = None

    # --- helpers ---------------------------------------------------------------

    def add(
        self,
        fid: str,
        severity: str,
        host: str,
        message: str,
        evidence: str,
        fix: str,
        **context: Any,
    ) -> None:
        severity = severity if severity in SEVERITIES else "error"
        link = doc(fid) if fid in CATALOG_IDS else f"{CATALOG}#{OTHER_IDS}"
        self.found.append(
            finding(
                fid,
                severity,
                clip(message, 600),
                # A stage's saved fix may already end with the catalog link.
                fix=fix if link in fix else f"{fix} ({link})",
                host=host,
                evidence=clip(evidence),
                doc=link,
                **context,
            )
        )

    def head_node(self) -> NodeEvidence | None:
        return self.nodes.get(self.head)

    def saved(self, stage: str, host: str | None = None) -> dict[str, Any] | None:
        node = self.nodes.get(host or self.head)
        return node.saved.get(stage) if node else None

    def plan(self) -> dict[str, Any] | None:
        """The head's saved plan when it was made for the inventory's recipe, else None."""
        plan = self.saved("plan")
        if plan is None or self.recipe is None:
            return plan
        try:
            asked = inputs_hash(self.recipe)
        except StageResultError:
            return None
        return plan if plan.get("recipe_hash") == asked else None

    def client_judged(self) -> bool:
        """Whether opencode's config is judged afresh (then the client stage's saved findings,
        made against an older server, are not repeated)."""
        record = self.client_input.get("config")
        return (
            isinstance(record, dict)
            and isinstance(record.get("text"), str)
            and self.saved("client") is not None
        )

    def saved_findings(self, fid: str) -> None:
        """Findings with ``fid`` that a stage saved: plan violations, preflight, fabric, client."""
        plan = self.plan()
        if plan is not None:
            for item in finding_list(plan.get("violations")):
                if item["id"] == fid:
                    self.add(
                        fid,
                        item["severity"],
                        self.head,
                        item["message"],
                        f"{self.head}:{self.nodes[self.head].paths.get('plan')} violations",
                        "fix vllm_recipe and re-plan (--tags plan, then --tags rollout)",
                    )
        for host, node in self.nodes.items():
            for stage in ("preflight", "fabric", "ingress", "client", "qualify"):
                if stage == "client" and self.client_judged():
                    continue
                result = node.saved.get(stage) or {}
                items = finding_list(result.get("findings"))
                items += finding_list((result.get("rank") or {}).get("findings"))
                items += finding_list(result.get("exposure"))
                for item in items:
                    if item["id"] != fid:
                        continue
                    own = item.get("evidence")
                    self.add(
                        fid,
                        item["severity"],
                        str(item.get("host") or host),
                        item["message"],
                        f"{host}:{node.paths.get(stage)} findings"
                        + (f": {own}" if isinstance(own, str) and own else ""),
                        item.get("fix")
                        or f"fix it and run the {stage} stage again (--tags {stage})",
                    )

    def live_recipes(self) -> list[tuple[list[str], dict[str, Any]]]:
        """Each distinct recipe the nodes' serving.json record, with the hosts that hold it."""
        by_hash: dict[str, tuple[list[str], dict[str, Any]]] = {}
        for host, node in self.nodes.items():
            if node.serving is not None:
                entry = by_hash.setdefault(
                    node.serving["recipe_hash"], ([], node.serving["recipe"])
                )
                entry[0].append(host)
        return list(by_hash.values())

    @staticmethod
    def _recipe_lint(recipe: dict[str, Any]) -> list[dict[str, Any]]:
        return lint_static(recipe) + [
            {**p, "severity": "error" if p["blocking"] else "warning"}
            for p in deployment_problems(recipe)
        ]

    def live_lint(
        self,
        fid: str,
        lint: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
        evidence: str = "serving.json recipe (what the node runs)",
        fix: str = "fix vllm_recipe and roll out again (--tags plan,rollout)",
    ) -> None:
        """Lint of the recipe the nodes actually run (serving.json), for one id.

        ``lint`` defaults to the recipe lint and the deployment checks."""
        for hosts, recipe in self.live_recipes():
            try:
                items = (lint or self._recipe_lint)(recipe)
            except (ValueError, KeyError, TypeError) as exc:
                self.add(
                    "evidence",
                    "error",
                    ", ".join(hosts),
                    f"serving.json's recipe cannot be linted: {exc}",
                    "serving.json recipe",
                    "run the rollout (--tags rollout)",
                )
                continue
            for item in items:
                if item["id"] == fid:
                    self.add(
                        fid, item["severity"], ", ".join(hosts), item["message"], evidence, fix
                    )

    def logs(self) -> list[tuple[str, NodeEvidence, dict[str, Any]]]:
        return [(h, n, n.log) for h, n in self.nodes.items() if n.log is not None]

    def client_findings(self) -> list[dict[str, Any]]:
        """opencode's config and the other clients' configs judged against the served context and
        the saved measurement."""
        if self._client_findings is None:
            basis = self._client_basis()
            self._client_findings = (
                self._judge_client(*basis) + self._judge_others(*basis) if basis else []
            )
        return self._client_findings

    def _client_basis(self) -> tuple[dict[str, Any], int] | None:
        """``(measurement, served context)`` when the client stage's saved result can be trusted."""
        record = self.client_input.get("config")
        others = self.client_input.get("others")
        has_config = isinstance(record, dict) and isinstance(record.get("text"), str)
        if not has_config and not (isinstance(others, dict) and others):
            return None
        measured = self.saved("client")
        if measured is None:
            # The client stage never ran: these configs are not the collection's to judge.
            return None
        head = self.head_node()
        served = head.serving["recipe"].get("max_model_len") if head and head.serving else None
        served = served if _count(served) else measured.get("max_model_len")
        wrong = [
            key
            for key, ok in (
                ("model", isinstance(measured.get("model"), str)),
                ("prompt_floor", _count(measured.get("prompt_floor"))),
                ("reasoning_key", isinstance(measured.get("reasoning_key"), str)),
                ("max_model_len", _count(served)),
            )
            if not ok
        ]
        if wrong:
            self.add(
                "evidence",
                "error",
                self.head,
                f"the saved client measurement lacks {', '.join(wrong)} (or holds no number)",
                f"{self.head}:{self.nodes[self.head].paths.get('client')}",
                "run the client stage (--tags client) to measure again",
            )
            return None
        return measured, served

    def _judge_client(self, measured: dict[str, Any], served: int) -> list[dict[str, Any]]:
        record = self.client_input.get("config")
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            return []
        path = str(record.get("path") or "opencode.json")
        provider = self.client_input.get("provider") or "localinference"
        try:
            config = parse_config(record["text"], path, allow_jsonc=True)
            found, numbers = judge_client(
                config,
                provider=str(provider),
                model=measured["model"],
                max_model_len=served,
                prompt_floor=measured["prompt_floor"],
                reasoning_key=measured["reasoning_key"],
                client_version=str(measured.get("opencode_version") or "1.18.33"),
            )
        except (OpencodeConfigError, TypeError, ValueError) as exc:
            return [
                finding(
                    "client-config", "error", str(exc), "run the client stage (--tags client)",
                    evidence=path,
                )
            ]
        where = (
            f"{path}: context {numbers.get('context')}, output {numbers.get('output')}, "
            f"served {served}, prompt floor {numbers.get('prompt_floor')}"
        )
        return [{**f, "evidence": where} for f in found]

    def _judge_others(self, measured: dict[str, Any], served: int) -> list[dict[str, Any]]:
        """Claude Code's, Codex's, Qwen Code's and Crush's configs (``client/_check.py``)."""
        return judge_clients(
            self.client_input.get("others"),
            measured.get("clients"),
            served=served,
            reasoning_key=measured["reasoning_key"],
        )

    def client(self, fid: str) -> None:
        for item in self.client_findings():
            if item["id"] == fid:
                self.add(
                    fid,
                    item["severity"],
                    "controller",
                    item["message"],
                    item["evidence"],
                    item.get("fix") or "rewrite the limits from the served context (--tags client)",
                )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def finding_list(value: Any) -> list[dict[str, Any]]:
    """The well-formed findings of a saved list (id, severity, message as strings)."""
    if not isinstance(value, list):
        return []
    return [
        item
        for item in value
        if isinstance(item, dict)
        and isinstance(item.get("id"), str)
        and item.get("severity") in SEVERITIES
        and isinstance(item.get("message"), str)
    ]
