# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's judgement of one look at the cluster: signs, verdict, action.

Pure: a look (what the probes read, see ``_program.look``) and the state carried from the
previous look go in; findings, the verdict, the action and the next state come out. Case
table: ``tests/unit/plugins/module_utils/watchdog/test_judge.yaml``.

Verdicts (roles/watchdog/README.md):

- ``down``: a serving unit failed, exited or was restarted by systemd alone (a TP cluster
  with one rank restarted cannot rejoin), or the engine has not answered ``/health`` on two
  looks although its units are active past the boot grace; the ingress unit failed (the
  engine streams directly): ``down`` with target ``ingress``;
- ``wedged``: on two consecutive looks, no streamed token while ``/health`` answers and the
  engine's token counters (prompt and generated) stand still (F28), or requests running while
  they stand still; a probe that misses its deadline while the counters move is a saturated
  engine: degraded, no action;
- ``degraded``: warn, no action: fabric drift (MTU, GID index, link), kernel events (Xid,
  AER, OOM kill), memory pressure, a first wedge sign, a booting engine, a cluster link
  that is down or runs below its MTU (a restart cannot help while the ranks cannot meet);
- a kernel event a restart cannot fix (``_kernel``: an Xid whose catalog action is more than
  restarting the application, an uncorrected fatal PCIe error): the action is ``page``, never a
  restart, from that look until the endpoint streams a token again;
- a silent engine whose log shows a kernel compile in progress (``_vllm_compile``), silent for
  less than vLLM's execute-model timeout: ``degraded``, hold (a restart throws the compile away);
- ``unknown``: the token probe could not run (no key, no config) or a node did not answer:
  evidence that could not be read never restarts anything;
