# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fabric stage's collective bandwidth: nccl-tests' table read, and judged.

``parse_all_reduce`` reads the output of nccl-tests' ``all_reduce_perf`` (or
its ``_mpi`` build) as people publish it: 2.17+ layouts (``redop root ...
#wrong``), the older ``error`` column (``N/A`` without validation), loader or
ssh warnings before the header, ``NCCL INFO`` lines inside the table, rows that
lost their alignment, ``mpirun --tag-output`` prefixes, no ``Avg`` line. The
lab's CPU stand-in (``GLOO_PROGRAM``: torch.distributed's gloo backend over the
cluster link) prints the same table, so one parser reads both.

``judge`` compares bus bandwidth (out of place) at the largest size with the
gate (``cluster_network_min_busbw_gbps``) and names the likely cause when it is
below: one port of the cable's two, an MTU below the jumbo one, an HCA list that
is not the one behind the cluster interfaces. A run that failed or stopped
early is refused as such, never read as a low figure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding

GATE_ID = "busbw"
STAND_IN_MARK = "# CPU stand-in: torch.distributed gloo"
_TAG = re.compile(r"^\[\d+,\d+\]<(stdout|stderr)>:")
_TYPES = {
    "int8",
    "uint8",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "half",
    "float",
    "double",
    "bfloat16",
    "f8e4m3",
    "f8e5m2",
}
_MAX_BYTES = re.compile(r"maxBytes\s+(\d+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(\w+)")
_FAILURE = re.compile(
    r"Test (NCCL )?failure|NCCL failure|Test CUDA failure|Bus error|Segmentation fault"
)


class BusbwParseError(validate.InputError):
    """The text is not a complete all_reduce_perf run; the message says what is missing."""


def _lines(text: str) -> list[str]:
    return [_TAG.sub("", line).rstrip() for line in text.splitlines()]


def _row(tokens: list[str], has_root: bool) -> dict[str, Any] | None:
    """One table row, or None when the line is not one."""
    if len(tokens) < 6 or not tokens[0].isdigit() or tokens[2] not in _TYPES:
        return None
    values = tokens[5:] if has_root else tokens[4:]
    if len(values) < 4:
        return None
    try:
        size, time_us, algbw, busbw = (
            int(tokens[0]),
            float(values[0]),
            float(values[1]),
            float(values[2]),
        )
    except ValueError:
        return None
    row = {"size": size, "time_us": time_us, "algbw": algbw, "busbw": busbw, "check": values[3]}
    if len(values) >= 8:
        row["busbw_in_place"] = float(values[6])
        row["check_in_place"] = values[7]
    strange = [
        key for key in ("time_us", "algbw", "busbw", "busbw_in_place")
        if key in row and not (math.isfinite(row[key]) and row[key] >= 0)
    ]
    if strange:  # a NaN bandwidth compares as above any gate
        raise BusbwParseError(
            f"the row of {size} bytes has {', '.join(f'{k}={row[k]!r}' for k in strange)}:"
            " not a measured bandwidth"
        )
    return row


def _wrong(check: str) -> bool:
    """A #wrong count above 0, or an error column that is not a tiny float or N/A."""
    if check in ("N/A", "0"):
        return False
    if check.isdigit():
        return int(check) > 0
    try:
        error = float(check)
    except ValueError:
        return True
    return not math.isfinite(error) or error > 1e-2  # a NaN error is a wrong result


