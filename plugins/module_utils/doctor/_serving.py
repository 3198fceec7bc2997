# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether the endpoint serves now: a live streamed token (F28) and the watchdog's incidents.

``/health`` and ``/v1/models`` keep answering 200 while a tensor-parallel rank hangs in a
collective (vLLM issue 42354; ``kill -STOP`` of the worker's rank shows the same picture), so
the doctor streams one token itself, on the head (``doctor_facts token_probes``, with
``_token_probe``, the watchdog's own probe): through the ingress with the key, and when that
fails directly at the engine. :func:`probe_targets` says where, from the head's saved ingress
result and ``serving.json``; :func:`check_f28` judges what came back; :func:`check_incidents`
reads the last incidents of the watchdog (``_incidents.read_recent`` on the head) and
:func:`incident_table` prints them.

The evidence (``doctor_node.live`` of the head, what the second ``doctor_facts`` call returned)::

    {"token": {"deadline_s": 20.0, "key_path": "...", "key_error": null,
               "probes": [{"name": "ingress", "url": ".../v1/chat/completions", "model": "...",
                           "health_url": ".../health", "health_status": 200, "health_error": null,
                           "ok": false, "ttft_s": null, "timeout": true, "error": "...",
                           "waited_s": 20.0}, ...]},
     "incidents": {"path": "...", "exists": true, "incidents": [...], "problems": [...]}}

No AnsibleModule and no HTTP here: unit-tested through tests/unit/plugins/module_utils/doctor/test_judge.py.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _validate as validate,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._findings import text_table
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._context import (
    Doctor,
)
from ansible_collections.localinference.vllm.plugins.module_utils.doctor._evidence import (
    check_node,
    clip,
)
from ansible_collections.localinference.vllm.plugins.module_utils.ingress._caddy import (
    caddy_base,
    caddy_ca,
)
from ansible_collections.localinference.vllm.plugins.module_utils.watchdog import _incidents

DEFAULT_DEADLINE_S = 20.0
KEY_PATH = "/etc/localinference/ingress/api-key.env"
INCIDENTS_PATH = "/var/lib/localinference/incidents.jsonl"
INCIDENT_COLUMNS = ["time", "verdict", "action", "outcome", "detect_s", "recover_s", "evidence"]
MAX_INCIDENT_EVIDENCE = 120
F28_FIX = (
    "the watchdog (role watchdog, watchdog_recover: true) restarts the engine in the rollout's "
    "order; without it restart the cluster: ansible-playbook site.yml --tags rollout. Then look "
    "for the cause in the kernel log of every node (journalctl -k | grep -Ei 'NCCL|Xid'; a "
    "pip-bundled NCCL is F22)"
)


# --- where the head probes -----------------------------------------------------------


def _engine_base(recipe: dict[str, Any]) -> str | None:
    port, host = recipe.get("port"), recipe.get("host")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return None
    host = host if isinstance(host, str) and host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def probe_targets(gathered: Any, key_path: Any = KEY_PATH, host: str = "head") -> dict[str, Any]:
    """Where the head streams its token, from what ``doctor_facts`` read there.

    ``{targets: [{name, base_url, health_url, model, auth}], key_path}``: every route of the
    saved ingress result (through Caddy, with the key), then the engine of ``serving.json``
    (``http://127.0.0.1:<port>``, no key). ``key_path`` is the key file the ingress result
    records, else the one given (``ingress_key_path``).
    """
    node, _ = check_node(host, {"gathered": gathered})
    targets: list[dict[str, Any]] = []
    ingress = node.saved.get("ingress") or {}
    base = caddy_base(ingress.get("listen"), ingress.get("tls"))
    ca_file = caddy_ca(ingress.get("tls"))
    for route in ingress.get("routes") or []:
        if not isinstance(route, dict) or base is None:
            continue
        prefix, model = route.get("prefix"), route.get("model")
        if isinstance(prefix, str) and prefix.startswith("/") and isinstance(model, str):
            targets.append(
                {
                    "name": "ingress",
                    "base_url": f"{base}{prefix}/v1",
                    "health_url": f"{base}{prefix}/health",
                    "model": model,
                    "auth": True,
                    "ca_file": ca_file,
                }
            )
    recipe = (node.serving or {}).get("recipe") or {}
    engine = _engine_base(recipe)
    model = recipe.get("served_model_name") or recipe.get("model")
    if engine and isinstance(model, str):
        targets.append(
            {
                "name": "engine",
                "base_url": f"{engine}/v1",
                "health_url": f"{engine}/health",
                "model": model,
                "auth": False,
            }
        )
    recorded = ingress.get("key_file")
    path = recorded if isinstance(recorded, str) and recorded.startswith("/") else key_path
    return {"targets": targets, "key_path": path if isinstance(path, str) else KEY_PATH}


# --- judged -----------------------------------------------------------------------------


def _probes(d: Doctor, token: dict[str, Any]) -> list[dict[str, Any]]:
    raw = token.get("probes")
    probes = [p for p in raw if isinstance(p, dict)] if isinstance(raw, list) else []
    if not isinstance(raw, list) or len(probes) != len(raw):
        d.add(
            "evidence",
            "warning",
            d.head,
            "the token probe returned something that is not a list of probes",
            clip(raw, 120),
            "run the doctor playbook of the collection",
        )
    return probes


def _shown(probe: dict[str, Any], deadline: float | None) -> str:
    """One probe as evidence: which, where, how long it waited, what /health said."""
    name = str(probe.get("name") or "probe")
    url = clip(probe.get("url") or "?", 120)
    waited = validate.finite(probe.get("waited_s"))
    health = probe.get("health_status")
    said = (
        f"/health {health}"
        if isinstance(health, int) and not isinstance(health, bool)
        else f"/health did not answer ({clip(probe.get('health_error') or 'no answer', 80)})"
    )
    if probe.get("ok") is True:
        ttft = validate.finite(probe.get("ttft_s"))
        return f"{name} {url}: first token in {ttft if ttft is not None else '?'} s; {said}"
    if probe.get("timeout"):
        limit = deadline if deadline is not None else waited
        what = f"no token within {limit:g} s" if limit is not None else "no token by the deadline"
    else:
        what = f"no token: {clip(probe.get('error') or 'no reason given', 120)}"
        if waited is not None:
            what += f" (after {waited:g} s)"
    return f"{name} {url}: {what}; {said}"


def token_summary(d: Doctor) -> str | None:
    """One line of what the token probe saw (printed under the verdict), or None."""
    token = d.live.get("token")
    if not isinstance(token, dict):
        return None
    deadline = validate.finite(token.get("deadline_s"))
    probes = [p for p in token.get("probes") or [] if isinstance(p, dict)]
    if not probes:
        return "TOKEN: not probed (" + clip(token.get("key_error") or "no target", 200) + ")"
    return "TOKEN: " + " | ".join(_shown(p, deadline) for p in probes)


def check_f28(d: Doctor) -> None:
    """F28: no token within the deadline while /health answers 200; other failures to stream."""
    if d.live.get("error"):
        d.add(
            "evidence",
            "warning",
            d.head,
            "no token was probed and no incident read on the head: " + clip(d.live["error"], 200),
            "doctor_facts token_probes",
            "fix the error named and run the doctor again",
        )
    token = d.live.get("token")
    if token is None:
        return
    if not isinstance(token, dict):
        d.add(
            "evidence",
            "warning",
            d.head,
            f"the token probe returned {type(token).__name__}, not a probe record",
            clip(token, 120),
            "run the doctor playbook of the collection",
        )
        return
    deadline = validate.finite(token.get("deadline_s"))
    if token.get("key_error"):
        d.add(
            "evidence",
            "warning",
            d.head,
            "the ingress key could not be read on the head: the token was probed at the "
            "engine only",
            clip(token["key_error"], 200),
            "run the ingress stage (--tags ingress) to write the key file again",
        )
    probes = _probes(d, token)
    if not probes:
        return
    evidence = "; ".join(_shown(p, deadline) for p in probes)
    if any(p.get("ok") is True for p in probes):
        if probes[0].get("name") == "ingress" and probes[0].get("ok") is not True:
            d.add(
                "ingress",
                "error",
                d.head,
                "the engine streams a token directly but not through the ingress",
                evidence,
                "check Caddy on the head (journalctl -u caddy) and the key; run --tags ingress",
            )
        return
    healthy = [p for p in probes if p.get("health_status") == 200]
    wedged = [p for p in healthy if p.get("timeout")]
    if wedged:
        d.add(
            "F28",
            "error",
            d.head,
            "the engine answers /health but streams no token: generation is wedged (typically "
            "a tensor-parallel rank stuck in a collective) while the API server still answers",
            evidence,
            F28_FIX,
        )
        return
    d.add(
        "token",
        "error",
        d.head,
        "the endpoint streams no token" + (" (it answers /health)" if healthy else ""),
        evidence,
        "the other findings name the unit or the ingress; read the engine's log "
        f"(journalctl -u localinference-vllm.service on {d.head or 'the head'})",
    )


# --- the watchdog's incidents -------------------------------------------------------------


def _read_incidents(live: dict[str, Any]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The incident record of the head and the records that pass the schema (checked again
    here: what comes over the wire is not trusted either)."""
    raw = live.get("incidents")
    if not isinstance(raw, dict) or not isinstance(raw.get("incidents"), list):
        return None, []
    return raw, [r for r in raw["incidents"] if _incidents.check(r) is None]


def check_incidents(d: Doctor) -> None:
    """Lines of the incident log that are not incidents, and a spent restart budget (warnings)."""
    if d.live.get("incidents") is None:
        return
    raw, records = _read_incidents(d.live)
    if raw is None:
        d.add(
            "evidence",
            "warning",
            d.head,
            "the incidents read on the head are not a list of incidents",
            clip(d.live.get("incidents"), 120),
            "run the doctor playbook of the collection",
        )
        return
    path = clip(raw.get("path") or INCIDENTS_PATH, 120)
    problems = (
        [str(p) for p in raw.get("problems") or []] if isinstance(raw.get("problems"), list) else []
    )
    dropped = len(raw["incidents"]) - len(records)
    if dropped:
        problems.append(f"{dropped} record(s) that are not incidents of schema {_incidents.SCHEMA}")
    if problems:
        d.add(
            "incidents",
            "warning",
            d.head,
            f"{len(problems)} line(s) of the watchdog's incident log are not incidents "
            "(a torn write or an edit by hand); they are not shown",
            f"{d.head}:{path}: " + "; ".join(clip(p, 100) for p in problems[:3]),
            f"read them by hand: tail -n 20 {path}; the watchdog appends whole lines only",
        )
    spent = [r for r in records if r["outcome"] == "budget-spent"]
    if spent:
        last = spent[-1]
        d.add(
            "watchdog-budget",
            "warning",
            d.head,
            f"the watchdog spent its restart budget ({last['time']}, {last['verdict']}): it only "
            "pages until its restart window passes",
            f"{d.head}:{path}: {clip(last['evidence'], 160)}",
            "find why the engine keeps wedging (kernel log: NCCL, Xid; the F28 entry), fix it, "
            "then restart the cluster with ansible-playbook site.yml --tags rollout",
        )


def incident_table(d: Doctor, limit: int | None = None) -> list[str]:
    """``INCIDENTS ...`` and a short table of the last incidents (oldest first), or one line."""
    raw, records = _read_incidents(d.live)
    if raw is None:
        return []
    where = f"{d.head}:{clip(raw.get('path') or INCIDENTS_PATH, 120)}"
    if not raw.get("exists", True):
        return [f"INCIDENTS: none ({where} does not exist: no watchdog has recorded one)"]
    if not records:
        return [f"INCIDENTS: none recorded in {where}"]
    shown = records[-limit:] if limit else records
    rows = [
        [
            r["time"],
            r["verdict"],
            r["action"],
            r["outcome"],
            "-" if r["detect_seconds"] is None else f"{r['detect_seconds']:g}",
            "-" if r["recover_seconds"] is None else f"{r['recover_seconds']:g}",
            clip(r["evidence"], MAX_INCIDENT_EVIDENCE),
        ]
        for r in shown
    ]
    header = f"INCIDENTS: the last {len(rows)} in {where}"
    return [header, *text_table([c.upper() for c in INCIDENT_COLUMNS], rows)]
