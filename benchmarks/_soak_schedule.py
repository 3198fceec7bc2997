# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which faults a soak causes and when; pure, no lab.

The seven faults of the hour, in the order it causes them. Each needs some minutes from its
cause to the clients' recovery (``needs_minutes``, with margin: a wedge costs about 55-72 s in
the lab, an upgrade two boots and two qualifications), may be ended by the head's watchdog
(``watchdog``: the incident fields of its record, one restart of its budget) and costs some
engine restarts by design (``restarts``: the outage goal counts a plain restart for each).

Without ``SOAK_FAULTS`` a soak takes the faults in :data:`PRIORITY` order while their needs fit
in :data:`FAULT_SHARE` of its minutes (the wedge always): 3 minutes is the wedge alone, 60 all
seven. The faults are spaced evenly: the same quiet time before each and after the last, each
given the minutes it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FaultSpec:
    name: str
    caused: str
    needs_minutes: float
    restarts: int = 0
    watchdog: dict[str, Any] | None = None


FAULTS = (
    FaultSpec("wedge", "kill -STOP of the worker's TP rank; the head's watchdog restarts the cluster",
              1.5, 1, {"verdict": "wedged", "action": "restart"}),
    FaultSpec("head_kill", "kill -KILL of the head's vLLM server; the head's watchdog restarts the cluster",
              2.5, 1, {"verdict": "down", "action": "restart"}),
    FaultSpec("link_flap", "the worker's cluster link down for SOAK_FLAP_S, then up", 1.5),
    FaultSpec("key_rotation", "ingress.yml -e ingress_rotate_key=true; a client refused with 401 reads"
              " the key file again", 1.5),
    FaultSpec("upgrade_regress", "upgrade.yml with max_num_seqs halved: qualified as challenger and"
              " reverted by itself", 8.0, 2),
    FaultSpec("upgrade_promote", "upgrade.yml with seed 1234: promoted; then the inventory's recipe is"
              " rolled out again", 8.0, 2),
    FaultSpec("caddy_stop", "systemctl stop of the ingress (caddy.service); the head's watchdog starts"
              " it again", 1.5, 0, {"verdict": "down", "action": "restart-ingress"}),
)
BY_NAME = {spec.name: spec for spec in FAULTS}
# What a shorter soak keeps first.
PRIORITY = ("wedge", "link_flap", "head_kill", "caddy_stop", "key_rotation", "upgrade_regress",
            "upgrade_promote")
# The share of the run the faults may take by default: the rest is quiet, measured traffic.
FAULT_SHARE = 0.6


@dataclass(frozen=True)
class Planned:
    spec: FaultSpec
    at: float  # seconds from the start

    @property
    def name(self) -> str:
        return self.spec.name


def select(faults: str, minutes: float, flap_seconds: float = 20) -> list[FaultSpec]:
    """The faults a soak of ``minutes`` causes, in their order: ``faults`` is ``SOAK_FAULTS`` (a
    comma list, ``none``, or empty for the default); ``flap_seconds`` 0 drops the link flap.

    Raises ValueError naming the problem: an unknown or repeated fault, a link flap of 0 s, or
    faults whose needs exceed the run."""
    text = faults.strip()
    if not text:
        chosen, used = [], 0.0
        for name in PRIORITY:
            spec = BY_NAME[name]
            if name == "link_flap" and not flap_seconds:
                continue
            if chosen and used + spec.needs_minutes > FAULT_SHARE * minutes:
                break
            chosen.append(name)
            used += spec.needs_minutes
    elif text.lower() == "none":
        chosen = []
    else:
        chosen = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in chosen if name not in BY_NAME]
        if unknown:
            raise ValueError(f"SOAK_FAULTS names {', '.join(repr(n) for n in unknown)}: the faults are"
                             f" {', '.join(spec.name for spec in FAULTS)} (or none)")
        repeated = sorted({name for name in chosen if chosen.count(name) > 1})
        if repeated:
            raise ValueError(f"SOAK_FAULTS names {', '.join(repeated)} more than once")
        if "link_flap" in chosen and not flap_seconds:
            raise ValueError("SOAK_FAULTS names link_flap but SOAK_FLAP_S is 0 (no flap)")
        needs = sum(BY_NAME[name].needs_minutes for name in chosen)
        if needs > minutes:
            raise ValueError(f"SOAK_FAULTS needs {needs:g} min ({', '.join(chosen)}); SOAK_MINUTES"
                             f" is {minutes:g}")
    return [spec for spec in FAULTS if spec.name in chosen]


def schedule(specs: Sequence[FaultSpec], minutes: float) -> list[Planned]:
    """When each fault is caused: equal quiet time before each and after the last."""
    quiet = max(0.0, minutes - sum(spec.needs_minutes for spec in specs)) / (len(specs) + 1)
    planned, at = [], 0.0
    for spec in specs:
        at += quiet
        planned.append(Planned(spec, round(at * 60, 1)))
        at += spec.needs_minutes
    return planned


def watchdog_restarts(specs: Sequence[FaultSpec]) -> int:
    """How many restarts of the watchdog's budget the faults spend when all goes well."""
    return sum(spec.watchdog is not None for spec in specs)


def describe(planned: Sequence[Planned]) -> str:
    """The schedule, one fault a line, for the soak's first words."""
    if not planned:
        return "no fault: steady traffic only"
    return "\n".join(f"  {p.at / 60:5.1f} min  {p.name:<16} {p.spec.caused}" for p in planned)
