# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight's judgement: node facts -> findings, the weakest rank, the verdict on a silent node.

Pure functions over the facts the collection's facts modules gather
(``ansible_facts.memory`` from ``memory_facts``, ``ansible_facts.gpu`` from
``gpu_facts``) and over the registered results of the probes preflight runs
about a node that did not answer. The role calls them through the filters in
``plugins/filter/preflight.py``; nothing here connects anywhere.

Finding ids (one finding type, :mod:`._findings`):

- ``F4`` (a weaker rank OOMs at start, the two-Spark field report): free memory below
  ``preflight_min_free_memory_gib``, swap above ``preflight_max_swap_used_percent``,
  memory pressure above ``preflight_max_psi_some_avg10``.
- ``F13`` (orphan offload files fill ``/dev/shm``): ``/dev/shm`` below
  ``preflight_min_shm_free_gib``.
- ``F5`` (a saturated node mistaken for an unreachable one, the two-Spark field report):
  load per CPU above ``preflight_max_load_per_cpu`` on a node that answered, and
  a silent node judged SATURATED from outside evidence.
- ``unreachable``: a silent node where nothing answers (or SSH refuses).
- ``incomplete``: a node whose preflight tasks failed.
- ``F21``-``F26`` (host stack): judged per node by ``_host_stack.judge_node`` through the
  ``preflight_rank`` filter; F23 (versions) and F25 (disk for the weights) compare nodes and
  are added here by ``_host_stack.judge_cluster_stack``.

