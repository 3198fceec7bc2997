# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel log lines the watchdog acts on: what each says, and whether a restart can fix it.

Pure: ``/dev/kmsg`` records in, events out. Every form below is one published in a real
report; the lines and their sources are ``tests/unit/fixtures/watchdog/kernel-lines.yaml``.

- ``xid``: ``NVRM: Xid (PCI:…): N, …`` with N's meaning from NVIDIA's Xid catalog, and the
  driver's own "GPU has fallen off the bus" (Xid 79's companion);
- ``aer``: a PCIe error, with or without the ``AER:`` prefix (``PCIe Bus Error: severity=…``,
  ``… device has no AER-aware driver``);
- ``oom``: one kill, from any of its lines (``X invoked oom-killer``, ``oom-kill:constraint=…``,
  ``Out of memory: Killed process N (name)``), with the victim's pid and name;
- ``gpu_memory``: the driver could not allocate memory (``NV_ERR_NO_MEMORY``), which precedes
  the GB10 (DGX Spark) freezes; a burst of them is one event.

An event with ``page`` set is one that a restart of the engine cannot fix: the watchdog pages
and does not restart (``_judge``).
"""

from __future__ import annotations

import re
from typing import Any

KINDS = ("xid", "aer", "oom", "gpu_memory")
MAX_EVENTS = 20
# The lines of one kill (or one burst) come within moments; a line further apart starts anew.
FOLD_US = 10_000_000
XID_CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
# Xid -> (mnemonic, description, immediate action), as NVIDIA's Xid catalog (XID_CATALOG) gives
# them for Ampere and newer GPUs.
XIDS: dict[int, tuple[str, str, str]] = {
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP"),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE"),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors",
         "WORKFLOW_XID_45"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48"),
    61: ("PMU_BREAKPOINT", "internal micro-controller breakpoint (unused since Ampere)",
         "CONTACT_SUPPORT"),
    62: ("PMU_HALT_ERROR", "Internal micro-controller halt", "RESET_GPU"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU"),
    74: ("NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU"),
    109: ("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU"),
    119: ("GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU"),
    120: ("GSP_ERROR", "GSP Error", "RESET_GPU"),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154"),
}
# Immediate actions a restart of the engine covers: restart the application, or nothing to
# do (45 only follows another Xid). Any other (RESET_GPU, RESTART_BM, the ECC and NVLink
# workflows, CONTACT_SUPPORT) needs more than a restart.
RESTART_FIXES = ("RESTART_APP", "IGNORE", "WORKFLOW_XID_45")

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?[0-9A-Fa-f:.]*\): (\d+),")
_OFF_BUS = re.compile(r"NVRM: .*fallen off the bus")
# Xid 154 names the recovery the driver now requires; 0x0 is "None".
_RECOVERY = re.compile(r"recovery action changed from 0x[0-9A-Fa-f]+ \([^)]*\) to 0x([0-9A-Fa-f]+)")
_AER = re.compile(r"\bAER: .*(error|Error)|PCIe Bus Error: severity=|has no AER-aware driver")
_AER_FATAL = re.compile(r"Uncorrected \(Fatal\)|has no AER-aware driver")
_NO_MEMORY = re.compile(r"Out of memory \[NV_ERR_NO_MEMORY\]")
_INVOKED = re.compile(r"^(\S.*?) invoked oom-killer:")
_CONSTRAINT = re.compile(r"^oom-kill:constraint=.*,task=([^,]*),pid=(\d+),")
_KILLED = re.compile(r"\bKilled process (\d+) \(([^)]*)\)")


def _xid(number: int, message: str) -> dict[str, Any]:
    mnemonic, meaning, action = XIDS.get(number, (None, None, None))
    if number == 154:
        to = _RECOVERY.search(message)
        page = to is None or int(to.group(1), 16) != 0
    else:
        page = action is not None and action not in RESTART_FIXES
    return {"kind": "xid", "xid": number, "mnemonic": mnemonic, "meaning": meaning,
            "catalog_action": action, "page": page}


def _oom(message: str) -> dict[str, Any] | None:
    invoked, constraint, killed = (_INVOKED.search(message), _CONSTRAINT.search(message),
                                   _KILLED.search(message))
    kill: dict[str, Any] = {"kind": "oom", "pid": None, "process": None, "invoked_by": None}
    if invoked:
        return {**kill, "part": "invoked", "invoked_by": invoked.group(1)}
    if constraint:
        return {**kill, "part": "constraint", "pid": int(constraint.group(2)), "process": constraint.group(1)}
    if killed:
        return {**kill, "part": "killed", "pid": int(killed.group(1)), "process": killed.group(2)}
    return None


def classify_kernel(message: str) -> dict[str, Any] | None:
    """One kernel message -> its event fields (``kind`` and what the line tells), or None."""
    xid = _XID.search(message)
    if xid:
        return _xid(int(xid.group(1)), message)
    if _OFF_BUS.search(message):
        return _xid(79, message)
    if _AER.search(message):
        return {"kind": "aer", "page": bool(_AER_FATAL.search(message))}
    if _NO_MEMORY.search(message):
        return {"kind": "gpu_memory", "page": False, "count": 1}
    return _oom(message)


def _same_kill(kill: dict[str, Any], part: dict[str, Any]) -> bool:
    """Whether ``part`` continues the kill ``kill``: the kernel prints the invoking task, then
    the victim's constraint line, then ``Killed process`` for the same pid."""
    order = ("invoked", "constraint", "killed")
    if order.index(part["part"]) <= order.index(kill["part"]):
        return False
    return kill.get("pid") is None or kill["pid"] == part.get("pid")


def _add(events: list[dict[str, Any]], event: dict[str, Any]) -> None:
    """Append, or fold into the last event: the lines of one kill, a burst of NV_ERR_NO_MEMORY
    (lines printed within FOLD_US of each other)."""
    last = events[-1] if events else None
    near = last is not None and abs(event["usec"] - last["usec"]) <= FOLD_US
    if near and event["kind"] == "oom" == last["kind"] and _same_kill(last, event):
        last.update({k: v for k, v in event.items() if k != "seq" and v is not None})
        return
    if near and event["kind"] == "gpu_memory" == last["kind"]:
        last["count"] += 1
        last["usec"] = event["usec"]
        return
    if len(events) < MAX_EVENTS:
        events.append(event)


def parse_kmsg(records: list[bytes], after: int | None) -> tuple[list[dict[str, Any]], int | None]:
    """``/dev/kmsg`` records -> (events after the cursor, the last sequence number).

    A record is ``PRIORITY,SEQ,USEC,FLAGS;MESSAGE``. With no cursor (the first look) the
    current end is taken and nothing is reported: only what happens while watched counts.
    An event keeps the sequence number of its first line and the text of its last.
    """
    events: list[dict[str, Any]] = []
    last = after
    for raw in records:
        head, sep, message = raw.partition(b";")
        fields = head.split(b",")
        if not sep or len(fields) < 3 or not fields[1].isdigit():
            continue
        seq, usec = int(fields[1]), int(fields[2]) if fields[2].isdigit() else 0
        last = seq if last is None or seq > last else last
        if after is None or seq <= after:
            continue
        text = message.split(b"\n", 1)[0].decode("utf-8", "replace")
        found = classify_kernel(text)
        if found:
            _add(events, {"seq": seq, "usec": usec, **found, "line": text[:300]})
    for event in events:
        event.pop("part", None)
        event.pop("usec", None)
    return events, last
