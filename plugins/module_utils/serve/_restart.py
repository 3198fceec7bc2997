# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one way the collection restarts a serving cluster, in the rollout's order.

The rollout (``playbooks/rollout.yml``) and the watchdog restart a cluster the same way:

1. **stop** every rank: on each node the units of ``serving.json``'s ``start_order`` in
   reverse (the server before its runtime), every node at once — :func:`stop_units`, which the
   rollout's ``serving_state stop_live`` calls too;
2. **verify** every node: the unit files on disk are exactly the ones ``serving.json``
   records (checksums and recipe hash, F10) and, in the rollout, ``serving.json`` is exactly
   what was rendered for the inventory's ask (the recipe and its hash, the image by digest,
   the environment, the weights digest, the unit checksums) — :func:`verify_node`, the one
   verifier of both (the rollout calls it through ``serving_state state=verified``);
3. **start** the head's Ray unit (Ray only), the workers, then the head's server —
   :func:`restart_plan` orders the nodes by :data:`RESTART_ORDER`, the one definition of
   this order (the rollout's plays are checked against it), :func:`start_units` starts one
   node's units;
4. **prove** a streamed first token (the caller: ``serving_ready`` in the rollout, the
   watchdog's token probe).

The watchdog never changes a recipe: it restarts what the last rollout reconciled. A node
whose files differ from its ``serving.json`` is not started (the rollout is the fix).

No AnsibleModule here: the serving_state module and the watchdog program use this file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.serve._stage_checks import (
    StageCheckError,
    read_unit_states,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    check_document,
    differences,
    unit_file_problems,
)

RAY_UNIT = "localinference-ray.service"

# The restart, one step per place in playbooks/rollout.yml, in its order: (step, the play's
# hosts, the serve role's tasks file that does it, which of a node's start_order units it
# starts). The rollout's plays run these files in this order (the rm -> update and the
# verify are the two halves of the play that imports apply.yml); restart_plan orders the
# watchdog's steps by this table, and tests/unit/plugins/module_utils/serve/test_restart_order.py
# reads the plays and the tasks files back and compares, so neither can change alone.
HEAD, WORKERS, CLUSTER = "vllm_head", "vllm_workers", "vllm_cluster"
ALL_UNITS, RAY_ONLY, SERVER = "all", "ray", "server"  # SERVER: every unit but Ray's
RESTART_ORDER: tuple[tuple[str, str, str, str], ...] = (
    ("stop", CLUSTER, "replace", ALL_UNITS),  # serving_state stop_live: reverse start_order
    ("verify", CLUSTER, "verify", ALL_UNITS),  # serving_state state=verified (F10)
    ("start", HEAD, "start_rendezvous", RAY_ONLY),  # the head's Ray unit (Ray only)
    ("start", WORKERS, "start_rank", ALL_UNITS),  # Ray workers or headless mp ranks
    ("start", HEAD, "start_server", SERVER),  # the server, then a streamed first token
)
# systemctl start of a Quadlet unit returns when the container started; a unit whose
# ExecStartPre (the admission, the offload reclaim) refuses fails here.
START_TIMEOUT = 600.0


def stop_units(runner, start_order: Sequence[str], check_mode: bool = False) -> list[str]:
    """Stop the node's running ``start_order`` units in reverse order; return those stopped.

    A stopped (``kill -STOP``) process ignores SIGTERM: the units' own stop timeouts end it
    with SIGKILL, so ``systemctl stop`` returns.
    """
    states = read_unit_states(runner, list(start_order))
    running = [u for u in reversed(start_order) if states[u].get("ActiveState") != "inactive"]
    if check_mode:
        return running
    for unit in running:
        rc, _, err = runner.run(["systemctl", "stop", "--", unit])
        if rc != 0:
            raise StageCheckError(f"systemctl stop {unit} failed (rc {rc}): {err.strip()[:300]}")
    return running


def start_units(runner, units: Sequence[str]) -> list[str]:
    """Start ``units`` in order; the first refusal stops it with systemd's own words."""
    started = []
    for unit in units:
        rc, _, err = runner.run(["systemctl", "start", "--", unit], timeout=START_TIMEOUT)
        if rc != 0:
            raise StageCheckError(
                f"systemctl start {unit} failed (rc {rc}): {err.strip()[:300]}; "
                f"journalctl -u {unit} says why"
            )
        started.append(unit)
    return started


def verify_node(
    document: Any,
    unit_dirs: Sequence[str],
    read: Callable[[str], str | None],
    wanted: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The node's reconciled state against its unit files: ``{ok, start_order, problems}``.

    ``document`` is ``serving.json`` as read back from the node (schema-checked here, never
    trusted). With ``wanted`` (the document rendered for the inventory's ask, as the rollout
    has it) every difference from it is a problem too; without it (the watchdog) the node is
    checked against its own record only: the watchdog never changes a recipe.
    """
    trusted, problems = check_document(document, tuple(unit_dirs))
    if trusted["valid"]:
        problems = differences(document, dict(wanted)) if wanted is not None else []
        problems += unit_file_problems(trusted, read)
    return {"ok": not problems, "start_order": trusted["start_order"], "problems": problems}


def _units(start_order: Sequence[str], which: str) -> list[str]:
    if which == RAY_ONLY:
        return [u for u in start_order if u == RAY_UNIT]
    if which == SERVER:
        return [u for u in start_order if u != RAY_UNIT]
    return list(start_order)


def restart_plan(nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ordered steps of a restart across ``nodes``, in :data:`RESTART_ORDER`.

    ``nodes``: ``{name, rank, start_order}`` with rank 0 the head. Steps are
    ``{step, node, units, wave}`` with step ``stop``, ``verify``, ``start``: every node (the
    head first, then the workers by rank) for a step of the whole cluster, and a start only
    where it has units to start. ``wave`` is the step's row of :data:`RESTART_ORDER`, the
    rollout's play: a play runs on its hosts at once, so the steps of one wave may run
    together and a wave starts when the one before it ended everywhere. The caller proves a
    streamed token after the last one. Raises ValueError when there is no single head.
    """
    heads = [n for n in nodes if n["rank"] == 0]
    if len(heads) != 1:
        raise ValueError(f"a restart needs exactly one node of rank 0, got {len(heads)}")
    workers = sorted((n for n in nodes if n["rank"] != 0), key=lambda n: n["rank"])
    hosts = {HEAD: heads, WORKERS: workers, CLUSTER: [*heads, *workers]}
    steps = []
    for wave, (step, group, _tasks, which) in enumerate(RESTART_ORDER):
        for node in hosts[group]:
            units = [] if step == "verify" else _units(node["start_order"], which)
            if step != "start" or units:
                steps.append({"step": step, "node": node["name"], "units": units, "wave": wave})
    return steps