Every finding carries ``host`` and ``check`` (``free_memory``, ``swap``, ``psi``,
``shm``, ``load``, ``silent``, ``incomplete``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import (
    errors,
    finding,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._host_stack import (
    judge_cluster_stack,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    ProcParseError,
    parse_loadavg,
)

GIB = 1024**3
MIB = 1024**2

THRESHOLDS = (
    "preflight_min_free_memory_gib",
    "preflight_max_swap_used_percent",
    "preflight_max_psi_some_avg10",
    "preflight_min_shm_free_gib",
    "preflight_max_load_per_cpu",
)
_MEMORY_KEYS = (
    "effective_available_bytes",
    "swap_total_bytes",
    "swap_used_percent",
    "shm",
    "loadavg",
    "cpu_count",
    "memlock",
    "other_users",
)
_TABLE_ROW = "%-3s %-16s %10s %7s %7s %10s %9s %12s  %s"
_OTHERS = ("OTHERS GiB", "VERDICT")

SATURATED_MESSAGE = "SATURATED, not down: the kernel answers but nothing else does in time."
SATURATED_FIX = (
    "Do not reboot or re-provision it; wait for the load to fall (the two-Spark field report: load 278 fell to 16"
    " within minutes of the last checkpoint load) or stop the job that saturates it, then re-run"
    " --tags preflight."
)
INCOMPLETE_MESSAGE = "INCOMPLETE: preflight did not finish on it, so it cannot be sized;"
INCOMPLETE_FIX = "fix the error above and re-run."


class PreflightInputError(validate.InputError):
    """Facts or thresholds that cannot be judged (the message names the variable)."""


def check_thresholds(thresholds: Mapping[str, Any]) -> dict[str, float]:
    """The five thresholds as numbers; a missing or non-numeric one names the variable."""
    missing = [name for name in THRESHOLDS if name not in thresholds]
    if missing:
        raise PreflightInputError(f"thresholds lack {', '.join(missing)}")
    # validate.number: NaN, infinity, booleans and words are refused, naming the variable
    return {
        name: validate.number(name, thresholds[name], error=PreflightInputError)
        for name in THRESHOLDS
    }


def _check_memory(memory: Any) -> None:
    if not isinstance(memory, Mapping):
        raise PreflightInputError(
            "ansible_facts.memory is missing: run localinference.vllm.memory_facts on the node first"
        )
    missing = [key for key in _MEMORY_KEYS if key not in memory]
    if missing:
        raise PreflightInputError(
            f"ansible_facts.memory lacks {', '.join(missing)}: it was not gathered by this"
            " collection's memory_facts module; re-run preflight"
        )


def _gib(value: float, digits: int) -> float:
    return round(value / GIB, digits)


def free_memory(memory: Mapping[str, Any], gpu: Mapping[str, Any] | None) -> tuple[int, str]:
    """The memory a rank can use, and where the number comes from.

    Discrete GPUs: the least free GPU memory. Unified memory (GB10), no GPU, or
    a GPU that reports no free memory: MemAvailable, capped by the node's cgroup
    limit.
    """
    gpu = gpu or {}
    gpus = gpu.get("gpus") or [{}]
    name = gpus[0].get("name") or "unknown GPU"
    dedicated = (
        bool(gpu.get("present"))
        and not gpu.get("unified_memory")
        and gpu.get("min_free_memory_mib") is not None
    )
    if dedicated:
        free = int(gpu["min_free_memory_mib"]) * MIB
        least = least_free_gpu(gpu)
        index = f" {least}" if least is not None and len(gpus) > 1 else ""
        return free, f"least free GPU{index} ({gpu.get('count')} x {name})"
    if not gpu.get("present"):
        source = "MemAvailable"
    elif gpu.get("unified_memory"):
        source = f"MemAvailable (unified memory, {name})"
    else:
        source = f"MemAvailable (free GPU memory not reported, {name})"
    if memory.get("cgroup_limit_bytes") is not None:
        source += " capped by cgroup"
    return int(memory["effective_available_bytes"]), source


def gpu_memory(gpu: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Each discrete GPU's free and total memory (one tensor-parallel rank each on a host
    with several); empty for unified memory (GB10), no GPU, or a GPU that reports no memory."""
    gpu = gpu or {}
    if not gpu.get("present") or gpu.get("unified_memory"):
        return []
    out = []
    for position, card in enumerate(gpu.get("gpus") or []):
        free, total = card.get("memory_free_mib"), card.get("memory_total_mib")
        if free is None or total is None:
            continue
        out.append(
            {
                "index": card["index"] if card.get("index") is not None else position,
                "name": card.get("name") or "unknown GPU",
                "free_bytes": int(free) * MIB,
                "free_gib": _gib(int(free) * MIB, 2),
                "total_gib": _gib(int(total) * MIB, 2),
            }
        )
    return out


def least_free_gpu(gpu: Mapping[str, Any] | None) -> int | None:
    """The index of the discrete GPU with the least free memory (the first on a tie)."""
    cards = gpu_memory(gpu)
    return min(cards, key=lambda card: card["free_bytes"])["index"] if cards else None


def rank_findings(
    memory: Mapping[str, Any], free_bytes: int, thresholds: Mapping[str, Any], host: str
) -> list[dict[str, Any]]:
    """F4 / F13 / F5 findings of one node that answered (wording matched by the lab tests).

    Messages show each threshold as the user wrote it (``=16``, ``=10.0``).
    """
    limits = check_thresholds(thresholds)
    shown = {name: str(thresholds[name]) for name in THRESHOLDS}
    return _memory_findings(memory, free_bytes, limits, shown, host) + _shm_and_load_findings(
        memory, limits, shown, host
    )


def _memory_findings(
    memory: Mapping[str, Any],
    free_bytes: int,
    limits: Mapping[str, Any],
    shown: Mapping[str, str],
    host: str,
) -> list[dict[str, Any]]:
    """F4: too little free memory, swap in use, or memory pressure already."""
    out = []
    minimum = limits["preflight_min_free_memory_gib"]
    if free_bytes < minimum * GIB:
        out.append(
            finding(
                "F4",
                "error",
                f"free memory {_gib(free_bytes, 1)} GiB is below"
                f" preflight_min_free_memory_gib={shown['preflight_min_free_memory_gib']}",
                "free memory on this node (other users' processes are listed below, never touched:"
                " ask their owners) before anything is loaded; the plan sizes for this rank",
                host=host,
                check="free_memory",
            )
        )
    swap = memory["swap_used_percent"]
    if memory["swap_total_bytes"] > 0 and swap > limits["preflight_max_swap_used_percent"]:
        out.append(
            finding(
                "F4",
                "error",
                f"swap {swap}% used is above preflight_max_swap_used_percent="
                f"{shown['preflight_max_swap_used_percent']}",
                "the kernel is paging another tenant out (the two-Spark field report: 13-14 of 15 GB); free memory"
                " on this node before the start",
                host=host,
                check="swap",
            )
        )
    psi = (memory.get("psi") or {}).get("some", {}).get("avg10")
    if psi is not None and psi > limits["preflight_max_psi_some_avg10"]:
        out.append(
            finding(
                "F4",
                "error",
                f"memory pressure {psi}% (PSI some avg10) is above preflight_max_psi_some_avg10="
                f"{shown['preflight_max_psi_some_avg10']}",
                "the node already stalls on memory: wait for the pressure to fall or free memory,"
                " then re-run --tags preflight",
                host=host,
                check="psi",
            )
        )
    return out


def _shm_and_load_findings(
    memory: Mapping[str, Any], limits: Mapping[str, Any], shown: Mapping[str, str], host: str
) -> list[dict[str, Any]]:
    """F13: /dev/shm too full for the offload pool; F5: a saturated node."""
    out = []
    shm = memory["shm"]
    if shm["free_bytes"] < limits["preflight_min_shm_free_gib"] * GIB:
        out.append(
            finding(
                "F13",
                "error",
                f"{shm['path']} has {_gib(shm['free_bytes'], 2)} GiB free of"
                f" {_gib(shm['size_bytes'], 2)} GiB, below preflight_min_shm_free_gib="
                f"{shown['preflight_min_shm_free_gib']}",
                "look for orphaned /dev/shm files, e.g. vllm_offload_*.mmap, and remove them"
                " (or grow /dev/shm)",
                host=host,
                check="shm",
            )
        )
    load, cpus = memory["loadavg"]["1m"], memory["cpu_count"]
    if load / cpus > limits["preflight_max_load_per_cpu"]:
        out.append(
            finding(
                "F5",
                "error",
                f"load {load} on {cpus} CPUs is above preflight_max_load_per_cpu="
                f"{shown['preflight_max_load_per_cpu']} per CPU (saturated)",
                "wait for the load to fall or stop the job that saturates the node; do not reboot it",
                host=host,
                check="load",
            )
        )
    return out


def rank_summary(
    memory: Mapping[str, Any],
    gpu: Mapping[str, Any] | None,
    thresholds: Mapping[str, Any],
    host: str,
) -> dict[str, Any]:
    """This node's summary (the ``rank`` of preflight's saved result) with its findings."""
    _check_memory(memory)
    free, source = free_memory(memory, gpu)
    psi = memory.get("psi")
    return {
        "free_bytes": free,
        "free_gib": _gib(free, 2),
        "source": source,
        "swap_used_percent": memory["swap_used_percent"],
        "psi_some_avg10": psi["some"]["avg10"] if psi else None,
        "shm_free_bytes": memory["shm"]["free_bytes"],
        "shm_size_bytes": memory["shm"]["size_bytes"],
        "mem_available_bytes": memory["effective_available_bytes"],
        "memlock_soft_bytes": memory["memlock"]["soft_bytes"],
        "load_1m": memory["loadavg"]["1m"],
        "cpu_count": memory["cpu_count"],
        "other_users": memory["other_users"],
        "gpus": gpu_memory(gpu),
        "findings": rank_findings(memory, free, thresholds, host),
    }


def weakest_rank(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The node with the least free memory (the first one on a tie); None without nodes.

    ``gpu`` is the index of that node's least free GPU when it holds several discrete
    ones (each a rank of tensor parallel inside the host), else None.
    """
    if not nodes:
        return None
    host = min(nodes, key=lambda name: int(nodes[name]["free_bytes"]))
    free = int(nodes[host]["free_bytes"])
    cards = nodes[host].get("gpus") or []
    least = min(cards, key=lambda card: int(card["free_bytes"])) if len(cards) > 1 else None
    return {
        "host": host,
        "gpu": least["index"] if least and int(least["free_bytes"]) == free else None,
        "free_bytes": free,
        "free_gib": _gib(free, 2),
        "source": str(nodes[host]["source"]).strip(),
    }


def cluster_limits(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The smallest host limits across the nodes that answered (the plan's offload check).

    ``memlock_bytes`` is None when every node's limit is unlimited; it is left
    out, like the other keys, when no node answered.
    """
    out: dict[str, Any] = {}
    for key, source in (
        ("shm_size_bytes", "shm_size_bytes"),
        ("shm_free_bytes", "shm_free_bytes"),
        ("mem_available_bytes", "mem_available_bytes"),
    ):
        values = [int(rank[source]) for rank in nodes.values() if rank.get(source) is not None]
        if values:
            out[key] = min(values)
    if nodes:
        memlock = [
            int(rank["memlock_soft_bytes"])
            for rank in nodes.values()
            if rank.get("memlock_soft_bytes") is not None
        ]
        out["memlock_bytes"] = min(memlock) if memlock else None
    return out


def _ok(result: Mapping[str, Any] | None) -> bool:
    return bool(result) and not result.get("skipped") and result.get("rc", 1) == 0


def read_load(text: str) -> tuple[float | None, int | None]:
    """``cat /proc/loadavg; nproc`` -> (1-minute load, CPUs); (None, None) if unreadable."""
    lines = text.strip().splitlines()
    if len(lines) < 2 or len(text.split()) < 6:
        return None, None
    try:
        load = parse_loadavg(lines[0])["1m"]
    except (ProcParseError, ValueError):
        return None, None
    if not math.isfinite(load) or load < 0:
        return None, None
    cpus = lines[-1].strip()
    if not (cpus.isascii() and cpus.isdigit()) or len(cpus) > 6 or int(cpus) < 1:
        return None, None
    return load, int(cpus)


def silent_verdict(
    evidence: Mapping[str, Any], banner_timeout: Any = 10, host: str = ""
) -> dict[str, Any]:
    """Saturated or unreachable (F5), from the registered results of preflight's probes.

    ``evidence`` keys: ``peer`` (the answering node asked, or ``localhost``),
    ``icmp_controller``, ``icmp_peer``, ``banner`` (``wait_for`` on the SSH port),
    ``peer_load`` (the peer's ``ssh <node> cat /proc/loadavg; nproc``) and
    ``patient`` (the patient ``raw`` attempt): each a registered task result,
    ``{"skipped": true}`` or missing when not run.
    """
    peer = evidence.get("peer") or "localhost"
    icmp_controller = _ok(evidence.get("icmp_controller"))
    icmp_peer_result = evidence.get("icmp_peer") or {"skipped": True}
    icmp_peer = _ok(icmp_peer_result)
    banner = evidence.get("banner") or {"skipped": True}
    banner_checked = not banner.get("skipped")
    banner_msg = str(banner.get("msg") or "") if banner_checked else ""
    patient = evidence.get("patient") or {"skipped": True}
    # wait_for retries a refused port until its timeout; SSH itself says "Connection refused".
    refused = "refused" in banner_msg.lower() or (
        bool(patient.get("unreachable")) and "refused" in str(patient.get("msg") or "").lower()
    )
    banner_ok = banner_checked and not banner_msg and not banner.get("failed")
    peer_load = evidence.get("peer_load") or {"skipped": True}
    if _ok(peer_load):
        text = str(peer_load.get("stdout") or "")
    elif not patient.get("unreachable") and _ok(patient):
        text = str(patient.get("stdout") or "")
    else:
        text = ""
    load, cpus = read_load(text)
    if not banner_checked:
        banner_text = "not an SSH connection"
    elif banner_ok:
        banner_text = f"in {banner.get('elapsed')} s"
    elif refused and "refused" in banner_msg.lower():
        banner_text = "connection refused"
    else:
        banner_text = f"none within {banner_timeout} s"
    if icmp_peer_result.get("skipped"):
        peer_text = "not tried"
    else:
        peer_text = "reply" if icmp_peer else "no reply"
    lines = [
        f"ICMP from the controller: {'reply' if icmp_controller else 'no reply'}",
        f"ICMP from {peer} over the cluster link: {peer_text}",
        f"SSH banner: {banner_text}",
        "load: " + (f"{load:.1f} on {cpus} CPUs" if load is not None else "could not be read"),
    ]
    pinged = icmp_controller or icmp_peer
    if load is not None or (pinged and not refused):
        kind, ident, message, fix = "saturated", "F5", SATURATED_MESSAGE, SATURATED_FIX
    elif refused:
        kind, ident = "unreachable", "unreachable"
        message = (
            "UNREACHABLE: SSH refuses connections although the node answers ping;"
            if pinged
            else "UNREACHABLE: SSH refuses connections (its network stack answers, ping does not);"
        )
        fix = "start sshd."
    else:
        kind, ident = "unreachable", "unreachable"
        message = "UNREACHABLE: no reply to ping from the controller or from its peer."
        fix = "Check power, the cable and the management network."
    return {
        "class": kind,
        "evidence": lines,
        "load_1m": load,
        "advice": f"{message} {fix}",
        "findings": [
            finding(ident, "error", message, fix, host=host, check="silent", evidence=lines)
        ],
    }


def incomplete_verdict(host: str) -> dict[str, Any]:
    """A node whose preflight tasks failed: it cannot be sized."""
    evidence = ["its preflight tasks failed; see the errors above"]
    return {
        "class": "incomplete",
        "load_1m": None,
        "evidence": evidence,
        "advice": f"{INCOMPLETE_MESSAGE} {INCOMPLETE_FIX}",
        "findings": [
            finding(
                "incomplete",
                "error",
                INCOMPLETE_MESSAGE,
                INCOMPLETE_FIX,
                host=host,
                check="incomplete",
                evidence=evidence,
            )
        ],
    }


def judge_cluster(
    hostvars: Mapping[str, Mapping[str, Any]],
    hosts: Sequence[str],
    active: Sequence[str] | None = None,
) -> dict[str, Any]:
    """All nodes side by side: the weakest rank, the silent nodes, the limits and one table.

    ``hostvars[host]`` carries ``preflight_rank`` (it answered) or
    ``preflight_unresponsive`` (the verdict on a silent node). A host of
    ``hosts`` with neither, or not in ``active`` (the play's hosts still
    running), is INCOMPLETE.
    """
    running = set(hosts if active is None else active)
    nodes: dict[str, dict[str, Any]] = {}
    silent: dict[str, dict[str, Any]] = {}
    for host in hosts:
        # HostVars answers an unknown host with an undefined marker, not a KeyError.
        values: Mapping[str, Any] = {}
        if host in hostvars:
            values = hostvars[host]
        if host in running and "preflight_rank" in values:
            nodes[host] = dict(values["preflight_rank"])
        elif "preflight_unresponsive" in values:
            silent[host] = dict(values["preflight_unresponsive"])
        else:
            silent[host] = incomplete_verdict(host)
    # F23 (versions) and F25 (the head's manifest sizes every node's disk) compare nodes.
    stacks = {host: rank["host_stack"] for host, rank in nodes.items() if rank.get("host_stack")}
    for host, extra in judge_cluster_stack(stacks).items():
        if extra:
            nodes[host]["findings"] = [*nodes[host].get("findings", []), *extra]
    weakest = weakest_rank(nodes)
    findings = [f for rank in nodes.values() for f in rank.get("findings", [])]
    findings += [f for verdict in silent.values() for f in verdict.get("findings", [])]
    failing = [host for host, rank in nodes.items() if errors(rank.get("findings", []))]
    failing += list(silent)
    return {
        "nodes": nodes,
        "weakest_rank": weakest,
        "unresponsive": silent,
        "cluster_limits": cluster_limits(nodes),
        "findings": findings,
        "failing": failing,
        "lines": report(nodes, silent, weakest, failing, len(hosts)),
    }


def _finding_line(f: Mapping[str, Any]) -> str:
    text = f"{f.get('host', '')}: {f['message']}"
    if f.get("fix"):
        text += f"; {f['fix']}"
    return f"{text} [{f['id']}{' warning' if f.get('severity') == 'warning' else ''}]"


def report(
    nodes: Mapping[str, Mapping[str, Any]],
    silent: Mapping[str, Mapping[str, Any]],
    weakest: Mapping[str, Any] | None,
    failing: Sequence[str],
    cluster_size: int | None = None,
) -> list[str]:
    """The table printed after every run (``*`` marks the weakest rank), then the findings.

    A node with several discrete GPUs gets one line per GPU under the table (each GPU
    is a rank of tensor parallel inside the host; ``*`` marks the weakest). With one
    node in the cluster every rank is on it: the advice says so instead of "not the head".
    """
    lines = [f"Preflight failed on {', '.join(failing)}." if failing else "Preflight passed."]
    single = (cluster_size if cluster_size is not None else len(nodes) + len(silent)) == 1
    if weakest:
        where = weakest["host"] + (
            f" GPU {weakest['gpu']}" if weakest.get("gpu") is not None else ""
        )
        advice = (
            "one node holds every rank: size the plan for this one."
            if single
            else "size the plan for this rank, not the head."
        )
        lines.append(
            f"Weakest rank: {where} with {weakest['free_gib']} GiB free ({weakest['source']}); {advice}"
        )
    lines.append("")
    lines += _table(nodes, silent, weakest)
    lines += _gpu_lines(nodes, weakest)
    for rank in nodes.values():
        if rank.get("findings"):
            lines.append("")
            lines.extend(_finding_line(f) for f in rank["findings"])
    for host, verdict in silent.items():
        lines.append("")
        lines.append(f"{host} did not answer and is {str(verdict['advice']).strip()}")
        lines.extend(f"  {item}" for item in verdict.get("evidence", []))
    return lines + _other_users_lines(nodes)


def _table(
    nodes: Mapping[str, Mapping[str, Any]],
    silent: Mapping[str, Mapping[str, Any]],
    weakest: Mapping[str, Any] | None,
) -> list[str]:
    """One row per node; a node that did not answer shows its class instead of figures."""
    lines = [
        _TABLE_ROW % ("", "HOST", "FREE GiB", "SWAP %", "PSI10", "SHM GiB", "LOAD/CPU", *_OTHERS)
    ]
    for host, rank in nodes.items():
        psi = rank.get("psi_some_avg10")
        lines.append(
            _TABLE_ROW
            % (
                "*" if weakest and host == weakest["host"] else "",
                host,
                f"{int(rank['free_bytes']) / GIB:.1f}",
                f"{float(rank['swap_used_percent']):.0f}",
                f"{float(psi):.1f}" if psi is not None else "-",
                f"{int(rank['shm_free_bytes']) / GIB:.2f}",
                f"{float(rank['load_1m']) / int(rank['cpu_count']):.2f}",
                f"{int(rank['other_users']['total_rss_bytes']) / GIB:.1f}",
                "FAIL" if errors(rank.get("findings", [])) else "ok",
            )
        )
    for host, verdict in silent.items():
        lines.append(
            _TABLE_ROW % ("", host, "-", "-", "-", "-", "-", "-", verdict["class"].upper())
        )
    return lines


def _gpu_lines(
    nodes: Mapping[str, Mapping[str, Any]], weakest: Mapping[str, Any] | None
) -> list[str]:
    """A node with several discrete GPUs: one line per GPU (each a rank), ``*`` the weakest."""
    lines: list[str] = []
    for host, rank in nodes.items():
        cards = rank.get("gpus") or []
        if len(cards) > 1:
            lines.append("")
            lines.append(f"GPUs of {host} (one rank each):")
            marked = weakest.get("gpu") if weakest and weakest["host"] == host else None
            lines.extend(
                f"  {'*' if card['index'] == marked else ' '} GPU {card['index']}  {card['name']}"
                f"  {card['free_gib']:.2f} GiB free of {card['total_gib']:.2f} GiB"
                for card in cards
            )
    return lines


def _other_users_lines(nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Other users' largest processes per node: listed for their owners, never touched."""
    lines: list[str] = []
    for host, rank in nodes.items():
        processes = rank["other_users"].get("top_processes") or []
        if processes:
            lines.append("")
            lines.append(
                f"Other users' processes on {host} by RSS (listed only, never touched;"
                " ask their owners):"
            )
            lines.extend(
                f"  {p['user']:<10} {p['pid']!s:>8} {p['rss_bytes'] / GIB:8.2f} GiB"
                f"  {(p.get('cmdline') or p['name'])[:80]}"
                for p in processes
            )
    return lines
