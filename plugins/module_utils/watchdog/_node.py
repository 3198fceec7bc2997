# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the watchdog reads and does on one node: ``watchdog node probe|stop|verify|start``.

The head runs the verbs itself; a worker runs them when the head's watchdog key logs in
over the cluster link (its ``authorized_keys`` entry forces ``watchdog node``, so
``SSH_ORIGINAL_COMMAND`` is the only input and the key can do nothing else). Each verb
prints one JSON object. The node's own config is ``/etc/localinference/watchdog-node.json``,
written by the role; the units come from the node's ``serving.json`` (the rollout's
reconciled state), never from the command line.

Parsers are pure and tested on recorded text (``tests/unit/fixtures/watchdog/``).
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Mapping
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import _files
from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._systemctl import (
    parse_unit_show,
)
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_compile import (
    compile_state,
)
from ansible_collections.localinference.vllm.plugins.module_utils.fabric._rdma_facts import (
    live_roce_v2_index,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._memory_facts import (
    parse_meminfo,
    parse_psi,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._restart import (
    start_units,
    stop_units,
    verify_node,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._stage_checks import (
    StageCheckError,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    check_document,
    read_text,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._kernel import parse_kmsg

VERBS = ("probe", "stop", "verify", "start")
SHOW = ("Id", "LoadState", "ActiveState", "SubState", "Result", "NRestarts",
        "ActiveEnterTimestampMonotonic")
MAX_KMSG_RECORDS = 20000
ENGINE_LOG_LINES = 400


class NodeError(validate.InputError):
    """The node cannot answer a verb; the message says why."""


def parse_command(text: str | None) -> tuple[str, int | None, list[str]]:
    """``SSH_ORIGINAL_COMMAND`` (or argv) -> (verb, kernel cursor, units); refuses the rest.

    ``probe [CURSOR]``, ``stop``, ``verify``, ``start [UNIT...]`` (units of the node's own
    ``start_order`` only, checked by :func:`run_verb`).
    """
    words = (text or "").split()
    if not words or words[0] not in VERBS:
        raise NodeError(f"refused: {str(text)[:80]!r} is not one of {', '.join(VERBS)}")
    verb, rest = words[0], words[1:]
    if verb == "probe" and len(rest) == 1 and rest[0].isascii() and rest[0].isdigit() and len(rest[0]) < 19:
        return verb, int(rest[0]), []
    if verb == "start" and len(rest) <= 4 and all(w.startswith("localinference-") for w in rest):
        return verb, None, rest
    if rest:
        raise NodeError(f"refused: {verb} does not take {' '.join(rest)[:80]!r}")
    return verb, None, []


def engine_log(runner, units: list[str]) -> dict[str, Any]:
    """Whether the serving units' latest journal lines show a kernel compile in progress
    (``_vllm_compile.compile_state``); a journal that cannot be read shows none, and says so."""
    argv = ["journalctl", "--no-pager", "--output=cat", f"--lines={ENGINE_LOG_LINES}",
            *(f"--unit={unit}" for unit in units)]
    try:
        rc, text, err = runner.run(argv)
    except CommandError as exc:
        rc, text, err = -1, "", str(exc)
    if rc != 0:
        return {"compiling": False, "what": None, "line": None,
                "error": f"journalctl failed (rc {rc}): {err.strip()[:200]}"}
    return compile_state(text.splitlines())


def read_kmsg(path: str) -> list[bytes]:
    """Every record the kernel still holds, read without blocking."""
    records = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while len(records) < MAX_KMSG_RECORDS:
            try:
                records.append(os.read(fd, 8192))
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                if exc.errno == errno.EPIPE:  # overwritten while read: go on
                    continue
                raise
    finally:
        os.close(fd)
    return records


def parse_show_blocks(text: str) -> dict[str, dict[str, Any]]:
    """``systemctl show -p … UNIT…`` -> per unit, with NRestarts and the active age typed."""
    units: dict[str, dict[str, Any]] = {}
    for unit, fields in parse_unit_show(text).items():
        entry: dict[str, Any] = {k: fields.get(k, "") for k in SHOW if k != "Id"}
        entry["NRestarts"] = int(entry["NRestarts"]) if entry["NRestarts"].isdigit() else None
        stamp = entry.pop("ActiveEnterTimestampMonotonic")
        entry["active_since_monotonic_us"] = int(stamp) if stamp.isdigit() and stamp != "0" else None
        units[unit] = entry
    return units


def link_state(ifname: str, read) -> dict[str, Any]:
    """One interface from sysfs: operstate, carrier, MTU; ``up`` when it can carry traffic."""
    base = f"/sys/class/net/{ifname}"
    state, carrier, mtu = read(f"{base}/operstate"), read(f"{base}/carrier"), read(f"{base}/mtu")
    if state is None:
        return {"ifname": ifname, "up": False, "state": "missing", "mtu": None}
    return {
        "ifname": ifname,
        "state": state,
        "up": state in ("up", "unknown") and carrier == "1",
        "mtu": int(mtu) if mtu and mtu.isdigit() else None,
    }


def _serving(cfg: Mapping[str, Any]) -> dict[str, Any]:
    text = read_text(cfg["serving_state_path"])
    if text is None:
        raise NodeError(f"{cfg['serving_state_path']} does not exist: no rollout reconciled this node")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise NodeError(f"{cfg['serving_state_path']}: not JSON ({exc})") from None
    return document


def _start_order(cfg: Mapping[str, Any]) -> list[str]:
    trusted, problems = check_document(_serving(cfg), tuple(cfg["unit_dirs"]))
    if problems:
        raise NodeError("; ".join(problems)[:500])
    return trusted["start_order"]


def probe(cfg: Mapping[str, Any], runner, cursor: int | None) -> dict[str, Any]:
    """What the watchdog judges on this node; a part that cannot be read says so."""
    out: dict[str, Any] = {"node": cfg["node"], "reachable": True, "unknown": []}
    units = _start_order(cfg)
    out["start_order"] = units
    rc, text, err = runner.run(["systemctl", "show", "-p", ",".join(SHOW), "--", *units])
    if rc != 0:
        out["unknown"].append(f"units: systemctl show failed (rc {rc}): {err.strip()[:200]}")
    out["units"] = parse_show_blocks(text) if rc == 0 else {}
    out["engine_log"] = engine_log(runner, units)
    now_us = time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6
    for entry in out["units"].values():
        since = entry.pop("active_since_monotonic_us")
        entry["active_for_s"] = round((now_us - since) / 1e6, 1) if since else None
    out["links"] = [link_state(name, _files.read_sysfs) for name in cfg.get("interfaces", [])]
    out["gid_index"] = None
    for port in cfg.get("rdma", []):
        out["gid_index"], _ = live_roce_v2_index(cfg["rdma_sys_root"], port["hca"], port["port"],
                                                 port["ipv4"], port.get("netdev"), _files.read_sysfs)
        break
    out["psi_some_avg10"], out["mem_available_bytes"] = None, None
    try:
        psi = _files.read_kernel_text("/proc/pressure/memory")
        out["psi_some_avg10"] = parse_psi(psi)["some"]["avg10"] if psi else None
        available = parse_meminfo(_files.read_kernel_text("/proc/meminfo") or "").get("MemAvailable")
        out["mem_available_bytes"] = available * 1024 if available is not None else None
    except (ValueError, KeyError) as exc:
        out["unknown"].append(f"memory: {str(exc)[:200]}")
    try:
        out["kernel"], out["kernel_cursor"] = parse_kmsg(read_kmsg(cfg["kmsg"]), cursor)
    except OSError as exc:
        out["kernel"], out["kernel_cursor"] = [], cursor
        out["unknown"].append(f"kernel log: {cfg['kmsg']}: {exc.strerror or exc}")
    return out


def run_verb(verb: str, cfg: Mapping[str, Any], runner, cursor: int | None = None,
             units: list[str] | None = None) -> dict[str, Any]:
    """One verb on this node, as the JSON it prints."""
    try:
        if verb == "probe":
            return probe(cfg, runner, cursor)
        if verb == "verify":
            return {"node": cfg["node"], **verify_node(_serving(cfg), cfg["unit_dirs"], _read_unit)}
        order = _start_order(cfg)
        if verb == "stop":
            return {"node": cfg["node"], "ok": True, "stopped": stop_units(runner, order)}
        unknown = [u for u in units or [] if u not in order]
        if unknown:
            raise NodeError(f"refused: {', '.join(unknown)} not in this node's start_order {order}")
        chosen = [u for u in order if u in units] if units else order
        return {"node": cfg["node"], "ok": True, "started": start_units(runner, chosen)}
    except (NodeError, StageCheckError) as exc:
        return {"node": cfg["node"], "ok": False, "reachable": True, "error": str(exc)[:500]}


def _read_unit(path: str) -> str | None:
    try:
        return _files.read_text(path, 1024 * 1024)
    except FileNotFoundError:
        return None
