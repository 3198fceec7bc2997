# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host-stack judgements (F21-F26): the text a node printed -> findings with their fix.

Users of every peer project lose days to the stack under vLLM rather than to
vLLM: a kernel update that breaks RDMA memory registration, a pip-bundled NCCL
loaded instead of the system one, nodes on different drivers, an unsynchronised
clock, a disk too small for the weights, a memlock limit RDMA cannot live with.
``localinference.vllm.host_stack_facts`` gathers the evidence (bounded
commands, no GPU needed); each check below is one pure function over that
recorded text and returns findings of the collection's one type
(:mod:`._findings`) with ``check``, ``evidence`` (the lines that prove it) and
the fix. Severity is ``error`` only where the stack is surely broken.

- ``F21`` kernel / CMA (``judge_kernel``)
- ``F22`` the NCCL the engine loads (``judge_nccl``, in ``_nccl_probe.py`` beside the probe)
- ``F23`` driver, CUDA or NCCL version differs between nodes (``judge_versions``)
- ``F24`` clock not synchronised (``judge_clock``)
- ``F25`` disk too small for the weights (``judge_disk``)
- ``F26`` memlock too low for RDMA (``judge_memlock``)

Every id is described in ``docs/failure-catalog.md``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.common._recipe import (
    DEPLOY_DEFAULTS,
)
from ansible_collections.localinference.vllm.plugins.module_utils.preflight._nccl_probe import (
    judge_nccl,
    nccl_summary,
)

GIB = 1024**3
MIB = 1024**2
KIB = 1024


def _doc(fid: str) -> str:
    return f"docs/failure-catalog.md#{fid.lower()}"


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


# --- F21: kernel and CMA ---------------------------------------------------------------------
#
# Kernels reported to fail RDMA memory registration on DGX Spark (ibv_reg_mr_iova2 ENOMEM at
# NCCL init, every start) unless booted with kho=off. The kernel enables Kexec HandOver by
# default; its scratch area is released to the page allocator as MIGRATE_CMA pageblocks that
# long-term pins (the NIC's) cannot use, and /proc/meminfo shows it as CmaFree above CmaTotal.
# - MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks#14: 7.0.0-1019-nvidia fails on three GB10 nodes,
#   6.17.0-1032-nvidia works (driver 580.173.02, NCCL 2.30.7 unchanged).
# - MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259: HWE 7.0.0-31 and 7.0.0-30 (arm64);
#   root cause KHO (CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=y), fixed by kho=off; a second pair
#   on 7.0.0-1019-nvidia showed "CmaTotal: 0 kB / CmaFree: 940604 kB" and recovered with kho=off.
# - NVIDIA/NV-Kernels#590 and #591: 7.0.0-1019.19~24.04.2, CmaTotal=0 with about 9.7 GiB
#   CmaFree; kho=off (or CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=n) passes; 6.17.13 passes.
# - luxingcom/aicad-nccl-optimization#1: 7.0.0-1019-nvidia "CmaTotal: 0 kB", ENOMEM even for
#   1 KB registrations; fixed by 6.17.0-1031-nvidia with driver 580.173.02.
# - eugr/spark-vllm-docker#389: NCCL memlock ENOMEM at init on 7.0.0-1019.
KNOWN_BAD_KERNELS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"^7\.0\.0-1019-nvidia$"),
        "aarch64",
        "MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks#14, NVIDIA/NV-Kernels#590",
    ),
    (
        re.compile(r"^7\.0\.0-3[01]-"),
        "aarch64",
        "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259",
    ),
)
KERNEL_FIX = (
    "add kho=off to the kernel command line (GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub,"
    " update-grub, reboot) or boot the previous kernel (6.17.0-1032-nvidia worked in the same"
    " reports); after the reboot CmaFree should read 0"
)
_CMA_LINE = re.compile(r"^(CmaTotal|CmaFree):\s+(\d{1,19})\s+kB$")
_KHO_OFF = {"off", "0", "n", "no", "false"}


