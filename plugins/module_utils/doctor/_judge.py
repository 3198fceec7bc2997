# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's judgement: every failure-catalog defect the gathered evidence shows.

:func:`judge` takes what ``playbooks/doctor.yml`` gathered (the saved stage
results, the serving units' ``systemctl show``, the tail of the server's last
boot log, ``serving_state state=verified`` against the inventory, the ingress
health answers and the opencode config) and returns findings of the shared
type (``_findings.finding``) with two more keys: ``evidence`` (the line that
shows it, and where it was read) and ``doc`` (the catalog entry,
``docs/failure-catalog.md#f12``). There is one function per catalog id the
evidence can show (``CHECKS``); ids found only by a stage (preflight, fabric,
ingress, client checks such as ``mtu``) are passed through from the saved
results. What cannot be read or trusted is a finding too (id ``evidence``).

Input (every part optional; anything malformed is a finding, never an exception)::

    {"head": "spark-head",                       # the first host of vllm_head
     "recipe": {...},                            # the inventory's vllm_recipe
     "nodes": {"spark-head": {"gathered": <doctor_facts evidence>,
                              "state": <serving_state result, or {"skipped_reason": ...}>,
                              "unreachable": false, "gather_error": null}, ...},
     "ingress_probes": [{"url": ..., "status": 502, "content": "...", "msg": "..."}],
     # nodes[head]["live"]: the head's streamed-token probe and incidents (_serving.py)
     "client": {"provider": "localinference", "config": <doctor_facts file record>,
                # the other clients' configs (Claude Code, Codex, Qwen Code, Crush), by client
                "others": {"codex": <doctor_facts file record>, ...}}}

No AnsibleModule here: unit-tested on its own (tests/unit/plugins/module_utils/doctor/test_judge.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.client._check import (
    config_paths,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._context import (
    CATALOG_IDS,
    Doctor,
    finding_list,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._evidence import (
    SERVER_UNIT,
    NodeEvidence,
    Unit,
    clip,
    first_line,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._live import (
    check_f17,
    check_f19,
    check_orphans,
    check_units,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._serving import (
    check_f28,
    check_incidents,
    incident_table,
    token_summary,
)
from ansible_collections.localinference.vllm.plugins.module_utils.plan._recipe_lint import (
    gpus_in_devices,
    lint_parallel,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._memory import (
    ADMISSION_MARKER,
    OFFLOAD_MARKER,
    start_refusals,
)

# Table order: catalog ids first (F1..F28), then the stage and doctor ids.
COLUMNS = ["host", "id", "severity", "message", "evidence", "fix"]
# The Caddy error an ingress answers when the vLLM behind a route is down (F11).
UPSTREAM_DOWN = (502, 503, 504)
# Podman's refusal of --ipc=host with --shm-size (podman issues 14609, 16632).
IPC_SHM_REFUSAL = "cannot set shmsize when running in the"
OFFLOAD_MMAP_FAILURE = ("[Errno 14] Bad address",)
# What vLLM's API server prints once it serves (uvicorn).
STARTUP_COMPLETE = "Application startup complete"
# What GPU builds of vLLM print when kv_cache_memory_bytes pins the cache (the two-Spark field report).
PROFILING_SKIPPED = "does not respect the gpu_memory_utilization"
# serving_state's difference for a node without serving.json.
NEVER_ROLLED_OUT = "serving.json: missing on the node (never rolled out, or removed)"


# --- one check per catalog id -----------------------------------------------------------


def _saved_and_lint(fid: str) -> Callable[[Doctor], None]:
    def check(d: Doctor) -> None:
        d.saved_findings(fid)
        d.live_lint(fid)

    check.__name__ = f"check_{fid.lower()}"
    check.__doc__ = f"{fid}: the plan's lint and the lint of the recipe the nodes run."
    return check


def _saved_only(fid: str) -> Callable[[Doctor], None]:
    def check(d: Doctor) -> None:
        d.saved_findings(fid)

    check.__name__ = f"check_{fid.lower()}"
    check.__doc__ = f"{fid}: what a stage saved (its check is the stage's, see the catalog)."
    return check


def check_refused_starts(d: Doctor, fid: str, marker: str, guard: str, why: str, fix: str) -> None:
    """A start guard's (admission, offload reclaim) newest refusal in each node's unit log."""
    for host, node in d.nodes.items():
        lines = [r for r in start_refusals(node.journal_text.splitlines()) if r.startswith(marker)]
        if lines:
            d.add(
                fid,
                "error",
                host,
                f"the {guard} refused to start {node.journal_unit}: {why}",
                f"{node.journal_unit}: {clip(lines[-1])}",
                fix,
            )


def check_f4(d: Doctor) -> None:
    """F4: preflight's weaker rank, the admission refusing a start, or a rank out of memory."""
    d.saved_findings("F4")
    check_refused_starts(
        d,
        "F4",
        ADMISSION_MARKER,
        "memory admission",
        "the node has less memory available than the recipe's rank needs (systemd retries it)",
        "free memory on that node (the line names its largest processes) or plan for less "
        "(max_model_len, gpu_memory_utilization), then --tags plan,rollout",
    )
    for host, node, log in d.logs():
        for oom in log.get("oom") or []:
            rank = oom.get("rank")
            d.add(
                "F4",
                "error",
                host,
                f"rank {rank if rank is not None else '?'} ran out of memory in the last boot "
                f"of {node.journal_unit}",
                f"{node.journal_unit}: {oom.get('line')}",
                "free memory on that node (--tags preflight names other tenants and swap) or "
                "lower gpu_memory_utilization / max_model_len, then roll out again",
            )
            break


def check_f5(d: Doctor) -> None:
    """F5: preflight found a saturated node; a node this run could not reach is named too."""
    d.saved_findings("F5")
    for host, node in d.nodes.items():
        if not node.reached:
            d.add(
                "unreachable",
                "error",
                host,
                "the doctor could not read this node: busy (F5) or down",
                node.state_error or "no answer",
                "run --tags preflight: it probes a silent node from outside and tells a "
                "saturated node (F5) from an unreachable one",
            )


def check_f7(d: Doctor) -> None:
    """F7: the configured opencode does not read the field the server streams reasoning in."""
    d.saved_findings("F7")
    d.client("F7")


def check_f8(d: Doctor) -> None:
    """F8: opencode's limits let prompt + output exceed the served context."""
    d.saved_findings("F8")
    d.client("F8")


def check_f9(d: Doctor) -> None:
    """F9: opencode's compaction trigger is below (or too close to) the prompt floor."""
    d.saved_findings("F9")
    d.client("F9")


def check_f10(d: Doctor) -> None:
    """F10: a node's reconciled state differs from the inventory, or the nodes disagree."""
    for host, node in d.nodes.items():
        if not node.reached:
            continue
        state = node.state
        if state is None:
            if node.state_error:
                d.add(
                    "evidence",
                    "warning",
                    host,
                    "the reconciled state was not compared with the inventory",
                    node.state_error,
                    "fix the error named and run the doctor again",
                )
            continue
        differences = [str(x) for x in state.get("differences") or []]
        if differences == [NEVER_ROLLED_OUT] and not any(
            u.get("LoadState") == "loaded" for u in node.units.values()
        ):
            d.add(
                "not-deployed",
                "error",
                host,
                "nothing is served on this node",
                differences[0],
                "run the rollout (site.yml, or --tags rollout)",
            )
            continue
        if differences:
            d.add(
                "F10",
                "error",
                host,
                f"the reconciled state on the node differs from the inventory "
                f"({len(differences)} difference{'s' if len(differences) > 1 else ''}): "
                + "; ".join(differences[:3]),
                differences[0],
                "run the rollout (rm -> update -> verify -> start) instead of restarting the "
                "units; --tags verify shows every difference",
            )
        for item in finding_list(state.get("live_findings")):
            if item["message"] not in differences:
                d.add(
                    "F10",
                    item["severity"],
                    host,
                    item["message"],
                    "serving_state",
                    item.get("fix") or "run the rollout (--tags rollout)",
                )
    hashes = {h: n.serving["recipe_hash"] for h, n in d.nodes.items() if n.serving}
    if len(set(hashes.values())) > 1:
        d.add(
            "F10",
            "error",
            ", ".join(sorted(hashes)),
            "the nodes record different recipes: tensor parallel ranks must run one recipe",
            ", ".join(f"{h} {v[:12]}" for h, v in sorted(hashes.items())),
            "run the rollout on every node (--tags rollout)",
        )


def _unit_verdict(unit: Unit) -> tuple[str, str] | None:
    """``(severity, message)`` for a serving unit that is not serving, or None."""
    active, result = unit.get("ActiveState"), unit.get("Result")
    status, restarts = unit.get("ExecMainStatus"), unit.number("NRestarts") or 0
    if unit.get("LoadState") != "loaded":
        return "error", f"{unit.name} is {unit.get('LoadState') or 'not loaded'}: nothing runs"
    if unit.get("Restart") not in ("", "always"):
        restart = unit.get("Restart")
        if active != "active":
            return "error", (
                f"{unit.name} is {active} and has Restart={restart}: an engine "
                "that exits (even with 0) stays down"
            )
        return "warning", (
            f"{unit.name} has Restart={restart}: an engine that exits 0 would stay down"
        )
    if active == "failed":
        return "error", (
            f"{unit.name} failed (Result={result}, exit status {status}) and "
            "systemd stopped restarting it"
        )
    if active == "inactive":
        return "error", (
            f"{unit.name} is stopped (Result={result}, exit status {status}): nothing serves"
        )
    if active == "activating" and unit.get("SubState") == "auto-restart":
        return "error", (
            f"{unit.name} keeps exiting and is being restarted ({restarts} restarts, "
            f"last exit status {status}): it looks alive but does not serve"
        )
    if active == "active" and restarts:
        return "warning", (
            f"{unit.name} exited and was restarted {restarts} time"
            f"{'s' if restarts > 1 else ''} since it was started (last exit "
            f"status {status}); Restart=always brought it back"
        )
    return None


def check_f11(d: Doctor) -> None:
    """F11: a serving unit that is not running (or restarts in a loop), or the ingress's 503 (or 504)."""
    for host, node in d.nodes.items():
        order = (
            node.serving["start_order"]
            if node.serving
            else [name for name, unit in node.units.items() if unit.get("LoadState") == "loaded"]
        )
        for name in order:
            unit = node.units.get(name)
            if unit is None:
                continue
            verdict = _unit_verdict(unit)
            if verdict:
                d.add(
                    "F11",
                    verdict[0],
                    host,
                    verdict[1],
                    unit.line(),
                    f"read why: journalctl -u {name} -n 200 on {host}; a unit the rollout "
                    "wrote restarts always, so a stopped or failed one was stopped by hand or "
                    "hit its start limit: run the rollout (--tags rollout)",
                )
    for probe in d.probes:
        status = probe.get("status")
        url = str(probe.get("url") or "the ingress")
        if status in UPSTREAM_DOWN:
            body = probe.get("content") or probe.get("msg") or ""
            if _starting(d.head_node()):
                d.add(
                    "F11",
                    "warning",
                    d.head,
                    f"the ingress answers {status} at {url}: the vLLM server is still starting "
                    "(its boot log has no 'Application startup complete' yet)",
                    f"HTTP {status}: {_error_message(body)}",
                    "wait for the start (the rollout waits for a streamed token), then run the "
                    "doctor again",
                )
                continue
            d.add(
                "F11",
                "error",
                d.head or "controller",
                f"the ingress answers {status} at {url}: the vLLM server behind it does not "
                "answer (down or restarting)",
                f"HTTP {status}: {_error_message(body)}",
                "the ingress names the unit to look at; a dead engine comes back with the "
                "rollout (--tags rollout)",
            )
        elif not isinstance(status, int) or status <= 0:
            d.add(
                "ingress",
                "error",
                d.head or "controller",
                f"the ingress does not answer at {url}",
                clip(probe.get("msg") or "no answer"),
                "check Caddy on the head (systemctl status caddy) and run --tags ingress",
            )


def _starting(node: NodeEvidence | None) -> bool:
    """The head's server unit is up and its whole boot log so far has not finished start-up."""
    if node is None or not node.journal_complete:
        return False
    unit = node.units.get(SERVER_UNIT)
    return (
        unit is not None
        and unit.get("ActiveState") in ("active", "activating")
        and unit.get("SubState") != "auto-restart"
        and STARTUP_COMPLETE not in node.journal_text
    )


def _error_message(body: Any) -> str:
    """The message of an OpenAI-style error body, else the body as one line."""
    try:
        return clip(json.loads(body)["error"]["message"])
    except (ValueError, TypeError, KeyError):
        return clip(body)


def check_f12(d: Doctor) -> None:
    """F12: the last boot refused to start for lack of KV (vLLM's estimate quoted)."""
    d.saved_findings("F12")
    for host, node, log in d.logs():
        if not log.get("kv_insufficient"):
            continue
        estimate = log.get("estimated_max_model_len")
        asked = log.get("requested_max_model_len")
        line = first_line(
            node.journal_text,
            "estimated maximum model length",
            "larger than the maximum number of tokens",
            "No available memory",
        )
        fix = (
            f"set vllm_recipe.max_model_len to {estimate} or less (vLLM's estimate)"
            if estimate
            else "lower vllm_recipe.max_model_len"
        )
        d.add(
            "F12",
            "error",
            host,
            f"the last boot of {node.journal_unit} refused to start: max_model_len "
            f"{asked if asked is not None else '?'} needs more KV cache than it holds",
            f"{node.journal_unit}: {line or 'kv_insufficient'}",
            f"{fix}, or give the cache more memory; then --tags plan,rollout",
        )


def check_f13(d: Doctor) -> None:
    """F13: orphaned offload files in /dev/shm now, a start the reclaim refused, or a failed map."""
    d.saved_findings("F13")
    check_orphans(d)
    check_refused_starts(
        d,
        "F13",
        OFFLOAD_MARKER,
        "offload reclaim",
        "offload files in /dev/shm may still be mapped by a live process",
        "list them with localinference.vllm.shm_offload state=status; stop the process that "
        "maps them, then start again",
    )
    for host, node, log in d.logs():
        hits = [e for e in log.get("errors") or [] if any(n in e for n in OFFLOAD_MMAP_FAILURE)]
        if hits:
            line = first_line(node.journal_text, *OFFLOAD_MMAP_FAILURE) or hits[0]
            d.add(
                "F13",
                "error",
                host,
                f"the last boot of {node.journal_unit} failed mapping memory: orphaned "
                "/dev/shm/vllm_offload_*.mmap files of a killed engine fill /dev/shm",
                f"{node.journal_unit}: {line}",
                "list them with localinference.vllm.shm_offload state=status and reclaim "
                "with state=reclaimed confirm=true (only files no live process maps)",
            )


def check_f14(d: Doctor) -> None:
    """F14: --ipc=host with ShmSize=: in the recipe, the unit files, or Podman's refusal."""
    d.saved_findings("F14")
    d.live_lint("F14")
    check_units(d, "F14")
    for host, node in d.nodes.items():
        line = first_line(node.journal_text, IPC_SHM_REFUSAL)
        if line:
            d.add(
                "F14",
                "error",
                host,
                "Podman refused to start the container: --ipc=host with a /dev/shm size",
                f"{node.journal_unit}: {line}",
                "drop shm_size (host IPC shares the host's /dev/shm) or set ipc_host: false",
            )


def check_f15(d: Doctor) -> None:
    """F15: speculative decoding reserved scheduler slots (vLLM says so at start)."""
    d.saved_findings("F15")
    for host, node, log in d.logs():
        scheduled = log.get("scheduled_tokens")
        if scheduled is not None:
            line = first_line(node.journal_text, "max_num_scheduled_tokens is set to")
            d.add(
                "F15",
                "warning",
                host,
                f"speculative decoding leaves {scheduled} scheduled tokens per step, fewer "
                "than max_num_batched_tokens",
                f"{node.journal_unit}: {line or scheduled}",
                "raise max_num_batched_tokens by (K-1) x max_num_seqs (the plan's F15 says "
                "by how much)",
            )


def check_f1(d: Doctor) -> None:
    """F1: the plan's and the running recipe's lint; else vLLM saying it skipped profiling."""
    before = len(d.found)
    d.saved_findings("F1")
    d.live_lint("F1")
    if len(d.found) > before:
        return
    for host, node, log in d.logs():
        line = first_line(node.journal_text, PROFILING_SKIPPED)
        if log.get("profiling_skipped") and line:
            d.add(
                "F1",
                "warning",
                host,
                "vLLM skipped memory profiling (explicit kv_cache_memory_bytes): "
                "gpu_memory_utilization has no effect and the cache is a hand estimate",
                f"{node.journal_unit}: {line}",
                "remove kv_cache_memory_bytes and let the profiler size the cache, unless the "
                "plan is calibrated (--tags plan)",
            )


def check_f27(d: Doctor) -> None:
    """F27: the plan's layout lint, and the recipe the nodes run against the nodes there are."""
    d.saved_findings("F27")
    nodes = len(d.nodes)
    if nodes:
        d.live_lint(
            "F27",
            lambda recipe: lint_parallel(recipe, nodes, gpus_in_devices(recipe.get("devices"))),
            f"serving.json recipe (what the nodes run) on the {nodes} node(s) of vllm_cluster",
            "fix vllm_recipe (or the hosts of vllm_cluster) and roll out again (--tags plan,rollout)",
        )


CHECKS: dict[str, Callable[[Doctor], None]] = {
    "F1": check_f1,
    "F2": _saved_only("F2"),
    "F3": _saved_and_lint("F3"),
    "F4": check_f4,
    "F5": check_f5,
    "F6": _saved_and_lint("F6"),
    "F7": check_f7,
    "F8": check_f8,
    "F9": check_f9,
    "F10": check_f10,
    "F11": check_f11,
    "F12": check_f12,
    "F13": check_f13,
    "F14": check_f14,
    "F15": check_f15,
    "F16": _saved_only("F16"),
    "F17": check_f17,
    "F19": check_f19,
    "F20": _saved_only("F20"),
    # Host-stack defects: preflight's judgement (_host_stack.py) of what it read on the node.
    **{fid: _saved_only(fid) for fid in ("F21", "F22", "F23", "F24", "F25", "F26")},
    "F27": check_f27,
    "F28": check_f28,
}


def stage_checks(d: Doctor) -> None:
    """Stage check ids (``mtu``, ``ingress-bypass``, ``client-config``...) the stages saved."""
    ids: set[str] = set()
    for node in d.nodes.values():
        for result in node.saved.values():
            for key in ("findings", "exposure", "violations"):
                ids.update(item["id"] for item in finding_list(result.get(key)))
            ids.update(
                item["id"] for item in finding_list((result.get("rank") or {}).get("findings"))
            )
    for fid in sorted(ids - set(CATALOG_IDS)):
        d.saved_findings(fid)
    for fid in dict.fromkeys(item["id"] for item in d.client_findings()):
        if fid not in CATALOG_IDS:
            d.client(fid)


def _merge(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (id, severity, message): the hosts that show it joined, first evidence kept."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for item in found:
        key = (item["id"], item["severity"], item["message"])
        if key not in rows:
            rows[key] = dict(item)
            continue
        hosts = rows[key]["host"].split(", ")
        for host in item["host"].split(", "):
            if host not in hosts:
                hosts.append(host)
        rows[key]["host"] = ", ".join(hosts)
    order = {fid: i for i, fid in enumerate(CATALOG_IDS)}
    return sorted(
        rows.values(),
        key=lambda f: (
            f["severity"] != "error",
            order.get(f["id"], len(order)),
            f["id"],
            f["host"],
        ),
    )


def judge(evidence: Any) -> dict[str, Any]:
    """``{healthy, verdict, findings, checked}`` for the gathered evidence; never raises."""
    d = Doctor(evidence)
    for check in CHECKS.values():
        check(d)
    stage_checks(d)
    check_incidents(d)
    if d.recipe is not None and d.saved("plan") is not None and d.plan() is None:
        d.add(
            "stale-plan",
            "warning",
            d.head,
            "the head's saved plan was made for another recipe than the inventory's: its "
            "violations are not shown",
            f"{d.head}:{d.nodes[d.head].paths.get('plan')} recipe_hash "
            f"{str(d.saved('plan').get('recipe_hash'))[:12]}",
            "run --tags plan (the next rollout re-plans too)",
        )
    findings = _merge(d.found)
    errors = [f for f in findings if f["severity"] == "error"]
    if errors:
        named = ", ".join(dict.fromkeys(f"{f['id']} ({f['host']})" for f in errors))
        verdict = f"{len(errors)} defect{'s' if len(errors) > 1 else ''} found: {named}"
    else:
        warnings = len(findings)
        verdict = "healthy" + (
            f" ({warnings} warning{'s' if warnings > 1 else ''})" if warnings else ""
        )
    return {
        "healthy": not errors,
        "verdict": verdict,
        "findings": findings,
        "checked": {"nodes": sorted(d.nodes), "ids": list(CHECKS)},
        # Printed under the table: what the live token probe saw, the watchdog's incidents.
        "live": [line for line in [token_summary(d)] if line] + incident_table(d),
    }


def probe_urls(evidence: Any) -> list[str]:
    """The ingress health URLs to probe, from the head's saved ingress result (checked)."""
    d = Doctor(evidence)
    ingress = d.saved("ingress") or {}
    urls = [r.get("health_url") for r in ingress.get("routes") or [] if isinstance(r, dict)]
    return [u for u in urls if isinstance(u, str) and u.startswith(("http://", "https://"))]


def client_paths(evidence: Any, clients: Any = None, client_dir: Any = "") -> dict[str, str]:
    """Where the other clients' configs are on the controller, to read before judging: the paths
    the head's saved client result records, else ``client_dir/<client>/<file>`` for each client
    of ``clients`` (the inventory's agent_client_clients); ``client_dir`` is ``doctor_client_dir``."""
    saved = Doctor(evidence).saved("client") or {}
    return config_paths(saved.get("clients"), clients, client_dir, "doctor_client_dir")


def probe_ca(evidence: Any) -> str:
    """The controller's copy of the CA the ingress's https certificate chains to ('' for none)."""
    tls = (Doctor(evidence).saved("ingress") or {}).get("tls")
    path = tls.get("client_ca_file") if isinstance(tls, dict) and tls.get("mode") not in (None, "off") else None
    return path if isinstance(path, str) and path.startswith("/") and path.isprintable() else ""
