# Copyright (c) localinference.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``memory_admission``: may ``need_bytes`` start on this node now? One call, from the node's /proc.

The judgement is ``_admission.check``'s (the unit's cgroup and its tenants against what the
node can still give); here the options are checked and a ``unit`` is turned into its cgroup
(``systemctl show``, or its slice under the root systemd manages when it is not running).

No AnsibleModule here: ``module`` is the caller's (``params``, ``get_bin_path``, ``fail_json``).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.localinference.vllm.plugins.module_utils.common import (
    _files,
)
from ansible_collections.localinference.vllm.plugins.module_utils.common._commands import (
    CommandError,
    Runner,
    timeout_error,
)
from ansible_collections.localinference.vllm.plugins.module_utils.serve._admission import (
    AdmissionError,
    check,
    own_cgroups,
)


def _unit_cgroup(module: Any, unit: str) -> str:
    systemctl = module.get_bin_path("systemctl", required=True)
    runner = Runner(module.params["timeout"])
    try:
        rc, out, err = runner.run(
            [systemctl, "show", "-p", "ControlGroup", "-p", "Slice", unit],
            "systemd does not answer",
        )
    except CommandError as exc:
        module.fail_json(msg=f"unit={unit}: {exc}")
    if rc != 0:
        module.fail_json(msg=f"unit={unit}: systemctl show exited {rc}: {err.strip()[:300]}")
    shown = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
    if shown.get("ControlGroup"):
        return shown["ControlGroup"]
    # Not running: its slice, under the root systemd manages (PID 1's cgroup less init.scope).
    cgroup = f"{module.params['proc_root']}/1/cgroup"
    paths = own_cgroups(_files.read_text(cgroup, _files.MAX_KERNEL_TEXT, errors="replace"))
    base = (paths.get("v2") or paths.get("memory") or "/").rstrip("/")
    if base.endswith("/init.scope"):
        base = base[: -len("/init.scope")]
    return f"{base}/{shown.get('Slice') or 'system.slice'}"


def run(module: Any) -> dict[str, Any]:
    """The admission of ``need_bytes`` on this node; refused (with ``fail_when_refused``), it ends the module."""
    params = module.params
    for option in ("need_bytes", "reserve_bytes", "top_tenants"):
        if params[option] < 0:
            module.fail_json(msg=f"{option} must be 0 or more, got {params[option]}")
    problem = timeout_error(params["timeout"])
    if problem:
        module.fail_json(msg=problem)
    cgroup = params["cgroup"]
    if params["unit"]:
        try:
            cgroup = _unit_cgroup(module, params["unit"])
        except OSError as exc:
            module.fail_json(msg=f"unit={params['unit']}: cannot find its cgroup: {exc}")
    try:
        decision = check(
            params["need_bytes"],
            params["reserve_bytes"],
            params["proc_root"],
            cgroup,
            params["top_tenants"],
            params["exclude_pids"],
        )
    except AdmissionError as exc:
        module.fail_json(
            msg=f"memory admission cannot judge this node: {exc}; is proc_root={params['proc_root']}"
            " a procfs mount?",
            admitted=False,
        )
    result = {"changed": False, **decision}
    if not decision["admitted"] and params["fail_when_refused"]:
        module.fail_json(msg=decision["message"], **result)
    return result