def parse_cma(meminfo: str) -> tuple[int, int] | None:
    """``(CmaTotal, CmaFree)`` in KiB from ``/proc/meminfo`` text; None without both lines."""
    values = {}
    for line in (meminfo or "").splitlines():
        match = _CMA_LINE.match(line.strip())
        if match:
            values[match.group(1)] = int(match.group(2))
    if "CmaTotal" in values and "CmaFree" in values:
        return values["CmaTotal"], values["CmaFree"]
    return None


def kho_off(cmdline: str) -> bool:
    """True when ``/proc/cmdline`` disables Kexec HandOver (``kho=off`` and its bool spellings)."""
    for token in (cmdline or "").split():
        key, sep, value = token.partition("=")
        if key == "kho" and sep and value.lower() in _KHO_OFF:
            return True
    return False


def known_bad_kernel(release: str, machine: str = "") -> str | None:
    """The sources that report ``release`` breaking RDMA registration, or None."""
    for pattern, arch, sources in KNOWN_BAD_KERNELS:
        if pattern.match(release or "") and (not machine or machine == arch):
            return sources
    return None


def judge_kernel(
    release: str, machine: str, cmdline: str, meminfo: str, rdma: bool, host: str = ""
) -> list[dict[str, Any]]:
    """F21: CmaFree above CmaTotal (the stack is broken for RDMA), or a known-bad kernel."""
    cma = parse_cma(meminfo)
    if cma and cma[1] > cma[0]:
        total, free = cma
        effect = (
            "RDMA memory registration (ibv_reg_mr, NCCL over RoCE) fails with ENOMEM"
            if rdma
            else "RDMA memory registration would fail (no RDMA device is in use on this node)"
        )
        return [
            finding(
                "F21",
                "error" if rdma else "warning",
                f"/proc/meminfo reports CmaFree {free} kB above CmaTotal {total} kB on kernel"
                f" {release}: memory handed out as CMA pageblocks (Kexec HandOver scratch) cannot"
                f" be pinned long-term, so {effect}",
                f"{KERNEL_FIX} ({_doc('F21')})",
                host=host,
                check="cma",
                evidence=f"CmaTotal: {total} kB; CmaFree: {free} kB; uname -r: {release}",
            )
        ]
    sources = known_bad_kernel(release, machine)
    if sources and rdma and not kho_off(cmdline):
        return [
            finding(
                "F21",
                "warning",
                f"kernel {release} is reported to break RDMA memory registration (ibv_reg_mr"
                f" ENOMEM at NCCL init) unless booted with kho=off ({sources}); its CMA figures"
                " look sane now, but the failure comes with memory pressure",
                f"{KERNEL_FIX} ({_doc('F21')})",
                host=host,
                check="kernel",
                evidence=f"uname -r: {release}; no kho=off in /proc/cmdline",
            )
        ]
    return []


# --- F23: versions equal on every node -------------------------------------------------------

VERSION_KEYS = (
    ("driver_version", "NVIDIA driver"),
    ("cuda_version", "CUDA version of the driver"),
    ("nccl_version", "NCCL the engine loads"),
)