def parse_all_reduce(text: str) -> dict[str, Any]:
    """``{rows, size_bytes, busbw_gbps, avg_busbw_gbps, complete, stand_in, max_bytes}``.

    ``busbw_gbps`` is the out-of-place bus bandwidth (GB/s) at the largest size;
    ``complete`` is True when the closing ``Out of bounds values`` line is there,
    None when the published text has no such line. Raises BusbwParseError when
    there is no table, a failure is printed, a row has wrong values, the
    bounds check failed, or the rows stop before the announced ``maxBytes``.
    """
    lines = _lines(text)
    failure = next((line.strip() for line in lines if _FAILURE.search(line)), None)
    if failure:
        raise BusbwParseError(f"the run failed: {failure[:200]}")
    header = next(
        (
            i
            for i, line in enumerate(lines)
            if line.startswith("#") and "busbw" in line and "size" in line
        ),
        None,
    )
    if header is None:
        raise BusbwParseError("no all_reduce_perf table (no header line naming size and busbw)")
    has_root = " root " in f" {lines[header]} "
    rows = [
        r
        for r in (
            _row(line.split(), has_root)
            for line in lines[header + 1 :]
            if line and not line.startswith("#")
        )
        if r
    ]
    if not rows:
        raise BusbwParseError("the table has no rows: the run ended before its first size")
    wrong = [r["size"] for r in rows if _wrong(r["check"]) or _wrong(r.get("check_in_place", "0"))]
    if wrong:
        raise BusbwParseError(
            f"wrong results at sizes {wrong[:5]}: a broken reduction, not a bandwidth"
        )
    avg = oob = max_bytes = None
    for line in lines:
        avg = avg or _AVG.match(line)
        oob = oob or _OOB.match(line)
        max_bytes = max_bytes or _MAX_BYTES.search(line)
    if oob and (int(oob.group(1)) > 0 or oob.group(2) != "OK"):
        raise BusbwParseError(f"out of bounds values: {oob.group(1)} {oob.group(2)}")
    largest = max(rows, key=lambda r: r["size"])
    announced = int(max_bytes.group(1)) if max_bytes else None
    if announced is not None and largest["size"] < announced and not oob:
        raise BusbwParseError(
            f"the table stops at {largest['size']} bytes of the announced {announced}: the run was cut short"
        )
    return {
        "rows": len(rows),
        "size_bytes": largest["size"],
        "busbw_gbps": largest["busbw"],
        "avg_busbw_gbps": float(avg.group(1)) if avg else None,
        "complete": True if oob else None,
        "max_bytes": announced,
        "stand_in": any(line.startswith(STAND_IN_MARK) for line in lines),
    }


# --------------------------------------------------------------------------- judgement

# The published two-Spark figures the causes are told with (NVIDIA dgx-spark-playbooks
# issues 102/103): both HCAs at MTU 9000, one HCA, one HCA at MTU 1500.
SPARK_BOTH_GBPS = 23.7
SPARK_ONE_PORT_GBPS = 13.6
SPARK_MTU_1500_GBPS = 3.0
JUMBO_MTU = 9000
ROCE_MTU = 4096


def _gate(severity: str, message: str, fix: str, host: Any) -> dict[str, Any]:
    return finding(GATE_ID, severity, message, fix, host=host, interface="all", check="busbw")


def likely_causes(context: Mapping[str, Any]) -> list[str]:
    """What in the node's facts explains a low figure: one port of two, MTU, the HCA list."""
    out = []
    hcas = list(context.get("hcas") or [])
    behind = list(context.get("hcas_behind") or [])
    twins = [list(t) for t in context.get("twins") or []]
    for pair in twins:
        listed = [h for h in pair if h in hcas]
        if len(listed) == 1:
            out.append(
                f"one port of two: NCCL_IB_HCA lists {listed[0]} but not its twin"
                f" {next(h for h in pair if h != listed[0])} (one x4 endpoint of the cable carries about"
                f" {SPARK_ONE_PORT_GBPS} GB/s, both {SPARK_BOTH_GBPS})"
            )
    mtu = context.get("mtu")
    active = [m for m in context.get("rdma_active_mtus") or [] if m is not None]
    if (mtu is not None and int(mtu) < JUMBO_MTU) or any(int(m) < ROCE_MTU for m in active):
        out.append(
            f"MTU: the cluster link runs MTU {mtu} (RDMA active_mtu {', '.join(map(str, active)) or '?'});"
            f" at 1500 one port reached about {SPARK_MTU_1500_GBPS} GB/s, at {JUMBO_MTU} with both"
            f" {SPARK_BOTH_GBPS}"
        )
    given = list(context.get("ib_hcas_given") or [])
    if given and behind and sorted(given) != sorted(behind):
        out.append(
            f"wrong HCA list: cluster_network_ib_hcas {', '.join(given)} is not the HCAs behind the"
            f" cluster interfaces ({', '.join(behind)})"
        )
    return out


