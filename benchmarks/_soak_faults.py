# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the soak causes each fault of benchmarks/_soak_schedule.py and puts the lab back.

Each fault is caused as its lab test causes it, through lab/harness.py and benchmarks/_faults.py
(nothing here talks to a host itself). A fault runs in three steps, the last one always:

1. ``cause()``: the fault is made (for the key rotation and the upgrades: the whole playbook);
2. ``settle(wait)``: until the fault is over on its own terms (the watchdog's record, the flap's
   length, the upgrade's outcome); ``wait(seconds)`` is False once the soak is over;
3. ``put_back(settled)``: what the product left undone is mended, and said: the rank continued,
   the units restarted in order, the link up, Caddy started, the inventory's recipe rolled out.

``error`` names what the product did not do as it must (a fault that went wrong fails the soak).
"""

from __future__ import annotations

import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._faults import ENDED, cont_rank, first_incident, link, plain_restart, stop_rank
from benchmarks._soak_schedule import FaultSpec
from lab.harness import (
    HEAD,
    INGRESS_UNIT,
    LabError,
    exec_on,
    inventory_recipe,
    kill_head_server,
    qualify,
    rollout,
    rotate_key,
    serving_hashes,
    upgrade,
)

# The upgrades' own saved verdict (the lab's qualify.json stays as it was), removed after each.
UPGRADE_SAVED = "/etc/localinference/qualify-soak.json"
UPGRADE_REVERTED = "UPGRADE: reverted: the last good stack serves again"
UPGRADE_PROMOTED = "UPGRADE: promoted: the new stack serves and is the last good one"
# A fault the watchdog ends, and it did not: how long it may still take before the soak mends it
# (the lab's watchdog_ready_timeout_s is 300 s; the watchdog's own lab tests wait as long).
WATCHDOG_WAIT = 500
PUT_BACK_TOKEN_S = 600

Wait = Callable[[float], bool]


@dataclass
class Options:
    flap_seconds: float = 20
    caddy_seconds: float = 120
    report_dir: Path = Path(".lab/soak-upgrades")


class Fault(ABC):
    def __init__(self, spec: FaultSpec, options: Options) -> None:
        self.spec, self.options = spec, options
        self.since = 0.0  # the epoch just before the cause
        self.caused = False
        self.error: str | None = None
        self.pids: list[str] = []

    @abstractmethod
    def cause(self) -> None:
        raise NotImplementedError

    def settle(self, wait: Wait) -> dict[str, Any]:
        """For a fault the watchdog ends: its record with an ended outcome (at most WATCHDOG_WAIT s)."""
        if not self.spec.watchdog:
            return {}
        # By its verdict alone: a page (budget spent) or the wrong restart ends it too, and is said.
        verdict, action = self.spec.watchdog["verdict"], self.spec.watchdog["action"]
        record, deadline = None, time.monotonic() + WATCHDOG_WAIT
        while record is None and time.monotonic() < deadline:
            record = first_incident(self.since - 1, verdict=verdict, outcome=ENDED)
            if record is None and not wait(2.0):
                break
        if record is not None and record.get("action") != action:
            self.error = (f"the watchdog answered the {self.spec.name} with {record.get('action')}"
                          f" ({record.get('outcome')}), not {action}: {record.get('evidence')}")
        detected = first_incident(self.since - 1, verdict=verdict)
        return {"watchdog_outcome": None if record is None else record["outcome"],
                "window_end_epoch": None if record is None else record.get("epoch"),
                "watchdog_detected_epoch": None if detected is None else detected.get("epoch"),
                "watchdog_detect_seconds": None if detected is None else detected.get("detect_seconds"),
                "watchdog_recover_seconds": None if record is None else record.get("recover_seconds")}

    def put_back(self, settled: dict[str, Any]) -> str | None:
        return None


class Wedge(Fault):
    def cause(self) -> None:
        self.pids, self.since = stop_rank()
        self.caused = True

    def put_back(self, settled: dict[str, Any]) -> str | None:
        if not self.caused or settled.get("watchdog_outcome") == "recovered":
            return None
        cont_rank(self.pids)
        return "the watchdog did not recover the wedge: the rank got kill -CONT"


class HeadKill(Fault):
    def cause(self) -> None:
        self.since = time.time()
        kill_head_server()
        self.caused = True

    def put_back(self, settled: dict[str, Any]) -> str | None:
        if not self.caused or settled.get("watchdog_outcome") == "recovered":
            return None
        plain_restart(PUT_BACK_TOKEN_S)
        return "the watchdog did not recover the killed server: the units were restarted in order"


class LinkFlap(Fault):
    def cause(self) -> None:
        self.since = time.time()
        self.caused = True  # before the command: a link half set down is still set up again
        link("down")

    def settle(self, wait: Wait) -> dict[str, Any]:
        wait(self.options.flap_seconds)
        return {}

    def put_back(self, settled: dict[str, Any]) -> str | None:
        if self.caused:
            link("up")
        return None


class KeyRotation(Fault):
    def cause(self) -> None:
        self.since = time.time()
        self.caused = True
        run = rotate_key()
        if run.rc != 0:
            self.error = f"ingress.yml -e ingress_rotate_key=true failed (rc {run.rc}): {run.tail(600)}"

    # Nothing to put back: the new key stays, every reader (the harness, the watchdog, the
    # client's env file, the soak's sessions after a 401) takes it from the files.


class CaddyStop(Fault):
    def cause(self) -> None:
        self.since = time.time()
        self.caused = True
        exec_on(HEAD, "systemctl", "stop", INGRESS_UNIT)

    def settle(self, wait: Wait) -> dict[str, Any]:
        """The watchdog's restart of the ingress, for at most SOAK_CADDY_S."""
        deadline = time.monotonic() + self.options.caddy_seconds
        verdict = (self.spec.watchdog or {}).get("verdict")
        while first_incident(self.since - 1, verdict=verdict, outcome=ENDED) is None and time.monotonic() < deadline:
            if not wait(2.0):
                break
        return super().settle(lambda seconds: False)

    def put_back(self, settled: dict[str, Any]) -> str | None:
        if not self.caused:
            return None
        active = exec_on(HEAD, "systemctl", "is-active", INGRESS_UNIT, check=False).stdout.strip()
        if active == "active":
            return None
        exec_on(HEAD, "systemctl", "start", INGRESS_UNIT)
        return f"{INGRESS_UNIT} was still stopped after {self.options.caddy_seconds:g} s: the soak started it"


class Upgrade(Fault):
    """upgrade.yml against a baseline qualified under the soak's own saved verdict."""

    expect = ""

    @abstractmethod
    def changes(self) -> dict[str, Any]:
        raise NotImplementedError

    def cause(self) -> None:
        self.before = serving_hashes()
        if len(self.before) != 1:
            raise LabError(f"the nodes serve different recipes before the upgrade: {sorted(self.before)}")
        self.since = time.time()
        self.caused = True
        reports = self.options.report_dir / self.spec.name
        base = qualify(UPGRADE_SAVED, reports / "base")
        if base.rc != 0:
            raise LabError(f"the baseline qualification failed (rc {base.rc}): {base.tail(600)}")
        self.run = upgrade(self.changes(), UPGRADE_SAVED, reports / "upgrade")
        self.error = self.judge()

    @abstractmethod
    def judge(self) -> str | None:
        raise NotImplementedError

    def put_back(self, settled: dict[str, Any]) -> str | None:
        if not self.caused:
            return None
        exec_on(HEAD, "rm", "-f", UPGRADE_SAVED, check=False)
        if serving_hashes() == self.before:
            return None
        back = rollout(tags="rollout")
        if back.rc != 0:
            raise LabError(f"the inventory's recipe could not be rolled out again: {back.tail(600)}")
        return "the inventory's recipe was rolled out again"


class UpgradeRegress(Upgrade):
    def changes(self) -> dict[str, Any]:
        self.streams = int(inventory_recipe().get("max_num_seqs", 4))
        return {"max_num_seqs": max(1, self.streams // 2)}

    def judge(self) -> str | None:
        if self.run.rc == 0 or UPGRADE_REVERTED not in self.run.flat:
            return f"the upgrade with max_num_seqs halved was not reverted (rc {self.run.rc}): {self.run.tail(600)}"
        if serving_hashes() != self.before:
            return "the upgrade said reverted but the nodes serve another recipe"
        return None


class UpgradePromote(Upgrade):
    def changes(self) -> dict[str, Any]:
        return {"seed": 1234}

    def judge(self) -> str | None:
        if self.run.rc != 0 or UPGRADE_PROMOTED not in self.run.flat:
            return f"the upgrade with seed 1234 was not promoted (rc {self.run.rc}): {self.run.tail(600)}"
        return None


KINDS: dict[str, type[Fault]] = {
    "wedge": Wedge, "head_kill": HeadKill, "link_flap": LinkFlap, "key_rotation": KeyRotation,
    "upgrade_regress": UpgradeRegress, "upgrade_promote": UpgradePromote, "caddy_stop": CaddyStop,
}


def make(spec: FaultSpec, options: Options) -> Fault:
    return KINDS[spec.name](spec, options)
