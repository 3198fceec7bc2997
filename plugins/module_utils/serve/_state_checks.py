# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node checks ``serving_state`` runs with ``checks`` (state=staged or verified), and the flag check.

Before anything is read: the node's load (F5) and its cluster address (:func:`node_checks`).
After the staged units are written: their mounts, the node's Quadlet generator (F14, F17),
the ports and the live units' states, then the guard programs are installed
(:func:`staged_checks`). On the live units: the generator and systemd's loaded services
(:func:`live_checks`). Every rendered flag exists in the targeted vLLM release
(:func:`check_help`, from ``help_text`` or the image's cached ``--help=all``).

The judgements are ``_stage_checks``'s; here they are run on the node. A refusal ends the
module through :func:`refused_or`. ``files`` is ``_state_apply.Files`` (writes honour check
mode); ``module`` is the caller's AnsibleModule.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._argv import (
    parse_help_flags,
    unknown_flags,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._ports import (
    foreign,
    listeners,
    refusal,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._quadlet import (
    QuadletCheckError,
    check_units,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._stage_checks import (
    StageCheckError,
    all_active,
    capture_help,
    check_mounts,
    help_cache_file,
    judge_address,
    judge_load,
    not_loaded,
    read_unit_states,
    stage_ports,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._state import (
    StateFileError,
    read_text,
)

# `vllm serve --help=all` is a few hundred kilobytes.
MAX_HELP_BYTES = 16 * 1024 * 1024


def refused_or(module: Any, result: dict[str, Any], step: Callable[..., Any], *args: Any) -> Any:
    """``step(*args)``; a refusal or a command that failed ends the module with its message."""
    try:
        return step(*args)
    except QuadletCheckError as exc:
        module.fail_json(msg=str(exc), **{**result, "quadlet": exc.extra})
    except (StageCheckError, CommandError) as exc:
        module.fail_json(msg=str(exc), **result)


def _quadlet_check(module: Any, checks: dict, recipe: dict, unit_dir: str, result: dict) -> None:
    """The node's Quadlet generator on ``unit_dir`` (F14, F17); findings that do not block are warnings."""
    checked = check_units(unit_dir, checks["quadlet"], recipe["privileged"], checks["timeout"])
    result["quadlet"] = {"services": checked["services"], "findings": checked["findings"]}
    for item in checked["findings"]:
        module.warn(f"{item['service']}: {item['id']}: {item['message']}")


def node_checks(checks: dict[str, Any], node: Any, runner: Runner) -> dict[str, Any]:
    """F5 and the cluster address: before anything else is read or written."""
    found = {}
    if checks["max_load_per_cpu"] is not None:
        loadavg = _files.read_kernel_text("/proc/loadavg", 4096) or ""  # unreadable: refused, named
        found["node_load"] = judge_load(
            loadavg, os.sysconf("SC_NPROCESSORS_ONLN"), checks["max_load_per_cpu"], node.host
        )
    if checks["cluster_address"] and node.address:
        rc, out, err = runner.run(["ip", "-o", "addr", "show"])
        if rc != 0:
            raise StageCheckError(f"{node.host}: ip -o addr show failed (rc {rc}): {err.strip()[:300]}")
        judge_address(out, node.address, node.host)
    return found


def _cached_help(module: Any, files: Any, checks: dict, recipe: dict) -> str | None:
    """The image's option list from the node's cache, asked of the image once (None in check mode)."""
    path = help_cache_file(checks["help_cache_dir"], recipe["image"])
    try:
        text = read_text(path, MAX_HELP_BYTES)
    except StateFileError as exc:
        raise StageCheckError(f"checks.help_cache_dir: {exc}; remove the file") from None
    if text is not None or module.check_mode:
        return text
    text = capture_help(Runner(checks["help_timeout"]), recipe)
    files.write(path, text, "checks.help_cache_dir")
    return text


def staged_checks(module: Any, files: Any, checks: dict, context: dict, runner: Runner) -> bool:
    """The checks on the staged units and the node's ports and units, then the guard programs."""
    recipe, node, result = context["recipe"], context["node"], context["result"]
    result["mounts"] = check_mounts(recipe, node.host)
    if checks["quadlet"] and recipe["deploy_mode"] == "quadlet":
        with tempfile.TemporaryDirectory(prefix="localinference-quadlet-") as scratch:
            unit_dir = context["unit_root"]
            if module.check_mode:  # nothing was written: check the units as rendered
                unit_dir = scratch
                for unit in context["units"]:
                    with open(os.path.join(scratch, unit["name"]), "w", encoding="utf-8") as handle:
                        handle.write(unit["content"])
            _quadlet_check(module, checks, recipe, unit_dir, result)
    if checks["ports"]:
        ports = stage_ports(recipe, result["document"], node.rank, node.nnodes)
        try:
            found = listeners(ports)
        except OSError as exc:
            raise StageCheckError(f"cannot read the node's listening sockets from /proc: {exc}") from None
        result["listeners"] = [item.as_dict() for item in found]
        strangers = foreign(found, sorted({*result["live_start_order"], *result["start_order"]}))
        if strangers:
            raise StageCheckError(refusal(strangers))
    if checks["unit_states"]:
        states = read_unit_states(runner, result["live_start_order"])
        result["live_active"] = {
            unit: states[unit]["ActiveState"] for unit in result["live_start_order"]
        }
        result["live_running"] = all_active(result["live_start_order"], states)
    installed = []
    for program in checks["programs"]:
        path = os.path.join(checks["programs_dir"], program["name"])
        if files.write(path, program["content"], "checks.programs", mode=0o755):
            installed.append(path)
    result["programs"] = installed
    return bool(installed)


def live_checks(module: Any, checks: dict, recipe: dict, unit_dir: str, result: dict, runner: Runner) -> None:
    """state=verified: the live units pass the node's generator and systemd loaded every service."""
    if checks["quadlet"] and recipe["deploy_mode"] == "quadlet":
        _quadlet_check(module, checks, recipe, unit_dir, result)
    if checks["unit_states"]:
        missing = not_loaded(result["start_order"], read_unit_states(runner, result["start_order"]))
        if missing:
            raise StageCheckError(
                f"systemd has no loaded service for {', '.join(missing)}: the units are written but "
                "were not read (run systemctl daemon-reload, or the rollout again)"
            )


def check_help(module: Any, files: Any, result: dict, inputs: dict, checks: dict | None) -> None:
    """Every rendered flag exists in the targeted vLLM release (help_text or the image's cache)."""
    state, recipe, help_path = module.params["state"], inputs["recipe"], inputs["help_path"]
    text = None
    if help_path and state != "absent":
        try:
            text = read_text(help_path, MAX_HELP_BYTES)
        except StateFileError as exc:
            module.fail_json(msg=f"help_text: {exc}", **result)
        if text is None:
            module.fail_json(msg=f"help_text {help_path} does not exist", **result)
    elif state == "staged" and checks and checks["help_cache_dir"] and recipe["deploy_mode"] == "quadlet":
        text = refused_or(module, result, _cached_help, module, files, checks, recipe)
    if text is None:
        return
    argv = (result["document"]["server_argv"] or []) + recipe["extra_args"]
    unknown = unknown_flags(argv, parse_help_flags(text))
    if unknown:
        module.fail_json(
            msg=f"vllm_recipe renders flags this vLLM release does not have: {', '.join(unknown)}; "
            "remove or rename them (see `vllm serve --help=all` of the targeted release)",
            unknown_flags=unknown,
            **result,
        )
