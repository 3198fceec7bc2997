# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's state as Prometheus text (metric names: roles/watchdog/README.md).

Checked in the unit tests with ``prometheus_client``'s own parser.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._incidents import (
    VERDICTS,
)

PREFIX = "localinference_watchdog_"
HELP = {
    "up": ("gauge", "1 while the watchdog's loop runs"),
    "verdict": ("gauge", "1 for the verdict of the last look, 0 for the others"),
    "last_look_timestamp_seconds": ("gauge", "Unix time the last look ended"),
    "first_token_seconds": ("gauge", "Time to the first streamed token of the last probe (NaN: none came)"),
    "bad_looks": ("gauge", "Consecutive looks with a wedge sign"),
    "restarts_in_window": ("gauge", "Restarts within the restart window"),
    "restart_budget": ("gauge", "Restarts allowed within the window (watchdog_max_restarts)"),
    "budget_spent": ("gauge", "1 when the restart budget is spent and the watchdog only pages"),
    "restarts_total": ("counter", "Restarts the watchdog made"),
    "incidents_total": ("counter", "Incidents recorded"),
    "fabric_drift": ("gauge", "1 when the cluster link differs from fabric.json"),
    "memory_pressure": ("gauge", "PSI memory some avg10 (percent)"),
    "memory_short": ("gauge", "1 when MemAvailable is below what the admission keeps"),
    "kernel_events_total": ("counter", "Kernel log events seen (Xid, AER, OOM kill, GPU driver out of memory)"),
    "evidence_unknown": ("gauge", "1 when that probe could not be read this look"),
}


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NaN"
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def render(status: Mapping[str, Any]) -> str:
    """``status``: the watchdog's published state (``_program.Watchdog.status``)."""
    samples: dict[str, list[tuple[dict[str, Any], Any]]] = {name: [] for name in HELP}
    samples["up"].append(({}, 1))
    for verdict in VERDICTS:
        samples["verdict"].append(({"verdict": verdict}, int(status.get("verdict") == verdict)))
    samples["last_look_timestamp_seconds"].append(({}, status.get("last_look")))
    samples["first_token_seconds"].append(({}, status.get("ttft_s")))
    samples["bad_looks"].append(({}, status.get("bad_looks", 0)))
    samples["restarts_in_window"].append(({}, status.get("restarts_in_window", 0)))
    samples["restart_budget"].append(({}, status.get("max_restarts", 0)))
    samples["budget_spent"].append(({}, int(bool(status.get("budget_spent")))))
    for target in ("engine", "ingress"):
        samples["restarts_total"].append(({"target": target}, status.get("restarts", {}).get(target, 0)))
    for verdict in VERDICTS:
        samples["incidents_total"].append(({"verdict": verdict}, status.get("incidents", {}).get(verdict, 0)))
    for node, info in sorted(status.get("nodes", {}).items()):
        for kind in ("mtu", "gid", "link"):
            samples["fabric_drift"].append(({"node": node, "kind": kind}, int(kind in info.get("drift", ()))))
        samples["memory_pressure"].append(({"node": node}, info.get("psi")))
        samples["memory_short"].append(({"node": node}, int(bool(info.get("memory_short")))))
        for kind in ("xid", "aer", "oom"):
            samples["kernel_events_total"].append(
                ({"node": node, "kind": kind}, info.get("kernel", {}).get(kind, 0)))
        for probe in ("node", "token", "metrics"):
            samples["evidence_unknown"].append(
                ({"node": node, "probe": probe}, int(probe in info.get("unknown", ()))))
    lines = []
    for name, (kind, text) in HELP.items():
        full = PREFIX + name
        lines += [f"# HELP {full} {text}", f"# TYPE {full} {kind}"]
        for labels, value in samples[name]:
            shown = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            sample = f"{full}_total" if kind == "counter" and not full.endswith("_total") else full
            lines.append(f"{sample}{{{shown}}} {_number(value)}" if shown else f"{sample} {_number(value)}")
    return "\n".join(lines) + "\n"