- ``healthy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import finding
from ansible_collections.localinference.vllm.plugins.module_utils.engine._vllm_compile import (
    EXECUTE_MODEL_TIMEOUT_S,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog._kernel import (
    XID_CATALOG,
)

WEDGE_LOOKS = 2
F28_FIX = (
    "the watchdog restarts the cluster in the rollout's order (watchdog_recover); by hand: "
    "ansible-playbook site.yml --tags rollout (its probe sees no token and restarts every rank); "
    "read the kernel log for NCCL or Xid errors"
)


def _unit_problem(show: Mapping[str, Any], grace_s: float) -> tuple[str | None, bool]:
    """(why the unit is down, whether it is still starting) from its ``systemctl show``."""
    active = show.get("ActiveState")
    if show.get("LoadState") not in (None, "loaded"):
        return f"not loaded ({show.get('LoadState')})", False
    if active == "failed":
        return f"failed ({show.get('Result') or 'unknown result'})", False
    if show.get("SubState") == "auto-restart":
        return "exited; systemd is restarting it alone", False
    if active in ("inactive", "deactivating"):
        return f"{active} (stopped or exited)", False
    if active in ("activating", "reloading"):
        return None, True
    age = show.get("active_for_s")
    return None, isinstance(age, (int, float)) and age < grace_s


def _restarted(show: Mapping[str, Any], before: Mapping[str, Any] | None) -> bool:
    now, then = show.get("NRestarts"), (before or {}).get("NRestarts")
    return isinstance(now, int) and isinstance(then, int) and now > then


KERNEL_FIXES = {
    "xid": "look the Xid up in NVIDIA's Xid catalog (" + XID_CATALOG + "); a recurring one needs a node reboot",
    "aer": "a PCIe error: reseat or replace the card or cable",
    "oom": "memory ran out: lower gpu_memory_utilization or the KV size (F4)",
    "gpu_memory": ("the GPU driver could not allocate unified memory, which precedes GB10 freezes: free "
                   "memory on the node, lower gpu_memory_utilization or the KV size (F4)"),
}
NO_RESTART_FIX = ("a restart of the engine cannot fix this: the watchdog pages and does not restart; drain "
                  "the node and reset or reboot it (a GB10 has no GPU reset: reboot), then check the card, "
                  "its slot and cable")


def kernel_summary(event: Mapping[str, Any]) -> str:
    """One kernel event in words: the Xid with its meaning, the killed process, the count."""
    kind = event["kind"]
    if kind == "xid":
        return (f"Xid {event.get('xid')} ({event.get('meaning') or 'not in the catalog'}; "
                f"NVIDIA's immediate action {event.get('catalog_action') or 'unknown'})")
    if kind == "oom":
        who = f"{event.get('process')} (pid {event.get('pid')})" if event.get("pid") else "a process"
        by = f", invoked by {event['invoked_by']}" if event.get("invoked_by") else ""
        return f"OOM kill of {who}{by}"
    if kind == "gpu_memory":
        return f"NV_ERR_NO_MEMORY x{event.get('count', 1)}"
    return "PCIe error" + (" (uncorrected, the device not recovered)" if event.get("page") else "")


def kernel_finding(name: str, event: Mapping[str, Any]) -> dict[str, Any]:
    """A kernel event as a finding: an error when a restart cannot fix it."""
    kind = event["kind"]
    ids = {"xid": "watchdog-xid", "aer": "watchdog-aer", "oom": "F4", "gpu_memory": "F4"}
    return finding(ids.get(kind, "watchdog-kernel"), "error" if event.get("page") else "warning",
                   f"{name}: kernel: {kernel_summary(event)}: {event['line'][:200]}",
                   NO_RESTART_FIX if event.get("page") else KERNEL_FIXES.get(kind, "read the kernel log"),
                   host=name, kind=kind)


def node_signs(name: str, node: Mapping[str, Any], expect: Mapping[str, Any],
               previous: Mapping[str, Any] | None, grace_s: float) -> dict[str, Any]:
    """One node's evidence judged: ``{down, starting, link_down, findings}``."""
    out: dict[str, Any] = {"down": [], "starting": False, "link_down": False, "mtu_low": False,
                           "findings": [], "no_restart": []}
    if not node.get("reachable"):
        out["findings"].append(finding(
            "watchdog-evidence", "warning",
            f"{name}: no evidence this look ({str(node.get('error'))[:200]})",
            "check the node and the cluster link; the watchdog does not act on evidence it cannot read",
            host=name))
        out["unreachable"] = True
        return out
    for unit, show in (node.get("units") or {}).items():
        problem, starting = _unit_problem(show, grace_s)
        if problem is None and _restarted(show, ((previous or {}).get("units") or {}).get(unit)):
            problem = "restarted by systemd alone (a rank cannot rejoin its tensor-parallel group)"
        if problem:
            out["down"].append(f"{name}: {unit} {problem}")
        out["starting"] |= starting
    for link in node.get("links") or []:
        want = expect.get("mtu")
        ifname = link.get("ifname")
        if not link.get("up"):
            out["link_down"] = True
            out["findings"].append(finding(
                "F19", "warning", f"{name}: cluster interface {ifname} is down ({link.get('state')})",
                "bring the link back (cable, switch port, nmcli connection up); the engine cannot "
                "serve across nodes without it", host=name, kind="link"))
        elif want and link.get("mtu") != want:
            # Below fabric.json's MTU the larger frames of the ranks' exchange are dropped
            # without a word: the engine stalls, and no restart can help until it is fixed.
            out["mtu_low"] |= isinstance(link.get("mtu"), int) and link["mtu"] < want
            out["findings"].append(finding(
                "F19", "warning",
                f"{name}: {ifname} runs MTU {link.get('mtu')}, fabric.json says {want}",
                "something changed the MTU behind the collection's back: "
                "ansible-playbook site.yml --tags fabric", host=name, kind="mtu"))
    gid, want_gid = node.get("gid_index"), expect.get("gid_index")
    if want_gid is not None and gid != want_gid:
        out["findings"].append(finding(
            "F20", "warning",
            f"{name}: the RoCE v2 GID index is {gid}, fabric.json says {want_gid}",
            "the serving units take the table's index at each start (gid-start logs the move in "
            "their journal); an engine started before the move keeps the old one: re-run the "
            "fabric stage (--tags fabric) and restart the engine in a quiet moment",
            host=name, kind="gid"))
    for event in node.get("kernel") or []:
        out["findings"].append(kernel_finding(name, event))
        if event.get("page"):
            out["no_restart"].append(f"{name}: {kernel_summary(event)}")
    psi, limit = node.get("psi_some_avg10"), expect.get("psi_limit")
    if isinstance(psi, (int, float)) and isinstance(limit, (int, float)) and psi > limit:
        out["findings"].append(finding(
            "F4", "warning", f"{name}: memory pressure {psi:g}% (PSI some avg10, limit {limit:g}%)",
            "another tenant or the page cache is squeezing the engine (F4)", host=name, kind="psi"))
    avail, need = node.get("mem_available_bytes"), expect.get("min_available_bytes")
    if isinstance(avail, int) and isinstance(need, int) and avail < need:
        out["findings"].append(finding(
            "F4", "warning",
            f"{name}: {avail / 2**30:.1f} GiB available, below the {need / 2**30:.1f} GiB the admission keeps",
            "a restart would be refused by the admission: free memory on the node first",
            host=name, kind="memory"))
    return out


def _progress(metrics: Mapping[str, Any], previous: Mapping[str, Any] | None) -> float | None:
    """Tokens the engine processed (prompt and generated) since the last look; None when unknown."""
    if not previous or "error" in metrics or "error" in previous:
        return None
    moved = [metrics[key] - previous[key] for key in ("generation_tokens", "prompt_tokens")
             if isinstance(metrics.get(key), (int, float)) and isinstance(previous.get(key), (int, float))]
    return sum(max(0, m) for m in moved) if moved else None


def _kv_delta(metrics: Mapping[str, Any], previous: Mapping[str, Any] | None) -> float:
    """How far the KV cache usage moved since the last look (percentage points; 0 when unknown).

    vLLM counts a prompt's tokens only when its prefill ends; while a long prompt is prefilled
    chunk by chunk the cache fills step by step, and a stopped rank moves nothing.
    """
    now, before = metrics.get("kv_usage"), (previous or {}).get("kv_usage")
    if "error" in metrics or not all(isinstance(v, (int, float)) for v in (now, before)):
        return 0.0
    return abs(now - before)


def _stalled(metrics: Mapping[str, Any], previous: Mapping[str, Any] | None) -> str | None:
    """Requests running, no token processed (prompt or generated) and the KV cache unmoved
    since the last look."""
    running = metrics.get("running")
    if (not isinstance(running, (int, float)) or running <= 0 or _progress(metrics, previous) != 0
            or _kv_delta(metrics, previous)):
        return None
    return f"{running:g} request(s) running and no token processed since the last look"


def busy(look: Mapping[str, Any], previous: Mapping[str, Any] | None) -> float:
    """Tokens the engine processed since the last look, over every node that serves metrics.

    A long prefill or a full batch can keep the probe's first token past its deadline; an
    engine whose counters move is saturated, not wedged (a stopped rank moves nothing).
    """
    return sum(_progress(metrics, ((previous or {}).get("metrics") or {}).get(name)) or 0
               for name, metrics in (look.get("metrics") or {}).items())


def filling(look: Mapping[str, Any], previous: Mapping[str, Any] | None) -> float:
    """How far the KV cache usage moved since the last look, over every node (a long prefill)."""
    return sum(_kv_delta(metrics, ((previous or {}).get("metrics") or {}).get(name))
               for name, metrics in (look.get("metrics") or {}).items())


def wedge_sign(look: Mapping[str, Any], previous: Mapping[str, Any] | None, moved: float) -> str | None:
    """Why this look shows a wedged engine (F28), or None; ``moved`` is :func:`busy` of the look."""
    token, engine = look.get("token") or {}, look.get("engine") or {}
    if (token.get("ok") is False and engine.get("health") == 200 and engine.get("token_ok") is not True
            and not moved):
        return (f"no token within {token.get('deadline_s')} s ({str(token.get('error'))[:160]}) "
                "while /health answers 200")
    for name, metrics in (look.get("metrics") or {}).items():
        stall = _stalled(metrics, ((previous or {}).get("metrics") or {}).get(name))
        if stall:
            return f"{name}: {stall}"
    return None


def _budget(state: Mapping[str, Any], now: float, cfg: Mapping[str, Any]) -> list[float]:
    return [t for t in state.get("restarts", []) if now - t < cfg["restart_window_s"]]


def judge(look: Mapping[str, Any], state: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Judge one look: ``{verdict, target, evidence, findings, action, state}``.

    ``state``: ``{bad_looks, first_bad_at, previous, restarts}`` from the last call (``{}``
    at first). ``cfg``: ``recover``, ``max_restarts``, ``restart_window_s``,
    ``boot_grace_s`` and ``expect`` per node (``mtu``, ``gid_index``, ``psi_limit``,
    ``min_available_bytes``).
    """
    now = look["time"]
    previous = state.get("previous") or {}
    signs = _cluster_signs(look, previous, cfg)
    findings = signs["findings"]
    token = look.get("token") or {}
    signs["compile_hold"] = compile_hold(
        look, state, cfg.get("execute_model_timeout_s", EXECUTE_MODEL_TIMEOUT_S), now)
    next_state = {"previous": look, "restarts": _budget(state, now, cfg),
                  "bad_looks": 0, "first_bad_at": None, "ingress_bad_looks": 0,
                  "no_restart": hardware_fault(signs, state, token, now)}
    verdict, target, evidence = _verdict(look, state, previous, signs, next_state)
    if token.get("ok") is True:
        next_state["last_good_at"] = now
    else:
        next_state["last_good_at"] = state.get("last_good_at")
    if verdict == "healthy" and findings:
        verdict = "degraded"
        evidence = findings[0]["message"]
    action = _action(verdict, target, token, signs, next_state, cfg)
    return {"verdict": verdict, "target": target, "evidence": evidence, "findings": findings,
            "action": action, "state": next_state,
            "detect_seconds": _detect(state, next_state, now) if verdict in ("wedged", "down") else None}


def _cluster_signs(
    look: Mapping[str, Any], previous: Mapping[str, Any], cfg: Mapping[str, Any]
) -> dict[str, Any]:
    """Every node's signs together: findings, units down, starting, link down or short, unreachable."""
    findings: list[dict[str, Any]] = []
    down, starting, link_down, mtu_low, unreachable, no_restart = [], False, False, False, [], []
    for name, node in (look.get("nodes") or {}).items():
        signs = node_signs(name, node, cfg["expect"].get(name, {}),
                           (previous.get("nodes") or {}).get(name), cfg["boot_grace_s"])
        findings += signs["findings"]
        no_restart += signs["no_restart"]
        down += signs["down"]
        starting |= signs["starting"]
        link_down |= signs["link_down"]
        mtu_low |= signs["mtu_low"]
        if signs.get("unreachable"):
            unreachable.append(name)
    return {"findings": findings, "down": down, "starting": starting, "link_down": link_down,
            "mtu_low": mtu_low, "unreachable": unreachable, "no_restart": no_restart}


def hardware_fault(signs: Mapping[str, Any], state: Mapping[str, Any], token: Mapping[str, Any],
                   now: float) -> dict[str, Any] | None:
    """What the kernel reported that a restart cannot fix, carried from look to look until the
    endpoint streams a token again: the engine dies after it, and must not then be restarted."""
    if signs["no_restart"]:
        return {"since": now, "why": "; ".join(signs["no_restart"])[:400]}
    carried = state.get("no_restart")
    return carried if carried and token.get("ok") is not True else None


def compile_hold(look: Mapping[str, Any], state: Mapping[str, Any], budget_s: float,
                 now: float) -> str | None:
    """Why a silent engine is compiling, not wedged, or None.

    A node's engine log shows a kernel compile started and not ended, and the engine has been
    silent (since the last streamed token, or the first bad look) for less than vLLM's
    execute-model timeout: vLLM itself waits that long for the step. Beyond it, a wedge again.
    """
    compiling = [(name, node["engine_log"]) for name, node in (look.get("nodes") or {}).items()
                 if (node.get("engine_log") or {}).get("compiling")]
    silent = now - (state.get("last_good_at") or state.get("first_bad_at") or now)
    if not compiling or silent >= budget_s:
        return None
    name, log = compiling[0]
    return (f"{name}: the engine is compiling ({log.get('what')}), silent {silent:.0f} s of the "
            f"{budget_s:g} s execute-model timeout: holding (a restart would throw the compile away)")


def _verdict(
    look: Mapping[str, Any],
    state: Mapping[str, Any],
    previous: Mapping[str, Any],
    signs: dict[str, Any],
    next_state: dict[str, Any],
) -> tuple[str, str | None, str]:
    """``(verdict, target, evidence)``, the first sign that explains the look; counts bad looks
    in ``next_state`` and adds the wedge's finding to ``signs["findings"]``."""
    now = look["time"]
    token, engine = look.get("token") or {}, look.get("engine") or {}
    down, unreachable = signs["down"], signs["unreachable"]
    moved, filled = busy(look, previous), filling(look, previous)
    wedge = wedge_sign(look, previous, moved or filled)
    no_answer = token.get("ok") is False and engine.get("health") != 200
    verdict, target, evidence = "healthy", None, "the endpoint streams a token"
    if token.get("ok") is None:
        verdict, evidence = "unknown", f"the token probe did not run: {str(token.get('error'))[:200]}"
    if down:
        verdict, target, evidence = "down", "engine", "; ".join(down)[:500]
        next_state.update(first_bad_at=state.get("first_bad_at") or now)
    elif unreachable and token.get("ok") is not True:
        verdict = "degraded"
        evidence = (f"{', '.join(unreachable)} unreachable over the cluster link and no token: "
                    "waiting for the link (a restart cannot help while the ranks cannot meet)")
    elif signs["link_down"] and token.get("ok") is not True:
        verdict, evidence = "degraded", "the cluster link is down: waiting for it, no restart"
    elif signs["mtu_low"] and token.get("ok") is not True:
        verdict, evidence = "degraded", ("the cluster link runs below fabric.json's MTU, so the ranks' "
                                         "larger frames are dropped: waiting for it, no restart")
    elif signs["starting"] and token.get("ok") is not True and engine.get("health") != 200:
        verdict, evidence = "degraded", "the engine is starting (within the boot grace): no verdict yet"
    elif token.get("ok") is False and engine.get("health") == 200 and (moved or filled):
        verdict = "degraded"
        work = (f"processed {moved:g} tokens" if moved else
                f"filled its KV cache by {filled:.2g} points (a long prefill)")
        evidence = (f"no token within {token.get('deadline_s')} s, but the engine {work} "
                    "since the last look: saturated, not wedged")
    elif (wedge or no_answer) and signs["compile_hold"]:
        next_state.update(bad_looks=int(state.get("bad_looks", 0)) + 1, first_bad_at=state.get("first_bad_at") or now)
        verdict, evidence = "degraded", signs["compile_hold"]
    elif wedge or no_answer:
        return _engine_silent(wedge, engine, state, signs["findings"], next_state, now)
    elif token.get("ok") is False and engine.get("token_ok") is True:
        return _ingress_silent(look, state, next_state)
    elif (look.get("ingress_unit") or {}).get("ActiveState") in ("failed", "inactive"):
        verdict, target = "down", "ingress"
        evidence = f"the ingress unit is {look['ingress_unit'].get('ActiveState')}"
    return verdict, target, evidence


def _engine_silent(
    wedge: str | None,
    engine: Mapping[str, Any],
    state: Mapping[str, Any],
    findings: list[dict[str, Any]],
    next_state: dict[str, Any],
    now: float,
) -> tuple[str, str | None, str]:
    """A wedge or an engine that does not answer: a verdict only on the WEDGE_LOOKS-th look."""
    bad = int(state.get("bad_looks", 0)) + 1
    first = state.get("first_bad_at") or now
    next_state.update(bad_looks=bad, first_bad_at=first)
    sign = wedge or (f"the engine has not answered /health ({engine.get('health')}) "
                     "although its units are active")
    evidence = f"{sign} ({bad} look{'s' if bad > 1 else ''})"
    if bad < WEDGE_LOOKS:
        return "degraded", None, evidence
    findings.append(finding("F28", "error", f"the engine answers /health but streams no token: {sign}",
                            F28_FIX) if wedge else finding(
        "watchdog-no-answer", "error", sign, "the watchdog restarts it in the rollout's order"))
    return ("wedged" if wedge else "down"), "engine", evidence


def _ingress_silent(
    look: Mapping[str, Any], state: Mapping[str, Any], next_state: dict[str, Any]
) -> tuple[str, str | None, str]:
    """The engine streams directly but not through the ingress."""
    # On two consecutive looks, as a wedge: at the edge of an engine's boot the ingress's
    # probe can meet the engine a moment before it answers and the direct one after.
    token, ingress = look.get("token") or {}, look.get("ingress_unit") or {}
    bad = int(state.get("ingress_bad_looks", 0)) + 1
    next_state["ingress_bad_looks"] = bad
    stopped = ingress.get("ActiveState") in ("failed", "inactive")
    verdict, target = ("down", "ingress") if stopped or bad >= WEDGE_LOOKS else ("degraded", None)
    evidence = (f"the engine streams directly but not through the ingress "
                f"({str(token.get('error'))[:160]}; {ingress.get('ActiveState', 'unit state unknown')}; "
                f"{bad} look{'s' if bad > 1 else ''})")
    return verdict, target, evidence


def _action(
    verdict: str,
    target: str | None,
    token: Mapping[str, Any],
    signs: dict[str, Any],
    next_state: Mapping[str, Any],
    cfg: Mapping[str, Any],
) -> str:
    """restart, restart-ingress, page (no recovery, the budget is spent, or the kernel reported
    what a restart cannot fix), hold or none."""
    fault = next_state.get("no_restart")
    if fault and (signs["no_restart"] or (verdict in ("wedged", "down") and target == "engine")):
        signs["findings"].append(finding(
            "watchdog-no-restart", "error", f"a restart cannot fix what the kernel reported: {fault['why']}",
            NO_RESTART_FIX))
        return "page"
    if verdict in ("wedged", "down"):
        if not cfg["recover"]:
            return "page"
        if len(next_state["restarts"]) >= cfg["max_restarts"]:
            signs["findings"].append(finding(
                "watchdog-budget", "error",
                f"restart budget spent: {len(next_state['restarts'])} restart(s) within "
                f"{cfg['restart_window_s']:g} s; the watchdog only pages now",
                "a restart loop hides the cause: read the incidents and the engine's log"))
            return "page"
        return "restart-ingress" if target == "ingress" else "restart"
    if verdict == "degraded" and token.get("ok") is not True and (
        signs["link_down"] or signs["mtu_low"] or signs["unreachable"] or signs["starting"]
        or signs["compile_hold"]
    ):
        return "hold"
    return "none"


def _detect(state: Mapping[str, Any], next_state: Mapping[str, Any], now: float) -> float:
    """Seconds from the last look that streamed a token (the fault is younger) to the verdict."""
    since = state.get("last_good_at") or next_state.get("first_bad_at") or now
    return max(0.0, now - since)