def judge_versions(stacks: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """F23: one warning per node whose driver, CUDA or NCCL version differs from the others.

    The reference is the most common value (on a tie, the first node's: the head).
    """
    out = []
    for key, label in VERSION_KEYS:
        values = {host: str(s[key]) for host, s in stacks.items() if s.get(key)}
        if len(set(values.values())) < 2:
            continue
        counts = Counter(values.values())
        best = max(counts.values())
        reference = next(v for v in values.values() if counts[v] == best)
        listing = ", ".join(f"{host} {value}" for host, value in values.items())
        for host, value in values.items():
            if value == reference:
                continue
            out.append(
                finding(
                    "F23",
                    "warning",
                    f"{label} {value} differs from the other nodes' {reference} ({listing})",
                    f"install the same {label} on every node (the ranks of one engine run one"
                    f" stack), then re-run --tags preflight ({_doc('F23')})",
                    host=host,
                    check=key,
                    evidence=listing,
                )
            )
    return out


# --- F24: clock and time sync ----------------------------------------------------------------

_OFFSET = re.compile(r"^(?P<value>\d+(?:\.\d+)?) seconds (?P<side>fast|slow) of NTP time$")


def parse_key_values(text: str, separator: str = "=") -> dict[str, str]:
    """``timedatectl show`` / ``systemctl show`` (``=``) or ``chronyc tracking`` (``:``)."""
    out = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(separator)
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def chrony_offset(tracking: Mapping[str, str]) -> float | None:
    """Seconds the system clock is ahead of NTP time (negative: behind)."""
    match = _OFFSET.match(tracking.get("System time", ""))
    if not match:
        return None
    value = validate.number("chronyc tracking System time", match.group("value"))
    return value if match.group("side") == "fast" else -value


def judge_clock(
    timedatectl: str | None, chronyc: str | None, max_offset: float, host: str = ""
) -> list[dict[str, Any]]:
    """F24: chrony or systemd says the clock is not synchronised, or is off by more than allowed."""
    fix = (
        "enable time sync on every node (timedatectl set-ntp true with systemd-timesyncd, or"
        f" chrony with a reachable server) ({_doc('F24')})"
    )
    why = "the ranks' logs no longer line up and TLS (hub downloads) can fail"
    tracking = parse_key_values(chronyc or "", ":")
    if "Leap status" in tracking:
        evidence = f"chronyc tracking: Leap status: {tracking['Leap status']}"
        if tracking["Leap status"].lower().startswith("not synchroni"):
            return [
                finding(
                    "F24",
                    "warning",
                    f"chrony is not synchronised (Reference ID {tracking.get('Reference ID', '?')}):"
                    f" {why}",
                    fix,
                    host=host,
                    check="clock",
                    evidence=evidence,
                )
            ]
        offset = chrony_offset(tracking)
        if offset is not None and abs(offset) > max_offset:
            side = "ahead of" if offset > 0 else "behind"
            return [
                finding(
                    "F24",
                    "warning",
                    f"the clock is {abs(offset):g} s {side} NTP time, more than"
                    f" preflight_max_clock_offset_seconds={max_offset:g}: {why}",
                    fix,
                    host=host,
                    check="clock",
                    evidence=f"chronyc tracking: System time: {tracking['System time']}",
                )
            ]
        return []
    show = parse_key_values(timedatectl or "")
    if show.get("NTPSynchronized") == "no":
        return [
            finding(
                "F24",
                "warning",
                f"the system clock is not synchronised (timedatectl: NTP={show.get('NTP', '?')}):"
                f" {why}",
                fix,
                host=host,
                check="clock",
                evidence=f"timedatectl show: NTPSynchronized=no, NTP={show.get('NTP', '?')}",
            )
        ]
    return []


# --- F25: disk space for the weights ---------------------------------------------------------


def judge_disk(
    disk: Mapping[str, Any], total_bytes: int | None, reserve_bytes: int, host: str = ""
) -> list[dict[str, Any]]:
    """F25: the weights still to copy do not fit (error) or leave less than the reserve (warning)."""
    if not total_bytes or disk.get("free_bytes") is None:
        return []
    free = int(disk["free_bytes"])
    missing = max(int(total_bytes) - int(disk.get("present_bytes") or 0), 0)
    where = disk.get("measured_at") or disk.get("path")
    evidence = (
        f"{where}: {free} bytes free; weights {int(total_bytes)} bytes, {missing} not yet here"
    )
    fix = (
        "free space there or point the weights at a larger filesystem (model_weights_hub_cache"
        f" and preflight_weights_dir), then re-run --tags preflight ({_doc('F25')})"
    )
    if missing > free:
        return [
            finding(
                "F25",
                "error",
                f"the weights need {_gib(missing)} more on {where} but only {_gib(free)} is free:"
                " the copy cannot finish",
                fix,
                host=host,
                check="disk",
                evidence=evidence,
            )
        ]
    if missing and free - missing < reserve_bytes:
        return [
            finding(
                "F25",
                "warning",
                f"after the weights ({_gib(missing)} still to copy) {_gib(free - missing)} would"
                f" remain free on {where}, below preflight_weights_reserve_gib="
                f"{reserve_bytes / GIB:g}",
                fix,
                host=host,
                check="disk",
                evidence=evidence,
            )
        ]
    return []


# --- F26: memlock for RDMA -------------------------------------------------------------------


def limit_bytes(value: str | None) -> int | None:
    """``infinity``/``unlimited``/``-1`` -> None; a byte count -> int; anything else -> -1."""
    text = (value or "").strip().lower()
    if text in ("infinity", "unlimited", "-1"):
        return None
    try:
        return validate.counter("memlock limit", text, max_digits=20)
    except validate.ValidationError:
        return -1


def recipe_memlock(recipe: Mapping[str, Any]) -> tuple[str, int | None] | None:
    """(``the ulimits entry``, soft bytes or None when unlimited) the recipe gives the engine;
    None when its ``ulimits`` has no memlock entry (the engine inherits the manager's default)."""
    ulimits = recipe.get("ulimits", DEPLOY_DEFAULTS["ulimits"])
    for item in ulimits if isinstance(ulimits, list) else []:
        name, _, value = str(item).partition("=")
        if name.strip().lower() == "memlock":
            return str(item), limit_bytes(value.split(":")[0])
    return None


def _ipc_lock(recipe: Mapping[str, Any]) -> bool:
    if recipe.get("privileged") is True:
        return True
    args = " ".join(str(a) for a in recipe.get("podman_args") or []).upper()
    return "IPC_LOCK" in args


def judge_memlock(
    rdma: bool,
    recipe: Mapping[str, Any] | None,
    manager_text: str | None,
    unit_text: str | None = None,
    host: str = "",
) -> list[dict[str, Any]]:
    """F26: the engine's memlock limit below unlimited on an RDMA node (warning).

    The recipe decides (``ulimits``, rendered as ``Ulimit=`` or ``LimitMEMLOCK=``); without a
    memlock entry the engine inherits systemd's ``DefaultLimitMEMLOCK``. A systemd-mode engine
    runs as root with CAP_IPC_LOCK, which the kernel lets pin past the limit; so does a
    container granted IPC_LOCK.
    """
    if not rdma or not recipe:
        return []
    if recipe.get("deploy_mode", DEPLOY_DEFAULTS["deploy_mode"]) == "systemd" or _ipc_lock(recipe):
        return []
    entry = recipe_memlock(recipe)
    manager = parse_key_values(manager_text or "")
    unit = parse_key_values(unit_text or "")
    live = unit.get("LimitMEMLOCKSoft") or unit.get("LimitMEMLOCK")
    evidence = f"vllm_recipe.ulimits: {entry[0] if entry else 'no memlock entry'}"
    if live:
        evidence += f"; running unit LimitMEMLOCKSoft={live}"
    if entry is None:
        inherited = manager.get("DefaultLimitMEMLOCKSoft") or manager.get("DefaultLimitMEMLOCK")
        limit = limit_bytes(inherited) if inherited else -1
        if limit is None:
            return []
        evidence += f"; systemd DefaultLimitMEMLOCKSoft={inherited or 'unknown'}"
        shown = f"{limit / MIB:g} MiB" if limit and limit > 0 else "an unknown limit"
        message = (
            f"vllm_recipe.ulimits has no memlock entry, so the engine's container inherits"
            f" systemd's default ({shown})"
        )
    else:
        if entry[1] is None:
            return []
        message = f"vllm_recipe.ulimits limits locked memory to {entry[1]} bytes ({entry[0]})"
    return [
        finding(
            "F26",
            "warning",
            message + ": NCCL over RoCE registers (pins) its buffers with ibv_reg_mr, which fails"
            " with ENOMEM past the memlock limit",
            f"add memlock=-1:-1 to vllm_recipe.ulimits (Ulimit=memlock=-1:-1) ({_doc('F26')})",
            host=host,
            check="memlock",
            evidence=evidence,
        )
    ]


# --- one node, and the cluster ---------------------------------------------------------------

STACK_OPTIONS = (
    "preflight_rdma",
    "preflight_max_clock_offset_seconds",
    "preflight_weights_reserve_gib",
    "preflight_weights_bytes",
    "preflight_recipe",
)


class HostStackInputError(validate.InputError):
    """Facts or options that cannot be judged (the message names the variable)."""


def rdma_in_use(setting: Any, devices: Sequence[str]) -> bool:
    """``preflight_rdma``: ``required``, ``unused``, or ``auto`` (an RDMA device exists)."""
    if setting in ("required", "unused"):
        return setting == "required"
    if setting != "auto":
        raise HostStackInputError(
            f"preflight_rdma must be auto, required or unused, got {setting!r}"
        )
    return bool(devices)


def judge_node(
    stack: Mapping[str, Any] | None,
    gpu: Mapping[str, Any] | None,
    options: Mapping[str, Any],
    host: str = "",
) -> dict[str, Any]:
    """``{summary, findings}`` of one node from ``ansible_facts.host_stack`` (F21, F22, F24, F26).

    F23 and F25 compare nodes (versions; the weights' size known on the head) and are judged
    by :func:`judge_cluster_stack`.
    """
    if not isinstance(stack, Mapping):
        raise HostStackInputError(
            "ansible_facts.host_stack is missing: run localinference.vllm.host_stack_facts first"
        )
    missing = [name for name in STACK_OPTIONS if name not in options]
    if missing:
        raise HostStackInputError(f"host-stack options lack {', '.join(missing)}")
    gpu = gpu or {}
    rdma = rdma_in_use(options["preflight_rdma"], stack.get("rdma_devices") or [])
    recipe = options["preflight_recipe"] or {}
    if not isinstance(recipe, Mapping):
        raise HostStackInputError(f"preflight_recipe must be a mapping, got {recipe!r}")
    engine_text = (stack.get("engine") or {}).get("probe")
    nccl = nccl_summary(engine_text) if engine_text else None
    cma = parse_cma(stack.get("meminfo_cma") or "")
    findings = judge_kernel(
        stack.get("kernel_release") or "",
        stack.get("machine") or "",
        stack.get("cmdline") or "",
        stack.get("meminfo_cma") or "",
        rdma,
        host,
    )
    findings += judge_nccl(engine_text, bool(gpu.get("unified_memory")), host)
    clock = stack.get("clock") or {}
    findings += judge_clock(
        clock.get("timedatectl"),
        clock.get("chronyc"),
        validate.number(
            "preflight_max_clock_offset_seconds",
            options.get("preflight_max_clock_offset_seconds"),
            error=HostStackInputError,
        ),
        host,
    )
    memlock = stack.get("memlock") or {}
    findings += judge_memlock(rdma, recipe, memlock.get("manager"), memlock.get("unit"), host)
    summary = {
        "kernel": stack.get("kernel_release"),
        "machine": stack.get("machine"),
        "kho_off": kho_off(stack.get("cmdline") or ""),
        "cma_total_kib": cma[0] if cma else None,
        "cma_free_kib": cma[1] if cma else None,
        "rdma": rdma,
        "driver_version": gpu.get("driver_version"),
        "cuda_version": gpu.get("cuda_version"),
        "nccl": nccl,
        "nccl_version": (nccl or {}).get("loads", {}).get("version"),
        "engine": {k: v for k, v in (stack.get("engine") or {}).items() if k != "probe"},
        "disk": stack.get("disk") or {},
        "weights_reserve_bytes": int(
            validate.number(
                "preflight_weights_reserve_gib",
                options.get("preflight_weights_reserve_gib"),
                error=HostStackInputError,
            )
            * GIB
        ),
        "weights_bytes": int(
            validate.number(
                "preflight_weights_bytes",
                options.get("preflight_weights_bytes"),
                error=HostStackInputError,
            )
        ),
    }
    return {"summary": summary, "findings": findings}


def judge_cluster_stack(stacks: Mapping[str, Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Findings per node that need the other nodes: F23 (versions) and F25 (disk).

    ``stacks`` maps each node that answered to its ``judge_node`` summary. The weights' size is
    ``preflight_weights_bytes`` when set, else the largest manifest any node holds (the head's).
    """
    out: dict[str, list[dict[str, Any]]] = {host: [] for host in stacks}
    for f in judge_versions(stacks):
        out[f["host"]].append(f)
    totals = [int(s["weights_bytes"]) for s in stacks.values() if s.get("weights_bytes")]
    totals = totals or [
        int(s["disk"]["manifest_bytes"])
        for s in stacks.values()
        if (s.get("disk") or {}).get("manifest_bytes")
    ]
    total = max(totals) if totals else None
    for host, s in stacks.items():
        out[host] += judge_disk(
            s.get("disk") or {}, total, int(s.get("weights_reserve_bytes") or 0), host
        )
    return out