def judge(
    measured: Mapping[str, Any] | str | None,
    min_gbps: float | None,
    context: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``{result, findings}``: the gate's verdict on a parsed run (or its parse error).

    ``measured`` is ``parse_all_reduce``'s dict, a string (why there is no
    figure: a parse error, a deadline) or None (not run). ``result`` is what
    fabric.json keeps: ``verdict`` pass, below, failed, unjudged (no gate
    figure) or not_run; ``busbw_gbps`` at ``size_bytes``; ``stand_in`` True for
    the CPU stand-in (gloo over TCP, not NCCL over RoCE).
    """
    context = context or {}
    host = context.get("host")
    result: dict[str, Any] = {
        "backend": context.get("backend"),
        "stand_in": False,
        "busbw_gbps": None,
        "size_bytes": None,
        "avg_busbw_gbps": None,
        "min_busbw_gbps": min_gbps,
        "verdict": "not_run",
        "causes": [],
        "note": "",
    }
    if measured is None:
        result["note"] = (
            "the collective bandwidth was not measured (cluster_network_busbw_gate false)"
        )
        return {"result": result, "findings": []}
    if isinstance(measured, str):
        return _no_figure(result, measured, host)
    _take_measurement(result, measured)
    if min_gbps is None:
        result["verdict"] = "unjudged"
        return {
            "result": result,
            "findings": [
                _gate(
                    "warning",
                    f"all_reduce bus bandwidth {measured['busbw_gbps']:g} GB/s at {measured['size_bytes']} bytes,"
                    " judged against nothing: this profile has no gate figure (cluster_network_min_busbw_gbps)",
                    "set cluster_network_min_busbw_gbps to the least bus bandwidth this cluster must reach",
                    host,
                )
            ],
        }
    if measured["busbw_gbps"] >= min_gbps:
        result["verdict"] = "pass"
        return {"result": result, "findings": []}
    return _below(result, measured, min_gbps, context)


def _no_figure(result: dict[str, Any], why: str, host: str | None) -> dict[str, Any]:
    """The run ended without a figure (a parse error, a deadline): failed, with the reason."""
    result["verdict"] = "failed"
    result["note"] = why
    return {
        "result": result,
        "findings": [
            _gate(
                "error",
                f"the collective bandwidth measurement gave no figure: {why}",
                "run the stage again with -v to see the command's output; check that every node reaches the"
                " others over the cluster link and that the measuring program exists on the nodes",
                host,
            )
        ],
    }


def _take_measurement(result: dict[str, Any], measured: Mapping[str, Any]) -> None:
    stand_in = bool(measured.get("stand_in"))
    result.update(
        stand_in=stand_in,
        busbw_gbps=measured["busbw_gbps"],
        size_bytes=measured["size_bytes"],
        avg_busbw_gbps=measured.get("avg_busbw_gbps"),
    )
    if stand_in:
        result["note"] = (
            "CPU stand-in: torch.distributed gloo over TCP on the cluster link, not NCCL over RoCE;"
            " the figure proves the path and its rate, not GPU collectives"
        )


def _below(
    result: dict[str, Any], measured: Mapping[str, Any], min_gbps: float, context: Mapping[str, Any]
) -> dict[str, Any]:
    """Below the gate: the verdict with the likely causes the facts show."""
    stand_in = result["stand_in"]
    causes = (
        [
            "the CPU stand-in's TCP path: the cluster link's rate (a tc shaper, the MTU) or the hosts' load"
        ]
        if stand_in
        else likely_causes(context)
        or [
            "none of one port of two, MTU or the HCA list shows in the facts: check the cable seating,"
            " the negotiated speed (ethtool) and other traffic on the link"
        ]
    )
    result.update(verdict="below", causes=causes)
    what = "gloo (CPU stand-in)" if stand_in else "NCCL all_reduce_perf"
    return {
        "result": result,
        "findings": [
            _gate(
                "error",
                f"{what} bus bandwidth {measured['busbw_gbps']:g} GB/s at {measured['size_bytes']} bytes is below"
                f" the gate of {min_gbps:g} GB/s; likely cause: {'; '.join(causes)}",
                "fix the cause and run the fabric stage again (--tags fabric); lower"
                " cluster_network_min_busbw_gbps only for a link that cannot do better",
                context.get("host"),
            )
        ],
    }


def run_outcome(run: Mapping[str, Any] | None, timeout: int) -> dict[str, Any] | str | None:
    """What rank 0's registered command result says: the parsed run, why there is
    no figure, or None when it did not run."""
    if not run or run.get("skipped") or "rc" not in run:
        return None
    stdout = str(run.get("stdout") or "")
    if run["rc"] in (124, 137):
        return f"the measurement passed its deadline of {timeout} s (timeout killed it)"
    try:
        parsed = parse_all_reduce(stdout)
    except BusbwParseError as exc:
        tail = [line for line in str(run.get("stderr") or "").splitlines() if line.strip()][-1:]
        return f"rc {run['rc']}: {exc}" + (f" ({tail[0][:200]})" if tail else "")
    return (
        parsed if run["rc"] == 0 else f"rc {run['rc']} after a table: {parsed['busbw_gbps']} GB/s"
    )
